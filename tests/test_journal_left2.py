"""The journal layer's leftovers of the 2026-11-23 audit: a directory with a segment's name, a
full disk under a shared writer's catch-up, the scanner's offset check, macOS's full sync."""

from __future__ import annotations

import errno
import os
import re
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

import journalq.journal.recovery as recovery_mod
import journalq.journal.sync as sync_mod
from journalq.errors import Error, InvalidMessageError, JournalError, LockedError, StorageError
from journalq.journal import Message, ReaderOffset, Scanner, SyncPolicy, Writer, end_offset, set_offset
from journalq.journal.codec import encode
from journalq.journal.inspect import check, describe
from journalq.journal.segment import segment_at

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def _journal(path: Path, count: int = 5) -> None:
    """``count`` messages of 46 bytes in segments of 100 bytes (three messages each)."""
    with Writer(path, segment_size=100) as writer:
        for i in range(count):
            writer.append(b"v%019d" % i)


# -- a directory with a segment's name --------------------------------------------------------


def test_a_directory_named_as_the_first_segment_is_refused_by_name(tmp_path: Path) -> None:
    directory = segment_at(tmp_path, 0).path
    directory.mkdir(parents=True)
    # Each was a bare IsADirectoryError ("[Errno 21] Is a directory"), most with no path.
    for call in (lambda: Writer(tmp_path), lambda: Scanner(tmp_path), lambda: describe(tmp_path),
                 lambda: end_offset(tmp_path), lambda: Writer(tmp_path, shared=True)):
        with pytest.raises(JournalError, match="not a segment: a directory has a segment's name") as info:
            call()
        assert info.value.file == directory
    assert directory.is_dir() and not any(directory.iterdir())
    for repair in (False, True):
        report = check(tmp_path, repair=repair)
        assert not report.ok
        [problem] = report.problems
        assert (problem.kind, problem.file, problem.fixed) == ("segment", directory, False)
        assert "a directory has a segment's name" in problem.reason


def test_a_directory_where_the_next_segment_goes_is_refused_by_name(tmp_path: Path) -> None:
    _journal(tmp_path)  # segments 0 (offsets 0-2) and 3 (3-4)
    directory = segment_at(tmp_path, 5).path
    directory.mkdir()
    with pytest.raises(JournalError, match="a directory has a segment's name") as info:
        Writer(tmp_path, segment_size=100)
    assert info.value.file == directory
    scanner = Scanner(tmp_path, 3)
    with pytest.raises(JournalError, match="a directory has a segment's name") as info:
        list(scanner)
    assert info.value.file == directory
    scanner.close()
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.file) for p in report.remaining] == [("segment", directory)]
    assert report.messages == 5
    # The segments before it are untouched, and read as before.
    with Scanner(tmp_path) as scanner:
        assert [m.offset for m in scanner.read_batch()] == [0, 1, 2]


# -- a full disk while a shared writer cuts a dead writer's torn tail --------------------------


