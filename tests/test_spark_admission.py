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
