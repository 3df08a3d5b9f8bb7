"""The scanner: following appends, waiting out incomplete messages, damage, timeouts, resuming."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from itertools import islice
from pathlib import Path
from unittest import mock

import pytest

from journalq.errors import CorruptionError, Error, JournalError, OffsetOutOfRangeError, TruncatedError
from journalq.errors import InvalidArgumentError, ScanTimeout
from journalq.journal import Message, Scanner, Writer
from journalq.journal import scanner as scanner_module
from journalq.journal.codec import encode
from journalq.journal.segment import list_segments, segment_bases
from conftest import size_past_the_end

pytestmark = pytest.mark.usefixtures("vectors_untouched")

SEG0 = "0000000000000000.jnl"


def scan_all(path: Path, offset: int = 0):
    with Scanner(path, offset) as s:
        return list(s)


class Follower(threading.Thread):
    """Iterates a following scanner in a thread until it has ``want`` messages or it ends."""

    def __init__(self, path: Path, want: int, offset: int = 0, timeout: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.scanner = Scanner(path, offset, timeout=timeout)
        self.want = want
        self.got: list[Message] = []
        self.error: BaseException | None = None
        self.started_waiting = threading.Event()

    def run(self) -> None:
        try:
            self.started_waiting.set()
            for message in self.scanner:
                self.got.append(message)
                if len(self.got) >= self.want:
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.scanner.close()

    def result(self, timeout: float = 30.0) -> list[Message]:
        self.join(timeout)
        assert not self.is_alive(), "the follower did not finish"
        if self.error is not None:
            raise self.error
        return self.got


# -- following -------------------------------------------------------------------------------


def test_follower_sees_later_appends_across_new_segments(tmp_path):
    writer = Writer(tmp_path, segment_size=300)
    follower = Follower(tmp_path, want=60)
    follower.start()
    follower.started_waiting.wait(10)
    for i in range(60):
        if i % 10 == 9:
            writer.append_many([b"batch %d" % i])
        else:
            writer.append(b"message %d" % i + b"." * 30)
        if i % 7 == 0:
            time.sleep(0.005)  # let the follower catch up and wait again now and then
    got = follower.result()
    writer.close()
    assert [m.offset for m in got] == list(range(60))
    assert got == scan_all(tmp_path)
    assert len(list((tmp_path / "jnl").glob("*.jnl"))) > 5


def test_follower_started_before_the_journal_exists(tmp_path):
    tmp_path.mkdir(exist_ok=True)  # a directory, but no jnl/ yet
    follower = Follower(tmp_path, want=5)
    follower.start()
    follower.started_waiting.wait(10)
    time.sleep(0.05)
    with Writer(tmp_path, segment_size=100) as writer:
        for i in range(5):
            writer.append(b"m%d" % i + b"-" * 60)
    assert [m.value[:2] for m in follower.result()] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


FOLLOWER_PROCESS = """
    import sys
    from journalq.journal import Scanner
    path, want = sys.argv[1], int(sys.argv[2])
    with Scanner(path, 0, timeout=20) as s:
        print("ready", flush=True)
        n = 0
        for m in s:
            print(m.offset, m.value.decode(), flush=True)
            n += 1
            if n == want:
                break
