"""Garbage collection: topic segments deleted once every channel is done with them (and never one
a slower channel still needs), retention by age and by size, and compaction of channel state
(snapshots) that another process rebuilds to the same state; finished and dead tasks collected
while an older one is in flight, and receives that go past what another process's retention
deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_queue_lookahead import broker  # noqa: F401 (fixture)

import journalq.journal.recovery as recovery_module
import journalq.queue.channel as channel_module
import journalq.queue.topic as topic_module
from journalq.errors import ZERO_TIMESTAMP, JournalError, StaleReceiptError, TaskNotFoundError
from journalq.journal import Scanner, Writer, first_offset, read_offset
from journalq.journal.segment import list_segments
from journalq.queue import Broker

SEGMENT = 4096
PER_SEGMENT = 33  # messages of 100 bytes in a 4096-byte segment


def body(i: int) -> bytes:
    return b"%04d" % i + b"x" * 96


def drain(channel, count: int | None = None, *, batch: int = 10) -> list[bytes]:
    got: list[bytes] = []
    while count is None or len(got) < count:
        messages = channel.receive(batch if count is None else min(batch, count - len(got)))
        if not messages:
            break
        got += [m.body for m in messages]
        assert not any(channel.delete_many([m.receipt for m in messages]))
    return got


def total_size(path: Path) -> int:
    return sum(s.path.stat().st_size for s in list_segments(path))


def test_segments_go_once_every_channel_is_done_two_channels_one_slow(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", segment_size=SEGMENT)
        fast, slow = topic.channel("fast"), topic.channel("slow")
        topic.send_many([body(i) for i in range(600)])
        segments_before = len(list_segments(topic.path))
        assert segments_before >= 15
        assert drain(fast) == [body(i) for i in range(600)]
        assert drain(slow, 300) == [body(i) for i in range(300)]
        (held,) = slow.receive(1, visibility_timeout=0.3)  # 300, in flight
        assert held.body == body(300)
        deleted = topic.gc()
        assert deleted and all(p.suffix in (".jnl", ".idx") for p in deleted)
        first = first_offset(topic.path)
        assert 300 - PER_SEGMENT < first <= 300  # only what both channels finished
        # nothing the slow channel still needs is gone: its held message comes back whole
        time.sleep(0.35)
        assert drain(slow) == [body(i) for i in range(300, 600)]
        topic.gc()
        assert len(list_segments(topic.path)) == 1  # never the segment being written
        assert first_offset(topic.path) > 560
        topic.send(b"after")
        assert drain(fast) == [b"after"] and drain(slow) == [b"after"]


def test_gc_keeps_what_a_channel_of_another_process_has_not_committed(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        topic = a.topic("events", segment_size=SEGMENT)
        topic.send_many([body(i) for i in range(300)])
        mine = topic.channel("mine")
        assert len(drain(mine)) == 300
        theirs = b.topic("events").channel("theirs")
        assert len(drain(theirs, 200)) == 200  # committed only on its next collection or close
        a.topic("events").gc()
        assert first_offset(topic.path) == 0
        b.close()  # closing commits its cursor
        assert read_offset(topic.path, "theirs") == 200
        a.topic("events").gc()
        assert 200 - PER_SEGMENT < first_offset(topic.path) <= 200
    with Broker(tmp_path, sync="none") as c:
        assert drain(c.topic("events").channel("theirs")) == [body(i) for i in range(200, 300)]


def test_a_channel_collects_segments_by_itself(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, task_gc_interval=0.05)
        q.send_many([body(i) for i in range(400)])
        assert len(drain(q)) == 400
        time.sleep(0.06)
        q.receive()  # a collection is due: it publishes the cursor and deletes consumed segments
        time.sleep(0.06)
        q.receive()
        assert len(list_segments(q.topic.path)) <= 2


def test_gc_deletes_finished_tasks_and_keeps_open_ones(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, task_gc_interval=0.05, task_gc_lifetime=0.1)
        ids = q.send_many([{"body": body(i), "metadata": {"i": i}} for i in range(200)])
        assert len(drain(q, 150)) == 150
        (open_,) = q.receive(visibility_timeout=60)  # id 150 stays open
        q.set_metadata(open_.id, {"i": 150, "progress": 0.5})
        assert len(drain(q)) == 49
        assert q.task(ids[10]).state == "finished"
        for _ in range(6):
            time.sleep(0.06)
            q.receive()
        assert 150 - PER_SEGMENT < first_offset(q.topic.path) <= 150  # the open task pins its segment
        t = q.task(open_.id)
        assert (t.state, t.metadata) == ("claimed", {"i": 150, "progress": 0.5})
        for gone in (ids[0], ids[10], ids[149]):
            with pytest.raises(TaskNotFoundError):
                q.task(gone)
        q.delete(open_.receipt)
        for _ in range(6):
            time.sleep(0.06)
            q.receive()
        assert first_offset(q.topic.path) > 190
        for gone in (open_.id, ids[199]):
            with pytest.raises(TaskNotFoundError):
                q.task(gone)


def test_retention_by_age(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, retention_seconds=1, task_gc_interval=0.05)
        q.send_many([body(i) for i in range(300)])
        (old,) = q.receive(visibility_timeout=60)  # even one in flight does not hold retention
        time.sleep(1.1)
        q.send_many([body(i) for i in range(300, 340)])  # its collection is due: it deletes them
        assert q.topic.gc() == []
        first = first_offset(q.topic.path)
        assert 300 - PER_SEGMENT < first <= 300  # old segments gone, unconsumed or not
        stats = q.stats()
        assert stats.available <= 340 - first + 1
        time.sleep(0.06)  # the channel catches up with retention at its next collection
        # Those of the segment still kept that are past retention are not delivered either.
        assert drain(q) == [body(i) for i in range(300, 340)]


@pytest.mark.parametrize("plain", [True, False])
def test_messages_past_retention_in_the_newest_segment_are_not_delivered(tmp_path: Path, plain: bool) -> None:
    """The topic's gc deletes whole segments past retention, never the newest: the messages in it
    that are past retention are finished unseen by a receive, and not counted, as the ZooKeeper
    store expires its tasks (they were delivered however old)."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", retention_seconds=1)
        old = [body(i) if plain else {"body": body(i), "attributes": {"n": i}} for i in range(5)]
        q.send_many(old)
        (in_flight,) = q.receive(1, visibility_timeout=60)
        time.sleep(1.1)
        fresh = q.send(b"fresh")
        stats = q.stats()
        assert (stats.available, stats.in_flight) == (1, 1)
        got = q.receive(10)
        assert [m.id for m in got] == [fresh]
        q.change_visibility(in_flight.receipt, 0)  # back: past retention, it is not delivered again
        assert q.receive(10) == []
        with pytest.raises(StaleReceiptError):
            q.delete(in_flight.receipt)
        assert q.task(in_flight.id).state == "finished"
        stats = q.stats()
        assert (stats.available, stats.in_flight) == (0, 1)  # the fresh one


