"""The ZooKeeper store on a real server: zkmq's tree, claims that cannot be taken twice, consumers
in other processes (and killed with SIGKILL), the server itself killed mid-load, garbage
collection under its lock, and a sender that dies between the steps of a send. (The shared
queue tests also run on this store: see the ``store_root`` fixture.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from journalq.errors import (
    InvalidMessageError,
    InvalidSettingError,
    StaleReceiptError,
    StoreUnavailableError,
    TaskNotFoundError,
)
from journalq.queue import Broker
from journalq.queue.zookeeper import parse_url
from journalq.queue.zookeeper.layout import DedupRecord, Entry, TaskFacts, collectable, dedup_collectable

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

_paths = iter(range(10**6))


@pytest.fixture
def url(zookeeper_server) -> str:
    """A fresh path on the session's server."""
    return zookeeper_server.url(f"/zk{os.getpid()}x{next(_paths)}")


@pytest.fixture
def broker(url: str):
    with Broker(url, sync="none") as b:
        yield b


def spawn(code: str, *args: object, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env, **kwargs)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# -- the tree --------------------------------------------------------------------------------


def test_tree_is_zkmq_s(broker) -> None:
    zk, root = broker.client, broker.path
    q = broker.queue("jobs", enums={"performance_class": ["low", "standard"]}, task_gc_lifetime=7, task_gc_interval=3)
    task = q.send(b"\x00body", filters={"performance_class": "standard"}, metadata={"step": 1}, attributes={"k": "v"})
    d = f"{root}/jobs"
    assert sorted(zk.get_children(d)) == ["conf", "consumers", "queue", "tasks"]
    assert sorted(zk.get_children(f"{d}/conf")) == ["task_gc_interval", "task_gc_lifetime"]
    assert zk.get(f"{d}/conf/task_gc_lifetime")[0] == b"7.0" and zk.get(f"{d}/conf/task_gc_interval")[0] == b"3.0"
    assert zk.get_children(f"{d}/queue") == [task]
    assert sorted(zk.get_children(f"{d}/tasks/{task}")) == ["data", "filters", "metadata", "state"]
    assert zk.get(f"{d}/tasks/{task}/data")[0] == b"\x00body"
    assert zk.get(f"{d}/tasks/{task}/state")[0] == b"inserted"
    assert zk.get(f"{d}/tasks/{task}/filters/performance_class")[0] == b"standard"
    assert json.loads(zk.get(f"{d}/tasks/{task}/metadata")[0]) == {"a": {"k": ["String", "v"]}, "m": {"step": 1}}
    (m,) = q.receive()
    claim, stat = zk.get(f"{d}/tasks/{task}/claim")
    assert claim == q.consumer_id.encode() and stat.ephemeralOwner == zk.client_id[0]
    assert zk.get(f"{d}/tasks/{task}/state")[0] == b"claimed"
    assert zk.exists(f"{d}/consumers/{q.consumer_id}/current").ephemeralOwner == zk.client_id[0]
    assert json.loads(zk.get(f"{d}/consumers/{q.consumer_id}/current")[0]) == [task]
    q.delete(m.receipt)
    assert zk.get_children(f"{d}/queue") == [] and zk.exists(f"{d}/tasks/{task}/claim") is None
    assert zk.get(f"{d}/tasks/{task}/state")[0] == b"finished"


def test_urls() -> None:
    assert parse_url("zk://a:1,b:2/x/y") == ("a:1,b:2", "/x/y")
    assert parse_url("zk://127.0.0.1:2181/jq/") == ("127.0.0.1:2181", "/jq")
    for bad in ("zk://a:1", "zk://a:1/", "zk://a:99999/x", "zk://a/zookeeper", "zk://a/../x", "zk://a b/x", "zk:///x"):
        with pytest.raises(InvalidSettingError):
            parse_url(bad)
        with pytest.raises(InvalidSettingError):
            Broker(bad)


def test_unreachable_ensemble_is_a_clear_error() -> None:
    from journalq.queue.zookeeper.server import free_port

    with pytest.raises(StoreUnavailableError, match="no ZooKeeper answered"):
        Broker(f"zk://127.0.0.1:{free_port()}/x", connect_timeout=1)


def test_a_broker_that_fails_to_open_closes_its_session(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import ConnectionLoss

    started: list[KazooClient] = []
    start = KazooClient.start

    def record_start(self: KazooClient, *args, **kwargs) -> None:
        started.append(self)
        start(self, *args, **kwargs)

    def lose(self: KazooClient, path: str, *args, **kwargs) -> None:
        raise ConnectionLoss()

    monkeypatch.setattr(KazooClient, "start", record_start)
    monkeypatch.setattr(KazooClient, "ensure_path", lose)
    with pytest.raises(StoreUnavailableError, match="ConnectionLoss"):
        Broker(url)
    (client,) = started
    assert not client.connected and not client.handler.running  # no session, no threads left


def test_what_the_store_cannot_do_is_refused(broker) -> None:
    with pytest.raises(InvalidSettingError, match="retention by size"):
        broker.queue("jobs", retention_bytes=10**6)
    with pytest.raises(InvalidSettingError, match="no shards"):
        broker.queue("jobs", shards=2)
    q = broker.queue("jobs")
    with pytest.raises(Exception, match="one channel per queue"):
        q.topic.channel("other")
    with pytest.raises(Exception, match="over the ZooKeeper store"):
        q.send(b"x" * 1_000_001)
    with pytest.raises(Exception, match="filter name 'zone/eu'"):
        q.send_many([b"fine", {"body": b"x", "filters": {"zone/eu": "1"}}])
    assert q.stats().available == 0


def test_a_receive_takes_a_groups_tasks_in_order_and_keeps_order_after_expiry(broker) -> None:
    """As on files (SQS FIFO's batches): a receive takes a group's next tasks after its first, in
    one transaction; ``one_per_group`` takes the first alone. After their visibility runs out,
    they come back in order."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"%s%d" % (g, i), "group_id": g.decode()} for i in range(3) for g in (b"x", b"y")])
    q.send(b"plain")
    got = q.receive(10, visibility_timeout=0.2, one_per_group=True)
    assert [m.body for m in got] == [b"x0", b"y0", b"plain"]
    time.sleep(0.25)
    got = q.receive(4)
    assert [m.body for m in got] == [b"x0", b"y0", b"x1", b"y1"] and [m.receive_count for m in got] == [2, 2, 1, 1]
    assert [m.body for m in q.receive(10)] == [b"plain"]  # nothing of a group while some of it is out
    q.delete_many([m.receipt for m in got])
    assert [m.body for m in q.receive(10)] == [b"x2", b"y2"]


def test_a_group_whose_first_task_comes_back_while_a_later_one_is_held_stays_held(broker) -> None:
    """A consumer that gives back the first task of its batch but keeps the second still holds
    the group (``Entry.then``): nothing of it goes to anyone until the second is done; the
    claim that then takes the first checks the second's entry unchanged."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(3)])
    first, second = q.receive(2)
    q.release(first.receipt)
    assert q.receive(1) == []  # (a look that stops at its first pick learns of the second from the first's entry)
    assert q.receive(10) == []
    q.change_visibility(second.receipt, 0.2)  # still held a while
    assert q.receive(10, wait=0) == []
    time.sleep(0.25)  # the second's visibility ran out: the group is free, in order
    assert [m.body for m in q.receive(10)] == [b"x0", b"x1", b"x2"]


def test_a_first_task_past_its_receives_waits_for_its_group_before_it_moves(broker) -> None:
    """The first task of a batch, given back past ``max_receive_count``, is not moved to the
    dead-letter queue while the second is held: it waits with its group, then moves."""
    dlq = broker.queue("fifo-dlq")
    q = broker.queue("fifo", max_receive_count=1, dead_letter_queue="fifo-dlq")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(2)])
    first, second = q.receive(2)
    q.release(first.receipt)
    assert q.receive(10) == []
    assert (q.stats().dead, dlq.stats().available) == (0, 0)
    q.delete(second.receipt)
    assert q.receive(10) == []  # the first moves now
    assert [m.body for m in dlq.receive(10)] == [b"x0"]


