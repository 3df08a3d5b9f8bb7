"""Garbage collection on the ZooKeeper store: the gc lock (left by this session, held by another),
producers that collect unless told not to, two objects of one queue never collecting at once, a
send whose entry lands as the collector deletes its task as an orphan."""

from __future__ import annotations

import time

import pytest

from journalq.queue import Broker

from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_gc_lock_left_by_this_session_does_not_stop_collection_for_good(broker) -> None:  # noqa: F811
    q = broker.queue("jobs", task_gc_lifetime=0)
    q.send(b"x")
    (m,) = q.receive()
    q.delete(m.receipt)
    # What a collection whose lock's answer was lost (connection lost after the server made it),
    # or whose delete of the lock failed, leaves: the ephemeral lock, owned by this very session,
    # which lives on after kazoo reconnects.
    broker.client.create(f"{broker.path}/jobs/conf/lock", broker.participant.encode(), ephemeral=True)
    assert q.topic.gc() == [m.id]
    assert broker.client.exists(f"{broker.path}/jobs/conf/lock") is None


def test_a_gc_lock_of_another_live_session_is_left_alone(url: str) -> None:  # noqa: F811
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q = a.queue("jobs", task_gc_lifetime=0)
        q.send(b"x")
        (m,) = q.receive()
        q.delete(m.receipt)
        b.client.create(f"{b.path}/jobs/conf/lock", b.participant.encode(), ephemeral=True)
        assert q.topic.gc() == []  # b collects now
        b.client.delete(f"{b.path}/jobs/conf/lock")
        assert q.topic.gc() == [m.id]


def test_a_send_whose_entry_lands_as_the_collector_deletes_its_task_as_an_orphan_is_not_lost(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperTopic, _Outgoing

    q = broker.queue("jobs")
    topic = q.topic
    # A send whose last step (the queue entry) is late: its requests waited in kazoo's queue
    # through an outage, say. Its first two steps are in; the collector takes it for an orphan.
    envelopes, metas = topic._prepare([{"body": b"late"}])
    ((task, ns),) = broker.ids.make(1)
    item = _Outgoing(task, ns, envelopes[0], metas[0])
    topic._write_data([item]).commit()
    topic._write_metadata([item]).commit()
    delete = ZooKeeperTopic._delete_tasks

    def entry_lands_first(self, tasks, **options):
        if task in tasks:  # between the collector's look at the entry and its delete
            assert topic._write_entries([item]).commit()[-1] == f"{broker.path}/jobs/queue/{task}"
        return delete(self, tasks, **options)

    monkeypatch.setattr(ZooKeeperTopic, "_delete_tasks", entry_lands_first)
    assert topic.collect(force=True, orphan_grace=0) == []
    (m,) = q.receive()  # the send was acknowledged: its message is there, whole
    assert (m.id, m.body) == (task, b"late")
    q.delete(m.receipt)


def test_two_objects_of_one_queue_in_one_broker_never_collect_at_once(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperTopic

    old = broker.topic("jobs")
    broker.forget("jobs")  # (a caller may still hold the object of before)
    new = broker.topic("jobs")
    assert new is not old
    collect_under, inner = ZooKeeperTopic._collect_under, []

    def collect_under_and_try_the_other(self, *args):
        if self is old:  # as the other collects, in another thread of this process (same session)
            inner.append(new.collect(force=True))
        return collect_under(self, *args)

    monkeypatch.setattr(ZooKeeperTopic, "_collect_under", collect_under_and_try_the_other)
    assert old.collect(force=True) == []
    assert inner == [None]  # it did not take the lock of this session from under the other


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
