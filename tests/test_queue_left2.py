"""Audit of the file store's work queues (second pass): a dead letter's ``source`` checked when
sent and read safely by a redrive; dead-letter queues that cannot take their letters; receive
counts that go on across moves, as SQS's do; sharded topics' gc and deletes under a long poll."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from journalq.errors import InvalidMessageError, QueueNotFoundError, SettingsFileError
from journalq.queue import Broker
from journalq.queue import settings as settings_file
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
