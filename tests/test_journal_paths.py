"""Journal paths that are not what they must be: a file where a journal's directory (or its
``jnl/``, or its ``ofs/``) goes; a directory or a named pipe where a segment, an index, the lock
file, an offset file or a queue's settings file goes. The error must say so, as a journalq error
naming the path, and a named pipe is never opened to wait for its other end."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from journalq.errors import JournalError
from journalq.journal import ReaderOffset, Scanner, Writer, end_offset, index, set_offset
from journalq.journal.inspect import check, describe
from journalq.journal.segment import Segment, list_segments, segment_at
from conftest import fifo_at, journal_values, returned_at_once, small_journal

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def test_a_writer_on_a_file_says_it_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    # It was FileExistsError "File exists: 'f'": as if the journal were there already.
    with pytest.raises(JournalError, match="not a directory") as info:
        Writer(tmp_path / "f")
    assert info.value.file == tmp_path / "f"
    assert (tmp_path / "f").read_bytes() == b"x"


def test_a_writer_whose_jnl_is_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "jnl").write_bytes(b"x")
    with pytest.raises(JournalError, match="not a directory") as info:
        Writer(tmp_path / "j", sync="always")
    assert info.value.file == tmp_path / "j" / "jnl"


def test_reader_offsets_whose_ofs_is_a_file_say_so(tmp_path: Path) -> None:
    (tmp_path / "ofs").write_bytes(b"x")
    with pytest.raises(JournalError, match="not a directory") as info:
        ReaderOffset(tmp_path, "alpha")
    assert info.value.file == tmp_path / "ofs"
    with pytest.raises(JournalError, match="not a directory"):
        set_offset(tmp_path, "alpha", 3)
    assert (tmp_path / "ofs").read_bytes() == b"x"


# -- a directory where a segment, a lock or an index goes -------------------------------------


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
    small_journal(tmp_path)  # segments 0 (offsets 0-2) and 3 (3-4)
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
    assert journal_values(tmp_path) == [b"v" * 20, b"x"]  # nothing of the batch


def test_a_directory_where_an_index_goes_is_no_index_and_named(tmp_path: Path) -> None:
    small_journal(tmp_path, 8)  # segments 0, 3 and 6
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


# -- a special file (a named pipe) where a journal's file goes: refused, never waited on ----------


@pytest.mark.parametrize("where", ["the only segment", "the last segment", "a segment before the last"])
def test_a_fifo_with_a_segments_name_is_refused_without_blocking(tmp_path, where):
    """open() of a FIFO waits for a writer to open its other end: a named pipe with a segment's
    name blocked the opening of a writer, a scanner or ``check`` for ever."""
    if where != "the only segment":
        with Writer(tmp_path, segment_size=100) as writer:
            writer.append_many([b"v" * 120] * 3)  # one message a segment: 0, 1, 2, then 3 empty
    base = {"the only segment": 0, "the last segment": 3, "a segment before the last": 1}[where]
    fifo = tmp_path / "jnl" / f"{base:016x}.jnl"
    fifo.parent.mkdir(exist_ok=True)
    with fifo_at(fifo):
        calls = [lambda: Scanner(tmp_path, base).read_batch()]
        if where != "a segment before the last":  # a writer opens the last segment only
            calls += [lambda: Writer(tmp_path).close(), lambda: Writer(tmp_path, shared=True).close()]
        for call in calls:
            error = returned_at_once(call)
            assert isinstance(error, JournalError) and error.file == fifo, error
            assert "not a segment: a special file has a segment's name" in str(error)
        report = returned_at_once(lambda: check(tmp_path))
        assert [(p.kind, p.file) for p in report.problems] == [("segment", fifo)]
        assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left as it was


def test_the_other_readers_of_segments_refuse_a_fifo_without_blocking(tmp_path):
    """The same for the readers that opened segments by their path rather than through
    ``open_segment``: a topic's look at a segment's last message (its gc), its deduplication's
    look at a segment's first, and the hub's raw reader (a push's)."""
    from journalq.hub.source import RawReader
    from journalq.queue.topic import DedupIndex, last_timestamp

    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 120] * 3)  # one message a segment: 0, 1, 2, then 3 empty
    fifo = tmp_path / "jnl" / f"{1:016x}.jnl"
    with fifo_at(fifo):
        for call in (
            lambda: last_timestamp(segment_at(tmp_path, 1)),
            lambda: DedupIndex(tmp_path, 3600).catch_up(),  # the window reaches back to segment 1
            lambda: RawReader(tmp_path).read(1),
        ):
            error = returned_at_once(call)
            assert isinstance(error, JournalError) and error.file == fifo, error
            assert "not a segment: a special file has a segment's name" in str(error)


