"""Bugs of the journal's index and ``inspect`` found by a fourth audit: each test here failed
before its fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
from journalq.errors import JournalError
from journalq.journal import Scanner, Writer, index
from journalq.journal.inspect import check, describe
from journalq.journal.segment import Segment, list_segments, segment_at
from conftest import fifo_at, returned_at_once


def _journal(path: Path) -> Segment:
    """Two segments of 41 messages, each with its index (the first's with entries); the last."""
    with Writer(path, segment_size=3000, index_interval=100) as writer:
        writer.append_many([b"v" * 60] * 41)
    first, last = list_segments(path)
    assert index.read_entries(first) and last.index_path.exists()
    return last


# -- a named pipe with an index's name ---------------------------------------------------------

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


# -- a dangling link with a segment's name -----------------------------------------------------


@pytest.fixture
def dangling(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A journal of segments 0, 2, 4, 6 and 8 (the last, empty) where one of them, as
    ``request.param`` says, is a link to nowhere: the link."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 9)  # two messages a segment
    assert [s.base for s in list_segments(tmp_path)] == [0, 2, 4, 6, 8]
    link = segment_at(tmp_path, request.param).path
    link.unlink()
    link.symlink_to(tmp_path / "nowhere")
    return link


@pytest.mark.parametrize("dangling", [0, 4, 8], indirect=True, ids=["first", "middle", "last"])
def test_describe_names_a_segment_that_is_a_dangling_link(tmp_path: Path, dangling: Path) -> None:
    """``describe`` (``journalq info``, the hub's status) skipped it as a segment collected since
    the listing: the journal read as whole without it (a last one gone, its end one segment
    early). A segment listed still that cannot be opened is refused by name, as one that is a
    directory."""
    with pytest.raises(JournalError) as info:
        describe(tmp_path)
    assert (info.value.reason, info.value.file) == ("segment is listed but cannot be opened", dangling)
    result = CliRunner().invoke(cli, ["info", str(tmp_path), "--format", "jsonl"])
    assert result.exit_code != 0 and str(dangling) in result.output, result.output


@pytest.mark.parametrize("dangling", [0, 4, 8], indirect=True, ids=["first", "middle", "last"])
@pytest.mark.parametrize("repair", [False, True])
def test_check_reports_a_segment_that_is_a_dangling_link(tmp_path: Path, dangling: Path, repair: bool) -> None:
    """``check`` skipped it the same way, and said the journal was ok; with ``repair`` and the
    last segment the link, it failed with a bare FileNotFoundError. It is a segment problem,
    named, never repaired (a directory there is one too)."""
    report = check(tmp_path, repair=repair)
    assert not report.ok
    assert [(p.kind, p.file, p.reason, p.fixed) for p in report.problems] == [
        ("segment", dangling, "segment is listed but cannot be opened", False)
    ]
    assert dangling.is_symlink()


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


# -- a named pipe with an offset file's or the lock file's name ----------------------------------


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
