"""The file store's receive past its look-ahead (``channel._LOOK_AHEAD`` never-seen messages read
per receive): an eligible message is found wherever it lies in the topic, behind any number of
messages that this consumer cannot take now (filtered out, delayed, held back by their FIFO
group), and later receives do not pay for every message skipped over on the way: what a filtered
consumer remembers of the messages its filters do not match (``channel._Missed``), and the far
scan's FIFO groups."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

from journalq.errors import (
    CorruptionError,
    InvalidSettingError,
    OffsetOutOfRangeError,
    ReceiptError,
    StorageError,
)
from journalq.journal import Scanner
from journalq.journal.inspect import check
from journalq.queue import Broker
from journalq.queue import channel as channel_module
from conftest import counted_lookups

ENUMS = {"cls": ["low", "high"]}
BEYOND = channel_module._LOOK_AHEAD + 200  # more ineligible messages than one look-ahead


@pytest.fixture
def broker(tmp_path: Path):
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


def test_a_filtered_consumer_finds_its_message_behind_a_look_ahead_of_others(broker: Broker) -> None:
    q = broker.queue("tasks", enums=ENUMS)
    q.send_many([{"body": b"low", "filters": {"cls": "low"}}] * BEYOND)
    wanted = q.send(b"high", filters={"cls": "high"})
    (got,) = q.receive(filters={"cls": ("high", "absolute")}, wait=0)
    assert got.id == wanted and got.body == b"high"
    # The others are all still there, in order, for a consumer that takes them.
    taken = q.receive(10, filters={"cls": ("low", "absolute")}, wait=0)
    assert [m.offset for m in taken] == list(range(10))


def test_an_undelayed_message_goes_out_behind_a_look_ahead_of_delayed_ones(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    now = q.send(b"now")
    (got,) = q.receive(wait=0)
    assert got.id == now
    assert q.receive(10, wait=0) == []
    stats = q.stats()
    assert (stats.available, stats.in_flight, stats.delayed) == (0, 1, BEYOND)


def test_a_fifo_group_goes_on_while_another_has_a_look_ahead_queued(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send_many([{"body": b"a%d" % i, "group_id": "A"} for i in range(BEYOND)])
    q.send_many([{"body": b"b0", "group_id": "B"}, {"body": b"b1", "group_id": "B"}])
    (a0,) = q.receive(wait=0)
    assert a0.body == b"a0"
    (b0,) = q.receive(wait=0)  # A's head is in flight: B goes on
    assert b0.body == b"b0"
    assert q.receive(10, wait=0) == []  # nothing of a group with one in flight
    q.delete(b0.receipt)
    assert [m.body for m in q.receive(10, wait=0)] == [b"b1"]
    q.delete(a0.receipt)
    assert [m.body for m in q.receive(10, wait=0)] == [b"a%d" % i for i in range(1, 11)]


def test_a_delayed_group_head_past_the_look_ahead_still_holds_its_group(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send_many([{"body": b"x", "delay": 600}] * BEYOND)
    q.send(b"g1", group_id="g", delay=600)
    q.send(b"g2", group_id="g")
    q.send(b"h1", group_id="h")
    assert [m.body for m in q.receive(10, wait=0)] == [b"h1"]


def test_a_group_past_the_look_ahead_goes_out_together_up_to_its_first_held_back(broker: Broker) -> None:
    """The scan past the look-ahead takes a group's messages together, as a receive under the
    hold does, and stops a group at its first message that cannot go."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x", "delay": 600}] * BEYOND)
    q.send_many([{"body": b"g%d" % i, "group_id": "g"} for i in range(3)])
    q.send_many([{"body": b"h0", "group_id": "h"}, {"body": b"h1", "group_id": "h", "delay": 600},
                 {"body": b"h2", "group_id": "h"}])
    got = q.receive(10, wait=0)
    assert [m.body for m in got] == [b"g0", b"g1", b"g2", b"h0"]
    q.send(b"g3", group_id="g")
    assert q.receive(10, wait=0) == []  # g and h in flight (h1 delayed besides)
    q.delete_many([m.receipt for m in got])
    assert [m.body for m in q.receive(10, wait=0)] == [b"g3"]
    # (With ``one_per_group``, the scan takes one of each.)
    q = broker.queue("fifo-shared")
    q.send_many([{"body": b"x", "delay": 600}] * BEYOND)
    q.send_many([{"body": b"g%d" % i, "group_id": "g"} for i in range(3)] + [{"body": b"h0", "group_id": "h"}])
    assert [m.body for m in q.receive(10, wait=0, one_per_group=True)] == [b"g0", b"h0"]


