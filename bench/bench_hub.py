"""hub: replication to a hub, against appending the same messages locally, in the same run.

The hub runs as a subprocess (``journalq hub serve``, sync "always": every push is synced before
it is answered), on loopback; the client is ``journalq.hub.client.Pusher`` in this process.

* Throughput: pushing a journal of keyless 100-byte messages (200,000; 1,000,000 without
  ``--quick``) to an empty hub, in pushes of 1 MiB (the default chunk), timed from the first
  request to the last answer: messages/s and MB/s of the journal's bytes. Baseline:
  ``Writer.append_many`` of the same messages locally, in batches as large as a push (8,322
  messages, 1 MiB) with sync "always", so both sides promise the same: on stable storage.
* Lag: a steady writer appends batches of 20 messages every 5 ms (4,000 msg/s) for 5 s (3 s with
  ``--quick``) to a local journal (sync "none", as an application's journal would), while the
  pusher follows it (inotify wakes it); the lag of a batch is the time from its append returning
  to the hub's answer that holds it. Median, p90, p99 over the batches; each the median over the
  rounds. Baseline: the time the same batch takes to append locally with sync "always" (the
  latency a writer would see storing it durably itself, on this disk).
"""

from __future__ import annotations

import sys
import threading
import time
from bisect import bisect_right
from pathlib import Path

from bench_server import Server, _free_port
from harness import MESSAGE_SIZE, Context, Result, best_rate, ms, rate, summarize, values

import journalq
from journalq.hub.client import DEFAULT_CHUNK, HubClient, Pusher
from journalq.hub.protocol import Push, PushResult
from journalq.journal import Writer

SRC = str(Path(journalq.__file__).resolve().parents[1])
BATCH = DEFAULT_CHUNK // MESSAGE_SIZE  # the messages of one push
STEADY_BATCH, STEADY_EVERY = 20, 0.005
THROUGHPUT_AIM = 0.25  # of local durable appends: the hub adds a hop, a check and a sync per push
LAG_AIM_MS = 50.0


