"""Deduplication on sharded queues: a duplicate ``dedup_id`` sent with another group or key, which
routes it to another shard, is dropped as on an unsharded queue and as SQS's DeduplicationScope
"queue" does (in one process, in a batch, from threads and from two processes at once); the
readings of every shard that deduplication keeps open, closed when idle (under another thread's
send too) and resumed after gc; the deduplication index's answer of where and when an id was sent."""

from __future__ import annotations

import collections
import os
import textwrap
import threading
import time
import zlib
from pathlib import Path

import pytest

from journalq.journal import Scanner
from journalq.journal.segment import list_segments
from journalq.queue import Broker, sharded, topic as topic_module
from journalq.queue.envelope import decode
from journalq.queue.topic import DedupIndex, DedupSend

from conftest import shard_of
from test_queue_processes import spawn


def groups_in_other_shards(shards: int, count: int) -> list[str]:
    """``count`` group ids that route to ``count`` different shards."""
    found: dict[int, str] = {}
    for n in range(10_000):
        group = f"group-{n}"
        found.setdefault(zlib.crc32(group.encode()) & (shards - 1), group)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough shards")


def stored_dedup_ids(root: Path, name: str, shards: int) -> collections.Counter[str]:
    """The dedup ids of every message stored in every shard of ``name``, counted."""
    counted: collections.Counter[str] = collections.Counter()
    bit = shards.bit_length() - 1
    for index in range(shards):
        with Scanner(root / f"{name}.{bit:x}.{index:03d}") as scanner:
            for message in scanner:
                counted[decode(message.type, message.value).dedup_id] += 1
    return counted


def test_a_duplicate_sent_with_another_group_is_dropped(tmp_path: Path) -> None:
    a, b, c = groups_in_other_shards(4, 3)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        first = queue.send(b"paid", dedup_id="order-1", group_id=a)
        assert shard_of(first) == zlib.crc32(a.encode()) & 3
        assert queue.send(b"paid again", dedup_id="order-1", group_id=b) == first
        assert queue.send(b"paid by key", dedup_id="order-1", key="customer-9") == first
        assert queue.send(b"paid bare", dedup_id="order-1") == first
        assert queue.send(b"other", dedup_id="order-2", group_id=c) != first
        assert queue.stats().available == 2
        assert sorted(m.body for m in queue.receive(10)) == [b"other", b"paid"]
    assert stored_dedup_ids(tmp_path, "orders", 4) == {"order-1": 1, "order-2": 1}


def test_a_duplicate_in_another_shard_is_dropped_from_a_batch(tmp_path: Path) -> None:
    a, b, c = groups_in_other_shards(8, 3)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=8)
        first = queue.send(b"one", dedup_id="x", group_id=a)
        ids = queue.send_many(
            [
                {"body": b"two", "dedup_id": "y", "group_id": b},  # new, and again in c below
                {"body": b"one again", "dedup_id": "x", "group_id": b},  # sent before, to a
                {"body": b"two again", "dedup_id": "y", "group_id": c},
                {"body": b"three", "group_id": c},
            ]
        )
        assert ids[1] == first
        assert ids[2] == ids[0] and shard_of(ids[0]) == zlib.crc32(b.encode()) & 7
        assert len(set(ids)) == 3
        assert queue.stats().available == 3
    assert stored_dedup_ids(tmp_path, "orders", 8) == {"x": 1, "y": 1, None: 1}


def test_a_duplicate_in_another_shard_is_taken_again_after_the_window(tmp_path: Path) -> None:
    a, b = groups_in_other_shards(4, 2)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, dedup_window=0.5)
        first = queue.send(b"one", dedup_id="x", group_id=a)
        time.sleep(0.6)
        second = queue.send(b"one later", dedup_id="x", group_id=b)
        assert second != first and shard_of(second) == zlib.crc32(b.encode()) & 3
        assert queue.send(b"one again", dedup_id="x", group_id=a) == second  # its window now
        assert queue.stats().available == 2


SENDER = textwrap.dedent(
    """
    import sys, time
    from journalq.queue import Broker

    root, group, start, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    with Broker(root, sync="none") as broker:
        queue = broker.queue("orders")
        time.sleep(max(0.0, start - time.time()))  # both senders start together
        for n in range(count):
            if n % 2:
                print(queue.send(b"%d" % n, dedup_id=str(n), group_id=group))
            else:  # a batch of one: the duplicate of the other process, or of the one before
                print(*queue.send_many([{"body": b"%d" % n, "dedup_id": str(n), "group_id": group},
                                        {"body": b"%d" % n, "dedup_id": str(n), "group_id": group + "x"}]))
    """
)


