"""The column-wise decoder and the pure parts of the Spark data source (no Spark session):
``columnar.decode_columns`` against the codec and the Go vectors, predicates, option parsing,
splitting, admission control, and the writer's digest and commit log; a chunk of columns bounded
under Arrow's int32 offsets (keys, values and the shard column), the rest going in the next."""

from __future__ import annotations

import glob
import random
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from pyspark.sql.types import StructType  # noqa: E402

from journalq.errors import ZERO_TIMESTAMP, CorruptionError  # noqa: E402
from journalq.journal import Message, Writer  # noqa: E402
from journalq.journal.codec import decode, encode  # noqa: E402
from journalq.spark import options as opts  # noqa: E402
from journalq.spark import predicates, reading  # noqa: E402
from journalq.spark import columnar  # noqa: E402
from journalq.spark.columnar import decode_columns  # noqa: E402
from journalq.spark.schema import SCHEMA  # noqa: E402
from journalq.spark.source import JournalStreamReader, allocate  # noqa: E402
from journalq.spark.targets import Target, for_writing, resolve  # noqa: E402
from journalq.spark.writing import COMMIT, INTENT, CommitLog, digest, log_name  # noqa: E402
from conftest import size_past_the_end  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_tuples(cols) -> list[tuple]:
    return [
        (int(cols.offset[i]), int(cols.timestamp_ns[i]), int(cols.type[i]), cols.key(i), cols.value(i))
        for i in range(len(cols))
    ]


def same_as_codec(buf: bytes, expected_offset: int | None = None) -> int:
    messages, used = decode(buf, expected_offset=expected_offset)
    cols, used2 = decode_columns(buf, expected_offset=expected_offset)
    assert used2 == used
    assert as_tuples(cols) == [tuple(m) for m in messages]
    return len(messages)


# -- the decoder ------------------------------------------------------------------------------


def test_every_vector_segment_decodes_as_the_codec_does(sej_vectors: Path):
    total = 0
    for segment in sorted(glob.glob(str(sej_vectors / "**" / "*.jnl"), recursive=True)):
        total += same_as_codec(Path(segment).read_bytes())
    assert total == 3000 + 1000 + 50


def test_torn_vector_leaves_the_partial_message(sej_vectors: Path):
    buf = (sej_vectors / "torn" / "jnl" / "0000000000000000.jnl").read_bytes()
    cols, used = decode_columns(buf)
    assert len(cols) == 50 and used == len(buf) - 30


@st.composite
def segments(draw):
    first = draw(st.integers(min_value=0, max_value=2**62))
    uniform = draw(st.booleans())
    n = draw(st.integers(min_value=0, max_value=80))
    parts = []
    for i in range(n):
        if uniform:
            key, value = b"k", bytes([i % 251]) * 20
        else:
            key = draw(st.binary(max_size=127))
            value = draw(st.binary(max_size=300))
        ts = draw(st.one_of(st.just(ZERO_TIMESTAMP), st.integers(min_value=ZERO_TIMESTAMP, max_value=2**63 - 1)))
        parts.append(encode(first + i, ts, draw(st.integers(0, 255)), key, value))
    buf = b"".join(parts)
    cut = draw(st.integers(min_value=0, max_value=len(buf)))
    return first, buf[:cut] if draw(st.booleans()) else buf


@FAST
@given(segments())
def test_random_segments_decode_as_the_codec_does(data):
    first, buf = data
    same_as_codec(buf, first)
    same_as_codec(buf)


