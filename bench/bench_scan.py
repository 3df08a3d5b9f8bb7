"""scan: how fast a Scanner reads a whole journal of keyless 100-byte messages (page cache warm).

* iterating ``Scanner(dir)`` (one ``Message`` at a time), and calling ``read_batch()``;
* baseline: a plain decoding loop over the same bytes: each segment file read whole, the header
  fields taken with ``struct.unpack_from``, key and value sliced, one tuple per message.

Timed: opening the scanner and reading every message (the figure includes the open).
"""

from __future__ import annotations

import struct
import time

from harness import Context, Result, best_rate, cached_journal, segment_files
from journalq.journal import Scanner

AIM = 600_000
HEAD = struct.Struct(">QqBb")
INT32 = struct.Struct(">i")


def plain_decode(path) -> tuple[int, int]:
    """Decode every message of every segment into tuples; (messages, last offset)."""
    unpack_head, unpack_int = HEAD.unpack_from, INT32.unpack_from
    count, last = 0, -1
    for segment in segment_files(path):
        with open(segment, "rb") as f:
            buf = f.read()
        messages = []
        append = messages.append
        pos, end = 0, len(buf)
        while pos < end:
            offset, timestamp_ns, type_, key_len = unpack_head(buf, pos)
            key_end = pos + 18 + key_len
            (value_len,) = unpack_int(buf, key_end)
            value_end = key_end + 4 + value_len
            append((offset, timestamp_ns, type_, buf[pos + 18 : key_end], buf[key_end + 4 : value_end]))
            pos = value_end + 4
        count += len(messages)
        if messages:
            last = messages[-1][0]
    return count, last


def run(ctx: Context) -> list[Result]:
    total = 100_000 if ctx.quick else 1_000_000
    path = cached_journal(ctx, total)

    def iterate() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with Scanner(path) as scanner:
            for message in scanner:
                n += 1
        seconds = time.perf_counter() - started
        assert n == total and message.offset == total - 1, (n, message.offset)
        return n, seconds

    def batches() -> tuple[int, float]:
        started = time.perf_counter()
        n = 0
        with Scanner(path) as scanner:
            while batch := scanner.read_batch():
                n += len(batch)
        seconds = time.perf_counter() - started
        assert n == total and batch == [] and scanner.offset == total, (n, scanner.offset)
        return n, seconds

    def baseline() -> tuple[int, float]:
        started = time.perf_counter()
        n, last = plain_decode(path)
        seconds = time.perf_counter() - started
        assert n == total and last == total - 1, (n, last)
        return n, seconds

    ctx.log(f"  scan: {total:,} messages, best of {ctx.repeat}")
    base, base_runs = best_rate(ctx.repeat, baseline)
    results = []
    for case, fn in (("Scanner, iterating", iterate), ("Scanner.read_batch()", batches)):
        best, runs = best_rate(ctx.repeat, fn)
        results.append(
            Result(
                "scan",
                f"{case} ({total:,} messages)",
                best,
                "msg/s",
                f"best of {ctx.repeat}",
                "plain unpack_from loop",
                base,
                aim=f">= {AIM:,} msg/s",
                aim_met=best >= AIM,
                extra={
                    "messages": total,
                    "runs": [round(r) for r in runs],
                    "baseline_runs": [round(r) for r in base_runs],
                },
            )
        )
    return results
