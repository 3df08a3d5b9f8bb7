"""Sharded queues, fourth audit: the round robin of keyless messages under threads, the
descriptors that deduplication keeps open per shard, and threads sharing one sharded queue."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from journalq.queue import Broker, sharded


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
