"""The writer: byte-exact output, segment rolling as sej does it, sync policies, a full disk."""

from __future__ import annotations

import errno
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import journalq.journal.sync as sync_mod
from journalq.errors import ZERO_TIMESTAMP, Error, InvalidMessageError, JournalError, StorageError, TruncatedError
from journalq.journal import Message, Scanner, SyncPolicy, Writer, end_offset, set_offset
from journalq.journal import writer as writer_mod
from journalq.journal.codec import encode_batch
from journalq.journal.sync import DEFAULT_GROUP_INTERVAL_MS

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def scan_all(path: Path, offset: int = 0) -> list[Message]:
    with Scanner(path, offset) as scanner:
        return list(scanner)


def run_in_threads(work: Callable[[], None], count: int) -> None:
    """``work`` in ``count`` threads at once; returns once all are done."""
    threads = [threading.Thread(target=work) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def jnl_files(path: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in (path / "jnl").glob("*.jnl"))


# -- byte-exact output -----------------------------------------------------------------------


def test_written_bytes_match_the_format_worked_out_by_hand(tmp_path):
    with Writer(tmp_path) as w:
        assert w.append(b"hello", key=b"k", type=1, timestamp_ns=1_700_000_000_123_456_789) == 0
        assert w.append(b"", key=b"", type=255, timestamp_ns=ZERO_TIMESTAMP) == 1
        assert w.append(b"v", key=bytes(range(127)), type=0, timestamp_ns=1) == 2
        assert (
            w.append_many(
                [
                    Message(timestamp_ns=-1, type=7, key=b"", value=b"\x00\xff"),
                    Message(timestamp_ns=1_234_567_890_000_000_000, type=128, key=b"key", value=b""),
                ]
            )
            == 4
        )
    expected = bytes.fromhex(
        # message 0
        "0000000000000000"  # offset 0
        "17979cfe3d85cd15"  # timestamp 1_700_000_000_123_456_789 ns
        "01"  # type 1
        "01" "6b"  # key length 1, key "k"
        "00000005" "68656c6c6f"  # value length 5, "hello"
        "00000020"  # size 26 + 1 + 5 = 32
        # message 1: empty key, Go's zero time, type 255, empty value
        "0000000000000001"  # offset 1
        "8000000000000000"  # the zero time: minimum int64
        "ff"  # type 255
        "00"  # key length 0
        "00000000"  # value length 0
        "0000001a"  # size 26
        # message 2: a 127-byte key
        "0000000000000002"  # offset 2
        "0000000000000001"  # timestamp 1 ns
        "00"  # type 0
        "7f"  # key length 127
        + bytes(range(127)).hex()  # key 00 01 .. 7e
        + "00000001" "76"  # value length 1, "v"
        "0000009a"  # size 26 + 127 + 1 = 154
        # message 3, from a batch: timestamp -1 ns
        "0000000000000003"  # offset 3
        "ffffffffffffffff"  # timestamp -1
        "07"  # type 7
        "00"  # key length 0
        "00000002" "00ff"  # value length 2, value
        "0000001c"  # size 28
        # message 4, from the same batch
        "0000000000000004"  # offset 4
        "112210f4768db400"  # timestamp 1_234_567_890_000_000_000 ns
        "80"  # type 128
        "03" "6b6579"  # key length 3, "key"
        "00000000"  # value length 0
        "0000001d"  # size 29
    )
    assert jnl_files(tmp_path) == [("0000000000000000.jnl", len(expected))]
    assert (tmp_path / "jnl" / "0000000000000000.jnl").read_bytes() == expected
    assert (tmp_path / "jnl.lck").exists()


def test_batch_of_plain_values_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_mod.time, "time_ns", lambda: 0x0102030405060708)
    with Writer(tmp_path) as w:
        assert w.append_many([b"a", bytearray(b"bc")]) == 1
        assert w.append(b"d") == 2  # timestamp None: now
        assert w.append_many([]) is None
    data = (tmp_path / "jnl" / "0000000000000000.jnl").read_bytes()
    assert data == (
        struct.pack(">QqBb", 0, 0x0102030405060708, 0, 0) + struct.pack(">i", 1) + b"a" + struct.pack(">i", 27)
        + struct.pack(">QqBb", 1, 0x0102030405060708, 0, 0) + struct.pack(">i", 2) + b"bc" + struct.pack(">i", 28)
        + struct.pack(">QqBb", 2, 0x0102030405060708, 0, 0) + struct.pack(">i", 1) + b"d" + struct.pack(">i", 27)
    )


