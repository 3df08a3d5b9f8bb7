"""Audit of the journal's readers and tools: end_offset, reader offsets, the scanner, the watch,
check --repair and the codec on damaged bytes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from journalq.errors import (
    CorruptionError,
    Error,
    JournalError,
    OffsetOutOfRangeError,
    TruncatedError,
)
from journalq.journal import ReaderOffset, Scanner, Writer, end_offset, read_offset
from journalq.journal import codec, index
from journalq.journal.inspect import check
from journalq.journal.segment import list_segments


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


def test_commit_after_close_is_refused(tmp_path):
    # A closed ReaderOffset no longer holds the name's lock: its commit would overwrite the
    # offset of the process that took the name since.
    reader = ReaderOffset(tmp_path, "r")
    reader.commit(3)
    reader.close()
    with ReaderOffset(tmp_path, "r") as other:
        other.commit(10)
        with pytest.raises(Error, match="closed"):
            reader.commit(5)
        assert read_offset(tmp_path, "r") == 10


@pytest.mark.parametrize("name", ["reader\n", "a\nb"])
def test_reader_name_with_a_newline_is_refused(tmp_path, name):
    with pytest.raises(Error, match="reader name"):
        ReaderOffset(tmp_path, name)
    assert not (tmp_path / "ofs").exists() or not list((tmp_path / "ofs").iterdir())


@pytest.mark.parametrize("bad", [True, 1.0])
def test_commit_refuses_what_is_no_integer(tmp_path, bad):
    with ReaderOffset(tmp_path, "r") as reader:
        with pytest.raises(Error, match="offset must be an unsigned 64-bit integer"):
            reader.commit(bad)
        assert reader.value == 0
    assert read_offset(tmp_path, "r") == 0


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


def _damage_offset_field(segment_path, position: int) -> None:
    data = bytearray(segment_path.read_bytes())
    data[position + 7] ^= 0x01  # the low byte of the offset field of the message there
    segment_path.write_bytes(bytes(data))


def test_check_repair_keeps_the_index_entries_past_damage(tmp_path):
    # The sound index entries past damage in a sealed segment are what let a reader seek over
    # it (to a committed offset after it). check called them stale, and --repair rebuilt the
    # index from the messages before the damage only: the seek then failed at the damage.
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first = list_segments(tmp_path)[0]
    assert first.index_path.exists()
    _damage_offset_field(first.path, 32 * 500)  # every message is 32 bytes
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000
    report = check(tmp_path)
    assert [p.kind for p in report.problems] == ["segment"]
    assert "offset 501 where 500 was due" in report.problems[0].reason
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.fixed) for p in report.problems] == [("segment", False)]
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000


def test_check_repair_of_a_stale_index_past_damage_keeps_the_sound_entries(tmp_path):
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first = list_segments(tmp_path)[0]
    entries = index.read_entries(first)
    assert len(entries) > 2
    _damage_offset_field(first.path, 32 * 100)
    # One entry that points at no message: the index is stale, and rebuilt.
    index.write_index(first, [*entries, (entries[-1][0] + 1, entries[-1][1] + 5)])
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.fixed) for p in report.problems] == [("segment", False), ("index", True)]
    assert index.read_entries(first) == entries
    assert check(tmp_path).remaining == report.remaining[:1]
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000


def test_a_follower_learns_at_once_that_its_segment_was_removed(tmp_path):
    # A failed append's new segment is taken back by unlinking it. The watch did not wake for a
    # deletion: a follower in that segment slept until the next append, or its timeout, and then
    # ended as if nothing had happened, the messages it returned from it being gone.
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    segment = list_segments(tmp_path)[-1]
    with Scanner(tmp_path, 0, timeout=3) as scanner:
        assert len(scanner.read_batch()) == 3
        timer = threading.Timer(0.2, os.unlink, [segment.path])
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(TruncatedError, match="removed under the scanner"):
                scanner.read_batch()
        finally:
            timer.join()
        assert time.monotonic() - started < 2


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


@pytest.mark.parametrize("key_len", [0, 5])
def test_a_value_length_that_makes_the_size_zero_is_damage(tmp_path, key_len):
    # A value length of -(26 + key length) made the message's size 0, and decode's look for a
    # run of messages of one size divided by it: ZeroDivisionError in every reader, in check and
    # in the recovery of a writer opening the journal, which then could not open it at all.
    head = codec.HEADER.pack(0, 1, 0, key_len) + b"k" * key_len
    damaged = head + codec.INT32.pack(-(codec.OVERHEAD + key_len)) + bytes(100)
    with pytest.raises(CorruptionError, match="negative value length"):
        codec.decode(damaged, 0, None, 0)
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b"])
    segment = list_segments(tmp_path)[0]
    sound = segment.path.read_bytes()
    segment.path.write_bytes(sound + codec.HEADER.pack(2, 1, 0, key_len) + damaged[18:])
    assert [p.kind for p in check(tmp_path).problems] == ["tail"]
    with Writer(tmp_path) as writer:  # recovers: cuts the damaged tail, keeps its bytes
        assert writer.append(b"c") == 2
    with Scanner(tmp_path) as scanner:
        assert [m.value for m in scanner.read_batch()] == [b"a", b"b", b"c"]
