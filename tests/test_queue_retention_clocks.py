"""Retention with writers' clocks out of step: a segment goes when its newest message is past
retention (as Kafka's log retention has it), not its last stored one; a message past retention
stored after one within it is not delivered."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest
from test_queue_lookahead import broker  # noqa: F401 (fixture)

from journalq.journal.segment import list_segments
from journalq.queue import Broker
from journalq.queue import topic as topic_module

SEGMENT = 4096


def test_a_segment_ending_with_an_old_stamped_message_keeps_its_fresh_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fresh messages, then one from a writer whose clock is 2 h behind (or a message written with
    its own old time) last in their segment: gc deleted the whole segment by that last message,
    fresh messages that no consumer had received included."""
    real_time_ns = topic_module.time.time_ns
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, retention_seconds=3600)
        fresh = [queue.send(b"fresh %d" % i + bytes(100)) for i in range(5)]
        monkeypatch.setattr(topic_module.time, "time_ns", lambda: real_time_ns() - 2 * 3600 * 10**9)
        queue.send(b"old" + bytes(4096))  # fills the segment: the next send starts another
        monkeypatch.setattr(topic_module.time, "time_ns", real_time_ns)
        queue.send(b"next")
        assert len(list_segments(tmp_path / "jobs")) == 2
        queue.topic.gc()
        assert len(list_segments(tmp_path / "jobs")) == 2
        got = queue.receive(10)
        assert [m.id for m in got] == [*fresh, got[-1].id] and got[-1].body == b"next"


def test_a_segment_whose_messages_are_all_past_retention_still_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_time_ns = topic_module.time.time_ns
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, retention_seconds=3600)
        monkeypatch.setattr(topic_module.time, "time_ns", lambda: real_time_ns() - 2 * 3600 * 10**9)
        for i in range(5):
            queue.send(b"old %d" % i + bytes(100))
        queue.send(b"old" + bytes(4096))
        monkeypatch.setattr(topic_module.time, "time_ns", real_time_ns)
        queue.send(b"next")
        queue.topic.gc()
        assert len(list_segments(tmp_path / "jobs")) == 1
        assert [m.body for m in queue.receive(10)] == [b"next"]


def test_a_plain_message_past_retention_after_one_within_is_not_delivered(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timestamps are the writers' clocks: a writer whose clock is behind (or stepped back)
    stores, after a message within retention, one past it. The run taken whole checked only its
    first message, and delivered the other too."""
    q = broker.queue("jobs", retention_seconds=3600)
    q.send(b"now")
    behind = time.time_ns() - 2 * 3600 * 10**9
    with monkeypatch.context() as patched:
        patched.setattr(topic_module, "time", types.SimpleNamespace(time_ns=lambda: behind, monotonic=time.monotonic))
        q.send(b"two hours ago")
    q.send(b"later")
    assert [m.body for m in q.receive(10, wait=0)] == [b"now", b"later"]
    assert q.receive(10, visibility_timeout=0, wait=0) == []
