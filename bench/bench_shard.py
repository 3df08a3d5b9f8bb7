"""shard: what sharding costs, writing and reading, against one journal holding the same messages.

* ``ShardedWriter(root, "bench", 2).append_many`` in batches of 10,000 ``Message``s with 8-byte
  keys (1,000 distinct keys, so about a quarter of each batch goes to each of the 4 shards) and
  100-byte values, sync "none", against ``Writer.append_many`` of the same batches into one
  journal. The figure includes grouping by shard and the four shards' writes; the shards are
  opened lazily, so their opening (a few ms each) is inside the first batch, and the baseline's
  timing includes opening its writer too.
* ``ShardedScanner`` reading the 4-shard root just written (iterating, and ``read_batch()``),
  against ``Scanner`` reading the single journal just written, the same way (page cache warm).

Timed: opening the writer(s) and the appends (closing, which syncs, is outside); for reads,
opening the scanner and reading every message.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import cycle

from harness import VALUE_SIZE, Context, Result, best_rate, rate, values
from journalq.journal import Message, Scanner, Writer
from journalq.shard import ShardedScanner, ShardedWriter

BATCH = 10_000
KEYS = [b"user%04d" % i for i in range(1000)]
MESSAGE_SIZE = 26 + 8 + VALUE_SIZE  # header, lengths and size field, key, value


def run(ctx: Context) -> list[Result]:
    total = 200_000 if ctx.quick else 1_000_000
    batches = total // BATCH
    pool = [Message(key=key, value=value) for key, value in zip(cycle(KEYS), values(BATCH, seed=7))]
    spread: Counter[str] = Counter()

    def sharded_append() -> tuple[int, float]:
        path = ctx.scratch("shard-root")
        writer = ShardedWriter(path, "bench", 2, sync="none")
        try:
            append_many = writer.append_many
            started = time.perf_counter()
            for _ in range(batches):
                placed = append_many(pool)
            seconds = time.perf_counter() - started
        finally:
            writer.close()
        spread.clear()
        spread.update(name for name, _ in placed)
        return batches * BATCH, seconds

    def single_append() -> tuple[int, float]:
        path = ctx.scratch("shard-single")
        started = time.perf_counter()  # the sharded writer opens its shards in its first batch
        writer = Writer(path, sync="none")
        try:
            append_many = writer.append_many
            for _ in range(batches):
                append_many(pool)
            seconds = time.perf_counter() - started
        finally:
            writer.close()
        return batches * BATCH, seconds

    ctx.log(f"  append_many x{BATCH:,}: {total:,} messages, 4 shards vs 1 journal, best of {ctx.repeat}")
    best, runs = best_rate(ctx.repeat, sharded_append)
    base, base_runs = best_rate(ctx.repeat, single_append)
    results = [
        Result(
            "shard",
            f"ShardedWriter.append_many, 4 shards, batches of {BATCH:,} (sync none)",
            best,
            "msg/s",
            f"best of {ctx.repeat}",
            "Writer.append_many, 1 journal",
            base,
            figure=f"{rate(best)}, {best * MESSAGE_SIZE / 1e6:.0f} MB/s",
            extra={
                "messages": total,
                "batch": BATCH,
                "shards": 4,
                "per_shard_in_a_batch": dict(sorted(spread.items())),
                "mb_per_s": round(best * MESSAGE_SIZE / 1e6, 1),
                "runs": [round(r) for r in runs],
                "baseline_runs": [round(r) for r in base_runs],
            },
        )
    ]

    # Reading what the last runs left: the root of 4 shards and the single journal.
    root, single = ctx.scratch_dir / "shard-root", ctx.scratch_dir / "shard-single"

    def sharded_iterate() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with ShardedScanner(root) as scanner:
            for _ in scanner:
                n += 1
            seconds = time.perf_counter() - started
            assert n == total and sum(scanner.offsets.values()) == total, (n, scanner.offsets)
        return n, seconds

    def sharded_batches() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with ShardedScanner(root) as scanner:
            while batch := scanner.read_batch():
                n += len(batch[1])
            seconds = time.perf_counter() - started
            assert n == total and sum(scanner.offsets.values()) == total, (n, scanner.offsets)
        return n, seconds

    def single_iterate() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with Scanner(single) as scanner:
            for _ in scanner:
                n += 1
            seconds = time.perf_counter() - started
        assert n == total, n
        return n, seconds

    def single_batches() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with Scanner(single) as scanner:
            while batch := scanner.read_batch():
                n += len(batch)
            seconds = time.perf_counter() - started
        assert n == total, n
        return n, seconds

    ctx.log(f"  read: {total:,} messages, 4 shards vs 1 journal, best of {ctx.repeat}")
    for case, base_case, fn, base_fn in (
        ("ShardedScanner, iterating (4 shards)", "Scanner, iterating, 1 journal", sharded_iterate, single_iterate),
        ("ShardedScanner.read_batch() (4 shards)", "Scanner.read_batch(), 1 journal", sharded_batches, single_batches),
    ):
        base, base_runs = best_rate(ctx.repeat, base_fn)
        best, runs = best_rate(ctx.repeat, fn)
        results.append(
            Result(
                "shard",
                f"{case} ({total:,} messages)",
                best,
                "msg/s",
                f"best of {ctx.repeat}",
                base_case,
                base,
                extra={
                    "messages": total,
                    "runs": [round(r) for r in runs],
                    "baseline_runs": [round(r) for r in base_runs],
                },
            )
        )
    return results
