"""Dead letters: after ``max_receive_count`` deliveries a message moves to the dead-letter queue,
with where it came from; ``Queue.redrive()`` moves dead letters back."""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path

import pytest

from journalq.errors import InvalidSettingError, QueueNotFoundError
from journalq.queue import Broker
from test_queue_processes import spawn


@pytest.fixture
def broker(store_root: Path | str):
    with Broker(store_root, sync="none") as b:
        yield b


def test_message_moves_after_max_receive_count(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=3, dead_letter_queue="jobs-dlq")
    mid = q.send(b"poison", attributes={"kind": "bad"}, group_id="g")
    q.send(b"fine")
    for count in (1, 2, 3):
        got = q.receive(visibility_timeout=0)  # 0: back at once, as if the consumer failed
        assert [(m.body, m.receive_count) for m in got] == [(b"poison", count)]
        (receipt,) = [m.receipt for m in got]
    (fine,) = q.receive()  # the fourth attempt moves the poison message and goes on
    assert fine.body == b"fine"
    stats = q.stats()
    assert stats.dead == 1 and stats.available == 0
    assert q.task(mid).state == "dead"
    with pytest.raises(Exception, match="no longer in flight"):
        q.delete(receipt)
    dlq = broker.queue("jobs-dlq")
    (dead,) = dlq.receive()
    assert dead.body == b"poison" and dead.attributes["kind"].value == "bad" and dead.group_id == "g"
    where = {key: dead.source[key] for key in ("queue", "channel", "id", "count")}
    assert where == {"queue": "jobs", "channel": "default", "id": mid, "count": 3}
    assert dead.receive_count == 1
    time.sleep(0.01)
    assert q.receive(wait=0) == []


def test_expired_visibility_counts_as_a_receive(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=2, dead_letter_queue="dlq")
    q.send(b"slow")
    q.receive(visibility_timeout=0.05)
    time.sleep(0.06)
    (m,) = q.receive(visibility_timeout=0.05)
    assert m.receive_count == 2
    time.sleep(0.06)
    assert q.receive() == []
    assert [m.body for m in broker.queue("dlq").receive()] == [b"slow"]


