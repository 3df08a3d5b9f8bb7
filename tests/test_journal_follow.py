"""Bugs of following and reading journals found by an audit: each test here failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import JournalError
from journalq.journal import Scanner, Writer


def _journal(path: Path, n: int) -> Path:
    with Writer(path) as writer:
        for i in range(n):
            writer.append(b"%d" % i)
    return path


def test_a_closed_scanner_refuses_to_read_rather_than_read_again(tmp_path: Path) -> None:
    """Once closed, a scanner reopened its segment at the start and gave the messages again."""
    path = _journal(tmp_path / "j", 5)
    scanner = Scanner(path)
    assert [m.offset for m in scanner.read_batch(2)] == [0, 1]  # 3 more decoded, not handed out
    scanner.close()
    assert scanner.offset == 2  # still says where it stopped
    with pytest.raises(JournalError, match="scanner is closed"):
        scanner.read_batch()
    with pytest.raises(JournalError, match="scanner is closed"):
        list(scanner)
    scanner.close()  # twice is harmless
    assert scanner.offset == 2
    with Scanner(path, scanner.offset) as resumed:
        assert [m.offset for m in resumed] == [2, 3, 4]


def test_closing_a_scanner_mid_iteration_ends_it_with_the_error(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j", 5)
    scanner = Scanner(path)
    iteration = iter(scanner)
    assert next(iteration).offset == 0
    scanner.close()
    with pytest.raises(JournalError, match="scanner is closed"):
        next(iteration)
    assert scanner.offset == 1


def test_a_closed_following_scanner_of_an_empty_journal_refuses_to_read(tmp_path: Path) -> None:
    """With no segment open (an empty journal), a read looked for one again, as if never closed."""
    path = tmp_path / "j"
    Writer(path).close()
    scanner = Scanner(path, timeout=0)
    assert scanner.read_batch() == []
    scanner.close()
    with pytest.raises(JournalError, match="scanner is closed"):
        scanner.read_batch()