# -- a named pipe or a directory where an index goes ---------------------------------------------


def _journal(path: Path) -> Segment:
    """Two segments of 41 messages, each with its index (the first's with entries); the last."""
    with Writer(path, segment_size=3000, index_interval=100) as writer:
        writer.append_many([b"v" * 60] * 41)
    first, last = list_segments(path)
    assert index.read_entries(first) and last.index_path.exists()
    return last


SPECIAL = "not an index: a special file has an index's name"


def test_readers_of_an_index_take_a_fifo_with_its_name_for_no_index(tmp_path: Path) -> None:
    """Each opened the index with a plain open(), which waits for ever for a named pipe's other
    end: a seek (a scanner's, the hub's raw reader's, Spark's), a writer's opening, ``check``.
    An index is a hint, rebuilt from its segment: a pipe there is no index, as a damaged one."""
    _journal(tmp_path)
    segment = segment_at(tmp_path, 0)
    with fifo_at(segment.index_path):
        assert returned_at_once(lambda: index.lookup(segment, 20)) is None
        assert returned_at_once(lambda: index.read_entries(segment)) == []
        assert returned_at_once(lambda: index.last_position(segment)) == 0
        report = returned_at_once(lambda: check(tmp_path))
        assert [(p.kind, p.file, p.reason, p.fixed) for p in report.problems] == [
            ("index", segment.index_path, SPECIAL, False)
        ]
        assert stat.S_ISFIFO(segment.index_path.lstat().st_mode)  # check alone changes nothing

        def seek() -> list[int]:
            with Scanner(tmp_path, 20) as scanner:
                return [m.offset for m in scanner]

        assert returned_at_once(seek) == list(range(20, 41))
    # The seek rebuilt it, as it rebuilds a damaged index of a sealed segment (with the scan's
    # interval, wider than the segment: no entry, but an index, which says to start at 0).
    assert stat.S_ISREG(segment.index_path.lstat().st_mode) and index.lookup(segment, 20) == (0, 0)


def test_check_repair_rebuilds_an_index_that_is_a_fifo(tmp_path: Path) -> None:
    _journal(tmp_path)
    segment = segment_at(tmp_path, 0)
    with fifo_at(segment.index_path):
        report = returned_at_once(lambda: check(tmp_path, repair=True))
    assert [(p.kind, p.file, p.reason, p.fixed) for p in report.problems] == [
        ("index", segment.index_path, SPECIAL, True)
    ]
    assert not check(tmp_path).problems


def test_a_writer_rebuilds_its_index_over_a_fifo_or_refuses_it_by_name(tmp_path: Path) -> None:
    """The last segment's index a named pipe: a writer rebuilds it, as any damaged index; where
    it cannot (the directory read-only), it refuses it by name, as an index that is a directory,
    instead of waiting for ever for the pipe's reader."""
    last = _journal(tmp_path)
    with fifo_at(last.index_path):
        returned_at_once(lambda: Writer(tmp_path).close())
    assert stat.S_ISREG(last.index_path.lstat().st_mode)

    jnl = last.path.parent
    with fifo_at(last.index_path):
        jnl.chmod(0o555)  # (root may write there anyway: ``index.writable`` asks the bits too)
        try:
            error = returned_at_once(lambda: Writer(tmp_path).close())
        finally:
            jnl.chmod(0o755)
        assert isinstance(error, JournalError) and error.file == last.index_path, error
        assert error.reason == SPECIAL
        assert stat.S_ISFIFO(last.index_path.lstat().st_mode)


