"""Admission control of the streaming read as Kafka's source does it (no Spark session):
minOffsetsPerTrigger against maxOffsetsPerTrigger, and when maxTriggerDelay counts from."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Writer  # noqa: E402
from journalq.spark import options as opts  # noqa: E402
from journalq.spark.schema import SCHEMA  # noqa: E402
from journalq.spark.source import JournalDataSource, JournalStreamReader  # noqa: E402


def journal(tmp_path, n: int) -> str:
    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * n)
    return str(path)


def test_min_offsets_above_max_offsets_is_refused_naming_both(tmp_path):
    path = journal(tmp_path, 1)
    options = {"path": path, "minOffsetsPerTrigger": "20", "maxOffsetsPerTrigger": "15"}
    with pytest.raises(opts.OptionError, match=r"minOffsetsPerTrigger \(20\).*maxOffsetsPerTrigger \(15\)"):
        JournalStreamReader(options, SCHEMA)
    with pytest.raises(opts.OptionError, match="minOffsetsPerTrigger"):
        JournalDataSource({**options, "MINOFFSETSPERTRIGGER": "20"}).streamReader(SCHEMA)
    # equal is a fixed batch size: allowed
    JournalStreamReader({**options, "maxOffsetsPerTrigger": "20"}, SCHEMA)


def test_the_first_batch_does_not_wait_for_max_trigger_delay(tmp_path, monkeypatch):
    # Kafka's source counts maxTriggerDelay from the last batch: with none yet, the data there
    # is read at once, not after the delay (15 minutes by default).
    from pyspark.sql.streaming.datasource import ReadMinRows

    path = journal(tmp_path, 10)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    reader = JournalStreamReader({"path": path, "minOffsetsPerTrigger": "20", "maxTriggerDelay": "60s"}, SCHEMA)
    clock[0] += 1
    assert reader.latestOffset({"": 0}, ReadMinRows(20)) == {"": 10}
    # from then on, fewer than 20 new messages wait for the delay since that batch
    with Writer(path) as w:
        w.append_many([b"y"] * 5)
    clock[0] += 30
    assert reader.latestOffset({"": 10}, ReadMinRows(20)) == {"": 10}
    clock[0] += 31
    assert reader.latestOffset({"": 10}, ReadMinRows(20)) == {"": 15}
    assert reader.latestOffset({"": 15}, ReadMinRows(20)) == {"": 15}


@pytest.mark.usefixtures("vectors_untouched")  # as in the file it came from
def test_a_small_shard_is_not_starved_by_a_big_one():
    """A shard's share of maxOffsetsPerTrigger rounds down to 0 beside a shard with a far bigger
    backlog; the offsets left over went to the fullest shard first, so while the big shard stayed
    behind the small one's messages were never read. Shards that got nothing now come first (as
    Kafka's source gives every partition with data at least one), within the limit."""
    from journalq.spark.source import allocate

    assert allocate({"small": 1, "big": 10**6}, 1000) == {"small": 1, "big": 999}
    assert allocate({"a": 3, "b": 10**6, "c": 10**6}, 10) == {"a": 1, "b": 5, "c": 4}
    assert allocate({"a": 2, "b": 2, "c": 10**6}, 2) == {"a": 1, "b": 0, "c": 1}  # the limit holds
    assert allocate({"a": 10, "b": 30}, 8) == {"a": 2, "b": 6}