def test_invalid_messages_are_refused_and_nothing_is_written(tmp_path):
    with Writer(tmp_path) as w:
        w.append(b"first")
        with pytest.raises(InvalidMessageError, match="key is 128 bytes"):
            w.append(b"v", key=b"k" * 128)
        with pytest.raises(InvalidMessageError, match="value must be bytes, not str"):
            w.append("text")
        with pytest.raises(InvalidMessageError):
            w.append_many([b"ok", b"ok", Message(key=b"k" * 200)])
        with pytest.raises(InvalidMessageError, match="item 1 of the batch is a int"):
            w.append_many([b"ok", 5])
        # A batch that is no iterable raised TypeError; encoded data that is not bytes, a
        # CorruptionError about an incomplete message (or a struct.error).
        with pytest.raises(InvalidMessageError, match="batch must be an iterable .*, not NoneType"):
            w.append_many(None)  # type: ignore[arg-type]
        for data in ("text", "t" * 100):
            with pytest.raises(InvalidMessageError, match="encoded messages must be bytes, not str"):
                w.append_encoded(data)  # type: ignore[arg-type]
        assert w.next_offset == 1
        assert w.append(b"second") == 1
    assert [m.value for m in scan_all(tmp_path)] == [b"first", b"second"]


# -- segment rolling -------------------------------------------------------------------------


def v(n: int) -> bytes:
    return b"x" * n  # a value making a message of 26 + n bytes with an empty key


def test_segments_roll_after_the_message_that_reaches_segment_size(tmp_path):
    w = Writer(tmp_path, segment_size=100)
    # 40-byte messages: 40, 80, 120 -> the third reaches 100, then the segment is closed.
    for i in range(3):
        assert w.append(v(14)) == i
    assert jnl_files(tmp_path) == [("0000000000000000.jnl", 120), ("0000000000000003.jnl", 0)]
    # A batch of seven 40-byte messages spans three more segments.
    assert w.append_many([v(14)] * 7) == 9
    # Message 10 is 60 bytes and ends exactly at 100: that closes the segment too.
    assert w.append(v(34)) == 10
    # One message larger than a segment gets a segment of its own.
    assert w.append_many([v(200)]) == 11
    # A batch starting in a segment with data: 12 alone, then 13, 14 reach it; 15, 16 follow.
    assert w.append(v(14)) == 12
    assert w.append_many([v(14)] * 4) == 16
    assert w.segment.path.name == "000000000000000f.jnl"
    w.close()
    assert jnl_files(tmp_path) == [
        ("0000000000000000.jnl", 120),  # 0, 1, 2
        ("0000000000000003.jnl", 120),  # 3, 4, 5
        ("0000000000000006.jnl", 120),  # 6, 7, 8
        ("0000000000000009.jnl", 100),  # 9 (40) and 10 (60)
        ("000000000000000b.jnl", 226),  # 11
        ("000000000000000c.jnl", 120),  # 12, 13, 14
        ("000000000000000f.jnl", 80),  # 15, 16
    ]
    # Each segment starts with the message its name says.
    for name, _ in jnl_files(tmp_path):
        head = (tmp_path / "jnl" / name).read_bytes()[:8]
        assert struct.unpack(">Q", head)[0] == int(name[:16], 16)
    assert [m.offset for m in scan_all(tmp_path)] == list(range(17))
    # A new writer continues in the last segment.
    with Writer(tmp_path, segment_size=100) as w:
        assert w.next_offset == 17
        assert w.append(v(14)) == 17
    # 80 + 40 reaches 100: it rolled after message 17, to an empty segment 18 (0x12).
    assert jnl_files(tmp_path)[-2:] == [("000000000000000f.jnl", 120), ("0000000000000012.jnl", 0)]


def test_buffered_writes_produce_the_same_bytes(tmp_path):
    items = [
        Message(timestamp_ns=i, type=i % 256, key=bytes([i % 7]) * (i % 5), value=v(i * 3 % 97)) for i in range(200)
    ]
    plain, buffered = tmp_path / "plain", tmp_path / "buffered"
    with Writer(plain, segment_size=700) as w:
        for m in items:
            w.append(m.value, key=m.key, type=m.type, timestamp_ns=m.timestamp_ns)
    with Writer(buffered, segment_size=700, buffer_size=1000) as w:
        for i in range(0, 200, 9):
            w.append_many(items[i : i + 9])
        assert w.next_offset == 200
    assert jnl_files(plain) == jnl_files(buffered)
    for name, _ in jnl_files(plain):
        assert (plain / "jnl" / name).read_bytes() == (buffered / "jnl" / name).read_bytes()


def test_rewriting_the_plain_vector_reproduces_every_segment(tmp_path, sej_vectors, expected_plain):
    """The Go writer used 64 KiB segments; the same messages must give the same files."""
    original = sej_vectors / "plain" / "jnl"
    one_by_one, batched = tmp_path / "one", tmp_path / "batched"
    with Writer(one_by_one, segment_size=65536) as w:
        for m in expected_plain:
            assert w.append(m.value, key=m.key, type=m.type, timestamp_ns=m.timestamp_ns) == m.offset
    with Writer(batched, segment_size=65536) as w:
        for i in range(0, len(expected_plain), 97):
            w.append_many(expected_plain[i : i + 97])
    want = sorted(p.name for p in original.glob("*.jnl"))
    assert len(want) > 20
    for path in (one_by_one, batched):
        assert [name for name, _ in jnl_files(path)] == want
        for name in want:
            assert (path / "jnl" / name).read_bytes() == (original / name).read_bytes(), name


