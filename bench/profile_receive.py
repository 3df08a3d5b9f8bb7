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
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import journalq  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

from journalq.queue import Broker  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--sync", default="none", choices=("none", "always"))
    parser.add_argument("--batch", type=int, default=1, help="receive(B) + delete_many (default 1: delete)")
    parser.add_argument("--loop", action="store_true", help="receive(B, delete=last round's receipts)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--cpu", action="store_true", help="no profiler: print the CPU time per message and per call (best of --repeat)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs with --cpu (the least CPU time is printed)")
    args = parser.parse_args()
    if args.cpu:
        best = min(run_once(args, None) for _ in range(args.repeat))
        calls = -(-args.messages // args.batch)
        print(
            f"receive({args.batch}) + {'delete= (loop)' if args.loop else 'delete'}, sync={args.sync}, "
            f"{args.messages:,} messages: CPU {best * 1e6 / args.messages:.2f} µs/message, "
            f"{best * 1e6 / calls:.1f} µs per round (best of {args.repeat})"
        )
        return 0
    profiler = cProfile.Profile()
    started = time.perf_counter()
    run_once(args, profiler)
    seconds = time.perf_counter() - started
    received = args.messages
    print(
        f"{received:,} messages, receive({args.batch}) + {'delete= (loop)' if args.loop else 'delete'}, sync={args.sync}: "
        f"{seconds:.2f} s under the profiler ({received / seconds:,.0f} msg/s)\n"
    )
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


def run_once(args: argparse.Namespace, profiler: cProfile.Profile | None) -> float:
    """Fill a scratch queue, then receive and delete it all (under ``profiler`` when given);
    returns the CPU time (user + system) of the receiving and deleting."""
    (HERE / ".data").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="profile-receive-", dir=HERE / ".data"))
    try:
        with Broker(root, sync="none") as broker:
            queue = broker.queue("q")
            for i in range(0, args.messages, 1000):
                queue.send_many([b"%010d" % n + bytes(90) for n in range(i, min(i + 1000, args.messages))])
        broker = Broker(root, sync=args.sync)
        queue = broker.queue("q", create=False)
        received = 0
        cpu = time.process_time()
        if profiler is not None:
            profiler.enable()
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
        if profiler is not None:
            profiler.disable()
        cpu = time.process_time() - cpu
        broker.close()
        if received != args.messages:
            raise AssertionError(f"received {received} of {args.messages}")
        return cpu
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
