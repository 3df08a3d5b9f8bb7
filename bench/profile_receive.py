"""Profile journalq's single-process receive(1) + delete with cProfile (not part of run.py).

    .venv/bin/python bench/profile_receive.py [--messages N] [--sync none|always] [--batch B] [--loop] [--top K]
    .venv/bin/python bench/profile_receive.py --cpu [--repeat R] ...   # CPU time per message, no profiler

Fills a queue in a scratch directory with N 100-byte messages (not profiled), then profiles one
process receiving and deleting them all, and prints the functions by own time and by cumulative
time. ``--loop``: the consumer loop, ``receive(B, delete=receipts of the last round)``. The scratch
directory is deleted afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import journalq  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

from journalq.queue import Broker  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_options(parser, messages=20_000, batch=1)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="no profiler: print the CPU time per message and per call (best of --repeat)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs with --cpu (the least CPU time is printed)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="with --cpu: this many consumer processes share the queue; prints their CPU, and the "
        "time each call waited for the channel's lock and held it",
    )
    args = parser.parse_args()
    if args.cpu and args.processes > 1:
        for _ in range(args.repeat):
            print(run_processes(args))
        return 0
    if args.cpu:
        best, system = min(run_once(args, None) for _ in range(args.repeat))
        calls = -(-args.messages // args.batch)
        print(
            f"receive({args.batch}) + {'delete= (loop)' if args.loop else 'delete'}, sync={args.sync}, "
            f"{args.messages:,} messages: CPU {best * 1e6 / args.messages:.2f} µs/message, "
            f"{best * 1e6 / calls:.1f} µs per round, of which system {system * 1e6 / calls:.1f} "
            f"(best of {args.repeat}; the kernel splits user and system by sampling: roughly)"
        )
        return 0
    profiler = cProfile.Profile()
    started = time.perf_counter()
    run_once(args, profiler)
    seconds = time.perf_counter() - started
    received = args.messages
    print(
        f"{received:,} messages, receive({args.batch}) + {'delete= (loop)' if args.loop else 'delete'}, "
        f"sync={args.sync}: "
        f"{seconds:.2f} s under the profiler ({received / seconds:,.0f} msg/s)\n"
    )
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


def add_workload_options(parser: argparse.ArgumentParser, *, messages: int, batch: int) -> None:
    """The options that ``fill`` and ``consume`` read, with these defaults: how many messages,
    the sync policy, and how they are received and deleted."""
    parser.add_argument("--messages", type=int, default=messages)
    parser.add_argument("--sync", default="none", choices=("none", "always"))
    parser.add_argument(
        "--batch", type=int, default=batch, help=f"receive(B) + delete_many (1: delete; default {batch})"
    )
    parser.add_argument("--loop", action="store_true", help="receive(B, delete=last round's receipts)")
    parser.add_argument(
        "--messages-of",
        dest="kind",
        default="plain",
        choices=("plain", "groups", "attributes"),
        help="plain messages (default); envelopes in 10 FIFO groups (round robin); envelopes with two attributes",
    )


def consume(queue: Any, args: argparse.Namespace) -> int:
    """Receive and delete until the queue is empty, as ``args`` says; returns how many."""
    received = 0
    if args.loop:
        done: list[str] = []
        while got := queue.receive(args.batch, delete=done):
            done = [m.receipt for m in got]
            received += len(got)
    elif args.batch == 1:
        while got := queue.receive(1):
            queue.delete(got[0].receipt)
            received += 1
    else:
        while got := queue.receive(args.batch):
            queue.delete_many([m.receipt for m in got])
            received += len(got)
    return received


def fill(args: argparse.Namespace, shards: int = 1) -> Path:
    """A scratch broker root holding a queue ``q`` (in ``shards`` shards) of ``args.messages``
    100-byte messages."""
    (HERE / ".data").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="profile-receive-", dir=HERE / ".data"))
    with Broker(root, sync="none") as broker:
        queue = broker.queue("q", shards=shards)
        kind = getattr(args, "kind", "plain")
        for i in range(0, args.messages, 1000):
            bodies = [b"%010d" % n + bytes(90) for n in range(i, min(i + 1000, args.messages))]
            if kind == "plain":
                queue.send_many(bodies)
            else:
                queue.send_many(
                    [{"body": body, "group_id": f"g{n % 10}"} for n, body in enumerate(bodies, i)]
                    if kind == "groups"
                    else [{"body": body, "attributes": {"trace": "abc123", "n": 7}} for body in bodies]
                )
    return root


def run_processes(args: argparse.Namespace) -> str:
    """``args.processes`` consumers (forked) share a scratch queue; a line of what they cost."""
    from journalq.journal import writer as writer_module

    root = fill(args)
    try:
        start = multiprocessing.get_context("fork").Barrier(args.processes + 1)
        results = multiprocessing.get_context("fork").SimpleQueue()
        children = []
        for _ in range(args.processes):
            pid = os.fork()
            if pid == 0:  # a consumer: time its lock waits and holds, then drain the queue
                waited = held = 0.0
                calls = 0
                take, enter, leave = (
                    writer_module.Writer._take_shared_lock,
                    writer_module._Hold.__enter__,
                    writer_module._Hold.__exit__,
                )
                hold_started = [0.0]

                def timed_take(self: Any) -> None:
                    nonlocal waited
                    t = time.perf_counter()
                    take(self)
                    waited += time.perf_counter() - t

                def timed_enter(self: Any) -> None:
                    nonlocal calls
                    calls += 1
                    enter(self)
                    hold_started[0] = time.perf_counter()

                def timed_leave(self: Any, *exc: Any) -> None:
                    nonlocal held
                    held += time.perf_counter() - hold_started[0]
                    leave(self, *exc)

                writer_module.Writer._take_shared_lock = timed_take
                writer_module._Hold.__enter__ = timed_enter
                writer_module._Hold.__exit__ = timed_leave
                broker = Broker(root, sync=args.sync)
                queue = broker.queue("q", create=False)
                start.wait()
                usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                received = consume(queue, args)
                after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
                broker.close()
                system = after.ru_stime - usage.ru_stime
                cpu = after.ru_utime - usage.ru_utime + system
                results.put((received, cpu, wall, waited, held, calls, system))
                os._exit(0)
            children.append(pid)
        start.wait()
        done = [results.get() for _ in children]
        for pid in children:
            os.waitpid(pid, 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    received = sum(r[0] for r in done)
    if received != args.messages:
        raise AssertionError(f"received {received} of {args.messages}")
    cpu, wall = sum(r[1] for r in done), max(r[2] for r in done)
    calls = sum(r[5] for r in done)
    return (
        f"{args.processes} processes, receive({args.batch}) + {'delete= (loop)' if args.loop else 'delete'}, "
        f"sync={args.sync}: {received / wall:,.0f} msg/s, CPU {cpu * 1e6 / received:.2f} µs/message "
        f"(all processes; system {sum(r[6] for r in done) * 1e6 / received:.2f}); per locked call: "
        f"waited {sum(r[3] for r in done) * 1e6 / calls:.0f} µs, "
        f"held {sum(r[4] for r in done) * 1e6 / calls:.0f} µs ({calls:,} calls)"
    )


def run_once(args: argparse.Namespace, profiler: cProfile.Profile | None) -> tuple[float, float]:
    """Fill a scratch queue, then receive and delete it all (under ``profiler`` when given);
    returns the CPU time (user + system) of the receiving and deleting, and its system part."""
    root = fill(args)
    try:
        broker = Broker(root, sync=args.sync)
        queue = broker.queue("q", create=False)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if profiler is not None:
            profiler.enable()
        received = consume(queue, args)
        if profiler is not None:
            profiler.disable()
        after = resource.getrusage(resource.RUSAGE_SELF)
        broker.close()
        if received != args.messages:
            raise AssertionError(f"received {received} of {args.messages}")
        system = after.ru_stime - usage.ru_stime
        return after.ru_utime - usage.ru_utime + system, system
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
