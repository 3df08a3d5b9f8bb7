"""The exactly-once commit log's marks: a task's first run reads none of the log (an import of N
tasks read it N times), and the marks never make a replay append twice: a log without them (an
older journalq's), a rebuild cut short, a mark left without its record (no Spark session)."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("pyspark")

from journalq.errors import JournalError  # noqa: E402
from journalq.journal import Message, Scanner, Writer  # noqa: E402
from journalq.spark import reading, writing  # noqa: E402
from journalq.spark.targets import Target, for_writing  # noqa: E402
from journalq.spark.writing import COMMIT, CommitLog  # noqa: E402
from conftest import fifo_at, returned_at_once  # noqa: E402



def rows_of(partition: int, n: int = 3) -> list[Message]:
    return [Message(0, None, 0, b"", b"row %d of %d" % (i, partition)) for i in range(n)]


def run_task(target: Target, query: str, batch: int, partition: int, rows: list[Message]) -> writing.TaskResult:
    appender = writing.Appender(target, sync="none", segment_size=1 << 20)
    try:
        log = CommitLog(target, query)
        return writing.append_exactly_once(appender, log, batch, partition, rows, [b""] * len(rows))
    finally:
        appender.close()


def stored(target: Target) -> list[bytes]:
    with Scanner(target.path, 0) as scanner:
        return [m.value for m in scanner]


def test_a_first_run_reads_none_of_the_log_and_a_retry_appends_nothing(tmp_path, decoded):
    target = Target(tmp_path / "out", "journal")
    for p in range(300):  # the tasks before: their intents
        run_task(target, "import-1", 0, p, rows_of(p))
    decoded[0] = 0
    assert run_task(target, "import-1", 0, 300, rows_of(300)).appended == {"": [900, 3]}
    assert decoded[0] == 0  # was 300 (every intent before, for every task: quadratic)
    assert not run_task(target, "import-1", 0, 300, rows_of(300)).appended  # run again: read
    assert decoded[0] > 0
    writing.commit_batch(CommitLog(target, "import-1"), 0, [])
    assert run_task(target, "import-1", 0, 7, rows_of(7)).skipped
    assert sorted(stored(target)) == sorted(m.value for p in range(301) for m in rows_of(p))


@pytest.mark.parametrize("damage", ["no marks (an older journalq)", "a rebuild cut short"])
def test_marks_missing_are_made_again_from_the_log(tmp_path, damage):
    target = Target(tmp_path / "out", "journal")
    run_task(target, "q", 0, 0, rows_of(0))
    writing.commit_batch(CommitLog(target, "q"), 0, [])
    run_task(target, "q", 1, 0, rows_of(10))
    run_task(target, "q", 1, 1, rows_of(11))
    marks = CommitLog(target, "q").marks
    if damage.startswith("no marks"):
        shutil.rmtree(marks)
    else:
        (marks / "ready").unlink()
        (marks / "t-1-1-").unlink()
        (marks / "c-0").unlink()
    assert CommitLog(target, "q").committed(0)
    assert run_task(target, "q", 0, 0, rows_of(0)).skipped
    assert not run_task(target, "q", 1, 1, rows_of(11)).appended  # its intent found: not again
    assert run_task(target, "q", 1, 2, rows_of(12)).appended
    assert (marks / "ready").exists() and (marks / "t-1-1-").exists()
    assert sorted(stored(target)) == sorted(m.value for p in (0, 10, 11, 12) for m in rows_of(p))


def test_a_mark_without_its_record_appends_the_rows_once(tmp_path):
    """A run killed between its mark and its intent appended nothing: the next appends all."""
    target = Target(tmp_path / "out", "journal")
    run_task(target, "q", 0, 0, rows_of(0))
    log = CommitLog(target, "q")
    log._mark("t-0-1-")
    log._mark("c-0")  # a driver killed between the mark and the commit's record
    assert not log.committed(0)
    assert run_task(target, "q", 0, 1, rows_of(1)).appended
    assert not run_task(target, "q", 0, 1, rows_of(1)).appended
    assert sorted(stored(target)) == sorted(m.value for p in (0, 1) for m in rows_of(p))


def test_a_commit_drops_its_tasks_marks_and_replays_still_skip(tmp_path, monkeypatch):
    monkeypatch.setattr(CommitLog, "SEGMENT_SIZE", 4096)
    monkeypatch.setattr(CommitLog, "KEEP_SEGMENTS", 2)
    target = Target(tmp_path / "out", "journal")
    for batch in range(40):
        for p in range(3):
            run_task(target, "q", batch, p, rows_of(100 * batch + p, 1))
        writing.commit_batch(CommitLog(target, "q"), batch, [])
    log = CommitLog(target, "q")
    names = sorted(path.name for path in log.marks.iterdir())
    assert not [n for n in names if n.startswith("t-")]  # every batch committed
    kept = [int(n[2:]) for n in names if n.startswith("c-")]
    assert 39 in kept and len(kept) < 40  # those whose records were trimmed went with them
    for batch in kept:
        assert log.committed(batch) and run_task(target, "q", batch, 1, rows_of(100 * batch + 1, 1)).skipped
    assert len(stored(target)) == 120
    log.append(COMMIT, {"k": "commit", "b": 40})  # a batch with no tasks' marks: nothing to drop
    assert CommitLog(target, "q").committed(40)


# -- a named pipe with a segment's name --------------------------------------------------------



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


def test_a_task_appending_to_many_shards_reads_none_of_the_log(tmp_path, decoded):
    """A mark per task only would send a run to read the whole log from its second shard on
    (its own intent on the first marks the task): an import into a sharded root was quadratic
    still. A run of the same task elsewhere (speculation) is seen on the shards it reached."""
    target = for_writing(str(tmp_path / "root"), shard_bit=3)
    rows = [Message(0, None, 0, b"key %d" % i, b"row %d" % i) for i in range(64)]
    keys = [m.key for m in rows]

    def task(partition: int, rows: list[Message], keys: list[bytes]) -> writing.TaskResult:
        appender = writing.Appender(target, sync="none", segment_size=1 << 20)
        try:
            return writing.append_exactly_once(appender, CommitLog(target, "import-1"), 0, partition, rows, keys)
        finally:
            appender.close()

    for p in range(1, 100):
        task(p, [Message(0, None, 0, b"k%d" % p, b"other %d" % p)], [b"k%d" % p])
    decoded[0] = 0
    assert len(task(0, rows, keys).appended) == 8
    assert decoded[0] == 0
    assert not task(0, rows, keys).appended  # run again: it reads, and appends nothing


# -- Trigger.AvailableNow and a shard made meanwhile ---------------------------------------------


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
