"""Threads sharing one sharded queue or topic: the round robin of keyless messages, a queue whose
topic the broker closes under its users, and threads asking for one channel at once."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from journalq.errors import LockedError
from journalq.journal.lock import FileLock
from journalq.queue import Broker, sharded

from conftest import shard_of


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
