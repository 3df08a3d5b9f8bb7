"""Audit of the journal's readers: end_offset, reader offsets and the scanner's batches."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from journalq.errors import JournalError
from journalq.journal import Writer, end_offset


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
