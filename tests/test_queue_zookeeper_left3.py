"""The ZooKeeper store, third audit: a queue delete that an outage cuts short before it changed
anything, consumer registration raced by the threads of one handle, deduplicated sends that lose
many races for their record, producers that do not collect, handles that the broker gives after a
close, and receives that must look past any number of tasks they cannot take."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import own_zookeeper
from journalq.errors import StoreUnavailableError
from journalq.queue import Broker
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

RACES = 25  # more races lost in a row than any fixed number of tries would take
_paths = iter(range(10**6))


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    with own_zookeeper() as zk:  # of this module's own: its tests freeze it
        yield zk


def _wait_for(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout:g}s"
        time.sleep(0.05)


# -- a queue delete cut short by an outage -------------------------------------------------------


def test_a_queue_delete_that_an_outage_stops_before_its_change_leaves_the_handle_working(
    own_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete marked the handle gone (and closed it) before its change: an outage between its
    look for the queue and its change left the queue whole and its handle refusing every call
    (QueueNotFoundError), and the broker's next ``queue(name)`` another handle."""
    url = own_server.url(f"/left3{os.getpid()}x{next(_paths)}")
    with Broker(url, session_timeout=1.0, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"before")
        client, node, frozen = broker.client, f"{broker.path}/jobs", []
        exists = client.exists

        def exists_then_outage(path: str, *args: Any, **kwargs: Any) -> Any:
            stat = exists(path, *args, **kwargs)
            if path == node and not frozen:  # the delete's look for the queue: then the outage
                frozen.append(True)
                own_server.process.send_signal(signal.SIGSTOP)
                _wait_for(lambda: not broker._connected.is_set(), "disconnected")
            return stat

        monkeypatch.setattr(client, "exists", exists_then_outage)
        try:
            with pytest.raises(StoreUnavailableError, match="deleting queue 'jobs'"):
                broker.delete("jobs")
        finally:
            own_server.process.send_signal(signal.SIGCONT)
            monkeypatch.undo()
        assert frozen
        _wait_for(lambda: broker._connected.is_set(), "reconnected")
        assert broker.exists("jobs")
        assert broker.queue("jobs") is q  # the handle of before, working
        q.send(b"after")
        assert sorted(m.body for m in q.receive(10)) == [b"after", b"before"]
        broker.delete("jobs")  # and a delete once the ensemble is back deletes it
        assert not broker.exists("jobs")


# -- consumer registration -----------------------------------------------------------------------