def test_retention_by_age_seen_by_a_fresh_process(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, retention_seconds=1, task_gc_interval=0.05)
        q.send_many([body(i) for i in range(300)])
        q.receive()
    time.sleep(1.1)
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"new")
        q.topic.gc()
        first = first_offset(q.topic.path)
        assert first > 200
        s = q.stats()  # must not fail on the deleted segments the channel has not read
        assert s.in_flight == 0 and s.available >= 1  # the one in flight was deleted with its segment
        time.sleep(0.06)
        assert drain(q)[-1] == b"new"


def test_retention_by_size(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, retention_bytes=3 * SEGMENT, task_gc_interval=0.05)
        q.send_many([body(i) for i in range(400)])
        q.topic.gc()
        segments = list_segments(q.topic.path)
        assert total_size(q.topic.path) <= 3 * SEGMENT and len(segments) >= 2
        with Scanner(q.topic.path, segments[0].base) as scanner:
            kept = [m.value for m in scanner]
        assert kept == [body(i) for i in range(segments[0].base, 400)]  # the newest are kept
        time.sleep(0.06)
        assert drain(q) == kept


# -- compaction of channel state ---------------------------------------------------------------


CHILD_VIEW = """
import json, sys
from journalq.queue import Broker
root, name, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with Broker(root, sync="none") as b:
    q = b.queue(name)
    s = q.stats()
    tasks = {}
    for i in ids:
        try:
            t = q.task(i)
            tasks[i] = [t.state, t.metadata, t.receive_count]
        except Exception as exc:
            tasks[i] = type(exc).__name__
    state = q.state
    print(json.dumps({
        "stats": [s.available, s.in_flight, s.delayed, s.dead],
        "consumers": q.consumers(),
        "tasks": tasks,
        "cursor": state.cursor, "frontier": state.frontier,
        "skipped": list(state.skipped), "finished": sorted(state.finished),
    }))
"""


def view(q, ids: list[str]) -> dict:
    s = q.stats()
    tasks = {}
    for i in ids:
        try:
            t = q.task(i)
            tasks[i] = [t.state, t.metadata, t.receive_count]
        except Exception as exc:  # noqa: BLE001
            tasks[i] = type(exc).__name__
    state = q.state
    return {
        "stats": [s.available, s.in_flight, s.delayed, s.dead],
        "consumers": q.consumers(),
        "tasks": tasks,
        "cursor": state.cursor, "frontier": state.frontier,
        "skipped": list(state.skipped), "finished": sorted(state.finished),
    }


