"""The read side of the ``journalq`` data source without a Spark session (the classes Spark drives
are called directly): its options, the plan of a read over a journal's segments (a gap, an overlap,
a journal cut short since, a named pipe with a segment's name), streams' batches after retention
and under Trigger.AvailableNow, and predicates on literals beyond int64."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.errors import CorruptionError, Error, JournalError  # noqa: E402
from journalq.journal import Message, Writer  # noqa: E402
from journalq.journal.segment import segment_bases, segment_name  # noqa: E402
from journalq.spark import options as opts  # noqa: E402
from journalq.spark import reading  # noqa: E402
from journalq.spark.source import plan_batch  # noqa: E402

from conftest import fifo_at, returned_at_once  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")

SECOND = 1_000_000_000


def offsets_read(path: Path, start: int, end: int) -> list[int]:
    return [int(o) for cols in reading.iter_columns(str(path), start, end) for o in cols.offset]


# -- timestamps given as ISO 8601 ---------------------------------------------------------------


def test_iso_timestamps_keep_their_nanoseconds(tmp_path):
    """A journal's timestamps are nanoseconds: an ISO time with 7 to 9 fraction digits must not be
    cut to microseconds (Python's fromisoformat drops the rest), or a read starting at .000000500
    takes in the message stored at .000000100."""
    base = 1_704_067_200 * SECOND  # 2024-01-01T00:00:00Z
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.000000500Z"}, "t") == base + 500
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.123456789+01:00"}, "t") == base - 3600 * SECOND + 123_456_789
    assert opts.timestamp_ns({"t": "2024-01-01 00:00:00.1234567"}, "t") == base + 123_456_700
    assert opts.timestamp_ns({"t": "20240101T000000.000000500Z"}, "t") == base + 500  # ISO's basic format
    assert opts.timestamp_ns({"t": "1969-12-31T23:59:59.999999999Z"}, "t") == -1
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.5Z"}, "t") == base + SECOND // 2
    with pytest.raises(opts.OptionError, match="option t must be"):
        opts.timestamp_ns({"t": "2024-01-01T00:00:00.1234567890Z"}, "t")  # past nanoseconds

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([Message(value=b"v%d" % i, timestamp_ns=base + t) for i, t in enumerate((100, 500, 900))])
    ranges = plan_batch({"path": str(path), "startingTimestamp": "2024-01-01T00:00:00.000000500Z",
                         "endingTimestamp": "2024-01-01T00:00:00.000000900Z"})
    assert [(r.start, r.end) for r in ranges] == [(1, 2)]


# -- segments missing in the middle of a journal -------------------------------------------------


def _journal_with_segments(path: Path) -> list[int]:
    with Writer(path, segment_size=200) as w:
        w.append_many([b"x%03d" % i for i in range(40)])
    bases = segment_bases(path)
    assert len(bases) >= 4
    return bases


def test_a_segment_missing_in_the_middle_is_named_as_a_gap(tmp_path):
    """A segment gone from the middle of a journal is a gap in its offsets (as the scanner and
    ``journalq check`` say), not 'the journal ends at offset N ... cut short'."""
    path = tmp_path / "j"
    bases = _journal_with_segments(path)
    os.unlink(path / "jnl" / segment_name(bases[2]))
    missing = f"offsets {bases[2]}-{bases[3] - 1} are missing"
    with pytest.raises(CorruptionError, match=missing) as caught:
        offsets_read(path, 0, 40)
    assert caught.value.offset == bases[2]
    assert caught.value.file == path / "jnl" / segment_name(bases[1])
    # Starting inside the missing segment: the same gap, not "ends at offset bases[2] + 1".
    with pytest.raises(CorruptionError, match=missing):
        offsets_read(path, bases[2] + 1, 40)
    # failOnDataLoss=false is about retention (the oldest segments), not holes in the middle.
    with pytest.raises(CorruptionError, match=missing):
        list(reading.iter_columns(str(path), 0, 40, fail_on_data_loss=False))


def test_segments_that_overlap_are_named_as_such(tmp_path):
    """A segment that starts before the previous one ends stores offsets twice."""
    path = tmp_path / "j"
    bases = _journal_with_segments(path)
    later = path / "jnl" / segment_name(bases[2])
    os.rename(later, path / "jnl" / segment_name(bases[2] - 2))
    with pytest.raises(CorruptionError, match=f"offsets {bases[2] - 2}-{bases[2] - 1} are stored twice"):
        offsets_read(path, 0, 40)


def test_a_journal_cut_short_since_planning_still_says_so(tmp_path):
    path = tmp_path / "j"
    bases = _journal_with_segments(path)
    os.unlink(path / "jnl" / segment_name(bases[-1]))
    with pytest.raises(JournalError, match=f"the journal ends at offset {bases[-1]}, before offset 40"):
        offsets_read(path, 0, 40)


# -- paths ----------------------------------------------------------------------------------------


def test_several_paths_are_refused_naming_them(tmp_path):
    """``load([a, b])`` hands the data source ``paths`` (a JSON list) and no ``path``: it was told
    'the journalq data source needs a path', as though it had been given none."""
    import json

    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalDataSource

    a, b = tmp_path / "a", tmp_path / "b"
    for path in (a, b):
        with Writer(path) as w:
            w.append_many([b"x"] * 3)
    both = JournalDataSource({"paths": json.dumps([str(a), str(b)])})
    with pytest.raises(opts.OptionError, match=r"one path per load\(\), not 2") as caught:
        both.reader(SCHEMA).partitions()
    assert str(a) in str(caught.value) and str(b) in str(caught.value)
    with pytest.raises(opts.OptionError, match=r"one path per load\(\), not 2"):
        both.streamReader(SCHEMA).initialOffset()
    # A list of one is that path.
    one = JournalDataSource({"paths": json.dumps([str(a)])}).reader(SCHEMA)
    assert [(p.range.start, p.range.end) for p in one.partitions()] == [(0, 3)]


# -- streaming past what retention deleted ---------------------------------------------------------


def test_a_lenient_stream_counts_its_batches_from_what_retention_left(tmp_path):
    """With failOnDataLoss=false the messages retention deleted are skipped; a batch limited by
    maxOffsetsPerTrigger must be counted from the first message left, or the query runs one empty
    micro-batch per maxOffsetsPerTrigger deleted messages (thousands of them after a big cut)
    before it reads anything again."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalStreamReader

    path = tmp_path / "j"
    bases = _journal_with_segments(path)
    for base in bases[:3]:  # retention
        os.unlink(path / "jnl" / segment_name(base))
    first = bases[3]
    lenient = JournalStreamReader({"path": str(path), "failOnDataLoss": "false", "maxOffsetsPerTrigger": "2"}, SCHEMA)
    end = lenient.latestOffset({"": 0}, ReadMaxRows(2))
    assert end == {"": first + 2}
    assert [(p.range.start, p.range.end) for p in lenient.partitions({"": 0}, end)] == [(first, first + 2)]
    # Nothing new: no batch, whatever was deleted before the checkpoint's offset.
    assert lenient.latestOffset({"": 40}, ReadMaxRows(2)) == {"": 40}
    # Failing on data loss: the batch is planned as it was, and partitions() names the loss.
    strict = JournalStreamReader({"path": str(path), "maxOffsetsPerTrigger": "2"}, SCHEMA)
    end = strict.latestOffset({"": 0}, ReadMaxRows(2))
    assert end == {"": 2}
    with pytest.raises(reading.DataLossError, match="offsets 0 to 2 of shard '' were deleted"):
        strict.partitions({"": 0}, end)


# -- pushed filters with literals beyond int64 ------------------------------------------------------


def test_literals_beyond_int64_are_compared_exactly():
    """A literal past int64's ends was clipped to them, so ``timestamp_ns = -2**64`` matched the
    zero time (-2**63) and ``timestamp_ns < 2**64`` dropped a message stored at int64's largest:
    its NOT dropped rows that Spark keeps."""
    import numpy as np

    from journalq.errors import ZERO_TIMESTAMP
    from journalq.spark import predicates

    ts = np.array([ZERO_TIMESTAMP, 0, 2**63 - 1], np.int64)
    offset, type_ = np.arange(3, dtype=np.int64), np.zeros(3, np.uint8)

    def rows(*conditions):
        mask = predicates.row_mask(list(conditions), offset, ts, type_)
        return [int(o) for o in offset[mask]]

    assert rows(("not", ("timestamp_ns", "=", -(2**64)))) == [0, 1, 2]
    assert rows(("timestamp_ns", "<", 2**64)) == [0, 1, 2]
    assert rows(("timestamp_ns", ">", -(2**64))) == [0, 1, 2]
    assert rows(("timestamp_ns", ">=", 2**63)) == []
    assert rows(("timestamp_ns", "in", (2**64, 0))) == [1]
    assert rows(("not", ("timestamp_ns", "in", (2**64, -(2**64))))) == [0, 1, 2]
    assert rows(("timestamp", "<", 2**64)) == [1, 2]  # the zero time is NULL


# -- offsets options naming shards that do not exist -------------------------------------------------


def test_offsets_for_unknown_shards_are_option_errors(tmp_path):
    """A shard name in startingOffsets/endingOffsets that the target does not have is a bad
    option (OptionError, as every other bad option), not a problem of the journal's files."""
    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalStreamReader

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([b"x"] * 3)
    for name in ("startingOffsets", "endingOffsets"):
        with pytest.raises(
            opts.OptionError, match=f"option {name} names shard\\(s\\) 'events.2.000'; the shards are ''"
        ):
            plan_batch({"path": str(path), name: '{"events.2.000": 1}'})
    with pytest.raises(opts.OptionError, match="option startingOffsets names shard"):
        JournalStreamReader({"path": str(path), "startingOffsets": '{"x": 1}'}, SCHEMA).initialOffset()


# -- maxOffsetsPerTrigger shared among shards -----------------------------------------------------


def test_a_path_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    from journalq.spark.targets import resolve

    file = tmp_path / "events.jnl"
    file.write_bytes(b"")
    with pytest.raises(Error, match="is a file, not a directory"):
        resolve(str(file))
    with pytest.raises(Error, match="does not exist"):
        resolve(str(tmp_path / "missing"))


# -- a named pipe with a segment's name; a shard made since prepareForTriggerAvailableNow ---------


def test_planning_and_reading_refuse_a_fifo_with_a_segments_name(tmp_path):
    """The planner (a range's bytes, its cuts) and the executors' reads opened segments with a
    bare open(), which waits for ever on a named pipe: the query hung instead of failing."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 120] * 3)  # one message a segment: 0, 1, 2
    fifo = tmp_path / "jnl" / f"{1:016x}.jnl"
    (tmp_path / "jnl" / f"{1:016x}.idx").unlink(missing_ok=True)
    with fifo_at(fifo):
        calls = [
            lambda: reading.range_bytes(str(tmp_path), 0, 3),
            lambda: reading.split([reading.ShardRange("", str(tmp_path), 0, 3)], min_partitions=None,
                                  max_partition_bytes=64),
            lambda: list(reading.iter_columns(str(tmp_path), 1, 3)),
        ]
        for call in calls:
            error = returned_at_once(call)
            assert isinstance(error, JournalError) and error.file == fifo, error
            assert "a special file has a segment's name" in str(error)


def test_available_now_reads_nothing_of_a_shard_made_since_and_does_not_go_back(tmp_path):
    """A shard made after prepareForTriggerAvailableNow was capped at offset 0: one that starts
    past 0 (a hub's copy, a shard whose old segments retention deleted) was planned at its first
    offset, then at 0, and the query failed with "shard ... went back" (DataLossError)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from journalq.spark.schema import SCHEMA
    from journalq.spark.source import JournalStreamReader

    root = tmp_path / "root"
    with Writer(root / "e.1.000") as writer:
        writer.append_many([b"a", b"b"])
    reader = JournalStreamReader({"path": str(root)}, SCHEMA)
    start = reader.initialOffset()
    assert start == {"e.1.000": 2}
    reader.prepareForTriggerAvailableNow()
    with Writer(root / "e.1.000") as writer:
        writer.append(b"after prepare")
    late = root / "e.1.001"
    (late / "jnl").mkdir(parents=True)
    (late / "jnl" / f"{100:016x}.jnl").touch()  # a copy that starts at offset 100
    with Writer(late) as writer:
        writer.append_many([b"x", b"y"])
    for _ in range(2):
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"e.1.000": 2, "e.1.001": 100}
        assert sum(p.range.count for p in reader.partitions(start, end)) == 0
        start = end
