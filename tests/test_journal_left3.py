"""Bugs of the journal's readers, locks and commands found by a third audit: each test here
failed before its fix."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner, Result

from journalq.cli.main import cli
from journalq.errors import Error, InvalidArgumentError, JournalError, OffsetOutOfRangeError, ScanTimeout
from journalq.journal import Scanner, Writer
from journalq.journal.inspect import check
from journalq.journal.lock import FileLock
from journalq.journal.segment import lock_path, segment_at
from conftest import fifo_at, returned_at_once


def test_next_message_raises_scan_timeout_when_none_comes_in_time(tmp_path):
    """``ScanTimeout`` was never raised: a following scanner's iteration ends quietly, and a
    caller waiting for one message could not tell a timeout from the end."""
    with Writer(tmp_path) as writer:
        writer.append(b"first")
    with Scanner(tmp_path, 0, timeout=0.2) as scanner:
        assert scanner.next_message().value == b"first"
        began = time.monotonic()
        with pytest.raises(ScanTimeout, match=r"no new message within 0\.2 s") as caught:
            scanner.next_message()
        assert time.monotonic() - began >= 0.2
        assert isinstance(caught.value, TimeoutError) and caught.value.offset == 1
        with Writer(tmp_path) as writer:
            writer.append(b"second")
        assert scanner.next_message().value == b"second"  # it goes on after a timeout
    with Scanner(tmp_path, 1) as scanner:  # not following: it waits no time at all
        assert scanner.next_message().value == b"second"
        with pytest.raises(ScanTimeout, match="end of the journal"):
            scanner.next_message()


@pytest.mark.parametrize("offset", [-1, -(2**70)])
def test_a_negative_offset_is_a_bad_argument_not_out_of_range(tmp_path, offset):
    """It raised ``OffsetOutOfRangeError``, which says the journal does not hold the offset (now,
    or any more), and which callers catch to look again elsewhere."""
    with Writer(tmp_path) as writer:
        writer.append(b"x")
    with pytest.raises(InvalidArgumentError, match=f"offset must be an integer, 0 or more, not {offset}") as caught:
        Scanner(tmp_path, offset)
    assert not isinstance(caught.value, OffsetOutOfRangeError)
    assert isinstance(caught.value, ValueError)  # (a bad argument, as Python's own say it)


def test_a_shared_writer_clears_a_dead_exclusive_writers_note_when_it_takes_the_lock(tmp_path):
    """The note a killed exclusive writer left in jnl.lck stayed when a shared writer that was
    open already took the lock for its appends: once the dead writer's pid was reused, a writer
    that found the lock held (for one append) read the note and refused with a ``LockedError``
    naming the dead holder, instead of waiting for the append."""
    shared = Writer(tmp_path, shared=True)
    try:
        # What a killed exclusive writer leaves, its pid since reused by a live process (this one).
        FileLock(lock_path(tmp_path)).write_note(f"exclusive writer, pid {os.getpid()}")
        shared.append(b"after the exclusive writer died")
        assert FileLock(lock_path(tmp_path)).read_note() == ""
        opened: list[object] = []

        def open_another() -> None:
            try:
                Writer(tmp_path, shared=True).close()
                opened.append("opened")
            except Error as exc:
                opened.append(exc)

        with shared.hold():  # another shared writer's append in progress
            other = threading.Thread(target=open_another)
            other.start()
            time.sleep(0.2)
        other.join(10)
        assert opened == ["opened"]
    finally:
        shared.close()


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


# -- the command line --------------------------------------------------------------------------


def run(*args: object) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_one_segment_is_not_said_segments(tmp_path):
    """info and check said "1 segments" and "1 messages"."""
    with Writer(tmp_path / "j") as writer:
        writer.append(b"only")
    info = run("info", tmp_path / "j", "--format", "table").stdout.splitlines()[0]
    assert info.startswith(f"{tmp_path / 'j'}: 1 segment, 1 message (offsets 0-0; next 1)")
    checked = run("check", tmp_path / "j", "--format", "table").stdout
    assert checked == f"{tmp_path / 'j'}: ok; 1 segment, 1 message checked\n"
    with Writer(tmp_path / "j", segment_size=10) as writer:
        writer.append(b"two")  # the first segment is over its size: a second one
    assert ": 2 segments, 2 messages" in run("info", tmp_path / "j", "--format", "table").stdout


def _output_until(process: subprocess.Popen, expected: bytes, seconds: float = 10) -> bytes:
    """What ``process`` printed, once it printed ``expected`` (or ``seconds`` passed)."""
    assert process.stdout is not None
    fd, out, deadline = process.stdout.fileno(), b"", time.monotonic() + seconds
    while not out.endswith(expected) and (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            if not (chunk := os.read(fd, 4096)):
                break
            out += chunk
    return out


def test_scan_follow_count_prints_the_count_as_it_changes(tmp_path, child_env):
    """Following, --count printed nothing, ever: the count came once the scan ended, and a
    scan that follows without a timeout ends only with Ctrl-C (quietly)."""
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append_many([b"a", b"b"])
    follower = subprocess.Popen(
        [sys.executable, "-m", "journalq.cli.main", "scan", str(journal), "--follow", "--count"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env,
    )
    try:
        assert _output_until(follower, b"2\n") == b"2\n"
        with Writer(journal) as writer:
            writer.append(b"c")
        assert _output_until(follower, b"3\n") == b"3\n"
    finally:
        follower.send_signal(signal.SIGINT)
        _, stderr = follower.communicate(timeout=20)
    assert follower.returncode == 130, stderr
    # With a timeout the last line is the count; nothing came: 0, once.
    assert run("scan", journal, "--timeout", "0.1", "--count").stdout == "3\n"
    assert run("scan", journal, "--from", "3", "--timeout", "0.1", "--count").stdout == "0\n"