"""


def test_follower_in_another_process(tmp_path, child_env):
    writer = Writer(tmp_path, segment_size=200)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FOLLOWER_PROCESS), str(tmp_path), "40"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        for i in range(40):
            if i % 4 == 0:
                writer.append_many([b"v%d" % i])
            else:
                writer.append(b"v%d" % i)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        writer.close()
    assert child.returncode == 0, err
    assert out.splitlines() == [f"{i} v{i}" for i in range(40)]


def test_an_incomplete_last_message_is_waited_out(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    segment = tmp_path / "jnl" / SEG0
    third = encode(3, 42, 7, b"key", b"the fourth message")
    scanner = Scanner(tmp_path, 0, timeout=20)
    assert [m.value for m in scanner.read_batch()] == [b"a", b"b", b"c"]
    with open(segment, "ab") as f:  # half a message, as a writer in the middle of a write
        f.write(third[:15])
        f.flush()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("batch", scanner.read_batch()))
    thread.start()
    thread.join(0.3)
    assert "batch" not in result  # nothing whole to return yet
    with open(segment, "ab") as f:
        f.write(third[15:])
    thread.join(30)
    assert not thread.is_alive()
    assert result["batch"] == [Message(3, 42, 7, b"key", b"the fourth message")]
    assert scanner.offset == 4
    scanner.close()


def test_a_torn_tail_cut_by_recovery_under_a_follower(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b"])
    with open(tmp_path / "jnl" / SEG0, "ab") as f:
        f.write(encode(2, 0, 0, b"", b"torn")[:20])
    follower = Follower(tmp_path, want=3)
    follower.start()
    time.sleep(0.2)  # the follower has read the torn bytes and waits for the rest
    with Writer(tmp_path) as writer:  # recovery cuts them
        assert writer.recoveries and writer.recoveries[0].cut_bytes == 20
        writer.append(b"c")
    assert [m.value for m in follower.result()] == [b"a", b"b", b"c"]


def test_a_segment_truncated_under_the_scanner_raises(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"x" * 20] * 5)  # 46-byte messages
    scanner = Scanner(tmp_path, 0)
    assert len(list(scanner)) == 5  # read to byte 230
    os.truncate(tmp_path / "jnl" / SEG0, 100)
    with pytest.raises(TruncatedError) as info:
        list(scanner)
    assert info.value.file == tmp_path / "jnl" / SEG0
    assert "shrank to 100 bytes after 230 bytes were read" in str(info.value)
    scanner.close()
    # The same for a follower.
    follower = Follower(tmp_path, want=10, offset=0)
    follower.start()
    deadline = time.monotonic() + 20
    while len(follower.got) < 2 and time.monotonic() < deadline:  # 100 bytes: 2 whole messages
        time.sleep(0.01)
    assert len(follower.got) == 2
    time.sleep(0.05)  # it waits for the rest of the third
    os.truncate(tmp_path / "jnl" / SEG0, 10)
    with pytest.raises(TruncatedError):
        follower.result()


def test_truncation_not_past_what_was_read_is_not_an_error(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"x" * 20] * 3)  # 46-byte messages
    segment = tmp_path / "jnl" / SEG0
    with Scanner(tmp_path, 0) as scanner:
        assert len(list(scanner)) == 3
        with open(segment, "ab") as f:
            f.write(encode(3, 0, 0, b"", b"torn")[:20])  # unread bytes, not a whole message
        assert scanner.read_batch() == []
        os.truncate(segment, 138)  # back to exactly what was read
        assert scanner.read_batch() == []
        with Writer(tmp_path) as writer:
            writer.append(b"next")
        assert [m.value for m in scanner.read_batch()] == [b"next"]


def test_a_torn_tail_cut_and_written_over_between_two_reads(tmp_path):
    """The scanner read a torn tail; before it looks again, recovery cuts it and another writer
    appends over it: the bytes read before are not the message's (found by
    tests/test_queue_crash_stress.py: a consumer died of a CorruptionError, "size field says
    808648704 bytes")."""
    with Writer(tmp_path) as writer:
        writer.append_many([b"x" * 20] * 3)  # 46-byte messages, to byte 138
    segment = tmp_path / "jnl" / SEG0
    with Scanner(tmp_path, 0) as scanner:
        assert len(list(scanner)) == 3
        with open(segment, "ab") as f:
            f.write(encode(3, 0, 9, b"key", b"torn" * 10)[:20])
        assert scanner.read_batch() == []  # it holds the 20 torn bytes
        with Writer(tmp_path) as writer:
            assert writer.recoveries[0].cut_bytes == 20
            writer.append(b"the message that took its place", type=1, timestamp_ns=42)
        assert scanner.read_batch() == [Message(3, 42, 1, b"", b"the message that took its place")]