def test_two_threads_of_one_handle_that_register_at_once_register_one_consumer(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """In a new session, each thread of a handle that found it unregistered made a consumer id of
    its own and registered it: two consumers for one handle, the first left registered (its
    ``current`` alive for the session, its name no longer the handle's). Here the second thread
    registers while the first is between its choice of a name and its registration."""
    from journalq.queue.zookeeper import store

    q = broker.queue("jobs")
    q.send(b"x")
    q.receive(visibility_timeout=0)  # registered in this session
    first = q.consumer_id
    session = broker.client.client_id[0]
    monkeypatch.setattr(q, "_client_session", lambda: session + 1)  # as in a new session: a new name
    participant, names, second = store._participant, [], []

    def name_then_other_thread(*args: Any) -> str:
        name = participant(*args)
        names.append(name)
        if len(names) == 1:  # the first thread has its name: the second registers meanwhile
            thread = threading.Thread(target=q._register)
            second.append(thread)
            thread.start()
            thread.join(1.0)
        return name

    monkeypatch.setattr(store, "_participant", name_then_other_thread)
    q._register()
    second[0].join(10)
    assert not second[0].is_alive()
    consumers = broker.client.get_children(f"{broker.path}/jobs/consumers")
    registered = {c for c in consumers if broker.client.exists(f"{broker.path}/jobs/consumers/{c}/current")}
    assert registered == {first, q.consumer_id}  # (the first's session is this one: it lives on)
    assert names == [q.consumer_id]


# -- deduplication ---------------------------------------------------------------------------------


def test_a_deduplicated_send_that_loses_many_races_for_its_record_is_stored(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """The send gave up after 10 lost races for its deduplication id's record (an error for a
    send that should have stored its message: a loaded system's). Here another sender's expired
    record is rewritten (a new version) between each of the send's reads of it and its write."""
    from journalq.queue.zookeeper.layout import DedupRecord
    from journalq.queue.zookeeper.store import ZooKeeperTopic

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q = a.queue("jobs")
        record = a.paths("jobs").dedup_record("d")
        b.client.ensure_path(f"{b.path}/jobs/dedup")
        expired = DedupRecord("1" * 24, 0).encode()  # an old send's: the window is over
        b.client.create(record, expired)
        write_entries, raced = ZooKeeperTopic._write_entries, []

        def rewritten_meanwhile(self: Any, chunk: Any) -> Any:
            t = write_entries(self, chunk)
            if self is q.topic and len(raced) < RACES:
                raced.append(b.client.set(record, expired))
            return t

        monkeypatch.setattr(ZooKeeperTopic, "_write_entries", rewritten_meanwhile)
        task = q.send(b"x", dedup_id="d")
        assert len(raced) == RACES
        assert DedupRecord.decode(a.client.get(record)[0]).task == task
        (m,) = q.receive()
        assert (m.id, m.body) == (task, b"x")
        assert q.send(b"again", dedup_id="d") == task  # the record holds


def test_a_deduplicated_send_whose_records_node_is_gone_ends_with_an_error(broker) -> None:  # noqa: F811
    """What a queue delete under way leaves for a moment (node by node): the records' node gone
    while the tasks are there. The record's create fails there every time: no race to try again
    (the send must end, with the queue's error, not loop)."""
    from journalq.errors import QueueNotFoundError

    q = broker.queue("jobs")
    q.send(b"a", dedup_id="d1")  # (the records' node is made, and known made)
    broker.client.delete(f"{broker.path}/jobs/dedup", recursive=True)
    outcome: list[object] = []

    def send() -> None:
        try:
            outcome.append(q.send(b"b", dedup_id="d2"))
        except Exception as exc:  # the outcome checked
            outcome.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "the send did not end"
    assert isinstance(outcome[0], QueueNotFoundError), outcome
    assert [m.body for m in q.receive(10)] == [b"a"]  # nothing of it can be received


# -- producers' garbage collection -----------------------------------------------------------------


def test_producers_collect_unless_their_broker_is_told_not_to(url: str) -> None:  # noqa: F811
    """zkmq: "every producer will try and perform this garbage collection (unless explicitly
    configured not to)"; there was no way to configure it not to."""
    from journalq.errors import InvalidSettingError, TaskNotFoundError

    with Broker(url, sync="none", producer_gc=False) as quiet, Broker(url, sync="none") as consumer:
        producer = quiet.queue("jobs", task_gc_lifetime=0, task_gc_interval=0.2)
        q = consumer.queue("jobs")
        done = q.send(b"done")
        (m,) = q.receive()
        q.delete(m.receipt)
        time.sleep(0.3)
        producer.send(b"x")  # the interval is over: a producer of the default would collect
        assert producer.task(done).state == "finished"
        assert quiet.client.exists(f"{quiet.path}/jobs/conf/lock") is None
        time.sleep(0.3)
        q.receive(visibility_timeout=0)  # consumers still collect
        with pytest.raises(TaskNotFoundError):
            producer.task(done)
        got = q.receive(10)
        assert sorted(m.body for m in got) == [b"x"]
        q.delete(got[0].receipt)
        assert producer.topic.gc() == [got[0].id]  # and a collection asked for runs
        last = producer.send(b"y")
    with Broker(url, sync="none") as loud:  # the default collects as it sends
        p = loud.queue("jobs")
        (m,) = p.receive(10)
        assert m.id == last
        p.delete(m.receipt)
        time.sleep(0.3)
        p.send(b"z")
        with pytest.raises(TaskNotFoundError):
            p.task(last)
    with pytest.raises(InvalidSettingError, match="producer_gc is True or False, not 'no'"):
        Broker(url, producer_gc="no")


# -- handles after a close -------------------------------------------------------------------------


def test_the_broker_gives_a_working_handle_after_the_one_it_gave_was_closed(broker) -> None:  # noqa: F811
    """The broker kept the closed handle and gave it again: its long polls returned at once with
    nothing (a closed handle's poll ends), and its consumer, unregistered by the close, still
    counted as registered (its first claims failed)."""
    q = broker.queue("jobs")
    held = q.send(b"held")
    (m,) = q.receive(visibility_timeout=60)
    q.close()
    again = broker.queue("jobs")
    assert again is not q and broker.topic("jobs").channel("default") is again
    sending = threading.Timer(0.5, lambda: again.send(b"later"))
    sending.start()
    try:
        start = time.monotonic()
        got = again.receive(wait=10)
    finally:
        sending.join()
    assert [x.body for x in got] == [b"later"] and time.monotonic() - start >= 0.4
    assert again.consumer_id in again.consumers()
    again.delete(m.receipt)  # the closed handle's delivery was kept: its receipt still good
    assert again.task(held).state == "finished"


# -- receives that must look past what they cannot take ----------------------------------------------

BEHIND = 2_100  # more than any read-ahead of 1,024 (the file store's was), twice over


@pytest.mark.parametrize("ahead", ["other filters", "delayed", "a blocked group"])
def test_a_receive_finds_the_one_message_it_can_take_behind_thousands_it_cannot(
    broker, ahead: str  # noqa: F811
) -> None:
    q = broker.queue("jobs", enums={"class": ["low", "high"]})
    if ahead == "a blocked group":
        q.send(b"head", group_id="a")
        (head,) = q.receive(visibility_timeout=60)  # its group waits for it
        assert head.body == b"head"
    for start in range(0, BEHIND, 500):
        count = min(500, BEHIND - start)
        if ahead == "other filters":
            q.send_many([{"body": b"low", "filters": {"class": "low"}}] * count)
        elif ahead == "delayed":
            q.send_many([{"body": b"later", "delay": 600}] * count)
        else:
            q.send_many([{"body": b"a", "group_id": "a"}] * count)
    last = q.send(b"mine", filters={"class": "high"}, group_id="b" if ahead == "a blocked group" else None)
    wanted = {"class": ("high", "absolute")} if ahead == "other filters" else None
    got = q.receive(10, filters=wanted)
    assert [(m.id, m.body) for m in got] == [(last, b"mine")]
    q.delete(got[0].receipt)
    assert q.receive(10, filters=wanted) == []  # nothing more to take, none taken wrongly


def test_a_batch_whose_connection_goes_as_a_chunk_settles_its_duplicates_says_what_it_stored(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A batch of two chunks: the first stored, the second's entries lost the race for a
    deduplication record, and the connection went as the records were read again. The error
    escaped as a plain StoreUnavailableError: the caller, told nothing was stored, sent the first
    chunk's 200 messages again."""
    from kazoo.exceptions import ConnectionLoss

    from journalq.errors import PartialSendError
    from journalq.queue.zookeeper.layout import DedupRecord
    from journalq.queue.zookeeper.store import ZooKeeperTopic

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q = a.queue("jobs")
        record = a.paths("jobs").dedup_record("d")
        write_entries = ZooKeeperTopic._write_entries

        def raced(self: Any, chunk: Any) -> Any:
            t = write_entries(self, chunk)
            if any(item.dedup is not None for item in chunk) and not b.client.exists(record):
                b.client.ensure_path(f"{b.path}/jobs/dedup")
                b.client.create(record, DedupRecord("1" * 24, int(time.time() * 1000)).encode())
            return t

        def connection_lost(self: Any, chunk: Any) -> Any:
            raise ConnectionLoss()

        monkeypatch.setattr(ZooKeeperTopic, "_write_entries", raced)
        monkeypatch.setattr(ZooKeeperTopic, "_settle_duplicates", connection_lost)
        items = [{"body": b"%d" % i} for i in range(200)] + [{"body": b"last", "dedup_id": "d"}]
        with pytest.raises(PartialSendError) as raised:
            q.send_many(items)
        assert isinstance(raised.value, StoreUnavailableError)
        assert raised.value.unsent == [200]
        monkeypatch.undo()
        stored = {m.id for m in q.receive(10, visibility_timeout=60)}
        assert stored <= set(raised.value.ids[:200]) and len(stored) == 10


def test_stats_do_not_count_dead_letters_kept_back_as_available(
    broker: Broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """As on files: a task past max_receive_count whose move the dead-letter queue refused is
    kept, undelivered, until the move is tried again: not available (a receive gives nothing)."""
    from journalq.errors import StorageError

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq", task_gc_interval=60)
    q.send(b"poison")
    (got,) = q.receive(visibility_timeout=0)

    def refuse(items: object) -> list[str]:
        raise StorageError("the disk is full")

    monkeypatch.setattr(broker.queue("jobs-dlq"), "send_many", refuse)
    assert q.receive(wait=0) == []  # the move is refused: kept here
    stats = q.stats()
    assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 1, 0)
    monkeypatch.undo()
    q.send(b"fine")  # (what comes after it goes on meanwhile)
    assert q.stats().available == 1
