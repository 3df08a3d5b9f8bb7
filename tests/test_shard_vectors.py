"""The sharded vector written by sej's ``shard.Writer``: read by ``ShardedScanner``, and written
again by ``ShardedWriter`` byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import load_expected
from journalq.journal import Message
from journalq.journal.writer import DEFAULT_SEGMENT_SIZE
from journalq.shard import ShardedScanner, ShardedWriter, read_layout, shard_of

pytestmark = pytest.mark.usefixtures("vectors_untouched")

SHARDS = [f"events.2.{i:03d}" for i in range(4)]


def as_tuples(messages):
    return [(m.offset, m.timestamp_ns, m.type, bytes(m.key), bytes(m.value)) for m in messages]


@pytest.fixture(scope="module")
def rows(sej_vectors: Path) -> list[dict]:
    return load_expected(sej_vectors / "sharded.expected.jsonl")


def segment_files(shard: Path) -> dict[str, bytes]:
    """The segments of a shard, by name (journalq's .idx files, which sej ignores, left out)."""
    return {p.name: p.read_bytes() for p in sorted((shard / "jnl").iterdir()) if p.suffix == ".jnl"}


def test_the_vector_is_what_the_readme_says(sej_vectors: Path, rows: list[dict]) -> None:
    layout = read_layout(sej_vectors / "sharded")
    assert (layout.prefix, layout.bit, list(layout.shards)) == ("events", 2, SHARDS)
    assert len(rows) == 1000 and {r["dir"] for r in rows} == set(SHARDS)
    # Each message is in the shard sej's default hash gives its key.
    assert all(r["dir"] == f"events.2.{shard_of(r['message'].key, 2):03d}" for r in rows)
    # One segment per shard, far below any default segment size (sej's or ours): the Go writer
    # never rolled, so a large segment size reproduces the same files.
    sizes = [os.path.getsize(p) for s in SHARDS for p in (sej_vectors / "sharded" / s / "jnl").glob("*.jnl")]
    assert len(sizes) == 4 and max(sizes) < DEFAULT_SEGMENT_SIZE


def test_sharded_scanner_reads_each_shard_as_expected(sej_vectors: Path, expected_sharded) -> None:
    # Reading from the start is a pure read: the read-only original works as it is.
    got: dict[str, list[Message]] = {}
    with ShardedScanner(sej_vectors / "sharded") as scanner:
        for name, message in scanner:
            got.setdefault(name, []).append(message)
        assert scanner.offsets == {name: len(expected_sharded[name]) for name in SHARDS}
    assert sorted(got) == SHARDS
    for name in SHARDS:
        assert as_tuples(got[name]) == as_tuples(expected_sharded[name]), name


def test_sharded_scanner_read_batch_gives_the_same(sej_vectors: Path, expected_sharded) -> None:
    got: dict[str, list[Message]] = {}
    with ShardedScanner(sej_vectors / "sharded", prefix="events") as scanner:
        while batch := scanner.read_batch(17):
            name, messages = batch
            assert 1 <= len(messages) <= 17
            got.setdefault(name, []).extend(messages)
    for name in SHARDS:
        assert as_tuples(got[name]) == as_tuples(expected_sharded[name]), name


def rewrite(root: Path, rows: list[dict], *, batch: int | None, segment_size: int) -> None:
    with ShardedWriter(root, "events", 2, segment_size=segment_size) as writer:
        if batch is None:
            for r in rows:
                m = r["message"]
                assert writer.append(m.value, m.key, m.type, m.timestamp_ns) == (r["dir"], m.offset)
        else:
            for start in range(0, len(rows), batch):
                part = rows[start : start + batch]
                assert writer.append_many([r["message"] for r in part]) == [
                    (r["dir"], r["message"].offset) for r in part
                ]


@pytest.mark.parametrize(
    ("batch", "segment_size"),
    [(None, DEFAULT_SEGMENT_SIZE), (None, 1 << 30), (100, DEFAULT_SEGMENT_SIZE), (1000, 1 << 30)],
    ids=["append", "append-1GiB-segments", "append_many-100", "append_many-1000-1GiB-segments"],
)
def test_sharded_writer_writes_the_vector_byte_for_byte(
    sej_vectors: Path, tmp_path: Path, rows: list[dict], batch: int | None, segment_size: int
) -> None:
    root = tmp_path / "sharded"
    rewrite(root, rows, batch=batch, segment_size=segment_size)
    assert sorted(p.name for p in root.iterdir()) == SHARDS
    for name in SHARDS:
        ours, sejs = segment_files(root / name), segment_files(sej_vectors / "sharded" / name)
        assert list(ours) == list(sejs) == ["0000000000000000.jnl"], name
        assert ours == sejs, name