def test_compaction_bounds_state_and_another_process_rebuilds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, child_env: dict
) -> None:
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 100)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", 4096)
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", max_receive_count=2, dead_letter_queue="dlq")
        ids = q.send_many(
            [{"body": b"%d" % i, "group_id": "g" if i % 50 == 0 else None} for i in range(2000)]
        )
        sizes = []
        for round_ in range(40):
            got = q.receive(50, visibility_timeout=600)
            keep = [m for m in got if int(m.id) % 97 == 0]  # some stay in flight
            for m in got:
                if int(m.id) % 89 == 0:
                    q.set_metadata(m.id, {"round": round_})
            q.delete_many([m.receipt for m in got if m not in keep])
            sizes.append(sum(s.path.stat().st_size for s in list_segments(q.path)))
        q.send(b"late", delay=600)
        poison = q.send(b"poison")
        q.receive(1000, visibility_timeout=0)  # everything left, once, back at once
        q.receive(1000, visibility_timeout=0)
        q.receive(1000, visibility_timeout=0)  # poison (received twice): dead on the third look
        assert q.stats().dead >= 1
        assert (q.path / "ofs" / "snapshot.ofs").is_file()
        assert len(list_segments(q.path)) <= 3
        assert max(sizes[10:]) < 3 * max(sizes[:10]) + 3 * 4096  # bounded, not growing with history
        sample = [ids[i] for i in (0, 1, 89, 97, 178, 194, 1999)] + [poison, "5000"]
        mine = view(q, sample)
        # a fresh broker in another process rebuilds the same state from snapshot + events
        out = subprocess.run(
            [sys.executable, "-c", CHILD_VIEW, str(tmp_path), "jobs", json.dumps(sample)],
            env=child_env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        theirs = json.loads(out)
        assert theirs == json.loads(json.dumps(mine))
        assert mine["tasks"]["5000"] == "TaskNotFoundError"


def test_compaction_under_a_long_lived_consumer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer idle while another compacts the state journal past it (deleting the state
    segments it was reading and writing) goes on with the right state: no error, nothing
    finished delivered again."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 50)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", 4096)
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        qa.send_many([b"%d" % i for i in range(3000)])
        (first,) = qa.receive()
        qa.delete(first.receipt)
        (held,) = qa.receive(visibility_timeout=600)
        done = {first.body}
        for _ in range(200):
            got = qb.receive(5)
            done.update(m.body for m in got)
            assert not any(qb.delete_many([m.receipt for m in got]))
        assert list_segments(qb.path)[0].base > 100  # a's position in the state journal is gone
        got = qa.receive(10)
        assert got and not {m.body for m in got} & done
        assert held.body not in {m.body for m in got}
        qa.delete(held.receipt)
        rest = drain(qa, batch=100) + [m.body for m in got]
        assert sorted(done | set(rest) | {held.body}, key=int) == [b"%d" % i for i in range(3000)]
        assert len(done) + len(rest) + 1 == 3000


def test_one_snapshot_per_interval_with_several_consumers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers in turn on one channel: the changes since the journal's last snapshot are counted
    from the last one anybody appended, so one of them compacts each time, not each in turn."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 100)
    compacted: list[object] = []
    compact = channel_module.Channel._compact
    monkeypatch.setattr(channel_module.Channel, "_compact", lambda self: (compacted.append(self), compact(self)))
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b, Broker(tmp_path, sync="none") as c:
        queues = [a.queue("jobs"), b.queue("jobs"), c.queue("jobs")]
        queues[0].send_many([body(i) for i in range(1000)])
        got: list[bytes] = []
        done: list[list[str]] = [[], [], []]
        for turn in range(2000):
            i = turn % 3
            messages = queues[i].receive(5, delete=done[i])
            done[i] = [m.receipt for m in messages]
            got += [m.body for m in messages]
            if not any(done):
                break
    assert sorted(got) == [body(i) for i in range(1000)]
    # 2,000 changes (a delivery and a delete each): 20 snapshots, give or take the last round's
    assert 19 <= len(compacted) <= 21
    assert len({id(channel) for channel in compacted}) == 3  # whoever came when it was due


