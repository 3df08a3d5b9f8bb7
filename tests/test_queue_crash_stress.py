"""Many processes at once, killed at random: producers and consumers share one queue while the
parent SIGKILLs a random one every 50-300 ms (and respawns it), and now and then leaves the torn
tail of an event in the state journal, as a process killed in the middle of that write would.
The children make the channel compact its state (snapshot, old state segments deleted), roll
state and topic segments, collect tasks and collect topic segments many times in the run.

At the end, a fresh broker finds: no message delivered twice (the visibility timeout is long:
one held by a killed consumer stays hidden), no acknowledged delete lost, every message a
producer was told was sent either deleted, held by a dead consumer or drained now exactly once,
the topic journal still readable, and ``stats()`` agreeing."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import journalq.queue.channel as channel_module
from journalq.errors import TaskNotFoundError
from journalq.journal import Scanner, end_offset, first_offset
from journalq.journal.lock import FileLock
from journalq.journal.segment import lock_path
from journalq.queue import Broker
from test_queue_processes import spawn, tear_state_tail

SNAPSHOT_EVERY = 200  # events between snapshots (20,000 by default)
STATE_SEGMENT_SIZE = 4096
SETTINGS = {
    "visibility_timeout": 600,  # no timeout expires during the run
    "segment_size": 4096,  # the smallest allowed: topic segments roll and are collected often
    "task_gc_interval": 0.05,
    "task_gc_lifetime": 1.0,
}

# Instrumented so that the run can tell how often compaction, rolls and gc happened.
CHILD = textwrap.dedent(
    """
    import random, sys, time
    import journalq.queue.channel as channel_module
    import journalq.journal.writer as writer_module
    import journalq.queue.topic as topic_module
    from journalq.queue import Broker

    role, root, out, seed, sync = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    channel_module.SNAPSHOT_EVERY = int(sys.argv[6])
    channel_module.STATE_SEGMENT_SIZE = int(sys.argv[7])
    rng = random.Random(seed)
    log = open(out, "a")  # made by the parent: a child may be killed before it opens it

    def note(line):
        log.write(line + "\\n")
        log.flush()

    def counted(cls, name, tag):
        original = getattr(cls, name)
        def wrapper(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if tag != "gc" or result:
                note(tag)
            return result
        setattr(cls, name, wrapper)

    counted(channel_module.Channel, "_compact", "compact")
    counted(writer_module.Writer, "_roll", "roll")
    counted(topic_module.Topic, "gc", "gc")

    with Broker(root, sync=sync) as broker:
        q = broker.queue("jobs")
        if role == "producer":
            n = 0
            while True:
                ids = q.send_many([b"%d:%d" % (seed, n + i) for i in range(rng.randint(1, 20))])
                n += len(ids)
                note("sent " + " ".join(ids))
                time.sleep(rng.uniform(0, 0.01))
        note("consumer " + q.consumer_id)
        pending = []
        while True:
            if pending and rng.random() < 0.5:
                got = q.receive(rng.randint(1, 20), delete=[m.receipt for m in pending])
                note("del " + " ".join(m.id for m in pending))
                pending = []
            else:
                got = q.receive(rng.randint(1, 20))
            note("recv " + " ".join(m.id for m in got))
            if got and rng.random() < 0.5:
                pending = got  # deleted by the next receive
                continue
            errors = q.delete_many([m.receipt for m in pending + got])
            if any(errors):
                note(f"error {errors}")
            note("del " + " ".join(m.id for m in pending + got))
            pending = []
            if not got:
                time.sleep(0.005)
    """
)


@dataclass
class Run:
    """What the children's logs say, gathered as they die."""

    sent: set[str] = field(default_factory=set)
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    acked: set[str] = field(default_factory=set)
    consumers: list[str] = field(default_factory=list)
    events: collections.Counter[str] = field(default_factory=collections.Counter)

    def read(self, log: Path, stderr: Path) -> None:
        # A writer that cuts a torn tail says so (a warning); anything else is a failure.
        errors = [line for line in stderr.read_text().splitlines() if not line.startswith("recovered ")]
        assert errors == [], f"a child failed (not by the kill): {stderr.read_text()}"
        self.events["recovered"] += len(stderr.read_text().splitlines()) - len(errors)
        lines = log.read_text().split("\n")[:-1]  # the last piece may be a line cut by the kill
        for line in lines:
            kind, _, rest = line.partition(" ")
            ids = rest.split()
            assert kind != "error", line
            if kind == "sent":
                self.sent.update(ids)
            elif kind == "recv":
                self.received.update(ids)
            elif kind == "del":
                self.acked.update(ids)
            elif kind == "consumer":
                self.consumers.append(rest)
            else:
                self.events[kind] += 1


def stress(root: Path, tmp_path: Path, env: dict, *, sync: str, seconds: float, seed: int) -> Run:
    rng = random.Random(seed)
    roles = ["producer", "producer", "consumer", "consumer", "consumer"]
    run = Run()
    children: list[tuple[subprocess.Popen, Path, Path]] = [None] * len(roles)  # type: ignore[list-item]
    spawned = 0

    def start(slot: int) -> None:
        nonlocal spawned
        spawned += 1
        log, err = tmp_path / f"child-{spawned}.log", tmp_path / f"child-{spawned}.err"
        log.touch()
        with open(err, "w") as stderr:
            child = spawn(
                CHILD, roles[slot], root, log, rng.randrange(1 << 30), sync, SNAPSHOT_EVERY,
                STATE_SEGMENT_SIZE, env=env, stderr=stderr,
            )
        children[slot] = (child, log, err)

    def kill(slot: int) -> str | None:
        """Kill the child in ``slot``; the consumer id of a consumer that received."""
        child, log, err = children[slot]
        assert child.poll() is None, f"a {roles[slot]} exited by itself ({child.returncode}): {err.read_text()}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
        consumers = len(run.consumers)
        run.read(log, err)
        return run.consumers[-1] if len(run.consumers) > consumers else None

    topic = root / "jobs"
    channel = topic / "channels" / "default"
    locks = {path: FileLock(lock_path(path)) for path in (topic, channel)}
    operator = Broker(root, sync=sync)
    try:
        for slot in range(len(roles)):
            start(slot)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.3))
            slot = rng.randrange(len(roles))
            dead = kill(slot)
            run.events["kill"] += 1
            if dead is not None:
                # What the dead consumer held would stay hidden for the whole run and keep the
                # channel's cursor (so topic gc) from passing it: finish it by id, as an operator
                # would. (What the last ones hold is left hidden, and checked so at the end.)
                q = operator.queue("jobs")
                for i in q.consumers().get(dead, []):
                    q.delete_id(i)
                    run.acked.add(i)
            if rng.random() < 0.2:
                # Under the lock, as a process killed in the middle of its append holds it: the
                # channel's state journal mostly, else the topic's (a producer's send).
                torn = rng.choice([channel, channel, channel, topic])
                lock = locks[torn]
                lock.acquire(wait=True)
                try:
                    tear_state_tail(torn, rng)
                finally:
                    lock.release()
                run.events["tear"] += 1
            start(slot)
        for slot in range(len(roles)):
            kill(slot)
    finally:
        operator.close()
        for lock in locks.values():
            lock.close()
        for child, _, _ in filter(None, children):
            if child.poll() is None:
                child.kill()
                child.wait()
    return run


