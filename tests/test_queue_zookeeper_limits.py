"""The ZooKeeper store within ZooKeeper's limits: messages, filters, settings and receives kept under
the packet limit (jute.maxbuffer) and one transaction's size, or refused before anything is
written; a message near the limit can still be dead-lettered."""

from __future__ import annotations

import pytest

from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


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


def test_a_message_with_metadata_near_the_limit_can_be_dead_lettered(broker) -> None:  # noqa: F811
    """The store took the message; its dead letter adds its source and a deduplication id to its
    metadata, which went over the limit: the move failed every time the message was met (each
    receive that met it then failed with InvalidMessageError, naming no message of the caller's),
    and the message never left the queue."""
    from journalq.errors import InvalidMessageError

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    big = "m" * 999_900  # just under the limit
    poison = q.send(b"poison", metadata=big)
    (m,) = q.receive(visibility_timeout=0)
    assert m.id == poison
    assert q.receive(10) == []  # moved
    assert q.task(poison).state == "dead"
    dlq = broker.queue("jobs-dlq")
    (letter,) = dlq.receive(visibility_timeout=0)
    assert (letter.body, letter.metadata, letter.source["id"]) == (b"poison", big, poison)
    dlq.set_metadata(letter.id, big)  # (its source and id count no more here)
    assert dlq.redrive() == 1  # and back, with a deduplication id of the redrive's
    (back,) = q.receive()
    assert (back.body, back.metadata) == (b"poison", big)
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's 1000000"):
        q.send(b"x", metadata=big + "m" * 100, dedup_id="d")  # the message's own still count