def test_a_large_state_is_compacted_after_as_many_changes_as_it_has_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot writes every entry of the state under the channel's lock (200,000 deliveries
    in flight: ~0.5 s). Up to ``SNAPSHOT_ENTRIES`` entries, one comes every ``SNAPSHOT_EVERY``
    changes; a larger state waits for as many changes as it has entries (at the defaults), so
    that each change pays for one entry written, not ten; a state small next to the changes,
    every ``SNAPSHOT_SMALL_EVERY``."""
    from journalq.queue.state import ChannelState

    state = ChannelState()

    def due(changes: int, entries: int) -> bool:
        state.events_applied = state.applied_at_snapshot + changes
        monkeypatch.setattr(state, "entries", lambda: entries)
        return channel_module._compaction_due(state)

    assert channel_module.SNAPSHOT_EVERY == channel_module.SNAPSHOT_ENTRIES == 20_000
    assert not due(19_999, 15_000) and due(20_000, 15_000) and due(20_000, 20_000)
    assert not due(20_000, 200_000) and not due(199_999, 200_000) and due(200_000, 200_000)
    assert not due(1_999, 10) and due(2_000, 250) and not due(2_000, 251)


def test_a_send_makes_the_compaction_its_process_saw_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction that came due with a call's own changes (after its check) is made by the
    next call, a send too: ``upkeep_due`` then clears. The server reads it before every batch
    and stores the batch in a thread while it holds; a process that went on sending only kept
    it set for good, and sent every batch through a thread."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 4)
    compactions: list[int] = []
    real_compact = channel_module.Channel._compact

    def compact(self: channel_module.Channel) -> None:
        compactions.append(1)
        real_compact(self)

    monkeypatch.setattr(channel_module.Channel, "_compact", compact)
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send_many([b"%d" % i for i in range(10)])
        got = q.receive(3)
        q.delete_many([m.receipt for m in got])  # 6 changes, the last 3 after its check
        assert q.upkeep_due() and not compactions
        q.send(b"more")
        assert compactions == [1] and not q.upkeep_due()
        q.send(b"and more")
        assert compactions == [1]


def test_a_small_state_is_compacted_sooner_and_its_pointer_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state small next to the changes since its last snapshot is compacted every
    ``SNAPSHOT_SMALL_EVERY`` changes (what a process opening the channel replays), a large one
    not until ``SNAPSHOT_EVERY``. The pointer to the snapshot is written over in place (no new
    file, no rename: a small compaction costs little), synced before any state segment goes."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_SMALL_EVERY", 40)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", 4096)
    steps: list[tuple[str, int]] = []  # ("pointer", its inode) and ("delete", 0), in order
    overwrite_offset, remove_segment = channel_module.overwrite_offset, channel_module.remove_segment

    def pointing(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
        assert sync  # sync="always"
        overwrite_offset(file, offset, sync=sync, inside=inside)
        steps.append(("pointer", file.stat().st_ino))

    def deleting(segment: Any) -> None:
        steps.append(("delete", 0))
        remove_segment(segment)

    monkeypatch.setattr(channel_module, "overwrite_offset", pointing)
    monkeypatch.setattr(channel_module, "remove_segment", deleting)
    with Broker(tmp_path, sync="always") as broker:
        q = broker.queue("jobs")
        q.send_many([b"%d" % i for i in range(3000)])
        done: list[str] = []
        for _ in range(200):  # 2,000 changes, five messages in flight at most
            got = q.receive(5, delete=done)
            done = [m.receipt for m in got]
        assert 45 <= sum(step == "pointer" for step, _ in steps) <= 50
        assert len({inode for step, inode in steps if step == "pointer"}) == 1  # one file, written over
        assert ("delete", 0) in steps and steps[0][0] == "pointer"
        assert len(list_segments(q.path)) <= 2
        held = q.receive(1000, visibility_timeout=600, delete=done)  # a large state now
        steps.clear()  # (that receive may compact, before it delivers)
        for _ in range(20):  # 200 changes
            got = q.receive(5)
            q.delete_many([m.receipt for m in got])
        assert steps == []
        assert len(held) == 1000
        rest = drain(q, batch=500)
        sample = [held[0].id, held[-1].id, "0", "2999"]
        mine = json.loads(json.dumps(view(q, sample)))
    with Broker(tmp_path, sync="none") as again:  # another opening rebuilds the same state
        assert json.loads(json.dumps(view(again.queue("jobs"), sample))) == mine
        assert again.queue("jobs").stats().in_flight == 1000
    assert len(rest) == 3000 - 1000 - 5 * 200 - 5 * 20


def test_a_channel_that_runs_dry_publishes_its_cursor_at_once(tmp_path: Path) -> None:
    """Not at its next collection only: other processes' gc, and the other consumers of a sharded
    queue, see without its lock that nothing is left (``ShardedChannel._surely_empty``)."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", task_gc_interval=3600)
        q.send_many([b"a", b"b", b"c"])
        got = q.receive(10)
        assert q.delete_many([m.receipt for m in got]) == [None] * 3
        assert read_offset(q.topic.path, "default") == 0  # the deletes alone publish nothing
        assert q.receive(10) == []
        assert read_offset(q.topic.path, "default") == 3
        q.send(b"d")
        (last,) = q.receive(10)
        assert q.receive(10, visibility_timeout=0) == []  # "d" is in flight: not dry
        assert read_offset(q.topic.path, "default") == 3
        q.delete(last.receipt)
        assert q.receive(10) == [] and read_offset(q.topic.path, "default") == 4


def test_producer_whose_segment_was_collected_can_still_send(tmp_path: Path) -> None:
    """A producer idle while others fill segments that gc then deletes, including the one its
    writer was on."""
    with Broker(tmp_path, sync="none") as idle, Broker(tmp_path, sync="none") as busy:
        idle_q = idle.queue("jobs", segment_size=SEGMENT)
        idle_q.send(b"first")
        busy_q = busy.queue("jobs")
        busy_q.send_many([body(i) for i in range(300)])
        assert len(drain(busy_q)) == 301
        busy_q.topic.gc()
        assert first_offset(busy_q.topic.path) > 200
        idle_q.send(b"again")
        assert drain(busy_q) == [b"again"]


def test_retention_while_a_consumer_reads(tmp_path: Path) -> None:
    """Retention deletes segments a live consumer was reading (and the ones after): it goes on
    with what is left, with no error."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, retention_bytes=2 * SEGMENT, task_gc_interval=0.05)
        q.send_many([body(i) for i in range(10)])
        assert len(drain(q)) == 10  # the consumer has read to the end of the first segment
        with Broker(tmp_path, sync="none") as producer:
            producer.queue("jobs").send_many([body(i) for i in range(10, 400)])
        q.topic.gc()
        first = first_offset(q.topic.path)
        assert first > 300
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (not got or got[-1] != body(399)):
            got += drain(q)
            time.sleep(0.02)
        assert got[-1] == body(399)
        assert got[-(400 - first):] == [body(i) for i in range(first, 400)]


def test_what_retention_deleted_is_neither_delivered_nor_counted_after_the_gc(tmp_path: Path) -> None:
    """A gc of this process deletes unfinished messages (by size here): its channels forget them
    at once, not at their next collection (a minute by default): what they had read ahead is not
    delivered, and messages in flight are no longer counted nor changed by their receipts."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", segment_size=SEGMENT, retention_bytes=3 * SEGMENT)
        q.send_many([body(i) for i in range(10)])
        held = q.receive(2, visibility_timeout=60)  # in flight; the rest of the 10 read ahead
        q.send_many([body(i) for i in range(10, 400)])
        assert q.topic.gc()
        first = first_offset(q.topic.path)
        assert first > 300
        s = q.stats()
        assert (s.available, s.in_flight) == (400 - first, 0)
        with pytest.raises(StaleReceiptError):
            q.delete(held[0].receipt)
        assert drain(q) == [body(i) for i in range(first, 400)]