@FAST
@given(st.data())
def test_damage_is_found_where_the_codec_finds_it(data):
    uniform = data.draw(st.booleans())
    parts = [encode(i, 5, 1, b"" if uniform else bytes(i % 4), b"x" * (20 if uniform else i % 30)) for i in range(40)]
    buf = bytearray(b"".join(parts))
    for _ in range(data.draw(st.integers(1, 3))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    buf = bytes(buf)

    def outcome(fn):
        try:
            result, used = fn(buf, expected_offset=0)
            return ("ok", len(result), used)
        except CorruptionError as exc:  # located alike: at the offset due, with no damaged header's
            return ("corrupt", exc.reason, exc.position, exc.offset, exc.timestamp_ns)

    assert outcome(decode_columns) == outcome(decode)


def test_max_messages_and_keys_values_left_out():
    buf = b"".join(encode(i, i, 0, b"key", b"value-%d" % i) for i in range(100))
    cols, used = decode_columns(buf, max_messages=30, keys=False, values=False)
    assert len(cols) == 30 and cols.key_data is None and cols.value_data is None
    assert used == sum(len(encode(i, i, 0, b"key", b"value-%d" % i)) for i in range(30))
    assert list(cols.timestamp_ns[:3]) == [0, 1, 2]


def test_offsets_beyond_bigint_are_refused():
    buf = encode(2**63, 0, 0, b"", b"v")
    with pytest.raises(CorruptionError, match="signed 64-bit"):
        decode_columns(buf)


def test_select_rows():
    buf = b"".join(encode(i, i, i % 3, bytes([i]), b"v" * i) for i in range(20))
    cols, _ = decode_columns(buf)
    picked = cols.select(cols.type == 1)
    assert [int(o) for o in picked.offset] == [i for i in range(20) if i % 3 == 1]
    assert [picked.value(j) for j in range(len(picked))] == [b"v" * i for i in range(20) if i % 3 == 1]
    tail = cols.select(slice(15, None))
    assert tail.key(0) == bytes([15]) and tail.value(4) == b"v" * 19


def test_uniform_decoding_is_fast():
    values = [random.Random(1).randbytes(100) for _ in range(1000)] * 100
    buf = b"".join(encode(i, 1, 0, b"", v) for i, v in enumerate(values))
    started = time.perf_counter()
    cols, _ = decode_columns(buf)
    seconds = time.perf_counter() - started
    assert len(cols) == 100_000
    assert seconds < 0.5  # ~0.01 s here: whole runs, vectorized


# -- reading a journal ------------------------------------------------------------------------


def test_iter_columns_seeks_and_crosses_segments(tmp_path):
    path = tmp_path / "j"
    with Writer(path, segment_size=4096) as w:
        w.append_many([Message(value=b"m%d" % i, key=b"k" * (i % 5), type=i % 7) for i in range(2000)])
    got = []
    for cols in reading.iter_columns(str(path), 123, 1789):
        got.extend(as_tuples(cols))
    assert [t[0] for t in got] == list(range(123, 1789))
    assert got[0][4] == b"m123" and got[-1][3] == b"k" * (1788 % 5)


def test_messages_bigger_than_a_read(tmp_path):
    path = tmp_path / "j"
    sizes = [10, 10 << 20, 5, 9 << 20, 1]
    with Writer(path) as w:
        w.append_many([bytes([i]) * n for i, n in enumerate(sizes)])
    for start in range(5):
        got = [
            (int(c.offset[i]), len(c.value(i)))
            for c in reading.iter_columns(str(path), start, 5) for i in range(len(c))
        ]
        assert got == [(o, sizes[o]) for o in range(start, 5)]
        assert reading.range_bytes(str(path), start, 4) == sum(n + 26 for n in sizes[start:4])


def test_iter_columns_reports_data_loss(tmp_path):
    path = tmp_path / "j"
    with Writer(path, segment_size=1024) as w:
        w.append_many([b"x" * 50] * 200)
    bases = reading.segment_bases(str(path))
    (path / "jnl" / f"{bases[0]:016x}.jnl").unlink()
    with pytest.raises(reading.DataLossError, match="failOnDataLoss"):
        list(reading.iter_columns(str(path), 0, 200))
    rest = [int(o) for cols in reading.iter_columns(str(path), 0, 200, fail_on_data_loss=False) for o in cols.offset]
    assert rest == list(range(bases[1], 200))


def test_first_offset_at_scans_unordered_timestamps(tmp_path):
    path = tmp_path / "j"
    stamps = [100, 300, 200, 400, 50, 500]
    with Writer(path) as w:
        w.append_many([Message(timestamp_ns=t, value=b"v") for t in stamps])
    assert reading.first_offset_at(str(path), 250, 0, 6) == 1
    assert reading.first_offset_at(str(path), 450, 0, 6) == 5
    assert reading.first_offset_at(str(path), 600, 0, 6) == 6
    assert reading.first_offset_at(str(path), 250, 2, 6) == 3


def test_split_by_size_and_min_partitions(tmp_path):
    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x" * 100] * 10_000)
    r = reading.ShardRange("", str(path), 0, 10_000)
    assert len(reading.split([r], min_partitions=None, max_partition_bytes=1 << 30)) == 1
    pieces = reading.split([r], min_partitions=None, max_partition_bytes=126 * 1000)
    assert len(pieces) == 10 and pieces[0].start == 0 and pieces[-1].end == 10_000
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    assert len(reading.split([r], min_partitions=7, max_partition_bytes=1 << 30)) == 7



def test_a_range_is_split_the_same_way_whatever_comes_after_it(tmp_path):
    # A streaming sink's exactly once needs a replayed batch to give each partition the same
    # rows: the pieces of a range may not depend on messages outside it (appended, or deleted).
    path = tmp_path / "j"
    with Writer(path, segment_size=64 << 10) as w:
        w.append_many([b"x" * 100] * 1000)
    r = reading.ShardRange("", str(path), 600, 1000)  # segments of 521 messages
    before = reading.split([r], min_partitions=None, max_partition_bytes=20_000)
    assert len(before) == 3  # 400 messages of 126 bytes
    assert reading.range_bytes(str(path), 0, 1000) == 1000 * 126
    assert reading.range_bytes(str(path), 600, 1000) == 400 * 126
    with Writer(path, segment_size=64 << 10) as w:
        w.append_many([b"y" * 3000] * 100)
    assert reading.split([r], min_partitions=None, max_partition_bytes=20_000) == before
    (path / "jnl" / "0000000000000000.jnl").unlink()  # retention
    assert reading.split([r], min_partitions=None, max_partition_bytes=20_000) == before


# -- predicates -------------------------------------------------------------------------------


def test_offset_bounds_and_shards():
    conds = [("offset", ">=", 10), ("offset", "<", 20), ("shard", "in", ("a", "b")), ("not", ("shard", "=", "b"))]
    assert predicates.offset_bounds(conds) == (10, 20)
    assert predicates.offset_bounds([("offset", "in", (5, 9, 7))]) == (5, 10)
    assert predicates.offset_bounds([("offset", "=", 3), ("offset", ">", 1)]) == (3, 4)
    assert [s for s in "abc" if predicates.shard_allowed(conds, s)] == ["a"]
    assert not predicates.needs_rows([("offset", ">", 1), ("shard", "=", "a")])
    assert predicates.needs_rows([("offset", "in", (1, 2))])


def test_row_masks_keep_sql_null_logic():
    offset = np.arange(6, dtype=np.int64)
    ts = np.array([ZERO_TIMESTAMP, 1_000, 2_000, 3_000, ZERO_TIMESTAMP, 5_000], np.int64)
    types = np.array([0, 1, 2, 1, 0, 1], np.uint8)

    def rows(*conds):
        mask = predicates.row_mask(list(conds), offset, ts, types)
        return list(np.flatnonzero(mask)) if mask is not None else list(range(6))

    assert rows(("type", "=", 1)) == [1, 3, 5]
    assert rows(("not", ("type", "in", (0, 1)))) == [2]
    assert rows(("timestamp", ">", 1)) == [2, 3, 5]  # microseconds: 1 us = 1000 ns
    assert rows(("not", ("timestamp", ">", 1))) == [1]  # NULL stays out, negated or not
    assert rows(("timestamp", "isnull", None)) == [0, 4]
    assert rows(("timestamp_ns", "<=", 2_000), ("offset", ">", 0)) == [1, 2, 4]  # the zero time is -2**63
    assert rows(("offset", "in", (1, 4, 99))) == [1, 4]


def test_translate_spark_filters():
    import datetime as dt

    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull, LessThan, Not, StringStartsWith

    moment = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert predicates.translate(EqualTo(("type",), 3)) == ("type", "=", 3)
    assert predicates.translate(GreaterThan(("timestamp",), moment)) == ("timestamp", ">", 1_704_067_200_000_000)
    assert predicates.translate(In(("shard",), ["a", "b"])) == ("shard", "in", ("a", "b"))
    assert predicates.translate(Not(LessThan(("offset",), 5))) == ("not", ("offset", "<", 5))
    assert predicates.translate(IsNull(("timestamp",))) == ("timestamp", "isnull", None)
    assert predicates.translate(EqualTo(("value",), b"x")) is None
    assert predicates.translate(StringStartsWith(("shard",), "ev")) is None
    assert predicates.translate(EqualTo(("type",), 1.5)) is None
    assert predicates.translate(In(("type",), [1, None])) is None


def test_negated_null_safe_equality_keeps_null_timestamps():
    import datetime as dt

    from pyspark.sql.datasource import EqualNullSafe, Not

    # NOT (timestamp <=> x) is true where timestamp is NULL (the zero time): those rows stay.
    moment = dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=dt.timezone.utc)
    condition = predicates.translate(Not(EqualNullSafe(("timestamp",), moment)))
    ts = np.array([ZERO_TIMESTAMP, 1_000, 2_000], np.int64)
    mask = None if condition is None else predicates.row_mask([condition], np.arange(3), ts, np.zeros(3, np.uint8))
    assert mask is None or list(mask) == [True, False, True]
    assert predicates.translate(Not(EqualNullSafe(("type",), 1))) == ("not", ("type", "=", 1))