# -- sync policies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, want",
    [
        ("none", SyncPolicy("none")),
        ("always", SyncPolicy("always")),
        (" Always ", SyncPolicy("always")),
        ("group", SyncPolicy("group", DEFAULT_GROUP_INTERVAL_MS, None)),
        ("group:", SyncPolicy("group", DEFAULT_GROUP_INTERVAL_MS, None)),
        ("group:5ms", SyncPolicy("group", 5.0, None)),
        ("group:2.5ms", SyncPolicy("group", 2.5, None)),
        ("group:1000", SyncPolicy("group", None, 1000)),
        ("group:5ms,1000", SyncPolicy("group", 5.0, 1000)),
        ("group:1000, 5ms", SyncPolicy("group", 5.0, 1000)),
        ("group:3600000ms", SyncPolicy("group", 3600000.0, None)),  # an hour: no exponent when written
        ("group:0.0000001ms", SyncPolicy("group", 1e-7, None)),
        ("group:10000000000000000ms", SyncPolicy("group", 1e16, None)),
        (SyncPolicy("group", 1.0, 2), SyncPolicy("group", 1.0, 2)),
    ],
)
def test_sync_policy_parse(spec, want):
    got = SyncPolicy.parse(spec)
    assert got == want
    assert SyncPolicy.parse(str(got)) == got


@pytest.mark.parametrize(
    "spec, match",
    [
        ("sometimes", "unknown sync policy 'sometimes'"),
        ("always:5", "unknown sync policy"),
        ("group:0", "must be positive"),
        ("group:0ms", "must be positive"),
        ("group:-5", "bad part '-5'"),
        ("group:5s", "bad part '5s'"),
        ("group:abc", "bad part 'abc'"),
        (5, "must be a string or SyncPolicy, not int"),
        (None, "must be a string or SyncPolicy, not NoneType"),
    ],
)
def test_sync_policy_parse_errors(spec, match, tmp_path):
    with pytest.raises(Error, match=match):
        SyncPolicy.parse(spec)
    with pytest.raises(Error, match=match):
        Writer(tmp_path / "j", sync=spec)


@pytest.fixture
def syncs(monkeypatch):
    """Counts the writer's fdatasync calls (and still syncs)."""
    calls: list[float] = []
    real = writer_mod.fdatasync

    def counting(fd):
        calls.append(time.monotonic())
        real(fd)

    monkeypatch.setattr(writer_mod, "fdatasync", counting)
    return calls


BIG = 1 << 30  # no rolls in the sync tests: a roll syncs too


def test_sync_always_syncs_every_append(tmp_path, syncs):
    w = Writer(tmp_path, sync="always", segment_size=BIG)
    assert len(syncs) == 0
    w.append(b"a")
    assert len(syncs) == 1
    w.append(b"b")
    assert len(syncs) == 2
    w.append_many([b"c", b"d", b"e"])
    assert len(syncs) == 3
    w.append_encoded(encode_batch(5, 7, [b"f", b"g"])[0])  # a hub's copy: as durable as the rest
    assert len(syncs) == 4
    w.close()
    assert len(syncs) == 5  # close syncs


def test_sync_none_syncs_only_on_close_and_roll(tmp_path, syncs):
    w = Writer(tmp_path, sync="none", segment_size=BIG)
    for _ in range(50):
        w.append(b"a")
    assert syncs == []
    w.sync()
    assert len(syncs) == 1
    w.close()
    assert len(syncs) == 2
    w.close()  # closing twice is harmless and does not sync again
    assert len(syncs) == 2
    # A roll syncs the full segment, as sej does.
    syncs.clear()
    with Writer(tmp_path / "rolls", sync="none", segment_size=100) as w:
        w.append_many([v(14)] * 9)  # 3 segments of 120 bytes: 3 rolls
        assert len(syncs) == 3
    assert len(syncs) == 4


def test_group_sync_every_n_messages(tmp_path, syncs):
    w = Writer(tmp_path, sync="group:3", segment_size=BIG)
    w.append(b"1")
    w.append(b"2")
    assert syncs == []
    w.append(b"3")
    assert len(syncs) == 1
    w.append(b"4")
    w.append(b"5")
    assert len(syncs) == 1
    w.append(b"6")
    assert len(syncs) == 2
    w.append_many([b"7", b"8"])
    assert len(syncs) == 2
    w.append_many([b"9"])
    assert len(syncs) == 3
    w.append_many([b"x"] * 5)  # one batch over N: one sync
    assert len(syncs) == 4
    w.append(b"y")
    w.close()
    assert len(syncs) == 5