def test_a_torn_tail_written_over_with_as_many_bytes_before_a_roll(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"x" * 20] * 3)
    segment = tmp_path / "jnl" / SEG0
    new = encode(3, 0, 0, b"", b"new")
    with Scanner(tmp_path, 0) as scanner:
        assert len(list(scanner)) == 3
        with open(segment, "ab") as f:
            f.write(encode(3, 0, 0, b"", b"torn" * 10)[: len(new)])
        assert scanner.read_batch() == []
        with Writer(tmp_path, segment_size=138 + len(new)) as writer:
            writer.append_many([b"new", b"in the next segment"])  # the same size again, then a roll
        assert [m.value for m in scanner.read_batch()] == [b"new"]
        assert [m.value for m in scanner.read_batch()] == [b"in the next segment"]


def hand_segment(path: Path, base: int, offsets: list[int]) -> tuple[Path, list[int]]:
    (path / "jnl").mkdir(parents=True, exist_ok=True)
    segment = path / "jnl" / f"{base:016x}.jnl"
    data, starts = b"", []
    for offset in offsets:
        starts.append(len(data))
        data += encode(offset, 0, 0, b"", b"value %d" % offset)
    segment.write_bytes(data)
    return segment, starts


@pytest.mark.parametrize("offsets, bad", [([0, 1, 2, 4, 5], 3), ([0, 1, 1, 2], 2), ([0, 1, 2, 0], 3)])
def test_out_of_order_offsets_raise_naming_file_and_position(tmp_path, offsets, bad):
    segment, starts = hand_segment(tmp_path, 0, offsets)
    got = []
    with pytest.raises(CorruptionError) as info:
        for m in Scanner(tmp_path, 0):
            got.append(m.offset)
    assert got == offsets[:bad]  # what comes before the damage is yielded first
    err = info.value
    assert err.file == segment and err.position == starts[bad]
    assert f"offset {offsets[bad]} where {bad} was due" in str(err)
    assert str(segment) in str(err) and f"byte {starts[bad]}" in str(err)


def test_a_segment_not_starting_at_its_name_is_corrupt(tmp_path):
    segment, _ = hand_segment(tmp_path, 5, [0, 1])
    with pytest.raises(CorruptionError, match="offset 0 where 5 was due") as info:
        list(Scanner(tmp_path, 5))
    assert info.value.file == segment and info.value.position == 0


def test_incomplete_message_at_the_end_of_a_finished_segment(tmp_path):
    hand_segment(tmp_path, 0, [0, 1])
    with open(tmp_path / "jnl" / SEG0, "ab") as f:
        f.write(encode(2, 0, 0, b"", b"cut")[:10])
    hand_segment(tmp_path, 2, [2, 3])
    got = []
    with pytest.raises(CorruptionError, match="incomplete message .* at the end of a finished segment"):
        for m in Scanner(tmp_path, 0):
            got.append(m.offset)
    assert got == [0, 1]


def test_a_size_past_the_end_with_whole_messages_after_it_is_damage(tmp_path):
    """A size field that reaches past the last segment's end reads as a message still being
    written. When the index names a whole message after it, which the segment confirms, it cannot
    be: a writer indexes messages once they are written, in order. A follower raises there, after
    the messages before it, rather than wait for ever; one that ends at the end does too."""
    segment = size_past_the_end(tmp_path, 700)
    for timeout in (None, 20):
        got = []
        started = time.monotonic()
        with pytest.raises(CorruptionError, match="incomplete message .*, yet the whole message") as info:
            with Scanner(tmp_path, 0, timeout=timeout) as scanner:
                for message in scanner:
                    got.append(message.offset)
        assert got == list(range(700)) and time.monotonic() - started < 10
        assert (info.value.file, info.value.offset) == (segment, 700), str(info.value)


