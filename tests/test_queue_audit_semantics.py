"""Work-queue semantics of the file store found wrong by an audit against the seeds and SQS:
each test fails on the code before its fix."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from journalq.errors import InvalidMessageError, InvalidSettingError, TaskNotFoundError
from journalq.queue import Broker
from journalq.queue import channel as channel_module
from journalq.queue.envelope import Envelope, decode_meta


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


# -- task garbage collection --------------------------------------------------------------------


def _collect(q, rounds: int = 4) -> None:
    """Let a few task collections run (each receive collects once ``task_gc_interval`` passed)."""
    for _ in range(rounds):
        time.sleep(0.06)
        q.receive(1, visibility_timeout=30)


@pytest.mark.parametrize("how", ["dead", "finished with metadata"])
def test_a_collected_task_is_gone_not_finished_while_an_older_one_is_in_flight(
    broker: Broker, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 3)  # the state read back from snapshots
    q = broker.queue(
        "tasks", max_receive_count=1, dead_letter_queue="tasks-dead", task_gc_interval=0.05, task_gc_lifetime=0.1
    )
    q.send(b"held")  # in flight all along: the channel's cursor stays before the task
    task = q.send(b"task")
    held, received = q.receive(2, visibility_timeout=30)
    if how == "dead":
        q.change_visibility(received.receipt, 0)
        assert q.receive(1) == []  # received once already: moved to the dead-letter queue
    else:
        q.set_metadata(task, {"step": 2})
        q.delete(received.receipt)
    assert q.task(task).state == how.split()[0]
    _collect(q)
    with pytest.raises(TaskNotFoundError):
        q.task(task)  # was: "finished" (a dead task), with the metadata it was sent with
    with Broker(broker.root, sync="none") as other:  # rebuilt from the last snapshot (see below)
        with pytest.raises(TaskNotFoundError):
            other.queue("tasks").task(task)
    q.delete(held.receipt)


# -- redrive of a topic's channel ---------------------------------------------------------------


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


# -- deduplication ------------------------------------------------------------------------------


def test_a_dedup_id_sent_again_after_its_window_is_deduplicated_in_every_process(broker: Broker) -> None:
    q = broker.queue("jobs", dedup_window=1.0)
    with Broker(broker.root, sync="none") as other_broker:
        other = other_broker.queue("jobs")
        assert q.send(b"a", dedup_id="X") == other.send(b"a again", dedup_id="X") == "0"
        time.sleep(1.1)  # the window of the first send is over: the id may be sent again
        again = q.send(b"b", dedup_id="X")
        assert again == "1"
        assert other.send(b"b again", dedup_id="X") == again  # was "2": stored twice
        with Broker(broker.root, sync="none") as fresh:  # one that reads the window from the journal
            assert fresh.queue("jobs").send(b"b once more", dedup_id="X") == again
    assert [m.body for m in q.receive(10)] == [b"a", b"b"]


def test_a_stored_channel_that_is_not_a_name_leaves_the_message_to_every_channel() -> None:
    assert decode_meta(b"body", b'{"c":5}') == Envelope(b"body")  # not another channel's, finished unseen
    assert decode_meta(b"body", b'{"c":"billing"}') == Envelope(b"body", channel="billing")


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


# -- bad input: a clear error ---------------------------------------------------------------------


NOT_LISTS = [
    (lambda q, r: q.delete_many(None), InvalidSettingError),
    (lambda q, r: q.receive(1, delete=None), InvalidSettingError),
    (lambda q, r: q.change_visibility_many(None), InvalidSettingError),
    (lambda q, r: q.change_visibility_many(r), InvalidSettingError),  # one receipt, not pairs
    (lambda q, r: q.change_visibility_many([r]), InvalidSettingError),
    (lambda q, r: q.change_visibility_many([(r, 1, 2)]), InvalidSettingError),
    (lambda q, r: q.send_many(None), InvalidMessageError),
    (lambda q, r: q.send_many({"body": b"one message"}), InvalidMessageError),
    (lambda q, r: q.send_many(b"one body"), InvalidMessageError),
]


@pytest.mark.parametrize("call, error", NOT_LISTS)
@pytest.mark.parametrize("shards", [1, 2])
def test_lists_of_receipts_changes_and_messages_that_are_not_lists_are_refused_clearly(
    broker: Broker, shards: int, call, error: type
) -> None:
    check_refused(broker.queue("jobs", shards=shards), call, error)


@pytest.mark.parametrize("call, error", NOT_LISTS)
def test_the_zookeeper_store_refuses_them_too(zookeeper_server: Any, call, error: type) -> None:
    with Broker(zookeeper_server.url(f"/audit{time.monotonic_ns()}")) as broker:
        check_refused(broker.queue("jobs"), call, error)


def check_refused(q: Any, call: Any, error: type) -> None:
    q.send(b"x")
    (received,) = q.receive(1)
    with pytest.raises(error, match="list|pair"):
        call(q, received.receipt)
    q.delete(received.receipt)  # nothing was done with it
    assert q.stats().available == 0