def test_dedup_after_gc_deleted_what_the_producer_had_not_read(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        qa = a.queue("jobs", segment_size=SEGMENT)
        qa.send(b"early", dedup_id="early")  # a's dedup index has read the journal to here
        qb = b.queue("jobs")
        qb.send_many([body(i) for i in range(300)])
        late = qb.send(b"late", dedup_id="late")
        assert len(drain(qb, batch=100)) == 302
        qb.topic.gc(now=time.time() + 301)  # once "early" is past its window (the last segment stays)
        assert first_offset(qb.topic.path) > 250
        assert qa.send(b"late again", dedup_id="late") == late  # b's id, still in the window
        assert qa.send(b"new", dedup_id="new") != late
        assert drain(qb) == [b"new"]


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("how", ["dedup_id", "content_based_dedup"])
def test_consumed_segments_stay_while_a_deduplication_id_in_them_is_within_its_window(
    tmp_path: Path, shards: int, how: str
) -> None:
    """Deduplication ids are known from the messages alone: a gc that deleted a consumed segment
    holding one still within its window let a process opened after it take a second send of the
    id for new, and deliver it again. Such segments stay until the ids are past their window;
    a shard whose messages have none is collected at once (as a queue that never had one: the
    tests above)."""
    content = how == "content_based_dedup"
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, shards=shards, content_based_dedup=content)
        paths = queue.topic.shard_paths if shards > 1 else [queue.topic.path]
        once = {"body": b"once"} if content else {"body": b"once", "dedup_id": "d"}
        first = queue.send_many([once])[0]
        queue.send_many([body(i) for i in range(300)])  # (with content_based_dedup, each has an id)
        assert len(drain(queue, batch=100)) == 301
        queue.commit_cursor()
        before = [len(list_segments(path)) for path in paths]
        assert min(before) > 1
        broker.gc()
        home = int(first.partition(".")[0]) if shards > 1 else 0  # the shard of "once"
        kept = [count if content or i == home else 1 for i, count in enumerate(before)]
        assert [len(list_segments(path)) for path in paths] == kept
    with Broker(tmp_path, sync="none") as broker:  # another process, after the gc
        queue = broker.queue("jobs", create=False)
        assert queue.send_many([dict(once)])[0] == first
        assert queue.receive(10) == []
        queue.topic.gc(now=time.time() + 301)  # the ids' window over: their segments go
        assert [len(list_segments(path)) for path in paths] == [1] * shards


class RacingGc:
    """The gc of another process (``other``, the same topic opened by another broker), begun in a
    thread the next time this process lists the topic's segments, and waited for there up to
    ``wait`` seconds (short where it waits for a lock this process holds)."""

    def __init__(self, other, now: float | None, wait: float) -> None:
        self.other, self.now, self.wait = other, now, wait
        self.deleted: list[Path] | None = None
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            self.deleted = self.other.gc(self.now)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.errors.append(exc)

    def join(self) -> list[Path]:
        assert self.thread is not None, "this process listed no segments"
        self.thread.join(10)
        assert not self.thread.is_alive() and self.errors == []
        assert self.deleted is not None
        return self.deleted


@pytest.fixture
def gc_of_another_process_after_listing(monkeypatch: pytest.MonkeyPatch):
    """``racing(topic, now, wait)``: the next time this process lists the topic's segments, ``topic``
    (the same topic, opened by another broker: another process) collects, as a gc of another
    process running at the same time can (``RacingGc``)."""
    real = topic_module.list_segments

    def racing(other, now: float | None = None, wait: float = 10) -> RacingGc:
        race = RacingGc(other, now, wait)

        def listing(path):
            segments = real(path)
            if race.thread is None:
                race.thread = threading.Thread(target=race.run)
                race.thread.start()
                race.thread.join(race.wait)
            return segments

        monkeypatch.setattr(topic_module, "list_segments", listing)
        return race

    return racing


def journals(deleted: list[Path]) -> list[Path]:
    """The segments' files among the files a gc deleted (not their indexes)."""
    return [path for path in deleted if path.suffix == ".jnl"]


def consumed_topic(broker: Broker, count: int):
    queue = broker.queue("jobs", segment_size=SEGMENT)
    queue.send_many([body(i) for i in range(count)])
    assert len(drain(queue)) == count
    queue.commit_cursor()
    return queue


def test_gc_at_the_same_time_as_another_process_gc(tmp_path: Path, gc_of_another_process_after_listing) -> None:
    """Two gcs of a topic with channels take turns (the lock of a channel's making): the second
    finds the first's deletes done."""
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        queue = consumed_topic(a, 400)
        segments = list_segments(queue.topic.path)
        race = gc_of_another_process_after_listing(b.topic("jobs"), wait=0.5)  # it waits for this gc
        deleted = a.topic("jobs").gc()
        assert race.join() == []
        assert journals(deleted) == [s.path for s in segments[:-1]]
        assert list_segments(queue.topic.path) == segments[-1:]
        queue.send(b"after")
        assert drain(queue) == [b"after"]