def test_an_index_that_is_a_directory_is_named_as_a_fifo_is(tmp_path: Path) -> None:
    """One refusal for what has an index's name but is no file (as for segments)."""
    last = _journal(tmp_path)
    last.index_path.unlink()
    last.index_path.mkdir()
    with pytest.raises(JournalError) as info:
        Writer(tmp_path)
    assert (info.value.reason, info.value.file) == ("not an index: a directory has an index's name", last.index_path)


def test_an_index_rebuild_is_given_up_where_a_fifo_has_its_temporary_files_name(tmp_path: Path) -> None:
    """``write_index`` wrote the new index to ``NAME.idx.PID.tmp`` with a plain open(), which
    waited for ever for the reader of a named pipe with that name. A rebuild that cannot be
    written is given up (False), as in a read-only directory: the index is a hint."""
    last = _journal(tmp_path)
    entries = index.read_entries(last)
    temporary = last.index_path.with_name(f"{last.index_path.name}.{os.getpid()}.tmp")
    with fifo_at(temporary):
        assert returned_at_once(lambda: index.write_index(last, entries)) is False
        assert stat.S_ISFIFO(temporary.lstat().st_mode)
    assert index.read_entries(last) == entries  # the index as it was


# -- a named pipe where an offset file, the lock file or a queue's settings file goes -------------


def test_a_fifo_with_an_offset_files_name_is_refused_by_name(tmp_path: Path) -> None:
    """``read_offset`` read the file with a plain open(), which waited for ever for the pipe's
    other end: so did ``check`` (it reads every offset) and a reader opening with the name."""
    from journalq.journal.offsets import read_offset

    _journal(tmp_path)
    path = tmp_path / "ofs" / "r.ofs"
    path.parent.mkdir(exist_ok=True)
    with fifo_at(path):
        error = returned_at_once(lambda: read_offset(tmp_path, "r"))
        assert isinstance(error, JournalError) and error.file == path
        assert str(error).startswith("not an offset file: a special file has an offset file's name")
        assert any("r.ofs" in str(problem) for problem in returned_at_once(lambda: check(tmp_path)).problems)


def test_a_fifo_with_the_lock_files_name_is_refused_by_name(tmp_path: Path) -> None:
    """A writer failed with a bare OSError(22, 'Invalid argument') from flock, naming no file;
    the lock's note (read for a refused writer's error) waited for ever on the pipe."""
    from journalq.journal.lock import FileLock
    from journalq.journal.segment import lock_path

    _journal(tmp_path)
    with fifo_at(lock_path(tmp_path)) as path:
        error = returned_at_once(lambda: Writer(tmp_path))
        assert isinstance(error, JournalError) and error.file == path
        assert str(error).startswith("not a lock file: a special file has a lock file's name")
        assert returned_at_once(lambda: FileLock(path).read_note()) == ""


def test_a_fifo_with_a_queue_settings_files_name_is_refused_by_name(tmp_path: Path) -> None:
    """Opening the queue read its ``queue.json`` with a plain open(), which waited for ever for
    the pipe's other end (a server's worker with it)."""
    from journalq.errors import SettingsFileError
    from journalq.queue import Broker
    from journalq.queue.settings import SETTINGS_FILE

    with Broker(tmp_path, sync="none") as broker:
        broker.queue("q").send(b"kept")
    with fifo_at(tmp_path / "q" / SETTINGS_FILE) as path, Broker(tmp_path, sync="none") as broker:
        error = returned_at_once(lambda: broker.queue("q"))
        assert isinstance(error, SettingsFileError) and error.file == path
        assert str(error).startswith("cannot read queue settings: not a settings file: a special file has")