class _FullFile:
    """A cut file on a full disk: part of what is written goes in, then ENOSPC."""

    def __init__(self, real: BinaryIO) -> None:
        self._real = real

    def write(self, data: bytes) -> int:
        self._real.write(data[: len(data) // 2])
        self._real.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


def _torn_tail(writer: Writer, offset: int) -> bytes:
    """What a shared writer killed mid-append leaves: the first 60 bytes of message ``offset``."""
    torn = encode(offset, 1, 0, b"", b"x" * 100)[:60]
    with open(writer.segment.path, "ab") as segment:
        segment.write(torn)
    return torn


def _values(path: Path) -> list[bytes]:
    with Scanner(path) as scanner:
        return [m.value for m in scanner]


def test_a_full_disk_while_a_shared_writer_cuts_a_torn_tail_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(tmp_path, shared=True)
    writer.append(b"one")
    size = writer.segment.path.stat().st_size
    torn = _torn_tail(writer, 1)
    real_new_file = recovery_mod._new_file
    monkeypatch.setattr(recovery_mod, "_new_file", lambda *a: (lambda p, f: (p, _FullFile(f)))(*real_new_file(*a)))
    # It was a bare OSError, naming no file, out of the append.
    with pytest.raises(StorageError, match="No space left on device") as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC
    assert info.value.file == writer.segment.path and info.value.position == size
    assert "nothing was cut" in str(info.value)
    # Nothing cut, nothing half saved: the segment holds what it held, torn tail too.
    assert writer.segment.path.read_bytes()[size:] == torn
    assert not any((tmp_path / "cut").iterdir())
    assert writer.recoveries == []
    monkeypatch.setattr(recovery_mod, "_new_file", real_new_file)  # room again
    assert writer.append(b"two") == 1
    [recovery] = writer.recoveries
    assert recovery.saved_to.read_bytes() == torn
    writer.close()
    assert _values(tmp_path) == [b"one", b"two"]


def test_a_full_disk_while_opening_cuts_a_torn_tail_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Writer(tmp_path) as writer:
        writer.append(b"one")
        torn = _torn_tail(writer, 1)
    real_new_file = recovery_mod._new_file
    monkeypatch.setattr(recovery_mod, "_new_file", lambda *a: (lambda p, f: (p, _FullFile(f)))(*real_new_file(*a)))
    with pytest.raises(StorageError, match="No space left on device") as info:
        Writer(tmp_path)
    assert info.value.errno == errno.ENOSPC and info.value.file == segment_at(tmp_path, 0).path
    assert segment_at(tmp_path, 0).path.read_bytes().endswith(torn)
    assert not any((tmp_path / "cut").iterdir())
    monkeypatch.setattr(recovery_mod, "_new_file", real_new_file)
    with Writer(tmp_path) as writer:
        assert writer.append(b"two") == 1
    assert _values(tmp_path) == [b"one", b"two"]


def test_a_shared_writer_on_a_really_full_disk_cuts_a_torn_tail_once_there_is_room(tmpfs: Path) -> None:
    writer = Writer(tmpfs / "j", shared=True)
    writer.append(b"one")
    torn = _torn_tail(writer, 1)
    filler = tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to its last byte
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(StorageError) as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC
    assert writer.segment.path.read_bytes().endswith(torn)
    filler.unlink()
    assert writer.append(b"two") == 1
    writer.close()
    assert _values(tmpfs / "j") == [b"one", b"two"]


# -- macOS: fsync leaves the data in the drive's cache -----------------------------------------


_F_FULLFSYNC = 51  # macOS's number (Linux's fcntl has none)


@pytest.fixture
def on_macos(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """This machine taken for macOS, whose ``fcntl`` has ``F_FULLFSYNC``: the calls made to
    ``fcntl(fd, F_FULLFSYNC)`` and ``fsync`` are recorded (as ``("full", fd)``, ``("fsync", fd)``),
    and the sync functions picked again for it."""
    import fcntl

    calls: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fake_fcntl(fd: int, command: int, *args: object) -> int:
        assert command == _F_FULLFSYNC
        calls.append(("full", fd))
        real_fsync(fd)
        return 0

    def recorded_fsync(fd: int) -> None:
        calls.append(("fsync", fd))
        real_fsync(fd)

    monkeypatch.setattr(sync_mod.sys, "platform", "darwin")
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", _F_FULLFSYNC, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", fake_fcntl)
    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.delattr(os, "fdatasync", raising=False)  # macOS's os has none
    monkeypatch.setattr(sync_mod, "_os_fdatasync", sync_mod._data_sync())
    monkeypatch.setattr(sync_mod, "_full_sync", sync_mod._full_sync_here())
    return calls


def test_on_macos_a_writer_syncs_with_f_fullfsync(tmp_path: Path, on_macos: list[tuple[str, int]]) -> None:
    # It was os.fsync, which on macOS leaves the data in the drive's cache: lost in a power cut.
    with Writer(tmp_path, sync="always") as writer:
        on_macos.clear()
        writer.append(b"one")
        assert ("full", writer._fd) in on_macos and ("fsync", writer._fd) not in on_macos
    on_macos.clear()
    set_offset(tmp_path, "reader", 1)  # an offset's commit, synced too
    assert [kind for kind, _ in on_macos].count("full") >= 1


def test_on_macos_a_file_system_that_refuses_f_fullfsync_gets_fsync(
    tmp_path: Path, on_macos: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    def refused(fd: int, command: int, *args: object) -> int:
        on_macos.append(("full", fd))
        raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))

    monkeypatch.setattr(fcntl, "fcntl", refused)
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x")
        f.flush()
        sync_mod.fdatasync(f.fileno())
        assert on_macos == [("full", f.fileno()), ("fsync", f.fileno())]


def test_elsewhere_a_writer_syncs_with_fdatasync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_mod.sys, "platform", "linux")
    assert sync_mod._data_sync() is os.fdatasync
    assert not sync_mod._full_sync_here()


