"""Instructions per message of journalq's receive + delete, counted by valgrind (not part of run.py).

    .venv/bin/python bench/count_instructions.py [--messages N] [--batch B] [--loop] [--shards S] [--sync none|always]

The shared machines this project is measured on change speed by half from one minute to the next
(the same consumer loop: 156 k msg/s at one time, 94-102 k a quarter of an hour later), which hides
a change of a few per cent in any timing. An instruction count does not move: valgrind's callgrind
counts the user-space instructions of one consumer process (not the kernel's: a system call counts
as its few instructions of C), and two counts of the same code agree to within 0.01 %. Weigh a
change to the receive path here first, then confirm it with timings (``profile_receive.py --cpu``,
the benchmark): fewer instructions are not always less time (cache misses, system calls).

A queue is filled in a scratch directory (not counted). A consumer process starts under valgrind
with its instrumentation off, opens the queue (with ``--shards``, its home shard's channel too) and
says it is ready; the instrumentation is switched on (``callgrind_control``) for its receive and
delete loop, as ``profile_receive.py`` runs it, and off after. With ``--shards``, the one consumer
drains every shard, its home first. Run the code of another tree with ``PYTHONPATH=TREE/src``.
Needs valgrind (``apt install valgrind``); a run of 10,000 messages takes about ten seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from profile_receive import add_workload_options, consume, fill

from journalq.queue import Broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_options(parser, messages=10_000, batch=10)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--child", metavar="ROOT", help=argparse.SUPPRESS)  # the consumer, under valgrind
    args = parser.parse_args()
    if args.child:
        return consumer(Path(args.child), args)
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"{' and '.join(missing)} not found: install valgrind (apt install valgrind)")
    root = fill(args, args.shards)
    try:
        instructions, received = count(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    api = f"receive({args.batch}, delete=...) loop" if args.loop else f"receive({args.batch}) + delete"
    print(
        f"{api}, sync={args.sync}, {args.shards} shard(s): {instructions / received:,.0f} instructions per "
        f"message ({instructions:,} for {received:,} messages)"
    )
    return 0


def count(root: Path, args: argparse.Namespace) -> tuple[int, int]:
    """Run the consumer under callgrind, counting its loop alone: (instructions, messages)."""
    out = Path(os.environ["CALLGRIND_OUT"]) if os.environ.get("CALLGRIND_OUT") else root / "callgrind.out"
    options = ["--messages", str(args.messages), "--sync", args.sync, "--batch", str(args.batch)]
    options += ["--loop"] if args.loop else []
    child = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, __file__, "--child", str(root), *options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict layouts in every run
    )
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the consumer under valgrind did not start")
        switch(child.pid, "on")
        child.stdin.write("go\n")
        child.stdin.flush()
        received = int(child.stdout.readline())
        switch(child.pid, "off")
        child.stdin.write("end\n")
        child.stdin.flush()
        if child.wait(timeout=600):
            raise RuntimeError(f"the consumer under valgrind failed with exit status {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    totals = next(line for line in out.read_text().splitlines() if line.startswith("totals:"))
    return int(totals.split()[1]), received


def switch(pid: int, state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def consumer(root: Path, args: argparse.Namespace) -> int:
    """The process counted: open the queue, say ready, drain it on "go", say how many."""
    broker = Broker(root, sync=args.sync)
    queue = broker.queue("q", create=False)
    if queue.settings.shards > 1:
        queue._channel(queue.home)  # opened out of the count, as a consumer that has run a while
    print("ready", flush=True)
    sys.stdin.readline()
    print(consume(queue, args), flush=True)
    sys.stdin.readline()
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