def test_deleted_in_time_is_not_dead(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    q.send(b"ok")
    (m,) = q.receive()
    q.delete(m.receipt)
    assert q.receive() == [] and q.stats().dead == 0
    assert broker.queue("dlq").stats().available == 0


def test_redrive_moves_dead_letters_back(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    q.send_many([{"body": b"%d" % i, "attributes": {"i": i}} for i in range(5)])
    assert len(q.receive(10, visibility_timeout=0)) == 5
    assert q.receive(10) == []  # all five moved
    dlq = broker.queue("jobs-dlq")
    assert dlq.stats().available == 5
    assert dlq.redrive() == 5
    assert dlq.stats().available == 0 and dlq.stats().in_flight == 0
    back = q.receive(10)
    assert [m.body for m in back] == [b"%d" % i for i in range(5)]  # oldest first
    assert [m.attributes["i"].value for m in back] == ["0", "1", "2", "3", "4"]
    assert all(m.receive_count == 1 for m in back)  # a fresh message: counting starts again


def test_redrive_to_another_destination_and_limit(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    q.send_many([b"a", b"b", b"c"])
    q.receive(10, visibility_timeout=0)
    q.receive(10)
    dlq = broker.queue("dlq")
    with pytest.raises(QueueNotFoundError):
        dlq.redrive("elsewhere")  # a destination must exist: redrive makes no queue
    assert dlq.stats().available == 3
    elsewhere = broker.queue("elsewhere")
    assert dlq.redrive("elsewhere", max_messages=2) == 2
    assert [m.body for m in elsewhere.receive(10)] == [b"a", b"b"]
    assert dlq.redrive() == 1
    assert [m.body for m in q.receive(10)] == [b"c"]


def test_redrive_of_many_dead_letters(broker: Broker) -> None:
    """More than two batches of 100: the batch size must stay within receive's limits."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    q.send_many([b"%d" % i for i in range(250)])
    while q.receive(100, visibility_timeout=0):
        pass
    dlq = broker.queue("dlq")
    assert dlq.stats().available == 250
    assert dlq.redrive() == 250
    assert q.stats().available == 250
    got = []
    while batch := q.receive(100):
        got += batch
        q.delete_many([m.receipt for m in batch])
    assert sorted(int(m.body) for m in got) == list(range(250))


@pytest.mark.files_only("the ZooKeeper store has one channel per queue")
def test_dead_letter_of_a_topic_channel_names_it(broker: Broker) -> None:
    topic = broker.topic("events", max_receive_count=1, dead_letter_queue="events-dlq")
    a, b = topic.channel("a"), topic.channel("b")
    topic.send(b"x")
    a.receive(visibility_timeout=0)
    assert a.receive() == []  # moved
    (m,) = b.receive()  # the other channel is not affected
    assert m.receive_count == 1
    (dead,) = broker.queue("events-dlq").receive()
    assert dead.source["channel"] == "a"


def test_a_dead_letter_keeps_when_it_was_first_sent(broker: Broker) -> None:
    """SQS keeps a dead letter's SentTimestamp (and MessageId, and counts on): here it is a new
    message of the dead-letter queue, with a new id and time, and its source says which message
    it was (id, receive count) and, since the time is lost otherwise, when that was sent."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    q.send(b"poison")
    (first,) = q.receive(visibility_timeout=0)
    time.sleep(0.01)
    assert q.receive() == []  # moved
    (dead,) = broker.queue("jobs-dlq").receive()
    assert dead.source["sent_at_ns"] == first.sent_at_ns < dead.sent_at_ns
    assert (dead.source["id"], dead.source["count"]) == (first.id, 1)


def test_a_dead_letter_moved_on_keeps_when_it_was_first_sent(broker: Broker) -> None:
    """A dead-letter queue with a redrive policy of its own moves the dead letter on: its source
    names the queue it came from last, and the time the message was first sent (it gave the
    time it was moved, so SQS's SentTimestamp changed on the second move)."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    broker.queue("jobs-dlq", max_receive_count=1, dead_letter_queue="jobs-dlq2")
    q.send(b"poison")
    (first,) = q.receive(visibility_timeout=0)
    time.sleep(0.01)
    assert q.receive() == []  # moved
    dlq = broker.queue("jobs-dlq")
    (dead,) = dlq.receive(visibility_timeout=0)
    time.sleep(0.01)
    assert dlq.receive() == []  # moved on
    (twice,) = broker.queue("jobs-dlq2").receive()
    assert twice.source["queue"] == "jobs-dlq" and twice.source["id"] == dead.id
    assert twice.source["sent_at_ns"] == first.sent_at_ns < dead.sent_at_ns < twice.sent_at_ns


@pytest.mark.files_only("the ZooKeeper store has one channel per queue")
def test_dead_letters_to_a_topic_go_to_its_channels_and_make_no_channel_of_their_own(broker: Broker) -> None:
    """A dead-letter queue that is a topic with channels of its own: each of them gets the dead
    letter, and no channel ``default`` is made on it (which took every message of the topic, and
    held its gc for ever, as no one reads it)."""
    dlq = broker.topic("events-dlq", segment_size=4096)
    audit, alert = dlq.channel("audit"), dlq.channel("alert")
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="events-dlq")
    poison = q.send(b"poison")
    q.receive(visibility_timeout=0)
    assert q.receive() == []  # moved
    dlq.send_many([b"x" * 100] * 100)  # segments that the two channels finish
    assert dlq.channel_names() == ["alert", "audit"]
    for channel in (audit, alert):
        got = channel.receive(200)
        assert [(m.body, m.source["id"]) for m in got[:1]] == [(b"poison", poison)] and len(got) == 101
        assert not any(channel.delete_many([m.receipt for m in got]))
    # No one else holds them (the move's deduplication id keeps its segment until its window ends).
    assert dlq.gc() == []
    assert dlq.gc(now=time.time() + dlq.settings.dedup_window + 1)


def test_a_dead_letter_queue_missing_is_made_by_the_first_move(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    poison = q.send(b"poison")
    q.receive(visibility_timeout=0)
    assert q.receive() == []
    assert broker.exists("jobs-dlq") and q.task(poison).state == "dead"
    assert [m.body for m in broker.queue("jobs-dlq").receive(10)] == [b"poison"]


def test_redrive_leaves_dead_letters_of_a_deleted_queue(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    q.send(b"a")
    q.receive(visibility_timeout=0)
    q.receive()
    broker.delete("jobs")
    dlq = broker.queue("dlq")
    assert dlq.redrive() == 0
    assert not broker.exists("jobs")  # not made again by the redrive
    s = dlq.stats()
    assert (s.available, s.in_flight) == (1, 0)  # given back, to be redriven elsewhere or looked at


def test_redrive_goes_past_what_cannot_move_and_gives_it_back(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    dlq = broker.queue("dlq")
    dlq.send_many([b"stray %d" % i for i in range(150)])  # sent to it by hand: no source queue
    q.send(b"dead")
    q.receive(visibility_timeout=0)
    assert q.receive() == []  # moved, behind more than a batch of strays
    assert dlq.redrive() == 1
    assert [m.body for m in q.receive(10)] == [b"dead"]
    s = dlq.stats()
    assert (s.available, s.in_flight) == (150, 0)
    assert [m.body for m in dlq.receive(2)] == [b"stray 0", b"stray 1"]  # in their order


def test_redrive_does_not_wait_for_more_dead_letters(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq")
    dlq = broker.queue("dlq", receive_wait=5)  # long polling by default
    q.send(b"x")
    q.receive(visibility_timeout=0)
    assert q.receive() == []
    started = time.monotonic()
    assert dlq.redrive() == 1
    assert time.monotonic() - started < 2


def test_bad_redrives(broker: Broker) -> None:
    dlq = broker.queue("dlq")
    dlq.send(b"x")
    with pytest.raises(InvalidSettingError, match="itself"):
        dlq.redrive("dlq")  # it would move the same messages round and round
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(InvalidSettingError, match="max_messages"):
            dlq.redrive(max_messages=bad)  # type: ignore[arg-type]
    assert dlq.redrive(max_messages=0) == 0
    assert dlq.stats().available == 1


# Killed right after it moved a dead letter, before it recorded the move (in the channel, or
# the task's state in ZooKeeper).
KILLED_MOVING = textwrap.dedent(
    """
    import os, signal, sys
    from journalq.queue import Broker

    if sys.argv[1].startswith("zk://"):
        from journalq.queue.zookeeper.store import ZooKeeperQueue as Mover

        move, send = Mover._send_dead, None
        def mover(self, dead):
            global send
            if dead and send is None:
                target = self.topic.broker.queue("jobs-dlq")
                send = target.send_many
                target.send_many = lambda items: (send(items), os.kill(os.getpid(), signal.SIGKILL))
            move(self, dead)
        Mover._send_dead = mover
    else:  # a send to the dead-letter topic, however the mover reaches it
        from journalq.queue.topic import Topic

        send = Topic.send_many
        def sender(self, items):
            ids = send(self, items)
            if self.name == "jobs-dlq":
                os.kill(os.getpid(), signal.SIGKILL)
            return ids
        Topic.send_many = sender
    options = {"session_timeout": 1.0} if sys.argv[1].startswith("zk://") else {}  # (its claims end soon)
    with Broker(sys.argv[1], sync="always", **options) as broker:
        broker.queue("jobs").receive(10)
    """
)


def poison_moved_by_a_killed_mover(root: Path | str, mover: str, child_env: dict) -> str:
    """A message received once from queue ``jobs`` (whose ``max_receive_count`` is 1, and
    dead-letter queue ``jobs-dlq``), then the process ``mover`` (code given ``root``), which
    receives, and kills itself as it moves the message; returns the message's id."""
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
        poison = q.send(b"poison")
        assert [m.id for m in q.receive(visibility_timeout=0)] == [poison]
    assert spawn(mover, root, env=child_env).wait(60) == -signal.SIGKILL
    return poison


def test_killed_after_moving_a_dead_letter_moves_it_once(store_root: Path | str, child_env: dict) -> None:
    poison = poison_moved_by_a_killed_mover(store_root, KILLED_MOVING, child_env)
    with Broker(store_root, sync="none") as broker:
        q = broker.queue("jobs")
        # A receive moves it again (the move before was never recorded) once the mover's claim
        # is over (on ZooKeeper, when its session ends).
        deadline = time.monotonic() + 30
        while q.task(poison).state != "dead" and time.monotonic() < deadline:
            assert q.receive(10, wait=0.2) == []
        assert q.stats().dead == 1 and q.task(poison).state == "dead"
        dead = broker.queue("jobs-dlq").receive(10)
        assert [(m.body, m.source["id"]) for m in dead] == [(b"poison", poison)], "moved twice"


def test_dead_letters_of_one_body_are_kept_by_a_content_deduplicating_queue(broker: Broker) -> None:
    # Each move has a deduplication id of its own: two messages with one body are two dead
    # letters (the dead-letter queue's content_based_dedup once dropped the second).
    broker.queue("jobs-dlq", content_based_dedup=True)
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    ids = [q.send(b"same"), q.send(b"same")]
    assert len(q.receive(10, visibility_timeout=0)) == 2
    assert q.receive(10) == []
    assert q.stats().dead == 2
    assert sorted(m.source["id"] for m in broker.queue("jobs-dlq").receive(10)) == ids


def test_a_dead_letter_redriven_to_a_content_deduplicating_queue_is_not_lost(broker: Broker) -> None:
    """The redriven message has the body of the one first sent, within the queue's dedup window:
    taken for a duplicate of it, it was dropped, and the redrive deleted the dead letter all the
    same. Each redriven message carries a deduplication id of its own (as a move does)."""
    q = broker.queue("jobs", content_based_dedup=True, max_receive_count=1, dead_letter_queue="jobs-dlq")
    q.send_many([b"same", b"other"])
    assert len(q.receive(10, visibility_timeout=0)) == 2
    assert q.receive(10) == []  # both moved
    dlq = broker.queue("jobs-dlq")
    assert dlq.redrive() == 2
    assert sorted(m.body for m in q.receive(10)) == [b"other", b"same"]


# Killed after it sent a batch of dead letters back, before it deleted them from the dead-letter
# queue (which hides them for a second, not a minute, so that the test sees them come back).
KILLED_REDRIVING = textwrap.dedent(
    """
    import os, signal, sys
    import journalq.queue.workqueue as workqueue
    from journalq.queue import Broker

    workqueue._REDRIVE_VISIBILITY = 1.0
    with Broker(sys.argv[1], sync="always") as broker:
        target = broker.queue("jobs")
        send = target.send_many
        target.send_many = lambda items: (send(items), os.kill(os.getpid(), signal.SIGKILL))
        broker.queue("jobs-dlq").redrive()
    """
)


def test_a_redrive_killed_after_sending_moves_each_dead_letter_once(store_root: Path | str, child_env: dict) -> None:
    with Broker(store_root, sync="none") as broker:
        q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
        q.send_many([b"a", b"b", b"c"])
        assert len(q.receive(10, visibility_timeout=0)) == 3
        assert q.receive(10) == []  # all three moved
    assert spawn(KILLED_REDRIVING, store_root, env=child_env).wait(60) == -signal.SIGKILL
    with Broker(store_root, sync="none") as broker:
        dlq = broker.queue("jobs-dlq")
        deadline = time.monotonic() + 30
        while dlq.stats().available < 3 and time.monotonic() < deadline:  # back from the killed redrive
            time.sleep(0.1)
        assert dlq.redrive() == 3
        got = broker.queue("jobs").receive(10)
        assert sorted(m.body for m in got) == [b"a", b"b", b"c"], "redriven twice"


@pytest.mark.files_only("two brokers of one directory in one process")
def test_a_dead_letter_queue_deleted_by_another_process_is_made_again_by_the_move(tmp_path: Path) -> None:
    """The move sent to the dead-letter topic this process had open, which another process had
    deleted: the receive of the source queue failed with the dead-letter queue's
    QueueNotFoundError (once; the next made it again). A move makes it again at once, as it
    makes one that is missing."""
    with Broker(tmp_path, sync="none") as here, Broker(tmp_path, sync="none") as there:
        q = here.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
        here.queue("jobs-dlq").send(b"earlier")
        poison = q.send(b"poison")
        q.receive(visibility_timeout=0)
        there.delete("jobs-dlq")
        assert q.receive() == []  # moved
        assert q.task(poison).state == "dead"
        assert [m.body for m in here.queue("jobs-dlq").receive(10)] == [b"poison"]
