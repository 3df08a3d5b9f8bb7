"""The ZooKeeper store's producers and consumers killed at random: the file store's crash test
(``test_queue_crash_stress``) on a ``zk://`` queue. Two producers (small batches, now and then one
of several send chunks) and three consumers (``receive(n)`` then ``delete_many``, or the delete in
the next ``receive(n, delete=...)``; some released at once by ``release`` or
``change_visibility``; some kept until the consumer dies) run while the parent SIGKILLs a random
one every 50-300 ms and respawns it; one run also SIGKILLs the ZooKeeper server mid-run and starts
it again (the children then meet ``StoreUnavailableError`` or ``PartialSendError``, and go on).
In one run the consumers' sessions expire now and then (the server ends them, as after a
partition): their tasks come back at once and their receipts are refused, and only then. Two
more scenarios: consumers with zkmq's filters (an ordered enum, ``absolute`` and
``at_least``), none of which may ever get a message its filters exclude; and poison messages
never deleted, with ``max_receive_count`` 2, each of which must reach the dead-letter queue (at
least once: twice when a consumer dies between the dead letter's send and the task's end).

The visibility timeout is long (600 s), so a delivery ends only when its consumer deletes or
releases it, or dies (its session ends: the store's promise is that its tasks come back then).
At the end, with a fresh broker: no delivery came before the one before it ended (per message,
and per FIFO group in the FIFO run), no acknowledged send is lost (what a ``PartialSendError``
said was stored counts), no acknowledged delete is undone, ``stats()`` and ``task(id).state``
agree, and finished tasks are collected after their lifetime, not before."""

from __future__ import annotations

import collections
import itertools
import os
import random
import re
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from journalq.errors import TaskNotFoundError
from journalq.queue import Broker
from conftest import own_zookeeper
from test_queue_crash_stress import (
    FILTERS,
    PROFILES,
    ROLES,
    Children,
    Delivery,
    Run,
    allowed,
    assert_finished,
    check_ended,
    drain,
)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

SESSION = 1.0  # the children's session timeout: a killed consumer's tasks come back this soon
LIFETIME = 2.0  # seconds a finished task is kept before the collector may delete it
SETTINGS = {"visibility_timeout": 600, "task_gc_interval": 0.1, "task_gc_lifetime": LIFETIME}
SCENARIOS = {  # the queue's settings beyond SETTINGS
    "plain": {},
    "expire": {},
    "fifo": {},
    "filters": {"enums": {"tier": FILTERS["tier"]}},
    "dead": {"max_receive_count": 2, "dead_letter_queue": "jobs-dead"},
}
GROUPS = 16