class _TimedClient(HubClient):
    """A HubClient that notes when each push was answered and what the hub then held."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.acks: list[tuple[int, float]] = []

    def push(self, push: Push) -> PushResult:
        result = super().push(push)
        self.acks.append((result.held.next, time.perf_counter()))
        return result


def _hub(ctx: Context, name: str) -> Server:
    root = ctx.scratch(f"hub-{name}")
    port = _free_port()
    code = f"import sys; sys.path.insert(0, {SRC!r}); from journalq.cli.main import main; main()"
    command = [sys.executable, "-c", code, "hub", "serve", "--root", str(root), "--port", str(port)]
    return Server("journalq-hub", command, ctx.scratch_dir / f"hub-{name}.log", port)


def run(ctx: Context) -> list[Result]:
    ctx.scratch_dir.mkdir(parents=True, exist_ok=True)
    total = 200_000 if ctx.quick else 1_000_000
    pool = values(BATCH, seed=3)
    batches = [pool[: min(BATCH, total - done)] for done in range(0, total, BATCH)]
    source = ctx.scratch("hub-source")
    with Writer(source) as writer:
        for batch in batches:
            writer.append_many(batch)

    rounds = 0

    def replicate() -> tuple[int, float]:
        nonlocal rounds
        rounds += 1
        hub = _hub(ctx, f"throughput-{rounds}")
        hub.start()
        try:
            with HubClient(hub.endpoint) as client, Pusher(client, "bench", [source]) as pusher:
                started = time.perf_counter()
                (copy,) = pusher.run()
                seconds = time.perf_counter() - started
            assert copy.failed is None and copy.hub_next == total, copy
        finally:
            hub.stop()
        return total, seconds

    def append_locally() -> tuple[int, float]:
        path = ctx.scratch("hub-local")
        with Writer(path, sync="always") as writer:
            started = time.perf_counter()
            for batch in batches:
                writer.append_many(batch)
            seconds = time.perf_counter() - started
        return total, seconds

    ctx.log(f"  replication of {total:,} messages in pushes of {BATCH:,} vs local append_many "
            f"(sync always), best of {ctx.repeat}")
    best, runs = best_rate(ctx.repeat, replicate)
    base, base_runs = best_rate(ctx.repeat, append_locally)
    results = [
        Result(
            "hub", f"push to a hub on loopback, pushes of {BATCH:,} (1 MiB), hub syncs each", best, "msg/s",
            f"best of {ctx.repeat}", "Writer.append_many locally, same batches, sync always", base,
            aim=f">= {THROUGHPUT_AIM:g}x local", aim_met=best >= THROUGHPUT_AIM * base,
            figure=f"{rate(best)}, {best * MESSAGE_SIZE / 1e6:.0f} MB/s",
            extra={"messages": total, "mb_per_s": round(best * MESSAGE_SIZE / 1e6, 1),
                   "baseline_mb_per_s": round(base * MESSAGE_SIZE / 1e6, 1),
                   "runs": [round(r) for r in runs], "baseline_runs": [round(r) for r in base_runs]},
        )
    ]

    seconds = 3.0 if ctx.quick else 5.0
    lag_rounds: list[list[float]] = []
    local_rounds: list[list[float]] = []
    for n in range(ctx.repeat):
        lags, local = _steady_round(ctx, n, seconds)
        lag_rounds.append(lags)
        local_rounds.append(local)
    lag, local = summarize(lag_rounds), summarize(local_rounds)
    steady_rate = STEADY_BATCH / STEADY_EVERY
    ctx.log(f"  lag: median {ms(lag['median'])}, p99 {ms(lag['p99'])}; "
            f"local durable append: median {ms(local['median'])}")
    results.append(
        Result(
            "hub",
            f"lag of a steady writer ({steady_rate:,.0f} msg/s in batches of {STEADY_BATCH}), append to hub answer",
            lag["median"], "ms", f"median of {ctx.repeat} rounds", "the batch appended locally, sync always",
            local["median"], aim=f"median < {LAG_AIM_MS:g} ms", aim_met=lag["median"] < LAG_AIM_MS,
            figure=f"{ms(lag['median'])} (p90 {ms(lag['p90'])}, p99 {ms(lag['p99'])})",
            extra={"lag_ms": {k: round(v, 3) for k, v in lag.items()},
                   "baseline_ms": {k: round(v, 3) for k, v in local.items()}, "seconds": seconds},
        )
    )
    return results


def _steady_round(ctx: Context, n: int, seconds: float) -> tuple[list[float], list[float]]:
    """Lags (ms) of every batch a steady writer appends while a pusher follows, and the times
    (ms) the same batches take to append locally with sync always."""
    source = ctx.scratch(f"hub-steady-{n}")
    batch = values(STEADY_BATCH, seed=n)
    with Writer(source) as writer:
        writer.append_many(batch)  # the journal exists before the pusher looks for it
    hub = _hub(ctx, f"lag-{n}")
    hub.start()
    appended: list[tuple[int, float]] = []  # (offset after the batch, when its append returned)
    stop = threading.Event()
    try:
        client = _TimedClient(hub.endpoint)
        with client, Pusher(client, "bench", [source]) as pusher:
            pusher.run()  # caught up with the first batch
            follower = threading.Thread(target=pusher.run, kwargs={"follow": True, "stop": stop.is_set})
            follower.start()
            try:
                with Writer(source) as writer:
                    started = time.perf_counter()
                    due = started
                    while due - started < seconds:
                        writer.append_many(batch)
                        appended.append((writer.next_offset, time.perf_counter()))
                        due += STEADY_EVERY
                        time.sleep(max(0.0, due - time.perf_counter()))
                deadline = time.perf_counter() + 30
                while (not client.acks or client.acks[-1][0] < appended[-1][0]) and time.perf_counter() < deadline:
                    time.sleep(0.01)
            finally:
                stop.set()
                follower.join()
    finally:
        hub.stop()
    acked = [next_ for next_, _ in client.acks]
    lags = []
    for next_offset, at in appended:
        i = bisect_right(acked, next_offset - 1)  # the first answer holding the whole batch
        if i == len(acked):
            raise RuntimeError(f"the hub never held offset {next_offset - 1}")
        lags.append((client.acks[i][1] - at) * 1000)
    local = []
    path = ctx.scratch(f"hub-steady-local-{n}")
    with Writer(path, sync="always") as writer:
        for _ in range(min(len(appended), 400)):
            t = time.perf_counter()
            writer.append_many(batch)
            local.append((time.perf_counter() - t) * 1000)
    return lags, local
