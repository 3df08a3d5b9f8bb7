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


def test_archived_files_are_synced_before_the_offset_commits(tmp_path: Path, monkeypatch) -> None:
    # Spark's local file writes are not fsynced: the archiver committed its reader offset while
    # the Parquet files' data (and a new date directory's entry in the output) could still be
    # lost in a power cut, losing those messages from the archive for good.
    from journalq.spark import pipelines

    staging, out = tmp_path / "out" / "_staging" / "run", tmp_path / "out"
    (staging / "date=2026-01-02").mkdir(parents=True)
    (staging / "date=2026-01-02" / "part-0.parquet").write_bytes(b"data")
    (staging / "date=2026-01-02" / ".part-0.parquet.crc").write_bytes(b"crc")
    from test_queue_deletion import _synced_paths

    synced = _synced_paths(monkeypatch)
    moved, dates = pipelines._move_into_place(staging, out, "jq-1-2-")
    assert (moved, dates) == (1, ["2026-01-02"])
    placed = out / "date=2026-01-02" / "jq-1-2-part-0.parquet"
    assert placed.read_bytes() == b"data"
    assert str(placed) in synced or str(staging / "date=2026-01-02" / "part-0.parquet") in synced
    assert str(out) in synced  # the new date directory's entry
    assert str(out / "date=2026-01-02") in synced


class _Failed(Exception):
    pass


class _Query:
    """A streaming query's waiting methods: ``runs_forever`` (a processing-time trigger), or
    failed with ``error``."""

    def __init__(self, *, runs_forever: bool = False, error: Exception | None = None) -> None:
        self.runs_forever, self.error, self.stopped = runs_forever, error, False

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        if self.error is not None:
            raise self.error
        if self.runs_forever and not self.stopped:
            if timeout is None:
                raise AssertionError("waited without end on a running query")
            return False
        return True if timeout is not None else None

    def stop(self) -> None:
        self.stopped = True


def test_wait_for_sees_the_second_query_fail_while_the_first_runs() -> None:
    # wait_for waited on the first query (which never ends under a processing-time trigger)
    # before looking at the second: aggregate hung with its Parquet query dead.
    from journalq.spark.pipelines import wait_for

    running, failed = _Query(runs_forever=True), _Query(error=_Failed("parquet sink failed"))
    with pytest.raises(_Failed, match="parquet sink failed"):
        wait_for(None, [running, failed])
    assert running.stopped


def test_wait_for_returns_when_every_query_ended() -> None:
    from journalq.spark.pipelines import wait_for

    queries = [_Query(), _Query()]
    wait_for(None, queries)
    assert not any(q.stopped for q in queries)


def test_a_timestamp_sej_cannot_hold_is_refused_before_any_append(tmp_path: Path) -> None:
    # TIMESTAMP reaches year 9999; sej's nanoseconds end in 2262. The row failed only in the
    # append, after the task's other shards (and earlier Arrow batches) were already appended.
    import datetime as dt

    import pyarrow as pa

    from journalq.spark.writing import WriteError, WriteSpec, batch_messages

    spec = WriteSpec(("value", "timestamp"))
    utc = dt.timezone.utc
    stamps = [dt.datetime(2020, 1, 1, tzinfo=utc), dt.datetime(3000, 1, 1, tzinfo=utc)]
    batch = pa.RecordBatch.from_pydict(
        {"value": [b"a", b"b"], "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC"))}
    )
    with pytest.raises(WriteError, match="timestamp .*3000-01-01.* 2262"):
        batch_messages(batch, spec)
    # timestamp_ns wins over timestamp: then the row is fine.
    spec_ns = WriteSpec(("value", "timestamp", "timestamp_ns"))
    with_ns = batch.append_column("timestamp_ns", pa.array([None, 5], pa.int64()))
    messages, _ = batch_messages(with_ns, spec_ns)
    assert [m.timestamp_ns for m in messages] == [1_577_836_800_000_000_000, 5]
    # The zero time (sej's "no timestamp", int64's least) as a read gives it back: a NULL
    # timestamp and its timestamp_ns. A copy of a journal writes it as it was.
    from journalq.errors import ZERO_TIMESTAMP

    zero = pa.RecordBatch.from_pydict({
        "value": [b"a"],
        "timestamp": pa.array([None], pa.timestamp("us", tz="UTC")),
        "timestamp_ns": pa.array([ZERO_TIMESTAMP], pa.int64()),
    })
    messages, _ = batch_messages(zero, spec_ns)
    assert [m.timestamp_ns for m in messages] == [ZERO_TIMESTAMP]


def test_a_column_named_twice_is_refused() -> None:
    # A join's two "key" (or "value") columns: the write silently took the first one.
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from journalq.spark.writing import WriteError, check_schema

    schema = StructType([StructField("value", BinaryType()), StructField("key", StringType()),
                         StructField("key", BinaryType())])
    with pytest.raises(WriteError, match="key .*more than once"):
        check_schema(schema)


def test_an_empty_write_id_is_refused_not_ignored(tmp_path: Path) -> None:
    # writeId="" (an id from an empty variable) silently made the write a plain append, so a
    # rerun appended everything again.
    from pyspark.sql.types import BinaryType, StructField, StructType

    from journalq.spark.source import JournalWriter

    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(Error, match="writeId"):
        JournalWriter({"path": str(tmp_path / "j"), "writeId": ""}, schema, False)
    assert JournalWriter({"path": str(tmp_path / "j"), "writeId": "w1"}, schema, False).write_id == "w1"