def test_a_size_past_the_end_with_no_index_after_it_is_waited_out(tmp_path):
    """Without an index entry past it (the journal's last bytes; or a journal that sej wrote,
    with no index), such damage is not told apart from an append under way: waited for, as
    before, until a writer's recovery cuts it."""
    size_past_the_end(tmp_path, 1999)
    with Scanner(tmp_path, 0) as scanner:
        assert [m.offset for m in scanner] == list(range(1999))
    size_past_the_end(tmp_path / "sej", 700)
    (tmp_path / "sej" / "jnl" / SEG0.replace(".jnl", ".idx")).unlink()
    with Scanner(tmp_path / "sej", 0) as scanner:
        assert [m.offset for m in scanner] == list(range(700))


# -- timeouts, batches, resuming -------------------------------------------------------------


def test_timeout_ends_the_iteration(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append(b"only")
    result: dict = {}

    def run():
        started = time.monotonic()
        with Scanner(tmp_path, 0, timeout=0.3) as s:
            result["got"] = list(s)
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "a scanner with a timeout never ended"
    assert [m.value for m in result["got"]] == [b"only"]
    assert result["took"] >= 0.2  # it waited, about the timeout


def test_timeout_on_an_empty_journal(tmp_path):
    Writer(tmp_path).close()
    started = time.monotonic()
    with Scanner(tmp_path, timeout=0.2) as s:
        assert list(s) == []
        assert s.read_batch() == []
    assert time.monotonic() - started >= 0.3  # two waits of about 0.2 s


def test_read_batch(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"%d" % i for i in range(10)])
    with Scanner(tmp_path, 2) as s:
        assert [m.offset for m in s.read_batch(3)] == [2, 3, 4]
        assert s.offset == 5
        assert [m.offset for m in s.read_batch()] == [5, 6, 7, 8, 9]
        assert s.read_batch() == []
        assert s.offset == 10


def test_iteration_resumes_after_ending(tmp_path):
    writer = Writer(tmp_path, segment_size=120)
    writer.append_many([b"first %d" % i for i in range(5)])
    scanner = Scanner(tmp_path, 0)
    head = list(islice(scanner, 2))
    assert [m.offset for m in head] == [0, 1]
    assert scanner.offset == 2
    assert [m.offset for m in scanner] == [2, 3, 4]  # a new iteration goes on where it stopped
    assert list(scanner) == []
    writer.append_many([b"second %d" % i for i in range(6)])  # into new segments
    assert [m.offset for m in scanner] == list(range(5, 11))
    assert scanner.offset == 11
    writer.append(b"third")
    assert [m.value for m in scanner.read_batch()] == [b"third"]
    scanner.close()
    writer.close()


def test_scanner_arguments(tmp_path):
    with pytest.raises(JournalError, match="no journal directory here"):
        Scanner(tmp_path / "missing")
    assert scan_all(tmp_path) == []  # an empty directory: an empty journal
    with pytest.raises(OffsetOutOfRangeError, match="past the end of an empty journal"):
        Scanner(tmp_path, 1)
    with pytest.raises(Error, match="offset must be an integer, 0 or more, not -1"):
        Scanner(tmp_path, -1)


def test_offsets_before_the_first_stored_segment(tmp_path):
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)  # 56-byte messages: 2 per segment
    (tmp_path / "jnl" / SEG0).unlink()  # retention removed the oldest segment
    with pytest.raises(OffsetOutOfRangeError, match="no longer stored: the journal starts at 2"):
        Scanner(tmp_path, 1)
    assert [m.offset for m in scan_all(tmp_path, 2)] == list(range(2, 10))
    with Scanner(tmp_path) as s:  # by default, from the oldest message stored
        assert s.offset == 2


def _collected_after_listing(path: Path, *names: str):
    """The scanner's first listing of segments, as it was before gc deleted ``names``."""
    stale = [segment_bases(path)]
    for name in names:
        (path / "jnl" / name).unlink()
    return mock.patch.object(scanner_module, "segment_bases", lambda p: stale.pop() if stale else segment_bases(p))


