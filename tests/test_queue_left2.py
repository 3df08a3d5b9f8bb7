"""Audit of the file store's work queues (second pass): a dead letter's ``source`` checked when
sent and read safely by a redrive; dead-letter queues that cannot take their letters; receive
counts that go on across moves, as SQS's do; sharded topics' gc and deletes under a long poll."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from journalq.errors import InvalidMessageError, QueueNotFoundError
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


# -- sharded topics ------------------------------------------------------------------------------


def test_a_sharded_receive_collects_the_topic_once_per_interval(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's channel collects when due; the topic's gc, which counts ``retention_bytes``
    over every shard, runs once for them all (it ran once per shard, each listing every shard)."""
    from journalq.queue.sharded import ShardedTopic

    queue = broker.queue("orders", shards=4, retention_bytes=10**6, task_gc_interval=0.5)
    calls: list[int] = []
    real = ShardedTopic.size_cuts
    monkeypatch.setattr(ShardedTopic, "size_cuts", lambda self: calls.append(1) or real(self))
    for _ in range(3):
        queue.send_many([b"%d" % i for i in range(8)])
        time.sleep(0.55)
        calls.clear()
        got = queue.receive(10)  # from every shard
        assert len({m.id.split(".")[0] for m in got}) > 1
        queue.delete_many([m.receipt for m in got])
        assert len(calls) == 1


@pytest.mark.parametrize("opened", ["every shard", "one shard"])
def test_a_sharded_long_poll_meets_a_delete_between_shards_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: str
) -> None:
    """``Broker.delete`` removes a sharded topic's shards before its own directory: a long poll of
    another broker (process) caught in between raises ``QueueNotFoundError`` (the server's 404),
    not whatever a missing shard's file gave (a 500)."""
    from journalq.queue import broker as broker_module

    shards_gone, carry_on = threading.Event(), threading.Event()
    real = broker_module.remove_directory

    def slow_remove(root: Path, name: str) -> bool:
        shards_gone.set()
        carry_on.wait(10)
        return real(root, name)

    outcome: list[object] = []
    with Broker(tmp_path, sync="none") as polling, Broker(tmp_path, sync="none") as deleting:
        queue = polling.queue("orders", shards=4)
        if opened == "every shard":
            queue.send_many([b"x%d" % i for i in range(16)])
            queue.delete_many([m.receipt for m in queue.receive(100)])
        else:
            queue.receive(1)  # opens its home shard's channel only

        def poll() -> None:
            try:
                outcome.append(queue.receive(10, wait=5))
            except Exception as exc:  # noqa: BLE001 - what it raised is the point
                outcome.append(exc)

        monkeypatch.setattr(broker_module, "remove_directory", slow_remove)
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)  # the poll is waiting
        deleter = threading.Thread(target=deleting.delete, args=("orders",))
        deleter.start()
        assert shards_gone.wait(10)
        poller.join(10)
        carry_on.set()
        deleter.join(10)
        assert not poller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], QueueNotFoundError), outcome


def test_a_sharded_gc_keeps_what_a_channel_of_another_process_has_not_read(tmp_path: Path) -> None:
    """The gc of a process that only sends (it opened no channel) keeps, in every shard, what a
    channel that another process made has not read there, also in shards it never received
    from; and collects once that channel is done."""
    with Broker(tmp_path, sync="none") as consuming:
        consuming.topic("events", shards=4, segment_size=4096)
        slow = consuming.topic("events").channel("slow")
        with Broker(tmp_path, sync="none") as sending:
            topic = sending.topic("events")
            sent = topic.send_many([b"%04d" % i + b"." * 100 for i in range(800)])
            first = slow.receive(5)  # from its home shard only
            slow.delete_many([m.receipt for m in first])
            slow.commit_cursor()
            topic.gc()
            rest = []
            while got := slow.receive(50):
                rest += got
                slow.delete_many([m.receipt for m in got])
            assert sorted(m.id for m in first + rest) == sorted(sent)
            slow.commit_cursor()
            assert topic.gc()  # once it is done


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


# -- stored envelopes that no sender could make ---------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [
        b'{"g":5}',
        b'{"g":["a"]}',
        b'{"i":7}',
        b'{"d":"inf"}',
        b'{"d":"nan"}',
        b'{"d":1e400}',
        b'{"a":{"x":[1,"v"]}}',
        b'{"f":{"k":1}}',
    ],
)
def test_a_stored_envelope_that_no_sender_makes_never_fails_a_receive(broker: Broker, meta: bytes) -> None:
    """sej messages carry no checksum, and other tools write the journal: an envelope whose
    fields have the wrong kinds is read as damaged (the value as it is, all body), as the
    format promises, instead of failing every receive of the queue (or storing a bad event)."""
    import struct

    from journalq.journal import Message

    q = broker.queue("jobs")
    value = b"JQ1" + struct.pack(">I", len(meta)) + meta + b"body"
    q.topic._get_writer().append_many([Message(timestamp_ns=time.time_ns(), type=ENVELOPE_TYPE, value=value)])
    q.send(b"next", group_id="g")
    got = q.receive(10)
    assert [m.body for m in got] == [value, b"next"]
    assert q.delete_many([m.receipt for m in got]) == [None, None]
    assert q.stats().available == 0