# -- options ----------------------------------------------------------------------------------


def test_option_parsing():
    o = {"startingOffsets": '{"events.2.000": 10, "": -2}', "MaxTriggerDelay": "2m", "size": "32m",
         "when": "2024-01-01T00:00:01Z", "ms": "1000", "flag": "false"}
    assert opts.offsets(o, "startingoffsets", "latest", ("earliest", "latest")) == {"events.2.000": 10, "": -2}
    assert opts.offsets({}, "startingOffsets", "latest", ("earliest", "latest")) == "latest"
    assert opts.duration(o, "maxTriggerDelay", 1) == 120
    assert opts.size(o, "size", 1) == 32 << 20
    assert opts.timestamp_ns(o, "when") == 1_704_067_201_000_000_000
    assert opts.timestamp_ns(o, "ms") == 1_000_000_000
    assert opts.boolean(o, "flag", True) is False
    for bad in ('{"a": "x"}', "[1]", "soon"):
        with pytest.raises(opts.OptionError):
            opts.offsets({"startingOffsets": bad}, "startingOffsets", "latest", ("earliest", "latest"))
    with pytest.raises(opts.OptionError, match="earliest"):
        opts.offsets({"endingOffsets": '{"": -2}'}, "endingOffsets", "latest", ("latest",))
    with pytest.raises(opts.OptionError):
        opts.integer({"minPartitions": "0"}, "minPartitions", None, minimum=1)