# -- check while a queue's gc collects segments ----------------------------------------------


def _collected_after_listing(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first segment of the journal at ``path`` collected (a gc) just after ``inspect``'s
    first listing of its segments, which names it still; its later listings do not (one that
    names it still is a segment that cannot be opened, such as a dangling link: not collected)."""
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.segment import list_segments, remove_segment

    stale = [list_segments(path)]
    remove_segment(stale[0][0])
    monkeypatch.setattr(inspect_mod, "list_segments", lambda p: stale.pop() if stale else list_segments(p))


def test_check_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _journal(tmp_path, 8)  # segments 0, 3 and 6
    _collected_after_listing(tmp_path, monkeypatch)
    # It was a bare FileNotFoundError, out of a check of a sound journal.
    report = check(tmp_path)
    assert report.ok and report.problems == []
    assert (report.messages, report.segments) == (5, 2)


# -- a scan over a message much larger than one read -----------------------------------------


def test_a_scan_over_a_huge_message_reads_it_in_few_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scan_segment`` (a writer's opening, ``check``, an index's rebuild) read a message larger
    than its chunk one chunk at a time, joining each to all read before: quadratic, 28 s for a
    message of 200 MiB (the scanner took 0.5 s). It now reads twice as much each time."""
    import journalq.journal.segment as segment_mod
    from journalq.journal.segment import scan_segment

    with Writer(tmp_path) as writer:
        writer.append(b"a")
        writer.append(b"x" * (1 << 20))
        writer.append(b"b")
    monkeypatch.setattr(segment_mod, "READ_CHUNK", 1024)
    reads = 0
    real_pread = os.pread

    def counted(fd: int, n: int, position: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_pread(fd, n, position)

    monkeypatch.setattr(segment_mod.os, "pread", counted)
    scan = scan_segment(segment_at(tmp_path, 0), 0, 0, keep=True)
    monkeypatch.undo()
    assert scan.clean and scan.next_offset == 3
    assert [len(m.value) for m in scan.messages or []] == [1, 1 << 20, 1]
    assert reads <= 16  # log2(1 MiB / 1 KiB) = 10 doublings, and a few more; it was 1,025


# -- check --repair beside a live queue's shared writers -------------------------------------


def test_check_repair_beside_a_shared_writer_does_not_refuse_its_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repair recovered the last segment through an exclusive writer: an append of a queue's
    shared writer (another process) meanwhile was refused with LockedError ("an exclusive writer
    holds the journal"), and a repair run while one appended was refused. The repair now takes
    the lock as the shared writers do, for its recovery only."""
    shared = Writer(tmp_path, shared=True)
    shared.append(b"one")
    torn = _torn_tail(shared, 1)
    appended: list[int] = []
    real_close = Writer.close

    def close_after_an_append(self: Writer) -> None:
        if self is not shared and not appended:  # the repair's writer: another process appends
            appended.append(shared.append(b"two"))
        real_close(self)

    monkeypatch.setattr(Writer, "close", close_after_an_append)
    report = check(tmp_path, repair=True)
    assert appended == [1]
    assert report.ok and [r.saved_to.read_bytes() for r in report.recoveries] == [torn]
    shared.close()
    assert _values(tmp_path) == [b"one", b"two"]


def test_check_repair_beside_an_exclusive_writer_is_refused(tmp_path: Path) -> None:
    with Writer(tmp_path) as writer:
        writer.append(b"one")
        with pytest.raises(LockedError, match="exclusive writer"):
            check(tmp_path, repair=True)
        assert check(tmp_path).ok  # without repair: no lock


# -- a sync policy made directly --------------------------------------------------------------


def test_a_group_policy_made_directly_syncs_every_10ms_as_its_string_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SyncPolicy("group") had no interval and no count: a writer with it never synced (until a
    # roll or close), where the string "group" syncs every 10 ms.
    assert SyncPolicy("group") == SyncPolicy.parse("group")
    import journalq.journal.writer as writer_mod

    synced = threading.Event()
    real = writer_mod.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        synced.set()

    monkeypatch.setattr(writer_mod, "fdatasync", fdatasync)
    with Writer(tmp_path, sync=SyncPolicy("group")) as writer:
        writer.append(b"one")
        assert synced.wait(5)


@pytest.mark.parametrize(
    ("args", "wrong"),
    [
        (("alway",), "unknown sync policy mode 'alway'"),
        (("group", 0.0), "interval_ms must be a number above 0"),
        (("group", -5.0), "interval_ms must be a number above 0"),
        (("group", float("nan")), "interval_ms must be a number above 0"),
        (("group", float("inf")), "interval_ms must be a number above 0"),
        (("group", "5ms"), "interval_ms must be a number above 0"),
        (("group", None, 0), "max_messages must be an integer above 0"),
        (("group", None, 2.5), "max_messages must be an integer above 0"),
        (("none", 5.0), "only a group policy has interval_ms or max_messages"),
        (("always", None, 3), "only a group policy has interval_ms or max_messages"),
    ],
)
def test_a_policy_made_directly_with_bad_fields_is_refused(args: tuple, wrong: str) -> None:
    # Each was taken as it was: "alway" and "none" with an interval never synced, a group of 0
    # synced at every append, and a string interval killed the timer's thread (no sync after).
    with pytest.raises(Error, match=re.escape(wrong)):
        SyncPolicy(*args)


def test_describe_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _journal(tmp_path, 8)  # segments 0, 3 and 6
    _collected_after_listing(tmp_path, monkeypatch)
    # It was a bare FileNotFoundError (`journalq info` on a live queue's topic).
    info = describe(tmp_path)
    assert [s.base for s in info.segments] == [3, 6]
    assert (info.first_offset, info.end_offset, info.messages) == (3, 8, 5)


def test_first_offset_since_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.inspect import first_offset_since
    from journalq.journal.segment import list_segments, remove_segment

    _journal(tmp_path, 8)
    listed = list_segments(tmp_path)
    remove_segment(listed[0])
    monkeypatch.setattr(inspect_mod, "list_segments", lambda path: listed)
    # It was OffsetOutOfRangeError ("offset 0 is no longer stored"): the scan began where the
    # journal had begun, from its own listing, not at the oldest message stored.
    assert first_offset_since(tmp_path, 0) == 3
    assert first_offset_since(tmp_path, 2**62) == 8


def test_a_directory_where_a_lock_file_goes_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "jnl.lck").mkdir()
    (tmp_path / "ofs" / "r.lck").mkdir(parents=True)
    # Each was a bare IsADirectoryError.
    for call, file in (
        (lambda: Writer(tmp_path), tmp_path / "jnl.lck"),
        (lambda: Writer(tmp_path, shared=True), tmp_path / "jnl.lck"),
        (lambda: ReaderOffset(tmp_path, "r"), tmp_path / "ofs" / "r.lck"),
        (lambda: set_offset(tmp_path, "r", 0), tmp_path / "ofs" / "r.lck"),
    ):
        with pytest.raises(JournalError, match="not a lock file: a directory has a lock file.s name") as info:
            call()
        assert info.value.file == file


@pytest.mark.parametrize("pid", ["0", "4294967296", "99999999999999999999999"])
def test_check_takes_a_temporary_file_naming_no_possible_process_for_abandoned(tmp_path: Path, pid: str) -> None:
    _journal(tmp_path)
    leftover = tmp_path / "jnl" / f"{0:016x}.idx.{pid}.tmp"
    leftover.write_bytes(b"x")
    os.utime(leftover, (1, 1))  # long ago
    # A pid past a C long raised OverflowError out of check; pid 0 (os.kill's "my process
    # group") was taken for a live process's write in progress, for ever.
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("index", leftover, True)]
    assert not leftover.exists()


@pytest.mark.parametrize("one", [b"abc", bytearray(b"abc"), "abc", Message(value=b"abc")])
def test_append_many_given_one_message_says_so(tmp_path: Path, one: object) -> None:
    # It was "item 0 of the batch is a int": the bytes (or the Message's fields) taken for items.
    with Writer(tmp_path) as writer:
        with pytest.raises(InvalidMessageError, match="a batch must be an iterable of values or Messages, not one"):
            writer.append_many(one)  # type: ignore[arg-type]
        assert writer.next_offset == 0


def test_a_shared_writer_that_cannot_open_the_segment_another_started_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up that went on to the segment another writer started, and could not open it
    (too many open files), had closed the segment it was on: every later append failed with
    EBADF, for good, and ``failed`` did not say so. It now stays on its segment until the next
    one is open, and the next append goes on."""
    import journalq.journal.writer as writer_mod

    first = Writer(tmp_path, shared=True, segment_size=100)
    second = Writer(tmp_path, shared=True, segment_size=100)
    first.append(b"x" * 40)
    second.append(b"y" * 40)  # 66 + 66 bytes: the second rolls, and starts segment 2
    real = writer_mod.IndexAppender
    failures = [OSError(errno.EMFILE, os.strerror(errno.EMFILE))]

    def index_appender(*args: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(writer_mod, "IndexAppender", index_appender)
    with pytest.raises(OSError, match="Too many open files"):
        first.append(b"lost")
    assert not failures and not first.failed
    assert first.append(b"z") == 2
    assert second.append(b"w") == 3
    first.close()
    second.close()
    assert _values(tmp_path) == [b"x" * 40, b"y" * 40, b"z", b"w"]


def test_a_full_disk_at_the_reservation_after_a_shared_writers_cut_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import journalq.journal.writer as writer_mod

    writer = Writer(tmp_path, shared=True)
    writer.append(b"one")
    torn = _torn_tail(writer, 1)

    def full(fd: int, offset: int, length: int) -> bool:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_mod, "reserve", full)
    with pytest.raises(StorageError, match="nothing of them was stored") as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC and info.value.offset == 1
    [recovery] = writer.recoveries  # the cut was done, and kept
    assert recovery.saved_to.read_bytes() == torn
    monkeypatch.undo()
    assert writer.append(b"two") == 1
    writer.close()
    assert _values(tmp_path) == [b"one", b"two"]


# -- seeking in a journal that cannot be written -----------------------------------------------


def test_a_seek_in_a_read_only_journal_does_not_scan_the_whole_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seek into a sealed segment without index scanned all of it to rebuild the index, even
    where it could not write one: every seek (a reader without write permission, an archive, the
    sej vectors) read the whole segment, 0.38 s for offset 1,000 of a 32 MiB segment against 2 ms.
    It now reads from the segment's start to the offset, as with no index."""
    import journalq.journal.scanner as scanner_mod

    with Writer(tmp_path, segment_size=4096, index_interval=64) as writer:
        writer.append_many([b"x" * 100] * 80)  # segments of 32 messages of 126 bytes
    for index_file in (tmp_path / "jnl").glob("*.idx"):
        index_file.unlink()
    scans: list[int] = []
    real = scanner_mod.scan_segment

    def recorded(segment: object, *args: object, **kwargs: object) -> object:
        scans.append(1)
        return real(segment, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scanner_mod, "scan_segment", recorded)
    (tmp_path / "jnl").chmod(0o555)
    try:
        for offset in (1, 20, 40):
            with Scanner(tmp_path, offset) as scanner:
                assert next(iter(scanner)).offset == offset
        assert scans == []
        assert not list((tmp_path / "jnl").glob("*.idx"))
    finally:
        (tmp_path / "jnl").chmod(0o755)
    with Scanner(tmp_path, 20) as scanner:  # writable again: the index is rebuilt once
        assert next(iter(scanner)).offset == 20
    assert scans == [1] and (tmp_path / "jnl" / f"{0:016x}.idx").exists()


def test_check_repair_beside_a_writer_that_holds_the_lock_for_good_is_refused_not_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sej's own writer holds jnl.lck for its lifetime and leaves no note: a repair that waited
    for the lock as a shared writer does (for one append) would wait for ever."""
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.lock import FileLock

    _journal(tmp_path)
    monkeypatch.setattr(inspect_mod, "_LOCK_WAIT", 0.3)
    sej = FileLock(tmp_path / "jnl.lck")
    sej.acquire()
    outcome: list[BaseException | None] = []

    def repair() -> None:
        try:
            check(tmp_path, repair=True)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=repair, daemon=True)
    thread.start()
    thread.join(10)
    sej.close()  # lets a hung repair go on
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], LockedError), outcome
    assert "held the lock" in str(outcome[0])


def test_a_batch_that_rolls_onto_a_directory_with_the_next_segments_name_stores_nothing(tmp_path: Path) -> None:
    writer = Writer(tmp_path, segment_size=100)
    writer.append(b"v" * 20)  # 46 bytes: offsets 0-2 fill segment 0, offset 3 starts the next
    directory = segment_at(tmp_path, 3).path
    directory.mkdir()
    with pytest.raises(JournalError, match="a directory has a segment's name") as info:
        writer.append_many([b"w" * 20] * 5)
    assert info.value.file == directory
    assert writer.next_offset == 1 and not writer.failed
    directory.rmdir()
    assert writer.append(b"x") == 1
    writer.close()
    assert _values(tmp_path) == [b"v" * 20, b"x"]  # nothing of the batch


def test_a_directory_where_an_index_goes_is_no_index_and_named(tmp_path: Path) -> None:
    _journal(tmp_path, 8)  # segments 0, 3 and 6
    for base in (0, 6):
        segment_at(tmp_path, base).index_path.unlink()
        segment_at(tmp_path, base).index_path.mkdir()
    # Each was a bare IsADirectoryError: the seek's index lookup, check, the writer's opening.
    with Scanner(tmp_path, 1) as scanner:
        assert [m.offset for m in scanner] == list(range(1, 8))
    with Scanner(tmp_path, 7) as scanner:
        assert [m.offset for m in scanner] == [7]
    for repair in (False, True):
        problems = check(tmp_path, repair=repair).remaining
        assert [(p.kind, p.file) for p in problems] == [
            ("index", segment_at(tmp_path, 0).index_path),
            ("index", segment_at(tmp_path, 6).index_path),
        ]
        assert all(p.reason.startswith("not an index: a directory has an index's name") for p in problems)
    with pytest.raises(JournalError, match="not an index: a directory has an index's name") as info:
        Writer(tmp_path, segment_size=100)
    assert info.value.file == segment_at(tmp_path, 6).index_path
