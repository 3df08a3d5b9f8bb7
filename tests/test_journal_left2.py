"""The journal layer's leftovers of the 2026-11-23 audit: a directory with a segment's name, a
full disk under a shared writer's catch-up, the scanner's offset check, macOS's full sync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journalq.errors import JournalError
from journalq.journal import Scanner, Writer, end_offset
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