def test_unknown_options_are_refused(tmp_path):
    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalDataSource

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 3)

    def source(**options):
        return JournalDataSource({"path": str(path), **options})

    # A misspelt name would be ignored: this stream would start at the latest offset, not the earliest.
    with pytest.raises(opts.OptionError, match="startingOffset.*did you mean startingOffsets"):
        source(startingOffset="earliest").streamReader(SCHEMA)
    with pytest.raises(opts.OptionError, match="maxOffsetsPerTrigger"):
        source(maxOffsetsPerTrigger="5").reader(SCHEMA)  # streaming only
    with pytest.raises(opts.OptionError, match="writeId"):
        source(writeId="w1", checkpointLocation="ck").streamWriter(SCHEMA, False)  # batch writes only
    with pytest.raises(opts.OptionError, match="segmentsize2"):
        source(segmentsize2="1m").writer(SCHEMA, False)
    # Names are case-insensitive (Spark lowers them), and Spark's own options pass.
    source(startingoffsets="earliest", FILTERPUSHDOWN="true").reader(SCHEMA)
    source(maxoffsetspertrigger="5", startingOffsets="earliest").streamReader(SCHEMA)
    source(writeid="w1", sync="none").writer(SCHEMA, False)
    source(checkpointlocation=str(tmp_path / "ck"), queryname="q").streamWriter(SCHEMA, False)


def test_shard_prefix_without_shard_bit_is_refused(tmp_path):
    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalDataSource

    # It would be ignored: the rows would go to a plain journal (or an existing root's prefix).
    source = JournalDataSource({"path": str(tmp_path / "new"), "shardPrefix": "ev"})
    with pytest.raises(opts.OptionError, match="shardPrefix.*shardBit"):
        source.writer(SCHEMA, False)
    assert not (tmp_path / "new").exists()


