"""Audit of the journal's readers: end_offset, reader offsets and the scanner's batches."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from journalq.errors import Error, JournalError
from journalq.journal import Scanner, Writer, end_offset


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


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_read_batch_refuses_a_bad_size(tmp_path, bad):
    # read_batch(0) answered [] (the end's answer), read_batch(-1) all but the last message.
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    with Scanner(tmp_path) as scanner:
        with pytest.raises(Error, match="max_messages must be an integer, 1 or more"):
            scanner.read_batch(bad)
        assert scanner.offset == 0
        assert [m.value for m in scanner.read_batch(2)] == [b"a", b"b"]


@pytest.mark.parametrize("offset", [1.5, "1", True])
def test_scanner_refuses_an_offset_that_is_no_integer(tmp_path, offset):
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    with pytest.raises(Error, match="offset must be an integer"):
        Scanner(tmp_path, offset)


@pytest.mark.parametrize("timeout", [-1, "1", float("nan")])
def test_scanner_refuses_a_bad_timeout(tmp_path, timeout):
    with Writer(tmp_path) as writer:
        writer.append(b"a")
    with pytest.raises(Error, match="timeout must be"):
        Scanner(tmp_path, timeout=timeout)
