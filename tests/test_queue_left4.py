"""The file store's channel, fourth pass: what a filtered consumer remembers of the messages its
filters do not match (``channel._Missed``), the far scan's FIFO groups, and retention on the
fast path of new plain messages."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from journalq.journal import Scanner
from journalq.queue import Broker
from journalq.queue import channel as channel_module
from journalq.queue import topic as topic_module

ENUMS = {"cls": ["low", "high"]}
HIGH = {"cls": ("high", "absolute")}
BEYOND = channel_module._LOOK_AHEAD + 200  # more than one look-ahead


@pytest.fixture
def broker(tmp_path: Path):
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


class _CountingScanner(Scanner):
    """A ``Scanner`` that counts the messages it reads (class-wide: ``read``)."""

    read = 0

    def read_batch(self, *args: object, **kwargs: object):  # type: ignore[override]
        batch = super().read_batch(*args, **kwargs)  # type: ignore[arg-type]
        _CountingScanner.read += len(batch)
        return batch


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> type[_CountingScanner]:
    """The channel's topic reads (look-ahead and far scan) counted by ``_CountingScanner.read``."""
    monkeypatch.setattr(channel_module, "Scanner", _CountingScanner)
    _CountingScanner.read = 0
    return _CountingScanner


def _lows(count: int, **more: object) -> list[dict[str, object]]:
    return [{"body": b"low", "filters": {"cls": "low"}, **more}] * count


# -- the far scan's FIFO groups -----------------------------------------------------------------


def test_a_far_group_head_goes_out_when_its_group_s_next_is_delayed(broker: Broker) -> None:
    """The far scan found g1 and read on to g2, delayed: it held group g back, after g1, so the
    second hold refused g1 too and the receive gave nothing."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    q.send(b"g1", group_id="g")
    q.send(b"g2", group_id="g", delay=600)
    assert [m.body for m in q.receive(10, wait=0)] == [b"g1"]


# -- retention on the fast path of new plain messages ---------------------------------------------


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