@pytest.mark.parametrize("filters", ["", [], 0, False, ()])
def test_message_filters_that_are_no_mapping_are_refused_even_when_empty(broker: Broker, filters: object) -> None:
    q = broker.queue("jobs")
    with pytest.raises(InvalidMessageError, match="filters"):
        q.send(b"x", filters=filters)  # type: ignore[arg-type]
    assert q.send(b"x", filters={}) == "0"  # an empty mapping is no filter


def test_a_dead_letter_queue_named_as_a_shard_is_refused_when_set(broker: Broker) -> None:
    """No queue can have such a name (kept for shards): every move would fail; refused at once."""
    from journalq.errors import InvalidSettingError

    with pytest.raises(InvalidSettingError, match="shard"):
        broker.queue("jobs", max_receive_count=1, dead_letter_queue="orders.2.001")
    q = broker.queue("jobs")
    with pytest.raises(InvalidSettingError, match="shard"):
        q.configure(max_receive_count=1, dead_letter_queue="orders.2.001")
    assert q.settings.dead_letter_queue is None


@pytest.mark.parametrize("metadata", [{"x": float("nan")}, {"x": object()}, {1j: 1}])
def test_a_sharded_batch_with_metadata_that_is_no_json_stores_nothing(broker: Broker, metadata: object) -> None:
    """Every message of a sharded batch is checked before any shard's part is written: metadata
    that cannot be stored as JSON was found only when its shard's part was encoded, after the
    parts of other shards were stored (a PartialSendError for bad input)."""
    queue = broker.queue("orders", shards=4)
    items = [{"body": b"%d" % i, "key": b"k%d" % i} for i in range(8)]
    items.append({"body": b"bad", "key": b"k7", "metadata": metadata})  # the last shard written
    with pytest.raises(InvalidMessageError, match="JSON") as caught:
        queue.send_many(items)
    assert type(caught.value) is InvalidMessageError
    assert queue.stats().available == 0


# -- retention by another process ------------------------------------------------------------


def test_a_receive_goes_past_what_another_process_s_retention_deleted(tmp_path: Path) -> None:
    """Another process's gc deleted (by retention) segments this channel had not read: the next
    receive starts at the first message kept. It returned nothing until this process's own
    collection came due (task_gc_interval, a minute by default), while stats said there were
    messages."""
    from journalq.journal.segment import list_segments

    with Broker(tmp_path, sync="none") as mine, Broker(tmp_path, sync="none") as other:
        queue = mine.queue("jobs", segment_size=4096, retention_bytes=3 * 4096)
        queue.send_many([b"%04d" % i + b"." * 100 for i in range(300)])
        assert other.topic("jobs").gc()  # the oldest segments go, unread
        first = list_segments(tmp_path / "jobs")[0].base
        assert first > 0 and queue.stats().available == 300 - first
        got = queue.receive(5)
        assert [m.offset for m in got] == list(range(first, first + 5))


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


def test_a_sharded_gc_collects_the_other_shards_when_one_fails(broker: Broker, tmp_path: Path) -> None:
    """One shard whose gc fails (a damaged offset file) no longer keeps the shards after it from
    being collected; its failure is raised once all were tried."""
    from journalq.errors import JournalError
    from journalq.journal.segment import list_segments

    topic = broker.topic("events", shards=4, segment_size=4096)
    channel = topic.channel("c")
    topic.send_many([{"body": b"%04d" % i + b"." * 100, "key": b"k%d" % i} for i in range(800)])
    while got := channel.receive(100):
        channel.delete_many([m.receipt for m in got])
    channel.commit_cursor()
    before = [len(list_segments(shard.path)) for shard in topic.shards]
    assert min(before) > 1
    damaged = topic.shards[1].path / "ofs" / "c.ofs"
    damaged.unlink()
    damaged.mkdir()  # read_offset: "the offset file is a directory"
    with pytest.raises(JournalError, match="directory"):
        topic.gc()
    after = [len(list_segments(shard.path)) for shard in topic.shards]
    assert after[1] == before[1]
    assert [after[i] for i in (0, 2, 3)] == [1, 1, 1]
