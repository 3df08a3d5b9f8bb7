"""zookeeper: the price of the shared store. The ZooKeeper store (``Broker("zk://...")``, a real
ZooKeeper 3.8 server on loopback started for the run, its data in the scratch directory, writes
fsynced by the server as it does by default) against the file-system store with
``sync="always"`` (each call on stable storage before it returns: the same promise on one
machine) in the same run, one process, 100-byte bodies:

* send: ``send()`` one by one, and ``send_many()`` in batches of 100;
* receive + delete: ``receive(1)`` + ``delete``, and ``receive(10)`` + ``delete_many``, until the
  queue is empty (filled with ``send_many``, not timed); every run checks that each message was
  received exactly once. Also ``receive(10)`` + ``delete_many`` of messages all in one FIFO group
  (``group_id``): a receive takes the group's next ten in one claim.

Each figure is the best of ``repeat`` runs, stores interleaved, each run on a fresh queue (a fresh
ZooKeeper path, a fresh directory). The aims are what a low-throughput shared queue (zkmq's words)
should still do; the ratio shows what sharing costs against the files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import count

from harness import Context, Result, rate

from journalq.queue import Broker

BODY = b"x" * 100
BATCH = 100
AIMS = {  # msg/s of the ZooKeeper store
    "send": 150,
    "send_many": 3_000,
    "receive1": 100,
    "receive10": 500,
    "receive10_group": 500,
}


def _sizes(ctx: Context) -> dict[str, int]:
    if ctx.quick:
        return {"send": 300, "send_many": 2_000, "receive1": 300, "receive10": 1_000, "receive10_group": 1_000}
    return {"send": 1_000, "send_many": 10_000, "receive1": 1_000, "receive10": 5_000, "receive10_group": 5_000}


def _send(broker: Broker, n: int) -> float:
    q = broker.queue("bench")
    start = time.perf_counter()
    for _ in range(n):
        q.send(BODY)
    elapsed = time.perf_counter() - start
    assert q.stats().available == n, "a send was lost"
    return elapsed


def _send_many(broker: Broker, n: int) -> float:
    q = broker.queue("bench")
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        q.send_many([BODY] * min(BATCH, n - i))
    elapsed = time.perf_counter() - start
    assert q.stats().available == n, "a send was lost"
    return elapsed


def _drain(batch: int, group_id: str | None = None) -> Callable[[Broker, int], float]:
    def drain(broker: Broker, n: int) -> float:
        q = broker.queue("bench", visibility_timeout=300)
        for i in range(0, n, 1000):
            bodies = [b"%d " % j + BODY for j in range(i, min(i + 1000, n))]
            q.send_many(bodies if group_id is None else [{"body": body, "group_id": group_id} for body in bodies])
        seen: set[bytes] = set()
        start = time.perf_counter()
        while got := q.receive(batch):
            if batch == 1:
                q.delete(got[0].receipt)
            else:
                errors = q.delete_many([m.receipt for m in got])
                assert not any(errors), errors
            for m in got:
                number = m.body.split(b" ", 1)[0]
                assert number not in seen, f"message {number!r} received twice"
                assert group_id is None or int(number) == len(seen), f"message {number!r} out of its group's order"
                seen.add(number)
        elapsed = time.perf_counter() - start
        assert len(seen) == n, f"{n - len(seen)} messages never received"
        return elapsed

    return drain


CASES: dict[str, tuple[str, Callable[[Broker, int], float]]] = {
    "send": ("send() one by one", _send),
    "send_many": (f"send_many() x{BATCH}", _send_many),
    "receive1": ("receive(1) + delete", _drain(1)),
    "receive10": ("receive(10) + delete_many", _drain(10)),
    "receive10_group": ("receive(10) + delete_many, one FIFO group", _drain(10, "g")),
}


def run(ctx: Context) -> list[Result]:
    from journalq.queue.zookeeper.server import ZooKeeperServer

    reason = ZooKeeperServer.available()
    if reason is not None:
        ctx.log(f"  skipped: {reason}")
        return []
    sizes = _sizes(ctx)
    fresh = count()
    results = []
    with ZooKeeperServer(ctx.scratch("zookeeper-server")) as server:
        for key, (how, measure) in CASES.items():
            n = sizes[key]
            ctx.log(f"  {how}: {n:,} x {len(BODY)} B, ZooKeeper and files (sync=always), best of {ctx.repeat}")
            zk_runs, file_runs = [], []
            for _ in range(ctx.repeat):
                with Broker(server.url(f"/bench{next(fresh)}")) as broker:
                    zk_runs.append(n / measure(broker, n))
                with Broker(ctx.scratch(f"zookeeper-files-{key}"), sync="always") as broker:
                    file_runs.append(n / measure(broker, n))
            best, base = max(zk_runs), max(file_runs)
            results.append(
                Result(
                    "zookeeper",
                    how,
                    best,
                    "msg/s",
                    f"best of {ctx.repeat}",
                    "files, sync=always",
                    base,
                    aim=f">= {rate(AIMS[key])}",
                    aim_met=best >= AIMS[key],
                    extra={
                        "messages": n,
                        "body_bytes": len(BODY),
                        "runs": [round(r, 1) for r in zk_runs],
                        "baseline_runs": [round(r, 1) for r in file_runs],
                    },
                )
            )
    return results
