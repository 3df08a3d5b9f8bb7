"""Many processes at once, killed at random: producers and consumers share one queue while the
parent SIGKILLs a random one every 50-300 ms (and respawns it), and now and then leaves the torn
tail of an event in the state journal, as a process killed in the middle of that write would.
The children make the channel compact its state (snapshot, old state segments deleted), roll
state and topic segments, collect tasks and collect topic segments many times in the run.

At the end, a fresh broker finds: no message delivered twice (the visibility timeout is long:
one held by a killed consumer stays hidden), no acknowledged delete lost, every message a
producer was told was sent either deleted, held by a dead consumer or drained now exactly once,
the topic journal still readable, and ``stats()`` agreeing.

The other scenarios run the same machinery (a ``scenario`` argument of the children) with FIFO
groups, dead letters, delays and filters, and on a sharded queue; each checks its own promises
from the children's logs, where each delivery is known by its stamp (the time of its event, the
last part of its receipt) and each delete or release by the times before and after its call."""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import journalq.queue.channel as channel_module
from journalq.errors import TaskNotFoundError
from journalq.journal import Scanner, end_offset, first_offset
from journalq.journal.lock import FileLock
from journalq.journal.segment import list_segments, lock_path
from journalq.queue import Broker, Queue
from journalq.queue.channel import ReceivedMessage
from test_queue_processes import spawn, tear_state_tail

SNAPSHOT_EVERY = 200  # events between snapshots (20,000 by default)
STATE_SEGMENT_SIZE = 4096
SETTINGS = {
    "visibility_timeout": 600,  # no timeout expires during the run
    "segment_size": 4096,  # the smallest allowed: topic segments roll and are collected often
    "task_gc_interval": 0.05,
    "task_gc_lifetime": 1.0,
}

# The scenarios beyond the first ("basic"): what their producers' messages carry and their
# consumers offer (zkmq filters: "tier" an ordered enum, "region" plain values).
FILTERS = {"tier": ["low", "mid", "high"], "region": ["eu", "us"]}
PROFILES = [None, {}, {"tier": ["mid", "at_least"]}, {"tier": "high"}, {"tier": ["high", "at_least"], "region": "eu"}]
SHORT_VISIBILITY = 1.5  # seconds: redelivery is the point of the scenarios that use it
GROUPS = 12  # FIFO groups (a consumer killed blocks the groups it held for SHORT_VISIBILITY)

