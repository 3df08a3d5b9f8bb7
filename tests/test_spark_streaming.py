"""Streaming reads and the exactly-once streaming sink, on a real local Spark session: stop,
append, restart from the checkpoint; read limits; new shards; data loss; and the driver killed
between the sink's commit and Spark's (in a child process), then restarted: nothing twice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Scanner, Writer  # noqa: E402
from journalq.journal.offsets import end_offset  # noqa: E402
from journalq.journal.segment import segment_bases  # noqa: E402
from journalq.shard.naming import shard_name, shard_of  # noqa: E402
from journalq.spark.testing import local_session  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")


@pytest.fixture(scope="module")
def spark():
    return local_session()


def values(path: Path) -> list[bytes]:
    if not (path / "jnl").is_dir():
        return []
    with Scanner(path) as scanner:
        return [m.value for m in scanner]


def append(path: Path, start: int, stop: int, **writer) -> None:
    with Writer(path, **writer) as w:
        w.append_many([b"m%05d" % i for i in range(start, stop)])


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def start_copy(spark, source: Path, out: Path, checkpoint: Path, **options):
    reader = spark.readStream.format("journalq").option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load(str(source))
        .selectExpr("value", "key")
        .writeStream.format("journalq")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start(str(out))
    )


def test_stop_append_restart_loses_nothing_and_repeats_nothing(spark, tmp_path):
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    append(source, 0, 500)
    query = start_copy(spark, source, out, checkpoint, maxOffsetsPerTrigger="150")
    try:
        wait_until(lambda: end_offset(out) >= 500 if (out / "jnl").is_dir() else False)
        append(source, 500, 800)  # while it runs
        wait_until(lambda: end_offset(out) >= 800)
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 150
    append(source, 800, 1000)  # while it is stopped
    query = start_copy(spark, source, out, checkpoint, maxOffsetsPerTrigger="150")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert values(out) == [b"m%05d" % i for i in range(1000)]


def test_available_now_and_new_shards(spark, tmp_path):
    root, out, checkpoint = tmp_path / "root", tmp_path / "out", tmp_path / "checkpoint"
    keys = [b"key-%d" % i for i in range(40)]

    def write(keys_, tag):
        for key in keys_:
            with Writer(root / shard_name("ev", 2, shard_of(key, 2))) as w:
                w.append(tag + key, key=key)

    write([k for k in keys if shard_of(k, 2) in (0, 1)], b"a:")

    def run():
        query = (
            spark.readStream.format("journalq").option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "7").load(str(root))
            .selectExpr("value").writeStream.format("journalq")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(str(out))
        )
        query.awaitTermination()
        return [p["numInputRows"] for p in query.recentProgress]

    first = run()
    assert sum(first) == len(values(out)) and max(first) <= 7
    write(keys, b"b:")  # more messages, and shards 2 and 3 appear: read from their start
    run()
    got = sorted(values(out))
    expected = sorted([b"a:" + k for k in keys if shard_of(k, 2) in (0, 1)] + [b"b:" + k for k in keys])
    assert got == expected


def test_data_loss_on_restart(spark, tmp_path):
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    append(source, 0, 100, segment_size=1024)

    def run(**options):
        query = (
            spark.readStream.format("journalq").option("startingOffsets", "earliest").options(**options)
            .load(str(source)).selectExpr("value").writeStream.format("journalq")
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(str(out))
        )
        query.awaitTermination()

    run()
    append(source, 100, 300, segment_size=1024)
    bases = segment_bases(source)
    doomed = [b for b in bases if b < 200]  # retention deletes what the query has not read yet
    for base in doomed:
        (source / "jnl" / f"{base:016x}.jnl").unlink()
        (source / "jnl" / f"{base:016x}.idx").unlink(missing_ok=True)
    first_kept = segment_bases(source)[0]
    with pytest.raises(Exception, match="were deleted"):
        run()
    run(failOnDataLoss="false")
    assert values(out) == [b"m%05d" % i for i in range(100)] + [b"m%05d" % i for i in range(first_kept, 300)]


CHILD = textwrap.dedent(
    """
    import sys
    from journalq.spark.testing import local_session
    source, out, checkpoint = sys.argv[1:4]
    spark = local_session()
    query = (spark.readStream.format("journalq").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 100).load(source)
             .selectExpr("value", "key").repartition(2)
             .writeStream.format("journalq").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(out))
    try:
        query.awaitTermination()
    except BaseException:
        # The hook killed the JVM: reap it (this process started it) before going down.
        import os, time
        time.sleep(1)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        raise
    print("batches", [p["batchId"] for p in query.recentProgress], flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["sink-commit:1", "task-after-write:2"])
def test_sink_is_exactly_once_when_the_driver_dies(tmp_path, child_env, crash):
    """The driver JVM is killed (SIGKILL) by a test hook: after the sink recorded batch 1 as
    committed but before Spark wrote its own commit; or (task-after-write) after a task appended
    batch 2's rows and before the batch was committed at all. The restarted query replays that
    batch from its checkpoint; the sink appends none of it twice."""
    source, out, checkpoint = tmp_path / "source", tmp_path / "out", tmp_path / "checkpoint"
    append(source, 0, 450)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(child_env, JOURNALQ_SPARK_TEST_CRASH=crash, JOURNALQ_SPARK_TEST_CRASH_ONCE=str(tmp_path / "crashed"))
    args = [sys.executable, str(script), str(source), str(out), str(checkpoint)]
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode != 0, first.stdout + first.stderr[-3000:]
    assert (tmp_path / "crashed").exists()
    written = len(values(out))
    batch = int(crash.split(":")[1])
    if crash.startswith("sink-commit"):
        assert written == 100 * (batch + 1)  # all of the crashed batch's rows are in the journal
    else:
        assert 100 * batch < written <= 100 * (batch + 1)  # a task's rows at least
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"batches [{batch}," in second.stdout  # Spark replayed the batch the crash cut short
    got = values(out)
    assert len(got) == 450 and sorted(got) == [b"m%05d" % i for i in range(450)]
    assert os.path.isdir(out / "_spark_commits")
