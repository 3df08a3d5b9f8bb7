"""The queue layer's main paths: send and receive, what is stored, visibility, receipts, FIFO
order, groups, deduplication, delays, long polling, fan-out and stats."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import journalq.queue.channel as channel_module
from journalq.errors import (
    InvalidMessageError,
    InvalidSettingError,
    ReceiptError,
    StaleReceiptError,
    TaskNotFoundError,
    VisibilityLimitError,
)
from journalq.journal import Scanner
from journalq.queue import ENVELOPE_TYPE, Attribute, Broker, ReceivedMessage
from journalq.queue.topic import Topic


@pytest.fixture
def broker(store_root: Path | str):
    with Broker(store_root, sync="none") as b:
        yield b


def stored(path: Path) -> list:
    with Scanner(path) as scanner:
        return list(scanner)


def bodies(messages: list[ReceivedMessage]) -> list[bytes]:
    return [m.body for m in messages]


# -- sending and what is stored ------------------------------------------------------------


@pytest.mark.files_only("sej messages in a journal")
def test_plain_send_is_a_plain_sej_message(broker: Broker) -> None:
    q = broker.queue("jobs")
    assert q.send(b"hello") == "0"
    assert q.send(b"") == "1"
    raw = stored(q.topic.path)
    assert [(m.offset, m.type, m.key, m.value) for m in raw] == [(0, 0, b"", b"hello"), (1, 0, b"", b"")]


@pytest.mark.files_only("sej messages in a journal")
def test_a_batch_of_bodies_stores_what_single_sends_store(broker: Broker) -> None:
    q = broker.queue("jobs")
    assert q.send_many([b"a", b"", b"c"]) == ["0", "1", "2"]
    assert q.send_many((b for b in [b"d"])) == ["3"]  # any iterable
    q.send_many([b"e", {"body": b"f"}])  # bodies and mappings mixed
    raw = stored(q.topic.path)
    assert [(m.offset, m.type, m.key, m.value) for m in raw] == [
        (n, 0, b"", body) for n, body in enumerate([b"a", b"", b"c", b"d", b"e", b"f"])]
    assert bodies(q.receive(10)) == [b"a", b"", b"c", b"d", b"e", b"f"]


def test_a_batch_of_bodies_takes_the_queue_default_delay(broker: Broker) -> None:
    q = broker.queue("jobs", delay=0.6)
    q.send_many([b"a", b"b"])
    assert q.receive(10) == [] and q.stats().delayed == 2


def test_a_batch_of_bodies_takes_the_queue_content_based_dedup(broker: Broker) -> None:
    q = broker.queue("jobs", content_based_dedup=True)
    first = q.send_many([b"x", b"y"])
    assert q.send_many([b"x", b"y", b"z"])[:2] == first
    assert sorted(bodies(q.receive(10))) == [b"x", b"y", b"z"]


@pytest.mark.files_only("the envelope in a journal")
def test_send_with_metadata_stores_the_documented_envelope(broker: Broker) -> None:
    q = broker.queue("jobs")
    mid = q.send(
        b"\x00body\xff",
        attributes={"name": "x", "size": 12, "blob": b"\x01\x02", "typed": Attribute("Number.float", "1.5")},
        delay=0.25,
        filters={"performance_class": "standard"},
        dedup_id="d-1",
        group_id="g-1",
    )
    (raw,) = stored(q.topic.path)
    assert raw.offset == int(mid) and raw.type == ENVELOPE_TYPE == 0xE0 and raw.key == b""
    value = raw.value
    assert value[:3] == b"JQ1"
    (meta_len,) = struct.unpack(">I", value[3:7])
    meta = json.loads(value[7 : 7 + meta_len].decode("utf-8"))
    assert value[7 + meta_len :] == b"\x00body\xff"
    assert meta == {
        "a": {
            "name": ["String", "x"],
            "size": ["Number", "12"],
            "blob": ["Binary", "AQI="],
            "typed": ["Number.float", "1.5"],
        },
        "d": 0.25,
        "f": {"performance_class": "standard"},
        "i": "d-1",
        "g": "g-1",
    }


def test_send_many_and_received_fields(broker: Broker) -> None:
    q = broker.queue("jobs")
    before = dt.datetime.now(dt.timezone.utc)
    ids = q.send_many([b"a", {"body": b"b", "attributes": {"k": "v"}}, bytearray(b"c")])
    got = q.receive(10)
    assert bodies(got) == [b"a", b"b", b"c"] and [g.id for g in got] == ids
    m = got[1]
    assert m.id == ids[1] and m.receive_count == 1 and isinstance(m.receipt, str)
    assert m.attributes == {"k": Attribute("String", "v")}
    assert before - dt.timedelta(seconds=1) <= m.sent_at <= dt.datetime.now(dt.timezone.utc)
    assert len({g.receipt for g in got}) == 3


def test_a_new_broker_sees_what_another_left(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as b:
        q = b.queue("jobs", visibility_timeout=60)
        q.send_many([b"1", b"2", b"3"])
        (m,) = q.receive()
        q.delete(m.receipt)
        (held,) = q.receive()
    with Broker(tmp_path) as b:
        q = b.queue("jobs")
        assert q.settings.visibility_timeout == 60
        (m,) = q.receive(5)
        assert m.body == b"3"
        q.delete(held.receipt)  # a receipt works in another broker (another process)
        assert q.stats().in_flight == 1


# -- visibility and receipts ---------------------------------------------------------------


def test_received_message_is_hidden_then_comes_back_by_itself(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (first,) = q.receive(visibility_timeout=0.5)
    assert q.receive() == []
    time.sleep(0.55)
    (again,) = q.receive(visibility_timeout=30)
    assert again.id == first.id and again.receive_count == 2 and again.receipt != first.receipt
    q.delete(again.receipt)
    time.sleep(0.05)
    assert q.receive() == [] and q.stats().in_flight == 0


def test_change_visibility_and_release(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (m,) = q.receive(visibility_timeout=0.2)
    q.change_visibility(m.receipt, 30)  # extend
    time.sleep(0.3)
    assert q.receive() == []
    q.change_visibility(m.receipt, 0)  # back at once
    (m2,) = q.receive()
    assert m2.receive_count == 2
    q.release(m2.receipt)  # mq: give it back now
    (m3,) = q.receive()
    assert m3.receive_count == 3
    q.release(m3.receipt, delay=0.5)  # mq: delayed redelivery
    assert q.receive() == []
    assert q.stats().in_flight == 1
    time.sleep(0.55)
    (m4,) = q.receive()
    assert m4.receive_count == 4 and m4.body == b"x"


@pytest.mark.parametrize("shards", [1, 2])
def test_a_change_within_a_limit_after_the_delivery(store_root: Path | str, broker: Broker, shards: int) -> None:
    """``within`` (SQS's 12 hours): a change that would hide the message past that many seconds
    after its delivery is refused and changes nothing; the others in the call are made."""
    if shards > 1 and not isinstance(store_root, Path):
        pytest.skip("the ZooKeeper store has no shards")
    q = broker.queue("jobs", shards=shards)
    q.send_many([b"a", b"b"])
    a, b = q.receive(2, visibility_timeout=30)
    time.sleep(0.2)
    past, kept = q.change_visibility_many([(a.receipt, 5), (b.receipt, 4)], within=5)
    assert isinstance(past, VisibilityLimitError) and repr(a.receipt) in str(past) and kept is None
    assert q.change_visibility_many([(a.receipt, 4)], within=5) == [None]
    with pytest.raises(InvalidSettingError, match="within"):
        q.change_visibility_many([(a.receipt, 4)], within=-1)
    assert q.change_visibility_many([(b.receipt, 0), (a.receipt, 0)]) == [None, None]  # no limit by default
    assert sorted(m.body for m in q.receive(2)) == [b"a", b"b"]


BAD_RECEIPTS = [
    "", "x", "1", "1.0", "-1.1", "1.-1", "1.2.3", "a.b", "1 .1x", " 0.1", "1_0.1", "0.1\n", "+0.1",
    "\u0660.\u0661", None, 5, 1.5, b"0.1",
]


@pytest.mark.parametrize("bad", BAD_RECEIPTS, ids=repr)
def test_malformed_receipt_is_a_receipt_error(broker: Broker, bad: object) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (m,) = q.receive()
    for act in (q.delete, q.release, lambda r: q.change_visibility(r, 5)):
        with pytest.raises(ReceiptError) as refused:
            act(bad)  # type: ignore[arg-type]
        assert not isinstance(refused.value, StaleReceiptError)  # not one of the queue's at all
    q.delete(m.receipt)  # the real delivery is untouched


def test_stale_receipt_after_redelivery_names_the_newer_delivery(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (old,) = q.receive(visibility_timeout=0.1)
    time.sleep(0.15)
    (new,) = q.receive(visibility_timeout=30)
    for act in (q.delete, q.release, lambda r: q.change_visibility(r, 0)):
        # One of the queue's receipts, whose delivery is over (SQS then deletes nothing, no error).
        with pytest.raises(StaleReceiptError, match=r"delivered again \(delivery 2\)"):
            act(old.receipt)
    assert q.consumers() == {q.consumer_id: [new.id]}  # still hidden: the stale receipts did nothing
    assert q.receive() == []
    q.delete(new.receipt)


def test_expired_but_not_redelivered_receipt_still_deletes(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (m,) = q.receive(visibility_timeout=0.05)
    time.sleep(0.1)
    q.delete(m.receipt)  # as SQS: nobody took it again, so the receipt is still the latest
    assert q.receive() == []


def test_delete_twice_is_an_error(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    (m,) = q.receive()
    q.delete(m.receipt)
    with pytest.raises(StaleReceiptError, match="no longer in flight"):
        q.delete(m.receipt)
    stale, bad = q.delete_many([m.receipt, "bad"])
    assert isinstance(stale, StaleReceiptError)
    assert isinstance(bad, ReceiptError) and not isinstance(bad, StaleReceiptError)


def test_the_consumer_loop_deletes_with_its_next_receive(broker: Broker) -> None:
    """``receive(n, delete=last_receipts)`` on either store: what was deleted is gone, and a
    refused receipt receives nothing."""
    q = broker.queue("q", visibility_timeout=60)
    q.send_many([b"%d" % i for i in range(7)])
    got, receipts = [], []
    while batch := q.receive(3, delete=receipts):
        got += [m.body for m in batch]
        receipts = [m.receipt for m in batch]
    assert sorted(got) == sorted(b"%d" % i for i in range(7))
    assert q.stats().in_flight == 0 and q.stats().available == 0
    with pytest.raises(ReceiptError):
        q.receive(1, delete=receipts[:1] or ["0.1.x"])  # deleted already (or never a receipt)
    q.send(b"late")
    assert bodies(q.receive(1)) == [b"late"]


# -- FIFO ---------------------------------------------------------------------------------


def test_fifo_oldest_first_without_timeouts(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([b"%d" % i for i in range(30)])
    order = []
    for size in (1, 3, 7, 1, 20):
        got = q.receive(size)
        order += bodies(got)
        q.delete_many([m.receipt for m in got])
    assert order == [b"%d" % i for i in range(30)]


def test_fifo_expired_message_goes_out_before_newer_ones(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([b"0", b"1", b"2", b"3"])
    (m0,) = q.receive(visibility_timeout=0.5)
    (m1,) = q.receive(visibility_timeout=30)
    q.send(b"4")
    time.sleep(0.55)
    got = q.receive(3)
    assert bodies(got) == [b"0", b"2", b"3"]
    assert got[0].receive_count == 2
    # released ones too: back in offset order ahead of everything newer
    q.release(got[2].receipt)
    q.release(m1.receipt)
    assert bodies(q.receive(3)) == [b"1", b"3", b"4"]


def test_groups_none_of_a_group_goes_out_while_one_is_in_flight(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send_many(
        [{"body": b"a1", "group_id": "A"}, {"body": b"a2", "group_id": "A"},
         {"body": b"b1", "group_id": "B"}, {"body": b"b2", "group_id": "B"}, {"body": b"c1", "group_id": "C"}]
    )
    (a1,) = q.receive()
    assert a1.body == b"a1" and a1.group_id == "A"
    (b1,) = q.receive()  # the second receive gets the next group's message
    assert b1.body == b"b1"
    (c1,) = q.receive()
    assert c1.body == b"c1"
    assert q.receive(10) == []  # or nothing
    q.delete(a1.receipt)
    assert bodies(q.receive(10)) == [b"a2"]  # after delete, the group's next message
    q.release(b1.receipt)  # b1 back: it goes before b2
    again, *rest = q.receive(10)
    assert again.body == b"b1" and again.receive_count == 2
    # b2 with it (nothing of B in flight), as SQS FIFO's batches.
    assert bodies(rest) == [b"b2"]


def test_a_batch_takes_each_group_in_order_and_again_after_expiry(broker: Broker) -> None:
    """As SQS FIFO's: a receive of several takes a group's messages in order, as long as none of
    the group is in flight (the whole group is then with one consumer); they come back in order,
    and none of the group goes out while any of it is in flight."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"%s%d" % (g, i), "group_id": g.decode()} for i in range(3) for g in (b"x", b"y")])
    q.send(b"plain")
    got = q.receive(4, visibility_timeout=0.2)
    assert bodies(got) == [b"x0", b"y0", b"x1", b"y1"]
    assert bodies(q.receive(10, visibility_timeout=0.2)) == [b"plain"]  # x and y are in flight: not x2, y2
    time.sleep(0.25)
    got = q.receive(10)
    assert bodies(got) == [b"x0", b"y0", b"x1", b"y1", b"x2", b"y2", b"plain"]
    assert [m.receive_count for m in got] == [2, 2, 2, 2, 1, 1, 2]
    q.delete_many([m.receipt for m in got if m.body in (b"x0", b"y0", b"y1")])
    assert q.receive(10) == []  # x1 and x2, y2 still in flight: nothing of x or y
    q.release(got[2].receipt)  # x1 back while x2 is out: x waits for x2
    assert q.receive(10) == []
    q.delete(got[4].receipt)
    assert bodies(q.receive(10)) == [b"x1"]


def test_one_per_group_takes_one_message_of_each_group(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send_many([{"body": b"%s%d" % (g, i), "group_id": g.decode()} for i in range(3) for g in (b"x", b"y")])
    q.send(b"plain")
    got = q.receive(10, one_per_group=True)
    assert bodies(got) == [b"x0", b"y0", b"plain"]
    assert q.receive(10) == []  # x and y are in flight
    q.delete_many([m.receipt for m in got])
    assert bodies(q.receive(10, one_per_group=True)) == [b"x1", b"y1"]


def test_a_refused_message_stops_its_group_in_a_batch(broker: Broker) -> None:
    """A message of a group that cannot go now (delayed; not for this consumer's filters) holds
    back the group's next ones in the same receive, as it does across receives."""
    q = broker.queue("fifo")
    q.send(b"g1", group_id="g")
    q.send(b"g2", group_id="g", delay=600)
    q.send(b"g3", group_id="g")
    q.send(b"h1", group_id="h", filters={"level": "high"})
    q.send(b"h2", group_id="h")
    q.send(b"k1", group_id="k")
    assert bodies(q.receive(10, filters={"level": "low"})) == [b"g1", b"k1"]


def test_a_receipt_past_its_visibility_cannot_hide_its_message_once_another_receive_took_its_group(
    broker: Broker,
) -> None:
    """A receipt whose visibility ran out names its message until the message is delivered
    again, but it may not hide it again once another receive holds the group: the group would
    have two holders, each working on a message of it at once, out of order. Until then it may
    (no one else holds the group), and a batch's own receipts may hide each other's messages."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(3)])
    first, second = q.receive(2, visibility_timeout=0.2)
    time.sleep(0.25)
    q.change_visibility(second.receipt, 30)  # no one took the group: hidden again, for its batch
    q.change_visibility(first.receipt, 30)  # and the first again, though the second is hidden
    assert q.receive(10) == []
    assert q.change_visibility_many([(first.receipt, 0), (second.receipt, 0)]) == [None, None]  # both back
    (again,) = q.receive(1)  # another consumer takes the group: x0 again
    assert (again.body, again.receive_count) == (b"x0", 2)
    with pytest.raises(StaleReceiptError, match="another receive took its FIFO group"):
        q.change_visibility(second.receipt, 30)
    with pytest.raises(StaleReceiptError, match="another receive took its FIFO group"):
        q.release(second.receipt)
    assert isinstance(q.change_visibility_many([(second.receipt, 30)])[0], StaleReceiptError)
    q.release(again.receipt)  # x0 back, now with the other receive's receipt: the group is free
    q.change_visibility(second.receipt, 30)  # so the first receive's x1 may be hidden again
    assert q.receive(1) == []  # and it holds the group: x0 waits
    with pytest.raises(StaleReceiptError, match="another receive took its FIFO group"):
        q.change_visibility(again.receipt, 30)  # and x0 no longer: the first receive holds x1
    q.delete(second.receipt)  # (deleting stays allowed: the work was done)
    got = q.receive(10)
    assert bodies(got) == [b"x0", b"x2"] and [m.receive_count for m in got] == [3, 1]


def test_a_batch_of_changes_of_visibility_never_gives_a_group_two_holders(broker: Broker) -> None:
    """Two receipts whose visibility ran out, of two receives of one group, hide their messages
    again in one call: the first does, and holds the group; the second is refused, as it would
    be in a call of its own after the first (judged as the queue was before the call, both
    would be hidden, and the group have two holders)."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(2)])
    first, second = q.receive(2)
    assert q.change_visibility_many([(first.receipt, 0), (second.receipt, 0)]) == [None, None]
    (again,) = q.receive(1)  # another receive takes the group: x0
    q.release(again.receipt)  # and gives it back: x0 and x1 are back, each with its receipt current
    hidden, refused = q.change_visibility_many([(again.receipt, 30), (second.receipt, 30)])
    assert hidden is None
    assert isinstance(refused, StaleReceiptError) and "another receive took its FIFO group" in str(refused)
    assert q.receive(10) == []  # the other receive holds the group, with x0
    q.delete(again.receipt)
    assert bodies(q.receive(10)) == [b"x1"]


def test_a_batch_of_changes_of_visibility_acts_as_its_changes_one_after_another(broker: Broker) -> None:
    """A change that gives back the message of the receive that took a group lets the late
    consumer's receipt after it in the same call hide its message of the group again."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(2)])
    first, second = q.receive(2)
    assert q.change_visibility_many([(first.receipt, 0), (second.receipt, 0)]) == [None, None]
    (again,) = q.receive(1)  # another receive takes the group: x0
    refused, given = q.change_visibility_many([(second.receipt, 30), (again.receipt, 0)])
    assert isinstance(refused, StaleReceiptError) and given is None  # the give-back comes after it
    (again,) = q.receive(1)
    assert q.change_visibility_many([(again.receipt, 0), (second.receipt, 30)]) == [None, None]
    assert q.receive(10) == []  # the late consumer holds the group again, with x1
    q.delete(second.receipt)
    assert bodies(q.receive(10)) == [b"x0"]


def test_a_receive_takes_what_comes_after_a_group_that_waits_for_its_later_message(broker: Broker) -> None:
    """A group whose first messages were given back while a later one of the same receive is
    still out waits for it; a receive of three takes the three that may go, past that group's
    first message, though it comes before the last of them."""
    q = broker.queue("fifo")
    q.send_many([{"body": body, "group_id": body[:1].decode()} for body in (b"b0", b"b1", b"a0", b"b2", b"a1")])
    got = {m.body: m for m in q.receive(5)}
    assert list(got) == [b"b0", b"b1", b"a0", b"b2", b"a1"]
    given = [(got[body].receipt, 0) for body in (b"b0", b"b1", b"a0", b"b2")]
    assert q.change_visibility_many(given) == [None] * 4
    assert bodies(q.receive(3)) == [b"b0", b"b1", b"b2"]  # a0 waits for a1, which is still out
    q.delete(got[b"a1"].receipt)
    assert bodies(q.receive(3)) == [b"a0"]


def test_a_message_given_back_then_hidden_by_its_receipt_holds_its_group(broker: Broker) -> None:
    """Hidden again by its receipt after it was given back (or given back with a delay), a
    message holds its FIFO group as it did when received: nothing of the group goes out, the
    messages before it neither, until it is deleted or comes back."""
    q = broker.queue("fifo")
    q.send_many([{"body": b"x%d" % i, "group_id": "x"} for i in range(4)])
    first, second = q.receive(2)
    assert q.change_visibility_many([(first.receipt, 0), (second.receipt, 0)]) == [None, None]
    q.change_visibility(second.receipt, 30)
    assert q.receive(1) == []
    assert q.receive(10) == []
    q.delete(second.receipt)
    first, third = q.receive(2)
    assert (first.body, third.body) == (b"x0", b"x2")
    assert q.change_visibility_many([(first.receipt, 0), (third.receipt, 0)]) == [None, None]
    q.release(third.receipt, delay=30)  # mq's delayed redelivery: held back, with its group
    assert q.receive(1) == []
    q.delete(third.receipt)
    assert bodies(q.receive(10)) == [b"x0", b"x3"]


def test_dedup_drops_second_send_within_window(broker: Broker) -> None:
    q = broker.queue("jobs")
    first = q.send(b"one", dedup_id="k")
    assert q.send(b"one again", dedup_id="k") == first
    ids = q.send_many([{"body": b"two", "dedup_id": "k2"}, {"body": b"dup", "dedup_id": "k2"},
                       {"body": b"dup", "dedup_id": "k"}, b"plain"])
    assert ids[0] == ids[1] and ids[2] == first and len(set(ids)) == 3
    assert q.stats().available == 3  # stored once each
    assert bodies(q.receive(10)) == [b"one", b"two", b"plain"]


def test_dedup_is_shared_by_brokers_and_ends_with_the_window(broker: Broker) -> None:
    q = broker.queue("jobs", dedup_window=1.0)
    first = q.send(b"x", dedup_id="same")
    with Broker(broker.root, sync="none") as other:
        assert other.queue("jobs").send(b"x", dedup_id="same") == first
    time.sleep(1.05)
    later = q.send(b"x", dedup_id="same")
    assert later != first
    assert q.stats().available == 2
    assert [(m.id, m.dedup_id) for m in q.receive(10)] == [(first, "same"), (later, "same")]


def held_clock(monkeypatch: pytest.MonkeyPatch, *, monotonic: bool = False) -> list[int]:
    """The process's clock held at its present reading and moved by the test alone: the list's one
    item, in nanoseconds, is what ``time.time_ns`` and ``time.time`` say, and with ``monotonic``
    ``time.monotonic`` too (which decides when a process looks at a queue's settings again; not on
    ZooKeeper, whose client keeps its connection by it)."""
    clock = [time.time_ns()]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])
    monkeypatch.setattr(time, "time", lambda: clock[0] / 1e9)
    if monotonic:
        monkeypatch.setattr(time, "monotonic", lambda: clock[0] / 1e9)
    return clock


def test_a_deduplication_id_sent_at_the_very_start_of_its_window_is_found_by_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window includes its first nanosecond: an id sent exactly ``dedup_window`` ago is still
    within it, in a segment before others that began that same nanosecond (a coarse clock, or a
    burst). A process that opens the topic then must start reading before them (the queue model
    with a clock of its own found it starting at the last of them, and taking the id as new)."""
    clock = held_clock(monkeypatch)
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", dedup_window=20.0, segment_size=4096)
        first = q.send(b"x", dedup_id="same")
        q.send_many([b"-" * 180] * 60)  # more segments, each begun in the same nanosecond
        assert len(list((tmp_path / "jobs" / "jnl").glob("*.jnl"))) > 2
        clock[0] += 20 * 10**9  # the window's first nanosecond is the send's
        with Broker(tmp_path, sync="none") as other:
            assert other.queue("jobs").send(b"x", dedup_id="same") == first
        clock[0] += 1  # and over one nanosecond later
        with Broker(tmp_path, sync="none") as other:
            assert other.queue("jobs").send(b"x", dedup_id="same") != first


@pytest.mark.parametrize("shards", [1, 2])
def test_a_deduplication_id_stands_for_its_latest_send_when_its_window_is_made_longer(
    broker: Broker, store_root: Path | str, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send accepted after the window of the first (then 5 s) starts the id's window again: once
    the window is made longer (20 s, covering both), a duplicate is answered with the id of the
    latest send, as the sender of that one was told, not of the first (a process reading the
    window again found both; found by the queue model with its clock)."""
    if shards > 1 and not isinstance(store_root, Path):
        pytest.skip("the ZooKeeper store has no shards")
    clock = held_clock(monkeypatch, monotonic=isinstance(store_root, Path))
    q = broker.queue("jobs", dedup_window=5.0, shards=shards)
    first = q.send(b"x", dedup_id="same")
    clock[0] += 6 * 10**9
    latest = q.send(b"x", dedup_id="same")
    assert latest != first
    q.configure(dedup_window=20.0)
    clock[0] += 2 * 10**9
    assert q.send(b"x", dedup_id="same") == latest
    with Broker(broker.root, sync="none") as other:
        assert other.queue("jobs").send(b"x", dedup_id="same") == latest
    assert q.stats().available == 2


@pytest.mark.parametrize("shards", [1, 2])
def test_a_gc_takes_up_a_longer_deduplication_window_set_by_another_process(
    tmp_path: Path, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's first send after another process made the window longer collects with the new
    window, not the one it last read: its gc ran before the send took up the settings, and
    deleted the segment of an id still within the new window (found by the queue model)."""
    clock = held_clock(monkeypatch, monotonic=True)
    with Broker(tmp_path, sync="none") as broker, Broker(tmp_path, sync="none") as other:
        q = broker.queue("jobs", dedup_window=5.0, segment_size=4096, task_gc_interval=1.0, shards=shards)
        first = q.send(b"x", dedup_id="same")
        q.send_many([b"-" * 180] * 60)
        while got := q.receive(10):  # consumed: only the window keeps the segments
            q.delete_many([m.receipt for m in got])
        other.queue("jobs").configure(dedup_window=20.0)
        clock[0] += 7 * 10**9  # past the old window, within the new one; the settings looked at again
        assert q.send(b"x", dedup_id="same") == first


def test_content_based_dedup(broker: Broker) -> None:
    q = broker.queue("jobs", content_based_dedup=True)
    a = q.send(b"same body")
    assert q.send(b"same body") == a
    assert q.send(b"same body", dedup_id="explicit") != a
    assert q.send(b"other body") != a
    assert bodies(q.receive(10)) == [b"same body", b"same body", b"other body"]


# -- delays ---------------------------------------------------------------------------------


def test_per_message_delay(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"later", delay=0.8)
    q.send(b"now")
    assert bodies(q.receive(10)) == [b"now"]
    stats = q.stats()
    assert stats.delayed == 1 and stats.available == 0
    time.sleep(0.85)
    assert bodies(q.receive(10)) == [b"later"]


def test_queue_default_delay(broker: Broker) -> None:
    q = broker.queue("jobs", delay=0.6)
    q.send(b"a")
    q.send(b"b", delay=0)  # an explicit delay beats the default
    assert bodies(q.receive(10)) == [b"b"]
    t0 = time.monotonic()
    got = q.receive(10, wait=3)  # long polling wakes when the delay ends
    assert bodies(got) == [b"a"] and time.monotonic() - t0 < 2.5


def test_delayed_group_head_holds_its_group(broker: Broker) -> None:
    q = broker.queue("fifo")
    q.send(b"g1", group_id="g", delay=0.6)
    q.send(b"g2", group_id="g")
    q.send(b"h1", group_id="h")
    assert bodies(q.receive(10)) == [b"h1"]
    time.sleep(0.65)
    assert bodies(q.receive(10)) == [b"g1", b"g2"]


# -- long polling ---------------------------------------------------------------------------


def test_long_poll_returns_when_a_thread_sends(broker: Broker) -> None:
    q = broker.queue("jobs")

    def send_later() -> None:
        time.sleep(0.3)
        with Broker(broker.root, sync="none") as other:
            other.queue("jobs").send(b"arrived")

    sender = threading.Thread(target=send_later)
    t0 = time.monotonic()
    sender.start()
    got = q.receive(wait=5)
    elapsed = time.monotonic() - t0
    sender.join()
    assert bodies(got) == [b"arrived"]
    assert 0.25 <= elapsed < 3


def test_long_poll_returns_when_another_process_sends(broker: Broker, child_env: dict) -> None:
    q = broker.queue("jobs")
    code = (
        "import sys, time\nfrom journalq.queue import Broker\ntime.sleep(0.3)\n"
        "with Broker(sys.argv[1], sync='none') as b: b.queue('jobs').send(b'from child')\n"
    )
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", code, str(broker.root)], env=child_env)
    try:
        got = q.receive(wait=5)
        elapsed = time.monotonic() - t0
    finally:
        assert child.wait(30) == 0
    assert bodies(got) == [b"from child"] and elapsed < 3


def test_long_poll_without_messages_waits_without_busy_loop(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"held")
    q.receive(visibility_timeout=60)  # something hidden: the wait has an expiry to watch too
    cpu0, t0 = time.process_time(), time.monotonic()
    assert q.receive(wait=1.0) == []
    cpu, elapsed = time.process_time() - cpu0, time.monotonic() - t0
    assert elapsed >= 0.95
    assert cpu < 0.5 * elapsed, f"{cpu:.2f} s of CPU in a {elapsed:.2f} s wait: a busy loop"


def test_long_poll_wakes_when_a_hidden_message_comes_back(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send(b"x")
    q.receive(visibility_timeout=0.4)
    t0 = time.monotonic()
    (m,) = q.receive(wait=5)
    assert m.receive_count == 2 and time.monotonic() - t0 < 3


# -- topics, channels, stats ----------------------------------------------------------------


@pytest.mark.files_only("the ZooKeeper store has one channel per queue")
def test_every_channel_gets_every_message_without_copies(broker: Broker) -> None:
    topic = broker.topic("events")
    a, b = topic.channel("a"), topic.channel("b")
    marker = b"unique-body-marker-" * 20
    topic.send_many([marker + b"%d" % i for i in range(50)])
    got_a = a.receive(100)
    got_b1 = b.receive(10)
    assert len(got_a) == 50 and len(got_b1) == 10
    assert bodies(got_a[:10]) == bodies(got_b1)
    a.delete_many([m.receipt for m in got_a])
    got_b2 = b.receive(100)  # a's deletes did not touch b
    assert len(got_b2) == 40
    # competing consumers within a channel share the messages out: a second broker's consumer
    with Broker(broker.root, sync="none") as other:
        b_other = other.topic("events").channel("b")
        b.release(got_b1[0].receipt)
        (shared,) = b_other.receive(10)
        assert shared.id == got_b1[0].id
    # channels refer to messages by offset: no channel file holds a body
    for file in (topic.path / "channels").rglob("*"):
        if file.is_file():
            assert b"unique-body-marker" not in file.read_bytes()
    assert sorted(topic.channel_names()) == ["a", "b"]


def test_stats(broker: Broker) -> None:
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    empty = q.stats()
    assert (empty.available, empty.in_flight, empty.delayed, empty.dead, empty.oldest_age) == (0, 0, 0, 0, None)
    q.send_many([b"0", b"1", b"2", b"3"])
    q.send(b"delayed", delay=60)
    time.sleep(0.05)
    s = q.stats()
    assert (s.available, s.in_flight, s.delayed, s.dead) == (4, 0, 1, 0)
    assert s.oldest_age is not None and 0.04 <= s.oldest_age < 30
    (m0,) = q.receive(visibility_timeout=0.5)
    (m1,) = q.receive()
    s = q.stats()
    assert (s.available, s.in_flight, s.delayed, s.dead) == (2, 2, 1, 0)
    time.sleep(0.55)
    s = q.stats()
    assert (s.available, s.in_flight, s.delayed, s.dead) == (3, 1, 1, 0)  # m0 came back
    got = q.receive(10)  # m0 was received once: it goes to the dead-letter queue now
    assert bodies(got) == [b"2", b"3"]
    s = q.stats()
    assert (s.available, s.in_flight, s.delayed, s.dead) == (0, 3, 1, 1)
    assert broker.queue("jobs-dlq").stats().available == 1


@pytest.mark.parametrize("shards", [1, 2])
def test_settings_changed_by_another_process_are_taken_up(store_root: Path | str, shards: int) -> None:
    if shards > 1 and not isinstance(store_root, Path):
        pytest.skip("the ZooKeeper store has no shards")
    with Broker(store_root, sync="none") as mine, Broker(store_root, sync="none") as other:
        q = mine.queue("jobs", visibility_timeout=60, shards=shards)
        sent = q.send(b"first", group_id="g", dedup_id="d")  # one group: one shard
        other.queue("jobs").configure(visibility_timeout=0.2, delay=30, dedup_window=0)
        time.sleep(1.1)  # settings are looked at again once a second
        (first,) = q.receive()
        assert q.settings.visibility_timeout == 0.2  # the other's, not the 60 it opened with
        assert q.send(b"second", group_id="g", dedup_id="d") != sent  # no window: not a duplicate
        time.sleep(0.3)  # (the second is delayed by the other's default)
        assert [(m.id, m.receive_count) for m in q.receive(10)] == [(first.id, 2)]


def test_stats_after_each_operation(broker: Broker) -> None:
    q = broker.queue("jobs")

    def counts() -> tuple[int, int, int]:
        s = q.stats()
        return s.available, s.in_flight, s.delayed

    q.send_many([b"0", b"1", b"2"])
    assert counts() == (3, 0, 0)
    a, b = q.receive(2)
    assert counts() == (1, 2, 0)
    q.release(a.receipt, delay=60)  # mq's delayed redelivery: hidden, so in flight (as SQS counts)
    assert counts() == (1, 2, 0)
    q.change_visibility(a.receipt, 0)
    assert counts() == (2, 1, 0)
    q.delete(b.receipt)
    assert counts() == (2, 0, 0)
    q.delete_id(a.id)  # by id, not delivered now
    assert counts() == (1, 0, 0)
    q.send(b"later", delay=60)
    assert counts() == (1, 0, 1)
    q.purge()
    s = q.stats()
    assert (s.available, s.in_flight, s.delayed, s.dead, s.oldest_age) == (0, 0, 0, 0, None)


def test_by_id_a_delivered_message_is_found_without_looking_for_the_topics_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mq deletes each message it fetched by its id. A delivered message is below the channel's
    frontier, stored for sure: its delete and its metadata do not look for the topic's end (a scan
    from the last index entry of the last segment, slower the more messages that segment holds).
    An id past the frontier still is checked against the end, and one past the end refused."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        ids = q.send_many([b"a", b"b", b"c"])
        (got,) = q.receive()
        looked: list[object] = []
        real = channel_module.end_offset
        monkeypatch.setattr(channel_module, "end_offset", lambda path: looked.append(path) or real(path))
        q.set_metadata(got.id, {"step": 1})
        q.delete_id(got.id)
        assert looked == []
        q.delete_id(ids[2])  # never delivered: past the frontier
        assert len(looked) == 1
        with pytest.raises(TaskNotFoundError, match="no message '3' waiting"):
            q.delete_id("3")  # the next id, not sent yet
        assert [m.body for m in q.receive(10)] == [b"b"]


def test_delete_ids_deletes_by_id_in_one_step_and_says_which_it_could_not(broker: Broker) -> None:
    q = broker.queue("jobs")
    ids = q.send_many([b"a", b"b", b"c", b"d"])
    (got,) = q.receive()  # a delivered, the others waiting: both are deleted by id
    unsent = str(max(int(i) for i in ids) + 1)
    outcomes = q.delete_ids([got.id, ids[2], "not-an-id", ids[2], unsent, got.id])
    assert outcomes[:2] == [None, None]
    assert isinstance(outcomes[2], InvalidMessageError)
    assert [type(o) for o in outcomes[3:]] == [TaskNotFoundError] * 3  # twice, never sent, twice
    assert f"no message {unsent!r} waiting" in str(outcomes[4])
    assert [m.body for m in q.receive(10)] == [b"b", b"d"]
    assert q.delete_ids([]) == []
    with pytest.raises(TaskNotFoundError):
        q.delete_id(ids[2])  # finished: as delete_ids said of it the second time


def test_stats_reads_a_bounded_look_ahead_of_unseen_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``stats()`` tells delayed messages apart among the first ``_STATS_LOOK_AHEAD`` that no
    receive has looked at; those beyond count as available (as SQS's counts, approximate): each
    scrape of the server's metrics calls it for every queue."""
    monkeypatch.setattr(channel_module, "_STATS_LOOK_AHEAD", 5)
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send_many([{"body": b"%d" % i, "delay": 600} for i in range(8)] + [b"now"])
        s = q.stats()
        assert (s.available, s.delayed) == (4, 5)
        assert [m.body for m in q.receive(10)] == [b"now"]  # a receive looks at them all
        s = q.stats()
        assert (s.available, s.delayed, s.in_flight) == (0, 8, 1)


def test_purge_finishes_everything_sent_so_far(broker: Broker) -> None:
    q = broker.queue("jobs")
    q.send_many([b"0", b"1", b"2"])
    (held,) = q.receive()
    q.purge()
    assert q.receive(10) == [] and q.stats().in_flight == 0
    with pytest.raises(ReceiptError):
        q.delete(held.receipt)
    q.send(b"after")
    assert bodies(q.receive(10)) == [b"after"]


def test_a_receipt_acts_only_on_its_own_channel(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        a, b = broker.queue("a"), broker.queue("b")
        a.send(b"x")
        b.send(b"y")
        receipt = a.receive()[0].receipt
        b.receive()
        with pytest.raises(ReceiptError, match="another queue"):
            b.delete(receipt)
        a.delete(receipt)
        # A queue made again under the same name does not take the old queue's receipts.
        a.send(b"z")
        old = a.receive(visibility_timeout=60)[0].receipt
        broker.delete("a")
        again = broker.queue("a")
        again.send_many([b"v", b"w"])
        taken = again.receive(2)
        assert taken[1].receipt.split(".")[:2] == old.split(".")[:2]  # same offset and delivery
        with pytest.raises(ReceiptError, match="another queue"):
            again.delete(old)
        assert again.task(taken[1].id).state == "claimed"


def test_the_same_receipt_twice_in_one_call(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("q")
        q.send(b"x")
        receipt = q.receive()[0].receipt
        first, second = q.delete_many([receipt, receipt])
        assert first is None
        assert isinstance(second, ReceiptError) and "twice" in str(second)


@pytest.mark.files_only("a topic's directory held open")
def test_a_topic_whose_writer_cannot_open_leaves_no_descriptor_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer refused (a read-only directory, a full disk): the topic's directory, held before
    the writer opens, is let go (a read-only bind mount of the data could not be unmounted)."""
    with Broker(tmp_path, sync="none") as b:
        b.queue("jobs").send(b"x")
    path = os.fspath(tmp_path / "jobs")

    def held() -> int:
        """The descriptors of this process open on the topic's directory."""
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass  # (listdir's own, closed since)
        return links.count(path)

    def refused(self: Topic) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path + "/jnl.lck")

    before = held()
    with Broker(tmp_path, sync="none") as b, monkeypatch.context() as patched:
        patched.setattr(Topic, "_get_writer", refused)
        for _ in range(3):  # one left open each time, it was
            with pytest.raises(OSError, match="Read-only file system"):
                b.queue("jobs", create=False)
        assert held() == before