CHILD = f"SESSION = {SESSION}\nGROUPS = {GROUPS}\nFILTERS = {FILTERS!r}\nPROFILES = {PROFILES!r}\n" + textwrap.dedent(
    """
    import json, random, sys, threading, time
    from journalq.errors import PartialSendError, ReceiptError, StoreUnavailableError
    from journalq.queue import Broker

    role, url, out, seed, scenario = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    rng = random.Random(seed)
    log = open(out, "a")  # made by the parent: a child may be killed before it opens it
    lock = threading.Lock()
    lost = threading.Event()  # this consumer's session expired: its receipts may be refused
    stamps = {}  # receipt -> the time its receive returned (the delivery's stamp in the logs)

    def note(line):
        with lock:
            log.write(line + "\\n")
            log.flush()

    def tokens(ms):
        return " ".join(f"{m.id},{stamps[m.receipt]}" for m in ms)

    def got(ms):
        stamp = time.time_ns()
        for m in ms:
            stamps[m.receipt] = stamp
        note("got " + " ".join(f"{m.id},{m.receive_count},{stamp},{m.sent_at_ns},{m.group_id or '-'},{m.body.decode()}"
                               for m in ms))

    def refused(errors):
        # Deliveries are hidden for 600 s: only a consumer whose session ended loses them.
        if any(errors) and not lost.is_set():
            note(f"error refused {errors}")

    def act(kind, call, ms):
        # "fin"/"rel" with the times before and after the call, and only what it did; a call cut
        # by the outage may have done any of it: "end" (for a delete), "rel" (a release).
        start = time.time_ns()
        try:
            errors = call([m.receipt for m in ms])
        except StoreUnavailableError:
            note(f"{'end' if kind == 'fin' else 'rel'} {start} {time.time_ns()} {tokens(ms)}")
            return
        refused(errors)
        note(f"{kind} {start} {time.time_ns()} " + tokens([m for m, e in zip(ms, errors) if e is None]))

    def release(rs):
        if rng.random() < 0.5:
            return q.change_visibility_many([(r, 0) for r in rs])
        errors = []
        for r in rs:
            try:
                q.release(r)
                errors.append(None)
            except ReceiptError as exc:
                errors.append(exc)
        return errors

    def choose(m):
        # delete most, release a few at once, keep a few until this consumer dies; poison never
        # deleted
        if scenario == "dead" and m.body[:1] == b"p":
            return rng.choice(["rel", ""])
        return rng.choices(["fin", "rel", ""], [16, 2, 1])[0]

    def expire(kept):
        # As the server does when the session times out (a partition, a long pause): another
        # client joins this session and closes it; this one then opens a new session. What it
        # kept goes back at once, and its receipts are refused from then on.
        from kazoo.client import KazooClient
        session = broker.client.client_id
        if session is None:
            return
        lost.set()
        note("expired")  # (before: this process may be killed before kazoo finds it out)
        other = KazooClient(hosts=broker.hosts, client_id=session)
        other.start(timeout=5)
        other.stop()
        other.close()
        deadline = time.monotonic() + 5
        while (broker.client.client_id or session)[0] == session[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            errors = q.change_visibility_many([(m.receipt, 600) for m in kept])
        except StoreUnavailableError:
            return
        if None in errors:
            note(f"error a receipt of the expired session was taken: {errors}")
        note("fenced")

    def consume(filters):
        later = []  # deleted by the next receive
        kept = []  # neither deleted nor released: held until this consumer dies
        while True:
            if scenario == "expire" and kept and rng.random() < 0.05:
                expire(kept)
                kept = []
            n, start = rng.randint(1, 8), time.time_ns()
            try:
                ms = q.receive(n, filters=filters, delete=[m.receipt for m in later])
                if later:
                    note(f"fin {start} {time.time_ns()} {tokens(later)}")
            except (ReceiptError, StoreUnavailableError) as exc:
                if later:  # some of them may be deleted (each is its own change here)
                    note(f"end {start} {time.time_ns()} {tokens(later)}")
                if isinstance(exc, ReceiptError):
                    refused([exc])
                note("unavailable" if isinstance(exc, StoreUnavailableError) else "refused")
                later = []
                time.sleep(0.05)
                continue
            later = []
            got(ms)
            keep = {m.receipt: choose(m) for m in ms}
            deleted = [m for m in ms if keep[m.receipt] == "fin"]
            if deleted and rng.random() < 0.5:
                later = deleted
            elif deleted:
                act("fin", q.delete_many, deleted)
            released = [m for m in ms if keep[m.receipt] == "rel"]
            if released:
                act("rel", release, released)
            kept += [m for m in ms if keep[m.receipt] == ""]
            time.sleep(rng.uniform(0, 0.01) if ms else 0.01)

    def item(n):
        body = "%d.%d" % (seed, n)
        if scenario == "fifo":
            return {"body": body.encode(), "group_id": "g%d" % rng.randrange(GROUPS)}
        if scenario == "filters":
            found = {k: rng.choice(v) for k, v in FILTERS.items() if rng.random() < 0.5}
            return {"body": f"{body}/{found.get('tier', '-')}/{found.get('region', '-')}".encode(), "filters": found}
        if scenario == "dead":  # poison (p) or not (n)
            return {"body": rng.choice(["p", "n", "n", "n"]).encode() + b"." + body.encode()}
        return {"body": body.encode()}

    def produce():
        n = 0
        while True:
            # mostly small batches; now and then one of several send transactions (200 a chunk)
            size = rng.randint(150, 300) if scenario == "plain" and rng.random() >= 0.97 else rng.randint(1, 5)
            items = [item(n + i) for i in range(size)]
            n += size
            try:
                ids = q.send_many(items)
            except PartialSendError as exc:  # (a StoreUnavailableError too: first)
                ids = [i for i in exc.ids if i is not None]
                note("partial")
            except StoreUnavailableError:
                ids = []
                note("unavailable")
            note("sent " + " ".join(ids))
            # about as fast as the consumers (slower with groups: one message in flight each)
            time.sleep(rng.uniform(0, 0.6 if scenario == "fifo" else 0.1))

    with Broker(url, session_timeout=SESSION) as broker:
        # A session that expires (the server down too long) gives this consumer's tasks back.
        def listen(state):
            if state == "LOST":
                lost.set()
                note("lost")
        broker.client.add_listener(listen)
        while True:  # started as the server restarts: opening meets the outage as any call does
            try:
                q = broker.queue("jobs")
                break
            except StoreUnavailableError:
                note("unavailable")
                time.sleep(0.1)
        if role == "producer":
            produce()
        note("consumer " + q.consumer_id)
        wanted = rng.choice(PROFILES) if scenario == "filters" else None
        note("filters " + json.dumps(wanted))
        consume(wanted)
    """
)


