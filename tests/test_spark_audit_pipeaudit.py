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


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_commit_log_record_is_a_clear_error(tmp_path: Path, value: bytes) -> None:
    # A record that is not a JSON object raised a bare JSONDecodeError/AttributeError.
    from journalq.journal import Writer
    from journalq.spark.targets import Target
    from journalq.spark.writing import INTENT, CommitLog

    log = CommitLog(Target(tmp_path, "journal"), "q1")
    log.append(INTENT, {"k": "intent", "b": 0, "p": 0, "s": "", "e": 0, "n": 1, "d": "1:0"})
    with Writer(log.path) as writer:
        writer.append(value, type=INTENT)
    with pytest.raises(Error, match=r"commit log .*_spark_commits.*offset 1"):
        log.records(0)