def test_a_plan_reused_after_its_guard_markers_were_swept_does_not_prune(tmp_path, monkeypatch):
    import os
    import tempfile

    import pyspark

    from journalq.spark import source

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    execution = ["1"]

    class Task:
        def getLocalProperty(self, name):  # noqa: N802 - Spark's name
            return execution[0] if name == "spark.sql.execution.id" else None

        def stageId(self):  # noqa: N802
            return 0

        def partitionId(self):  # noqa: N802
            return 0

    monkeypatch.setattr(pyspark.TaskContext, "get", lambda: Task())
    token = source._plan_token()
    assert source._may_prune(token, 0)  # the first query that runs the plan prunes
    execution[0] = "2"
    assert not source._may_prune(token, 0)  # a later query reusing it reads everything
    # A day later, the markers are swept (by the next push of any DataFrame)...
    clock = time.time() + 86400 + 60
    monkeypatch.setattr(time, "time", lambda: clock)
    for name in os.listdir(source._guard_dir()):
        os.utime(os.path.join(source._guard_dir(), name), (clock - 86400 - 1, clock - 86400 - 1))
    source._register_push("another-dataframe", [("type", "=", 1)])
    # ...and a query reusing the old plan must still read everything, not prune by its filters.
    execution[0] = "3"
    assert not source._may_prune(token, 0)


# -- targets ----------------------------------------------------------------------------------


def test_targets(tmp_path, sej_vectors):
    assert resolve(str(sej_vectors / "plain")).kind == "journal"
    sharded = resolve(str(sej_vectors / "sharded"))
    assert sharded.kind == "sharded" and [s.name for s in sharded.shards] == [f"events.2.00{i}" for i in range(4)]
    assert (sharded.prefix, sharded.bit) == ("events", 2)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(Exception, match="not a journal"):
        resolve(str(tmp_path / "other"))
    with pytest.raises(Exception, match="refusing"):
        for_writing(str(tmp_path / "other"))
    new = for_writing(str(tmp_path / "new"), shard_bit=3, shard_prefix="p")
    assert new.sharded and new.shard_path(5).name == "p.3.005"
    topic = for_writing(str(tmp_path / "data"), "events")
    assert topic.kind == "topic" and (tmp_path / "data" / "events" / "queue.json").is_file()


# -- admission control (the stream reader's offsets, without Spark) ---------------------------


def test_allocate_shares_in_proportion():
    assert allocate({"a": 10, "b": 30}, 100) == {"a": 10, "b": 30}
    shares = allocate({"a": 10, "b": 30}, 8)
    assert shares == {"a": 2, "b": 6}
    assert sum(allocate({"a": 1, "b": 1, "c": 1}, 2).values()) == 2
    assert allocate({"a": 5, "b": 0}, 1) == {"a": 1, "b": 0}


def test_stream_offsets_limits_and_trigger_delay(tmp_path, monkeypatch):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    from journalq.spark.schema import SCHEMA

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 10)
    reader = JournalStreamReader({"path": str(path), "maxOffsetsPerTrigger": "8",
                                  "minOffsetsPerTrigger": "6", "maxTriggerDelay": "60s"}, SCHEMA)
    assert reader.initialOffset() == {"": 10}  # streams start at the latest offset by default
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    start = {"": 5}
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    reader._last_trigger = clock[0]
    # fewer than minOffsetsPerTrigger: wait, until maxTriggerDelay passes
    assert reader.latestOffset(start, ReadMaxRows(4)) == start
    clock[0] += 61
    assert reader.latestOffset(start, ReadMaxRows(4)) == {"": 9}
    assert reader.latestOffset({"": 9}, ReadMaxRows(4)) == {"": 9}  # the clock restarted
    # ReadAllAvailable (Trigger.Once, or Spark's own choice) ignores the options' limits
    assert reader.latestOffset(start, ReadAllAvailable()) == {"": 10}
    assert reader.latestOffset({"": 0}, ReadMinRows(5)) == {"": 8}  # the option's maximum
    # Trigger.AvailableNow: a fixed target, no waiting for minOffsetsPerTrigger
    reader.prepareForTriggerAvailableNow()
    with Writer(path) as w:
        w.append_many([b"y"] * 5)
    assert reader.latestOffset({"": 8}, ReadMaxRows(4)) == {"": 10}
    assert reader.latestOffset({"": 10}, ReadMaxRows(4)) == {"": 10}


def test_stream_starting_offsets_past_the_end_are_refused(tmp_path):
    from journalq.spark.schema import SCHEMA

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 10)
    # Taken as it was, offset 15 would skip messages 10 to 14 once they are appended.
    reader = JournalStreamReader({"path": str(path), "startingOffsets": '{"": 15}'}, SCHEMA)
    with pytest.raises(opts.OptionError, match="startingOffsets: offset 15 of shard '' is past its end"):
        reader.initialOffset()
    reader = JournalStreamReader({"path": str(path), "startingOffsets": '{"": 10}'}, SCHEMA)
    assert reader.initialOffset() == {"": 10}


