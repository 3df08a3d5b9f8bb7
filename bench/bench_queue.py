"""channels and receive: the work queues (``journalq.queue``) against the designs they replace.

channels (sq's experiment): 5,000 messages of 4 KiB sent to a topic with 0, 5 and 10 channels,
one by one with ``Topic.send`` and in batches of 100 with ``Topic.send_many``, with
``sync="always"`` and ``sync="none"``. The channels are made with ``topic.channel("cN")`` and each
has received once (from the empty topic) before the sends, so each exists on disk with its state
journal. A channel refers to the topic's messages by offset, so the time must not grow with
channels. Baseline, in the same run: the naive design sq improved on (NSQ's: every channel gets
its own copy of each message), emulated as one ``journalq.journal.Writer`` per channel plus the
topic's, each appended the message (shared writers, like the topic's, with the same sync policy).
Timed: the sends only. Each figure is the best (least) time of ``repeat`` runs, run interleaved
(0, 5, 10 channels, then again); every run is in the JSON.

receive: receive + delete of the same N messages (100-byte bodies) by one process and by four
processes sharing them, with every change synced (``Broker(root, sync="always")``) and not
(``sync="none"``), one message at a time (``receive(1)`` + ``delete``) and in batches
(``receive(10)`` + ``delete_many``), and beside each the consumer loop (``receive(1 or 10,
delete=receipts of the last round)``: the deletes of one round go with the next receive: one lock,
one write, one sync), against

* persist-queue's ``SQLiteAckQueue`` (``get()`` + ``ack()``): with sync its durable defaults (WAL,
  synchronous=FULL, auto_commit); without, ``PRAGMA synchronous=OFF`` on its connection. It has no
  batch receive (10 ``get()`` then 10 ``ack()``), its acked rows are cleared every 1,000 acks
  (``clear_acked_data``; without, ``get()`` scans past them and is twice as slow), and with four
  processes ``get()`` runs under an exclusive ``flock``: it selects then marks a row in two
  statements, and four processes without the lock received messages twice.
* the vsqs design (``bench/vsqs.py``): one file per message, renamed between states; with sync
  the file and the directory are fsynced at each change.

With four processes, journalq is also measured on the same queue made in four shards
(``broker.queue("q", shards=4)``, both APIs): each consumer keeps to a shard of its own while it
has messages, so the four mostly take different locks, where on one queue they take turns at one.
Its order is FIFO per shard, not across the queue (the other rows keep strict FIFO): how a user
who needs more consumers than one lock serves would make the queue, as with Kafka's partitions.

Beside each configuration, the ceiling: the most messages/s that the design's system calls allow
at that moment, with no Python work (``ceiling``): locked appends/s (``flock``, ``fstat``,
``write``, unlock; one lock for all processes) under sync="none", synced appends/s (a write under
the lock, then ``fdatasync``, by 1 or 4 processes) under sync="always", measured after each round
of runs (best kept). Ceiling / best baseline is the most that the ratio could be.

Each consumer is a separate process (``bench/queue_child.py``) that opens the queue, says ready,
then on a signal receives and deletes until the queue is empty. Timed: from the first consumer's
start to the last one's end. Filling the queue (and ``os.sync()`` after it) is not timed. Every run
checks that the N messages were received exactly once (the numbers at the head of the bodies,
counted across the processes): a run that loses or repeats a message stops the benchmark. The rate
is the best of ``repeat`` runs (implementations interleaved); aim: journalq at least 10 times the
best baseline of each configuration.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import time
from itertools import cycle
from pathlib import Path
from typing import NamedTuple

from harness import Context, Result, cpu_jiffies, ms, rate, stolen_share
from journalq.journal import Writer, end_offset
from journalq.queue import Broker
from vsqs import VsqsQueue

HERE = Path(__file__).resolve().parent
CHILD = str(HERE / "queue_child.py")

# -- channels -----------------------------------------------------------------------------------

CHANNEL_COUNTS = (0, 5, 10)
CHANNEL_MESSAGE_SIZE = 4096
CHANNEL_BATCH = 100
FLAT = 1.2  # "flat": 10 channels take at most this many times the time of none
SQ_REPORTED_MS = 450  # sq's figure for each channel count (given, not measured)
NSQ_REPORTED_MS = {0: 2200, 5: 3800, 10: 5200}  # NSQ's figures (given, not measured)

CHANNELS_CONTEXT = (
    "For context (channels): sq reported 450 ms for 5,000 messages of 4 KiB to a topic with 0, 5 and 10\n"
    "channels, and NSQ 2.2 s, 3.8 s and 5.2 s (figures given, not measured here)."
)
RECEIVE_CONTEXT = (
    "receive: persist-queue has no batch receive (10 get() + 10 ack()) and, with four processes, runs\n"
    "get() under a flock (without it, processes received the same message twice); vsqs is bench/vsqs.py."
)


def _channel_bodies(count: int) -> list[bytes]:
    rnd = random.Random(4096)
    pool = [rnd.randbytes(CHANNEL_MESSAGE_SIZE) for _ in range(64)]
    return [body for _, body in zip(range(count), cycle(pool))]


def _send(bodies: list[bytes], batch: int, one, many) -> float:
    started = time.perf_counter()
    if batch == 1:
        for body in bodies:
            one(body)
    else:
        for i in range(0, len(bodies), batch):
            many(bodies[i : i + batch])
    return time.perf_counter() - started


def _journalq_channels(ctx: Context, channels: int, sync: str, batch: int, bodies: list[bytes], check: bool) -> float:
    path = ctx.scratch("channels")
    broker = Broker(path, sync=sync)
    try:
        topic = broker.topic("t")
        made = [topic.channel(f"c{i}") for i in range(channels)]
        for channel in made:
            channel.receive(1)  # nothing to get yet; the channel now exists on disk with its state
        if sorted(topic.channel_names()) != sorted(f"c{i}" for i in range(channels)):
            raise AssertionError(f"expected {channels} channels on disk, found {topic.channel_names()}")
        seconds = _send(bodies, batch, topic.send, topic.send_many)
        if check:
            if end_offset(topic.path) != len(bodies):
                raise AssertionError(f"the topic holds {end_offset(topic.path)} messages, not {len(bodies)}")
            for channel in made:
                available = channel.stats().available
                if available != len(bodies):
                    raise AssertionError(f"channel {channel.name} sees {available} messages, not {len(bodies)}")
    finally:
        broker.close()
    return seconds


def _copies_channels(ctx: Context, channels: int, sync: str, batch: int, bodies: list[bytes]) -> float:
    """NSQ's design: the topic and every channel keep a copy (one shared journal writer each)."""
    path = ctx.scratch("channels-copies")
    writers = [Writer(path / "t", shared=True, sync=sync)]
    writers += [Writer(path / f"c{i}", shared=True, sync=sync) for i in range(channels)]
    try:
        if batch == 1:

            def one(body: bytes) -> None:
                for writer in writers:
                    writer.append(body)

            many = None
        else:
            one = None

            def many(chunk: list[bytes]) -> None:
                for writer in writers:
                    writer.append_many(chunk)

        seconds = _send(bodies, batch, one, many)
        for writer in writers:
            if writer.next_offset != len(bodies):
                raise AssertionError(f"{writer.path} holds {writer.next_offset} messages, not {len(bodies)}")
    finally:
        for writer in writers:
            writer.close()
    return seconds


