"""Dead letters on the file store: a dead letter's ``source`` checked when sent and read safely by
a redrive, and naming the message by the id its queue gave; receive counts that go on across moves,
as SQS's do; dead-letter queues that cannot take their letters (damaged, named as a shard); redrives
that move nothing on by the dead-letter queue's own policy, and that go to a topic's channels
without making one of their own. (test_queue_zookeeper_follow runs some of these on ZooKeeper.)"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from journalq.errors import InvalidMessageError
from journalq.queue import Broker
from journalq.queue.envelope import ENVELOPE_TYPE, Envelope, encode


@pytest.fixture
def broker(tmp_path: Path):
    with Broker(tmp_path, sync="none") as b:
        yield b


# -- a dead letter's source -------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "jobs",
        ["jobs"],
        {"queue": 7},
        {"queue": "../escape"},
        {"channel": ""},
        {"id": 3},
        {"count": -1},
        {"count": True},
        {"sent_at_ns": 1.5},
        {1: "x"},
    ],
)
def test_a_send_with_a_bad_source_is_refused(broker: Broker, source: object) -> None:
    q = broker.queue("dlq")
    with pytest.raises(InvalidMessageError, match="source"):
        q.send_many([{"body": b"x", "source": source}])
    assert q.stats().available == 0  # nothing stored


def test_a_send_with_a_good_source_is_kept(broker: Broker) -> None:
    q = broker.queue("dlq")
    source = {"queue": "jobs", "channel": "default", "id": "4", "count": 2, "sent_at_ns": 5}
    q.send_many([{"body": b"x", "source": source}])
    (m,) = q.receive()
    assert m.source == source


def _store_raw(broker: Broker, name: str, source: object) -> None:
    """A message whose source is malformed, as an older version (or another tool) stored it."""
    broker.queue(name)
    topic = broker.topic(name)
    type_, value = encode(Envelope(b"old", source=source))  # type: ignore[arg-type]
    assert type_ == ENVELOPE_TYPE
    from journalq.journal import Message

    topic._get_writer().append_many([Message(timestamp_ns=time.time_ns(), type=type_, value=value)])


@pytest.mark.parametrize("source", ["jobs", ["jobs"], {"queue": "../escape"}, {"queue": 7}])
def test_redrive_of_a_malformed_source_keeps_it_and_moves_the_rest(
    broker: Broker, source: object, caplog: pytest.LogCaptureFixture
) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    _store_raw(broker, "dlq", source)
    q.send(b"dead")
    q.receive(visibility_timeout=0)
    assert q.receive() == []  # moved
    dlq = broker.queue("dlq")
    with caplog.at_level(logging.WARNING, logger="journalq.queue"):
        assert dlq.redrive() == 1
    assert "malformed source" in caplog.text and "message 0" in caplog.text
    assert [m.body for m in q.receive(10)] == [b"dead"]
    s = dlq.stats()
    assert (s.available, s.in_flight) == (1, 0)  # given back, nothing lost


def test_a_dead_letter_of_a_sharded_queue_names_its_message_as_the_queue_does(broker: Broker) -> None:
    """Its source's id is the id the sharded queue gave ("SHARD.ID"), not the shard's own, which
    several shards share (the SQS layer keys a dead letter's first receive by it)."""
    queue = broker.queue("orders", shards=4, max_receive_count=1, dead_letter_queue="dead")
    ids = queue.send_many([b"%d" % i for i in range(8)])
    got: list = []
    while len(got) < 8 and (more := queue.receive(10, visibility_timeout=0)):
        got += more
    assert queue.receive(10) == []  # all moved
    letters = broker.queue("dead").receive(10)
    assert sorted(m.source["id"] for m in letters) == sorted(ids)
    assert {m.body: m.source["id"] for m in letters} == {m.body: m.id for m in got}


# -- receive counts across moves ---------------------------------------------------------------


def test_a_dead_letter_moved_on_keeps_its_running_receive_count(broker: Broker) -> None:
    """SQS's ApproximateReceiveCount goes on across a redrive policy's moves: a dead letter
    moved on by its dead-letter queue's own policy records every receive it had, in each queue
    (the SQS layer shows ``source["count"]`` plus the receives where it is now). Its
    dead-letter queue's ``max_receive_count`` counts its receives there only, as SQS does (a
    lower one would move each letter on unseen)."""
    q = broker.queue("jobs", max_receive_count=2, dead_letter_queue="dlq")
    broker.queue("dlq", max_receive_count=1, dead_letter_queue="dlq2")
    q.send(b"poison")
    for _ in range(2):
        q.receive(visibility_timeout=0)
    assert q.receive() == []  # moved, after 2 receives
    dlq = broker.queue("dlq")
    (dead,) = dlq.receive(visibility_timeout=0)  # delivered there, though 2 >= its 1
    assert dead.source["count"] == 2 and dead.receive_count == 1
    assert dlq.receive() == []  # moved on
    (twice,) = broker.queue("dlq2").receive()
    assert twice.source["queue"] == "dlq" and twice.source["count"] == 3


# -- a dead-letter queue that cannot take its letters ----------------------------------------


def test_a_damaged_dead_letter_queue_does_not_block_the_source(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The dead-letter queue's settings file damaged: the source queue goes on delivering what
    it can; its dead letters stay in it, not delivered again, not lost (nor their group's
    followers delivered before them), with a warning naming the file once per
    ``task_gc_interval``, and move once the dead-letter queue can take them."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq", task_gc_interval=1.5)
    dlq = broker.queue("dlq")
    dlq.close()
    broker.forget("dlq")
    good = (tmp_path / "dlq" / "queue.json").read_text()
    (tmp_path / "dlq" / "queue.json").write_text("{damaged")
    poison = q.send(b"poison", group_id="g")
    q.send(b"after poison", group_id="g")
    q.send(b"fine")
    (first,) = q.receive(visibility_timeout=0)
    assert first.body == b"poison"
    with caplog.at_level(logging.WARNING, logger="journalq.queue"):
        (fine,) = q.receive(10)
        assert fine.body == b"fine"
        q.delete(fine.receipt)
        assert q.receive(10) == [] and q.receive(10) == []
    warnings = [r for r in caplog.records if "cannot move" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path / "dlq" / "queue.json") in warnings[0].getMessage()
    assert q.task(poison).state == "inserted"  # kept
    (tmp_path / "dlq" / "queue.json").write_text(good)
    time.sleep(1.6)
    assert [m.body for m in q.receive(10)] == [b"after poison"]  # the poison moved first
    assert q.task(poison).state == "dead"
    assert [m.body for m in broker.queue("dlq").receive(10)] == [b"poison"]


def test_a_message_with_no_time_moves_to_the_dead_letter_queue(broker: Broker) -> None:
    """A sej message stamped with Go's zero time: its dead letter's ``sent_at_ns`` is that time,
    which the source's check takes (any integer), so the move does not fail."""
    from journalq.errors import ZERO_TIMESTAMP
    from journalq.journal import Message

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    q.topic._get_writer().append_many([Message(timestamp_ns=ZERO_TIMESTAMP, value=b"timeless")])
    assert [m.body for m in q.receive(visibility_timeout=0)] == [b"timeless"]
    assert q.receive() == []
    (dead,) = broker.queue("dlq").receive()
    assert dead.body == b"timeless" and dead.source["sent_at_ns"] == ZERO_TIMESTAMP


def test_a_dead_letter_queue_named_as_a_shard_is_refused_when_set(broker: Broker) -> None:
    """No queue can have such a name (kept for shards): every move would fail; refused at once."""
    from journalq.errors import InvalidSettingError

    with pytest.raises(InvalidSettingError, match="shard"):
        broker.queue("jobs", max_receive_count=1, dead_letter_queue="orders.2.001")
    q = broker.queue("jobs")
    with pytest.raises(InvalidSettingError, match="shard"):
        q.configure(max_receive_count=1, dead_letter_queue="orders.2.001")
    assert q.settings.dead_letter_queue is None


# -- redrives ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2])
def test_a_redrive_does_not_move_dead_letters_on_by_the_dead_letter_queue_s_own_policy(
    broker: Broker, shards: int
) -> None:
    """A redrive receives the dead letters to move them back (SQS's StartMessageMoveTask, which
    is no receive): those already looked at up to the dead-letter queue's own
    max_receive_count went on to its dead-letter queue instead of back to their queue."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    dlq = broker.queue("dlq", max_receive_count=1, dead_letter_queue="dlq2", shards=shards)
    q.send(b"poison")
    q.receive(visibility_timeout=0)
    time.sleep(0.01)
    assert q.receive() == []  # moved
    (looked,) = dlq.receive()
    dlq.release(looked.receipt)  # looked at once, given back
    assert dlq.redrive() == 1
    assert [m.body for m in q.receive(5)] == [b"poison"]
    assert broker.queue("dlq2").receive(5) == []
    assert dlq.stats().dead == 0


def test_a_dead_letter_of_one_channel_is_redriven_to_that_channel_alone(broker: Broker) -> None:
    events = broker.topic("events", max_receive_count=1, dead_letter_queue="events-dead")
    billing, audit = events.channel("billing"), events.channel("audit")
    events.send_many([b"m0", b"m1", b"m2"])
    audit.delete_many([m.receipt for m in audit.receive(10)])
    received = billing.receive(10, visibility_timeout=0)
    billing.delete_many([m.receipt for m in received[:2]])
    assert billing.receive(10) == []  # m2, received once already, moved to the dead-letter queue
    assert broker.queue("events-dead").redrive() == 1
    assert events.channel_names() == ["audit", "billing"]  # no channel "default" taking them all again
    assert audit.stats().available == 0  # audit had m2 already
    assert audit.receive(10) == []
    assert billing.stats().available == 1
    assert [m.body for m in billing.receive(10)] == [b"m2"]
    with Broker(broker.root, sync="none") as other:  # a channel opened anew sees the same
        assert other.topic("events").channel("audit").receive(10) == []


def test_a_redrive_to_a_topic_makes_no_channel_of_its_own(broker: Broker) -> None:
    events = broker.topic("events")
    billing = events.channel("billing")
    events.send_many([b"old", b"older"])  # a channel made now would take these again
    billing.delete_many([m.receipt for m in billing.receive(10)])
    dead = broker.queue("dead")
    dead.send(b"moved")
    assert dead.redrive("events") == 1
    assert events.channel_names() == ["billing"]  # was: a channel "default" too, from offset 0
    assert [m.body for m in billing.receive(10)] == [b"moved"]