def test_a_seek_into_a_segment_collected_after_the_listing(tmp_path):
    """gc deleting the segment a scanner seeks into, between its listing and its open: the oldest
    message (by default) is the next one still stored, and an offset in the collected segment is
    no longer stored, never an empty journal (that a follower would wait on forever) or EBADF."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)  # 56-byte messages: 2 per segment
    with _collected_after_listing(tmp_path, SEG0):
        with Scanner(tmp_path) as s:
            assert [m.offset for m in s] == list(range(2, 10))
    (tmp_path / "jnl" / "0000000000000002.jnl").unlink()
    # The first offset of the collected segment, and one inside another.
    for offset, collected, first in ((4, "0000000000000004.jnl", 6), (7, "0000000000000006.jnl", 8)):
        with _collected_after_listing(tmp_path, collected):
            with pytest.raises(OffsetOutOfRangeError, match=f"no longer stored: the journal starts at {first}"):
                Scanner(tmp_path, offset)


def test_the_next_segment_collected_before_the_scanner_opens_it(tmp_path):
    """gc deleting the segment a scanner is about to go on to, after it saw the segment there: the
    messages it was due are no longer stored, said as such (not an OSError)."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)
    real_open = Scanner._open

    def open_collected(self, segment, next_base):
        if segment.base == 2:
            segment.path.unlink()
        return real_open(self, segment, next_base)

    with Scanner(tmp_path, 0) as s, mock.patch.object(Scanner, "_open", open_collected):
        got = []
        with pytest.raises(OffsetOutOfRangeError, match="offset 2 is no longer stored") as info:
            for m in s:
                got.append(m.offset)
    assert got == [0, 1] and info.value.file == tmp_path / "jnl" / "0000000000000002.jnl"


def test_a_missing_middle_segment_is_an_error_not_the_end(tmp_path):
    """A finished segment that ends where no segment starts (one deleted by hand, or lost) is not
    the journal's end: a scanner stopping there without a word would hide the messages after it,
    and a follower would wait at it for ever. Seeking across it, or reaching it after a roll,
    both say which offsets are missing, after handing out every message before them."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)  # 2 messages per segment: 0, 2, 4, 6, 8
    (tmp_path / "jnl" / "0000000000000004.jnl").unlink()
    for start in (0, 2, 3):  # listed right before the gap, or reached by a roll
        got = []
        with Scanner(tmp_path, start, timeout=5.0) as s:
            with pytest.raises(CorruptionError, match="offsets 4-5 are missing") as info:
                for m in s:
                    got.append(m.offset)
        assert got == list(range(start, 4))
        assert info.value.file == tmp_path / "jnl" / "0000000000000002.jnl" and info.value.offset == 4
    with pytest.raises(CorruptionError, match="offsets 4-5 are missing"):
        Scanner(tmp_path, 5)  # an offset in the gap


def test_a_finished_segment_cut_inside_a_message_before_a_gap_is_an_error(tmp_path):
    """A finished segment cut short inside a message (its later messages lost with it) was taken
    for a last segment with a message being written: ``journalq scan`` printed the messages before
    the cut and exited 0, a seek past it said the journal ended there, and a follower waited at it
    for ever. As for a gap, every message before the damage comes first."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)  # 2 messages per segment: 0, 2, 4, 6, 8
    segment = tmp_path / "jnl" / "0000000000000002.jnl"
    os.truncate(segment, segment.stat().st_size - 10)  # offset 3 cut short; 4 starts the next one
    for start, timeout in ((0, None), (2, None), (0, 5.0)):
        got = []
        with Scanner(tmp_path, start, timeout=timeout) as s:
            with pytest.raises(CorruptionError, match="incomplete message .* at the end of a finished") as info:
                for m in s:
                    got.append(m.offset)
        assert got == list(range(start, 3))
        assert info.value.file == segment and info.value.offset == 3
    with pytest.raises(CorruptionError, match="incomplete message"):
        Scanner(tmp_path, 3)  # the message cut: not "past the end of the journal"


def test_a_segment_overlapping_the_next_is_an_error(tmp_path):
    hand_segment(tmp_path, 0, [0, 1, 2])
    hand_segment(tmp_path, 2, [2, 3])
    with pytest.raises(CorruptionError, match="offsets 2-2 are stored twice"):
        scan_all(tmp_path)


