"""shard-queue: receive + delete by consumer processes on a sharded queue (4 shards) against the
same queue unsharded, in the same run.

The same N messages (100-byte bodies, keyless, so spread round robin over the shards) are put in
``Broker(root).queue("q", shards=4)`` and in ``Broker(root).queue("q")``, then four consumer
processes (``bench/queue_child.py``, as the receive benchmark's) receive and delete until the queue
is empty: ``receive(1)`` + ``delete`` and ``receive(10)`` + ``delete_many``, ``sync="none"`` and
``"always"``. Each consumer of the sharded queue claims a home shard and stays on a shard while it
has messages (mq's peers), so the four mostly take different locks; on the unsharded queue all
four take the one channel lock. One more case has two consumers on the four shards: once their
homes run dry each goes on to a shard that the other does not hold (``ShardedChannel._visit``),
rather than both to the same one. Timed: from the first consumer's start to the last one's end;
filling (and ``os.sync()`` after it) is not timed. Every run checks that each message was received
exactly once. The figure is the best of ``repeat`` runs, sharded and unsharded interleaved. Aim:
the sharded queue faster than the unsharded one (ratio > 1).
"""

from __future__ import annotations

from bench_queue import SHARDS, _consume, _fill, _receive_bodies
from harness import Context, Result, rate

CASES = ((4, "none", 1), (4, "none", 10), (4, "always", 10), (2, "none", 10))  # (processes, sync, batch)


def run(ctx: Context) -> list[Result]:
    count = 2000 if ctx.quick else 20_000
    bodies = _receive_bodies(count)
    results = []
    for processes, sync, batch in CASES:
        how = "receive(1)+delete" if batch == 1 else f"receive({batch})+delete_many"
        case = f"{processes} processes, {SHARDS} shards, sync={sync}, {how}"
        ctx.log(f"  {case}: {count:,} messages, best of {ctx.repeat}")
        runs: dict[int, list[float]] = {SHARDS: [], 1: []}
        first_shards = []  # per sharded run: the shard each consumer started at
        for _ in range(ctx.repeat):
            for shards in runs:
                path = ctx.scratch(f"shard-queue-{shards}")
                _fill("journalq-sharded" if shards > 1 else "journalq", path, bodies)
                consumed = _consume("journalq", path, sync, batch, processes, count)
                runs[shards].append(count / consumed.seconds)
                if shards > 1:
                    first_shards.append(consumed.settings["first_shard"])
        best = {shards: max(r) for shards, r in runs.items()}
        ctx.log(f"    sharded {rate(best[SHARDS])}, unsharded {rate(best[1])}")
        results.append(
            Result(
                "shard-queue",
                case,
                best[SHARDS],
                "msg/s",
                f"best of {ctx.repeat}",
                "the same queue unsharded",
                best[1],
                aim="> 1x unsharded",
                aim_met=best[SHARDS] > best[1],
                extra={
                    "messages": count,
                    "processes": processes,
                    "shards": SHARDS,
                    "sync": sync,
                    "batch": batch,
                    "sharded_runs": [round(r) for r in runs[SHARDS]],
                    "unsharded_runs": [round(r) for r in runs[1]],
                    "first_shards": first_shards,
                },
            )
        )
    return results
