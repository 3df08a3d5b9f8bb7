"""Audit of the Spark write path and the pipelines (no Spark session): each test is a bug found
and fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.errors import Error  # noqa: E402
from journalq.spark.targets import for_writing  # noqa: E402


def test_shard_bit_for_a_topic_is_refused_not_ignored(tmp_path: Path) -> None:
    # A topic's shards are its settings: shardBit/shardPrefix were silently dropped.
    with pytest.raises(Error, match="shardBit"):
        for_writing(str(tmp_path), "events", shard_bit=2)
    assert not (tmp_path / "events").exists()  # refused before the topic is made
    for_writing(str(tmp_path), "events")
    with pytest.raises(Error, match="shardBit"):
        for_writing(str(tmp_path), "events", shard_bit=2)
