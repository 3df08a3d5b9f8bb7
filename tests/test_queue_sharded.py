"""Sharded topics and queues of the broker (``shards`` at creation): routing by group, key, dedup
id or round robin; consumers spread over shards (separate processes, SIGKILL included); ids and
receipts that name their shard; the shards as plain sej journals; reopening; bad input refused;
the command line, the server's create paths and the Spark source."""

from __future__ import annotations

import collections
import itertools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import pytest

from journalq.errors import (
    BusyError,
    CorruptionError,
    InvalidMessageError,
    InvalidNameError,
    InvalidSettingError,
    LockedError,
    QueueNotFoundError,
    ReceiptError,
    StorageError,
    TaskNotFoundError,
)
from journalq.journal.lock import FileLock
from journalq.journal.writer import DeferredSyncs
from journalq.journal import Scanner
from journalq.queue import Broker, Queue, QueueSettings, settings as settings_file, sharded
from journalq.queue.envelope import decode
from journalq.queue.sharded import ShardedQueue, ShardedTopic
from journalq.shard import ShardedScanner, read_layout
from test_queue_dead_letter_moves import broker  # noqa: F401 (fixture)
from test_queue_processes import CONSUMER, spawn


def shard_of(id_or_receipt: str) -> int:
    return int(id_or_receipt.split(".", 1)[0])


def key_of(shard: int, shards: int = 4) -> str:
    """A routing key of ``shard`` (sej's routing: crc32 of the key, masked)."""
    return next(k for k in map(str, range(1000)) if zlib.crc32(k.encode()) & (shards - 1) == shard)


def drain(queue, batch: int = 10) -> list:
    received = []
    while got := queue.receive(batch):
        received.extend(got)
        assert queue.delete_many([m.receipt for m in got]) == [None] * len(got)
    return received


# -- sending, receiving, deleting ----------------------------------------------------------------


def test_send_receive_delete_across_shards(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        assert isinstance(queue, ShardedQueue) and isinstance(broker.topic("orders"), ShardedTopic)
        ids = queue.send_many([b"m%d" % i for i in range(100)])
        # keyless messages go round robin: 25 to each shard
        assert collections.Counter(map(shard_of, ids)) == {0: 25, 1: 25, 2: 25, 3: 25}
        assert len(set(ids)) == 100
        assert queue.stats().available == 100
        received = drain(queue, 7)
        assert sorted(m.body for m in received) == sorted(b"m%d" % i for i in range(100))
        assert {m.id for m in received} == set(ids)
        assert all(shard_of(m.receipt) == shard_of(m.id) for m in received)
        stats = queue.stats()
        assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)
        assert queue.receive(10) == []


def test_routing_by_group_key_and_dedup_id(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=8)

        def expected(route: str) -> int:
            return zlib.crc32(route.encode()) & 7  # sej's hash

        for key in ("alpha", "beta", "gamma", "delta"):
            assert shard_of(queue.send(b"k", key=key)) == expected(key)
            assert shard_of(queue.send(b"k", key=key.encode())) == expected(key)
        # a group id wins over a key: a group stays in one shard
        assert shard_of(queue.send(b"g", group_id="g-1", key="alpha")) == expected("g-1")
        first = queue.send(b"d", dedup_id="once")
        assert shard_of(first) == expected("once")
        assert queue.send(b"d again", dedup_id="once") == first  # the duplicate is caught
        assert queue.send_many([{"body": b"x", "dedup_id": "once"}, {"body": b"y", "dedup_id": "twice"}])[0] == first
        with pytest.raises(InvalidMessageError, match="key must be bytes or a string"):
            queue.send(b"bad", key=12)


def test_content_based_dedup_routes_by_the_body_digest(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, content_based_dedup=True)
        ids = [queue.send(b"same body") for _ in range(5)]
        assert len(set(ids)) == 1
        assert queue.stats().available == 1