def test_a_batch_ending_before_it_starts_is_refused(tmp_path):
    """An endingOffsets before the startingOffsets is a mistake to name, not an empty read."""
    from journalq.spark.source import plan_batch

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 10)
    options = {"path": str(path), "startingOffsets": '{"": 6}', "endingOffsets": '{"": 4}'}
    with pytest.raises(
        opts.OptionError, match=r"endingOffsets: offset 4 of shard '' is before where the read starts \(6\)"
    ):
        plan_batch(options)
    options["endingOffsets"] = '{"": 6}'  # an empty range given as such is fine
    assert [(r.start, r.end) for r in plan_batch(options)] == [(6, 6)]


def test_stream_notices_a_journal_made_again(tmp_path):
    import shutil

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from journalq.spark.reading import DataLossError
    from journalq.spark.schema import SCHEMA

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"old"] * 10)
    reader = JournalStreamReader({"path": str(path), "startingOffsets": "earliest"}, SCHEMA)
    assert reader.latestOffset({"": 0}, ReadAllAvailable()) == {"": 10}
    shutil.rmtree(path)  # deleted and made again: its 3 messages are new ones
    with Writer(path) as w:
        w.append_many([b"new"] * 3)
    # Waiting until the journal passes offset 10 would skip its first 10 messages, silently.
    end = reader.latestOffset({"": 10}, ReadAllAvailable())
    assert end == {"": 3}
    with pytest.raises(DataLossError, match="went back from offset 10 to 3"):
        reader.partitions({"": 10}, end)
    lenient = JournalStreamReader({"path": str(path), "failOnDataLoss": "false"}, SCHEMA)
    assert [(p.range.start, p.range.end) for p in lenient.partitions({"": 10}, end)] == [(0, 3)]


def test_stream_refuses_starting_offsets_and_timestamp_together(tmp_path):
    from journalq.spark.schema import SCHEMA

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 10)
    # As batch reads do: one or the other (the timestamp used to win, silently).
    reader = JournalStreamReader({"path": str(path), "startingOffsets": "latest", "startingTimestamp": "0"}, SCHEMA)
    with pytest.raises(opts.OptionError, match="startingOffsets or startingTimestamp, not both"):
        reader.initialOffset()


# -- the writer's bookkeeping -----------------------------------------------------------------


def test_digest_ignores_order_and_timestamps():
    a = [Message(1, 5, 0, b"k", b"v1"), Message(2, 6, 1, b"", b"v2")]
    b = [Message(9, 0, 1, b"", b"v2"), Message(8, None, 0, b"k", b"v1")]
    assert digest(a) == digest(b)
    assert digest(a) != digest([Message(1, 5, 0, b"", b"kv1"), a[1]])


def test_commit_log_reads_back_from_the_end(tmp_path):
    target = Target(tmp_path, "journal")
    log = CommitLog(target, "query-1")
    for batch in range(300):
        log.append(INTENT, {"k": "intent", "b": batch, "p": 0})
        log.append(COMMIT, {"k": "commit", "b": batch})
    assert log.committed(299) and log.committed(250)
    assert not log.committed(300)
    assert [r["b"] for r in log.records(298)] == [298, 298, 299, 299]
    assert log_name("a/b") != "a/b" and log_name("3c49c2f2-e993") == "3c49c2f2-e993"


def test_an_older_batchs_intent_written_late_hides_no_newer_record(tmp_path):
    """A task attempt of batch 1 still running after batch 1 committed (a zombie) writes its
    intent after batch 2's records. Reading back stopped at the first older record, so batch 2's
    commit was not seen: a replay of batch 2 would have appended it again."""
    log = CommitLog(Target(tmp_path, "journal"), "query-1")
    for batch in (0, 1):
        log.append(INTENT, {"k": "intent", "b": batch, "p": 0})
        log.append(COMMIT, {"k": "commit", "b": batch})
    log.append(INTENT, {"k": "intent", "b": 2, "p": 0})
    log.append(INTENT, {"k": "intent", "b": 1, "p": 1})  # the zombie's
    log.append(COMMIT, {"k": "commit", "b": 2})
    assert log.committed(2)
    assert [(r["k"], r["b"]) for r in log.records(2)] == [("intent", 2), ("commit", 2)]


class _Killed(BaseException):
    """Stands for the death of a task's process in the middle of its work."""