def check(root: Path, run: Run) -> None:
    assert [i for i, n in run.received.items() if n > 1] == [], "delivered twice while hidden"
    assert run.sent and run.acked, "the children did no work"
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        held = q.consumers()
        assert set(held) <= set(run.consumers), "messages held by a consumer that never ran"
        held_ids = {i for ids in held.values() for i in ids}
        assert not held_ids & run.acked, "a deleted message is still held"
        # Received, not logged as deleted, not held: deleted by a consumer killed before it
        # logged that (checked finished below, and not drained again).
        unlogged = set(run.received) - run.acked - held_ids
        for i in run.acked | unlogged:
            try:
                assert q.task(i).state == "finished", f"delete of {i} lost"
            except TaskNotFoundError:
                pass  # finished, and collected since
        drained = []
        while got := q.receive(100, visibility_timeout=600):
            assert all(m.receive_count == 1 for m in got), "a message delivered before came back"
            drained += [m.id for m in got]
            assert not any(q.delete_many([m.receipt for m in got]))
        assert len(drained) == len(set(drained)), "drained twice"
        assert not set(drained) & (run.acked | held_ids | set(run.received))
        assert run.sent <= run.acked | unlogged | held_ids | set(drained), "lost messages"
        stats = q.stats()
        assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, len(held_ids), 0, 0)
        topic = q.topic.path
    start, end = first_offset(topic), end_offset(topic)
    with Scanner(topic, start) as scanner:
        offsets = [m.offset for m in scanner]
    assert offsets == list(range(start, end)), "the topic journal does not read whole"


@pytest.mark.slow
@pytest.mark.parametrize(("sync", "seconds"), [("none", 20.0), ("always", 6.0)])
def test_random_kills_of_many_producers_and_consumers(
    tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch, sync: str, seconds: float
) -> None:
    seed = int(os.environ.get("JOURNALQ_STRESS_SEED", "20261122"))
    seconds = float(os.environ.get("JOURNALQ_STRESS_SECONDS", seconds))
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", SNAPSHOT_EVERY)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", STATE_SEGMENT_SIZE)
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs", **SETTINGS)
    run = stress(root, tmp_path, child_env, sync=sync, seconds=seconds, seed=seed)
    print(f"seed {seed}: {len(run.sent)} sent, {len(run.acked)} deleted, {dict(run.events)}")
    # (Hundreds of compactions and rolls and tens of topic collections in a run here: the bounds
    # only make sure the paths were taken, on a slower machine too.)
    assert run.events["compact"] >= 5 and run.events["roll"] >= 5 and run.events["gc"] >= 1
    check(root, run)
