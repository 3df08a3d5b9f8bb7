"""Indexes whose segment is gone (``%016x.idx`` with no ``%016x.jnl``): a seek that rebuilds an
index must not leave one behind a gc that deleted its segment meanwhile, and ``check`` reports
(``--repair`` removes) those that a process killed between a segment's deletion and its index's
left."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import journalq.journal.scanner as scanner_mod
from journalq.journal import Scanner, Writer
from journalq.journal.index import read_entries
from journalq.journal.inspect import check
from journalq.journal.segment import list_segments

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def build(path: Path) -> list:
    with Writer(path, segment_size=20_000) as w:
        w.append_many([b"m%05d" % i * 8 for i in range(1500)])
    segments = list_segments(path)
    assert len(segments) > 2
    return segments


def test_a_seek_does_not_leave_the_index_of_a_segment_collected_while_it_rebuilt_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segments = build(tmp_path)
    sealed = segments[0]
    target = read_entries(sealed)[-1][0] + 1
    sealed.index_path.unlink()  # to be rebuilt by the seek
    real = scanner_mod.scan_segment

    def collected_meanwhile(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        scan = real(*args, **kwargs)
        sealed.path.unlink()  # a gc in another process, between the scan and the index's write
        sealed.index_path.unlink(missing_ok=True)
        return scan

    monkeypatch.setattr(scanner_mod, "scan_segment", collected_meanwhile)
    with Scanner(tmp_path, target) as s:
        assert next(iter(s)).offset == target  # read through the segment it holds open
    assert not sealed.index_path.exists()



def test_check_reports_an_index_without_its_segment_and_repair_removes_it(tmp_path: Path) -> None:
    segments = build(tmp_path)
    gone = segments[0]
    gone.path.unlink()  # a gc killed before it deleted the index too
    assert gone.index_path.exists()
    report = check(tmp_path)
    assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("index", gone.index_path, False)]
    assert "its segment" in report.problems[0].reason and not report.ok
    assert gone.index_path.exists()  # a check without repair changes nothing
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("index", gone.index_path, True)]
    assert not gone.index_path.exists()
    assert check(tmp_path).problems == []
    assert all(s.index_path.exists() for s in segments[1:])


def test_removing_a_segment_never_leaves_its_index_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed between a segment's two deletions leaves the segment (a journal's data,
    which a writer recovers) rather than an index of nothing: the index goes first."""
    from journalq.journal.segment import remove_segment

    segments = build(tmp_path)
    gone = segments[0]
    real = Path.unlink
    done: list[Path] = []

    def killed_after_one(self: Path, missing_ok: bool = False) -> None:
        if done:
            raise KeyboardInterrupt  # as kill -9 would stop it, before the second deletion
        real(self, missing_ok=missing_ok)
        done.append(self)

    monkeypatch.setattr(Path, "unlink", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        remove_segment(gone)
    monkeypatch.undo()
    assert done == [gone.index_path] and gone.path.exists()
    assert [p.reason for p in check(tmp_path).problems] == ["index is missing"]  # a mere hint
    remove_segment(gone)
    assert not gone.path.exists() and not gone.index_path.exists()
    remove_segment(gone)  # nothing left to remove: no error


def test_removing_a_segment_takes_an_index_a_seek_rebuilt_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from journalq.journal.index import write_index
    from journalq.journal.segment import remove_segment

    segments = build(tmp_path)
    gone = segments[0]
    entries = read_entries(gone)
    real = Path.unlink

    def rebuilt_between(self: Path, missing_ok: bool = False) -> None:
        real(self, missing_ok=missing_ok)
        if self == gone.index_path and gone.path.exists():
            write_index(gone, entries)  # a scanner's rebuild, with the segment still there

    monkeypatch.setattr(Path, "unlink", rebuilt_between)
    remove_segment(gone)
    monkeypatch.undo()
    assert not gone.path.exists() and not gone.index_path.exists()
    assert check(tmp_path).problems == []


def test_check_reports_the_temporary_files_of_killed_processes_and_repair_removes_them(tmp_path: Path) -> None:
    """An index rebuilt, or a reader offset committed, is written to a temporary file renamed over
    the old one: a process killed in between left that file for ever. A live process's is its
    write in progress, left alone."""
    import subprocess
    import sys

    from journalq.journal import ReaderOffset

    build(tmp_path)
    with ReaderOffset(tmp_path, "alpha") as reader:
        reader.commit(5)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    pid = int(dead.stdout)
    stray = [
        tmp_path / "jnl" / f"0000000000000000.idx.{pid}.tmp",
        tmp_path / "ofs" / f"alpha.ofs.{pid}.{pid}.tmp",
    ]
    live = [
        tmp_path / "jnl" / f"0000000000000000.idx.{os.getpid()}.tmp",
        tmp_path / "ofs" / f"alpha.ofs.{os.getpid()}.1.tmp",
    ]
    for file in stray + live:
        file.write_bytes(b"half")
    young = tmp_path / "ofs" / f"beta.ofs.{pid}.{pid}.tmp"  # maybe another pid namespace's: left
    young.write_bytes(b"half")
    for file in stray + live:
        os.utime(file, (time.time() - 3600, time.time() - 3600))
    report = check(tmp_path)
    assert sorted((p.kind, p.file, p.fixed) for p in report.problems) == sorted(
        [("index", stray[0], False), ("offset", stray[1], False)]
    )
    assert all(f"left by process {pid}" in p.reason for p in report.problems)
    report = check(tmp_path, repair=True)
    assert all(p.fixed for p in report.problems) and len(report.problems) == 2
    assert not any(f.exists() for f in stray) and all(f.exists() for f in live) and young.exists()
    assert check(tmp_path).problems == []


def test_check_reports_a_damaged_reader_offset_and_leaves_it(tmp_path: Path) -> None:
    """A reader offset that is not 8 bytes (``ReaderOffset`` refuses to open it, and a queue's
    gc cannot read it): reported, never "repaired" (``journalq offset --set`` mends it)."""
    build(tmp_path)
    (tmp_path / "ofs").mkdir()
    damaged = tmp_path / "ofs" / "beta.ofs"
    damaged.write_bytes(b"\x00\x01\x02")
    (tmp_path / "ofs" / "empty.ofs").write_bytes(b"")  # as sej reads it: never committed, 0
    for repair in (False, True):
        report = check(tmp_path, repair=repair)
        assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("offset", damaged, False)]
        assert "holds 3 bytes, not 8" in report.problems[0].reason
    assert damaged.read_bytes() == b"\x00\x01\x02"