def run_channels(ctx: Context) -> list[Result]:
    count = 1000 if ctx.quick else 5000
    bodies = _channel_bodies(count)
    results = []
    for sync in ("always", "none"):
        for batch in (1, CHANNEL_BATCH):
            how = "send() one by one" if batch == 1 else f"send_many() x{batch}"
            ctx.log(f"  {how}, sync={sync}: {count:,} x 4 KiB, 0/5/10 channels, best of {ctx.repeat}")
            mine: dict[int, list[float]] = {k: [] for k in CHANNEL_COUNTS}
            copies: dict[int, list[float]] = {k: [] for k in CHANNEL_COUNTS}
            for r in range(ctx.repeat):
                for k in CHANNEL_COUNTS:
                    mine[k].append(_journalq_channels(ctx, k, sync, batch, bodies, check=r == 0))
                    copies[k].append(_copies_channels(ctx, k, sync, batch, bodies))
            best = {k: min(v) * 1000 for k, v in mine.items()}
            base = {k: min(v) * 1000 for k, v in copies.items()}
            for k in CHANNEL_COUNTS:
                results.append(
                    Result(
                        "channels",
                        f"{how}, sync={sync}, {k} channels",
                        best[k],
                        "ms",
                        f"best of {ctx.repeat}",
                        f"NSQ-style copies ({k + 1} journal{'s' if k else ''})",
                        base[k],
                        figure=f"{ms(best[k])} ({rate(count / best[k] * 1000)})",
                        extra={
                            "messages": count,
                            "message_bytes": CHANNEL_MESSAGE_SIZE,
                            "batch": batch,
                            "sync": sync,
                            "channels": k,
                            "runs_ms": [round(s * 1000, 2) for s in mine[k]],
                            "baseline_runs_ms": [round(s * 1000, 2) for s in copies[k]],
                            "sq_reported_ms": SQ_REPORTED_MS,
                            "nsq_reported_ms": NSQ_REPORTED_MS[k],
                        },
                    )
                )
            flat = best[10] / best[0]
            results.append(
                Result(
                    "channels",
                    f"{how}, sync={sync}: 10 channels / 0",
                    best[10],
                    "ms",
                    f"best of {ctx.repeat}",
                    "journalq, 0 channels",
                    best[0],
                    aim=f"10/0 <= {FLAT:g} (flat)",
                    aim_met=flat <= FLAT,
                    figure=f"{ms(best[10])} vs {ms(best[0])}; NSQ-style 10/0: {base[10] / base[0]:.2f}x",
                    extra={"batch": batch, "sync": sync, "copies_ratio_10_over_0": round(base[10] / base[0], 4)},
                )
            )
    return results