def test_two_processes_sending_the_same_dedup_ids_with_other_groups_store_each_once(
    tmp_path: Path, child_env: dict
) -> None:
    a, b = groups_in_other_shards(4, 2)
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("orders", shards=4)
    count, start = 300, time.time() + 1.5
    senders = [spawn(SENDER, tmp_path, group, start, count, env=child_env, stdout=-1, text=True) for group in (a, b)]
    outputs = []
    for sender in senders:
        out, _ = sender.communicate(timeout=120)
        assert sender.returncode == 0
        outputs.append(out.splitlines())
    stored = stored_dedup_ids(tmp_path, "orders", 4)
    assert stored == {str(n): 1 for n in range(count)}
    # Both processes were given the id of the one message stored for each dedup id.
    for n, (mine, theirs) in enumerate(zip(*outputs)):
        assert len(set(mine.split() + theirs.split())) == 1, n


def test_threads_sending_the_same_dedup_ids_with_other_groups_store_each_once(tmp_path: Path) -> None:
    groups = groups_in_other_shards(4, 4)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        results: dict[str, list[str]] = {}

        def send(group: str) -> None:
            results[group] = [queue.send(b"%d" % n, dedup_id=str(n), group_id=group) for n in range(100)]

        threads = [threading.Thread(target=send, args=(group,)) for group in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(len({results[g][n] for g in groups}) == 1 for n in range(100))
    assert stored_dedup_ids(tmp_path, "orders", 4) == {str(n): 1 for n in range(100)}


# -- the readings of every shard that deduplication keeps open ----------------------------------


def deduplication_readings(root: Path) -> collections.Counter[str]:
    """The segments of topics' journals under ``root`` open for reading here, counted by the
    directory of their topic (deduplication reads them; writers open theirs read-write, and
    channels are left out: their journals are under ``channels/``)."""
    found: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
            with open(f"/proc/self/fdinfo/{fd}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except OSError:
            continue  # (the listing's own descriptor, closed by now)
        topic = target.parent.parent
        if target.suffix == ".jnl" and topic.parent == root and flags & os.O_ACCMODE == os.O_RDONLY:
            found[topic.name] += 1
    return found


def topics_reading(root: Path) -> set[str]:
    """The sharded topics under ``root`` whose shards have a segment open for reading here."""
    return {shard.split(".")[0] for shard in deduplication_readings(root)}


def dedup_ids_in_every_shard(shards: int) -> list[str]:
    """Deduplication ids that route to each of ``shards`` shards, one each."""
    found: dict[int, str] = {}
    for n in range(10_000):
        found.setdefault(zlib.crc32(b"id-%d" % n) & (shards - 1), f"id-{n}")
        if len(found) == shards:
            return list(found.values())
    raise AssertionError("no id for some shard")


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs /proc (Linux)")


@needs_proc
def test_deduplicated_sends_read_each_shard_once(tmp_path: Path) -> None:
    """The sharded topic looks for a dedup id in every shard; the shard sent to looked again
    with a reading of its own (a second open segment per shard, and a second read per send)."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        first = [queue.send(b"x", dedup_id=dedup_id) for dedup_id in dedup_ids_in_every_shard(4)]
        assert sorted(shard_of(id) for id in first) == [0, 1, 2, 3]
        again = [queue.send(b"y", dedup_id=dedup_id, key="other") for dedup_id in dedup_ids_in_every_shard(4)]
        assert again == first
        assert deduplication_readings(tmp_path) == {name: 1 for name in queue.topic.shard_names}
    assert deduplication_readings(tmp_path) == {}


@needs_proc
def test_the_readings_of_topics_that_stopped_deduplicating_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sharded topic kept a reading of every shard open for ever once it deduplicated: a
    process with many such topics ran out of descriptors. Those of a topic idle for
    ``DEDUP_IDLE_SECONDS`` are closed, and read on where they stopped when used again."""
    monkeypatch.setattr(sharded, "DEDUP_IDLE_SECONDS", 1.0)
    with Broker(tmp_path, sync="none") as broker:
        queues = [broker.queue(f"q{n}", shards=4) for n in range(5)]
        first = [queue.send(b"x", dedup_id="a") for queue in queues[:4]]
        assert topics_reading(tmp_path) == {"q0", "q1", "q2", "q3"}
        time.sleep(1.2)
        queues[4].send(b"x", dedup_id="a")
        assert topics_reading(tmp_path) == {"q4"}
        queues[0].send(b"z", dedup_id="b")  # a reading again, from where it was closed
        assert queues[0].send(b"x again", dedup_id="a") == first[0]
        assert queues[0].stats().available == 2
        assert topics_reading(tmp_path) == {"q0", "q4"}
        broker.topic("q4").close()
        assert topics_reading(tmp_path) == {"q0"}
        assert [queue.send(b"x again", dedup_id="a") for queue in queues[1:4]] == first[1:4]
        assert topics_reading(tmp_path) == {"q0", "q1", "q2", "q3"}


def test_a_topic_deduplicating_keeps_its_own_readings_whatever_the_idle_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``DEDUP_IDLE_SECONDS`` at 0 every other topic is idle at once, but not the one
    sending: it took itself for idle, closed its own readings (to open them again at once) and
    left the topics noted, so that nothing closed them once it was idle."""
    monkeypatch.setattr(sharded, "DEDUP_IDLE_SECONDS", 0.0)
    with Broker(tmp_path, sync="none") as broker:
        first, second = broker.queue("first", shards=2), broker.queue("second", shards=2)
        first.send(b"x", dedup_id="a")
        assert topics_reading(tmp_path) == {"first"}
        second.send(b"y", dedup_id="b")
        assert topics_reading(tmp_path) == {"second"}


def sent_at(dedup: DedupIndex, dedup_id: str) -> int | None:
    """The offset that ``dedup`` says ``dedup_id`` was sent at, if any."""
    sent = dedup.sent(dedup_id)
    return None if sent is None else sent.offset


def test_a_closed_reading_resumes_after_gc_collected_where_it_stopped(tmp_path: Path) -> None:
    """A deduplication reading closed (``DedupIndex.rest``) opens again where it stopped; when gc
    has collected that place since, it reads the window again (what is left of it)."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("t", segment_size=4096, retention_bytes=8192)
        topic.send_many([{"body": b"x" * 1000, "dedup_id": f"early-{n}"} for n in range(3)])
        dedup = DedupIndex(topic.path, 3600)
        dedup.catch_up()
        dedup.rest()
        later = [topic.send(b"y" * 1000, dedup_id=f"later-{n}") for n in range(40)]
        topic.gc()
        kept_from = list_segments(topic.path)[0].base
        assert kept_from > 3  # where the reading stopped is collected
        dedup.catch_up()
        assert sent_at(dedup, "later-39") == int(later[-1])
        assert sent_at(dedup, "early-0") == 0  # read before: still known
        assert sent_at(dedup, f"later-{kept_from - 3}") == kept_from  # (the later ones from offset 3)
        dedup.close()


def test_the_deduplication_index_says_where_and_when_an_id_was_sent(tmp_path: Path) -> None:
    """``DedupIndex.sent``: the offset and time of an id's send within the window, what a sharded
    topic compares across its shards (it read the index's own dictionary for the time)."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("t")
        topic.send(b"a", dedup_id="first")
        topic.send(b"b", dedup_id="second")
        topic.send(b"b again", dedup_id="second")  # dropped: no message
        dedup = DedupIndex(topic.path, 3600)
        dedup.catch_up()
        with Scanner(topic.path) as scanner:
            stored = {decode(m.type, m.value).dedup_id: (m.offset, m.timestamp_ns) for m in scanner}
        assert dedup.sent("first") == DedupSend(*stored["first"])
        assert dedup.sent("second") == DedupSend(offset=1, timestamp_ns=stored["second"][1])
        assert dedup.sent("never") is None
        dedup.close()
        expired = DedupIndex(topic.path, 0.001)
        time.sleep(0.01)
        expired.catch_up()
        assert expired.sent("first") is None
        expired.close()


def test_a_topic_closed_while_another_thread_closes_its_idle_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send to one sharded topic closes the idle readings of another, under that topic's
    deduplication locks; the other's ``close`` closed them without the locks, under the first
    one's feet (its send failed on a reading gone None, and a descriptor could be closed twice)."""
    monkeypatch.setattr(sharded, "DEDUP_IDLE_SECONDS", 0.0)
    resting, closed = threading.Event(), threading.Event()

    class PausingScanner(Scanner):
        @property
        def offset(self) -> int:
            if threading.current_thread().name == "sender" and not resting.is_set():
                resting.set()  # the sender is closing a reading of the idle topic: close it now
                closed.wait(5)
            return super().offset

    monkeypatch.setattr(topic_module, "Scanner", PausingScanner)
    with Broker(tmp_path, sync="none") as broker:
        idle, busy = broker.queue("idle", shards=2), broker.queue("busy", shards=2)
        idle.send(b"x", dedup_id="a")
        failures: list[BaseException] = []

        def send() -> None:
            try:
                busy.send(b"y", dedup_id="b")
            except BaseException as exc:  # re-raised below, in the test's thread
                failures.append(exc)

        sender = threading.Thread(target=send, name="sender")
        sender.start()
        assert resting.wait(5)
        closer = threading.Thread(target=broker.topic("idle").close)
        closer.start()
        closer.join(0.5)  # done at once when it does not wait for the sender's closing
        closed.set()
        sender.join()
        closer.join()
        if failures:
            raise failures[0]
        assert topics_reading(tmp_path) == {"busy"}