def test_a_bad_message_in_a_batch_stores_nothing(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        with pytest.raises(InvalidMessageError, match="body must be bytes"):
            queue.send_many([b"a", b"b", b"c", {"body": "not bytes"}])
        assert queue.stats().available == 0


@pytest.mark.parametrize("metadata", [{"x": float("nan")}, {"x": object()}, {1j: 1}])
def test_a_sharded_batch_with_metadata_that_is_no_json_stores_nothing(broker: Broker, metadata: object) -> None:
    """Every message of a sharded batch is checked before any shard's part is written: metadata
    that cannot be stored as JSON was found only when its shard's part was encoded, after the
    parts of other shards were stored (a PartialSendError for bad input)."""
    queue = broker.queue("orders", shards=4)
    items = [{"body": b"%d" % i, "key": b"k%d" % i} for i in range(8)]
    items.append({"body": b"bad", "key": b"k7", "metadata": metadata})  # the last shard written
    with pytest.raises(InvalidMessageError, match="JSON") as caught:
        queue.send_many(items)
    assert type(caught.value) is InvalidMessageError
    assert queue.stats().available == 0


def test_a_batch_cut_short_in_its_second_shard_says_which_messages_are_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from journalq.errors import PartialSendError, PartialStorageError, StorageError

    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("orders", shards=4)
        items = [{"body": b"%d" % i, "key": f"k{i}"} for i in range(12)]
        shards = [zlib.crc32(item["key"].encode()) & 3 for item in items]
        first, second = list(dict.fromkeys(shards))[:2]  # the order the shards' parts are written

        def full(batch: list) -> list:
            raise StorageError("disk full", errno=28, file=q.topic.shards[second].path)

        monkeypatch.setattr(q.topic.shards[second], "send_many", full)
        with pytest.raises(
            PartialSendError, match=r"of the 12 messages of the batch stored, not those at positions .*: disk full"
        ) as failed:
            q.send_many(items)
        error = failed.value
        assert isinstance(error, PartialStorageError) and isinstance(error, StorageError) and error.errno == 28
        assert error.unsent == [i for i, shard in enumerate(shards) if shard != first]
        assert all(
            error.ids[i] is not None and shard_of(error.ids[i]) == first for i in range(12) if shards[i] == first
        )
        got = drain(q)
        assert sorted((m.id, m.body) for m in got) == sorted(
            (error.ids[i], items[i]["body"]) for i in range(12) if shards[i] == first
        )
        # The first shard's part failing stores nothing: its own error, not a partial one.
        monkeypatch.setattr(q.topic.shards[first], "send_many", full)
        with pytest.raises(StorageError) as failed:
            q.send_many(items)
        assert not isinstance(failed.value, PartialSendError)
        monkeypatch.undo()
        q.send_many([items[i] for i in error.unsent])  # the retry that the error makes possible
        assert sorted(m.body for m in got + drain(q)) == sorted(item["body"] for item in items)


def test_order_holds_within_a_shard(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        for i in range(200):
            queue.send(b"%s:%d" % (b"abcdefgh"[i % 8 : i % 8 + 1], i), key=f"customer-{i % 8}")
        received = drain(queue, 3)
        by_key: dict[bytes, list[int]] = collections.defaultdict(list)
        by_shard: dict[int, list[int]] = collections.defaultdict(list)
        for m in received:
            key, number = m.body.split(b":")
            by_key[key].append(int(number))
            by_shard[shard_of(m.id)].append(m.offset)
        assert len(received) == 200
        assert all(numbers == sorted(numbers) for numbers in by_key.values())
        assert all(offsets == sorted(offsets) for offsets in by_shard.values())


def test_fifo_groups_keep_their_order(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, fifo=True)
        for i in range(30):
            queue.send(b"%d" % i, group_id=f"g{i % 3}")
        seen: dict[str, list[int]] = collections.defaultdict(list)
        while got := queue.receive(10):
            # A group's messages come together, in order; none of a group in flight goes out again.
            others = queue.receive(10)
            assert not {m.group_id for m in others} & {m.group_id for m in got}
            got += others
            for m in got:
                seen[m.group_id].append(int(m.body))
            queue.delete_many([m.receipt for m in got])
        assert seen == {f"g{g}": list(range(g, 30, 3)) for g in range(3)}


def test_consumers_spread_over_shards_and_stay_where_there_is_work(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("orders", shards=4)
        for i in range(40):
            topic.send(b"%d" % i)
        consumers = [topic.channel("work")] + [
            Broker(tmp_path, sync="none").topic("orders").channel("work") for _ in range(3)
        ]
        try:
            assert sorted(c.home for c in consumers) == [0, 1, 2, 3]  # each claims a shard of its own
            for consumer in consumers:
                got = consumer.receive(5)
                assert {shard_of(m.id) for m in got} == {consumer.home}
        finally:
            for consumer in consumers[1:]:
                consumer.topic.broker.close()
        # a consumer that closes lets its home shard go
        gone = consumers[1].home
        consumers[1].topic.broker.close()
        with Broker(tmp_path, sync="none") as later:
            assert later.topic("orders").channel("work").home == gone
        # a consumer whose shard runs dry moves on, and a receive is empty only when all are
        lone = consumers[0]
        received = []
        while got := lone.receive(10):
            received.extend(got)
            lone.delete_many([m.receipt for m in got])
        assert len(received) == 40 - 4 * 5  # the first five of each consumer are in flight


def test_consumers_whose_homes_run_dry_go_to_shards_no_one_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two consumers on four shards: one whose home runs dry goes on to a shard that neither the
    other's home nor its visit is, while there is one; before, it went to the shard after its
    home, the other's, and both waited for each other's hold there, shards no one worked
    waiting. A visit holds the shard's visit lock, so a consumer that comes later goes elsewhere
    while it can, and takes the visited shard as its home when no other is left (with one lock
    for both, the fourth of four consumers was left without a home); back home, a consumer lets
    go of its visit."""
    monkeypatch.setattr(sharded, "_instances", itertools.count(-os.getpid() % 4))  # homes 0, 1
    with Broker(tmp_path, sync="none") as first, Broker(tmp_path, sync="none") as second:
        topic = first.topic("jobs", shards=4)
        topic.send_many([b"%d" % i for i in range(40)])  # round robin: ten in each shard
        a, b = topic.channel("work"), second.topic("jobs").channel("work")
        assert (a.home, b.home) == (0, 1)
        assert {shard_of(m.id) for m in drain_once(a)} == {0}
        assert {shard_of(m.id) for m in drain_once(a)} == {2}  # not 1, b's home, which has work
        with pytest.raises(LockedError):
            FileLock(topic.path / "consumers" / "work.2.visit.lck").acquire(wait=False)
        with Broker(tmp_path, sync="none") as third:  # a consumer that comes now: the shard no one holds
            assert third.topic("jobs").channel("work").home == 3
            with Broker(tmp_path, sync="none") as fourth:  # none left: the visited one is still a home
                assert fourth.topic("jobs").channel("work").home == 2
        assert {shard_of(m.id) for m in drain_once(b)} == {1}
        assert {shard_of(m.id) for m in drain_once(b)} == {3}
        later = topic.send_many([{"body": b"home", "key": key_of(0)}])
        assert [m.id for m in drain_once(a)] == later  # home again: the visit let go
        with FileLock(topic.path / "consumers" / "work.2.visit.lck"):
            pass


def drain_once(queue, batch: int = 10) -> list:
    """One receive of ``batch``, deleted."""
    got = queue.receive(batch)
    assert queue.delete_many([m.receipt for m in got]) == [None] * len(got)
    return got


def test_a_consumer_passes_a_shard_run_dry_without_opening_its_channel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a shard's channel replays its state journal: a consumer whose home runs dry looks
    first at the cursor that the shard's consumers publish when they run it dry, and goes in
    only when the shard has more than that (new messages, or messages in flight that may come
    back)."""
    with Broker(tmp_path, sync="none") as first, Broker(tmp_path, sync="none") as second:
        topic = first.topic("jobs", shards=2)
        keys = {index: key_of(index, shards=2) for index in (0, 1)}
        # A consumer opens the channel of the shard it starts at, picked by its pid: b at 1, a at 0.
        monkeypatch.setattr(sharded, "_instances", itertools.count((1 - os.getpid()) % 2))
        b = second.topic("jobs").channel("work")
        a = topic.channel("work")
        assert (b.home, a.home) == (1, 0) and b._shard_channels[0] is None and a._shard_channels[1] is None
        topic.send_many([{"body": b"%d" % i, "key": keys[1]} for i in range(5)])
        assert len(drain(b)) == 5  # its last receive found shard 1 dry, and shard 0 empty
        assert b._shard_channels[0] is None
        for _ in range(2):  # (the second time from what the first found: no more appended)
            assert a.receive(10) == [] and a._shard_channels[1] is None  # passed by, not opened
        (late,) = topic.send_many([{"body": b"late", "key": keys[1]}])
        (got,) = a.receive(10, visibility_timeout=0.2)  # shard 1 has more than its cursor says
        assert got.id == late and a._shard_channels[1] is not None
        assert b.receive(10) == []  # in flight
        time.sleep(0.3)
        (again,) = b.receive(10)  # back in shard 1 after its visibility
        assert again.id == late and again.receive_count == 2
        b.delete(again.receipt)
        assert b.receive(10) == [] and a.receive(10) == []


def test_a_consumer_opens_no_shard_channel_but_its_home_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a shard's channel replays its state journal: a sharded channel opens none when
    made (a producer needs none), and its first receive opens its home's only, even when the
    shard its pid picked is another consumer's home."""
    with Broker(tmp_path, sync="none") as first, Broker(tmp_path, sync="none") as second:
        topic = first.topic("jobs", shards=4)
        topic.send_many([b"%d" % i for i in range(8)])
        monkeypatch.setattr(sharded, "_instances", itertools.count((2 - os.getpid()) % 4))
        a = topic.channel("work")
        assert a._shard_channels == [None] * 4 and a.home == 2
        monkeypatch.setattr(sharded, "_instances", itertools.count((2 - os.getpid()) % 4))
        b = second.topic("jobs").channel("work")  # picked 2 too: its home is the next free one
        assert b._shard_channels == [None] * 4
        got = b.receive(1)
        assert b.home == 3 and [c is not None for c in b._shard_channels] == [False, False, False, True]
        assert got and got[0].id.startswith("3.")
        assert {c.consumer_id for c in b._shard_channels if c is not None} == {b.consumer_id}


def test_an_event_loops_call_that_would_open_a_shards_channel_is_busy_with_nothing_done(tmp_path: Path) -> None:
    """Opening a shard's channel replays its state journal (for hundreds of ms at a deep backlog):
    in a ``DeferredSyncs(wait=False)`` block that did nothing yet (the server's event loop), a
    receive or a delete that would open one raises ``BusyError``, having taken or deleted
    nothing; the same call outside the block (the server's thread) opens it. Once a call did
    something, it opens what it needs where it is (its change cannot be taken back)."""
    with Broker(tmp_path, sync="always") as broker, Broker(tmp_path, sync="none") as other:
        queue = broker.queue("jobs", shards=2)
        ids = queue.send_many([b"%d" % i for i in range(4)])  # (two a shard: round robin)
        with DeferredSyncs(wait=False):
            with pytest.raises(BusyError, match="opening shard .'s channel could take long"):
                queue.receive(10)
        assert queue._shard_channels == [None, None]
        assert other.queue("jobs").stats().available == 4
        (first,) = queue.receive(1)  # outside: opens its home's
        home = shard_of(first.id)
        assert [c is not None for c in queue._shard_channels] == [i == home for i in range(2)]
        with DeferredSyncs(wait=False) as syncs:
            rest = queue.receive(10)  # its home's first: then it opens the other shard's
        syncs.sync()
        assert sorted(m.id for m in [first, *rest]) == sorted(ids)
        # Receipts of a shard whose channel this process has not opened: another's.
        theirs = other.queue("jobs", create=False)
        theirs.change_visibility_many([(m.receipt, 0) for m in [first, *rest]])
        got = theirs.receive(10)
        fresh = Broker(tmp_path, sync="always")
        try:
            mine = fresh.queue("jobs", create=False)
            with DeferredSyncs(wait=False):
                with pytest.raises(BusyError, match="opening shard"):
                    mine.delete_many([m.receipt for m in got])
            assert other.queue("jobs").stats().in_flight == 4
            assert mine.delete_many([m.receipt for m in got]) == [None] * 4
        finally:
            fresh.close()
        assert other.queue("jobs").stats().in_flight == 0 and theirs.receive(10) == []


def test_a_process_under_the_usual_open_files_limit_uses_every_shard(tmp_path: Path) -> None:
    """Each shard's writer holds five files, and a consumer's channel of it ~11: under a soft
    limit on open files of 256 (1,024, the usual one, is met at 128 shards), a process ran out of
    descriptors (EMFILE) while sending to a 32-shard queue and draining it, or appending to a
    64-shard journal and scanning it. Opening one raises the soft limit as far as the hard one
    lets it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit on open files is {hard}: no room above the soft one to test")
    script = textwrap.dedent(
        f"""
        import resource
        from journalq.queue import Broker
        from journalq.shard import ShardedScanner, ShardedWriter
        with Broker({str(tmp_path / "data")!r}, sync="none") as broker:
            queue = broker.queue("jobs", shards=32)
            queue.send_many([b"%d" % i for i in range(64)])
            got = 0
            while batch := queue.receive(10):
                queue.delete_many([m.receipt for m in batch])
                got += len(batch)
            assert got == 64, got
        with ShardedWriter({str(tmp_path / "events")!r}, prefix="events", bit=6) as writer:
            for i in range(128):
                writer.append(b"e%d" % i, key=b"k%d" % i)
            with ShardedScanner({str(tmp_path / "events")!r}, prefix="events") as scanner:
                assert len(list(scanner)) == 128
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 256
    assert len(os.listdir(tmp_path / "events")) == len({zlib.crc32(b"k%d" % i) & 63 for i in range(128)})


def test_every_channel_of_a_sharded_topic_gets_every_message(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", shards=2)
        billing, audit = topic.channel("billing"), topic.channel("audit")
        sent = topic.send_many([b"%d" % i for i in range(10)])
        assert topic.channel_names() == ["audit", "billing"]
        for channel in (billing, audit):
            assert sorted(m.id for m in drain(channel)) == sorted(sent)
        assert topic.gc() == [] and broker.names() == ["events"]


def test_gc_keeps_what_a_channel_has_not_read_in_shards_it_has_not_opened_yet(tmp_path: Path) -> None:
    """A channel opens its shards' channels as it uses them; a shard it has not used yet must
    still count it as a channel with nothing read, or its gc deletes what the channel never got."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", shards=2, segment_size=4096)
        fast, slow = topic.channel("fast"), topic.channel("slow")
        sent = topic.send_many([b"%03d" % i + b"." * 100 for i in range(600)])
        assert len(drain(fast, 50)) == 600
        topic.gc()  # slow has read nothing yet, in either shard
        assert sorted(m.id for m in drain(slow, 50)) == sorted(sent)
        slow.commit_cursor()
        assert topic.gc()  # once both are done
        with pytest.raises(InvalidNameError):
            topic.channel("../../escape")  # refused before any shard gets a directory for it
        assert not (tmp_path / "escape").exists()
        assert sorted(os.listdir(tmp_path / "events.1.000" / "channels")) == ["fast", "slow"]


def test_a_damaged_shard_does_not_hide_the_messages_of_the_others(tmp_path: Path) -> None:
    """A receive that took messages from a healthy shard returns them when a later shard fails;
    the failure is raised once no other shard has anything to give."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", shards=2)
        keys = {index: key_of(index, shards=2) for index in (0, 1)}
        healthy = queue.send_many([{"body": b"h%d" % i, "key": keys[0]} for i in range(4)])
        queue.send_many([{"body": b"d%d" % i, "key": keys[1]} for i in range(4)])
        segment = next((tmp_path / "jobs.1.001" / "jnl").glob("*.jnl"))
        with open(segment, "r+b") as f:
            f.write(b"\xff" * 40)  # the first message of shard 1 is damaged
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", create=False)
        (queue.topic.path / "consumers").mkdir(exist_ok=True)
        with FileLock(queue.topic.path / "consumers" / "default.1.lck") as other:
            other.acquire(wait=False)  # another consumer's home: this one's is the healthy shard
            assert queue.home == 0
        got = queue.receive(10, visibility_timeout=30)
        assert sorted(m.id for m in got) == sorted(healthy)
        assert queue.delete_many([m.receipt for m in got]) == [None] * 4
        with pytest.raises(CorruptionError, match="jobs.1.001"):
            queue.receive(10)
        assert queue.shard_stats()["jobs.1.000"].in_flight == 0


def test_a_receive_whose_deletes_fail_raises_even_when_other_shards_have_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``receive(delete=...)`` returns only once its deletes are stored: when the shard that
    deletes them fails, the receive raises, whatever the other shards have to give."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", shards=2)
        keys = {index: key_of(index, shards=2) for index in (0, 1)}
        queue.send_many([{"body": b"%d.%d" % (index, i), "key": keys[index]} for index in (0, 1) for i in range(3)])
        got = queue.receive(10, visibility_timeout=30)
        held = [m for m in got if shard_of(m.id) == 1]
        assert len(held) == 3
        queue.change_visibility_many([(m.receipt, 0) for m in got if shard_of(m.id) == 0])  # shard 0 has work
        failing = queue._channel(1)

        def refuse(*args: object, **kwargs: object) -> object:
            raise StorageError("no space left on device", file=failing.path)

        monkeypatch.setattr(failing, "_receive_now", refuse)
        with pytest.raises(StorageError):
            queue.receive(10, delete=[m.receipt for m in held])


def test_long_poll_wakes_on_any_shard(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        start = queue.home
        other = next(k for k in map(str, range(100)) if zlib.crc32(k.encode()) & 3 != start)
        timer = threading.Timer(0.3, lambda: Broker(tmp_path, sync="none").queue("orders").send(b"late", key=other))
        timer.start()
        started = time.monotonic()
        got = queue.receive(1, wait=10)
        timer.join()
        assert [m.body for m in got] == [b"late"] and shard_of(got[0].id) != start
        assert queue.shard == shard_of(got[0].id) and queue.home == start
        assert time.monotonic() - started < 10


def test_a_receive_passes_by_its_home_run_dry_without_taking_its_lock(tmp_path: Path) -> None:
    """A consumer whose home shard has nothing left (all finished, none in flight) takes from the
    others without looking into home under its lock at every receive; a message sent there since
    is seen at the next receive, and one in flight there keeps home looked into (it may come
    back)."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        home = queue.home
        keys = {zlib.crc32(k.encode()) & 3: k for k in map(str, range(100))}
        queue.send(b"home", key=keys[home])
        other = (home + 1) % 4
        for i in range(6):
            queue.send(b"other %d" % i, key=keys[other])
        (first,) = queue.receive(1)
        assert first.body == b"home"
        queue.delete(first.receipt)
        looked: list[int] = []
        channel = queue._channel(home)
        real = channel._receive_now
        channel._receive_now = lambda *args: looked.append(1) or real(*args)  # type: ignore[method-assign]
        # (The first may look once: home's look-ahead still held the message it delivered.)
        assert [m.body for m in queue.receive(2)] == [b"other 0", b"other 1"]
        looked.clear()
        assert [m.body for m in queue.receive(2)] == [b"other 2", b"other 3"]
        assert [m.body for m in queue.receive(1)] == [b"other 4"]
        assert looked == []
        queue.send(b"home again", key=keys[home])
        assert [m.body for m in queue.receive(1)] == [b"home again"]
        assert [m.body for m in queue.receive(1)] == [b"other 5"]  # home's in flight: looked into
        assert len(looked) == 2


def test_a_long_poll_opens_no_shard_channel_to_watch_and_wakes_on_a_release_in_one(tmp_path: Path) -> None:
    """A long poll watches every shard and every shard's channel state, by path: it opens no
    shard's channel for that (each would replay its state: with 1,024 shards, a second of CPU
    and thousands of files held). A release by another process's consumer, in a shard whose
    channel this one has not opened, wakes it."""
    with Broker(tmp_path, sync="none") as broker, Broker(tmp_path, sync="none") as elsewhere:
        queue = broker.queue("orders", shards=4)
        home = queue.home
        key = next(k for k in map(str, range(100)) if zlib.crc32(k.encode()) & 3 != home)
        sent = queue.send(b"held", key=key)
        (held,) = elsewhere.queue("orders").receive(1, visibility_timeout=60)
        assert held.id == sent
        timer = threading.Timer(0.3, lambda: elsewhere.queue("orders").release(held.receipt))
        timer.start()
        started = time.monotonic()
        got = queue.receive(1, wait=10)
        timer.join()
        assert [(m.id, m.receive_count) for m in got] == [(sent, 2)]
        assert time.monotonic() - started < 5
        opened = {i for i, c in enumerate(queue._shard_channels) if c is not None}
        # The one holding a message in flight, looked into; not home, which had nothing to give
        # (a receive passes by a shard run dry, home too, without opening its channel).
        assert opened == {shard_of(sent)}


def test_long_poll_wakes_when_a_hidden_message_comes_back(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        sent = queue.send(b"again", key="somewhere")
        assert [m.id for m in queue.receive(1, visibility_timeout=0.5)] == [sent]
        got = queue.receive(1, wait=10)  # no file changes when the visibility ends
        assert [(m.id, m.receive_count) for m in got] == [(sent, 2)]


def test_visibility_release_and_change_go_to_the_right_shard(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, visibility_timeout=60)
        queue.send_many([b"%d" % i for i in range(8)])
        first = queue.receive(8)
        assert len(first) == 8  # a receive fills up from the other shards
        assert queue.receive(8) == []
        queue.release(first[0].receipt)
        queue.change_visibility(first[1].receipt, 0)
        assert queue.change_visibility_many([(first[2].receipt, 0), (first[3].receipt, 30)]) == [None, None]
        with pytest.raises(InvalidSettingError, match="visibility timeout"):  # checked before any change
            queue.change_visibility_many([(first[4].receipt, 0), (first[5].receipt, -1)])
        again = []
        while got := queue.receive(8):
            again.extend(got)
        assert sorted(m.body for m in again) == sorted(m.body for m in first[:3])
        assert all(m.receive_count == 2 for m in again)
        with pytest.raises(ReceiptError, match=repr(first[0].receipt)):
            queue.delete(first[0].receipt)  # delivered again since: the old receipt is over


def test_a_receive_refused_for_a_stale_receipt_takes_no_message(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=2, visibility_timeout=60, dead_letter_queue="dlq", max_receive_count=1)
        queue.send_many(
            [{"body": b"a%d" % i, "key": "a"} for i in range(3)] + [{"body": b"d%d" % i, "key": "d"} for i in range(3)]
        )
        batch = queue.receive(6)
        by_shard = {shard_of(m.receipt): m for m in batch}
        assert len(by_shard) == 2
        queue.send_many([{"body": b"later-a", "key": "a"}, {"body": b"later-d", "key": "d"}])
        stale = by_shard[1].receipt
        queue.delete(stale)
        # Shard 0's receipt is good, shard 1's is stale: whichever shard is asked first, the
        # refused receive must not take (and hide, and count) messages it never returns.
        with pytest.raises(ReceiptError, match=re.escape(repr(stale))) as refused:
            queue.receive(10, delete=[by_shard[0].receipt, stale])
        # The message is named by its id as this queue gives it ("1.5"), not its offset in the shard.
        assert f"message {by_shard[1].id} is no longer in flight" in str(refused.value)
        assert sorted(m.body for m in queue.receive(10)) == [b"later-a", b"later-d"]


def test_two_processes_creating_one_topic_with_other_shard_counts_cannot_split_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from journalq.queue import sharded

    check_new = sharded.check_new
    sent: list[str] = []

    def meanwhile(root: Path, name: str, settings: QueueSettings) -> None:
        check_new(root, name, settings)
        if settings.shards == 4 and not sent:  # another process creates it with 2 shards and sends
            with Broker(tmp_path, sync="none") as other:
                sent.append(other.queue("orders", shards=2).send(b"first"))

    monkeypatch.setattr(sharded, "check_new", meanwhile)
    with Broker(tmp_path, sync="none") as broker:
        # Both found no topic; the first to store its settings made it: the other's count is refused.
        with pytest.raises(InvalidSettingError, match="fixed when a topic is created"):
            broker.queue("orders", shards=4)
        assert settings_file.load(tmp_path / "orders").shards == 2
        assert not list(tmp_path.glob("orders.2.*"))
        assert [m.body for m in broker.queue("orders").receive(10)] == [b"first"]


def test_the_consumer_loop_deletes_in_every_shard_with_its_next_receive(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, visibility_timeout=60)
        queue.send_many([b"%d" % i for i in range(40)])
        first = queue.receive(10)
        assert len({shard_of(m.receipt) for m in first}) >= 1
        with pytest.raises(ReceiptError, match="is not one of this sharded queue's"):
            queue.receive(10, delete=[first[0].receipt, "9." + first[1].receipt])  # no shard 9: nothing done
        bodies = [m.body for m in first]
        receipts = [m.receipt for m in first]
        while got := queue.receive(10, delete=receipts):
            bodies += [m.body for m in got]
            receipts = [m.receipt for m in got]
        queue.delete_many(receipts)  # the last round's (none: the loop ended on an empty receive)
        assert sorted(bodies) == sorted(b"%d" % i for i in range(40))
        assert queue.stats().available == 0 and queue.stats().in_flight == 0
        spread = queue.receive(1, delete=[])  # nothing left
        assert spread == []
        # Receipts from several shards at once, one of them stale: refused at its shard, by the
        # receipt the caller gave.
        queue.send_many([b"x%d" % i for i in range(8)])
        batch = queue.receive(8)
        assert len({shard_of(m.receipt) for m in batch}) > 1
        queue.delete(batch[-1].receipt)
        with pytest.raises(ReceiptError, match=re.escape(repr(batch[-1].receipt))):
            queue.receive(1, delete=[m.receipt for m in batch])


# -- bad settings, names and receipts ----------------------------------------------------------------


@pytest.mark.parametrize("shards", [0, 3, 6, 2048, -4, True, "4", 2.0])
def test_bad_shard_counts_are_refused(tmp_path: Path, shards: object) -> None:
    with Broker(tmp_path, sync="none") as broker:
        with pytest.raises(InvalidSettingError, match="shards .* power of two from 1 .* to 1024"):
            broker.queue("orders", shards=shards)
        assert not broker.exists("orders") and os.listdir(tmp_path) == []


def test_names_that_could_collide_are_refused(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        with pytest.raises(InvalidNameError, match="prefix of its shard directories"):
            broker.queue("my.orders", shards=4)
        broker.queue("orders", shards=4)
        for name in ("orders.2.001", "orders.1.000", "x.a.3ff", "2.001"):
            with pytest.raises(InvalidNameError, match="kept for shards"):
                broker.queue(name)
        assert broker.names() == ["orders"]
        assert not broker.exists("orders.2.001")
        # shards left by another shard count are not taken over
        (tmp_path / "stale.1.000" / "jnl").mkdir(parents=True)
        with pytest.raises(InvalidSettingError, match="stale.1.000"):
            broker.queue("stale", shards=4)
        assert not broker.exists("stale")
        (tmp_path / "raw" / "jnl").mkdir(parents=True)  # a plain journal cannot become a sharded topic
        with pytest.raises(InvalidSettingError, match="is a journal already"):
            broker.queue("raw", shards=2)


def test_the_shard_count_is_fixed_at_creation(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        sharded = broker.queue("orders", shards=4)
        plain = broker.queue("plain")
        with pytest.raises(InvalidSettingError, match="fixed when a topic is created"):
            sharded.configure(shards=8)
        with pytest.raises(InvalidSettingError, match="fixed when a topic is created"):
            broker.queue("plain", shards=2)
        assert isinstance(plain, Queue) and broker.queue("orders", shards=4) is sharded
        sharded.configure(visibility_timeout=5)  # other settings change as ever, on every shard
        assert all(shard.settings.visibility_timeout == 5 for shard in sharded.topic.shards)


def test_bad_receipts_and_ids_get_clear_errors(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        other = broker.queue("others", shards=4)
        plain = broker.queue("plain")
        for q in (queue, other, plain):
            q.send_many([b"a", b"b", b"c", b"d"])
        mine = queue.receive(1)[0]
        theirs = other.receive(1)[0]
        unsharded = plain.receive(1)[0]
        index, inner = mine.receipt.split(".", 1)
        wrong_shard = f"{(int(index) + 1) % 4}.{inner}"
        cases = {
            "garbage": "not one of this sharded queue's",
            "9.1.1.abcdef12": "SHARD from 0 to 3",
            unsharded.receipt: "not a receipt of this queue",
            theirs.receipt: "belongs to another queue",
            wrong_shard: "belongs to another queue",
        }
        outcomes = queue.delete_many(list(cases))
        for (receipt, needle), error in zip(cases.items(), outcomes):
            assert isinstance(error, ReceiptError) and needle in str(error), (receipt, error)
            assert repr(receipt) in str(error)
        for call in (lambda r: queue.delete(r), lambda r: queue.release(r), lambda r: queue.change_visibility(r, 1)):
            with pytest.raises(ReceiptError, match="not one of this sharded queue's"):
                call(12)
        assert queue.delete_many([mine.receipt, mine.receipt])[1] is not None  # given twice
        with pytest.raises(ReceiptError):
            queue.delete(mine.receipt)  # finished already
        with pytest.raises(ReceiptError):
            plain.delete(mine.receipt)  # a sharded receipt on a plain queue
        # One spelling per shard (ASCII digits, no sign, space or leading zero), and no number so
        # long that reading it fails otherwise.
        for bad in ("12", "7.0", "x.1", "", "01.0", "1.", "\u0663.0", "+1.0", " 1.0", "1" * 5000 + ".0"):
            with pytest.raises(InvalidMessageError, match="message id"):
                queue.task(bad)


def test_a_consumer_loop_deletes_receipts_of_several_shards_remembered_or_not(tmp_path: Path) -> None:
    """``receive(delete=...)`` finds each receipt's shard whether or not the consumer still
    remembers giving it out (that memory is only a cache), several shards in one call; a receipt
    that is no string refuses the call and changes nothing."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        queue.send_many([{"body": b"%d" % i, "key": str(i)} for i in range(40)])
        got = []
        while batch := queue.receive(10):
            got += batch
        shards = {m.receipt.split(".", 1)[0] for m in got}
        assert len(got) == 40 and len(shards) == 4
        receipts = [m.receipt for m in got]
        queue._issued.clear()  # the first half forgotten: read from the receipts
        queue.receive(1, delete=receipts[:20])
        assert queue.stats().in_flight == 20
        with pytest.raises(ReceiptError, match="not one of this sharded queue's"):
            queue.receive(1, delete=[*receipts[20:30], ["not", "a", "receipt"]])  # type: ignore[list-item]
        assert queue.stats().in_flight == 20
        assert queue.receive(1, delete=receipts[20:]) == []
        assert queue.stats().in_flight == queue.stats().available == 0


# -- tasks, filters, metadata, dead letters, purge ---------------------------------------------------


def test_tasks_filters_metadata_and_purge(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, enums={"size": ["small", "large"]})
        small = queue.send(b"s", filters={"size": "small"}, metadata={"step": 1}, key="a")
        large = queue.send(b"l", filters={"size": "large"}, key="b")
        assert queue.task(small).state == "inserted" and queue.task(small).id == small
        queue.set_metadata(small, {"step": 2})
        got = queue.receive(10, filters={"size": "large"})
        assert [m.id for m in got] == [large]
        assert queue.task(large).state == "claimed" and queue.task(large).consumer == queue.consumer_id
        assert queue.consumers() == {queue.consumer_id: [large]}
        got = queue.receive(10)
        assert [(m.id, m.metadata) for m in got] == [(small, {"step": 2})]
        queue.delete(got[0].receipt)
        assert queue.task(small).state == "finished"
        queue.delete_id(large)
        assert queue.task(large).state == "finished"
        queue.send_many([b"%d" % i for i in range(20)])
        queue.purge()
        assert queue.stats().available == 0 and queue.receive(10) == []


def test_delete_ids_sends_each_id_to_its_shard(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        ids = [queue.send(b"%d" % i, key=str(i)) for i in range(8)]
        assert len({id.split(".")[0] for id in ids}) > 1  # over several shards
        outcomes = queue.delete_ids([*ids[:4], "9.1", ids[0], "0.x"])
        assert outcomes[:4] == [None] * 4
        assert "is not one of this sharded queue's" in str(outcomes[4])  # no shard 9
        assert isinstance(outcomes[5], TaskNotFoundError)  # given twice
        assert "is not one of this queue's ids" in str(outcomes[6])
        assert sorted(m.body for m in queue.receive(10)) == [b"4", b"5", b"6", b"7"]


@pytest.mark.parametrize("operation", ["delete_ids", "delete_many", "change_visibility_many"])
def test_a_batch_in_a_shard_that_fails_tells_each_item_how_it_fared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """A shard whose step fails for the storage changed none of its items, and each of them gets
    that error; the other shards' steps are stored, so the caller makes again just those (a
    delete told "failed" that was stored would be refused the second time). When no shard's
    step is stored, the error raises, as an unsharded queue's."""
    from journalq.queue.channel import Channel

    real = getattr(Channel, operation)
    failing: set[str] = set()

    def step(self: Channel, *args: object, **kwargs: object) -> list:
        if self.receipt_prefix in failing:
            raise StorageError("no space left", file=self.path)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Channel, operation, step)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        ids = [queue.send(b"%d" % i, key=str(i)) for i in range(16)]
        receipts = {m.id: m.receipt for m in queue.receive(16, visibility_timeout=60)}
        assert sorted(receipts) == sorted(ids)
        items: dict[str, object] = {
            "delete_ids": dict(zip(ids, ids)),
            "delete_many": receipts,
            "change_visibility_many": {id: (receipt, 0) for id, receipt in receipts.items()},
        }[operation]
        act = getattr(queue, operation)
        shards = sorted({id.split(".")[0] for id in ids})
        assert len(shards) > 2
        failing.add(f"{shards[1]}.")
        outcomes = act([items[id] for id in ids])
        failed = [id for id, outcome in zip(ids, outcomes) if outcome is not None]
        assert failed and {id.split(".")[0] for id in failed} == {shards[1]}
        assert all(isinstance(outcome, StorageError) for outcome in outcomes if outcome is not None)
        if operation == "change_visibility_many":  # the others' messages are back, the failed hidden
            assert sorted(m.id for m in queue.receive(16)) == sorted(set(ids) - set(failed))
        else:
            assert [queue.task(id).state for id in ids] == ["claimed" if id in failed else "finished" for id in ids]
        failing.update(f"{shard}." for shard in shards)
        with pytest.raises(StorageError, match="no space left"):
            act([items[id] for id in failed])
        failing.clear()
        assert act([items[id] for id in failed]) == [None] * len(failed)
        if operation != "change_visibility_many":
            assert queue.stats().in_flight == queue.stats().available == 0


def test_dead_letters_and_redrive(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("dead", shards=2)
        queue = broker.queue("orders", shards=4, max_receive_count=1, dead_letter_queue="dead")
        ids = queue.send_many([b"%d" % i for i in range(8)])
        first = []
        while got := queue.receive(10, visibility_timeout=0):
            first.extend(got)
            if len(first) >= 8:
                break
        assert queue.receive(10) == []  # each went out once: the next receive moves it
        assert queue.stats().dead == 8
        dead = broker.queue("dead", create=False)
        letters = drain_without_delete(dead)
        assert sorted(m.body for m in letters) == sorted(b"%d" % i for i in range(8))
        assert {m.source["queue"] for m in letters} == {"orders"}
        for m in letters:
            dead.release(m.receipt)
        assert dead.redrive() == 8
        assert sorted(m.body for m in drain(queue)) == sorted(b"%d" % i for i in range(8))
        assert len(ids) == 8


def test_a_redrive_whose_delete_fails_in_a_shard_raises_and_a_second_one_moves_each_letter_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redrive sends the dead letters back, then deletes them from the dead-letter queue: when
    that delete fails in one shard (the others' stored), it raises, and the failed shard's letters
    stay. A redrive made again moves them, and the queue gets each message once (a letter sent
    back twice is a duplicate of its redrive's own deduplication id)."""
    from journalq.queue import workqueue
    from journalq.queue.channel import Channel

    real = Channel.delete_many
    failing: set[str] = set()

    def delete_many(self: Channel, receipts: list[str]) -> list:
        if self.receipt_prefix in failing:
            raise StorageError("no space left", file=self.path)
        return real(self, receipts)

    monkeypatch.setattr(Channel, "delete_many", delete_many)
    # What a failed redrive held comes back in a second, not after its minute (within that
    # second, a redrive that went on past the failure would find nothing more and return 16).
    monkeypatch.setattr(workqueue, "_REDRIVE_VISIBILITY", 1.0)
    with Broker(tmp_path, sync="none") as broker:
        dead = broker.queue("dead", shards=2)
        queue = broker.queue("orders", shards=4, max_receive_count=1, dead_letter_queue="dead")
        queue.send_many([b"%d" % i for i in range(16)])
        while queue.receive(10, visibility_timeout=0):
            pass
        assert queue.stats().dead == 16 and dead.stats().available == 16
        failing.add("1.")
        with pytest.raises(StorageError, match="no space left"):
            dead.redrive()
        left = dead.stats().available + dead.stats().in_flight
        assert 0 < left < 16  # shard 0's letters were deleted, shard 1's are still there
        failing.clear()
        deadline = time.monotonic() + 30
        while dead.stats().available < left and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dead.redrive() == left
        assert sorted(m.body for m in drain(queue)) == sorted(b"%d" % i for i in range(16))
        assert dead.stats().available == dead.stats().in_flight == 0


def drain_without_delete(queue) -> list:
    out = []
    while got := queue.receive(10, visibility_timeout=30):
        out.extend(got)
    return out


# -- the directory: plain sej shards, listing, deleting, reopening ------------------------------------


def test_each_shard_is_a_plain_sej_journal(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        sent = queue.send_many([b"plain %d" % i for i in range(20)] + [{"body": b"wrapped", "attributes": {"a": "1"}}])
        queue.receive(3)
    entries = sorted(os.listdir(tmp_path))
    assert entries == ["orders", "orders.2.000", "orders.2.001", "orders.2.002", "orders.2.003"]
    assert sorted(os.listdir(tmp_path / "orders")) == ["consumers", "queue.json"]  # no journal there
    layout = read_layout(tmp_path, "orders")
    assert (layout.prefix, layout.bit, list(layout.shards)) == ("orders", 2, entries[1:])
    with ShardedScanner(tmp_path, prefix="orders") as scanner:
        read = {f"{int(name.rsplit('.', 1)[1], 16)}.{m.offset}": m for name, m in scanner}
    assert set(read) == set(sent)
    assert read[sent[0]].type == 0 and read[sent[0]].value == b"plain 0"  # no envelope: plain sej
    assert decode(read[sent[-1]].type, read[sent[-1]].value).body == b"wrapped"
    for shard in entries[1:]:
        with Scanner(tmp_path / shard) as scanner:
            assert [m.offset for m in scanner] == list(range(len(list(Scanner(tmp_path / shard)))))


def test_list_exists_delete_and_create_again(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("orders", shards=4).send_many([b"x"] * 10)
        broker.queue("plain")
        assert broker.names() == ["orders", "plain"] and broker.exists("orders")
        assert set(broker.gc()) == {"orders", "plain"}
        broker.delete("orders")
        assert broker.names() == ["plain"] and not broker.exists("orders")
        assert sorted(os.listdir(tmp_path)) == ["plain"]
        again = broker.queue("orders", shards=2)
        assert again.stats().available == 0
        assert sorted(os.listdir(tmp_path)) == ["orders", "orders.1.000", "orders.1.001", "plain"]


def test_a_shard_removed_by_another_process_is_not_made_again(tmp_path: Path) -> None:
    """Another process's delete removes the shards first, then the topic's own directory: a send
    or a new channel meanwhile, in a shard this process had not opened, is told the queue was deleted;
    it neither says it stored a message nor makes the shard's directory again."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", shards=2)  # its shards made, neither opened here
        sharded.delete_shards(tmp_path, "jobs", queue.settings.shards)  # the first step of another's delete
        with pytest.raises(QueueNotFoundError, match="deleted"):
            queue.send(b"lost", key="k")
        with pytest.raises(QueueNotFoundError, match="deleted"):
            broker.topic("jobs").channel("audit")
        assert sorted(os.listdir(tmp_path)) == ["jobs"]


def test_reopen_finds_the_shards_and_the_deliveries(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, visibility_timeout=60)
        queue.send_many([b"%d" % i for i in range(12)])
        held = queue.receive(5)
        assert len(held) == 5
    assert settings_file.load(tmp_path / "orders") == QueueSettings(visibility_timeout=60, shards=4)
    assert json.loads((tmp_path / "orders" / "queue.json").read_text())["shards"] == 4
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", create=False)
        assert isinstance(queue, ShardedQueue) and queue.settings.shards == 4
        stats = queue.stats()
        assert (stats.available, stats.in_flight) == (7, 5)
        assert queue.delete_many([m.receipt for m in held]) == [None] * 5  # receipts outlive the process
        assert len(drain(queue)) == 7


# -- many processes ---------------------------------------------------------------------------------

def claimed_homes(root: Path, name: str, shards: int) -> list[int]:
    """The home shards that live consumers of queue ``name`` hold now."""
    held: list[int] = []
    if not (root / name / "consumers").is_dir():
        return held  # no consumer has received yet
    for index in range(shards):
        lock = FileLock(root / name / "consumers" / f"default.{index}.lck")
        try:
            lock.acquire(wait=False)
        except LockedError:
            held.append(index)
        finally:
            lock.close()
    return held


def test_four_consumer_processes_drain_a_sharded_queue_exactly_once(tmp_path: Path, child_env: dict) -> None:
    root, done = tmp_path / "data", tmp_path / "done"
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", shards=4)
        queue.send_many([b"%d" % i for i in range(1000)])
        logs = [tmp_path / f"consumer{i}.log" for i in range(4)]
        consumers = [spawn(CONSUMER, root, log, done, env=child_env) for log in logs]
        for start in range(1000, 3000, 100):  # more arrive while they consume
            queue.send_many([b"%d" % i for i in range(start, start + 100)])
        deadline = time.monotonic() + 60
        while claimed_homes(root, "jobs", 4) != [0, 1, 2, 3] and time.monotonic() < deadline:
            time.sleep(0.05)
        # four consumers at once: one home shard each (they keep polling until ``done``)
        assert claimed_homes(root, "jobs", 4) == [0, 1, 2, 3]
        done.touch()
        for process in consumers:
            assert process.wait(timeout=120) == 0
        bodies: collections.Counter[str] = collections.Counter()
        for log in logs:
            lines = log.read_text().splitlines()
            assert lines[0].startswith("consumer ")
            assert not [line for line in lines if line.startswith("error")]
            bodies.update(lines[1:])
        assert bodies == collections.Counter(str(i) for i in range(3000))
        assert claimed_homes(root, "jobs", 4) == []  # let go as the consumers ended
        assert queue.stats().available == 0 and queue.stats().in_flight == 0


HOLDER = textwrap.dedent(
    """
    import sys, time
    from journalq.queue import Broker

    broker = Broker(sys.argv[1], sync="none")
    q = broker.queue("jobs", create=False)
    got = []
    while len(got) < 6:
        got += q.receive(6 - len(got), visibility_timeout=1.5)
    print(" ".join(m.id for m in got), flush=True)
    time.sleep(60)
    """
)


def test_a_consumer_killed_with_sigkill_loses_nothing(tmp_path: Path, child_env: dict) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs", shards=4)
        ids = queue.send_many([b"%d" % i for i in range(12)])
        holder = spawn(HOLDER, root, env=child_env, stdout=subprocess.PIPE, text=True)
        try:
            held = holder.stdout.readline().split()
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        assert len(held) == 6 and set(held) <= set(ids)
        # the dead consumer's home shard is free again: four new consumers take all four
        others = [Broker(root, sync="none") for _ in range(3)]
        try:
            homes = [queue.home] + [b.queue("jobs", create=False).home for b in others]
            assert sorted(homes) == [0, 1, 2, 3]
        finally:
            for b in others:
                b.close()
        rest = drain(queue)
        assert {m.id for m in rest} == set(ids) - set(held)
        time.sleep(1.6)  # the killed consumer's visibility timeout ends
        again = drain(queue)
        assert {m.id for m in again} == set(held)
        assert all(m.receive_count == 2 for m in again)


# -- the command line, the server, Spark ------------------------------------------------------------


def test_cli_create_with_shards_send_with_key(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from journalq.cli.main import cli

    def run(*args: str, input: str | None = None):
        return CliRunner().invoke(cli, ["queue", *args, "--data", str(tmp_path), "--sync", "none"], input=input)

    made = run("create", "orders", "--shards", "4")
    assert made.exit_code == 0, made.stderr
    assert json.loads(made.stdout)["settings"]["shards"] == 4
    sent = run("send", "orders", "hello", "--key", "alpha")
    assert sent.exit_code == 0 and shard_of(json.loads(sent.stdout)["id"]) == zlib.crc32(b"alpha") & 3
    got = run("receive", "orders", "-n", "5", "--delete")
    assert got.exit_code == 0 and [json.loads(line)["body"] for line in got.stdout.splitlines()] == ["hello"]
    assert json.loads(run("list").stdout) == {"name": "orders"}
    bad = run("create", "other", "--shards", "3")
    assert bad.exit_code != 0 and "power of two" in bad.stderr
    again = run("create", "orders", "--shards", "8")
    assert again.exit_code != 0 and "shards is 4, not 8" in again.stderr
    run("create", "plain")
    keyed = run("send", "plain", "x", "--key", "k")
    assert keyed.exit_code != 0 and "not sharded" in keyed.stderr


def test_server_creates_sharded_queues_over_rest_and_sqs(tmp_path_factory: pytest.TempPathFactory) -> None:
    import httpx
    from botocore.exceptions import ClientError
    from test_server_harness import module_server, sqs_client

    servers = module_server(tmp_path_factory)
    server = next(servers)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.put("/rest-orders?shards=4").status_code == 201
            assert client.put("/rest-bad?shards=3").status_code == 400
            ids = [client.post("/rest-orders/messages", content=b"%d" % i).headers["x-message-id"] for i in range(8)]
            assert {shard_of(i) for i in ids} == {0, 1, 2, 3}
            fetched = client.get("/rest-orders/messages")
            assert fetched.status_code == 200 and fetched.headers["x-message-id"] in ids
            assert client.delete(f"/rest-orders/messages/{fetched.headers['x-message-id']}").status_code == 204
            counts = client.get("/rest-orders").json()
            assert (counts["available"], counts["in_flight"]) == (7, 0)
        sqs = sqs_client(server.url)
        url = sqs.create_queue(QueueName="sqs-orders", Attributes={"Shards": "8"})["QueueUrl"]
        assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]["Shards"] == "8"
        assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Shards"])["Attributes"] == {"Shards": "8"}
        with pytest.raises(ClientError, match="different value for attribute Shards"):
            sqs.create_queue(QueueName="sqs-orders", Attributes={"Shards": "4"})
        with pytest.raises(ClientError, match="power of two"):
            sqs.create_queue(QueueName="sqs-bad", Attributes={"Shards": "6"})
        for i in range(10):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
        bodies = []
        while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            bodies += [m["Body"] for m in got]
            sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)]
            )
        assert sorted(bodies) == sorted(f"m{i}" for i in range(10))
    finally:
        next(servers, None)


def test_spark_reads_a_sharded_broker_topic(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from journalq.spark.targets import for_writing, resolve
    from journalq.spark.testing import local_session

    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        sent = queue.send_many([b"%d" % i for i in range(40)])
        broker.queue("plain").send(b"not in it")
    target = resolve(str(tmp_path), "orders")
    assert target.sharded and [s.name for s in target.shards] == [f"orders.2.00{i}" for i in range(4)]
    assert resolve(str(tmp_path / "orders")).shards == target.shards
    assert for_writing(str(tmp_path), "orders").commits_dir == tmp_path / "orders" / "_spark_commits"
    spark = local_session()
    rows = spark.read.format("journalq").option("topic", "orders").load(str(tmp_path)).collect()
    read = {f"{int(r.shard.rsplit('.', 1)[1], 16)}.{r.offset}": bytes(r.value) for r in rows}
    assert read == {i: b"%d" % n for n, i in enumerate(sent)}
    # written by key, as the queue routes a message sent with that key; the queue receives them
    df = spark.createDataFrame([(f"k{i}", f"w{i}") for i in range(20)], "key string, value string")
    df.write.format("journalq").mode("append").option("topic", "orders").option("writeId", "w1").save(str(tmp_path))
    df.write.format("journalq").mode("append").option("topic", "orders").option("writeId", "w1").save(str(tmp_path))
    assert (tmp_path / "orders" / "_spark_commits").is_dir() and not (tmp_path / "_spark_commits").exists()
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", create=False)
        for i in range(20):
            assert shard_of(queue.send(b"probe", key=f"k{i}")) == zlib.crc32(b"k%d" % i) & 3
        written = [m for m in drain(queue) if m.body != b"probe"]
        assert sorted(m.body for m in written) == sorted(
            [b"w%d" % i for i in range(20)] + [b"%d" % i for i in range(40)]
        )
        assert broker.names() == ["orders", "plain"]


def _kept(topic: ShardedTopic) -> list[list[int]]:
    """Per shard, the sizes of the segments it keeps."""
    from journalq.journal.segment import list_segments

    return [[s.path.stat().st_size for s in list_segments(shard.path)] for shard in topic.shards]


@pytest.mark.parametrize("gc_by", ["topic", "shard"])
def test_retention_by_size_counts_every_shard_and_lets_the_oldest_go_first(tmp_path: Path, gc_by: str) -> None:
    """``retention_bytes`` bounds the whole sharded topic, not each shard (4 shards kept 4 times
    the limit), and the oldest segments go first whichever shard holds them: a shard written to
    long ago gives up its old segments before a busy shard its new ones. The topic's gc and a
    shard's own (as a channel's maintenance runs it) decide alike."""
    segment, limit = 4096, 6 * 4096
    keys = {zlib.crc32(k) & 3: k for k in (b"k%d" % i for i in range(64))}
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, segment_size=segment, retention_bytes=limit)
        topic = queue.topic
        # Shard 0 first, long ago; then the others, shard 3 the busiest.
        for shard, count in ((0, 300), (1, 100), (2, 100), (3, 400)):
            queue.send_many([{"body": b"%d-%04d" % (shard, i) + b"x" * 90, "key": keys[shard]} for i in range(count)])
            time.sleep(0.01)
        before = _kept(topic)
        assert sum(map(sum, before)) > 4 * limit  # far past it, in every shard but two
        if gc_by == "topic":
            topic.gc()
        else:
            topic.shards[3].gc()  # the busiest shard's own: it keeps its newest
            for shard in topic.shards[:3]:
                shard.gc()
        after = _kept(topic)
        assert sum(map(sum, after)) <= limit
        assert len(after[0]) == 1  # the oldest shard keeps only the segment it would write to
        assert len(after[3]) > 1  # the busiest, the newest messages: what is kept is mostly its
        for kept, was in zip(after, before):
            assert kept == was[len(was) - len(kept) :]  # the newest of each shard, as they were