class ZooKeeperRun(Run):
    """``Run`` with who held each delivery and when each consumer was killed."""

    def __init__(self) -> None:
        super().__init__()
        self.holder: dict[Delivery, str] = {}
        self.killed_at: dict[str, int] = {}
        self.lost: set[str] = set()  # consumers whose session expired while they ran

    def end_of(self, d: Delivery) -> int | None:
        """When delivery ``d`` may have ended at the earliest (None: it never did): a delete or
        release that began, or its consumer's death. (Only for a delivery in ``settled``: its
        consumer logged what it did with it.) A consumer whose session expired (the store's
        promise: its tasks come back then) may have lost it at any time: its stamp then."""
        if self.holder.get(d) in self.lost:
            return d.stamp
        key = (d.id, d.stamp)
        times = [times[key][0] for times in self.ended.values() if key in times]
        if d in self.holder and self.holder[d] in self.killed_at:
            times.append(self.killed_at[self.holder[d]])
        return min(times, default=None)


def stress(server, tmp_path: Path, env: dict, *, seed: int, seconds: float, scenario: str,
           restart: bool) -> ZooKeeperRun:
    """Run the children on the queue "jobs" of ``server``'s path /crash for ``seconds``."""
    rng = random.Random(seed)
    url = server.url("/crash")
    with Broker(url) as broker:
        broker.queue("jobs", **SETTINGS, **SCENARIOS[scenario])
    run = ZooKeeperRun()
    children = Children(CHILD, tmp_path, env, run, lambda role, log: [role, url, log, rng.randrange(1 << 30), scenario])

    def kill(slot: int) -> None:
        at, deliveries = time.time_ns(), len(run.deliveries)  # (the session ends after ``at``)
        log = children.children[slot][1]  # type: ignore[index]
        consumer = children.kill(slot)
        if consumer is not None:
            run.killed_at[consumer] = at
            if {"lost", "expired"} & set(log.read_text().split("\n")):
                run.lost.add(consumer)
            run.holder.update((d, consumer) for d in run.deliveries[deliveries:])

    try:
        for slot in range(len(ROLES)):
            children.start(slot)
        began = time.monotonic()
        restart_at = began + seconds / 2 if restart else None
        while time.monotonic() < began + seconds:
            time.sleep(rng.uniform(0.05, 0.3))
            if restart_at is not None and time.monotonic() > restart_at:
                # Frozen first, so that requests are surely in flight (sent, unanswered) at the
                # crash: made while kazoo reconnects, they would wait for it and not fail.
                server.process.send_signal(signal.SIGSTOP)
                time.sleep(0.3)
                server.kill()  # SIGKILL, as a crash: what it acknowledged is on its disk
                time.sleep(rng.uniform(0.1, 0.5))
                server.start()
                restart_at = None
                run.events["server restart"] += 1
            slot = rng.randrange(len(ROLES))
            kill(slot)
            run.events["kill"] += 1
            children.start(slot)
        # On a loaded machine a child can take longer to start (Python, kazoo, a session) than the
        # kills leave it: then the last ones, left alone, must send and delete something.
        worked = time.monotonic() + 60
        while not (run.sent and run.acked or _working(children)) and time.monotonic() < worked:
            time.sleep(0.2)
        for slot in range(len(ROLES)):
            kill(slot)
    finally:
        children.close()
    return run


