"""follow: how soon a follower in another process sees a message after it is appended.

A writer process appends one message at a time (``Writer.append``, sync none) every 2 ms; a follower
process iterates ``Scanner(dir, follow=True, timeout=...)`` and records, for each message,
``time.time_ns()`` on receipt minus the message's timestamp (which ``append`` takes from
``time.time_ns()`` just before writing). The first 20 messages of each round are dropped (warm-up).

Baseline, the operating system's floor for the same thing: a sender process writes its
``time.time_ns()`` into a pipe at the same pace, a receiver blocked in ``read`` records the same
difference (and echoes a byte back, which gives the round trip, shown for information).

Information: the same follower polling instead of waiting for notification (``Scanner`` without
follow, read to the end, then ``time.sleep(0.001)``).

Each figure (median, p90, p99) is the median over ``repeat`` rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import Context, Result, ms, summarize

CHILD = str(Path(__file__).resolve().parent / "follow_child.py")
INTERVAL = 0.002
WARMUP = 20
AIM_MS = 1.0


def start(role: str, *args: object, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, CHILD, role, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=pass_fds,
    )
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise RuntimeError(f"{role} process did not start: {line!r}")
    return process


def collect(receiver: subprocess.Popen[str], sender: subprocess.Popen[str], limit: float) -> tuple[list, list]:
    time.sleep(0.2)  # let the receiver settle into its wait
    sender.stdin.write("go\n")
    sender.stdin.flush()
    out, _ = receiver.communicate(timeout=limit)
    sent, _ = sender.communicate(timeout=limit)
    if receiver.returncode or sender.returncode:
        raise RuntimeError(f"follow processes failed ({receiver.returncode}, {sender.returncode})")
    return json.loads(out), (json.loads(sent) if sent.strip() else [])


def journal_round(ctx: Context, role: str, count: int) -> list[float]:
    path = ctx.scratch(f"follow-{role}")
    writer = start("writer", path, count, INTERVAL)
    try:
        reader = start(role, path, count, 5)
    except BaseException:
        writer.kill()
        raise
    latencies, _ = collect(reader, writer, count * INTERVAL + 60)
    if len(latencies) != count:
        raise RuntimeError(f"{role} received {len(latencies)} of {count} messages")
    return [ns / 1e6 for ns in latencies[WARMUP:]]


def pipe_round(count: int) -> tuple[list[float], list[float]]:
    forward_r, forward_w = os.pipe()
    back_r, back_w = os.pipe()
    try:
        receiver = start("pipe-receiver", forward_r, back_w, count, pass_fds=(forward_r, back_w))
        sender = start("pipe-sender", forward_w, back_r, count, INTERVAL, pass_fds=(forward_w, back_r))
    finally:
        for fd in (forward_r, forward_w, back_r, back_w):
            os.close(fd)
    one_way, round_trips = collect(receiver, sender, count * INTERVAL + 60)
    return [ns / 1e6 for ns in one_way[WARMUP:]], [ns / 1e6 for ns in round_trips[WARMUP:]]


def run(ctx: Context) -> list[Result]:
    count = 500 if ctx.quick else 2000
    ctx.log(
        f"  follow: {ctx.repeat} rounds of {count:,} messages every {INTERVAL * 1000:g} ms "
        f"(~{ctx.repeat * 3 * count * INTERVAL:.0f} s)"
    )
    notified, polled, one_way, round_trip = [], [], [], []
    for _ in range(ctx.repeat):
        notified.append(journal_round(ctx, "follower", count))
        polled.append(journal_round(ctx, "poller", count))
        pipe, trips = pipe_round(count)
        one_way.append(pipe)
        round_trip.append(trips)

    base = summarize(one_way)
    stat = f"median of {ctx.repeat} rounds x {count - WARMUP:,}"

    def row(case: str, stats: dict[str, float], **kw) -> Result:
        return Result(
            "follow",
            case,
            stats["median"],
            "ms",
            stat,
            figure=f"median {ms(stats['median'])}, p90 {ms(stats['p90'])}, p99 {ms(stats['p99'])}",
            extra={
                "messages_per_round": count,
                "interval_ms": INTERVAL * 1000,
                **{f"{k}_ms": round(v, 4) for k, v in stats.items()},
            },
            **kw,
        )

    follow = summarize(notified)
    return [
        row(
            "Scanner(follow=True), append every 2 ms",
            follow,
            baseline_name="pipe one-way",
            baseline_value=base["median"],
            aim=f"median <= {AIM_MS:g} ms",
            aim_met=follow["median"] <= AIM_MS,
        ),
        row(
            "info: follower polling, sleep(0.001)", summarize(polled),
            baseline_name="pipe one-way", baseline_value=base["median"],
        ),
        row("baseline: pipe one-way (OS floor)", base),
        row("info: pipe round trip", summarize(round_trip)),
    ]