def test_retention_at_the_same_time_as_another_process_s(
    tmp_path: Path, gc_of_another_process_after_listing
) -> None:
    """A topic with no channel is collected by retention alone, with no lock: a segment listed
    may be gone before it is deleted (another process's gc deleted it)."""
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        topic = a.topic("events", segment_size=SEGMENT, retention_seconds=1)
        topic.send_many([body(i) for i in range(400)])
        segments = list_segments(topic.path)
        later = time.time() + 10
        race = gc_of_another_process_after_listing(b.topic("events"), later)
        deleted = topic.gc(later)
        raced = race.join()
        assert raced, "the other gc deleted nothing"
        assert sorted(journals(deleted + raced)) == [s.path for s in segments[:-1]]
        assert list_segments(topic.path) == segments[-1:]


def test_a_dedup_send_while_another_process_collects(tmp_path: Path, gc_of_another_process_after_listing) -> None:
    """A deduplicating send reads the segments of the window from the newest one back; one that
    another process's gc deleted meanwhile is no error."""
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        queue = consumed_topic(a, 400)
        race = gc_of_another_process_after_listing(b.topic("jobs"))
        with Broker(tmp_path, sync="none") as c:
            c.queue("jobs").topic._last_gc = time.monotonic()  # its own gc not due: the listing is the send's
            sent = c.queue("jobs").send(b"once", dedup_id="d")
            assert race.join(), "the other gc deleted nothing"
            assert c.queue("jobs").send(b"once", dedup_id="d") == sent
        assert drain(queue) == [b"once"]


def test_cursor_commits_of_one_channel_from_two_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic's gc (run by one channel's receive) publishes every channel's cursor, while the
    thread of one of them may publish that one's too: both wrote the same temporary file (its name
    has the pid only), and the second rename found it gone (FileNotFoundError)."""
    paused, resume = threading.Event(), threading.Event()

    class PausingOs:
        """``os`` of ``write_offset``'s ``replace_file``, whose first rename waits until the test says go."""

        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def replace(self, src, dst) -> None:
            if not paused.is_set():
                paused.set()
                assert resume.wait(10)
            os.replace(src, dst)

    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events")
        first, second = topic.channel("first"), topic.channel("second")
        topic.send_many([b"a", b"b"])
        first.delete(first.receive()[0].receipt)
        second.delete(second.receive()[0].receipt)
        monkeypatch.setattr(recovery_module, "os", PausingOs())
        errors: list[BaseException] = []

        def noting(call) -> threading.Thread:
            def run() -> None:
                try:
                    call()
                except BaseException as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        gc = noting(topic.gc)  # publishes both cursors: paused in the first one's
        assert paused.wait(10)
        commit = noting(first.commit_cursor)  # the same one's, meanwhile
        commit.join(0.5)  # done by now, unless it waits for the gc's
        resume.set()
        gc.join(10)
        commit.join(10)
        assert errors == []
        assert read_offset(topic.path, "first") == 1 and read_offset(topic.path, "second") == 1


def test_a_channel_opened_while_the_gc_publishes_the_cursors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gc goes over the topic's channels while another thread may open one (here, the commit
    of the first opens it): 'dictionary changed size during iteration' failed the gc."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events")
        first = topic.channel("first")
        topic.send(b"a")
        first.delete(first.receive()[0].receipt)
        commit = channel_module.Channel.commit_cursor

        def opening(self) -> bool:
            if self is first:
                topic.channel("second")
            return commit(self)

        monkeypatch.setattr(channel_module.Channel, "commit_cursor", opening)
        topic.gc()
        assert read_offset(topic.path, "first") == 1
        assert topic.channel_names() == ["first", "second"]


