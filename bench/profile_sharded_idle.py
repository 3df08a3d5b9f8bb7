"""What a sharded consumer costs on a drained queue (not part of run.py).

    .venv/bin/python bench/profile_sharded_idle.py [--shards N] [--wait SECONDS] [--repeat R]

Fills a queue of N shards (default 1,024) in a scratch directory with 2N messages and drains it,
then, with a new broker: the CPU and wall time of opening the queue and its first empty
``receive(10)``, of each later empty ``receive(10)``, and of one ``receive(10, wait=SECONDS)``
that gets nothing (a long poll: what it costs to sit idle), and the files the process holds after
it. The scratch directory is deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
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


def clocks() -> tuple[float, float]:
    """Wall and CPU time now (seconds)."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    """Wall and CPU seconds since ``start`` (``clocks()``)."""
    wall, cpu = clocks()
    return wall - start[0], cpu - start[1]


def run_once(shards: int, wait: float) -> str:
    (HERE / ".data").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="profile-sharded-idle-", dir=HERE / ".data"))
    try:
        with Broker(root, sync="none") as broker:
            queue = broker.queue("q", shards=shards)
            queue.send_many([b"x"] * (2 * shards))
            while got := queue.receive(10):
                queue.delete_many([m.receipt for m in got])
        with Broker(root, sync="none") as broker:
            start = clocks()
            queue = broker.queue("q", create=False)
            queue.receive(10)
            first = since(start)
            start = clocks()
            for _ in range(10):
                queue.receive(10)
            later = since(start)
            start = clocks()
            queue.receive(10, wait=wait)
            idle = since(start)
            files = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return (
        f"{shards} shards: open + first empty receive {first[0] * 1e3:.1f} ms (CPU {first[1] * 1e3:.1f}); "
        f"each later empty receive {later[0] * 1e2:.2f} ms (CPU {later[1] * 1e2:.2f}); "
        f"receive(wait={wait:g}) with nothing: {idle[0]:.2f} s, CPU {idle[1] * 1e3:.1f} ms; "
        f"files held {files}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=1024)
    parser.add_argument("--wait", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.repeat):
        print(run_once(args.shards, args.wait), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