def test_group_sync_after_the_interval(tmp_path, syncs):
    w = Writer(tmp_path, sync="group:100ms", segment_size=BIG)
    try:
        time.sleep(0.05)
        assert syncs == []  # nothing appended, nothing to sync
        appended = time.monotonic()
        w.append(b"a")
        deadline = time.monotonic() + 10
        while not syncs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(syncs) == 1, "group:100ms never synced an append"
        assert syncs[0] - appended >= 0.09  # not before the interval
        # More appends, another sync after the interval; then it sleeps again.
        w.append_many([b"b", b"c"])
        deadline = time.monotonic() + 10
        while len(syncs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(syncs) == 2
    finally:
        w.close()
    assert len(syncs) == 3


def test_group_sync_interval_and_count(tmp_path, syncs):
    with Writer(tmp_path, sync="group:60000ms,2", segment_size=BIG) as w:
        w.append(b"a")
        assert syncs == []
        w.append(b"b")
        assert len(syncs) == 1


# -- a full disk -----------------------------------------------------------------------------


class FullDisk:
    """Stands in for ``os`` in the writer module; its ``write`` can fail like a full disk."""

    def __init__(self) -> None:
        self.fail_on: int | None = None  # the number of the write() call that fails
        self.calls = 0
        self.partial = 0

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            # Part of the data goes in, then the disk is full.
            self.partial = os.write(fd, bytes(data[: max(1, len(data) // 2)]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


@pytest.fixture
def full_disk(monkeypatch):
    fake = FullDisk()
    monkeypatch.setattr(writer_mod, "os", fake)
    return fake


def check_failed_batch(path: Path, w: Writer, fake: FullDisk, batch, before_files, before_messages):
    fake.calls, fake.fail_on = 0, fake.fail_on
    with pytest.raises(JournalError) as info:
        w.append_many(batch)
    assert fake.partial > 0, "the fault did not happen"
    err = info.value
    assert "No space left on device" in str(err)
    assert "nothing of them was stored" in str(err)
    assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC
    assert err.offset == len(before_messages)
    # Nothing of the batch is visible; everything before it is.
    assert jnl_files(path) == before_files
    assert scan_all(path) == before_messages
    assert end_offset(path) == len(before_messages)
    assert w.next_offset == len(before_messages)


def test_full_disk_takes_the_whole_batch_back(tmp_path, full_disk):
    w = Writer(tmp_path, segment_size=BIG)
    for i in range(10):
        w.append(b"before %d" % i)
    before_files, before = jnl_files(tmp_path), scan_all(tmp_path)
    full_disk.fail_on = 1
    check_failed_batch(tmp_path, w, full_disk, [b"lost %d" % i for i in range(20)], before_files, before)
    # The fault is gone: the next append gets the next dense offset.
    full_disk.fail_on = None
    assert w.append(b"after") == 10
    assert w.append_many([b"after 2", b"after 3"]) == 12
    w.close()
    got = scan_all(tmp_path)
    assert [m.offset for m in got] == list(range(13))
    assert [m.value for m in got[10:]] == [b"after", b"after 2", b"after 3"]
    with Writer(tmp_path) as again:
        assert again.recoveries == []
        assert again.next_offset == 13


def test_full_disk_on_a_single_append(tmp_path, full_disk):
    w = Writer(tmp_path)
    w.append(b"kept")
    full_disk.calls, full_disk.fail_on = 0, 1
    with pytest.raises(JournalError, match="No space left on device"):
        w.append(b"lost")
    full_disk.fail_on = None
    assert w.append(b"next") == 1
    w.close()
    assert [m.value for m in scan_all(tmp_path)] == [b"kept", b"next"]


@pytest.mark.parametrize("fail_on", [2, 3])
def test_full_disk_in_a_batch_that_spans_a_roll(tmp_path, full_disk, fail_on):
    w = Writer(tmp_path, segment_size=100, index_interval=50)
    w.append_many([v(14)] * 4)  # segment 0: 0, 1, 2 (120 bytes); segment 3: 3 (40 bytes)
    before_files, before = jnl_files(tmp_path), scan_all(tmp_path)
    assert before_files == [("0000000000000000.jnl", 120), ("0000000000000003.jnl", 40)]
    # Nine 40-byte messages from offset 4: 4, 5 fill segment 3; 6, 7, 8 make segment 6; ...
    # The first write goes in and the segment rolls; a later write fails half done.
    full_disk.calls, full_disk.fail_on = 0, fail_on
    check_failed_batch(tmp_path, w, full_disk, [v(14)] * 9, before_files, before)
    assert not (tmp_path / "jnl" / "0000000000000006.jnl").exists()
    assert not (tmp_path / "jnl" / "0000000000000006.idx").exists()
    assert not (tmp_path / "jnl" / "0000000000000009.jnl").exists()
    full_disk.fail_on = None
    assert w.append(v(14)) == 4
    assert w.append_many([v(14)] * 3) == 7
    w.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(8))
    assert jnl_files(tmp_path) == [
        ("0000000000000000.jnl", 120),
        ("0000000000000003.jnl", 120),
        ("0000000000000006.jnl", 80),
    ]
    for k in range(8):
        with Scanner(tmp_path, k) as s:
            assert next(iter(s)).offset == k


def test_writer_arguments_are_checked(tmp_path):
    with pytest.raises(Error, match="segment_size must be an integer, 1 or more, not 0"):
        Writer(tmp_path, segment_size=0)
    # A string, a bool or a float failed late (TypeError) or was taken (True: a 1-byte segment);
    # an index interval of 0 or less put an index entry at every message.
    for bad in ("10", True, 1.5):
        with pytest.raises(Error, match=f"segment_size must be an integer, 1 or more, not {bad!r}"):
            Writer(tmp_path, segment_size=bad)
    for bad in (0, -5, "4096", False):
        with pytest.raises(Error, match=f"index_interval must be an integer, 1 or more, not {bad!r}"):
            Writer(tmp_path, index_interval=bad)
    with pytest.raises(Error, match="buffer_size must be an integer, 0 or more, not 'x'"):
        Writer(tmp_path, buffer_size="x")
    with pytest.raises(Error, match="buffer_size"):
        Writer(tmp_path, buffer_size=-1)
    with pytest.raises(Error, match="buffer_size cannot be used"):
        Writer(tmp_path, buffer_size=10, sync="always")
    w = Writer(tmp_path)
    w.close()
    with pytest.raises(Error, match="closed"):
        w.append(b"x")


def test_concurrent_threads_get_dense_offsets(tmp_path):
    w = Writer(tmp_path, segment_size=2000)
    results: list[list[int]] = [[] for _ in range(4)]

    def work(i):
        for j in range(100):
            if j % 3:
                results[i].append(w.append(b"t%d-%d" % (i, j)))
            else:
                last = w.append_many([b"t%d-%d-%d" % (i, j, k) for k in range(3)])
                results[i].extend(range(last - 2, last + 1))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    got = scan_all(tmp_path)
    assert [m.offset for m in got] == list(range(len(got)))
    assert sorted(o for r in results for o in r) == list(range(len(got)))
    by_offset = {m.offset: m.value for m in got}
    for i, offsets in enumerate(results):
        assert all(by_offset[o].startswith(b"t%d-" % i) for o in offsets)


def test_a_follower_is_not_stranded_by_a_failed_batch(tmp_path, full_disk):
    w = Writer(tmp_path, segment_size=100)
    w.append_many([v(14)] * 4)  # segment 0: 0, 1, 2; segment 3: 3
    follower = Scanner(tmp_path, 0, timeout=0.5)
    assert [m.offset for m in follower] == [0, 1, 2, 3]
    real_write = FullDisk.write

    def write_then_let_the_follower_read(self, fd, data):
        if self.calls + 1 == self.fail_on:
            os.write(fd, bytes(data[:40]))  # part of the batch reaches the new segment ...
            list(follower)  # ... and the follower goes there
            self.calls += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, fd, data)

    full_disk.calls, full_disk.fail_on = 0, 2  # the batch's second write: in the new segment
    full_disk.write = write_then_let_the_follower_read.__get__(full_disk)
    with pytest.raises(JournalError):
        w.append_many([v(14)] * 9)
    full_disk.fail_on = None
    assert w.append(b"real 4") == 4
    w.close()
    # The follower saw messages that were taken back: it must fail fast, not wait forever.
    with pytest.raises(TruncatedError, match="removed under the scanner"):
        list(follower)


def test_always_is_group_commit_across_threads(tmp_path, monkeypatch):
    """Threads appending at once share syncs, and none returns before a sync covering its bytes."""
    synced_sizes: list[int] = []  # file size at the start of each completed sync
    lock = threading.Lock()

    def slow_fdatasync(fd: int) -> None:
        size = os.fstat(fd).st_size
        time.sleep(0.002)  # a slow disk: appends pile up behind each sync
        os.fdatasync(fd)
        with lock:
            synced_sizes.append(size)

    monkeypatch.setattr(writer_mod, "fdatasync", slow_fdatasync)
    w = Writer(tmp_path, sync="always")
    size_of_one = 26 + 10
    problems: list[str] = []

    def work() -> None:
        for _ in range(25):
            offset = w.append(b"0123456789")
            end = (offset + 1) * size_of_one
            with lock:
                covered = max(synced_sizes, default=0)
            if covered < end:
                problems.append(f"offset {offset} returned before a sync covered byte {end}")

    run_in_threads(work, 8)
    w.close()
    assert not problems
    appends = 8 * 25
    assert [m.offset for m in scan_all(tmp_path)] == list(range(appends))
    assert len(synced_sizes) < appends / 2  # shared: far fewer syncs than appends


def test_a_roll_during_a_sync_leaves_the_synced_descriptor_open_then_closes_it(tmp_path, monkeypatch):
    """``sync="always"`` syncs the segment's own descriptor out of the mutex: a roll by another
    thread meanwhile must not close it under the sync (nor let its number name another file), and
    it is closed once the sync is done."""
    problems: list[str] = []

    def slow_fdatasync(fd: int) -> None:
        if sys._getframe(1).f_code.co_name != "_make_durable":
            os.fdatasync(fd)  # a roll's sync, under the mutex: quick, so rolls happen meanwhile
            return
        before = os.fstat(fd)
        time.sleep(0.002)  # other threads append and roll meanwhile
        after = os.fstat(fd)  # EBADF if the roll closed it
        if (before.st_ino, before.st_dev) != (after.st_ino, after.st_dev):
            problems.append(f"descriptor {fd} named another file during its sync")
        os.fdatasync(fd)

    monkeypatch.setattr(writer_mod, "fdatasync", slow_fdatasync)
    fds_before = len(os.listdir("/proc/self/fd"))
    w = Writer(tmp_path, sync="always", segment_size=200)  # a roll every few appends

    def work() -> None:
        try:
            for _ in range(20):
                w.append(b"0123456789" * 3)
        except Exception as exc:  # noqa: BLE001 - reported below
            problems.append(repr(exc))

    run_in_threads(work, 6)
    w.close()
    assert not problems
    assert [m.offset for m in scan_all(tmp_path)] == list(range(120))
    assert len(jnl_files(tmp_path)) > 5  # it did roll, many times
    assert len(os.listdir("/proc/self/fd")) == fds_before  # every descriptor closed


class IndexFailsOnNewSegments:
    """While ``on``, opening the index of any segment but the first fails (too many open files),
    after the segment's file is made."""

    def __init__(self) -> None:
        self.on = True
        self._real = writer_mod.IndexAppender

    def __call__(self, segment, entries):
        if self.on and segment.base != 0:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return self._real(segment, entries)


@pytest.fixture
def index_fails(monkeypatch):
    fault = IndexFailsOnNewSegments()
    monkeypatch.setattr(writer_mod, "IndexAppender", fault)
    return fault


def test_a_roll_that_fails_after_making_the_segment_takes_the_segment_back(tmp_path, index_fails):
    """The new segment's file is made, then opening its index fails (too many open files, a full
    disk): the batch is taken back, and the file too. Left behind empty, it would stand for
    offsets that a later roll stores in the segment before it, and a seek to them found nothing."""
    w = Writer(tmp_path, segment_size=100)
    w.append(v(14))  # 40-byte messages: offsets 0, 1, 2 fill segment 0, offset 3 would start one
    with pytest.raises(JournalError, match="Too many open files"):
        w.append_many([v(14)] * 3)
    assert jnl_files(tmp_path) == [("0000000000000000.jnl", 40)]
    index_fails.on = False
    assert w.append_many([v(0)] * 5) == 5  # 26-byte messages: segment 0 now ends after offset 3
    w.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(6))
    for k in range(6):
        with Scanner(tmp_path, k) as s:
            assert next(iter(s)).offset == k


def test_append_encoded_whose_new_segment_fails_stores_nothing_and_goes_on(tmp_path, index_fails):
    """A copy asking for a new segment that cannot be opened: a StorageError saying nothing was
    stored, and the writer goes on appending in the segment it had (it was left without one)."""
    w = Writer(tmp_path)
    w.append(b"a")
    with pytest.raises(JournalError, match="Too many open files.*nothing of them was stored"):
        w.append_encoded(encode_batch(1, 5, [b"b"])[0], new_segment=True)
    assert jnl_files(tmp_path) == [("0000000000000000.jnl", 27)]
    assert w.append(b"c") == 1
    index_fails.on = False
    assert w.append_encoded(encode_batch(2, 5, [b"d"])[0], new_segment=True) == 2
    w.close()
    assert [(m.offset, m.value) for m in scan_all(tmp_path)] == [(0, b"a"), (1, b"c"), (2, b"d")]
    assert [name for name, _ in jnl_files(tmp_path)] == ["0000000000000000.jnl", "0000000000000002.jnl"]


@pytest.mark.parametrize(("sync", "segment_size"), [("group:2", BIG), ("none", 100)])
def test_a_failed_sync_while_appending_fails_the_writer(tmp_path, sync_fault, sync, segment_size):
    """A sync that fails inside an append (group commit's count reached, a segment's roll): after
    EIO the kernel may have dropped earlier appends' data, and a later sync may not say so. The
    writer fails for good, as on a failed sync of the timer or of sync='always', so that its owner
    opens a new one that recovers, rather than appending on as if the data were stored."""
    w = Writer(tmp_path, sync=sync, segment_size=segment_size)
    w.append(v(30))
    sync_fault.armed = True
    with pytest.raises(JournalError, match="Input/output error"):
        w.append_many([v(30)] * 3)
    assert sync_fault.count == 1
    assert w.failed
    with pytest.raises(JournalError, match="open a new writer to recover"):
        w.append(b"z")
    w.close()
    with Writer(tmp_path) as again:
        assert again.next_offset == 1  # the batch was taken back


def test_a_failed_sync_is_a_storage_error(tmp_path, sync_fault):
    """Not a bare OSError: journalq's errors are one hierarchy, and this one names the file."""
    w = Writer(tmp_path)
    w.append(b"x")
    sync_fault.armed = True
    with pytest.raises(StorageError, match="could not sync: Input/output error") as info:
        w.sync()
    assert info.value.errno == errno.EIO and info.value.file == tmp_path / "jnl" / "0000000000000000.jnl"
    assert w.failed
    w.close()


def test_a_durable_writer_syncs_the_entries_that_a_killed_writer_left_unsynced(tmp_path, monkeypatch):
    """A writer killed right after it made the journal's directory or a segment's file, before it
    synced their entries, leaves them unsynced: a writer that opens them under ``sync="always"``
    syncs them, or the appends it syncs could go with them in a power cut. (Before, only a writer
    that made them synced them.)"""
    (tmp_path / "jnl").mkdir()
    (tmp_path / "jnl" / "0000000000000000.jnl").touch()  # as a killed writer left them
    synced: list[Path] = []
    monkeypatch.setattr(writer_mod, "fsync_dir", synced.append)
    with Writer(tmp_path, sync="always") as w:
        w.append(b"durable")
    assert tmp_path in synced and tmp_path / "jnl" in synced
    synced.clear()
    with Writer(tmp_path, sync="none") as w:  # nothing promised: nothing synced
        w.append(b"not durable")
    assert synced == []


@pytest.mark.parametrize("sync", ["none", "group:1000"])
def test_sync_stores_the_entries_of_the_directories_and_segments_it_made(tmp_path, monkeypatch, sync):
    """Under ``none`` and ``group``, nothing is synced per append; but ``sync()`` (and group
    sync's own syncs) promise that what was appended is stored. A segment or journal directory
    made since the last sync is stored only once its directory's entry is synced as well: a
    power cut could otherwise take away a whole segment of synced appends."""
    root = tmp_path / "deep" / "journal"
    synced: list[Path] = []
    monkeypatch.setattr(writer_mod, "fsync_dir", synced.append)
    with Writer(root, sync=sync, segment_size=64) as w:
        w.append(b"x" * 100)  # fills the first segment: the next append starts a new one
        assert synced == []  # nothing is synced per append under these policies
        w.sync()
        assert set(synced) == {tmp_path, tmp_path / "deep", root, root / "jnl"}
        synced.clear()
        w.append(b"y" * 100)  # its segment was made when the first one rolled, and is now full
        w.sync()
        assert synced == [root / "jnl"]
        synced.clear()
        w.sync()  # nothing new made: nothing more to sync
        assert synced == []
        w.append(b"z" * 100)  # another segment made
    # Closing syncs the data; the new entries too, unless the policy promises nothing at all.
    assert synced == ([] if sync == "none" else [root / "jnl"])


# -- macOS: fsync leaves the data in the drive's cache -----------------------------------------


_F_FULLFSYNC = 51  # macOS's number (Linux's fcntl has none)


@pytest.fixture
def on_macos(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """This machine taken for macOS, whose ``fcntl`` has ``F_FULLFSYNC``: the calls made to
    ``fcntl(fd, F_FULLFSYNC)`` and ``fsync`` are recorded (as ``("full", fd)``, ``("fsync", fd)``),
    and the sync functions picked again for it."""
    import fcntl

    calls: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fake_fcntl(fd: int, command: int, *args: object) -> int:
        assert command == _F_FULLFSYNC
        calls.append(("full", fd))
        real_fsync(fd)
        return 0

    def recorded_fsync(fd: int) -> None:
        calls.append(("fsync", fd))
        real_fsync(fd)

    monkeypatch.setattr(sync_mod.sys, "platform", "darwin")
    monkeypatch.setattr(fcntl, "F_FULLFSYNC", _F_FULLFSYNC, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", fake_fcntl)
    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.delattr(os, "fdatasync", raising=False)  # macOS's os has none
    monkeypatch.setattr(sync_mod, "_os_fdatasync", sync_mod._data_sync())
    monkeypatch.setattr(sync_mod, "_full_sync", sync_mod._full_sync_here())
    return calls


def test_on_macos_a_writer_syncs_with_f_fullfsync(tmp_path: Path, on_macos: list[tuple[str, int]]) -> None:
    # It was os.fsync, which on macOS leaves the data in the drive's cache: lost in a power cut.
    with Writer(tmp_path, sync="always") as writer:
        on_macos.clear()
        writer.append(b"one")
        assert ("full", writer._fd) in on_macos and ("fsync", writer._fd) not in on_macos
    on_macos.clear()
    set_offset(tmp_path, "reader", 1)  # an offset's commit, synced too
    assert [kind for kind, _ in on_macos].count("full") >= 1


def test_on_macos_a_file_system_that_refuses_f_fullfsync_gets_fsync(
    tmp_path: Path, on_macos: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    def refused(fd: int, command: int, *args: object) -> int:
        on_macos.append(("full", fd))
        raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))

    monkeypatch.setattr(fcntl, "fcntl", refused)
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x")
        f.flush()
        sync_mod.fdatasync(f.fileno())
        assert on_macos == [("full", f.fileno()), ("fsync", f.fileno())]


def test_elsewhere_a_writer_syncs_with_fdatasync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_mod.sys, "platform", "linux")
    assert sync_mod._data_sync() is os.fdatasync
    assert not sync_mod._full_sync_here()


# -- a sync policy made directly --------------------------------------------------------------


def test_a_group_policy_made_directly_syncs_every_10ms_as_its_string_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SyncPolicy("group") had no interval and no count: a writer with it never synced (until a
    # roll or close), where the string "group" syncs every 10 ms.
    assert SyncPolicy("group") == SyncPolicy.parse("group")
    import journalq.journal.writer as writer_mod

    synced = threading.Event()
    real = writer_mod.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        synced.set()

    monkeypatch.setattr(writer_mod, "fdatasync", fdatasync)
    with Writer(tmp_path, sync=SyncPolicy("group")) as writer:
        writer.append(b"one")
        assert synced.wait(5)


@pytest.mark.parametrize(
    ("args", "wrong"),
    [
        (("alway",), "unknown sync policy mode 'alway'"),
        (("group", 0.0), "interval_ms must be a number above 0"),
        (("group", -5.0), "interval_ms must be a number above 0"),
        (("group", float("nan")), "interval_ms must be a number above 0"),
        (("group", float("inf")), "interval_ms must be a number above 0"),
        (("group", "5ms"), "interval_ms must be a number above 0"),
        (("group", None, 0), "max_messages must be an integer above 0"),
        (("group", None, 2.5), "max_messages must be an integer above 0"),
        (("none", 5.0), "only a group policy has interval_ms or max_messages"),
        (("always", None, 3), "only a group policy has interval_ms or max_messages"),
    ],
)
def test_a_policy_made_directly_with_bad_fields_is_refused(args: tuple, wrong: str) -> None:
    # Each was taken as it was: "alway" and "none" with an interval never synced, a group of 0
    # synced at every append, and a string interval killed the timer's thread (no sync after).
    with pytest.raises(Error, match=re.escape(wrong)):
        SyncPolicy(*args)


@pytest.mark.parametrize("one", [b"abc", bytearray(b"abc"), "abc", Message(value=b"abc")])
def test_append_many_given_one_message_says_so(tmp_path: Path, one: object) -> None:
    # It was "item 0 of the batch is a int": the bytes (or the Message's fields) taken for items.
    with Writer(tmp_path) as writer:
        with pytest.raises(InvalidMessageError, match="a batch must be an iterable of values or Messages, not one"):
            writer.append_many(one)  # type: ignore[arg-type]
        assert writer.next_offset == 0


def test_deferred_syncs_write_at_once_and_sync_later_in_another_thread(tmp_path, syncs):
    # An event loop appends itself and only the syncs wait in a thread (the server's group
    # commit): the appends are written (readable) in the block, synced once by ``sync()``.
    a = Writer(tmp_path / "a", sync="always", segment_size=BIG)
    b = Writer(tmp_path / "b", sync="always", segment_size=BIG)
    none = Writer(tmp_path / "n", sync="none", segment_size=BIG)
    with writer_mod.DeferredSyncs() as deferred:
        a.append(b"1")
        a.append_many([b"2", b"3"])
        with a.hold():
            a.append(b"4")
        b.append(b"x")
        none.append(b"not synced: sync='none'")
    assert syncs == []
    assert [m.value for m in scan_all(a.path)] == [b"1", b"2", b"3", b"4"]
    assert deferred.due == {a: 4, b: 1}
    thread = threading.Thread(target=deferred.sync)
    thread.start()
    thread.join()
    assert len(syncs) == 2 and not deferred
    assert a._durable_offset == 4 and b._durable_offset == 1
    a.append(b"5")  # out of the block: synced as before
    assert len(syncs) == 3
    for w in (a, b, none):
        w.close()


def test_deferred_syncs_a_failed_sync_raises_and_fails_the_writer(tmp_path, monkeypatch):
    w = Writer(tmp_path, sync="always", segment_size=BIG)
    with writer_mod.DeferredSyncs() as deferred:
        w.append(b"1")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(writer_mod, "fdatasync", failing)
    with pytest.raises(StorageError, match="Input/output error"):
        deferred.sync()
    assert w.failed
    with pytest.raises(JournalError, match="failed earlier"):
        w.append(b"2")
    w.close()


def test_deferred_syncs_do_not_nest_and_are_of_their_thread(tmp_path, syncs):
    w = Writer(tmp_path, sync="always", segment_size=BIG)
    with writer_mod.DeferredSyncs():
        with pytest.raises(Error, match="do not nest"), writer_mod.DeferredSyncs():
            pass
        other = threading.Thread(target=w.append, args=(b"another thread's: synced",))
        other.start()
        other.join()
        assert len(syncs) == 1
    with writer_mod.DeferredSyncs():  # the block left: one may begin again
        pass
    w.close()