# Instrumented so that the run can tell how often compaction, rolls and gc happened.
CHILD = f"FILTERS = {FILTERS!r}\nPROFILES = {PROFILES!r}\nGROUPS = {GROUPS}\n" + textwrap.dedent(
    """
    import json, random, sys, time
    import journalq.queue.channel as channel_module
    import journalq.journal.writer as writer_module
    import journalq.queue.topic as topic_module
    from journalq.errors import ReceiptError
    from journalq.queue import Broker

    role, root, out, seed, sync = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    channel_module.SNAPSHOT_EVERY = int(sys.argv[6])
    channel_module.STATE_SEGMENT_SIZE = int(sys.argv[7])
    scenario = sys.argv[8]
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

    def stamp(m):  # the delivery's time: the last part of its receipt
        return int(m.receipt.rsplit(".", 1)[1], 16)

    def got(ms):
        note("got " + " ".join(
            f"{m.id},{m.receive_count},{stamp(m)},{m.sent_at_ns},{m.group_id or '-'},{m.body.decode()}" for m in ms
        ))

    def act(kind, call, ms):
        # Logged with the time before the call and after it, and only what it did.
        start = time.time_ns()
        errors = call([m.receipt for m in ms])
        done = [f"{m.id},{stamp(m)}" for m, e in zip(ms, errors) if e is None]
        note(f"{kind} {start} {time.time_ns()} " + " ".join(done))

    def consume(q, keep, filters=None):
        # keep(m): "fin" (delete), "rel" (release: back at once) or "" (let its visibility end)
        later = []  # deleted by the next receive, in the same step
        while True:
            start = time.time_ns()
            try:
                ms = q.receive(rng.randint(1, 5), filters=filters, delete=[m.receipt for m in later])
                if later:
                    note(f"fin {start} {time.time_ns()} " + " ".join(f"{m.id},{stamp(m)}" for m in later))
            except ReceiptError:  # one came back meanwhile: the others, then
                # (A sharded queue's deletes in the shards before the stale one's stay done:
                # these deliveries may have ended from ``start`` on, deleted or not.)
                note(f"end {start} {time.time_ns()} " + " ".join(f"{m.id},{stamp(m)}" for m in later))
                act("fin", q.delete_many, later)
                ms = q.receive(rng.randint(1, 5), filters=filters)
            later = []
            got(ms)
            for kind in ("fin", "rel"):
                chosen = [m for m in ms if keep(m) == kind]
                if kind == "fin" and rng.random() < 0.5:
                    later = chosen
                elif chosen:
                    act(kind, q.delete_many if kind == "fin" else (
                        lambda rs: q.change_visibility_many([(r, 0) for r in rs])), chosen)
            time.sleep(rng.uniform(0, 0.01) if ms else 0.005)

    def produce(q, item, most=10, pause=0.01):
        n = 0
        while True:
            items = [item(n + i) for i in range(rng.randint(1, most))]
            n += len(items)
            note("sent " + " ".join(q.send_many(items)))
            time.sleep(rng.uniform(0, pause))

    with Broker(root, sync=sync) as broker:
        q = broker.queue("jobs")
        if scenario == "fifo":
            if role == "producer":
                # (slower: a group waits while any of it is in flight)
                produce(q, lambda n: {"body": b"%d.%d" % (seed, n), "group_id": "g%d" % rng.randrange(GROUPS)}, 4, 0.1)
            note("consumer " + q.consumer_id)
            consume(q, lambda m: rng.choices(["fin", "rel", ""], [16, 2, 1])[0])
        if scenario == "dead":
            if role == "producer":  # poison (p) never deleted; a few of the others let go too
                produce(q, lambda n: b"%s.%d.%d" % (rng.choice([b"p", b"n", b"n", b"n", b"n"]), seed, n))
            note("consumer " + q.consumer_id)
            consume(q, lambda m: rng.choice(["rel", ""]) if m.body[:1] == b"p" else rng.choices(["fin", ""], [9, 1])[0])
        if scenario == "delays":
            if role == "producer":
                def item(n):
                    delay = rng.choice([None, 0, 0.1, 0.5, 1.0])  # None: the queue's (0.3)
                    found = {k: rng.choice(v) for k, v in FILTERS.items() if rng.random() < 0.5}
                    body = "/".join([str(seed), str(n), str(delay), found.get("tier", "-"), found.get("region", "-")])
                    return {"body": body.encode(), "delay": delay, "filters": found}
                produce(q, item)
            wanted = rng.choice(PROFILES)
            note("consumer " + q.consumer_id)
            note("filters " + json.dumps(wanted))
            consume(q, lambda m: "fin", wanted)
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


@dataclass(frozen=True, eq=False)  # (one per delivery logged: told apart by identity)
class Delivery:
    """One delivery a consumer logged ("got"): ``stamp`` is its event's time, from its receipt."""

    id: str
    count: int
    stamp: int
    sent_at: int
    group: str
    body: str
    filters: dict | None  # what the consumer offered


@dataclass
class Run:
    """What the children's logs say, gathered as they die."""

    sent: set[str] = field(default_factory=set)
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    acked: set[str] = field(default_factory=set)
    consumers: list[str] = field(default_factory=list)
    events: collections.Counter[str] = field(default_factory=collections.Counter)
    deliveries: list[Delivery] = field(default_factory=list)
    settled: set[Delivery] = field(default_factory=set)  # a later "got" in its log: its end is logged
    # (id, delivery stamp) -> (time before, time after) of the delete ("fin") or release ("rel")
    # that ended that delivery, or of a call that may have deleted it ("end").
    ended: dict[str, dict[tuple[str, int], tuple[int, int]]] = field(
        default_factory=lambda: {"fin": {}, "rel": {}, "end": {}}
    )

    def read(self, log: Path, stderr: Path) -> None:
        # A writer that cuts a torn tail says so (a warning); anything else is a failure.
        errors = [line for line in stderr.read_text().splitlines() if not line.startswith("recovered ")]
        assert errors == [], f"a child failed (not by the kill): {stderr.read_text()}"
        self.events["recovered"] += len(stderr.read_text().splitlines()) - len(errors)
        lines = log.read_text().split("\n")[:-1]  # the last piece may be a line cut by the kill
        offered, settled_from = None, len(self.deliveries)
        for line in lines:
            kind, _, rest = line.partition(" ")
            ids = rest.split()
            assert kind != "error", line
            if kind == "got":
                # The deliveries before were settled: the child logged what it did with them.
                self.settled.update(self.deliveries[settled_from:])
                settled_from = len(self.deliveries)
                for token in ids:
                    id, count, stamp, sent_at, group, body = token.split(",")
                    self.deliveries.append(Delivery(id, int(count), int(stamp), int(sent_at), group, body, offered))
                    self.received[id] += 1
            elif kind in ("fin", "rel", "end"):
                start, end, *done = ids
                for token in done:
                    id, stamp = token.split(",")
                    self.ended[kind][id, int(stamp)] = (int(start), int(end))
                    if kind == "fin":
                        self.acked.add(id)
            elif kind == "filters":
                offered = json.loads(rest)
            elif kind == "sent":
                self.sent.update(ids)
            elif kind == "recv":
                self.received.update(ids)
            elif kind == "del":
                self.acked.update(ids)
            elif kind == "consumer":
                self.consumers.append(rest)
            else:
                self.events[kind] += 1


ROLES = ["producer", "producer", "consumer", "consumer", "consumer"]


class Children:
    """A stress run's children, one per role of ``ROLES``: each started (again) with a log of its
    own and the arguments ``arguments(role, log)`` gives; SIGKILLed, its log then read into ``run``."""

    def __init__(self, code: str, tmp_path: Path, env: dict, run: Run,
                 arguments: Callable[[str, Path], list[object]]) -> None:
        self.code, self.tmp_path, self.env, self.run, self.arguments = code, tmp_path, env, run, arguments
        self.children: list[tuple[subprocess.Popen, Path, Path] | None] = [None] * len(ROLES)
        self.spawned = 0

    def start(self, slot: int) -> None:
        self.spawned += 1
        log, err = self.tmp_path / f"child-{self.spawned}.log", self.tmp_path / f"child-{self.spawned}.err"
        log.touch()
        with open(err, "w") as stderr:
            child = spawn(self.code, *self.arguments(ROLES[slot], log), env=self.env, stderr=stderr)
        self.children[slot] = (child, log, err)

    def kill(self, slot: int) -> str | None:
        """Kill the child in ``slot``; the consumer id of a consumer that received."""
        entry = self.children[slot]
        assert entry is not None
        child, log, err = entry
        assert child.poll() is None, f"a {ROLES[slot]} exited by itself ({child.returncode}): {err.read_text()}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
        consumers = len(self.run.consumers)
        self.run.read(log, err)
        return self.run.consumers[-1] if len(self.run.consumers) > consumers else None

    def close(self) -> None:
        for entry in filter(None, self.children):
            if entry[0].poll() is None:
                entry[0].kill()
                entry[0].wait()


def stress(
    root: Path, tmp_path: Path, env: dict, *, sync: str, seconds: float, seed: int, scenario: str = "basic",
    finish_dead: bool = True, snapshot_every: int = SNAPSHOT_EVERY, at_least: dict[str, int] | None = None,
) -> Run:
    """``finish_dead``: delete by id what a killed consumer held (for a long visibility timeout).
    ``at_least``: events (as the children log them) that the run must see this many times: it
    goes on past ``seconds`` until they come, up to four times as long in all (a slow or busy
    machine does less in the time)."""
    rng = random.Random(seed)
    run = Run()
    children = Children(CHILD, tmp_path, env, run, lambda role, log: [
        role, root, log, rng.randrange(1 << 30), sync, snapshot_every, STATE_SEGMENT_SIZE, scenario,
    ])
    start, kill = children.start, children.kill

    topics = journals(root)
    channels = [topic / "channels" / "default" for topic in topics]
    locks = {path: FileLock(lock_path(path)) for path in topics + channels}
    operator = Broker(root, sync=sync)
    try:
        for slot in range(len(ROLES)):
            start(slot)
        started = time.monotonic()

        def going_on() -> bool:
            spent = time.monotonic() - started
            short = any(run.events[kind] < least for kind, least in (at_least or {}).items())
            return spent < seconds or short and spent < 4 * seconds

        while going_on():
            time.sleep(rng.uniform(0.05, 0.3))
            slot = rng.randrange(len(ROLES))
            dead = kill(slot)
            run.events["kill"] += 1
            if dead is not None and finish_dead:
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
                # (A shard's channel is made by the first receive there: maybe not yet.)
                shard = rng.randrange(len(topics))
                torn = rng.choice([channels[shard], channels[shard], channels[shard], topics[shard]])
                lock = locks[torn]
                if torn.is_dir():
                    lock.acquire(wait=True)
                    try:
                        if list_segments(torn) and tear_state_tail(torn, rng):
                            run.events["tear"] += 1
                    finally:
                        lock.release()
            start(slot)
        for slot in range(len(ROLES)):
            kill(slot)
    finally:
        operator.close()
        for lock in locks.values():
            lock.close()
        children.close()
    return run


def journals(root: Path) -> list[Path]:
    """The topic journals of the queue "jobs": one, or a sharded queue's shards."""
    return sorted(root.glob("jobs.*.*")) or [root / "jobs"]


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
        assert_finished(q, run.acked | unlogged)
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
    check_journals(root)


def assert_finished(q: Queue, ids: Iterable[str]) -> None:
    for i in ids:
        try:
            assert q.task(i).state == "finished", f"delete of {i} lost"
        except TaskNotFoundError:
            pass  # finished, and collected since


def check_journals(root: Path) -> None:
    for topic in journals(root):
        start, end = first_offset(topic), end_offset(topic)
        with Scanner(topic, start) as scanner:
            offsets = [m.offset for m in scanner]
        assert offsets == list(range(start, end)), f"the topic journal {topic} does not read whole"


def prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: object) -> Path:
    """The data directory with the queue "jobs" made with ``settings`` (beyond ``SETTINGS``)."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", SNAPSHOT_EVERY)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", STATE_SEGMENT_SIZE)
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs", **{**SETTINGS, **settings})
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("sync", "seconds"), [("none", 20.0), ("always", 6.0)])
def test_random_kills_of_many_producers_and_consumers(
    tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch, sync: str, seconds: float
) -> None:
    seed = int(os.environ.get("JOURNALQ_STRESS_SEED", "20261122"))
    seconds = float(os.environ.get("JOURNALQ_STRESS_SECONDS", seconds))
    root = prepare(tmp_path, monkeypatch)
    least = {"compact": 5, "roll": 5, "gc": 1}
    run = stress(root, tmp_path, child_env, sync=sync, seconds=seconds, seed=seed, at_least=least)
    print(f"seed {seed}: {len(run.sent)} sent, {len(run.acked)} deleted, {dict(run.events)}")
    # (Hundreds of compactions and rolls and tens of topic collections in a run here: the bounds
    # only make sure the paths were taken, on a slower or busy machine too.)
    assert all(run.events[kind] >= n for kind, n in least.items()), dict(run.events)
    check(root, run)


def scenario_run(
    tmp_path: Path, child_env: dict, root: Path, scenario: str, seconds: float, seed: int,
    at_least: dict[str, int] | None = None,
) -> Run:
    seed = int(os.environ.get("JOURNALQ_STRESS_SEED", seed))
    seconds = float(os.environ.get("JOURNALQ_STRESS_SECONDS", seconds))
    short = scenario in ("fifo", "dead")  # redelivery is their point: nothing is finished by id
    # (FIFO groups go slowly, each waiting while any of it is in flight: snapshots more often, to restore groups.)
    run = stress(
        root, tmp_path, child_env, sync="none", seconds=seconds, seed=seed, scenario=scenario,
        finish_dead=not short, snapshot_every=20 if scenario == "fifo" else SNAPSHOT_EVERY, at_least=at_least,
    )
    redelivered = sum(1 for d in run.deliveries if d.count > 1)
    print(
        f"{scenario} seed {seed}: {len(run.sent)} sent, {len(run.acked)} deleted, {len(run.ended['rel'])} released, "
        f"{redelivered} redelivered, {dict(run.events)}"
    )
    assert run.sent and run.acked, "the children did no work"
    if short:
        time.sleep(SHORT_VISIBILITY + 0.1)  # what the last consumers held comes back
    return run


def drain(q: Queue, finish: Callable[[ReceivedMessage], bool] = lambda m: True) -> list[ReceivedMessage]:
    """Receive until nothing comes: delete what ``finish`` says, release the others (at once)."""
    drained = []
    while got := q.receive(10):
        drained += got
        done = [m.receipt for m in got if finish(m)]
        assert not any(q.delete_many(done))
        assert not any(q.change_visibility_many([(m.receipt, 0) for m in got if not finish(m)]))
    return drained


def offset(id: str) -> int:
    """A message's offset in its journal: its id, or the part after the shard's ("3.17")."""
    return int(id.rpartition(".")[2])


def check_ended(run: Run) -> None:
    """No message comes back after a delete that returned; a message's deliveries count up."""
    by_id: dict[str, list[Delivery]] = collections.defaultdict(list)
    for d in run.deliveries:
        by_id[d.id].append(d)
    deleted = {id: end for (id, _), (_, end) in run.ended["fin"].items()}
    for id, deliveries in by_id.items():
        deliveries.sort(key=lambda d: d.stamp)
        counts = [d.count for d in deliveries]
        assert counts == sorted(set(counts)), f"message {id}: receive counts {counts}"
        assert id not in deleted or deliveries[-1].stamp < deleted[id], f"message {id} came back after its delete"


