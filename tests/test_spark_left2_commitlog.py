"""The exactly-once commit log is read once per CommitLog, then only what was appended since:
a writeId import's task no longer decodes the whole log again for every shard it appends to
(no Spark session)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Message, Scanner  # noqa: E402
from journalq.spark import writing  # noqa: E402
from journalq.spark.targets import Target, for_writing  # noqa: E402
from journalq.spark.writing import COMMIT, INTENT, CommitLog  # noqa: E402



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
