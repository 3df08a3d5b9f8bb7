"""fifo: a consumer draining a FIFO queue whose messages are in 1 or 10 groups (20,000 messages of
100 bytes; 4,000 with --quick), with the consumer loop ``receive(10, delete=last round's
receipts)``, one process, ``sync="none"``.

A receive takes a group's messages in order, as SQS FIFO's does (the group is then out with this
consumer alone). Baseline, in the same run and the same directory layout: the same loop with
``one_per_group=True``, one message of a group a receive, which is what a FIFO receive gave
before (and what the ZooKeeper store's gave until the twenty-fifth session): with one group,
one message a call.
"""

from __future__ import annotations

import time

from harness import Context, Result
from journalq.queue import Broker

BODY = b"x" * 100
GROUPS = (1, 10)
BATCH = 10


def _drain(ctx: Context, groups: int, count: int, one_per_group: bool) -> float:
    """Messages a second of one consumer loop draining ``count`` messages in ``groups`` groups."""
    path = ctx.scratch(f"fifo-{groups}-{one_per_group}")
    with Broker(path, sync="none") as broker:
        queue = broker.queue("orders")
        for start in range(0, count, 1000):
            queue.send_many([{"body": BODY, "group_id": f"g{n % groups}"} for n in range(start, start + 1000)])
        done: list[str] = []
        taken = 0
        started = time.perf_counter()
        while batch := queue.receive(BATCH, delete=done, wait=0, one_per_group=one_per_group):
            taken += len(batch)
            done = [m.receipt for m in batch]
        queue.delete_many(done)
        seconds = time.perf_counter() - started
    if taken != count:
        raise AssertionError(f"drained {taken} of {count} messages")
    return count / seconds


def run(ctx: Context) -> list[Result]:
    count = 4_000 if ctx.quick else 20_000
    results = []
    for groups in GROUPS:
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(ctx.repeat):
            for one_per_group in (False, True):  # interleaved: the host's minute affects both alike
                runs[one_per_group].append(_drain(ctx, groups, count, one_per_group))
        best, baseline = max(runs[False]), max(runs[True])
        ctx.log(f"  {groups} group(s): {best:,.0f} msg/s; one per group {baseline:,.0f} msg/s")
        results.append(Result(
            "fifo", f"{groups} group{'s' if groups > 1 else ''}, receive({BATCH}) loop, sync none", best, "msg/s",
            "best", "one message of a group a receive", baseline,
            extra={"runs": runs[False], "baseline_runs": runs[True], "messages": count},
        ))
    return results
