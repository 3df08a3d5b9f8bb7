"""Spark's leftovers checked again by the fifth pass: each test here failed before its fix (no
Spark session)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import StructType  # noqa: E402

from journalq.journal import Writer  # noqa: E402
from journalq.spark import columnar, reading  # noqa: E402
from journalq.spark.schema import SCHEMA  # noqa: E402

LIMIT = 1000


def test_the_shard_column_of_a_batch_stays_within_arrows_offsets(tmp_path, monkeypatch) -> None:
    """The shard column repeats the shard's name on every row, counted in int32 offsets as keys
    and values are: a batch of many small messages (empty values, after a large one had grown
    the read) with a long name passed 2 GiB there, where the offsets wrapped round without a
    word (an Arrow array with negative offsets). Batches now stop at as many rows as the column
    holds. The limit is made small here (``columnar.MAX_BINARY``), not the data huge."""
    monkeypatch.setattr(columnar, "MAX_BINARY", LIMIT)
    with Writer(tmp_path / "j") as writer:
        writer.append_many([b""] * 300)  # 26 bytes each: one read, one call of decode_columns
    shard = "events.1.000"  # 12 bytes a row: 83 rows a batch
    spec = reading.ReadSpec(StructType([SCHEMA["offset"], SCHEMA["shard"]]))
    batches = list(reading.read_range(reading.ShardRange(shard, str(tmp_path / "j"), 0, 300), spec))
    offsets = [np.frombuffer(b.column(1).buffers()[1], np.int32)[b.column(1).offset :] for b in batches]
    assert all(int(o[len(b)]) <= LIMIT for o, b in zip(offsets, batches))
    assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(300))
    assert {s for b in batches for s in b.column(1).to_pylist()} == {shard}
