"""Run journalq's benchmarks: ``bench/run.py [--quick] [--repeat N] [NAME ...]``.

Names: append, scan, seek, follow, channels, receive, fifo, server, consumers, shard, shard-queue, spark, zookeeper,
hub
(all by default). Prints a table
(figure, baseline measured in the same run, ratio, aim), then one JSON object per result, one per
line, for machines. Progress goes to stderr. See bench/README.md for what each benchmark measures and why.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import journalq  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(HERE.parent / "src"))

import bench_append  # noqa: E402
import bench_consumers  # noqa: E402
import bench_fifo  # noqa: E402
import bench_follow  # noqa: E402
import bench_hub  # noqa: E402
import bench_queue  # noqa: E402
import bench_scan  # noqa: E402
import bench_seek  # noqa: E402
import bench_spark  # noqa: E402
import bench_server  # noqa: E402
import bench_shard  # noqa: E402
import bench_shard_queue  # noqa: E402
import bench_zookeeper  # noqa: E402
from harness import Context, Result, cpu_note, remove, table  # noqa: E402

BENCHMARKS = {
    "append": bench_append.run,
    "scan": bench_scan.run,
    "seek": bench_seek.run,
    "follow": bench_follow.run,
    "channels": bench_queue.run_channels,
    "receive": bench_queue.run_receive,
    "fifo": bench_fifo.run,
    "server": bench_server.run,
    "consumers": bench_consumers.run,
    "shard": bench_shard.run,
    "shard-queue": bench_shard_queue.run,
    "hub": bench_hub.run,
    "spark": bench_spark.run,
    "zookeeper": bench_zookeeper.run,
}

GO_CONTEXT = (
    "For context: the Go reference implementation (h12.io/sej) writes 1.9 million and reads 1.2 million\n"
    "such messages (keyless, 100-byte values) per second on this machine (figures given, not measured here)."
)
CONTEXTS = {  # printed after the table when their benchmark ran
    "append": GO_CONTEXT,
    "scan": GO_CONTEXT,
    "channels": bench_queue.CHANNELS_CONTEXT,
    "receive": bench_queue.RECEIVE_CONTEXT,
    "server": bench_server.SERVER_CONTEXT,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (and no 10**7 journal)")
    parser.add_argument("--repeat", type=int, default=3, help="runs (or rounds) per measurement (default 3)")
    parser.add_argument(
        "--data", type=Path, default=HERE / ".data", help="where journals are cached (default bench/.data)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    names = args.names or list(BENCHMARKS)

    scratch = args.data / "scratch"
    ctx = Context(quick=args.quick, repeat=args.repeat, data_dir=args.data, scratch_dir=scratch)
    args.data.mkdir(parents=True, exist_ok=True)
    ctx.log(f"journalq benchmarks: {', '.join(names)}{' (quick)' if args.quick else ''}; {cpu_note()}")
    results: list[Result] = []
    started = time.perf_counter()
    try:
        for name in names:
            t = time.perf_counter()
            ctx.log(f"{name}:")
            results.extend(BENCHMARKS[name](ctx))
            ctx.log(f"  ({time.perf_counter() - t:.0f} s)")
    finally:
        remove(scratch)

    print()
    print(
        f"journalq benchmarks ({'quick' if args.quick else 'full'}), Python {platform.python_version()}, "
        f"{cpu_note()}, {time.perf_counter() - started:.0f} s"
    )
    print("ratio = figure / baseline; throughputs: best of the runs; latencies: median over the rounds.")
    print()
    print(table(results))
    print()
    for context in dict.fromkeys(CONTEXTS[n] for n in names if n in CONTEXTS):
        print(context)
        print()
    for result in results:
        print(result.to_json(args.quick))
    return 0  # a missed aim is reported, not an error: these machines are noisy


if __name__ == "__main__":
    sys.exit(main())