def _working(children: Children) -> bool:
    """Whether the children running now have logged messages sent and deleted."""
    logs = "\n".join(entry[1].read_text() for entry in filter(None, children.children))
    return re.search(r"^sent \S", logs, re.M) is not None and re.search(r"^fin \d+ \d+ \S", logs, re.M) is not None


def check_deliveries(run: ZooKeeperRun, scenario: str) -> None:
    """What the children's logs say: nothing delivered while an earlier delivery of it was
    hidden; of a FIFO group, nothing while a delivery of an earlier receive was (a receive takes
    a group's tasks together), each receive's in order and the first deliveries in order; and
    nothing to a consumer whose filters exclude it."""
    assert run.sent and run.acked, "the children did no work"
    check_ended(run)  # receive counts rise; nothing comes back after a delete that returned
    by_id: dict[str, list[Delivery]] = collections.defaultdict(list)
    by_group: dict[tuple[str, str], list[Delivery]] = collections.defaultdict(list)
    for d in run.deliveries:
        by_id[d.id].append(d)
        if scenario == "fifo":  # a group's messages of one producer (the ids of two interleave)
            by_group[d.group, d.body.split(".")[0]].append(d)
    for deliveries in [*by_id.values(), *by_group.values()]:
        deliveries.sort(key=lambda d: d.stamp)  # (stable: one receive's in the order it gave them)
        earlier: list[Delivery] = []  # the settled deliveries of the earlier receives
        for stamp, together in itertools.groupby(deliveries, key=lambda d: d.stamp):
            receive = list(together)
            assert [d.id for d in receive] == sorted(d.id for d in receive), f"a receive at {stamp} gave {receive}"
            for first in earlier:
                end = run.end_of(first)
                assert end is not None and end <= stamp, f"{receive[0]} delivered while {first} was hidden"
            # (not settled: its consumer's last, maybe deleted or released unlogged, at any time)
            earlier += [d for d in receive if d in run.settled]
    for (group, _), deliveries in by_group.items():
        firsts = [d.id for d in deliveries if d.count == 1]
        assert firsts == sorted(firsts), f"group {group} first delivered out of order"
    if scenario == "filters":
        for d in run.deliveries:
            _, tier, region = d.body.split("/")
            assert allowed(d.filters, tier, region), f"{d} went to a consumer whose filters exclude it"
        assert any(d.filters for d in run.deliveries), "no consumer with filters received"