def test_a_groups_claim_fails_when_a_later_task_is_held_again_after_the_look(
    broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look read the later task free (its visibility over); its holder hides it again before
    the claim: the claim, which checks that entry unchanged, fails, and the group stays held."""
    from journalq.queue.zookeeper.store import ZooKeeperQueue

    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(2)])
    first, second = q.receive(2, visibility_timeout=0.2)
    q.release(first.receipt)
    time.sleep(0.25)  # the second's visibility ran out: free, but its receipt still current
    real = ZooKeeperQueue._group_holds

    def then_hidden_again(self, *args):
        found = real(self, *args)
        monkeypatch.setattr(ZooKeeperQueue, "_group_holds", real)  # once
        q.change_visibility(second.receipt, 30)
        return found

    monkeypatch.setattr(ZooKeeperQueue, "_group_holds", then_hidden_again)
    assert q.receive(1) == []
    q.delete(second.receipt)
    assert [m.body for m in q.receive(10)] == [b"x0"]


def test_a_hide_after_the_claim_ran_out_fails_when_another_receive_takes_the_group_after_the_look(
    broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change read the group free, then another receive claims its first task before the
    change commits: the change, which checks the group's entries unchanged, fails, reads
    again and is refused (the group would have two holders)."""
    from journalq.queue.zookeeper.store import ZooKeeperQueue

    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(2)])
    first, second = q.receive(2, visibility_timeout=0.2)
    time.sleep(0.25)  # both ran out: receipts still current, the group free
    real = ZooKeeperQueue._group_entries
    taken: list[bytes] = []

    def then_taken(self, *args):
        found = real(self, *args)
        monkeypatch.setattr(ZooKeeperQueue, "_group_entries", real)  # once
        taken.extend(m.body for m in q.receive(1))
        return found

    monkeypatch.setattr(ZooKeeperQueue, "_group_entries", then_taken)
    with pytest.raises(StaleReceiptError, match="another receive took its FIFO group"):
        q.change_visibility(second.receipt, 30)
    assert taken == [b"x0"]


def test_the_guard_of_a_hide_after_a_claim_ran_out_is_pure() -> None:
    """``group_guard``: the group taken by another claim refuses the change; else the change
    checks every other entry of the group, and names its task in the group's first task's
    ``then`` when that one comes before it and is free (so that no look claims it meanwhile)."""
    from journalq.queue.zookeeper.layout import group_guard

    now, live = 10_000, {"c1", "c2"}
    first = Entry(at=now - 5, count=1)  # given back: free, first of the group
    late = Entry(at=now - 1, count=1, by="c1", group="g", received=500)  # its claim ran out
    other = Entry(at=now - 1, count=1, by="c1", group="g", received=500)
    group = {"01": (first, 3), "02": (late, 7), "03": (other, 7)}
    taken, guard = group_guard("02", late, group, now, live)
    assert not taken and guard == [("01", 3, Entry(at=now - 5, count=1, then=("02",))), ("03", 7, None)]
    # Hidden again by the same claim's receipt: still not taken; the first already names it: checked.
    group = {"01": (Entry(at=now - 5, count=1, then=("02",)), 4), "02": (late, 7), "03": (late.hidden(30, now), 8)}
    assert group_guard("02", late, group, now, live) == (False, [("01", 4, None), ("03", 8, None)])
    # Another receive holds a task of the group: taken.
    held = Entry(at=now + 30_000, count=2, by="c2", group="g", received=now)
    assert group_guard("02", late, {"01": (held, 5), "02": (late, 7)}, now, live) == (True, [])
    # (The hidden entry keeps its holder while hidden, and names none once given back.)
    assert late.hidden(30, now) == Entry(at=now + 30, count=1, by="c1", group="g", received=500)
    assert late.hidden(0, now).by is None and late.hidden(0, now).at == now


def test_a_send_that_fails_in_its_garbage_collection_stored_nothing(broker, monkeypatch: pytest.MonkeyPatch) -> None:
    from kazoo.exceptions import ConnectionLoss

    q = broker.queue("jobs", task_gc_interval=0.001)

    def lose(*args, **kwargs) -> None:
        raise ConnectionLoss()

    monkeypatch.setattr(q.topic, "collect", lose)
    time.sleep(0.01)
    # A send that says it failed is sent again by its caller: it must not have stored anything.
    with pytest.raises(StoreUnavailableError):
        q.send(b"x")
    monkeypatch.undo()
    assert q.receive(wait=0) == []


