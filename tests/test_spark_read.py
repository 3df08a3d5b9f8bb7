"""Batch reads through the ``journalq`` data source, on a real local Spark session: the Go
vectors, the columns, offsets and timestamps options, partitioning, filter pushdown (and its
guard against Spark's shared read plans), topics with queue envelopes, data loss."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402

from journalq.errors import ZERO_TIMESTAMP  # noqa: E402
from journalq.journal import Message, Writer  # noqa: E402
from journalq.queue import Broker  # noqa: E402
from journalq.spark.testing import local_session, scanned_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")


@pytest.fixture(scope="module")
def spark():
    return local_session()


def read(spark, path, **options):
    reader = spark.read.format("journalq")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(path))


def rows_as_messages(df, with_shard=False):
    """Rows as (shard,) Message, timestamp checked against timestamp_ns on the way."""
    out = []
    cols = df.select("*", F.unix_micros("timestamp").alias("_us")).orderBy("shard", "offset").collect()
    for r in cols:
        if r.timestamp_ns == ZERO_TIMESTAMP:
            assert r.timestamp is None and r._us is None
        else:
            assert r._us == r.timestamp_ns // 1000
        m = Message(r.offset, r.timestamp_ns, r.type, bytes(r.key), bytes(r.value))
        out.append((r.shard, m) if with_shard else m)
    return out


# -- the vectors ------------------------------------------------------------------------------


def test_plain_vector(spark, sej_vectors, expected_plain):
    df = read(spark, sej_vectors / "plain")
    assert rows_as_messages(df) == expected_plain
    assert {r.shard for r in df.select("shard").distinct().collect()} == {""}


def test_sharded_vector(spark, sej_vectors, expected_sharded):
    got = rows_as_messages(read(spark, sej_vectors / "sharded"), with_shard=True)
    by_shard: dict[str, list[Message]] = {}
    for shard, message in got:
        by_shard.setdefault(shard, []).append(message)
    assert by_shard == expected_sharded


def test_torn_vector(spark, sej_vectors, expected_torn):
    assert rows_as_messages(read(spark, sej_vectors / "torn")) == expected_torn


def test_schema_and_body_of_plain_messages(spark, sej_vectors):
    df = read(spark, sej_vectors / "plain")
    fields = {f.name: (f.dataType.simpleString(), f.nullable) for f in df.schema.fields}
    assert fields == {
        "offset": ("bigint", False), "timestamp": ("timestamp", True), "timestamp_ns": ("bigint", False),
        "type": ("smallint", False), "key": ("binary", False), "value": ("binary", False),
        "shard": ("string", False), "attributes": ("map<string,string>", True), "body": ("binary", False),
    }
    # No message of the vector is a queue envelope (type 0xE0 ones lack the magic): body = value.
    assert df.where("body != value or attributes is not null").count() == 0
    assert df.where("type = 224").count() > 0


def test_a_user_schema_picks_columns(spark, sej_vectors, expected_plain):
    df = spark.read.format("journalq").schema("value binary, offset bigint").load(str(sej_vectors / "plain"))
    rows = df.orderBy("offset").collect()
    assert [(r.offset, bytes(r.value)) for r in rows] == [(m.offset, m.value) for m in expected_plain]
    with pytest.raises(Exception, match="no column 'nope'"):
        spark.read.format("journalq").schema("nope int").load(str(sej_vectors / "plain")).collect()
    with pytest.raises(Exception, match=r"column\(s\) value appear more than once in the schema"):
        spark.read.format("journalq").schema("value binary, value binary").load(str(sej_vectors / "plain")).collect()


# -- offsets, timestamps, partitions ----------------------------------------------------------


def test_starting_and_ending_offsets(spark, sej_vectors, expected_plain, expected_sharded):
    df = read(spark, sej_vectors / "plain", startingOffsets='{"": 100}', endingOffsets='{"": 250}')
    assert [m.offset for m in rows_as_messages(df)] == list(range(100, 250))
    assert read(spark, sej_vectors / "plain", startingOffsets="latest").count() == 0
    sharded = read(spark, sej_vectors / "sharded",
                   startingOffsets='{"events.2.001": 200, "events.2.003": -1}', endingOffsets='{"events.2.000": 10}')
    counts = {r.shard: r["count"] for r in sharded.groupBy("shard").count().collect()}
    assert counts == {"events.2.000": 10, "events.2.001": len(expected_sharded["events.2.001"]) - 200,
                      "events.2.002": len(expected_sharded["events.2.002"])}
    with pytest.raises(Exception, match="names shard"):
        read(spark, sej_vectors / "sharded", startingOffsets='{"nope.2.000": 1}').collect()
    with pytest.raises(Exception, match="past its end"):
        read(spark, sej_vectors / "plain", endingOffsets='{"": 5000}').collect()


def test_starting_timestamp_is_the_first_offset_at_or_after(spark, sej_vectors, expected_plain):
    moment = sorted(m.timestamp_ns for m in expected_plain if m.timestamp_ns != ZERO_TIMESTAMP)[1500]
    first = next(m.offset for m in expected_plain if m.timestamp_ns >= moment)
    millis = -(-moment // 1_000_000)  # Kafka's unit; the first at or after the millisecond
    first_ms = next(m.offset for m in expected_plain if m.timestamp_ns >= millis * 1_000_000)
    df = read(spark, sej_vectors / "plain", startingTimestamp=str(millis))
    assert df.agg(F.min("offset"), F.count("*")).first() == (first_ms, 3000 - first_ms)
    assert first <= first_ms
    iso = "2030-01-01T00:00:00Z"
    end = next((m.offset for m in expected_plain if m.timestamp_ns >= 1_893_456_000_000_000_000), 3000)
    assert read(spark, sej_vectors / "plain", endingTimestamp=iso).count() == end


def test_partitions_by_shard_and_offset_range(spark, sej_vectors):
    assert read(spark, sej_vectors / "plain").rdd.getNumPartitions() == 1
    df = read(spark, sej_vectors / "plain", minPartitions=5)
    assert df.rdd.getNumPartitions() == 5
    assert df.count() == 3000 and df.select("offset").distinct().count() == 3000
    assert read(spark, sej_vectors / "plain", maxPartitionBytes="256k").rdd.getNumPartitions() >= 4
    assert read(spark, sej_vectors / "sharded").rdd.getNumPartitions() == 4


# -- filter pushdown --------------------------------------------------------------------------


def test_offset_filters_seek_instead_of_reading(spark, sej_vectors, expected_plain):
    df = read(spark, sej_vectors / "plain", filterPushdown="true")
    narrow = df.where("offset >= 1000 and offset < 1010")
    assert scanned_rows(narrow) == 10
    assert [m.offset for m in rows_as_messages(narrow)] == list(range(1000, 1010))


def test_type_timestamp_and_shard_filters(spark, sej_vectors, expected_plain, expected_sharded):
    df = read(spark, sej_vectors / "plain", filterPushdown="true")
    wanted = [m.offset for m in expected_plain if m.type in (3, 7) and m.offset > 500]
    q = df.where("type in (3, 7) and offset > 500").select("offset")
    assert scanned_rows(q) == len(wanted)
    assert sorted(r.offset for r in q.collect()) == wanted

    cut = 1_800_000_000_000_000_000
    df = read(spark, sej_vectors / "plain", filterPushdown="true")
    later = df.where(F.col("timestamp") >= F.timestamp_micros(F.lit(cut // 1000)))
    expected = [m.offset for m in expected_plain if m.timestamp_ns != ZERO_TIMESTAMP and m.timestamp_ns >= cut]
    assert scanned_rows(later) == len(expected)
    assert read(spark, sej_vectors / "plain", filterPushdown="true").where("timestamp is null").count() == sum(
        m.timestamp_ns == ZERO_TIMESTAMP for m in expected_plain
    )

    sharded = read(spark, sej_vectors / "sharded", filterPushdown="true").where("shard = 'events.2.002'")
    assert scanned_rows(sharded) == len(expected_sharded["events.2.002"])


def test_reused_dataframes_stay_correct(spark, sej_vectors):
    """Spark 4 keeps one read plan per loaded DataFrame and hands the plan made for one scan's
    pushed filters to its other scans: journalq never lets that drop rows."""
    df = read(spark, sej_vectors / "plain", filterPushdown="true")
    assert df.where("offset < 10").count() == 10
    assert df.count() == 3000  # a later query, no pushable filter: the same plan, read whole
    assert df.where("type = 1 or offset < 3").count() == read(
        spark, sej_vectors / "plain", filterPushdown="true"
    ).where("type = 1 or offset < 3").count()
    both = df.where("offset < 5").union(df.where("offset >= 2990"))
    assert sorted(r.offset for r in both.collect()) == [0, 1, 2, 3, 4] + list(range(2990, 3000))
    # One scan with a pushed filter and one without, in one query: Spark gives both the pruned
    # plan and the unfiltered scan never reaches Python. Refused, rather than a wrong answer.
    fresh = read(spark, sej_vectors / "plain", filterPushdown="true")
    with pytest.raises(Exception, match="scans one loaded journalq DataFrame twice"):
        fresh.union(fresh.where("offset < 5")).collect()
    safe = read(spark, sej_vectors / "plain", filterPushdown="false")
    assert safe.union(safe.where("offset < 5")).count() == 3005
    # The case the guard cannot see (README.md): a join of the DataFrame with a filtered copy of
    # itself, whose scans run in different stages. With filterPushdown=false it is right.
    left = safe.select("offset").join(safe.where("offset < 10").select("offset", "type"), "offset", "left")
    assert left.count() == 3000


def test_pushdown_is_off_unless_asked_for(spark, sej_vectors):
    """By default every row reaches Spark, so a DataFrame joined with a filtered copy of itself
    (the case Spark 4 gets wrong with pushed filters) is right."""
    df = read(spark, sej_vectors / "plain")
    assert scanned_rows(df.where("offset >= 1000 and offset < 1010")) == 3000
    left = df.select("offset").join(df.where("offset < 10").select("offset", "type"), "offset", "left")
    assert left.count() == 3000


def test_works_with_pushdown_disabled(spark, sej_vectors):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = read(spark, sej_vectors / "plain", filterPushdown="true")
        q = df.where("offset >= 1000 and offset < 1010")
        assert q.count() == 10
        assert scanned_rows(q) == 3000  # Spark filtered everything itself
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


# -- topics and queue envelopes ---------------------------------------------------------------


def test_topic_with_envelopes(spark, tmp_path):
    with Broker(tmp_path / "data", sync="none") as broker:
        topic = broker.topic("orders")
        topic.send(b"plain body")
        topic.send(b"with attributes", attributes={"size": 3, "name": "x", "blob": b"\x00\x01"})
        topic.send(b"grouped", group_id="g1")
    by_path = read(spark, tmp_path / "data" / "orders").orderBy("offset").collect()
    by_topic = spark.read.format("journalq").option("topic", "orders").load(str(tmp_path / "data"))
    assert [r.offset for r in by_topic.collect()] == [0, 1, 2]
    assert [bytes(r.body) for r in by_path] == [b"plain body", b"with attributes", b"grouped"]
    assert [r.type for r in by_path] == [0, 0xE0, 0xE0]
    assert by_path[0].attributes is None
    assert by_path[1].attributes == {"size": "3", "name": "x", "blob": "AAE="}
    assert by_path[2].attributes == {}
    assert bytes(by_path[1].value).startswith(b"JQ1")  # value stays the raw sej value
    with pytest.raises(Exception, match="no topic 'nope'"):
        spark.read.format("journalq").option("topic", "nope").load(str(tmp_path / "data")).collect()


def test_missing_and_wrong_paths(spark, tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        read(spark, tmp_path / "missing").collect()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="not a journal directory"):
        read(spark, tmp_path / "empty").collect()


def test_data_loss_in_batch_reads(spark, tmp_path):
    path = tmp_path / "j"
    with Writer(path, segment_size=2048) as w:
        w.append_many([b"x" * 100] * 100)
    first_segment = sorted((path / "jnl").glob("*.jnl"))[0]
    first_segment.unlink()
    kept = read(spark, path).agg(F.min("offset")).first()[0]
    with pytest.raises(Exception, match="no longer stored"):
        read(spark, path, startingOffsets='{"": 0}').collect()
    assert read(spark, path, startingOffsets='{"": 0}', failOnDataLoss="false").count() == 100 - kept


def test_many_messages_in_arrow_batches(spark, tmp_path):
    path = tmp_path / "big"
    with Writer(path, segment_size=1 << 20) as w:
        for batch in range(10):
            w.append_many([Message(value=b"%08d" % (batch * 10_000 + i), key=b"k%d" % (i % 10), type=i % 5)
                           for i in range(10_000)])
    df = read(spark, path, minPartitions=3)
    stats = df.agg(F.count("*"), F.countDistinct("offset"), F.sum(F.col("type").cast("long"))).first()
    assert tuple(stats) == (100_000, 100_000, 200_000)
    sample = df.where("offset = 54321").first()
    assert (bytes(sample.value), bytes(sample.key), sample.type) == (b"00054321", b"k1", 1)


def test_copy_back_and_forth_keeps_everything(spark, sej_vectors, expected_plain, tmp_path):
    copy = tmp_path / "copy"
    read(spark, sej_vectors / "plain").write.format("journalq").mode("append").save(str(copy))
    assert rows_as_messages(read(spark, copy)) == expected_plain
    shutil.rmtree(copy)