# -- receive ------------------------------------------------------------------------------------

IMPLEMENTATIONS = ("journalq", "journalq-loop", "persist-queue", "vsqs")
SHARDS = 4
# With several consumer processes, the same queue made with ``shards=SHARDS``: each consumer keeps
# to a shard of its own while it has messages, so they mostly take different locks (FIFO holds per
# shard, not across the queue).
SHARDED = ("journalq-sharded", "journalq-sharded-loop")
JOURNALQ = ("journalq", "journalq-loop", *SHARDED)
BASELINES = ("persist-queue", "vsqs")
RECEIVE_BODY = 100
ID_DIGITS = 10
AIM_TIMES = 10


def _receive_bodies(count: int) -> list[bytes]:
    filler = random.Random(100).randbytes(RECEIVE_BODY - ID_DIGITS)
    return [b"%010d" % i + filler for i in range(count)]


def _fill(impl: str, path: Path, bodies: list[bytes], template: Path | None = None) -> None:
    """Put the messages in (not timed), then sync everything, so every run starts alike."""
    if impl in JOURNALQ:
        with Broker(path, sync="none") as broker:
            queue = broker.queue("q", shards=SHARDS if impl in SHARDED else 1)
            for i in range(0, len(bodies), 1000):
                queue.send_many(bodies[i : i + 1000])
    elif impl == "persist-queue":
        assert template is not None, "persist-queue is filled from its template"
        shutil.copytree(template, path)  # filled once by put(); a copy is the same queue
    else:
        queue = VsqsQueue(path, sync=False)
        try:
            for body in bodies:
                queue.publish(body)
        finally:
            queue.close()
    os.sync()


def _persist_queue_template(ctx: Context, bodies: list[bytes]) -> Path:
    from persistqueue import SQLiteAckQueue

    path = ctx.scratch("receive-persist-queue-template")
    queue = SQLiteAckQueue(str(path))
    queue._conn.execute("PRAGMA synchronous=OFF")  # the fill only; each run opens it anew
    for body in bodies:
        queue.put(body)
    queue.close()
    return path


class Consumed(NamedTuple):
    """A run of ``_consume``: its time, what the queue was opened with, and the share of the
    machine's CPU time that the host stole meanwhile (None: not known here)."""

    seconds: float
    settings: dict
    stolen: float | None


