"""The consumer loop (``receive(n, delete=receipts)``), deliveries left unsynced under
``sync="always"``, and the rule that keeps that safe: a receipt of a delivery lost in a crash never
acts on a later delivery of the same message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journalq.errors import InvalidSettingError, ReceiptError
from journalq.journal import Writer
from journalq.journal import writer as writer_module
from journalq.journal.segment import list_segments
from journalq.queue import Broker


def _fill(queue, count: int) -> None:
    queue.send_many([b"m%d" % i for i in range(count)])


def test_receive_with_delete_deletes_then_receives_the_next(tmp_path: Path) -> None:
    with Broker(tmp_path) as broker:
        queue = broker.queue("q", visibility_timeout=0.2)
        _fill(queue, 5)
        first = queue.receive(2)
        second = queue.receive(2, delete=[m.receipt for m in first])
        assert [m.body for m in second] == [b"m2", b"m3"]
        third = queue.receive(5, delete=[m.receipt for m in second])
        assert [m.body for m in third] == [b"m4"]
        assert queue.receive(5, delete=[m.receipt for m in third]) == []
        stats = queue.stats()
        assert (stats.available, stats.in_flight) == (0, 0)
        # Deleted messages never come back, even after their visibility would have ended.
        assert queue.receive(5, wait=0.4) == []


def test_receive_with_a_stale_receipt_changes_nothing(tmp_path: Path) -> None:
    with Broker(tmp_path) as broker:
        queue = broker.queue("q")
        _fill(queue, 4)
        got = queue.receive(2)
        queue.delete(got[1].receipt)
        with pytest.raises(ReceiptError, match="nothing deleted, nothing received"):
            queue.receive(2, delete=[got[0].receipt, got[1].receipt])
        # Nothing was deleted (the good receipt still works) and nothing was delivered.
        assert queue.stats().in_flight == 1
        assert queue.stats().available == 2
        assert queue.delete_many([got[0].receipt, got[1].receipt])[0] is None
        with pytest.raises(ReceiptError, match="not a receipt"):
            queue.receive(1, delete=["nonsense"])
        with pytest.raises(ReceiptError, match="twice"):
            again = queue.receive(1)
            queue.receive(1, delete=[again[0].receipt, again[0].receipt])
        with pytest.raises(InvalidSettingError, match="list of receipts"):
            queue.receive(1, delete=again[0].receipt)


def test_receive_with_delete_waits_after_deleting(tmp_path: Path) -> None:
    with Broker(tmp_path) as broker:
        queue = broker.queue("q")
        _fill(queue, 1)
        (message,) = queue.receive(1)
        assert queue.receive(1, delete=[message.receipt], wait=0.2) == []
        assert queue.stats().in_flight == 0
        with pytest.raises(ReceiptError):
            queue.delete(message.receipt)  # deleted by the receive


def test_under_sync_always_deliveries_are_not_synced_but_deletes_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = writer_module.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(writer_module, "fdatasync", counting)
    with Broker(tmp_path, sync="always") as broker:
        queue = broker.queue("q")
        _fill(queue, 30)
        queue.receive(1)  # the channel's first maintenance may sync; count from here
        synced.clear()
        got = queue.receive(10)
        assert len(got) == 10 and synced == []
        queue.delete_many([m.receipt for m in got])
        assert len(synced) == 1
        synced.clear()
        more = queue.receive(10)
        assert synced == []
        queue.receive(5, delete=[m.receipt for m in more])
        assert len(synced) == 1  # the deletes and the deliveries after them: one sync


def test_writer_durable_false_is_synced_by_the_next_durable_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = writer_module.fdatasync
    monkeypatch.setattr(writer_module, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    with Writer(tmp_path / "j", sync="always") as writer:
        writer.append_many([b"a", b"b"], durable=False)
        assert synced == []
        writer.append_many([b"c"])
        assert len(synced) == 1
        with writer.hold():
            writer.append_many([b"d"], durable=False)
            writer.append_many([b"e"])
            writer.append_many([b"f"], durable=False)
        assert len(synced) == 2  # one sync at the end of the hold, covering all three
        with Writer(tmp_path / "k", sync="none") as other:
            other.append_many([b"x"])
        assert len(synced) == 3  # "none" syncs only on close


def _state_segment(root: Path) -> Path:
    (segment,) = list_segments(root / "q" / "channels" / "default")
    return segment.path


def test_a_receipt_of_a_delivery_lost_in_a_crash_never_matches_a_later_delivery(tmp_path: Path) -> None:
    """A power cut loses what was not synced: under sync="always", deliveries. Emulated by cutting
    the channel's state journal back to its size before the delivery (what the disk kept). The
    message is delivered again with the same delivery number; the lost delivery's receipt must
    not delete (or hide, or release) it."""
    with Broker(tmp_path, sync="always") as broker:
        queue = broker.queue("q", visibility_timeout=60)
        _fill(queue, 2)
        queue.receive(1, visibility_timeout=0)  # m0, back at once: the state journal exists
        queue.delete(queue.receive(1)[0].receipt)  # m0 done, synced
    synced_size = _state_segment(tmp_path).stat().st_size
    with Broker(tmp_path, sync="always") as broker:
        queue = broker.queue("q")
        (lost,) = queue.receive(1)  # m1, delivery 1: appended, not synced
        assert lost.body == b"m1" and lost.receive_count == 1
        broker.close()  # (close syncs; the cut below undoes what a crash would have lost)
    os.truncate(_state_segment(tmp_path), synced_size)
    with Broker(tmp_path, sync="always") as broker:
        queue = broker.queue("q")
        (again,) = queue.receive(1)
        assert again.body == b"m1" and again.receive_count == 1  # same message, same number
        assert again.receipt != lost.receipt
        for act in (
            lambda: queue.delete(lost.receipt),
            lambda: queue.change_visibility(lost.receipt, 0),
            lambda: queue.release(lost.receipt),
            lambda: queue.receive(1, delete=[lost.receipt]),
        ):
            with pytest.raises(ReceiptError, match="lost in a crash"):
                act()
        assert queue.stats().in_flight == 1
        queue.delete(again.receipt)
        assert queue.stats().in_flight == 0


def test_receipts_without_a_stamp_are_refused(tmp_path: Path) -> None:
    with Broker(tmp_path) as broker:
        queue = broker.queue("q")
        _fill(queue, 1)
        (message,) = queue.receive(1)
        stripped = message.receipt.rsplit(".", 1)[0]
        with pytest.raises(ReceiptError, match="not a receipt"):
            queue.delete(stripped)
        queue.delete(message.receipt)


def test_stamps_survive_a_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.queue import channel as channel_module

    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 5)
    with Broker(tmp_path) as broker:
        queue = broker.queue("q")
        _fill(queue, 20)
        held = queue.receive(3)
        for _ in range(4):  # enough events for snapshots
            queue.delete_many([m.receipt for m in queue.receive(2)])
    with Broker(tmp_path) as broker:  # rebuilt from the snapshot
        queue = broker.queue("q")
        assert queue.delete_many([m.receipt for m in held]) == [None, None, None]


def test_many_events_do_what_single_events_do() -> None:
    from journalq.queue.state import ChannelState, Event, EventKind, deliver_many_record, deliver_record, finish_records

    S = 1_000_000_000
    one, many = ChannelState(), ChannelState()
    for offset in (0, 1, 2, 4):
        one.apply_record(*deliver_record(offset, 1, 30 * S, b"c", None), 5)
    many.apply_record(*deliver_many_record([0, 1, 2, 4], [1, 1, 1, 1], 30 * S, b"c"), 5)
    assert one.snapshot() == many.snapshot()
    assert many.check_receipt(4, 1, 5).consumer == "c"
    for offset in (0, 2, 4):
        one.apply_record(*finish_records([offset], [1])[0], 6)
    (record,) = finish_records([0, 2, 4], [1, 1, 1])
    assert record[0] == EventKind.FINISH_MANY
    assert many.apply_record(*record, 6) == 3
    assert one.snapshot() == many.snapshot()
    assert (many.cursor, sorted(many.inflight), list(many.skipped)) == (1, [1], [3])
    assert one.events_applied == many.events_applied == 7
    assert finish_records([], []) == []
    # Through Event, as tools that decode the state journal see them.
    for type_, key, value in (deliver_many_record([7, 9], [2, 1], 4 * S, b"host:1"), record):
        event = Event.decode(type_, key, value)
        assert event.encode() == (type_, key, value)
        via_event, direct = ChannelState(), ChannelState()
        via_event.apply(event, 1)
        direct.apply_record(type_, key, value, 1)
        assert via_event.snapshot() == direct.snapshot()


@pytest.mark.parametrize("shards", [1, 2])
def test_received_messages_are_whole_immutable_records(tmp_path: Path, shards: int) -> None:
    """A receive builds its messages without ``ReceivedMessage``'s constructor: each is one all
    the same, every field set, immutable; a sharded queue's name their shard."""
    from journalq.queue.channel import ReceivedMessage

    with Broker(tmp_path) as broker:
        queue = broker.queue("q", shards=shards)
        route = {"key": "k"} if shards > 1 else {}  # both in one shard, in order
        queue.send(b"plain", **route)
        queue.send(b"rich", attributes={"a": "1"}, filters={"f": "x"}, **route)
        plain, rich = queue.receive(2)
        queue.delete_many([plain.receipt, rich.receipt])  # the receipts given out are the queue's
        assert queue.stats().available == queue.stats().in_flight == 0
    for message in (plain, rich):
        assert type(message) is ReceivedMessage
        fields = message._asdict()
        assert list(fields) == list(ReceivedMessage._fields)
        assert ReceivedMessage(**fields) == message
        with pytest.raises(AttributeError):
            message.body = b"changed"  # type: ignore[misc]
        shard, _, own_id = message.id.rpartition(".")
        assert own_id == str(message.offset) and message.receipt.startswith(message.id + ".")
        assert shard.isdecimal() if shards > 1 else shard == ""
    assert (plain.body, plain.attributes, plain.filters) == (b"plain", {}, {})
    assert rich.body == b"rich" and rich.filters == {"f": "x"} and "a" in rich.attributes
    assert plain.attributes is not rich.attributes
    made = [ReceivedMessage("1", "r", b"", {}, 1, 0, 1) for _ in range(2)]
    assert made[0].filters == {} and made[0].filters is not made[1].filters  # a fresh default each
    assert made[0].sent_at.timestamp() == 0