@pytest.mark.slow
@pytest.mark.parametrize(("shards", "seconds"), [(1, 10.0), (4, 6.0)])
def test_random_kills_with_fifo_groups_and_redeliveries(
    tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch, shards: int, seconds: float
) -> None:
    """FIFO groups; consumers delete most messages, release some and let some time out
    (visibility 1.5 s). Within a group: deliveries in send order, none while an earlier one of
    another receive is in flight (a receive takes a group's messages together; a group stays in
    one shard of a sharded queue)."""
    root = prepare(tmp_path, monkeypatch, visibility_timeout=SHORT_VISIBILITY, shards=shards)
    run = scenario_run(tmp_path, child_env, root, "fifo", seconds, 20261123)
    check_ended(run)
    # The end of a delivery is known when its consumer logged what it did with it (deleted,
    # released or kept): else it may have been deleted unlogged, at an unknown time.
    margin = 0.5e9  # a delivery's visibility is counted from a moment before its stamp
    by_group: dict[str, list[Delivery]] = collections.defaultdict(list)
    for d in run.deliveries:
        by_group[d.group].append(d)
    assert set(by_group) <= {f"g{n}" for n in range(GROUPS)}
    for group, deliveries in by_group.items():
        deliveries.sort(key=lambda d: d.stamp)  # (stable: one receive's in the order it gave them)
        # A group's messages go out first in send order, and a receive gives its own in order. (A
        # message given back while a later one of its receive was deleted goes out again after it.)
        firsts = [offset(d.id) for d in deliveries if d.count == 1]
        assert firsts == sorted(firsts), f"group {group} first delivered out of order"
        # No receive gives a group's message while a delivery of an earlier receive is in flight:
        # each receive comes after the latest end of the earlier ones' (settled) deliveries.
        latest: tuple[float, Delivery] | None = None  # (when it was in flight until, which delivery)
        for stamp, together in itertools.groupby(deliveries, key=lambda d: d.stamp):
            receive = list(together)
            offsets = [offset(d.id) for d in receive]
            assert offsets == sorted(offsets), f"group {group}: a receive at {stamp} gave {offsets}"
            if latest is not None:
                assert stamp >= latest[0], f"group {group}: {receive[0]} delivered while {latest[1]} was in flight"
            for first in receive:
                if first not in run.settled:
                    continue
                key = (first.id, first.stamp)
                ended = [times[key] for times in run.ended.values() if key in times]
                hidden_until = first.stamp + SHORT_VISIBILITY * 1e9 - margin
                if ended:
                    hidden_until = min(hidden_until, *(start for start, _ in ended))
                if latest is None or hidden_until > latest[0]:
                    latest = (hidden_until, first)
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        drained = drain(q)
        assert not {m.id for m in drained} & run.acked, "a deleted message came back"
        for group in by_group:
            offsets = [offset(m.id) for m in drained if m.group_id == group]
            assert offsets == sorted(offsets), f"group {group} drained out of order"
            # One older than a message deleted was delivered before (given back, or let go, from
            # the receive that gave the deleted one): never passed over.
            deleted = max((offset(d.id) for d in by_group[group] if d.id in run.acked), default=-1)
            delivered = {offset(d.id) for d in by_group[group]}
            passed = [n for n in offsets if n < deleted and n not in delivered]
            assert not passed, f"group {group}: {passed} drained, never delivered, older than {deleted} deleted"
        left = run.sent - run.acked - {m.id for m in drained}
        assert_finished(q, left)  # deleted by a consumer killed before it logged it
        stats = q.stats()
        assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)
    check_journals(root)


