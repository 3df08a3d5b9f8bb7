"""The ZooKeeper store where ZooKeeper makes things hard: calls cut short by a lost connection (what
they did or did not do), optimistic concurrency between consumers and by-id calls, ZooKeeper's
packet limit, and kazoo's errors that must come out as journalq's."""

from __future__ import annotations

import pytest

from journalq.errors import QueueNotFoundError
from journalq.queue import Broker
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_queue_delete_cut_short_after_its_first_step_is_finished_by_the_next(broker) -> None:  # noqa: F811
    q = broker.queue("jobs")
    q.send(b"x")
    # What a delete whose connection was lost (or whose process died) after its first step left:
    # the queue's node emptied (no longer a queue), the rest still there.
    broker.client.set(f"{broker.path}/jobs", b"")
    assert not broker.exists("jobs")
    broker.delete("jobs")  # a retry of the delete finishes it
    assert broker.client.exists(f"{broker.path}/jobs") is None
    with pytest.raises(QueueNotFoundError):
        broker.delete("jobs")  # (and a queue that is not there at all is still an error)
    q = broker.queue("jobs")  # the name can be used again
    q.send(b"y")
    assert [m.body for m in q.receive()] == [b"y"]


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


@pytest.mark.parametrize("message", [
    {"filters": {"a": "x" * 600_000, "b": "y" * 600_000}},  # filters are a node each, and the entry holds them all
    {"filters": {"a": "x" * 600_000}, "metadata": {"m": "m" * 600_000}},  # one transaction: metadata and filters
    {"filters": {"a": "x" * 300_000}, "group_id": "g", "attributes": {"k": "v" * 800_000}},
])
def test_a_message_whose_parts_are_too_large_together_is_refused_before_anything_is_written(
    broker, message: dict  # noqa: F811
) -> None:
    from journalq.errors import InvalidMessageError

    q = broker.queue("jobs")
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's"):
        q.send(b"x", **message)
    assert broker.client.get_children(f"{broker.path}/jobs/tasks") == []
    assert broker.client.connected  # (ZooKeeper drops the connection of a packet over its limit)
    q.send(b"small", filters={"a": "x" * 400_000})  # one large part alone is taken
    assert [m.filters for m in q.receive()] == [{"a": "x" * 400_000}]


def test_a_broker_whose_path_was_deleted_under_it_lists_nothing_and_makes_it_again(broker) -> None:  # noqa: F811
    broker.queue("jobs").send(b"x")
    broker.client.delete(broker.path, recursive=True)  # an operator's `deleteall` of the store's path
    assert broker.names() == []
    assert broker.gc() == {}
    q = broker.queue("other")
    q.send(b"y")
    assert broker.names() == ["other"] and [m.body for m in q.receive()] == [b"y"]


def test_a_node_that_refuses_this_client_is_a_journalq_error(broker) -> None:  # noqa: F811
    from kazoo.security import OPEN_ACL_UNSAFE, make_acl

    from journalq import Error

    broker.client.set_acls(broker.path, [make_acl("world", "anyone", read=True, admin=True)])  # no create
    try:
        with pytest.raises(Error, match=r"refused a request while opening queue 'jobs' \(NoAuthError"):
            broker.queue("jobs")
    finally:
        broker.client.set_acls(broker.path, OPEN_ACL_UNSAFE)


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


def test_a_large_receive_of_messages_with_large_filters_stays_under_zookeeper_s_packet_limit(
    broker  # noqa: F811
) -> None:
    q = broker.queue("jobs")
    big = {"f": "x" * 50_000}  # each queue entry holds its filters: thirty of them are over 1 MiB
    sent = q.send_many([{"body": b"%d" % i, "filters": big} for i in range(30)])
    got = q.receive(30, visibility_timeout=60)
    assert sorted(m.id for m in got) == sorted(sent)
    assert broker.client.connected
    assert q.change_visibility_many([(m.receipt, 120) for m in got]) == [None] * 30
    assert q.delete_many([m.receipt for m in got]) == [None] * 30
    assert q.stats().available == 0


def test_settings_too_large_for_a_znode_are_refused_before_anything_is_written(broker) -> None:  # noqa: F811
    from journalq.errors import InvalidSettingError

    huge = {"performance_class": [f"v{i:07d}" for i in range(120_000)]}  # 1.3 MB of JSON
    with pytest.raises(InvalidSettingError, match="over the ZooKeeper store's"):
        broker.queue("jobs", enums=huge)
    assert not broker.exists("jobs") and broker.client.connected
    q = broker.queue("jobs", enums={"performance_class": ["low", "high"]})
    with pytest.raises(InvalidSettingError, match="over the ZooKeeper store's"):
        broker.configure("jobs", enums=huge)
    assert broker.client.connected
    assert q.settings.enums == {"performance_class": ("low", "high")}


def test_a_batch_of_messages_with_many_small_filters_stays_under_zookeeper_s_packet_limit(broker) -> None:  # noqa: F811
    q = broker.queue("jobs")
    many = {f"filter_name_{i:03d}": "v" for i in range(60)}  # a node each: the nodes' paths weigh
    sent = q.send_many([{"body": b"%d" % i, "filters": many} for i in range(200)])
    assert broker.client.connected and len(sent) == 200
    got = q.receive(200)
    assert sorted(m.id for m in got) == sorted(sent) and got[0].filters == many


def test_a_message_with_too_many_filters_for_one_transaction_is_refused(broker) -> None:  # noqa: F811
    from journalq.errors import InvalidMessageError

    q = broker.queue("jobs")
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's"):
        q.send(b"x", filters={f"f{i}": "" for i in range(20_000)})
    assert broker.client.connected and broker.client.get_children(f"{broker.path}/jobs/tasks") == []


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
