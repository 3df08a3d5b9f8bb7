"""Reader offsets (DIR/ofs/NAME.ofs, 8 bytes big-endian, as sej's Offset) and the journal's ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from journalq.errors import Error, JournalError, LockedError
from journalq.journal import ReaderOffset, Writer, end_offset, first_offset, read_offset, set_offset
from journalq.journal import offsets as offsets_mod
from journalq.journal import recovery as recovery_mod

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def test_commit_and_read_round_trip(tmp_path):
    with ReaderOffset(tmp_path, "alpha") as ro:
        assert ro.value == 0
        assert ro.name == "alpha"
        ro.commit(42)
        assert ro.value == 42
        assert read_offset(tmp_path, "alpha") == 42
        ro.commit(42)  # the same again: harmless
        ro.commit(0x0102030405060708)
    path = tmp_path / "ofs" / "alpha.ofs"
    assert path.read_bytes() == bytes.fromhex("0102030405060708")  # 8 bytes, big-endian
    with ReaderOffset(tmp_path, "alpha") as ro:  # a new holder reads what was committed
        assert ro.value == 0x0102030405060708
        ro.commit(2**64 - 1)
    assert path.read_bytes() == b"\xff" * 8
    assert read_offset(tmp_path, "alpha") == 2**64 - 1
    assert sorted(p.name for p in (tmp_path / "ofs").iterdir()) == ["alpha.lck", "alpha.ofs"]  # no temporaries


def test_commit_without_sync(tmp_path):
    with ReaderOffset(tmp_path, "fast", sync=False) as ro:
        ro.commit(7)
    assert (tmp_path / "ofs" / "fast.ofs").read_bytes() == bytes.fromhex("0000000000000007")


def test_never_committed_and_empty_files_read_as_zero(tmp_path):
    assert read_offset(tmp_path, "nobody") == 0
    (tmp_path / "ofs").mkdir()
    (tmp_path / "ofs" / "empty.ofs").write_bytes(b"")
    assert read_offset(tmp_path, "empty") == 0


def test_the_offsets_committed_by_sej_on_a_copy(copy_vector):
    path = copy_vector("plain")
    with ReaderOffset(path, "alpha") as ro:
        assert ro.value == 1465
        ro.commit(1466)
    assert (path / "ofs" / "alpha.ofs").read_bytes() == (1466).to_bytes(8, "big")
    assert read_offset(path, "beta") == 1150


def test_a_second_holder_of_the_same_name_is_refused(tmp_path, child_env):
    first = ReaderOffset(tmp_path, "alpha")
    with pytest.raises(LockedError) as info:
        ReaderOffset(tmp_path, "alpha")
    assert info.value.file == tmp_path / "ofs" / "alpha.lck"
    # It said "another writer holds the lock", of a reader offset.
    assert "reader offset 'alpha' is in use by another reader" in str(info.value)
    with pytest.raises(LockedError, match="reader offset 'alpha' is in use by another reader"):
        set_offset(tmp_path, "alpha", 3)
    with ReaderOffset(tmp_path, "beta") as other:  # another name is another lock
        other.commit(1)
    script = (
        "import sys\nfrom journalq.journal import ReaderOffset, LockedError\n"
        "try:\n    ReaderOffset(sys.argv[1], 'alpha')\nexcept LockedError as e:\n    print('LockedError', e)\n"
        "else:\n    print('opened')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.startswith("LockedError"), result.stderr
    assert "alpha.lck" in result.stdout
    first.close()
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "opened", result.stderr
    with ReaderOffset(tmp_path, "alpha") as again:
        assert again.value == 0


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../escape", "a b", "tab\t", "ü", None, 5])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(Error, match="reader name"):
        ReaderOffset(tmp_path, name)
    with pytest.raises(Error, match="reader name"):
        read_offset(tmp_path, name)
    assert not (tmp_path / "escape.ofs").exists()


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "0", "x" * 100])
def test_good_names(tmp_path, name):
    with ReaderOffset(tmp_path, name) as ro:
        ro.commit(3)
    assert read_offset(tmp_path, name) == 3


@pytest.mark.parametrize("bad", [-1, 2**64, "5", 1.0, None])
def test_bad_commits_are_refused(tmp_path, bad):
    with ReaderOffset(tmp_path, "alpha") as ro:
        ro.commit(9)
        with pytest.raises(Error, match="unsigned 64-bit integer"):
            ro.commit(bad)
        assert ro.value == 9
    assert read_offset(tmp_path, "alpha") == 9


def test_a_corrupt_offset_file_is_a_clear_error(tmp_path):
    (tmp_path / "ofs").mkdir()
    path = tmp_path / "ofs" / "alpha.ofs"
    path.write_bytes(b"\x00\x01\x02\x03\x04")
    with pytest.raises(JournalError) as info:
        read_offset(tmp_path, "alpha")
    assert info.value.file == path
    assert "offset file holds 5 bytes, not 8" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(JournalError, match="holds 5 bytes, not 8"):
        ReaderOffset(tmp_path, "alpha")
    # The refused holder let the lock go.
    path.write_bytes((11).to_bytes(8, "big"))
    with ReaderOffset(tmp_path, "alpha") as ro:
        assert ro.value == 11


def test_an_offset_file_that_cannot_be_read_is_a_journal_error_naming_it(tmp_path):
    """A directory where the offset file should be (or an ``ofs`` that is a file) raised the raw
    IsADirectoryError/NotADirectoryError, which no caller expects of a journalq call."""
    path = tmp_path / "ofs" / "alpha.ofs"
    path.mkdir(parents=True)
    with pytest.raises(JournalError, match="a directory has an offset file.s name") as info:
        read_offset(tmp_path, "alpha")
    assert info.value.file == path
    with pytest.raises(JournalError, match="a directory has an offset file.s name"):
        ReaderOffset(tmp_path, "alpha")
    other = tmp_path / "other"
    other.mkdir()
    (other / "ofs").write_bytes(b"not a directory")
    with pytest.raises(JournalError, match="cannot read the offset file") as info:
        read_offset(other, "alpha")
    assert info.value.file == other / "ofs" / "alpha.ofs"


def test_the_ends_of_a_file_given_as_a_journal_are_a_journal_error(tmp_path):
    """They raised the raw NotADirectoryError of listing ``FILE/jnl``."""
    file = tmp_path / "notes.txt"
    file.write_text("kept")
    for ends in (first_offset, end_offset):
        with pytest.raises(JournalError, match="not a directory") as info:
            ends(file)
        assert info.value.file == file
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "jnl").write_text("kept")
    with pytest.raises(JournalError, match="not a directory") as info:
        end_offset(tmp_path / "j")
    assert info.value.file == tmp_path / "j" / "jnl"


def test_first_and_end_offsets(tmp_path):
    assert (first_offset(tmp_path), end_offset(tmp_path)) == (0, 0)
    with Writer(tmp_path, segment_size=100) as w:
        w.append_many([b"v" * 30] * 7)  # 56-byte messages: 2 per segment, then an empty one
    assert (first_offset(tmp_path), end_offset(tmp_path)) == (0, 7)
    os.unlink(tmp_path / "jnl" / "0000000000000000.jnl")
    assert (first_offset(tmp_path), end_offset(tmp_path)) == (2, 7)
    with Writer(tmp_path, segment_size=100) as w:
        w.append(b"v" * 30)
        assert end_offset(tmp_path) == 8  # a reader sees the append at once
    assert (tmp_path / "jnl" / "0000000000000008.jnl").stat().st_size == 0  # it rolled after 7
    with open(tmp_path / "jnl" / "0000000000000008.jnl", "ab") as f:
        f.write(b"\x00" * 12)  # the start of a message: not counted
    assert end_offset(tmp_path) == 8


def test_clean_end_offset_is_none_when_bytes_that_are_no_message_follow(tmp_path):
    assert offsets_mod.clean_end_offset(tmp_path) == 0  # no segment yet
    with Writer(tmp_path) as w:
        w.append_many([b"v" * 30] * 3)
    assert offsets_mod.clean_end_offset(tmp_path) == end_offset(tmp_path) == 3
    with open(tmp_path / "jnl" / "0000000000000000.jnl", "ab") as f:
        f.write(b"\x00" * 12)  # a message being written, or torn
    assert offsets_mod.clean_end_offset(tmp_path) is None and end_offset(tmp_path) == 3


def test_overwrite_offset_writes_in_place_and_makes_a_missing_file(tmp_path, monkeypatch):
    file = tmp_path / "ofs" / "snapshot.ofs"
    offsets_mod.overwrite_offset(file, 5, sync=False)  # made as write_offset makes it
    inode = file.stat().st_ino
    synced = []
    fdatasync = os.fdatasync
    monkeypatch.setattr(offsets_mod.os, "fdatasync", lambda fd: (synced.append(fd), fdatasync(fd)))
    offsets_mod.overwrite_offset(file, 2**64 - 1, sync=True)
    assert file.stat().st_ino == inode and read_offset(tmp_path, "snapshot") == 2**64 - 1 and len(synced) == 1
    offsets_mod.overwrite_offset(file, 7, sync=False)
    assert file.read_bytes() == (7).to_bytes(8, "big") and len(synced) == 1
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(Error, match="unsigned 64-bit"):
            offsets_mod.overwrite_offset(file, bad)
    assert read_offset(tmp_path, "snapshot") == 7


def test_a_durable_commit_syncs_the_ofs_directory_it_made(tmp_path, monkeypatch):
    """The first commit of a journal makes ofs/: its entry in the journal directory must reach
    stable storage with the commit, or a power cut takes the committed offset away with it."""
    synced = []
    monkeypatch.setattr(recovery_mod, "fsync_dir", synced.append)
    with ReaderOffset(tmp_path, "alpha") as ro:
        ro.commit(5)
    assert tmp_path in synced and tmp_path / "ofs" in synced
    synced.clear()
    offsets_mod.write_offset(tmp_path / "more" / "ofs" / "beta.ofs", 6)
    assert synced == [tmp_path, tmp_path / "more", tmp_path / "more" / "ofs"]
    synced.clear()
    with ReaderOffset(tmp_path / "fast", "gamma", sync=False) as ro:  # no sync asked: none done
        ro.commit(7)
    assert synced == []


def test_commits_from_two_threads_and_a_refused_one_leave_no_stray_file(tmp_path, monkeypatch):
    """``write_offset``'s temporary file was named by the process alone: two threads committing
    at once wrote one file and the second rename failed (FileNotFoundError). And a commit the
    disk refused left the file behind."""
    import threading

    file = tmp_path / "ofs" / "alpha.ofs"
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def commit(base: int) -> None:
        start.wait()
        try:
            for i in range(300):
                offsets_mod.write_offset(file, base + i, sync=False)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and read_offset(tmp_path, "alpha") % 1000 == 299

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(offsets_mod.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        offsets_mod.write_offset(file, 5)
    assert sorted(p.name for p in file.parent.iterdir()) == ["alpha.ofs"]
    assert read_offset(tmp_path, "alpha") % 1000 == 299  # the old value stands


def test_end_offset_reads_on_when_the_last_segment_is_taken_back_meanwhile(tmp_path, monkeypatch):
    """A writer whose append failed removes the segment that append started; an ``end_offset``
    that had listed it reads the segment before it (it raised FileNotFoundError)."""
    with Writer(tmp_path, segment_size=100) as w:
        w.append_many([b"x" * 40] * 3)  # two segments: offsets 0-1, then 2
    real = offsets_mod.scan_tail
    taken: list[str] = []

    def scan_tail(segment):
        if not taken:
            taken.append(segment.path.name)
            segment.path.unlink()  # the take-back, between the listing and the read
        return real(segment)

    monkeypatch.setattr(offsets_mod, "scan_tail", scan_tail)
    assert end_offset(tmp_path) == 2
    assert taken == ["0000000000000002.jnl"]


# -- arguments refused, a dangling last segment ----------------------------------------------------


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail a test that hangs (a loop that never ends) instead of hanging the suite."""

    def hung(signum: int, frame: object) -> None:
        raise AssertionError("hung for 5 seconds")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_end_offset_names_a_dangling_last_segment(tmp_path, alarm):
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    os.symlink(tmp_path / "nowhere", tmp_path / "jnl" / f"{3:016x}.jnl")
    with pytest.raises(JournalError, match="listed but cannot be opened"):
        end_offset(tmp_path)


def test_commit_after_close_is_refused(tmp_path):
    # A closed ReaderOffset no longer holds the name's lock: its commit would overwrite the
    # offset of the process that took the name since.
    reader = ReaderOffset(tmp_path, "r")
    reader.commit(3)
    reader.close()
    with ReaderOffset(tmp_path, "r") as other:
        other.commit(10)
        with pytest.raises(Error, match="closed"):
            reader.commit(5)
        assert read_offset(tmp_path, "r") == 10


@pytest.mark.parametrize("name", ["reader\n", "a\nb"])
def test_reader_name_with_a_newline_is_refused(tmp_path, name):
    with pytest.raises(Error, match="reader name"):
        ReaderOffset(tmp_path, name)
    assert not (tmp_path / "ofs").exists() or not list((tmp_path / "ofs").iterdir())


@pytest.mark.parametrize("bad", [True, 1.0])
def test_commit_refuses_what_is_no_integer(tmp_path, bad):
    with ReaderOffset(tmp_path, "r") as reader:
        with pytest.raises(Error, match="offset must be an unsigned 64-bit integer"):
            reader.commit(bad)
        assert reader.value == 0
    assert read_offset(tmp_path, "r") == 0
