"""append: how fast a Writer stores keyless 100-byte messages.

* ``append_many`` in batches of 1,000 and 10,000 (sync "none", default segment size), against the
  fastest pure-Python encoder of the same bytes: one ``Struct.pack_into`` per message into a
  preallocated ``bytearray``, then one ``write`` of it all.
* single ``append()`` calls, against ``struct.pack`` + ``os.write`` per message.
* ``sync="always"`` single appends, against ``os.write`` + ``os.fdatasync`` per message on one
  file (the writer syncs with ``fdatasync`` too).

Timed: the appends only; opening and closing the writer (close syncs) are outside. The segment
roll inside a run (64 MiB segments; 1,000,000 messages make two) syncs the full segment, as sej
does, and is inside.
"""

from __future__ import annotations

import os
import struct
import time
from itertools import cycle
from pathlib import Path

from harness import MESSAGE_SIZE, VALUE_SIZE, Context, Result, best_rate, rate, segment_files, values
from journalq.journal import Writer

MESSAGE = struct.Struct(f">QqBbi{VALUE_SIZE}si")  # offset, timestamp, type, key len, value len, value, size
AIM = 1_000_000


def encode_fast(first_offset: int, timestamp_ns: int, pool: list[bytes], count: int) -> bytearray:
    """The fastest pure-Python encoder we found for these bytes (see bench/README.md)."""
    buf = bytearray(count * MESSAGE_SIZE)
    pack_into = MESSAGE.pack_into
    for i, value in zip(range(count), cycle(pool)):
        pack_into(buf, i * MESSAGE_SIZE, first_offset + i, timestamp_ns, 0, 0, VALUE_SIZE, value, MESSAGE_SIZE)
    return buf


def _check_same_bytes(journal: Path, pool: list[bytes]) -> None:
    """The baseline encodes exactly what the writer wrote (first batch, same timestamp)."""
    with open(segment_files(journal)[0], "rb") as f:
        head = f.read(len(pool) * MESSAGE_SIZE)
    timestamp_ns = struct.unpack_from(">q", head, 8)[0]
    if bytes(encode_fast(0, timestamp_ns, pool, len(pool))) != head:
        raise AssertionError("the baseline encoder does not produce the writer's bytes")


def run(ctx: Context) -> list[Result]:
    total = 200_000 if ctx.quick else 1_000_000
    results = []
    for batch in (1_000, 10_000):
        pool = values(batch, seed=batch)
        batches = total // batch
        checked = False

        def journalq_run() -> tuple[int, float]:
            nonlocal checked
            path = ctx.scratch("append")
            writer = Writer(path, sync="none")
            try:
                append_many = writer.append_many
                started = time.perf_counter()
                for _ in range(batches):
                    append_many(pool)
                seconds = time.perf_counter() - started
            finally:
                writer.close()
            if not checked:
                _check_same_bytes(path, pool)
                checked = True
            return batches * batch, seconds

        def baseline_run() -> tuple[int, float]:
            path = ctx.scratch("append-baseline")
            with open(path, "wb", buffering=0) as f:
                started = time.perf_counter()
                data = encode_fast(0, time.time_ns(), pool, batches * batch)
                written = f.write(data)
                seconds = time.perf_counter() - started
                assert written == len(data)
                os.fdatasync(f.fileno())  # outside the timing, as the writer's close
            return batches * batch, seconds

        ctx.log(f"  append_many x{batch:,}: {total:,} messages, best of {ctx.repeat}")
        best, runs = best_rate(ctx.repeat, journalq_run)
        base, base_runs = best_rate(ctx.repeat, baseline_run)
        results.append(
            Result(
                "append",
                f"append_many, batches of {batch:,} (sync none)",
                best,
                "msg/s",
                f"best of {ctx.repeat}",
                "pack_into + 1 write",
                base,
                aim=f">= {AIM:,} msg/s",
                aim_met=best >= AIM,
                figure=f"{rate(best)}, {best * MESSAGE_SIZE / 1e6:.0f} MB/s",
                extra={
                    "messages": batches * batch,
                    "batch": batch,
                    "mb_per_s": round(best * MESSAGE_SIZE / 1e6, 1),
                    "runs": [round(r) for r in runs],
                    "baseline_runs": [round(r) for r in base_runs],
                    "baseline_mb_per_s": round(base * MESSAGE_SIZE / 1e6, 1),
                },
            )
        )

    # Single appends: one write per message, sync none.
    single = 20_000 if ctx.quick else 100_000
    pool = values(1000, seed=1000)

    def single_run() -> tuple[int, float]:
        path = ctx.scratch("append-single")
        writer = Writer(path, sync="none")
        try:
            append = writer.append
            started = time.perf_counter()
            for _, value in zip(range(single), cycle(pool)):
                append(value)
            seconds = time.perf_counter() - started
        finally:
            writer.close()
        return single, seconds

    def single_baseline() -> tuple[int, float]:
        path = ctx.scratch("append-single-baseline")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            pack, write, now = MESSAGE.pack, os.write, time.time_ns
            started = time.perf_counter()
            for offset, value in zip(range(single), cycle(pool)):
                write(fd, pack(offset, now(), 0, 0, VALUE_SIZE, value, MESSAGE_SIZE))
            seconds = time.perf_counter() - started
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return single, seconds

    ctx.log(f"  append() single: {single:,} messages, best of {ctx.repeat}")
    best, runs = best_rate(ctx.repeat, single_run)
    base, base_runs = best_rate(ctx.repeat, single_baseline)
    results.append(
        Result(
            "append",
            "append() one by one (sync none)",
            best,
            "msg/s",
            f"best of {ctx.repeat}",
            "pack + os.write each",
            base,
            figure=f"{rate(best)}, {best * MESSAGE_SIZE / 1e6:.1f} MB/s",
            extra={
                "messages": single, "runs": [round(r) for r in runs], "baseline_runs": [round(r) for r in base_runs]
            },
        )
    )

    # Durable single appends: one fdatasync per message.
    durable = 200 if ctx.quick else 1000

    def durable_run() -> tuple[int, float]:
        path = ctx.scratch("append-always")
        writer = Writer(path, sync="always")
        try:
            append = writer.append
            started = time.perf_counter()
            for _, value in zip(range(durable), cycle(pool)):
                append(value)
            seconds = time.perf_counter() - started
        finally:
            writer.close()
        return durable, seconds

    def durable_baseline() -> tuple[int, float]:
        path = ctx.scratch("append-always-baseline")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            pack, write, now, sync = MESSAGE.pack, os.write, time.time_ns, os.fdatasync
            started = time.perf_counter()
            for offset, value in zip(range(durable), cycle(pool)):
                write(fd, pack(offset, now(), 0, 0, VALUE_SIZE, value, MESSAGE_SIZE))
                sync(fd)
            seconds = time.perf_counter() - started
        finally:
            os.close(fd)
        return durable, seconds

    ctx.log(f"  append() sync always: {durable:,} messages, best of {ctx.repeat}")
    best, runs = best_rate(ctx.repeat, durable_run)
    base, base_runs = best_rate(ctx.repeat, durable_baseline)
    results.append(
        Result(
            "append",
            'append() one by one, sync="always"',
            best,
            "msg/s",
            f"best of {ctx.repeat}",
            "write + fdatasync each",
            base,
            figure=f"{rate(best)} ({1000 / best:.3f} ms each)",
            extra={
                "messages": durable, "runs": [round(r) for r in runs], "baseline_runs": [round(r) for r in base_runs]
            },
        )
    )
    return results