def test_a_receive_that_fails_after_applying_its_deletes_leaves_them_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletes of ``receive(delete=...)`` are applied before the step decides and appended
    with what it records; if the step fails in between, the channel's state is rebuilt from its
    journal, which never got them: nothing was deleted, in this process or any other."""
    from journalq.errors import StorageError
    from journalq.queue.channel import Channel

    with Broker(tmp_path) as broker:
        queue = broker.queue("q", max_receive_count=1, dead_letter_queue="dlq")
        _fill(queue, 2)
        (first,) = queue.receive(1)
        (late,) = queue.receive(1, visibility_timeout=0)  # back at once, due for the dead letters

        def failing(self, dead) -> None:
            raise StorageError("disk full (test)")

        monkeypatch.setattr(Channel, "_send_dead", failing)
        with pytest.raises(StorageError):
            queue.receive(1, delete=[first.receipt])
        monkeypatch.undo()
        assert queue.stats().in_flight == 1  # ``first`` still in flight in this process...
        with Broker(tmp_path) as other:
            assert other.queue("q").stats().in_flight == 1  # ... and as the journal says
        assert queue.receive(1, delete=[first.receipt]) == []  # now deleted; ``late`` went to dlq
        assert [m.body for m in broker.queue("dlq").receive(5)] == [late.body]
        assert queue.stats().in_flight == 0


LOOP_CONSUMER = """
import sys
from journalq.queue import Broker