@pytest.mark.slow
def test_random_kills_with_dead_letters(tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Poison messages (bodies "p...") are never deleted, only released or left to time out:
    each must reach the dead-letter queue after 2 deliveries, exactly once, kills or not."""
    root = prepare(
        tmp_path, monkeypatch, visibility_timeout=SHORT_VISIBILITY, max_receive_count=2, dead_letter_queue="jobs-dead"
    )
    run = scenario_run(tmp_path, child_env, root, "dead", 10.0, 20261124)
    check_ended(run)
    assert all(d.count <= 2 for d in run.deliveries), "delivered more often than max_receive_count"
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        drained = drain(q, lambda m: m.body[:1] == b"n")  # poison goes on until it is a dead letter
        assert all(m.receive_count <= 2 for m in drained)
        assert q.receive(10) == []
        dead = drain(broker.queue("jobs-dead"))
        sources = collections.Counter(m.source["id"] for m in dead)
        assert [i for i, n in sources.items() if n > 1] == [], "dead-lettered twice"
        assert all(m.source["count"] == 2 for m in dead)
        assert not set(sources) & run.acked, "a deleted message is a dead letter too"
        poison = {d.id for d in run.deliveries if d.body[:1] == "p"} | {m.id for m in drained if m.body[:1] == b"p"}
        assert poison <= set(sources), "poison lost"
        assert not {m.id for m in drained} & run.acked, "a deleted message came back"
        left = run.sent - run.acked - {m.id for m in drained if m.body[:1] == b"n"} - set(sources)
        assert_finished(q, left)
        stats = q.stats()
        assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, len(sources))
        run.events["dead letters"] = len(sources)
        print(dict(run.events))
    check_journals(root)


def allowed(offered: dict | None, tier: str, region: str) -> bool:
    """What zkmq's filters let through, written out again (README): a message's filter the
    consumer does not offer keeps it away; ``at_least`` compares in the enum's order."""
    if offered is None:
        return True
    for name, needed in (("tier", tier), ("region", region)):
        if needed == "-":
            continue
        spec = offered.get(name)
        if spec is None:
            return False
        value, method = (spec, "absolute") if isinstance(spec, str) else spec
        if method == "absolute" and value != needed:
            return False
        if method == "at_least" and FILTERS[name].index(value) < FILTERS[name].index(needed):
            return False
    return True


@pytest.mark.slow
def test_random_kills_with_delays_and_filters(tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Delays (per message, and the queue's 0.3 s) and consumers with filters: nothing goes out
    before its delay ends, nor to a consumer whose filters exclude it; the rest as the first test."""
    root = prepare(tmp_path, monkeypatch, delay=0.3, enums={"tier": FILTERS["tier"]})
    run = scenario_run(tmp_path, child_env, root, "delays", 8.0, 20261125)
    for d in run.deliveries:
        _, _, delay, tier, region = d.body.split("/")
        delay_ns = int((0.3 if delay == "None" else float(delay)) * 1e9)
        assert d.stamp >= d.sent_at + delay_ns, f"{d} delivered before its delay ended"
        assert allowed(d.filters, tier, region), f"{d} went to a consumer whose filters exclude it"
    assert any(d.filters for d in run.deliveries), "no consumer with filters received"
    time.sleep(1.1)  # the longest delay: what is left is available
    check(root, run)


@pytest.mark.slow
def test_random_kills_on_a_sharded_queue(tmp_path: Path, child_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first test's producers and consumers on a queue of 4 shards."""
    root = prepare(tmp_path, monkeypatch, shards=4)
    assert len(journals(root)) == 4
    least = {"compact": 1, "roll": 1}
    run = scenario_run(tmp_path, child_env, root, "basic", 10.0, 20261126, at_least=least)
    assert all(run.events[kind] >= n for kind, n in least.items()), dict(run.events)
    check(root, run)