def test_a_channel_made_by_another_process_during_a_gc_keeps_what_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gc decides what is consumed from the channels it lists; a channel made by another process
    right after the listing was not among them, and the segments it had begun to read were deleted
    under it: a message it had been given was gone before its redelivery. Making a channel now
    waits for a gc under way (and a gc for a channel being made), so the new channel starts
    either where the gc left the topic or before a gc that counts it."""
    listed, made = threading.Event(), threading.Event()
    real = topic_module.channel_names_in

    def listing(path: Path) -> list[str]:
        names = real(path)
        if not listed.is_set():
            listed.set()
            made.wait(0.5)  # the other process makes its channel meanwhile (or waits for this gc)
        return names

    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        topic = a.topic("events", segment_size=SEGMENT)
        old = topic.channel("old")
        topic.send_many([body(i) for i in range(300)])
        assert len(drain(old)) == 300
        monkeypatch.setattr(topic_module, "channel_names_in", listing)
        gc = threading.Thread(target=topic.gc)
        gc.start()
        assert listed.wait(10)
        new = b.topic("events").channel("new")
        given = new.receive(visibility_timeout=60)[0]
        made.set()
        gc.join(10)
        assert not gc.is_alive()
        assert list_segments(topic.path)[0].base > 0, "the gc deleted nothing"
        new.release(given.receipt)
        with Broker(tmp_path, sync="none") as c:  # a consumer of the channel that has not read it
            again = c.topic("events").channel("new").receive(visibility_timeout=60)[0]
        assert (again.id, again.body, again.receive_count) == (given.id, given.body, 2)


@pytest.mark.parametrize("opened_here", [False, True])
def test_a_gc_of_every_queue_does_not_make_again_a_queue_deleted_as_it_runs(
    store_root: Path | str, monkeypatch: pytest.MonkeyPatch, opened_here: bool
) -> None:
    """``Broker.gc`` lists the queues, then opens each to collect it: one that another process
    deleted in between is left out, not made again (empty) by the opening, in either store."""
    with Broker(store_root, sync="none") as a, Broker(store_root, sync="none") as b:
        (a if opened_here else b).queue("jobs").send(b"x")
        b.queue("kept")
        names = type(a).names

        def deleted_after_listing(self: Any) -> list[str]:
            listed = names(self)
            if self is a:
                b.delete("jobs")  # another process deletes it between the listing and the gc
            return listed

        monkeypatch.setattr(type(a), "names", deleted_after_listing)
        assert a.gc() == {"kept": 0}
        assert "jobs" not in names(b)
        if isinstance(store_root, Path):
            assert not (store_root / "jobs").exists()
        else:
            assert b.client.exists(f"{b.path}/jobs") is None


def _tasks_or_gone(q: Any, ids: list[str]) -> None:
    for id in ids:  # (each in its shard, for a sharded queue)
        try:
            q.task(id)
        except TaskNotFoundError:
            pass


CALLS_BUT_RECEIVE = {
    "send": lambda q, ids: q.send(b"more"),
    "send_many": lambda q, ids: q.send_many([{"body": b"more", "attributes": {"n": 1}}]),
    "stats": lambda q, ids: q.stats(),
    "task": _tasks_or_gone,
    "consumers": lambda q, ids: q.consumers(),
    "set_metadata": lambda q, ids: q.set_metadata(q.send(b"more"), {"n": 1}),
}


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("call", sorted(CALLS_BUT_RECEIVE))
def test_finished_tasks_are_collected_when_no_one_receives(tmp_path: Path, call: str, shards: int) -> None:
    """zkmq: finished tasks are garbage-collected after task_gc_lifetime, every task_gc_interval,
    by producers too. The collection ran on receives alone: a queue that only got sends, or was
    looked at (stats, tasks), kept them for ever."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", task_gc_interval=0.05, task_gc_lifetime=0.1, shards=shards)
        ids = q.send_many([{"body": b"%d" % i, "metadata": {"i": i}} for i in range(3)] + [b"plain"])
        got = q.receive(10)
        assert len(got) == 4 and not any(q.delete_many([m.receipt for m in got]))
        assert q.task(ids[0]).state == "finished"
        for _ in range(6):  # no receive from here on
            time.sleep(0.06)
            CALLS_BUT_RECEIVE[call](q, ids)
        for gone in ids:
            with pytest.raises(TaskNotFoundError):
                q.task(gone)


@pytest.mark.parametrize("shards", [1, 4])
def test_finished_tasks_are_collected_by_receives_that_find_nothing(tmp_path: Path, shards: int) -> None:
    """An idle consumer's polls collect too. A sharded receive passes by the shards it can tell
    are run dry, without their lock (home too): it still collects their channels when due, as
    a receive under their lock would."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", task_gc_interval=0.05, task_gc_lifetime=0.1, shards=shards)
        q.send_many([b"%d" % i for i in range(8)])
        got = q.receive(10)
        assert len(got) == 8 and not any(q.delete_many([m.receipt for m in got]))
        states = [q.state] if shards == 1 else [c.state for c in q._shard_channels if c is not None]
        assert sum(state.cursor for state in states) == 8
        assert [state.collected_below for state in states] == [0] * len(states)
        for _ in range(6):  # receives alone, finding nothing (a task read would collect by itself)
            time.sleep(0.06)
            assert q.receive(10) == []
        # (Plain finished tasks carry no record: a collection forgets those below the cursor
        # that an earlier one noted, task_gc_lifetime before.)
        assert [state.collected_below for state in states] == [state.cursor for state in states]


@pytest.mark.parametrize("shards", [1, 4])
def test_a_topic_that_only_gets_sends_keeps_to_its_retention(
    tmp_path: Path, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic(
            "events", segment_size=SEGMENT, retention_seconds=1, retention_bytes=10**9, task_gc_interval=0.05,
            shards=shards,
        )
        topic.send_many([body(i) for i in range(400)])
        time.sleep(1.1)
        cuts: list[int] = []
        size_cuts = topic_module.size_cuts
        monkeypatch.setattr(topic_module, "size_cuts", lambda *a: cuts.append(1) or size_cuts(*a))
        monkeypatch.setattr("journalq.queue.sharded.size_cuts", topic_module.size_cuts)
        topic.send_many([body(i) for i in range(8)])  # a collection is due: the segments past retention go
        for path in getattr(topic, "shard_paths", [topic.path]):
            assert first_offset(path) > 400 // shards - PER_SEGMENT
        assert cuts == [1]  # retention by size counted once over all the shards, not once per shard


def test_a_collection_that_fails_fails_no_send_or_read_and_is_tried_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sends and reads run the collection when due, but do not depend on it: its failure is
    logged, tried again an interval later, and raised by a receive (as before)."""
    tries: list[float] = []

    def failing(segment: Any) -> int:
        tries.append(time.monotonic())
        raise JournalError("cannot read the last message of a segment", file=segment.path)

    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", task_gc_interval=1.0, segment_size=SEGMENT)
        topic = broker.topic("events", task_gc_interval=1.0, segment_size=SEGMENT)
        for sink in (q, topic):
            sink.send_many([body(i) for i in range(100)])  # segments: the gc reads the oldest's time
        time.sleep(1.01)
        monkeypatch.setattr(topic_module, "last_timestamp", failing)
        for _ in range(5):
            q.send(b"x")
            topic.send(b"y")
            assert q.stats().in_flight == 0
            assert q.task("0").state == "inserted"
        assert len(tries) == 2  # once each, not once a call
        assert sum("garbage collection due failed" in r.getMessage() for r in caplog.records) == 2
        time.sleep(1.01)
        q.send(b"x")
        topic.send(b"y")
        assert len(tries) == 4
        time.sleep(1.01)
        with pytest.raises(JournalError, match="last message"):
            q.receive()  # a receive's own collection raises, as it did