def _lose_entries_of_chunks(q, monkeypatch: pytest.MonkeyPatch, lost: set[int]) -> None:
    """Batches of 2 messages per chunk; the queue entries of the chunks numbered in ``lost`` (from
    0) are never written, and their answer is a broken connection."""
    from kazoo.exceptions import ConnectionLoss

    from journalq.queue.zookeeper import store

    class Lost:
        def commit_async(self) -> Lost:
            return self

        def get(self) -> None:
            raise ConnectionLoss()

    write_entries = q.topic._write_entries
    chunks = iter(range(10**6))

    def write_some(chunk):
        return Lost() if next(chunks) in lost else write_entries(chunk)

    monkeypatch.setattr(store, "_BATCH_TASKS", 2)
    monkeypatch.setattr(q.topic, "_write_entries", write_some)


def test_a_batch_of_chunks_cut_short_says_which_messages_are_stored(broker, monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.errors import PartialSendError

    q = broker.queue("jobs")
    bodies = [b"m%d" % i for i in range(6)]
    _lose_entries_of_chunks(q, monkeypatch, {1})  # the second chunk of three
    stored_in_part = r"4 of the 6 messages of the batch stored, not those at positions 2-3: "
    with pytest.raises(PartialSendError, match=stored_in_part) as failed:
        q.send_many(bodies)
    monkeypatch.undo()
    error = failed.value
    assert isinstance(error, StoreUnavailableError) and isinstance(error.__cause__, StoreUnavailableError)
    assert error.unsent == [2, 3] and error.ids[2:4] == [None, None] and None not in error.ids[:2] + error.ids[4:]
    got = q.receive(10, wait=0)
    assert sorted((m.id, m.body) for m in got) == sorted((error.ids[i], bodies[i]) for i in (0, 1, 4, 5))
    q.send_many([bodies[i] for i in error.unsent])  # the retry that the error makes possible
    assert sorted(m.body for m in got + q.receive(10, wait=0)) == bodies


def test_a_batch_that_stored_nothing_raises_its_own_error(broker, monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.errors import PartialSendError

    q = broker.queue("jobs")
    _lose_entries_of_chunks(q, monkeypatch, {0, 1})
    with pytest.raises(StoreUnavailableError) as failed:
        q.send_many([b"a", b"b", b"c"])
    monkeypatch.undo()
    assert not isinstance(failed.value, PartialSendError) and q.receive(10, wait=0) == []


def test_two_senders_racing_with_one_dedup_id_store_one_message(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read no record of the id; the first to write its entry stores its message, and the
    other's entry fails on the record: it returns the first's id, deletes what it wrote, and
    still stores the rest of its batch."""
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        write = qb.topic._write
        firsts: list[str] = []

        def after_the_other(chunks):
            firsts.append(qa.send(b"from a", dedup_id="same"))  # between b's read and b's writes
            return write(chunks)

        monkeypatch.setattr(qb.topic, "_write", after_the_other)
        ids = qb.send_many([{"body": b"from b", "dedup_id": "same"}, b"other"])
        monkeypatch.undo()
        assert ids[0] == firsts[0] and ids[1] != ids[0]
        assert sorted((m.id, m.body) for m in qb.receive(10)) == sorted([(firsts[0], b"from a"), (ids[1], b"other")])
        zk = a.client
        assert sorted(zk.get_children(f"{a.path}/jobs/tasks")) == sorted(ids)  # b's duplicate is gone
        assert len(zk.get_children(f"{a.path}/jobs/dedup")) == 1


def test_threads_of_many_brokers_sending_one_dedup_id_store_it_once(url: str) -> None:
    brokers = [Broker(url, sync="none") for _ in range(4)]
    try:
        queues = [b.queue("jobs") for b in brokers]
        got: list[list[str]] = [[] for _ in queues]
        start = threading.Barrier(len(queues))

        def send(n: int) -> None:
            start.wait()
            got[n] = queues[n].send_many([{"body": b"%d" % i, "dedup_id": f"id-{i}"} for i in range(20)])

        threads = [threading.Thread(target=send, args=(n,)) for n in range(len(queues))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(ids == got[0] for ids in got) and len(set(got[0])) == 20
        assert sorted(m.id for m in queues[0].receive(100)) == sorted(got[0])
    finally:
        for b in brokers:
            b.close()


def test_gc_deletes_the_dedup_records_whose_window_is_over(broker) -> None:
    q = broker.queue("jobs", dedup_window=0.2)
    zk, dedup = broker.client, f"{broker.path}/jobs/dedup"
    first = q.send(b"x", dedup_id="short")
    time.sleep(0.3)
    later = q.send(b"y", dedup_id="long")
    made = {json.loads(zk.get(f"{dedup}/{name}")[0])["id"]: zk.exists(f"{dedup}/{name}").ctime
            for name in zk.get_children(dedup)}
    q.topic._collect_dedup(made[later] + 100)  # (times are the server's) the first's window is over
    (kept,) = zk.get_children(dedup)
    assert json.loads(zk.get(f"{dedup}/{kept}")[0])["id"] == later
    time.sleep(0.3)
    q.topic.gc()
    assert zk.get_children(dedup) == []
    assert q.send(b"x again", dedup_id="short") not in (first, later)


def test_messages_too_large_for_zookeeper_are_refused_before_anything_is_written(broker) -> None:
    q = broker.queue("jobs")
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's"):
        q.send(b"x", metadata={"blob": "m" * 1_100_000})
    # Many messages whose metadata is large only together go out in several transactions.
    q.send_many([{"body": b"%d" % i, "metadata": {"blob": "m" * 30_000}} for i in range(60)])
    assert q.stats().available == 60
    tasks = broker.client.get_children(f"{broker.path}/jobs/tasks")
    assert tasks == broker.client.get_children(f"{broker.path}/jobs/queue")
    task = q.receive()[0].id
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's"):
        q.set_metadata(task, {"blob": "m" * 1_100_000})
    assert q.task(task).metadata == {"blob": "m" * 30_000}


# -- claims ----------------------------------------------------------------------------------


def test_threads_of_many_brokers_never_claim_one_task_twice(url: str) -> None:
    with Broker(url) as b:
        ids = set(b.queue("jobs").send_many([b"%d" % i for i in range(300)]))
    got: list[str] = []
    lock = threading.Lock()

    def drain() -> None:
        with Broker(url) as b:
            q = b.queue("jobs")
            while batch := q.receive(7, visibility_timeout=60):
                with lock:
                    got.extend(m.id for m in batch)
                assert not any(q.delete_many([m.receipt for m in batch]))

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == sorted(ids)  # each once


def test_a_live_consumer_s_expired_claim_is_taken_over(url: str) -> None:
    with Broker(url) as a, Broker(url) as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        task = qa.send(b"x")
        (first,) = qa.receive(visibility_timeout=0.2)
        assert qb.receive() == []
        time.sleep(0.25)
        (second,) = qb.receive(visibility_timeout=30)
        assert second.id == task and second.receive_count == 2
        claim = b.client.exists(f"{b.path}/jobs/tasks/{task}/claim")
        assert claim.ephemeralOwner == b.client.client_id[0]  # b's lock now, a's is gone
        assert qa.task(task).consumer == qb.consumer_id
        with pytest.raises(Exception, match=r"delivered again \(delivery 2\)"):
            qa.delete(first.receipt)
        qb.delete(second.receipt)


def test_a_consumer_that_registers_while_another_receives_keeps_its_claim(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the crash test: B lists the consumers; then A, new, registers and claims the
    task; then B reads the task's entry, held by A, whom B's list lacks: B took A for dead and
    received the task too, while A held it hidden."""
    with Broker(url) as b, Broker(url) as a:
        qb, qa = b.queue("jobs", visibility_timeout=600), a.queue("jobs")
        qb.send(b"x")
        held = []
        listing = qb._pending

        def listing_then_a_receives(relist: bool, watch: bool) -> tuple[list[str], bool]:
            result = listing(relist, watch)  # after B asked for the consumers, before the entries
            if not held:
                held.extend(qa.receive())
            return result

        monkeypatch.setattr(qb, "_pending", listing_then_a_receives)
        assert qb.receive() == []
        assert len(held) == 1 and qb.task(held[0].id).state == "claimed"
        qa.delete(held[0].receipt)  # A's receipt is still the latest


def expire_session(broker) -> None:
    """End ``broker``'s ZooKeeper session as the server does when it expires it (ephemeral nodes
    deleted): another client joins the session (its id and password) and closes it. The broker's
    client then finds its session expired and opens a new one (kazoo's LOST, then CONNECTED)."""
    from kazoo.client import KazooClient

    old = broker.client.client_id
    other = KazooClient(hosts=broker.hosts, client_id=old)
    other.start(timeout=10)
    other.stop()
    other.close()
    deadline = time.monotonic() + 10
    while (broker.client.client_id or old)[0] == old[0]:
        assert time.monotonic() < deadline, "the broker's client did not open a new session"
        time.sleep(0.01)


def test_a_consumer_whose_session_expired_is_a_new_consumer_when_it_reconnects(url: str) -> None:
    """A claim belongs to a session: the process that reconnects does not hold its old claims
    again (before, it registered under the same id, and they looked held until their visibility
    timeout ended)."""
    with Broker(url) as a, Broker(url) as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        t, u = qa.send_many([b"t", b"u"])
        assert [m.id for m in qa.receive(2, visibility_timeout=600)] == [t, u]
        before = qa.consumer_id
        expire_session(a)
        (again,) = qa.receive(visibility_timeout=600)  # free at once, to it as to any other
        assert (again.id, again.receive_count) == (t, 2) and qa.consumer_id != before
        (other,) = qb.receive(visibility_timeout=600)
        assert (other.id, other.receive_count) == (u, 2)
        assert qb.consumers() == {qa.consumer_id: [t], qb.consumer_id: [u]}
        assert qb.task(t).consumer == qa.consumer_id
        qa.delete(again.receipt)
        qb.delete(other.receipt)


def test_receipts_of_a_session_that_expired_are_refused(url: str) -> None:
    """Its claims ended with the session: their receipts no longer delete or hide (another
    consumer may be working on the task), from that process or any other; and its close does
    not keep them hidden."""
    with Broker(url) as a, Broker(url) as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        ids = qa.send_many([b"t", b"u", b"v"])
        t, u, v = qa.receive(3, visibility_timeout=600)
        expire_session(a)
        refused = [*qa.delete_many([t.receipt]), *qa.change_visibility_many([(u.receipt, 600), (v.receipt, 0)]),
                   *qb.delete_many([u.receipt])]
        assert all(isinstance(e, StaleReceiptError) and "session of consumer" in str(e) for e in refused), refused
        a.close()  # leaves cleanly, but what it held was not its own any more
        got = qb.receive(3, visibility_timeout=600)
        assert sorted(m.id for m in got) == ids and {m.receive_count for m in got} == {2}
        assert not any(qb.delete_many([m.receipt for m in got]))


def test_a_session_that_expires_as_its_consumer_claims_wins_nothing_others_could_take(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ends between the consumer's registration and its claim: the claim, made in the
    client's new session, must not name the consumer registered in the old one (whose claims
    others take for dead): it fails, and the receive registers again and claims anew."""
    with Broker(url) as a, Broker(url) as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        qa.receive(wait=0)  # registered
        task = qa.send(b"x")
        listing = qa._pending
        expired: list[str] = []

        def listing_then_expiry(relist: bool, watch: bool) -> tuple[list[str], bool]:
            result = listing(relist, watch)  # after the registration, before the claim
            if task in result[0] and not expired:
                expired.append(qa.consumer_id)
                expire_session(a)
            return result

        monkeypatch.setattr(qa, "_pending", listing_then_expiry)
        (m,) = qa.receive(visibility_timeout=600)
        assert m.id == task and m.receive_count == 1 and expired != [qa.consumer_id]
        assert qb.receive() == []  # held by a consumer alive
        assert qb.task(task).consumer == qa.consumer_id
        qa.delete(m.receipt)


def test_a_claim_never_takes_the_lock_of_a_holder_taken_for_dead(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A receive whose liveness read takes a live holder for dead finds the holder's lock: its
    claim fails and the holder keeps the task (before, the claim was tried again replacing the
    lock: a takeover of a live consumer's task). Once the holder's visibility timeout ran out,
    the lock is replaced, whatever the liveness read said."""
    with Broker(url) as a, Broker(url) as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        task = qa.send(b"x")
        (held,) = qa.receive(visibility_timeout=600)
        monkeypatch.setattr(qb, "_live", lambda consumers=None: {qb.consumer_id})  # a taken for dead
        lock = f"{b.path}/jobs/tasks/{task}/claim"
        assert qb.receive() == []
        assert b.client.get(lock)[1].ephemeralOwner == a.client.client_id[0]
        qa.change_visibility(held.receipt, 0.2)
        time.sleep(0.25)
        (again,) = qb.receive(visibility_timeout=600)
        assert again.id == task and again.receive_count == 2
        assert b.client.get(lock)[1].ephemeralOwner == b.client.client_id[0]
        monkeypatch.undo()
        with pytest.raises(Exception, match=r"delivered again \(delivery 2\)"):
            qa.delete(held.receipt)
        qb.delete(again.receipt)


def test_a_consumer_that_closes_keeps_its_tasks_hidden_for_their_visibility(url: str) -> None:
    with Broker(url) as b:
        q = b.queue("jobs")
        q.send(b"x")
        a = Broker(url)
        (held,) = a.queue("jobs").receive(visibility_timeout=0.5)
        a.close()  # its session (and its lock) ends, but it left cleanly: not a crash
        assert q.receive() == [] and q.stats().in_flight == 1
        assert q.task(held.id).state == "claimed"
        time.sleep(0.55)
        (again,) = q.receive()
        assert again.id == held.id and again.receive_count == 2


def test_a_stale_receipt_cannot_delete_a_task_that_a_dead_letter_mover_claimed(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's visibility ran out; a mover claims the task for the dead-letter queue (its
    receive count ran out), and then the consumer deletes with its receipt: refused, else the
    task were both deleted and dead-lettered (the mover's mark then failed, and stats missed it)."""

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        qa = a.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
        task = qa.send(b"x")
        (m,) = qa.receive(visibility_timeout=0.2)
        time.sleep(0.3)
        qb = b.queue("jobs")
        move = qb._send_dead
        refused: list[object] = []

        def consumer_deletes_first(claimed: list) -> None:
            refused.extend(qa.delete_many([m.receipt]))  # between the mover's claim and its move
            move(claimed)

        monkeypatch.setattr(qb, "_send_dead", consumer_deletes_first)
        assert qb.receive(10) == []
        monkeypatch.undo()
        assert isinstance(refused[0], StaleReceiptError) and "dead-letter queue" in str(refused[0])
        assert qa.task(task).state == "dead" and qa.stats().dead == 1
        assert [d.source["id"] for d in a.queue("jobs-dlq").receive(10)] == [task]


def test_a_dead_letter_keeps_when_it_was_first_sent_as_on_files(broker) -> None:
    """The dead letter's source is the file store's: which task it was, its receive count, and
    when it was first sent (SQS keeps a dead letter's SentTimestamp; the move's is its own)."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    task = q.send(b"poison")
    (first,) = q.receive(visibility_timeout=0)
    time.sleep(0.01)
    assert q.receive() == []  # moved
    (dead,) = broker.queue("jobs-dlq").receive()
    assert dead.source == {
        "queue": "jobs", "channel": "default", "id": task, "count": 1, "sent_at_ns": first.sent_at_ns
    }
    assert first.sent_at_ns < dead.sent_at_ns


# -- processes -------------------------------------------------------------------------------

CONSUMER = """
    import os, sys
    from journalq.queue import Broker

    root, out, done = sys.argv[1], sys.argv[2], sys.argv[3]
    with Broker(root, session_timeout=1.0) as broker, open(out, "w") as log:
        q = broker.queue("jobs")
        idle = 0
        while True:
            got = q.receive(10, wait=0.2, visibility_timeout=60)
            if got:
                idle = 0
                errors = q.delete_many([m.receipt for m in got])
                log.write("".join(m.body.decode() + ("\\n" if e is None else f" error {e}\\n")
                                  for m, e in zip(got, errors)))
                log.flush()
            elif os.path.exists(done):
                idle += 1
                if idle >= 3:
                    break
"""


def test_two_consumer_processes_drain_a_queue_each_task_once(url: str, tmp_path: Path, child_env: dict) -> None:
    done = tmp_path / "done"
    with Broker(url) as broker:
        q = broker.queue("jobs")
        outs = [tmp_path / f"c{i}.log" for i in range(2)]
        consumers = [spawn(CONSUMER, url, out, done, env=child_env) for out in outs]
        for start in range(0, 1000, 100):
            q.send_many([b"%d" % i for i in range(start, start + 100)])
        done.touch()
        for c in consumers:
            assert c.wait(120) == 0
        lines = [line for out in outs for line in read_lines(out)]
        assert not [line for line in lines if "error" in line]
        assert sorted(map(int, lines)) == list(range(1000))  # every task, each once
        assert all(read_lines(out) for out in outs)  # both took part
        assert q.stats().available == 0


HOLDER = """
    import sys, time
    from journalq.queue import Broker

    with Broker(sys.argv[1], session_timeout=1.0) as broker:
        q = broker.queue("jobs")
        got = q.receive(5, visibility_timeout=600)
        print(" ".join(m.id for m in got), flush=True)
        time.sleep(600)
"""


def test_a_consumer_killed_gives_its_tasks_back_when_its_session_expires(url: str, child_env: dict) -> None:
    with Broker(url) as broker:
        q = broker.queue("jobs")
        ids = q.send_many([b"%d" % i for i in range(8)])
        holder = spawn(HOLDER, url, env=child_env, stdout=subprocess.PIPE, text=True)
        try:
            held = holder.stdout.readline().split()
            assert held == ids[:5]
            assert [m.id for m in q.receive(10, visibility_timeout=600)] == ids[5:]
            assert q.receive() == []  # the live holder's tasks stay hidden
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            killed_at = time.monotonic()
            back = q.receive(10, wait=10, visibility_timeout=600)
            waited = time.monotonic() - killed_at
        finally:
            holder.kill()
            holder.wait()
        assert sorted(m.id for m in back) == held and all(m.receive_count == 2 for m in back)
        assert waited < 8  # its session (1 s) ended; the 600 s visibility timeout did not matter
        assert all(q.task(i).state == "claimed" and q.task(i).consumer == q.consumer_id for i in held)
        consumers = f"{broker.path}/jobs/consumers"
        assert len(broker.client.get_children(consumers)) == 2  # the dead one's node is left...
        q.topic.collect(force=True)
        assert broker.client.get_children(consumers) == [q.consumer_id]  # ...until a collection
        assert list(q.consumers()) == [q.consumer_id]


PRODUCER = """
    import sys, time
    from journalq.errors import StoreUnavailableError
    from journalq.queue import Broker

    root, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Broker(root, session_timeout=5.0) as broker, open(out, "w") as log:
        q = broker.queue("jobs")
        i = 0
        while i < count:
            try:
                q.send(b"%d" % i)
            except StoreUnavailableError:
                time.sleep(0.05)
                print("retry", flush=True)
                continue  # not acknowledged: send it again (perhaps twice: at least once)
            log.write(f"{i}\\n")  # acknowledged
            log.flush()
            i += 1
"""


RETRYING_CONSUMER = """
    import os, sys, time
    from journalq.errors import StoreUnavailableError
    from journalq.queue import Broker

    root, out, done = sys.argv[1], sys.argv[2], sys.argv[3]
    with Broker(root, session_timeout=5.0) as broker, open(out, "w") as log:
        q = broker.queue("jobs")
        while True:
            try:
                got = q.receive(10, wait=0.2, visibility_timeout=30)
                if not got:
                    if os.path.exists(done):
                        break
                    continue
                # Processed (logged) before the delete, as an at-least-once consumer must: a delete
                # cut by the outage may or may not have been done.
                log.write("".join(m.body.decode() + "\\n" for m in got))
                log.flush()
                q.delete_many([m.receipt for m in got])
            except StoreUnavailableError:
                time.sleep(0.05)  # what it held comes back to it (or another) later: at least once
"""


# Killed right after it marked its dead letters dead, as it would have counted them.
KILLED_AFTER_MARKING = """
import os, signal, sys
from journalq.queue import Broker
from journalq.queue.zookeeper.store import ZooKeeperQueue

act = ZooKeeperQueue._act
def act_and_die(self, receipts, change, **options):
    outcomes = act(self, receipts, change, **options)
    if change(0, None)[0] == "dead":  # (the mover's: it ends the tasks as dead)
        os.kill(os.getpid(), signal.SIGKILL)
    return outcomes
ZooKeeperQueue._act = act_and_die
with Broker(sys.argv[1], session_timeout=1.0) as broker:
    broker.queue("jobs").receive(10)
"""


def test_a_dead_letter_mover_killed_after_its_move_counted_it(url: str, child_env: dict) -> None:
    from test_queue_dead_letters import poison_moved_by_a_killed_mover

    poison = poison_moved_by_a_killed_mover(url, KILLED_AFTER_MARKING, child_env)
    with Broker(url, sync="none") as broker:
        q = broker.queue("jobs")
        assert q.task(poison).state == "dead"
        assert q.stats().dead == 1  # counted in the transaction that marked it


def test_server_killed_and_restarted_mid_load_loses_no_acknowledged_message(tmp_path: Path, child_env: dict) -> None:
    from journalq.queue.zookeeper.server import ZooKeeperServer

    with ZooKeeperServer(tmp_path / "zk") as server:
        url = server.url("/jobs")
        acked, consumed, done = tmp_path / "acked.log", tmp_path / "consumed.log", tmp_path / "done"
        producer = spawn(PRODUCER, url, acked, 600, env=child_env, stdout=subprocess.PIPE, text=True)
        consumer = spawn(RETRYING_CONSUMER, url, consumed, done, env=child_env)
        try:
            deadline = time.monotonic() + 60
            while len(read_lines(acked)) < 150 and time.monotonic() < deadline:
                time.sleep(0.02)
            # Freeze the server first, so that the producer's next request is surely in flight
            # (sent, unanswered) when the crash comes: requests made while kazoo is reconnecting
            # wait for it and meet no failure at all.
            server.process.send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            server.kill()  # mid-load: SIGKILL, as a crash
            time.sleep(0.5)
            server.start()  # same port, same data
            retries = producer.communicate(timeout=120)[0].split()
            assert producer.returncode == 0
            done.touch()
            assert consumer.wait(120) == 0
        finally:
            producer.kill()
            consumer.kill()
        assert retries  # the producer met the outage (and sent again what was not acknowledged)
        sent = [int(line) for line in read_lines(acked)]
        assert sent == list(range(600))
        got = [int(line) for line in read_lines(consumed)]
        assert got  # the consumer worked through the outage too
        with Broker(url) as broker:
            q = broker.queue("jobs")
            # A receive whose answer the outage cut leaves its tasks hidden for their visibility
            # timeout (30 s): wait that out for whatever is still missing.
            deadline = time.monotonic() + 45
            while not set(sent) <= set(got) and time.monotonic() < deadline:
                batch = q.receive(100, wait=1, visibility_timeout=60)
                got += [int(m.body) for m in batch]
                q.delete_many([m.receipt for m in batch])
        assert set(got) == set(sent)  # duplicates allowed (a send retried), nothing lost


# -- garbage collection ------------------------------------------------------------------------


def test_gc_removes_finished_tasks_and_nothing_else(url: str) -> None:
    with Broker(url) as broker:
        zk = broker.client
        q = broker.queue("jobs", task_gc_lifetime=0.5, task_gc_interval=3600, max_receive_count=1,
                         dead_letter_queue="dlq")
        old_dead = q.send(b"dead")
        q.receive(visibility_timeout=0)
        assert q.receive() == []  # its second receive sends it to the dead-letter queue
        old_done = q.send(b"done")
        (m,) = q.receive()
        q.delete(m.receipt)
        assert q.task(old_dead).state == "dead" and q.task(old_done).state == "finished"
        time.sleep(0.6)
        held, waiting, delayed, fresh = q.send(b"held"), q.send(b"waiting"), q.send(b"later", delay=600), q.send(b"f")
        (m_held,) = q.receive(visibility_timeout=600)
        q.delete_id(fresh)  # finished, but not long ago
        tasks = f"{broker.path}/jobs/tasks"
        before = set(zk.get_children(tasks))
        assert set(q.topic.gc()) == {old_done, old_dead}
        assert set(zk.get_children(tasks)) == before - {old_done, old_dead}
        for gone in (old_done, old_dead):
            with pytest.raises(TaskNotFoundError):
                q.task(gone)
        states = {i: q.task(i).state for i in (held, waiting, delayed, fresh)}
        assert states == {held: "claimed", waiting: "inserted", delayed: "inserted", fresh: "finished"}
        assert q.topic.gc() == []  # nothing else is due
        q.delete(m_held.receipt)
        (dl,) = broker.queue("dlq").receive()
        assert dl.body == b"dead" and dl.source["id"] == old_dead


def test_gc_runs_every_interval_by_whoever_comes_and_never_twice_at_once(url: str) -> None:
    with Broker(url) as a, Broker(url) as b:
        qa = a.queue("jobs", task_gc_lifetime=0, task_gc_interval=2.0)
        qb = b.queue("jobs")
        lock = f"{a.path}/jobs/conf/lock"
        b.client.create(lock, b"b collects", ephemeral=True)  # b holds the lock
        assert qa.topic.collect(force=True) is None  # so a does not collect meanwhile
        b.client.delete(lock)
        qa.send(b"x")
        (x,) = qa.receive()
        qa.delete(x.receipt)
        assert qa.topic.collect(force=True) == [x.id]
        qa.send(b"y")
        (y,) = qa.receive()
        qa.delete(y.receipt)
        assert qb.topic.collect() is None  # another participant, but the interval is not over
        time.sleep(2.05)
        assert qb.topic.collect() == [y.id]  # now b collects, in turn
        assert json.loads(a.client.get(f"{a.path}/jobs/conf")[0])["collected_by"] == b.participant
        qb.send(b"z")  # producers collect too, as they send
        (z,) = qa.receive()
        qa.delete(z.receipt)
        time.sleep(2.05)
        qa.send(b"w")  # a's send, the interval over: it collects z
        with pytest.raises(TaskNotFoundError):
            qa.task(z.id)


def test_gc_decisions_are_pure() -> None:
    now, life, grace = 100_000, 1_000, 60_000
    assert collectable(TaskFacts(0, "finished", now - life, False), now, life, grace)
    assert not collectable(TaskFacts(0, "finished", now - life + 1, False), now, life, grace)
    assert collectable(TaskFacts(0, "dead", 0, False), now, life, grace)
    for state in ("inserted", "claimed"):
        assert not collectable(TaskFacts(0, state, 0, True), now, life, grace)  # pending: never
        assert collectable(TaskFacts(now - grace, state, 0, False), now, life, grace)  # an orphan
        assert not collectable(TaskFacts(now - grace + 1, state, 0, False), now, life, grace)  # a send under way
    assert collectable(TaskFacts(0, None, 0, False), now, life, grace)
    assert Entry.decode(Entry(5, 2, "c", "g", {"f": "v"}).encode()) == Entry(5, 2, "c", "g", {"f": "v"})
    assert Entry.decode(b"{damaged").at == 0  # delivered rather than stuck
    assert Entry.decode(Entry(5, 1, "m", kept=True, moving=True).encode()) == Entry(5, 1, "m", kept=True, moving=True)
    record = DedupRecord("123", now - 5_000)
    assert DedupRecord.decode(record.encode()) == record and DedupRecord.decode(b'{"id": "x/y", "at": 1}') is None
    assert record.holds(now, 5_000) and not record.holds(now, 4_999)  # the window, as on files
    assert dedup_collectable(now - 5_001, now, 5_000) and not dedup_collectable(now - 5_000, now, 5_000)


def test_task_ids_and_receipts_are_pure() -> None:
    from journalq.errors import InvalidMessageError, ReceiptError
    from journalq.queue.zookeeper.layout import TaskIds, check_task_id, parse_receipt, receipt, sent_at_ns

    ids = TaskIds()
    made = [task for task, _ in ids.make(1000)] + [task for task, _ in ids.make(3)]
    assert made == sorted(made) and len(set(made)) == len(made)  # in sending order, unique
    assert all(len(task) == 24 and task.isdigit() for task in made)
    assert abs(sent_at_ns(made[0]) - time.time_ns()) < 10**9
    assert parse_receipt(receipt(made[0], 3)) == (made[0], 3)
    for bad in ("", "1", "1.0", "a.1", "1.1.1", " 1.1", "1.-1", None, 5, "\u0661.1"):
        with pytest.raises(ReceiptError):
            parse_receipt(bad)
    assert check_task_id("99") == "99"
    for bad in ("not-an-id", "", "1/2", "-1", "\u0661", None, 5, "9" * 41):
        with pytest.raises(InvalidMessageError):
            check_task_id(bad)
    live = {"a"}
    held = Entry(at=2_000, count=1, by="a")
    assert held.held(1_000, live) and not held.available(1_000, live)
    assert Entry(at=2_000, count=1, by="gone").available(1_000, live)  # its session ended
    kept = Entry(at=2_000, count=1, by="gone", kept=True)  # it closed cleanly
    assert kept.held(1_000, live) and not kept.available(1_000, live) and kept.available(2_000, live)
    assert not Entry(at=2_000).available(1_000, live) and not Entry(at=2_000).held(1_000, live)  # delayed


CRASHING_SENDER = """
    import os, sys
    from journalq.queue import Broker
    from journalq.queue.zookeeper.store import ZooKeeperTopic

    root, step = sys.argv[1], sys.argv[2]
    def die(self, chunk):
        self._zk.sync(self.paths.tasks)  # answered after the steps sent before: they are applied
        os._exit(9)  # killed before this step
    setattr(ZooKeeperTopic, step, die)
    with Broker(root) as broker:
        broker.queue("jobs").send_many([{"body": b"lost", "metadata": {"m": 1}, "filters": {"f": "v"}}] * 3)
"""


@pytest.mark.parametrize("step", ["_write_metadata", "_write_entries"])
def test_a_sender_dying_between_steps_leaves_nothing_visible_and_gc_cleans_up(
    url: str, step: str, child_env: dict
) -> None:
    with Broker(url) as broker:
        q = broker.queue("jobs", task_gc_lifetime=0)
        kept = q.send(b"kept")
        assert spawn(CRASHING_SENDER, url, step, env=child_env).wait(60) == 9
        zk, tasks = broker.client, f"{broker.path}/jobs/tasks"
        orphans = sorted(set(zk.get_children(tasks)) - {kept})
        assert len(orphans) == 3  # what the sender had written before it died
        for orphan in orphans:
            with pytest.raises(TaskNotFoundError):
                q.task(orphan)
        stats = q.stats()
        assert (stats.available, stats.in_flight, stats.delayed) == (1, 0, 0)
        (m,) = q.receive(10)
        assert m.id == kept
        assert q.topic.collect(force=True) == []  # a send may still be under way: kept for now
        assert sorted(q.topic.collect(force=True, orphan_grace=0) or []) == orphans
        assert sorted(zk.get_children(tasks)) == [kept]
        q.delete(m.receipt)


# -- the command line and the server -----------------------------------------------------------


def test_the_command_line_on_a_zk_url(url: str) -> None:
    from click.testing import CliRunner

    from journalq.cli.main import cli

    def run(*args: str) -> list[dict]:
        result = CliRunner().invoke(cli, ["queue", *args, "--data", url], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    [sent] = run("send", "jobs", "hello", "--metadata", '{"step": 1}')
    [got] = run("receive", "jobs", "--visibility-timeout", "60")
    assert got["id"] == sent["id"] and got["body"] == "hello"
    [task] = run("task", "jobs", sent["id"])
    assert task["state"] == "claimed" and task["metadata"] == {"step": 1}  # the receive's process is gone
    run("delete", "jobs", got["receipt"])
    assert run("list") == [{"name": "jobs"}]
    result = CliRunner().invoke(cli, ["queue", "list", "--data", "zk://127.0.0.1:1"])
    assert result.exit_code != 0 and "needs a path" in result.stderr


def test_serve_on_a_zk_url(url: str, child_env: dict) -> None:
    import httpx

    from journalq.queue.zookeeper.server import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "journalq.cli.main", "serve", "--data", url, "--port", str(port), "--sync", "none"],
        env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
                time.sleep(0.1)
            assert client.put("/jobs").status_code == 201
            added = client.post("/jobs/messages", content=b"hello")
            assert added.status_code == 201
            fetched = client.get("/jobs/messages", params={"visibility_timeout": 60})
            assert fetched.content == b"hello" and fetched.headers["X-Message-Id"] == added.headers["X-Message-Id"]
            assert client.get("/jobs").json()["in_flight"] == 1
            assert client.get("/jobs/messages").status_code == 204
            assert client.delete(f"/jobs/messages/{added.headers['X-Message-Id']}").status_code == 204
            assert 'journalq_queue_available{queue="jobs"} 0.0' in client.get("/metrics").text
            sqs = client.post("/", json={}, headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                                                     "Content-Type": "application/x-amz-json-1.0"})
            assert sqs.status_code == 400 and "ZooKeeper" in sqs.text
    finally:
        server.terminate()
        server.wait(30)


def test_a_queue_deleted_under_its_consumer(url: str) -> None:
    from journalq.errors import QueueNotFoundError

    with Broker(url) as a, Broker(url) as b:
        q = a.queue("jobs")
        q.send(b"x")
        b.delete("jobs")
        for act in (q.receive, lambda: q.send(b"y"), q.stats, q.purge):
            with pytest.raises(QueueNotFoundError):
                act()
        assert a.names() == [] and not a.exists("jobs")


def test_a_queue_deleted_while_a_sender_adds_a_task_is_deleted(broker, monkeypatch: pytest.MonkeyPatch) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    zk = broker.client
    listing = zk.get_children
    added: list[str] = []

    def list_then_send(path: str, *args, **kwargs):
        children = listing(path, *args, **kwargs)
        if path.endswith("/jobs/tasks") and not added:  # a sender's node comes right after the listing
            added.append(zk.create(f"{path}/0", b""))
        return children

    monkeypatch.setattr(zk, "get_children", list_then_send)
    broker.delete("jobs")
    monkeypatch.undo()
    assert added and not broker.exists("jobs") and zk.exists(f"{broker.path}/jobs") is None


def test_a_consumer_node_collected_as_its_consumer_comes_back_is_made_again(
    broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    zk = broker.client
    node = q.paths.consumer(q.consumer_id)
    zk.create(node, b"")  # left by an earlier session of this consumer: no "current" under it
    create = zk.create

    def collected_first(path: str, *args, **kwargs):
        if path == f"{node}/current":
            zk.delete(node)  # the collector finds no "current" and deletes the node just now
        return create(path, *args, **kwargs)

    monkeypatch.setattr(zk, "create", collected_first)
    (m,) = q.receive()
    monkeypatch.undo()
    assert m.body == b"x" and zk.exists(f"{node}/current").ephemeralOwner == zk.client_id[0]


def test_without_kazoo_a_zk_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.errors import QueueError

    monkeypatch.setitem(sys.modules, "kazoo", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "kazoo.client", None)
    monkeypatch.delitem(sys.modules, "journalq.queue.zookeeper.store", raising=False)
    with pytest.raises(QueueError, match=r"needs kazoo.*journalq\[zookeeper\]"):
        Broker("zk://127.0.0.1:2181/x")


# -- the test server itself --------------------------------------------------------------------


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where ``ZooKeeperServer`` makes its temporary data directory (``tempfile``'s default)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_server_that_cannot_start_leaves_no_directory(own_tmp: Path) -> None:
    import socket

    from journalq.queue.zookeeper.server import ZooKeeperServer

    if ZooKeeperServer.available() is not None:
        pytest.skip(ZooKeeperServer.available())
    with socket.socket() as taken:  # the port is someone else's: the server exits at start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(StoreUnavailableError, match=r"ZooKeeper exited with status \d+ at start.*\n.*") as failed:
            ZooKeeperServer(port=taken.getsockname()[1])
    assert "see " not in str(failed.value)  # the log it pointed to is gone: its end is in the error
    assert list(own_tmp.iterdir()) == []


def test_a_server_whose_java_cannot_run_leaves_no_directory(own_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.queue.zookeeper import server

    if server.ZooKeeperServer.available() is not None:
        pytest.skip(server.ZooKeeperServer.available())

    def broken(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "java")

    monkeypatch.setattr(server.subprocess, "Popen", broken)
    with pytest.raises(PermissionError):
        server.ZooKeeperServer()
    assert list(own_tmp.iterdir()) == []
    kept = own_tmp / "mine"  # a directory the caller gave is the caller's: kept
    with pytest.raises(PermissionError):
        server.ZooKeeperServer(kept)
    assert kept.is_dir()