root, out, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Broker(root, sync="none") as broker, open(out, "w") as log:
    q = broker.queue("jobs")
    done = []
    while got := q.receive(batch, delete=done):
        log.write("".join(m.body.decode() + "\\n" for m in got))
        done = [m.receipt for m in got]
"""


def test_consumer_loops_in_three_processes_take_each_message_once(tmp_path: Path, child_env: dict) -> None:
    import subprocess
    import sys

    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", visibility_timeout=600)  # no timeout expires during the test
        for start in range(0, 6000, 1000):
            queue.send_many([b"%d" % i for i in range(start, start + 1000)])
    logs = [tmp_path / f"loop-{n}.log" for n in range(3)]
    children = [
        subprocess.Popen([sys.executable, "-c", LOOP_CONSUMER, str(root), str(log), str(batch)], env=child_env)
        for log, batch in zip(logs, (1, 7, 10))
    ]
    try:
        for child in children:
            assert child.wait(120) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    received = [int(line) for log in logs for line in log.read_text().splitlines()]
    assert sorted(received) == list(range(6000))  # each once
    with Broker(root, sync="none") as broker:
        stats = broker.queue("jobs").stats()
        assert (stats.available, stats.in_flight, stats.dead) == (0, 0, 0)


def test_snapshots_from_before_stamps_still_restore() -> None:
    import json

    from journalq.queue.state import ChannelState, StaleReceipt

    state = ChannelState()
    old = json.loads(ChannelState().snapshot())
    old.update(frontier=3, skipped=[0], inflight=[[1, 2, 10**18, "host:1:a", None], [2, 1, 10**18, "c", "g"]])
    state.restore(json.dumps(old).encode())
    assert state.check_receipt(1, 2).stamp == 0 and state.group_holds == {"g": 1}
    with pytest.raises(StaleReceipt, match="lost in a crash"):
        state.check_receipt(1, 2, 12345)  # a receipt with a stamp never matches one without
