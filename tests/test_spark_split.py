"""How a read cuts a shard's offsets into partitions (no Spark session): pieces bounded in bytes
even where message sizes vary (a task never holds far more than maxPartitionBytes), at least
minPartitions of them, and the same pieces whenever the same range is planned again (a replayed
micro-batch must give each partition the same rows)."""

from __future__ import annotations

from itertools import pairwise

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Writer  # noqa: E402
from journalq.journal.codec import OVERHEAD  # noqa: E402
from journalq.spark import reading  # noqa: E402

MB = 1 << 20


def skewed(tmp_path, segment_size: int = 8 * MB) -> str:
    path = tmp_path / "j"
    with Writer(path, segment_size=segment_size) as w:
        w.append_many([b"x" * MB] * 40)  # 40 MB in 40 messages, across segments
        w.append_many([b"y" * 10] * 100_000)  # 3.6 MB in 100,000
    return str(path)


def check_contiguous(pieces, start: int, end: int) -> None:
    assert pieces[0].start == start and pieces[-1].end == end
    assert all(a.end == b.start and a.end > a.start for a, b in pairwise(pieces))


def test_pieces_are_bounded_in_bytes_when_message_sizes_vary(tmp_path):
    path = skewed(tmp_path)
    r = reading.ShardRange("", path, 0, 100_040)
    pieces = reading.split([r], min_partitions=None, max_partition_bytes=4 * MB)
    check_contiguous(pieces, 0, 100_040)
    sizes = [reading.range_bytes(path, p.start, p.end) for p in pieces]
    assert sum(sizes) == reading.range_bytes(path, 0, 100_040)
    # at most the bound and the message that straddles a cut
    assert max(sizes) <= 4 * MB + MB + OVERHEAD, [s // MB for s in sizes]
    assert len(pieces) >= 11


def test_byte_pieces_are_the_same_when_planned_again(tmp_path):
    path = skewed(tmp_path)
    r = reading.ShardRange("", path, 30, 100_000)
    before = reading.split([r], min_partitions=3, max_partition_bytes=2 * MB)
    with Writer(path, segment_size=8 * MB) as w:
        w.append_many([b"z" * MB] * 10)
    for idx in (tmp_path / "j" / "jnl").glob("*.idx"):
        idx.unlink()  # the sparse index is only a shortcut: the cuts come from the messages
    assert reading.split([r], min_partitions=3, max_partition_bytes=2 * MB) == before


def test_min_partitions_still_counts_messages_beside_a_huge_one(tmp_path):
    path = tmp_path / "j"
    with Writer(path) as w:
        w.append(b"h" * (10 * MB))
        w.append_many([b"t"] * 9)
    r = reading.ShardRange("", str(path), 0, 10)
    pieces = reading.split([r], min_partitions=10, max_partition_bytes=64 * MB)
    check_contiguous(pieces, 0, 10)
    assert len(pieces) == 10
    pieces = reading.split([r], min_partitions=None, max_partition_bytes=2 * MB)
    check_contiguous(pieces, 0, 10)
    assert [(p.start, p.end) for p in pieces] == [(0, 1), (1, 10)]


def test_min_partitions_holds_where_byte_cuts_fall_inside_big_messages(tmp_path):
    # 300 KB over 10 big messages and 18 small ones: by bytes "322 pieces" of 1,000 bytes, but
    # the cuts land inside the big messages; minPartitions still gets a piece per message.
    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"b" * 30_000] * 10 + [b"s"] * 18)
    r = reading.ShardRange("", str(path), 0, 28)
    pieces = reading.split([r], min_partitions=50, max_partition_bytes=1000)
    check_contiguous(pieces, 0, 28)
    assert len(pieces) == 28