def check(url: str, run: ZooKeeperRun, scenario: str) -> None:
    with Broker(url) as broker:
        q = broker.queue("jobs")
        # Deleted within the lifetime: still there, finished (collected: only after it). First,
        # while the last deletes are recent (a loaded machine takes its time over the rest). The
        # children's deletes may all be older than that on a loaded machine: one made here now
        # is always checked, so the lifetime is never left unchecked.
        own = q.send(b"checked within the lifetime")
        q.delete_id(own)  # by id: a receive would take the oldest message, maybe one of theirs
        q.topic.gc()
        now = time.time_ns()
        recent = {id for (id, _), (start, _) in run.ended["fin"].items() if now - start < (LIFETIME - 0.5) * 1e9}
        assert {q.task(id).state for id in recent | {own}} == {"finished"}
        check_deliveries(run, scenario)
        deadline = time.monotonic() + 10 * SESSION
        while q.consumers() and time.monotonic() < deadline:  # the killed consumers' sessions end
            time.sleep(0.1)
        assert q.consumers() == {}
        if scenario == "dead":
            check_dead_letters(broker, run)
            return
        assert_finished(q, run.acked)
        # What is pending: what stats() counts, and nothing deleted.
        states = {}
        for id in run.sent | set(run.received):
            try:
                states[id] = q.task(id).state
            except TaskNotFoundError:
                states[id] = None  # finished and collected (or an unacknowledged send left half)
        stats = q.stats()
        drained: list[str] = []
        while got := q.receive(100, visibility_timeout=600):
            drained += [m.id for m in got]
            assert not any(q.delete_many([m.receipt for m in got]))
        assert len(drained) == len(set(drained)) == stats.available, "stats() is not what is there"
        assert (stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0)
        assert {id for id, state in states.items() if state == "inserted"} <= set(drained)
        assert {id for id, state in states.items() if state not in ("inserted", "finished", None)} == set()
        assert not set(drained) & run.acked, "a deleted message came back"
        # Sent and not there now: a consumer received it (and deleted it, logged or not).
        assert run.sent - set(drained) <= set(run.received), "acknowledged sends lost"
        # After their lifetime, the finished tasks go at the next collection.
        time.sleep(LIFETIME)
        broker.gc()
        for id in run.acked:
            with pytest.raises(TaskNotFoundError):
                q.task(id)
        assert q.stats().available == 0


def check_dead_letters(broker: Broker, run: ZooKeeperRun) -> None:
    """Every poison message reached the dead-letter queue: once, or twice when a consumer died
    between the dead letter's send and the task's end (the store's promise: never none); nothing
    went out more than ``max_receive_count`` times; nothing deleted is a dead letter."""
    q = broker.queue("jobs")
    assert all(d.count <= 2 for d in run.deliveries), "delivered more often than max_receive_count"
    drained = drain(q, lambda m: m.body[:1] == b"n")  # poison goes round until it is a dead letter
    assert all(m.receive_count <= 2 for m in drained) and q.receive(10) == []
    assert not {m.id for m in drained} & run.acked, "a deleted message came back"
    dead = drain(broker.queue("jobs-dead"))
    sources = collections.Counter(m.source["id"] for m in dead)
    assert all(m.source["count"] == 2 and m.source["queue"] == "jobs" for m in dead)
    assert not set(sources) & run.acked, "a deleted message is a dead letter too"
    poison = {d.id for d in run.deliveries if d.body[:1] == "p"} | {m.id for m in drained if m.body[:1] == b"p"}
    assert poison, "no poison message was sent"
    assert poison <= set(sources), f"poison lost: {sorted(poison - set(sources))}"
    for id in sources:
        try:
            assert q.task(id).state == "dead", f"dead letter {id} is not dead"
        except TaskNotFoundError:
            pass  # dead, and collected since
    # The rest: deleted (by a consumer killed before it logged that, too).
    assert_finished(q, run.sent - {m.id for m in drained if m.body[:1] == b"n"} - set(sources))
    stats = q.stats()
    assert (stats.available, stats.in_flight, stats.delayed) == (0, 0, 0)
    # (A mover killed after the task's end, before it counted it, counts it not at all.)
    assert stats.dead <= len(sources)
    twice = sum(n > 1 for n in sources.values())
    print(f"{len(sources)} dead letters ({twice} sent twice), {stats.dead} counted by stats()")


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "restart", "seconds"), [("plain", False, 8.0), ("plain", True, 8.0),
                                                              ("expire", False, 8.0), ("fifo", False, 5.0),
                                                              ("filters", False, 8.0), ("dead", False, 8.0)])
