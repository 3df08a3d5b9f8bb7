"""The file store's channel, fourth pass: what a filtered consumer remembers of the messages its
filters do not match (``channel._Missed``), the far scan's FIFO groups, and retention on the
fast path of new plain messages."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

from journalq.journal import Scanner
from journalq.queue import Broker
from journalq.queue import channel as channel_module
from journalq.queue import topic as topic_module
from conftest import counted_lookups

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


# -- filter misses remembered --------------------------------------------------------------------


def test_an_empty_filtered_receive_does_not_read_the_topic_again(
    broker: Broker, counted_reads: type[_CountingScanner]
) -> None:
    """The second empty receive with the same filters passes over what the first found not
    matching (it read the whole topic again, out of the lock, at every receive)."""
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many(_lows(4 * BEYOND))
    assert q.receive(filters=HIGH, wait=0) == []
    counted_reads.read = 0
    assert q.receive(filters=HIGH, wait=0) == []
    assert counted_reads.read < 100, f"{counted_reads.read} messages read again"
    # What comes after is still found, and what the filters match among the misses' neighbours.
    wanted = q.send(b"high", filters={"cls": "high"})
    (got,) = q.receive(filters=HIGH, wait=0)
    assert got.id == wanted
    # The misses are still there, in order, for a consumer without filters and one they match.
    assert [m.offset for m in q.receive(10, wait=0)] == list(range(10))
    assert [m.offset for m in q.receive(10, filters={"cls": ("low", "absolute")}, wait=0)] == list(range(10, 20))


def test_other_filters_are_not_passed_over_by_one_consumer_s_misses(broker: Broker) -> None:
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many(_lows(4 * BEYOND))
    q.send(b"high", filters={"cls": "high"})
    assert [m.body for m in q.receive(filters={"cls": ("low", "at_least")}, wait=0)] == [b"low"]
    # "low at_least" matches the lows only: a miss of it, the high, is no miss of "high at_least".
    assert q.receive(filters={"cls": ("low", "at_least")}, visibility_timeout=60, wait=0)[0].offset == 1
    got = q.receive(filters={"cls": ("high", "at_least")}, wait=0)
    assert [m.offset for m in got] == [2]


def test_a_grouped_miss_still_holds_its_group_back(broker: Broker) -> None:
    """A FIFO group's message that the filters do not match holds back its group's later ones,
    whether or not the misses around it are remembered."""
    q = broker.queue("fifo", enums=ENUMS)
    q.send_many(_lows(4 * BEYOND))
    q.send(b"g-low", group_id="g", filters={"cls": "low"})
    q.send_many(_lows(4 * BEYOND))
    q.send(b"g-high", group_id="g", filters={"cls": "high"})
    for _ in range(3):
        assert q.receive(filters=HIGH, wait=0) == []


def test_a_miss_that_passed_retention_is_read_again_and_finished(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Misses remembered while within retention are read again once their oldest passes it, so
    that a receive finishes them unseen as retention says."""
    q = broker.queue("tasks", enums=ENUMS, retention_seconds=3600)
    q.send_many(_lows(4 * BEYOND))
    assert q.receive(filters=HIGH, wait=0) == []
    later = time.time_ns() + 2 * 3600 * 10**9
    monkeypatch.setattr(channel_module, "time", types.SimpleNamespace(time_ns=lambda: later, monotonic=time.monotonic))
    assert q.receive(filters=HIGH, wait=0) == []
    assert q.task("0").state == "finished"  # by the filtered receive, unseen


def test_the_misses_remembered_are_bounded(broker: Broker) -> None:
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many(_lows(2 * BEYOND))
    for i in range(channel_module._MISSED_FILTER_SETS + 4):
        assert q.receive(filters={f"f{i}": "x"}, wait=0) == []  # none offers cls: all missed
    assert len(q._missed) == channel_module._MISSED_FILTER_SETS
    assert all(len(runs) <= channel_module._ASLEEP_MOST for runs in q._missed.values())
    assert q.receive(filters={"f0": "x", "cls": "low"}, wait=0)[0].offset == 0


def test_a_filtered_long_poll_gets_what_comes_behind_misses(broker: Broker) -> None:
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many(_lows(2 * BEYOND))
    with Broker(broker.root, sync="none") as other:
        sender = other.queue("tasks")

        def send() -> None:
            for _ in range(3):
                sender.send_many(_lows(100))
                time.sleep(0.05)
            sender.send(b"high", filters={"cls": "high"})

        timer = threading.Timer(0.2, send)
        timer.start()
        try:
            got = q.receive(filters=HIGH, wait=5)
        finally:
            timer.join()
    assert [m.body for m in got] == [b"high"]


def test_misses_skipped_by_a_far_delivery_are_not_walked_again(broker: Broker) -> None:
    """A far delivery leaves the misses before it skipped: later receives with the same filters
    pass over them, under the hold, rather than look up each one again; a consumer without
    filters still receives them all, in order."""
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many(_lows(4 * BEYOND))
    q.send_many([{"body": b"h%d" % i, "filters": {"cls": "high"}} for i in range(5)])
    assert [m.body for m in q.receive(filters=HIGH, wait=0)] == [b"h0"]
    looked_up = counted_lookups(q.topic)
    for i in range(1, 5):
        assert [m.body for m in q.receive(filters=HIGH, wait=0)] == [b"h%d" % i]
    assert q.receive(filters=HIGH, wait=0) == []
    assert len(looked_up) < 5 * 100, f"{len(looked_up)} messages looked up for 5 receives"
    seen = []
    while batch := q.receive(100, wait=0):
        seen += [m.offset for m in batch]
    assert seen == list(range(4 * BEYOND))


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