def test_the_next_segment_taken_back_by_a_failed_append_is_no_gap(tmp_path):
    """A writer whose append failed after it rolled removes the segment it started: a scanner that
    listed that segment then finds its own segment's end is the journal's end after all."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 3)  # segments 0 (0, 1) and 2 (2)
    taken_back = tmp_path / "jnl" / "0000000000000004.jnl"
    taken_back.write_bytes(encode(4, 0, 0, b"", b"v" * 30))  # as a failed batch left it
    with Scanner(tmp_path, 2) as s:  # lists segment 4 after 2
        taken_back.unlink()
        assert [m.offset for m in s] == [2]


def test_an_iteration_goes_on_after_what_read_batch_took_meanwhile(tmp_path):
    """``read_batch`` between two steps of an iteration takes the messages that come next: the
    iteration, resumed, goes on after them (it gave them a second time), within the batch it is in
    and past it."""
    with Writer(tmp_path) as writer:
        writer.append_many([b"m%d" % i for i in range(10)])
    with Scanner(tmp_path, 0) as s:
        iteration = iter(s)
        assert next(iteration).offset == 0
        assert [m.offset for m in s.read_batch(3)] == [1, 2, 3]
        assert next(iteration).offset == 4
        assert [m.offset for m in s.read_batch()] == list(range(5, 10))  # the rest of the batch
        with Writer(tmp_path) as writer:
            writer.append_many([b"more"] * 5)
        assert [m.offset for m in s.read_batch(2)] == [10, 11]  # a new batch, with read_batch
        assert [m.offset for m in iteration] == [12, 13, 14]


# -- a timeout of next_message, a negative offset -----------------------------------------------


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


def test_scan_timeout_is_one_of_the_journals_errors(tmp_path):
    """``journalq.journal`` gave every error its scanner raises (``TruncatedError``,
    ``CorruptionError``, ...) but ``ScanTimeout``, which ``next_message`` raises (the README's
    journal example names it): importing it from there failed."""
    import journalq.journal

    with Writer(tmp_path) as writer:
        writer.append(b"only")
    with Scanner(tmp_path, 1) as scanner, pytest.raises(journalq.journal.ScanTimeout):
        scanner.next_message()
    assert "ScanTimeout" in journalq.journal.__all__


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


# -- arguments refused, segments gone or unreadable under a scanner --------------------------------


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


def test_segments_collected_under_a_reader_are_no_longer_stored(tmp_path):
    # Retention deletes the oldest segments, the one a slow reader has open among them: past its
    # end the offsets it wants are gone. That is OffsetOutOfRangeError (what a hub client and
    # Spark's failOnDataLoss handle), not a TruncatedError about a failed append taken back.
    with Writer(tmp_path, segment_size=300) as writer:
        writer.append_many([b"v" * 20] * 40)
    segments = list_segments(tmp_path)
    assert len(segments) > 4
    with Scanner(tmp_path, 0) as scanner:
        assert [m.offset for m in scanner.read_batch(1)] == [0]
        for segment in segments[:3]:
            os.unlink(segment.path)
            segment.index_path.unlink(missing_ok=True)
        gone = rf"no longer stored.*starts at {segments[3].base}"
        with pytest.raises(OffsetOutOfRangeError, match=gone):
            while scanner.read_batch():
                pass


def test_a_next_segment_that_cannot_be_opened_is_named(tmp_path):
    # A segment listed where the next offset is due but that cannot be opened (a dangling link)
    # was reported as a gap: "offsets 2-1 are stored twice".
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b"])
    dangling = tmp_path / "jnl" / f"{2:016x}.jnl"
    os.symlink(tmp_path / "nowhere", dangling)
    with Scanner(tmp_path, 0) as scanner:
        assert len(scanner.read_batch()) == 2
        with pytest.raises(JournalError, match="listed but cannot be opened") as caught:
            scanner.read_batch()
    assert caught.value.file == dangling