def test_a_batch_takes_several_far_messages_and_another_process_sees_them(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    q.send_many([b"n0", b"n1", b"n2"])
    got = q.receive(2, wait=0)
    assert [m.body for m in got] == [b"n0", b"n1"]
    with Broker(broker.root, sync="none") as other:
        (third,) = other.queue("jobs").receive(10, wait=0)
        assert third.body == b"n2"
        assert other.queue("jobs").receive(10, wait=0) == []


def test_messages_behind_a_far_delivery_keep_coming_cheaply(broker: Broker) -> None:
    """After a delivery far past the frontier, the delayed messages skipped over are not read
    again by every receive (each would cost a read of thousands of messages under the lock)."""
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * (4 * BEYOND))
    q.send_many([b"n%d" % i for i in range(20)])
    assert [m.body for m in q.receive(wait=0)] == [b"n0"]
    reads = counted_lookups(q.topic)
    for i in range(1, 20):
        assert [m.body for m in q.receive(wait=0)] == [b"n%d" % i]
    assert len(reads) < 20 * 10, f"{len(reads)} messages looked up for 19 receives"
    assert q.receive(wait=0) == []
    reads.clear()
    stats = q.stats()  # nor by stats, which counts them
    assert (stats.available, stats.in_flight, stats.delayed) == (0, 20, 4 * BEYOND)
    assert len(reads) < 100, f"{len(reads)} messages looked up for stats"


def test_delayed_messages_skipped_over_go_out_when_their_delay_ends(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"soon", "delay": 0.5}] * BEYOND)
    q.send(b"now")
    assert [m.body for m in q.receive(wait=0)] == [b"now"]
    assert q.receive(wait=0) == []
    time.sleep(0.55)
    got = q.receive(10, wait=0)
    assert [m.offset for m in got] == list(range(10))
    seen = {m.offset for m in got}
    while batch := q.receive(10, wait=0):
        seen.update(m.offset for m in batch)
    assert seen == set(range(BEYOND))