def _replays(tmp_path, monkeypatch, dying_append, before_replay=None) -> list[bytes]:
    """Run task (batch 0, partition 0) with ``dying_append`` in place of the real append, then
    ``before_replay(target, log)``, then the task again (its rows in another order, as a replay
    may give them) and once more; returns the values the journal holds."""
    from journalq.journal import Scanner
    from journalq.spark import writing

    target = for_writing(str(tmp_path / "j"))
    log = CommitLog(target, "query")
    rows = [Message(0, None, 0, b"", b"row %d" % i) for i in range(10)]

    def task(messages, partition=0):
        appender = writing.Appender(target, sync="none", segment_size=1 << 20)
        try:
            return writing.append_exactly_once(appender, log, 0, partition, messages, [b""] * len(messages))
        finally:
            appender.close()

    real = writing._append
    monkeypatch.setattr(writing, "_append", lambda writer, messages: dying_append(real, writer, messages))
    with pytest.raises(_Killed):
        task(rows)
    monkeypatch.setattr(writing, "_append", real)
    if before_replay is not None:
        before_replay(task, rows)
    task(rows[::-1])
    task(rows)
    with Scanner(target.path, 0) as scanner:
        return sorted(m.value for m in scanner.read_batch())


def test_a_task_killed_part_way_through_its_append_completes_it_once(tmp_path, monkeypatch):
    def appends_four_then_dies(real, writer, messages):
        real(writer, messages[:4])  # what reached the file before the process was killed
        raise _Killed

    assert _replays(tmp_path, monkeypatch, appends_four_then_dies) == sorted(b"row %d" % i for i in range(10))


def test_a_task_replayed_in_the_same_order_after_a_kill_keeps_the_order_of_rows_alike(tmp_path, monkeypatch):
    """Rows alike (a, b, a, c): killed after appending the first, the replay in the same order
    appends b, a, c, and the journal holds the rows in their order. (Before, the rest kept the
    first of the rows alike, not the last: a, a, b, c.)"""
    from journalq.journal import Scanner
    from journalq.spark import writing

    target = for_writing(str(tmp_path / "j"))
    log = CommitLog(target, "query")
    rows = [Message(0, None, 0, b"", value) for value in (b"a", b"b", b"a", b"c")]

    def task() -> None:
        appender = writing.Appender(target, sync="none", segment_size=1 << 20)
        try:
            writing.append_exactly_once(appender, log, 0, 0, rows, [b""] * len(rows))
        finally:
            appender.close()

    real = writing._append

    def appends_one_then_dies(writer, messages):
        real(writer, messages[:1])
        raise _Killed

    monkeypatch.setattr(writing, "_append", appends_one_then_dies)
    with pytest.raises(_Killed):
        task()
    monkeypatch.setattr(writing, "_append", real)
    task()
    task()
    with Scanner(target.path, 0) as scanner:
        assert [m.value for m in scanner.read_batch()] == [b"a", b"b", b"a", b"c"]


def test_a_task_killed_before_its_append_is_not_mistaken_for_another_with_the_same_rows(tmp_path, monkeypatch):
    def dies(real, writer, messages):
        raise _Killed

    def other_partition_same_rows(task, rows):
        task(rows, partition=1)  # appends where partition 0 meant to

    values = _replays(tmp_path, monkeypatch, dies, other_partition_same_rows)
    assert values == sorted(b"row %d" % i for i in range(10) for _ in range(2))


@pytest.mark.parametrize("lure", ["damaged", "unfinished"])
def test_a_read_takes_no_index_entry_that_the_segment_does_not_confirm(tmp_path, lure):
    """An index entry that points into a value holding its offset's 8 bytes is not where a read
    starts: the segment, not the index, says where each message is. (Before, a read from the
    lie's offset on began inside that value.)"""
    from test_journal_index import lured_journal

    values = lured_journal(tmp_path, lure, sealed=True)
    for start in range(len(values)):
        got = [c.value(i) for c in reading.iter_columns(str(tmp_path), start, len(values)) for i in range(len(c))]
        assert got == values[start:]


