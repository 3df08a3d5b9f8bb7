"""Batch writes through the ``journalq`` data source: journals, sharded roots, topics; what is
refused and why; exactly-once appends with a write id."""

from __future__ import annotations

import datetime as dt
import zlib
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.errors import Error  # noqa: E402
from journalq.journal import Scanner  # noqa: E402
from journalq.journal.offsets import end_offset  # noqa: E402
from journalq.queue import Broker  # noqa: E402
from journalq.queue.settings import load as load_settings  # noqa: E402
from journalq.spark.targets import for_writing  # noqa: E402
from journalq.spark.testing import local_session  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")


@pytest.fixture(scope="module")
def spark():
    return local_session()


def messages(path):
    with Scanner(path) as scanner:
        return list(scanner)


def save(df, path, **options):
    writer = df.write.format("journalq").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(str(path))


def test_append_values_keys_types_timestamps(spark, tmp_path):
    moment = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    df = spark.createDataFrame(
        [(b"a", "k1", 3, moment, None), (b"b", None, None, None, 42), (b"c", "k3", 255, None, None)],
        "value binary, key string, type int, timestamp timestamp, timestamp_ns bigint",
    ).coalesce(1)
    path = tmp_path / "j"
    before = dt.datetime.now(dt.timezone.utc).timestamp() * 1e9
    save(df, path)
    got = messages(path)
    assert [(m.offset, m.value, m.key, m.type) for m in got] == [
        (0, b"a", b"k1", 3), (1, b"b", b"", 0), (2, b"c", b"k3", 255)
    ]
    assert got[0].timestamp_ns == 1_714_564_800_123_456_000
    assert got[1].timestamp_ns == 42  # timestamp_ns is exact and wins
    assert got[2].timestamp_ns >= before  # none given: the time of the append
    save(spark.createDataFrame([("text",)], "value string"), path)
    assert messages(path)[-1].value == b"text" and end_offset(path) == 4


def test_sharded_root_by_key_hash(spark, tmp_path, copy_vector):
    rows = spark.range(2000).selectExpr("cast(id as string) as key", "cast(id * 2 as string) as value")
    root = tmp_path / "root"
    save(rows, root, shardBit="3", shardPrefix="ev")
    shards = sorted(p.name for p in root.iterdir() if not p.name.startswith("_"))
    assert shards == [f"ev.3.00{i}" for i in range(8)]
    total = 0
    for shard in shards:
        for m in messages(root / shard):
            assert f"ev.3.{zlib.crc32(m.key) & 7:03x}" == shard
            assert int(m.value) == 2 * int(m.key)
            total += 1
    assert total == 2000
    # An existing sej root: appended with the hash sej uses, to the shards sej made.
    copy = copy_vector("sharded")
    before = {s: end_offset(copy / s) for s in (f"events.2.00{i}" for i in range(4))}
    save(spark.createDataFrame([(b"key-%d" % i, b"v") for i in range(40)], "key binary, value binary"), copy)
    after = {s: end_offset(copy / s) for s in before}
    assert sum(after.values()) - sum(before.values()) == 40
    for i in range(40):
        key = b"key-%d" % i
        shard = f"events.2.{zlib.crc32(key) & 3:03x}"
        assert any(m.key == key for m in messages(copy / shard))


def test_topic_is_created_with_the_broker_and_keeps_its_settings(spark, tmp_path):
    data = tmp_path / "data"
    with Broker(data, sync="none") as broker:
        broker.topic("small", segment_size=4096)
    df = spark.range(500).selectExpr("cast(concat('message ', id) as binary) as value")
    save(df, data, topic="small")
    save(df.limit(3), data, topic="fresh")
    assert load_settings(data / "fresh") is not None
    assert len(list((data / "small" / "jnl").glob("*.jnl"))) >= 4  # the topic's 4 KiB segments
    with Broker(data, sync="none") as broker:
        received = broker.queue("small").receive(10)
        assert len(received) == 10 and received[0].body.startswith(b"message ")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda s: s.createDataFrame([("x",)], "v string"), "needs a value column"),
        (lambda s: s.createDataFrame([(1,)], "value int"), "column value is int"),
        (lambda s: s.createDataFrame([(b"x", 1.5)], "value binary, type double"), "column type is double"),
        (lambda s: s.createDataFrame([(b"x", "y")], "value binary, extra string"), "extra cannot be written"),
        (lambda s: s.createDataFrame([(b"x", 256)], "value binary, type int"), "from 0 to 255"),
        (lambda s: s.createDataFrame([(None,)], "value binary"), "value is NULL"),
        (lambda s: s.createDataFrame([(b"x", b"k" * 128)], "value binary, key binary"), "at most 127"),
    ],
)
def test_refused_with_a_clear_error(spark, tmp_path, make, match):
    with pytest.raises(Exception, match=match):
        save(make(spark), tmp_path / "j")
    assert not (tmp_path / "j" / "jnl").exists() or end_offset(tmp_path / "j") == 0


def test_only_append(spark, tmp_path):
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("journalq").mode("overwrite").save(str(tmp_path / "j"))
    with pytest.raises(Exception, match="Append"):
        df.write.format("journalq").save(str(tmp_path / "j"))  # Spark's default, ErrorIfExists
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("mine")
    with pytest.raises(Exception, match="refusing to write"):
        save(df, tmp_path / "notes")


def test_write_id_appends_once(spark, tmp_path):
    df = spark.range(1000).selectExpr("cast(id as string) as value").repartition(4)
    path = tmp_path / "j"
    save(df, path, writeId="load-2024-05-01")
    save(df, path, writeId="load-2024-05-01")  # a rerun: nothing appended
    assert end_offset(path) == 1000
    assert sorted(int(m.value) for m in messages(path)) == list(range(1000))
    save(df, path, writeId="load-2024-05-02")
    assert end_offset(path) == 2000
    assert (path / "_spark_commits").is_dir()


# -- refused, not ignored: a shard bit for a topic, a timestamp sej cannot hold, an empty write id --


def test_shard_bit_for_a_topic_is_refused_not_ignored(tmp_path: Path) -> None:
    # A topic's shards are its settings: shardBit/shardPrefix were silently dropped.
    with pytest.raises(Error, match="shardBit"):
        for_writing(str(tmp_path), "events", shard_bit=2)
    assert not (tmp_path / "events").exists()  # refused before the topic is made
    for_writing(str(tmp_path), "events")
    with pytest.raises(Error, match="shardBit"):
        for_writing(str(tmp_path), "events", shard_bit=2)


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


def test_an_empty_write_id_is_refused_not_ignored(tmp_path: Path) -> None:
    # writeId="" (an id from an empty variable) silently made the write a plain append, so a
    # rerun appended everything again.
    from pyspark.sql.types import BinaryType, StructField, StructType

    from journalq.spark.source import JournalWriter

    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(Error, match="writeId"):
        JournalWriter({"path": str(tmp_path / "j"), "writeId": ""}, schema, False)
    assert JournalWriter({"path": str(tmp_path / "j"), "writeId": "w1"}, schema, False).write_id == "w1"
