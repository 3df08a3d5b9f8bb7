"""A consumer process of the receive benchmark (started by bench_queue.py, one or four at a time).

    queue_child.py IMPL PATH SYNC BATCH PROCESSES

IMPL is ``journalq``, ``journalq-loop`` (the consumer loop: ``receive(BATCH, delete=the last
round's receipts)``), ``journalq-sharded`` and ``journalq-sharded-loop`` (the same on a sharded
queue: the consumer opens whatever queue ``q`` is), ``persist-queue`` or ``vsqs``; PATH the queue
(a broker's root, a persist-queue directory or a vsqs directory) already filled; SYNC ``always``
or ``none``; BATCH 1 (receive one, delete it) or more (receive up to BATCH, delete them in one
call); PROCESSES how many consumers share the queue.

The process opens the queue, prints ``ready``, waits for a line on stdin, then receives and deletes
until the queue is empty and prints one JSON object: ``start`` and ``end`` (``time.monotonic()``,
the same clock in every process), ``ids`` (the number at the head of each body received, in order)
``failed`` (deletes that did not take) and ``settings`` (what the queue was opened with).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import journalq  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

ID_DIGITS = 10  # bodies start with the message's number, ten digits
CLEAR_ACKED_EVERY = 1000  # persist-queue: acks between clear_acked_data() calls


def ready() -> None:
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)


def run_journalq(
    path: str, sync: str, batch: int, processes: int, loop: bool = False
) -> tuple[list[int], int, float, float, dict]:
    """receive + delete (or delete_many); with ``loop``, ``receive(batch, delete=last round's)``."""
    from journalq.errors import ReceiptError
    from journalq.queue import Broker

    broker = Broker(path, sync=sync)
    queue = broker.queue("q", create=False)
    settings = {"sync": broker.sync, "visibility_timeout": queue.settings.visibility_timeout}
    if queue.settings.shards > 1:
        settings["first_shard"] = queue.home  # the shard this consumer claimed
        # Its channel opened before the clock starts, as each baseline opens its queue (a sharded
        # consumer opens it at its first receive).
        queue._channel(queue.home)
    ids: list[int] = []
    failed = 0
    ready()
    start = time.monotonic()
    if loop:
        receive = queue.receive
        done: list[str] = []
        while True:
            try:
                got = receive(batch, delete=done)
            except ReceiptError:  # one of them is stale: delete the rest one by one, then go on
                failed += sum(1 for o in queue.delete_many(done) if o is not None)
                got = receive(batch)
            if not got:
                break
            done = [m.receipt for m in got]
            ids.extend(int(m.body[:ID_DIGITS]) for m in got)
    elif batch == 1:
        receive, delete = queue.receive, queue.delete
        while got := receive(1):
            message = got[0]
            delete(message.receipt)
            ids.append(int(message.body[:ID_DIGITS]))
    else:
        receive, delete_many = queue.receive, queue.delete_many
        while got := receive(batch):
            outcomes = delete_many([m.receipt for m in got])
            failed += sum(1 for o in outcomes if o is not None)
            ids.extend(int(m.body[:ID_DIGITS]) for m in got)
    end = time.monotonic()
    broker.close()
    return ids, failed, start, end, settings


def run_persist_queue(path: str, sync: str, batch: int, processes: int) -> tuple[list[int], int, float, float, dict]:
    from persistqueue import SQLiteAckQueue
    from persistqueue.exceptions import Empty

    # auto_commit stays True (the ack queue refuses False), one connection (multithreading=False):
    # with sync its defaults (WAL, synchronous=FULL: every get and ack committed durably); without,
    # synchronous=OFF on its connection (commits survive the process, not the machine).
    queue = SQLiteAckQueue(path)
    if sync == "none":
        queue._conn.execute("PRAGMA synchronous=OFF")
    settings = {
        "journal_mode": queue._conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": queue._conn.execute("PRAGMA synchronous").fetchone()[0],  # 0 OFF, 2 FULL
        "auto_commit": queue.auto_commit,
        "multithreading": queue.multithreading,
        "get_under_flock": processes > 1,
    }
    lock_fd = -1
    if processes > 1:
        # get() selects the oldest ready row, then marks it in a second statement: two processes
        # can take the same row (duplicates were seen). One lock around get() makes it correct.
        lock_fd = os.open(os.path.join(path, "get.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    get, ack = queue.get, queue.ack
    ids: list[int] = []
    acked = 0
    ready()
    start = time.monotonic()
    done = False
    while not done:
        items = []
        for _ in range(batch):  # persist-queue has no batch receive: get() BATCH times
            if lock_fd >= 0:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                items.append(get(block=False))
            except Empty:
                done = True
                break
            finally:
                if lock_fd >= 0:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
        for item in items:
            ack(item)
            ids.append(int(item[:ID_DIGITS]))
        acked += len(items)
        if acked >= CLEAR_ACKED_EVERY:
            # acked rows stay in the table, and get() scans past them: clear them now and then
            queue.clear_acked_data(max_delete=0, keep_latest=0)
            acked = 0
    end = time.monotonic()
    queue.close()
    if lock_fd >= 0:
        os.close(lock_fd)
    return ids, 0, start, end, settings


def run_vsqs(path: str, sync: str, batch: int, processes: int) -> tuple[list[int], int, float, float, dict]:
    from vsqs import VsqsQueue

    queue = VsqsQueue(path, sync=sync == "always")
    settings = {"fsync": queue.sync, "visibility_ms": queue.visibility_ms}
    ids: list[int] = []
    failed = 0
    ready()
    start = time.monotonic()
    if batch == 1:
        receive, delete = queue.receive, queue.delete
        while got := receive(1):
            receipt, body = got[0]
            failed += not delete(receipt)
            ids.append(int(body[:ID_DIGITS]))
    else:
        receive, delete_many = queue.receive, queue.delete_many
        while got := receive(batch):
            failed += sum(1 for ok in delete_many([r for r, _ in got]) if not ok)
            ids.extend(int(body[:ID_DIGITS]) for _, body in got)
    end = time.monotonic()
    queue.close()
    return ids, failed, start, end, settings


IMPLEMENTATIONS = {
    "journalq": run_journalq,
    "journalq-loop": lambda *args: run_journalq(*args, loop=True),
    "journalq-sharded": run_journalq,
    "journalq-sharded-loop": lambda *args: run_journalq(*args, loop=True),
    "persist-queue": run_persist_queue,
    "vsqs": run_vsqs,
}


def main() -> int:
    impl, path, sync, batch, processes = sys.argv[1:6]
    ids, failed, start, end, settings = IMPLEMENTATIONS[impl](path, sync, int(batch), int(processes))
    report = {"start": start, "end": end, "ids": ids, "failed": failed, "settings": settings}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