def test_random_kills_of_zookeeper_producers_and_consumers(
    tmp_path: Path, child_env: dict, scenario: str, restart: bool, seconds: float
) -> None:
    seed = int(os.environ.get("JOURNALQ_STRESS_SEED", "20261122"))
    seconds = float(os.environ.get("JOURNALQ_STRESS_SECONDS", seconds))
    with own_zookeeper(tmp_path / "zk") as server:
        run = stress(server, tmp_path, child_env, seed=seed, seconds=seconds, scenario=scenario, restart=restart)
        redelivered = sum(1 for d in run.deliveries if d.count > 1)
        print(f"{scenario} seed {seed}: {len(run.sent)} sent, {len(run.acked)} deleted, {len(run.ended['rel'])} "
              f"released, {redelivered} redelivered, {dict(run.events)}")
        check(server.url("/crash"), run, scenario)


@pytest.mark.slow
def test_a_batch_cut_by_a_server_crash_says_what_it_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server SIGKILLed in the middle of a batch of three chunks, after the first chunk's
    entries were applied and while the others' were in flight: ``PartialSendError`` (a
    ``StoreUnavailableError`` too) names the first chunk's messages stored and the others unsent;
    after the restart exactly those are there (the half-written rest is invisible), and sending
    the unsent again leaves every message once."""
    from journalq.errors import PartialSendError, StoreUnavailableError
    from journalq.queue.zookeeper import store
    with own_zookeeper(tmp_path / "zk") as server, Broker(server.url("/partial"), session_timeout=10) as broker:
        q = broker.queue("jobs")
        monkeypatch.setattr(store, "_BATCH_TASKS", 3)  # 8 messages: chunks of 3, 3 and 2
        write_entries = q.topic._write_entries
        chunks = iter(range(10**6))
        killer = threading.Timer(0.3, server.kill)

        def crash_at_the_second(chunk: list) -> object:
            if next(chunks) == 1:
                broker.client.sync("/")  # answered after every request sent before: applied
                # Frozen, then killed once the rest is sent (requests made while kazoo already
                # reconnects would wait for the server to come back, and not fail).
                server.process.send_signal(signal.SIGSTOP)
                killer.start()
            return write_entries(chunk)

        monkeypatch.setattr(q.topic, "_write_entries", crash_at_the_second)
        bodies = [b"m%d" % i for i in range(8)]
        with pytest.raises(PartialSendError, match=r"^3 of the 8 messages of the batch stored, not those at positions "
                                                   r"3-7: ZooKeeper at ") as failed:
            q.send_many(bodies)
        monkeypatch.undo()
        error = failed.value
        assert isinstance(error, StoreUnavailableError) and isinstance(error.__cause__, StoreUnavailableError)
        stored = error.ids[:3]
        assert None not in stored and error.ids[3:] == [None] * 5 and error.unsent == [3, 4, 5, 6, 7]
        killer.join()  # (the send fails as the socket closes, maybe before the kill reaped it)
        server.start()
        deadline = time.monotonic() + 30
        while True:  # (kazoo reconnects on its own)
            try:
                got = q.receive(10, visibility_timeout=600)
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "no reconnection"
                time.sleep(0.1)
        assert sorted((m.id, m.body) for m in got) == sorted(zip(stored, bodies[:3]))
        resent = q.send_many([bodies[i] for i in error.unsent])
        got += q.receive(10, visibility_timeout=600)
        assert sorted(m.body for m in got) == bodies and {m.id for m in got} == set(stored) | set(resent)
        assert q.receive(10, wait=0) == [] and not any(q.delete_many([m.receipt for m in got]))
        tasks = broker.client.get_children(f"{broker.path}/jobs/tasks")
        assert len(tasks) == 8 + 5  # the rest's data and metadata, written before the crash: orphans
        assert sorted(q.topic.collect(force=True, orphan_grace=0) or []) == sorted(set(tasks) - {m.id for m in got})
