"""minOffsetsPerTrigger on a real local Spark session: a query's first micro-batch reads what is
there at once (as Kafka's source), the later ones wait for the minimum or for maxTriggerDelay."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Scanner, Writer  # noqa: E402
from journalq.spark.testing import local_session  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def count(path: Path) -> int:
    if not (path / "jnl").is_dir():
        return 0
    with Scanner(path) as scanner:
        return sum(1 for _ in scanner)


def test_first_batch_is_read_at_once_then_min_offsets_waits(tmp_path):
    spark = local_session()
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    with Writer(source) as w:
        w.append_many([b"m%d" % i for i in range(10)])
    query = (
        spark.readStream.format("journalq").option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "1000").option("maxTriggerDelay", "5m").load(str(source))
        .selectExpr("value").writeStream.format("journalq")
        .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds")
        .start(str(out))
    )
    try:
        deadline = time.monotonic() + 60
        while count(out) < 10:  # before: nothing for maxTriggerDelay (5 minutes here)
            assert time.monotonic() < deadline, "the first micro-batch waited for minOffsetsPerTrigger"
            time.sleep(0.2)
        with Writer(source) as w:
            w.append_many([b"n%d" % i for i in range(10)])
        time.sleep(3)  # 15 triggers: fewer than 1000 new messages, and within the delay
        assert count(out) == 10
    finally:
        query.stop()