def test_a_size_that_reaches_past_the_end_before_indexed_messages_is_damage_not_a_cut(tmp_path):
    """The last segment ends in an incomplete message, yet its index shows whole messages after
    it: the read says damage there (as the scanner does), not that the journal was cut short."""
    from journalq.errors import JournalError
    from journalq.journal import end_offset

    segment = size_past_the_end(tmp_path, 500)
    each = segment.stat().st_size // 2000  # every message takes as many bytes
    assert end_offset(tmp_path) == 2000  # as a query plans it
    with pytest.raises(CorruptionError, match="incomplete message .* yet the whole message") as caught:
        for _ in reading.iter_columns(str(tmp_path), 0, 2000):
            pass
    assert (caught.value.file, caught.value.position, caught.value.offset) == (segment, each * 500, 500)
    # Where the index names nothing after it, it is an append under way: the journal ends there.
    (tmp_path / "jnl" / segment.name.replace(".jnl", ".idx")).unlink()
    with pytest.raises(JournalError, match="the journal ends at offset 500"):
        for _ in reading.iter_columns(str(tmp_path), 0, 2000):
            pass


def test_register_without_a_session_is_a_journalq_error(monkeypatch):
    from pyspark.sql import SparkSession

    import journalq.spark
    from journalq.errors import Error

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    with pytest.raises(Error, match="no active Spark session"):
        journalq.spark.register()


# -- a chunk bounded under Arrow's int32 offsets (MAX_BINARY made small here, not the data huge) -----


LIMIT = 1000


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(columnar, "MAX_BINARY", LIMIT, raising=False)


def values_of(cols) -> list[bytes]:
    return [cols.value(i) for i in range(len(cols))]


def test_a_uniform_run_stops_at_the_limit_and_the_next_call_goes_on(small_limit):
    values = [b"%099d" % i for i in range(50)]  # 100 bytes each: 10 a call
    buf = b"".join(encode(i, 1, 0, b"k", v) for i, v in enumerate(values))
    got, pos, calls = [], 0, 0
    while pos < len(buf):
        cols, pos = decode_columns(buf, pos, len(buf), len(got))
        assert len(cols) == 10 and int(cols.value_offsets[-1]) <= LIMIT
        got += values_of(cols)
        calls += 1
    assert got == values and calls == 5


def test_messages_of_many_sizes_stop_at_the_limit_keys_too(small_limit):
    values = [b"v" * (1 + i * 37 % 300) for i in range(60)]
    keys = [b"k" * (i % 100) for i in range(60)]
    buf = b"".join(encode(i, 1, 0, k, v) for i, (k, v) in enumerate(zip(keys, values)))
    for wanted in ({"keys": True, "values": True}, {"keys": True, "values": False}):
        got_keys, pos = [], 0
        while pos < len(buf):
            cols, pos = decode_columns(buf, pos, len(buf), len(got_keys), **wanted)
            assert int(cols.key_offsets[-1]) <= LIMIT
            if wanted["values"]:
                assert int(cols.value_offsets[-1]) <= LIMIT
                assert values_of(cols) == values[len(got_keys) : len(got_keys) + len(cols)]
            got_keys += [cols.key(i) for i in range(len(cols))]
        assert got_keys == keys


def test_a_message_larger_than_the_limit_is_decoded_alone(small_limit):
    values = [b"a" * 10, b"b" * 3000, b"c" * 10]
    buf = b"".join(encode(i, 1, 0, b"", v) for i, v in enumerate(values))
    first, pos = decode_columns(buf, 0, len(buf), 0)
    second, pos = decode_columns(buf, pos, len(buf), 1)
    third, pos = decode_columns(buf, pos, len(buf), 2)
    assert [values_of(c) for c in (first, second, third)] == [[values[0]], [values[1]], [values[2]]]
    assert pos == len(buf)


def test_a_journal_with_more_values_than_a_chunk_holds_is_read_whole_not_called_corrupt(tmp_path, small_limit):
    values = [b"%0*d" % (50 + i % 200, i) for i in range(3000)]  # 450 KB, in one 4 MiB read
    with Writer(tmp_path / "j") as writer:
        writer.append_many(values)
    batches = list(reading.iter_columns(str(tmp_path / "j"), 0, len(values)))
    assert all(int(c.value_offsets[-1]) <= LIMIT for c in batches)
    assert [v for c in batches for v in values_of(c)] == values
    # From inside a segment's chunk: the messages before are passed over across several stops.
    inside = list(reading.iter_columns(str(tmp_path / "j"), 1234, 2900))
    assert [int(o) for c in inside for o in c.offset] == list(range(1234, 2900))
    assert [v for c in inside for v in values_of(c)] == values[1234:2900]


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