def test_a_long_poll_wakes_for_a_message_sent_behind_a_look_ahead_of_delayed_ones(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    with Broker(broker.root, sync="none") as other:
        timer = threading.Timer(0.3, lambda: other.queue("jobs").send(b"now"))
        timer.start()
        try:
            started = time.monotonic()
            got = q.receive(wait=5)
        finally:
            timer.join()
    assert [m.body for m in got] == [b"now"] and time.monotonic() - started < 4


# -- stats of dead letters kept back ----------------------------------------------------------


def test_stats_do_not_count_dead_letters_kept_back_as_available(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message past max_receive_count whose move the dead-letter queue refused is kept,
    undelivered, until the move is tried again: not available (a receive gives nothing)."""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq", task_gc_interval=60)
    q.send(b"poison")
    (got,) = q.receive(visibility_timeout=0)
    dlq_topic = broker.topic("jobs-dlq")

    def refuse(items: object) -> list[str]:
        raise StorageError("the disk is full")

    monkeypatch.setattr(dlq_topic, "send_many", refuse)
    assert q.receive(wait=0) == []  # the move is refused: kept here
    stats = q.stats()
    assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 1, 0)
    assert stats.oldest_age is not None
    monkeypatch.undo()
    q.send(b"fine")  # (what comes after it goes on meanwhile)
    assert q.stats().available == 1


def test_consumers_of_two_brokers_share_the_far_messages_once_each(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    q.send_many([b"n%d" % i for i in range(60)])
    seen: list[int] = []
    with Broker(broker.root, sync="none") as other:
        r = other.queue("jobs")
        for _ in range(40):
            for consumer in (q, r, q):
                got = consumer.receive(2, wait=0)
                seen += [m.offset for m in got]
                consumer.delete_many([m.receipt for m in got[:1]])  # the second stays in flight
    assert sorted(seen) == list(range(BEYOND, BEYOND + 60))


def test_a_far_message_taken_by_another_process_during_the_scan_is_not_given_twice(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    q.send_many([b"n0", b"n1"])
    with Broker(broker.root, sync="none") as other:
        r = other.queue("jobs")
        scan = q._scan_far
        taken = []

        def scan_then_lose_the_race(*args: object):
            found = scan(*args)  # type: ignore[arg-type]
            taken.extend(r.receive(wait=0))  # another process takes n0 between the scan and the hold
            return found

        q._scan_far = scan_then_lose_the_race  # type: ignore[method-assign]
        got = q.receive(2, wait=0)
        assert [m.body for m in taken] == [b"n0"]
        assert [m.body for m in got] == [b"n1"]
        assert r.receive(10, wait=0) == [] and q.receive(10, wait=0) == []


def test_a_consumer_that_others_overran_reads_under_the_hold_only_what_it_takes(broker: Broker) -> None:
    """Another process took all that this consumer had read ahead: the receive reads on, under the
    hold, only as far as it takes (``_HELD_READ`` at a time), not a whole look-ahead while the
    others wait for the lock; the next receive reads the rest out of the hold."""
    look_ahead = channel_module._LOOK_AHEAD
    q = broker.queue("jobs")
    q.send_many([b"m%d" % i for i in range(3 * look_ahead)])
    assert [m.offset for m in q.receive(wait=0)] == [0]  # and a look-ahead read
    with Broker(broker.root, sync="none") as other:
        r = other.queue("jobs")
        while r.receive(10, wait=0)[-1].offset < look_ahead:  # past all that q read ahead
            pass
        frontier = r.receive(wait=0)[0].offset + 1
    reads: list[tuple[bool, int]] = []
    read_ahead = q._read_ahead

    def recorded(at: int, most: int = look_ahead) -> list:
        got = read_ahead(at, most)
        if most:
            reads.append((q._writer._held > 0, len(got)))  # (under the hold, messages read)
        return got

    q._read_ahead = recorded  # type: ignore[method-assign]
    assert [m.offset for m in q.receive(2, wait=0)] == [frontier, frontier + 1]
    assert 2 <= sum(n for held, n in reads if held) < look_ahead // 4  # (``_HELD_READ``; a whole one before)
    reads.clear()
    assert [m.offset for m in q.receive(2, wait=0)] == [frontier + 2, frontier + 3]
    assert [held for held, n in reads if n] == [False]  # the rest of a look-ahead, out of the hold


# -- read ahead, then deleted by another process's retention ---------------------------------------


def test_what_was_read_ahead_and_deleted_by_another_process_is_not_delivered(tmp_path: Path) -> None:
    """Another process's gc deletes (retention by size) the segments that this consumer had read
    ahead: the receive skips them, and gives no more than asked, each with a receipt that works.
    (It gave the deleted messages, with receipts naming no delivery, and one more than asked.)"""
    segment = 4096
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=segment, retention_bytes=3 * segment)
        q.send_many([b"%03d" % i + b"x" * 97 for i in range(10)])
        q.receive(2, visibility_timeout=60)  # the rest of the 10 read ahead
        with Broker(tmp_path, sync="none") as other:
            o = other.queue("jobs")
            o.send_many([b"%03d" % i + b"x" * 97 for i in range(10, 400)])
            assert o.topic.gc()
        first = q.topic.first_offset()
        assert first > 300
        got = q.receive(10)
        assert [m.offset for m in got] == list(range(first, first + 10))
        assert q.delete_many([m.receipt for m in got]) == [None] * 10


def test_a_redelivery_taken_before_retention_was_found_to_have_deleted_it_is_not_given(
    tmp_path: Path,
) -> None:
    """Of the messages that come back, the first is still in the topic's cache and the next is
    not, both deleted by another process's retention: the receive skips them both (it gave the
    first, with a receipt naming no delivery)."""
    segment = 4096
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=segment, retention_bytes=3 * segment)
        q.send_many([b"%03d" % i + b"x" * 97 for i in range(10)])
        assert len(q.receive(10, visibility_timeout=0)) == 10  # all back at once
        with Broker(tmp_path, sync="none") as other:
            o = other.queue("jobs")
            o.send_many([b"%03d" % i + b"x" * 97 for i in range(10, 400)])
            assert o.topic.gc()
        first = q.topic.first_offset()
        real = q.topic.message
        # The cache held message 0, and no longer the others (a cache of a few thousand).
        q.topic.message = lambda offset: real(offset) if offset == 0 or offset >= first else None  # type: ignore[method-assign]
        got = q.receive(10)
        assert [m.offset for m in got] == list(range(first, first + 10))
        assert q.delete_many([m.receipt for m in got]) == [None] * 10


# -- filter misses remembered (``channel._Missed``) ------------------------------------------------


HIGH = {"cls": ("high", "absolute")}


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


# -- the far scan's FIFO groups --------------------------------------------------------------------


def test_a_far_group_head_goes_out_when_its_group_s_next_is_delayed(broker: Broker) -> None:
    """The far scan found g1 and read on to g2, delayed: it held group g back, after g1, so the
    second hold refused g1 too and the receive gave nothing."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"later", "delay": 600}] * BEYOND)
    q.send(b"g1", group_id="g")
    q.send(b"g2", group_id="g", delay=600)
    assert [m.body for m in q.receive(10, wait=0)] == [b"g1"]


# -- damage in the topic ahead ---------------------------------------------------------------------

DAMAGED_AT = channel_module._LOOK_AHEAD + 476  # within the look-ahead read from a frontier before it
_SIZE = 100  # each message's body: every message takes the same bytes in the segment


def damaged_topic(root: Path, damage: str, total: int = 3000, name: str = "jobs") -> tuple[Path, bytes]:
    """A queue ``name`` of ``total`` messages of ``_SIZE`` bytes whose message ``DAMAGED_AT`` is
    damaged in its segment as ``damage`` says; the segment and its damaged bytes."""
    with Broker(root, sync="none") as broker:
        broker.queue(name).send_many([b"%05d" % i + b"x" * (_SIZE - 5) for i in range(total)])
    (segment,) = (root / name / "jnl").glob("*.jnl")
    data = bytearray(segment.read_bytes())
    at = DAMAGED_AT * (len(data) // total)  # the damaged message's first byte
    if damage == "value length":  # framing broken: the trailing size no longer agrees
        data[at + 18 : at + 22] = (_SIZE + 1).to_bytes(4, "big")
    elif damage == "size past the end":  # as a message still being written, but for the index
        data[at + 18 : at + 22] = (0x7FFFFF00).to_bytes(4, "big")
    elif damage == "offset":
        data[at : at + 8] = (10**6).to_bytes(8, "big")
    else:  # zeroed: a block the disk lost
        data[at : at + 4096] = bytes(4096)
    segment.write_bytes(bytes(data))
    return segment, bytes(data)


@pytest.mark.parametrize("damage", ["value length", "size past the end", "offset", "zeroed"])
def test_the_messages_before_damage_in_the_topic_go_out_before_its_error(tmp_path: Path, damage: str) -> None:
    """sej's messages carry no checksum, and a damaged one in the middle of the topic stops its
    reading there. The look-ahead reads past the frontier: meeting the damage, it must not keep
    back the whole messages before it (a consumer got 530 of 1,500, then only the error). Each goes
    out once; then every receive raises a ``CorruptionError`` that names the segment and the
    offset, and nothing in the file is cut or rewritten."""
    root = tmp_path / "data"
    segment, damaged = damaged_topic(root, damage)
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", create=False)
        bodies: list[bytes] = []
        receipts: list[str] = []
        while got := queue.receive(10, delete=receipts):
            bodies += [m.body[:5] for m in got]
            receipts = [m.receipt for m in got]
        # That last receive found nothing: it stored its deletes rather than raise (nothing is in flight below).
        assert bodies == [b"%05d" % i for i in range(DAMAGED_AT)]
        for _ in range(2):
            with pytest.raises(CorruptionError) as info:
                queue.receive(10, wait=1)  # at once, not at the end of the wait
            assert info.value.file == segment and info.value.offset == DAMAGED_AT, str(info.value)
        stats = queue.stats()  # the counts still come: past the damage, counted as available
        assert (stats.in_flight, stats.available) == (0, 3000 - DAMAGED_AT)
    assert segment.read_bytes() == damaged


def test_redeliveries_and_delayed_messages_before_damage_still_go_out(tmp_path: Path) -> None:
    """Damage at the frontier holds back none of what comes before it: a message whose visibility
    ended comes back, and a delayed one goes out once its delay ends, before the damage's error
    (which a receive that waits gets at once, not at the end of its wait, once nothing is left)."""
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs")
        queue.send_many([b"%05d" % i + b"x" * (_SIZE - 5) for i in range(3)])
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", create=False)
        queue.send(b"later", delay=1)
        (first,) = queue.receive(1, visibility_timeout=0.5)
        queue.delete_many([m.receipt for m in queue.receive(10)])  # the other two
        with (root / "jobs" / "jnl" / "0000000000000000.jnl").open("ab") as f:
            f.write(b"\xff" * 60)  # a damaged message after "later": never a write under way
        got = queue.receive(1, wait=5)
        assert [m.body for m in got] == [first.body] and got[0].receive_count == 2
        queue.delete(got[0].receipt)
        got = queue.receive(1, wait=5)
        assert [m.body for m in got] == [b"later"]
        queue.delete(got[0].receipt)
        started = time.monotonic()
        with pytest.raises(CorruptionError) as info:
            queue.receive(1, wait=5)
        assert time.monotonic() - started < 4 and info.value.offset == 4, str(info.value)


@pytest.mark.parametrize("damage", ["value length", "size past the end", "offset", "zeroed"])
def test_a_skip_to_where_check_says_messages_start_again_gets_every_channel_past_damage(
    tmp_path: Path, damage: str
) -> None:
    """The operator's way on (``journalq check``, then ``journalq queue skip``): every message from
    where ``check`` says whole messages start again goes out, once; what lay between is finished.
    A consumer of another broker (another process's) that had met the damage goes on too."""
    root = tmp_path / "data"
    segment, damaged = damaged_topic(root, damage)
    (problem,) = [p for p in check(root / "jobs").problems if p.kind == "segment"]
    assert problem.offset == DAMAGED_AT and problem.resume is not None
    resume = problem.resume
    assert DAMAGED_AT < resume < DAMAGED_AT + 100  # the next sound index entry (one every 4 KiB)
    with Broker(root, sync="none") as broker, Broker(root, sync="none") as other:
        queue, elsewhere = broker.queue("jobs", create=False), other.queue("jobs", create=False)
        taken = queue.receive(10, visibility_timeout=600)  # in flight when skipped: finished too
        bodies: list[bytes] = [m.body[:5] for m in taken]
        with pytest.raises(CorruptionError, match="`journalq check` names where whole messages start again"):
            while True:  # until the error, once all before the damage went out
                got = elsewhere.receive(10)
                bodies += [m.body[:5] for m in got]
                elsewhere.delete_many([m.receipt for m in got])
        assert queue.skip_to(resume) == resume - DAMAGED_AT + 10
        assert queue.skip_to(resume) == 0  # never back
        with pytest.raises(ReceiptError):
            queue.change_visibility(taken[0].receipt, 0)  # finished by the skip
        while got := elsewhere.receive(10, wait=0):
            bodies += [m.body[:5] for m in got]
            elsewhere.delete_many([m.receipt for m in got])
        assert bodies == [b"%05d" % i for i in [*range(DAMAGED_AT), *range(resume, 3000)]]
        assert queue.receive(10, wait=0) == []
        stats = queue.stats()
        assert (stats.available, stats.in_flight) == (0, 0)
    assert segment.read_bytes() == damaged  # nothing cut or rewritten


def test_stats_say_where_damage_stops_the_receives_until_a_skip_gets_past_it(tmp_path: Path) -> None:
    """Monitoring sees a queue stopped at damage: ``stats().damage`` names the segment and the
    offset, from a broker that never received (another process's, as ``journalq queue stats``
    and the server's scrape are) and from the consumer stuck there; None once skipped past."""
    root = tmp_path / "data"
    segment, _ = damaged_topic(root, "value length")
    (problem,) = [p for p in check(root / "jobs").problems if p.kind == "segment"]
    with Broker(root, sync="none") as broker, Broker(root, sync="none") as watcher:
        queue, watched = broker.queue("jobs", create=False), watcher.queue("jobs", create=False)
        damage = watched.stats().damage
        assert damage is not None and str(segment) in damage and f"offset {DAMAGED_AT}" in damage
        with pytest.raises(CorruptionError):
            while True:
                queue.delete_many([m.receipt for m in queue.receive(10)])
        assert queue.stats().damage == damage == watched.stats().damage
        queue.skip_to(problem.resume)
        assert queue.stats().damage is None and watched.stats().damage is None


def test_stats_say_damage_past_what_they_read_once_this_process_s_receives_met_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stats`` reads only so far past what receives took (``_STATS_LOOK_AHEAD``): damage
    beyond is said once the receives' look-ahead met it, in their process."""
    monkeypatch.setattr(channel_module, "_STATS_LOOK_AHEAD", 100)
    root = tmp_path / "data"
    damaged_topic(root, "zeroed")
    with Broker(root, sync="none") as broker, Broker(root, sync="none") as watcher:
        queue, watched = broker.queue("jobs", create=False), watcher.queue("jobs", create=False)
        assert queue.stats().damage is None  # not read yet by anyone here
        taken = 0
        while queue.stats().damage is None:  # the look-ahead reads 1,024 past the frontier
            taken += len(queue.receive(100))
            assert taken < DAMAGED_AT - 200  # met by the receives, not by a stats read near the frontier
        assert f"offset {DAMAGED_AT}" in str(queue.stats().damage)
        assert watched.stats().damage is None  # that process's stats read 100 past the frontier


def test_a_sharded_queue_s_stats_name_each_damaged_shard(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", shards=2)
        queue.send_many([{"body": b"%05d" % i + b"x" * (_SIZE - 5), "key": b"k%05d" % i} for i in range(3000)])
        first, second = queue.topic.shard_names
        count = queue.shard_stats()[second].available
    (segment,) = (root / second / "jnl").glob("*.jnl")
    with segment.open("r+b") as f:  # the offset of message 100 (all take the same bytes), indexed ones after it
        f.seek(100 * (segment.stat().st_size // count))
        f.write((10**6).to_bytes(8, "big"))
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", create=False)
        stats, by_shard = queue.stats(), queue.shard_stats()
        assert by_shard[first].damage is None and by_shard[second].damage is not None
        assert stats.damage == by_shard[second].damage and str(segment) in stats.damage


def test_a_skip_refuses_an_offset_past_the_end_and_a_wrong_one(broker: Broker) -> None:
    queue = broker.queue("jobs")
    queue.send_many([b"m%d" % i for i in range(5)])
    past = "offset 6 is past the end of topic 'jobs': its next message will be offset 5"
    with pytest.raises(OffsetOutOfRangeError, match=past):
        queue.skip_to(6)
    for wrong in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidSettingError, match="offset must be a whole number from 0"):
            queue.skip_to(wrong)  # type: ignore[arg-type]
    assert queue.skip_to(5) == 5  # up to the end: a purge
    assert queue.receive(wait=0) == []
    queue.send(b"after")
    assert [m.body for m in queue.receive(wait=0)] == [b"after"]


def test_a_skip_counts_only_what_it_finished(broker: Broker) -> None:
    queue = broker.queue("jobs")
    queue.send_many([b"m%d" % i for i in range(10)])
    got = queue.receive(4)
    queue.delete_many([got[1].receipt, got[3].receipt])  # finished out of order: 1 and 3
    assert queue.skip_to(6) == 4  # 0, 2, 4 and 5
    assert [m.body for m in queue.receive(10, wait=0)] == [b"m6", b"m7", b"m8", b"m9"]


def test_a_sharded_queue_skips_in_the_shard_named(tmp_path: Path) -> None:
    with Broker(tmp_path / "data", sync="none") as broker:
        queue = broker.queue("jobs", shards=2)
        queue.send_many([{"body": b"m%d" % i, "key": b"k%d" % i} for i in range(40)])
        first, second = queue.topic.shard_names
        in_first = queue.shard_stats()[first].available
        assert 0 < in_first < 40
        unknown = f"'nope' is not a shard of 'jobs': its shards are {first} to {second}"
        with pytest.raises(InvalidSettingError, match=unknown):
            queue.skip_to(1, shard="nope")
        assert queue.skip_to(in_first, shard=first) == in_first
        left = queue.shard_stats()
        assert (left[first].available, left[second].available) == (0, 40 - in_first)


def test_a_damaged_segment_that_every_channel_skipped_past_is_collected(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs", segment_size=65536).send_many([b"%05d" % i + b"x" * (_SIZE - 5) for i in range(3000)])
    first, *rest = sorted((root / "jobs" / "jnl").glob("*.jnl"))
    assert rest
    data = bytearray(first.read_bytes())
    at = 100 * (len(data) // int(rest[0].stem, 16))  # message 100 (the segment's messages are all alike)
    data[at + 18 : at + 22] = (_SIZE + 1).to_bytes(4, "big")
    first.write_bytes(bytes(data))
    (problem,) = [p for p in check(root / "jobs").problems if p.kind == "segment"]
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", create=False)
        with pytest.raises(CorruptionError):
            while True:
                queue.delete_many([m.receipt for m in queue.receive(10)])
        queue.skip_to(problem.resume)
        while got := queue.receive(10, wait=0):
            queue.delete_many([m.receipt for m in got])
        broker.gc()
    assert not first.exists() and not first.with_suffix(".idx").exists()
