"""The ZooKeeper store's optimistic concurrency: by-id, by-receipt, settings and deduplicated
calls that lose many races in a row to other processes, threads or consumers (a claim, a heartbeat)
still end as they must (done, or a clear error), never with a spurious failure or a success that
changed nothing; a batch whose connection goes part way says what it stored."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from journalq.errors import StoreUnavailableError
from journalq.queue import Broker

from conftest import RACES
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def _changed_meanwhile(q, change, monkeypatch: pytest.MonkeyPatch, times: int = RACES) -> list[int]:
    """Call ``change`` (another consumer's write of the entry: a new version) between each of
    ``q``'s reads of its entries and its write of them, ``times`` times; returns a counter."""
    from journalq.queue.zookeeper.store import ZooKeeperQueue

    apply, done = ZooKeeperQueue._apply, [0]

    def change_first(self, changes, **options):
        if self is q and changes and done[0] < times:
            done[0] += 1
            change()
        return apply(self, changes, **options)

    monkeypatch.setattr(ZooKeeperQueue, "_apply", change_first)
    return done


@pytest.mark.parametrize("how", ["purge", "delete_id"])
def test_a_by_id_finish_that_loses_many_races_to_a_heartbeating_consumer_still_finishes(
    url: str, how: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q, holder = a.queue("jobs"), b.queue("jobs")
        task = q.send(b"x")
        (m,) = holder.receive(visibility_timeout=60)
        # the holder extends its visibility (a heartbeat) each time between q's read and write
        done = _changed_meanwhile(q, lambda: holder.change_visibility(m.receipt, 60), monkeypatch)
        if how == "purge":
            q.purge()
        else:
            q.delete_id(task)
        assert done[0] == RACES
        assert q.task(task).state == "finished"
        assert a.client.get_children(f"{a.path}/jobs/queue") == []


def test_a_receipt_delete_that_loses_many_races_to_its_heartbeat_deletes_or_says_why(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q, holder = a.queue("jobs"), b.queue("jobs")
        task = q.send(b"x")
        (m,) = holder.receive(visibility_timeout=60)
        # the same delivery's receipt, used by two workers: one heartbeats, the other deletes
        done = _changed_meanwhile(q, lambda: holder.change_visibility(m.receipt, 60), monkeypatch)
        assert q.delete_many([m.receipt]) == [None]
        assert q.task(task).state == "finished"  # (None said it was deleted: it must be)
        assert done[0] == RACES
        assert a.client.get_children(f"{a.path}/jobs/queue") == []


def test_a_settings_change_that_loses_many_races_to_other_processes_still_holds(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperBroker

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        a.queue("jobs")
        save, raced = ZooKeeperBroker._save, []

        def other_saves_first(self, name, settings, *args, **kwargs):
            if self is a and len(raced) < RACES:  # between each of a's reads of the settings and its write
                raced.append(b.configure("jobs", delay=len(raced) % 2 + 1))
            return save(self, name, settings, *args, **kwargs)

        monkeypatch.setattr(ZooKeeperBroker, "_save", other_saves_first)
        assert a.configure("jobs", visibility_timeout=5).visibility_timeout == 5
        assert len(raced) == RACES
    with Broker(url, sync="none") as c:
        settings = c.queue("jobs").settings
        assert (settings.visibility_timeout, settings.delay) == (5, (RACES - 1) % 2 + 1)  # (the last of the other's)


def _claimed_meanwhile(q, other, monkeypatch: pytest.MonkeyPatch) -> list:
    """Let ``other`` receive (claim: a new entry version) between ``q``'s read of the entries and
    its first write of them, as a consumer of another process may; returns what it received."""
    from journalq.queue.zookeeper.store import ZooKeeperQueue

    apply, got = ZooKeeperQueue._apply, []

    def claim_first(self, changes, **options):
        if self is q and not got:
            got.extend(other.receive(10))
        return apply(self, changes, **options)

    monkeypatch.setattr(ZooKeeperQueue, "_apply", claim_first)
    return got


@pytest.mark.parametrize("how", ["purge", "delete_id"])
def test_a_by_id_finish_is_not_lost_to_a_claim_between_its_read_and_its_write(
    url: str, how: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.errors import StaleReceiptError

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q = a.queue("jobs")
        task = q.send(b"x")
        got = _claimed_meanwhile(q, b.queue("jobs"), monkeypatch)
        if how == "purge":
            q.purge()
        else:
            q.delete_id(task)
        assert [m.id for m in got] == [task]  # (the claim did come between)
        assert q.task(task).state == "finished"
        assert a.client.get_children(f"{a.path}/jobs/queue") == []
        with pytest.raises(StaleReceiptError):
            b.queue("jobs").delete(got[0].receipt)


def test_two_processes_changing_different_settings_at_once_both_hold(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperBroker

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        a.queue("jobs")
        save, raced = ZooKeeperBroker._save, []

        def other_saves_first(self, name, settings, *args, **kwargs):
            if self is a and not raced:  # between a's read of the settings and its write
                raced.append(b.configure("jobs", delay=3))
            return save(self, name, settings, *args, **kwargs)

        monkeypatch.setattr(ZooKeeperBroker, "_save", other_saves_first)
        a.configure("jobs", visibility_timeout=5, task_gc_lifetime=60)
        assert raced and raced[0].delay == 3
    with Broker(url, sync="none") as c:
        settings = c.queue("jobs").settings
        assert (settings.visibility_timeout, settings.delay, settings.task_gc_lifetime) == (5, 3, 60)


def test_settings_given_to_a_queue_that_another_process_makes_first_hold(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperBroker

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        create = ZooKeeperBroker._create

        def other_makes_it_first(self, name, settings):
            if self is a:  # between a's look (no queue) and its create
                b.queue(name)
            return create(self, name, settings)

        monkeypatch.setattr(ZooKeeperBroker, "_create", other_makes_it_first)
        assert a.queue("jobs", visibility_timeout=5).settings.visibility_timeout == 5
    with Broker(url, sync="none") as c:
        assert c.queue("jobs").settings.visibility_timeout == 5


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