def test_the_oldest_age_is_of_a_message_that_stats_count(tmp_path: Path) -> None:
    """stats' oldest_age was the age of the message at the channel's cursor, even one that a
    receive finishes unseen (past retention) and that stats do not count."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs", retention_seconds=1)
        q.send_many([body(i) for i in range(5)])
        time.sleep(1.1)
        assert (q.stats().available, q.stats().oldest_age) == (0, None)
        fresh = q.send(b"fresh")
        s = q.stats()
        assert s.available == 1 and s.oldest_age is not None and s.oldest_age < 1
        assert [m.id for m in q.receive(10, visibility_timeout=60)] == [fresh]
        s = q.stats()
        assert s.in_flight == 1 and s.oldest_age is not None and s.oldest_age < 1
        # One in flight past retention is counted (in flight): so is its age.
        q.send(b"held")
        assert len(q.receive(visibility_timeout=60)) == 1
        time.sleep(1.1)
        s = q.stats()
        assert s.in_flight == 2 and s.oldest_age is not None and s.oldest_age > 1


@pytest.mark.parametrize("retention", [None, 3600])
def test_the_oldest_age_leaves_out_what_is_for_another_channel(tmp_path: Path, retention: int | None) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", retention_seconds=retention)
        a, b = topic.channel("a"), topic.channel("b")
        topic.send_many([{"body": b"for a", "channel": "a"}])  # (a dead letter redriven to a)
        time.sleep(0.2)
        assert (b.stats().available, b.stats().oldest_age) == (0, None)
        assert a.stats().available == 1 and a.stats().oldest_age >= 0.2
        topic.send(b"both")
        assert b.stats().available == 1 and b.stats().oldest_age < 0.2
        assert b.receive(10)[0].body == b"both"


@pytest.mark.parametrize("no_time", [0, ZERO_TIMESTAMP])
def test_retention_never_deletes_messages_that_have_no_time(tmp_path: Path, no_time: int) -> None:
    """A message with no time (0, or Go's zero time as sej stores it) is never past retention for
    a receive, which delivers it: the topic's gc deleted whole segments of them all the same,
    unread, as if they were older than any retention."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", segment_size=SEGMENT, retention_seconds=1)
        channel = topic.channel("reader")
        with Writer(topic.path, segment_size=SEGMENT, shared=True) as writer:
            for i in range(100):
                writer.append(body(i), timestamp_ns=no_time)
        assert len(list_segments(topic.path)) > 2
        time.sleep(1.1)
        assert topic.gc() == []
        assert drain(channel) == [body(i) for i in range(100)]


def test_a_damaged_queue_does_not_stop_the_gc_of_the_others(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """broker.gc() (and ``journalq queue gc``) raised at the first queue whose settings file is
    damaged, collecting none of the queues listed after it."""
    from click.testing import CliRunner

    from journalq.cli.main import cli

    with Broker(tmp_path, sync="none") as broker:
        broker.queue("a-damaged").send(b"x")
        for name in ("b", "c"):
            q = broker.queue(name, segment_size=SEGMENT)
            q.send_many([body(i) for i in range(200)])
            assert len(drain(q)) == 200
        (tmp_path / "a-damaged" / "queue.json").write_text("{bad")
        broker.forget("a-damaged")
        counts = broker.gc()
        assert sorted(counts) == ["b", "c"] and counts["b"] > 0
        assert any("a-damaged" in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records)
        broker.queue("b").send_many([body(i) for i in range(200)])
        assert len(drain(broker.queue("b"))) == 200
    result = CliRunner().invoke(cli, ["queue", "gc", "--data", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["name"] for row in rows] == ["b", "c"] and rows[0]["deleted_files"] > 0


# -- task collection while an older task is in flight ----------------------------------------------


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


# -- retention by another process ------------------------------------------------------------------


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


@pytest.mark.parametrize("shards", [None, 2])
def test_upkeep_due_says_whether_a_send_would_collect_too(tmp_path: Path, shards: int | None) -> None:
    # The server sends on its event loop only when the send will not collect (a gc, a
    # compaction: milliseconds): upkeep_due must say so for a queue, its topic, a sharded one.
    with Broker(tmp_path) as broker:
        queue = broker.queue("q", task_gc_interval=60.0, **({} if shards is None else {"shards": shards}))
        topic = broker.topic("t", task_gc_interval=60.0)
        assert queue.upkeep_due() and topic.upkeep_due()  # never collected by this process
        queue.send(b"x")
        topic.send(b"x")
        assert not queue.upkeep_due() and not topic.upkeep_due()
        queue.topic._last_gc -= 61  # its topic's gc falls due
        topic._last_gc -= 61
        assert queue.upkeep_due() and topic.upkeep_due()
        queue.send(b"y")
        assert not queue.upkeep_due()
        # (A sharded queue's: a shard's channel opened here, by a receive say; a send opens none.)
        maintained = queue if shards is None else queue._channel(0)
        maintained.state.last_collect -= 61 * 10**9  # its channel's maintenance falls due
        assert queue.upkeep_due()
