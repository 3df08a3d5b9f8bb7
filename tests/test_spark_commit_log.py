"""The exactly-once commit log (no Spark session): read once per ``CommitLog``, then only what was
appended since; its marks, by which a task's first run reads none of the log (an import of N tasks
read it N times) and which never make a replay append twice: a log without them (an older
journalq's), a rebuild cut short, a mark left without its record; a damaged record."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.errors import Error  # noqa: E402
from journalq.journal import Message, Scanner  # noqa: E402
from journalq.spark import writing  # noqa: E402
from journalq.spark.targets import Target, for_writing  # noqa: E402
from journalq.spark.writing import COMMIT, INTENT, CommitLog  # noqa: E402


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


# -- the log read once, then only what was appended since ----------------------------------------


def test_records_read_again_decode_only_what_was_appended_since(tmp_path, decoded):
    log = CommitLog(Target(tmp_path, "journal"), "import-1")
    for p in range(600):
        log.append(INTENT, {"k": "intent", "b": 0, "p": p, "s": "", "e": p, "n": 1, "d": "1:0"})
    assert len(log.records(0)) == 600
    decoded[0] = 0
    for p in range(600, 650):
        log.append(INTENT, {"k": "intent", "b": 0, "p": p, "s": "", "e": p, "n": 1, "d": "1:0"})
        assert [r["p"] for r in log.records(0)] == list(range(p + 1))
    assert decoded[0] == 50  # not 50 reads of the whole log (31,000 records)
    # Another writer's records (another CommitLog, as another task's) are seen too.
    CommitLog(Target(tmp_path, "journal"), "import-1").append(COMMIT, {"k": "commit", "b": 0})
    assert log.committed(0) and decoded[0] < 50 + 700


def test_reading_on_keeps_the_zombie_rule(tmp_path):
    """Read forward from where it was, the records are the ones read backward anew: those of
    batches since the one asked for, after the newest commit of an older batch, with a late
    intent of an older batch (a zombie's) passed over."""
    target = Target(tmp_path, "journal")
    log = CommitLog(target, "query-1")
    for batch in (0, 1):
        log.append(INTENT, {"k": "intent", "b": batch, "p": 0})
        assert [(r["k"], r["b"]) for r in log.records(1)] == [("intent", 1)] * batch
        log.append(COMMIT, {"k": "commit", "b": batch})
    assert [(r["k"], r["b"]) for r in log.records(2)] == []
    log.append(INTENT, {"k": "intent", "b": 2, "p": 0})
    log.append(INTENT, {"k": "intent", "b": 1, "p": 1})  # the zombie's
    assert [(r["k"], r["b"]) for r in log.records(2)] == [("intent", 2)]
    log.append(COMMIT, {"k": "commit", "b": 2})
    got = [(r["k"], r["b"]) for r in log.records(2)]
    assert got == [("intent", 2), ("commit", 2)] == [(r["k"], r["b"]) for r in CommitLog(target, "query-1").records(2)]
    since_1 = [("intent", 1), ("commit", 1), ("intent", 2), ("intent", 1), ("commit", 2)]
    assert [(r["k"], r["b"]) for r in log.records(1)] == since_1
    assert log.records(3) == []
    log.append(COMMIT, {"k": "commit", "b": 1})  # an older batch's commit, late: reading stops there
    assert log.records(2) == [] == CommitLog(target, "query-1").records(2)


def test_a_task_decodes_the_log_once_whatever_its_shards(tmp_path, decoded):
    """A task of a writeId import appends to every shard of a root: it read the whole log for
    each one (and once more before), so that an import's tasks read it quadratically often."""
    target = for_writing(str(tmp_path / "root"), shard_bit=3)
    earlier = CommitLog(target, "import-1")
    for p in range(1, 400):  # other tasks' intents
        earlier.append(INTENT, {"k": "intent", "b": 0, "p": p, "s": "x", "e": 0, "n": 1, "d": "1:0"})
    rows = [Message(0, None, 0, b"key %d" % i, b"row %d" % i) for i in range(64)]
    keys = [m.key for m in rows]
    decoded[0] = 0
    appender = writing.Appender(target, sync="none", segment_size=1 << 20)
    try:
        result = writing.append_exactly_once(appender, CommitLog(target, "import-1"), 0, 0, rows, keys)
    finally:
        appender.close()
    assert len(result.appended) == 8 and sum(n for _, n in result.appended.values()) == 64
    assert decoded[0] <= 399 + 8  # the log once, then each shard's intent: not 9 x 399
    again = writing.Appender(target, sync="none", segment_size=1 << 20)
    try:  # run again (a retried task): nothing appended twice
        assert not writing.append_exactly_once(again, CommitLog(target, "import-1"), 0, 0, rows, keys).appended
    finally:
        again.close()
    values = []
    for shard in target.path.iterdir():
        if shard.name.startswith("_"):
            continue
        with Scanner(shard, 0) as scanner:
            values += [m.value for m in scanner.read_batch()]
    assert sorted(values) == sorted(m.value for m in rows)


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
