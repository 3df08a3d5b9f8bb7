"""Sharded queues, fourth audit: the round robin of keyless messages under threads, the
descriptors that deduplication keeps open per shard, and threads sharing one sharded queue."""

from __future__ import annotations

import collections
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from journalq.errors import LockedError
from journalq.journal import Scanner
from journalq.journal.lock import FileLock
from journalq.journal.segment import list_segments
from journalq.queue import Broker, sharded
from journalq.queue.envelope import decode
from journalq.queue import topic as topic_module
from journalq.queue.topic import DedupIndex, DedupSend


@pytest.fixture
def threads_taking_turns() -> Iterator[None]:
    """Threads started meanwhile give way to the others at every line of ``sharded.py`` (a
    tracer, as coverage or a debugger sets, that sleeps 0 s): a race between two of its lines
    shows at once. (CPython with its GIL seldom switches threads between two lines with no call
    between them; a tracer, or a build without the GIL, does.)"""

    def give_way(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename != sharded.__file__:
            return None
        if event == "line":
            time.sleep(0)
        return give_way

    threading.settrace(give_way)
    try:
        yield
    finally:
        threading.settrace(None)  # type: ignore[arg-type]  # None takes the tracer away


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """``work(n)`` for n in range(count), each in its own thread; the first failure re-raised."""
    failures: list[BaseException] = []

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException as exc:  # re-raised below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def shard_of(id_or_receipt: str) -> int:
    return int(id_or_receipt.split(".", 1)[0])


# -- the round robin of keyless messages --------------------------------------------------------


@pytest.mark.usefixtures("threads_taking_turns")
def test_threads_sending_keyless_messages_fill_every_shard_evenly(tmp_path: Path) -> None:
    """Each keyless message takes the next shard: 8 threads of 100 sends, 800 messages over 4
    shards, are 200 per shard exactly (two threads once took the same turn, and one skipped)."""
    threads, sends, shards = 8, 100, 4
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=shards)
        ids: list[str] = []

        def send(n: int) -> None:
            for i in range(sends):
                ids.append(queue.send(b"%d.%d" % (n, i)))

        run_threads(threads, send)
        per_shard = collections.Counter(shard_of(id) for id in ids)
        assert per_shard == {index: threads * sends // shards for index in range(shards)}
        assert {name: s.available for name, s in queue.shard_stats().items()} == {
            name: threads * sends // shards for name in queue.topic.shard_names
        }


# -- the descriptors that deduplication holds open ----------------------------------------------


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


# -- a sharded queue closed under its users --------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
def test_a_queue_closed_by_its_topic_receives_nothing_and_claims_nothing(tmp_path: Path, shards: int) -> None:
    """The broker closes a topic under the queue objects given out (``Broker.forget``, a delete):
    an unsharded queue's receive then gets nothing; a sharded one opened its shards' channels
    again, claimed a home shard that nothing let go of, and hid the messages it took."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=shards)
        queue.send_many([b"m%d" % n for n in range(8)])
        broker.topic("orders").close()
        assert queue.receive(10) == []
        claims = sorted((tmp_path / "orders" / "consumers").glob("*.lck"))
        for path in claims:  # none held: each can be taken at once
            claim = FileLock(path)
            claim.acquire(wait=False)
            claim.close()
    with Broker(tmp_path, sync="none") as broker:
        assert len(broker.queue("orders").receive(10, visibility_timeout=60)) == 8



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


def claims_held(root: Path, name: str) -> list[str]:
    """The consumers' home-shard claims of sharded topic ``name`` held now (by this process: a
    lock of another file description refuses at once)."""
    held: list[str] = []
    for path in sorted((root / name / "consumers").glob("*.lck")):
        claim = FileLock(path)
        try:
            claim.acquire(wait=False)
        except LockedError:
            held.append(path.name)
        finally:
            claim.close()
    return held


@pytest.mark.usefixtures("threads_taking_turns")
def test_threads_asking_for_one_channel_at_once_get_one(tmp_path: Path) -> None:
    """Two threads asking a sharded topic for a new channel each made one: the one not kept by
    the topic was never closed with it, and the home shard it claimed stayed claimed."""
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("orders", shards=4)
        got: list[object] = [None, None]
        start = threading.Barrier(2)

        def take(n: int) -> None:
            start.wait()
            channel = got[n] = topic.channel("billing")
            channel.receive(1, wait=0)  # claims a home shard

        run_threads(2, take)
        assert got[0] is got[1]
        topic.close()
        assert claims_held(tmp_path, "orders") == []
