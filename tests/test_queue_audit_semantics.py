"""Work-queue semantics of the file store found wrong by an audit against the seeds and SQS:
each test fails on the code before its fix."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from journalq.queue import Broker
from journalq.queue.channel import _LOOK_AHEAD


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


# -- what cannot go out now must not hide what can: beyond the look-ahead too --------------------

BACKLOG = _LOOK_AHEAD + 100  # more messages that cannot go out than one receive reads ahead


def test_a_message_for_this_consumer_behind_many_filtered_out_is_received(broker: Broker) -> None:
    q = broker.queue("tasks", enums={"class": ["low", "high"]})
    q.send_many([{"body": b"low", "filters": {"class": "low"}} for _ in range(BACKLOG)])
    wanted = q.send(b"high", filters={"class": "high"})
    assert [m.id for m in q.receive(1, filters={"class": "high"})] == [wanted]


def test_a_message_behind_many_delayed_ones_is_received(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 900} for _ in range(BACKLOG)])
    now = q.send(b"now")
    assert [m.id for m in q.receive(1)] == [now]
    assert q.stats().delayed == BACKLOG


def test_another_group_behind_a_long_blocked_group_is_received(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send_many([{"body": b"a", "group_id": "A"} for _ in range(BACKLOG)])
    b = q.send(b"b", group_id="B")
    assert [m.group_id for m in q.receive(1)] == ["A"]
    assert [m.id for m in q.receive(10)] == [b]  # A is in flight: only B's one may go
