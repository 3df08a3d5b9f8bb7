"""spark: the journalq data source on a local Spark (local[2]), 1,000,000 keyless 100-byte messages.

* read: ``spark.read.format("journalq").load(dir)`` into Spark's ``noop`` sink (every column
  made, nothing kept); baseline: the same records (same nine columns) read from Parquet, written
  once from the journal in the same run;
* write: the records (value, key, type, timestamp_ns) from that Parquet appended through the
  data source to a fresh journal; baseline: the same rows written by Spark's Parquet writer;
* information: a narrow query (``offset`` between two values, 1,000 rows) through filter
  pushdown, against the same query with pushdown disabled for the read.

Starting Spark and a warm-up run of each case are not timed (the first job of a session pays for
starting Python workers and the JVM's compiler). Throughputs: rows per second, best of the runs.
"""

from __future__ import annotations

import os
import sys
import time

from harness import Context, Result, best_rate, cached_journal, remove

READ_AIM = 500_000
WRITE_AIM = 150_000


def _session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from journalq.spark.testing import local_session

    return local_session(**{"spark.driver.memory": "2g"})


def run(ctx: Context) -> list[Result]:
    total = 100_000 if ctx.quick else 1_000_000
    path = cached_journal(ctx, total)
    ctx.log("  starting Spark (local[2]; not timed)...")
    spark = _session()
    try:
        return _measure(ctx, spark, path, total)
    finally:
        spark.stop()


def _measure(ctx: Context, spark, path, total: int) -> list[Result]:
    parquet = ctx.scratch("spark-parquet")
    spark.read.format("journalq").load(str(path)).write.parquet(str(parquet))

    def timed(action) -> tuple[int, float]:
        started = time.perf_counter()
        action()
        return total, time.perf_counter() - started

    def read_journal() -> tuple[int, float]:
        return timed(
            lambda: spark.read.format("journalq").load(str(path)).write.format("noop").mode("overwrite").save()
        )

    def read_parquet() -> tuple[int, float]:
        return timed(lambda: spark.read.parquet(str(parquet)).write.format("noop").mode("overwrite").save())

    rows = spark.read.parquet(str(parquet)).select("value", "key", "type", "timestamp_ns")
    target = ctx.scratch("spark-written")
    parquet_out = ctx.scratch("spark-parquet-written")

    def write_journal() -> tuple[int, float]:
        remove(target)
        n, seconds = timed(lambda: rows.write.format("journalq").mode("append").save(str(target)))
        from journalq.journal import end_offset

        assert end_offset(target) == total, end_offset(target)
        return n, seconds

    def write_parquet() -> tuple[int, float]:
        return timed(lambda: rows.write.mode("overwrite").parquet(str(parquet_out)))

    ctx.log(f"  spark: {total:,} messages, warm-up then best of {ctx.repeat}")
    for warm in (read_journal, read_parquet, write_journal, write_parquet):
        warm()
    results = []
    read_best, read_runs, base_best, base_runs = _interleaved(ctx.repeat, read_journal, read_parquet)
    results.append(
        Result(
            "spark", f"read: data source -> noop ({total:,} rows, 9 columns)", read_best, "msg/s",
            f"best of {ctx.repeat}", "Parquet -> noop", base_best,
            aim=f">= {READ_AIM:,} msg/s", aim_met=read_best >= READ_AIM,
            extra={
                "rows": total, "runs": [round(r) for r in read_runs], "baseline_runs": [round(r) for r in base_runs]
            },
        )
    )
    write_best, write_runs, wbase_best, wbase_runs = _interleaved(ctx.repeat, write_journal, write_parquet)
    results.append(
        Result(
            "spark", f"write: sink, append ({total:,} rows)", write_best, "msg/s",
            f"best of {ctx.repeat}", "Spark's Parquet writer", wbase_best,
            aim=f">= {WRITE_AIM:,} msg/s", aim_met=write_best >= WRITE_AIM,
            extra={
                "rows": total, "runs": [round(r) for r in write_runs],
                "baseline_runs": [round(r) for r in wbase_runs],
            },
        )
    )
    low = total // 2

    def narrow(pushdown: bool) -> float:
        df = spark.read.format("journalq").option("filterPushdown", "true" if pushdown else "false").load(str(path))
        started = time.perf_counter()
        n = df.where(f"offset >= {low} and offset < {low + 1000}").count()
        seconds = time.perf_counter() - started
        assert n == 1000, n
        return seconds

    narrow(True)
    pushed = min(narrow(True) for _ in range(ctx.repeat))
    full = min(narrow(False) for _ in range(ctx.repeat))
    results.append(
        Result(
            "spark", "narrow query: 1,000 rows by offset, pushdown (information)", pushed * 1000, "ms",
            f"least of {ctx.repeat}", "without pushdown", full * 1000,
            extra={"rows": 1000, "of": total},
        )
    )
    return results


def _interleaved(repeat: int, fn, baseline) -> tuple[float, list[float], float, list[float]]:
    """Alternate the case and its baseline, so that both see the same machine."""
    runs, base_runs = [], []
    for _ in range(repeat):
        best, one = best_rate(1, fn)
        runs.extend(one)
        best, one = best_rate(1, baseline)
        base_runs.extend(one)
    return max(runs), runs, max(base_runs), base_runs