def _consume(impl: str, path: Path, sync: str, batch: int, processes: int, count: int) -> Consumed:
    """Start the consumers, let them empty the queue; check each message came out exactly once."""
    children = []
    try:
        for _ in range(processes):
            child = subprocess.Popen(
                [sys.executable, CHILD, impl, str(path), sync, str(batch), str(processes)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            children.append(child)
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{impl} consumer did not start: {line!r}")
        jiffies = cpu_jiffies()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            out, _ = child.communicate(timeout=1800)
            if child.returncode:
                raise RuntimeError(f"{impl} consumer failed with exit status {child.returncode}")
            reports.append(json.loads(out))
        stolen = stolen_share(jiffies, cpu_jiffies())
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    ids = [i for report in reports for i in report["ids"]]
    distinct = len(set(ids))
    failed = sum(report["failed"] for report in reports)
    if len(ids) != count or distinct != count or set(ids) != set(range(count)) or failed:
        raise RuntimeError(
            f"{impl} ({processes} process(es), sync={sync}, batch {batch}): {len(ids)} received, "
            f"{distinct} distinct, of {count} sent; {failed} failed deletes: the run is invalid"
        )
    settings = dict(reports[0]["settings"])
    if "first_shard" in settings:  # a sharded queue: where each consumer started
        settings["first_shard"] = [r["settings"]["first_shard"] for r in reports]
    return Consumed(max(r["end"] for r in reports) - min(r["start"] for r in reports), settings, stolen)


def stolen_text(stolen: dict[str, list[float | None]]) -> str:
    """For the log: the most CPU time the host stole in a run of the row, when known."""
    known = [x for runs in stolen.values() for x in runs if x is not None]
    return f"; the host stole up to {max(known):.0%} of the CPU time in a run" if known else ""


# -- the floors under receive: what the system calls alone allow -----------------------------------

FLOOR_SECONDS = 0.5  # each floor is measured this long (x repeat, best kept)
FLOOR_SYNCS = 300  # synced appends per process in the synced floors


def _locked_appends(path: Path, seconds: float) -> float:
    """Appends per second of a shared-journal step with no Python work around it: take the lock
    (``flock``), look at the file's size (``fstat``), write 40 bytes, let the lock go."""
    fd = os.open(path / "floor.jnl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    lock = os.open(path / "floor.lck", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    data = bytes(40)
    done = 0
    start = time.perf_counter()
    end = start + seconds
    try:
        while time.perf_counter() < end:
            for _ in range(1000):
                fcntl.flock(lock, fcntl.LOCK_EX)
                os.fstat(fd)
                os.write(fd, data)
                fcntl.flock(lock, fcntl.LOCK_UN)
            done += 1000
        return done / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.close(lock)


def _synced_appender(path: str, count: int, go, results) -> None:  # noqa: ANN001 - mp primitives
    fd = os.open(os.path.join(path, "floor.jnl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    lock = os.open(os.path.join(path, "floor.lck"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    data = bytes(40)
    go.wait()
    start = time.monotonic()
    for _ in range(count):
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(fd, data)
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.fdatasync(fd)  # out of the lock, as journalq syncs: concurrent syncs share commits
    results.put((start, time.monotonic()))


def _synced_appends(path: Path, processes: int, count: int) -> float:
    """Synced appends per second, all processes together: each appends 40 bytes under the lock
    and ``fdatasync``s, ``count`` times (the least a change durable before its call returns costs)."""
    context = multiprocessing.get_context("fork")
    go, results = context.Event(), context.Queue()
    workers = [context.Process(target=_synced_appender, args=(str(path), count, go, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    go.set()
    spans = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    return processes * count / (max(end for _, end in spans) - min(start for start, _ in spans))


def receive_floor(ctx: Context, processes: int, sync: str) -> float:
    """The floor of a configuration, once: synced appends/s with ``processes`` processes under
    sync="always", locked appends/s (one process; the lock serializes every process) under "none"."""
    path = ctx.scratch("receive-floor")
    path.mkdir(parents=True, exist_ok=True)
    if sync == "always":
        return _synced_appends(path, processes, 100 if ctx.quick else FLOOR_SYNCS)
    return _locked_appends(path, FLOOR_SECONDS)


def ceiling(floor: float, processes: int, sync: str, batch: int, loop: bool) -> tuple[float, str]:
    """The most messages/s that journalq's design allows on this machine with no Python work at
    all, from the configuration's floor, and how it is reckoned. Every change is a locked append;
    under sync="always" each call that deletes returns only once synced (deliveries are not)."""
    if sync == "always":
        return batch * floor, f"{batch} message(s) per synced append ({processes} process(es): {floor:,.0f}/s)"
    appends = 1 if loop else 2  # the loop's deletes go with its next receive
    return batch * floor / appends, (
        f"{batch} message(s) per {appends} locked append(s) ({floor:,.0f}/s, one lock for all processes)"
    )


def run_receive(ctx: Context) -> list[Result]:
    if importlib.util.find_spec("persistqueue") is None:
        raise RuntimeError("the receive benchmark needs persist-queue: pip install -e '.[bench]'")
    count = 2000 if ctx.quick else 20_000
    bodies = _receive_bodies(count)
    template = _persist_queue_template(ctx, bodies)
    results = []
    for processes in (1, 4):
        for sync in ("always", "none"):
            for batch in (1, 10):
                how = "receive(1)+delete" if batch == 1 else f"receive({batch})+delete_many"
                case = f"{processes} process{'es' if processes > 1 else ''}, sync={sync}, {how}"
                ctx.log(f"  {case}: {count:,} messages, best of {ctx.repeat}")
                impls = IMPLEMENTATIONS + (SHARDED if processes > 1 else ())
                runs: dict[str, list[float]] = {impl: [] for impl in impls}
                stolen: dict[str, list[float | None]] = {impl: [] for impl in impls}
                settings: dict[str, dict] = {}
                floors: list[float] = []
                for _ in range(ctx.repeat):
                    for impl in impls:
                        path = ctx.scratch(f"receive-{impl}")
                        _fill(impl, path, bodies, template)
                        consumed = _consume(impl, path, sync, batch, processes, count)
                        runs[impl].append(count / consumed.seconds)
                        stolen[impl].append(consumed.stolen)
                        settings[impl] = consumed.settings
                    floors.append(receive_floor(ctx, processes, sync))  # the disk's pace changes
                best = {impl: max(r) for impl, r in runs.items()}
                floor = max(floors)
                ctx.log("    " + ", ".join(f"{impl} {rate(best[impl])}" for impl in impls) + stolen_text(stolen))
                top = max(BASELINES, key=best.__getitem__)
                other = next(b for b in BASELINES if b != top)
                config = {"messages": count, "processes": processes, "sync": sync, "batch": batch}
                extra = {
                    **config,
                    **{f"{impl}_msg_per_s": round(best[impl]) for impl in impls},
                    **{f"{impl}_runs": [round(r) for r in runs[impl]] for impl in impls},
                    # The share of CPU time the host stole during each run (a shared host's noise).
                    **{f"{impl}_stolen": [None if x is None else round(x, 3) for x in stolen[impl]] for impl in impls},
                    "settings": settings,
                }
                rows = [
                    ("journalq", case),
                    ("journalq-loop", f"  same, consumer loop: receive({batch}, delete=last round's receipts)"),
                ]
                if processes > 1:
                    rows += [
                        ("journalq-sharded", f"  same, the queue in {SHARDS} shards (FIFO per shard)"),
                        ("journalq-sharded-loop", f"  same, {SHARDS} shards, consumer loop"),
                    ]
                for impl, label in rows:
                    results.append(
                        Result(
                            "receive",
                            label,
                            best[impl],
                            "msg/s",
                            f"best of {ctx.repeat}",
                            f"best baseline, {top}",
                            best[top],
                            aim=f">= {AIM_TIMES}x best baseline",
                            aim_met=best[impl] >= AIM_TIMES * best[top],
                            extra={
                                **extra,
                                "journalq_api": "loop" if impl.endswith("-loop") else "plain",
                                "shards": SHARDS if impl in SHARDED else 1,
                            },
                        )
                    )
                for loop_row in (False, True) if sync == "none" else (None,):
                    most, how_reckoned = ceiling(floor, processes, sync, batch, bool(loop_row))
                    which = {False: "the calls", True: "the loop", None: "both"}[loop_row]
                    results.append(
                        Result(
                            "receive",
                            f"  ceiling of {which}: {how_reckoned}",
                            most,
                            "msg/s",
                            "system calls alone",
                            f"best baseline, {top}",
                            best[top],
                            extra={**config, "floor_runs_per_s": [round(f) for f in floors]},
                        )
                    )
                results.append(
                    Result(
                        "receive",
                        f"  same (receive+delete), against {other}",
                        best["journalq"],
                        "msg/s",
                        f"best of {ctx.repeat}",
                        other,
                        best[other],
                        extra=config,
                    )
                )
    return results
