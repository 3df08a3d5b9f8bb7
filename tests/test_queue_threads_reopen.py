"""Threads of one process sharing a queue's journal writer when it must be reopened (another
process's gc or compaction deleted the segment it was on): they go on with one new writer, never
with the closed one (a request failing though nothing is wrong), never with one each (their
writers' mutexes would no longer keep them apart, and a leaked writer keeps its files open)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import journalq.queue.channel as channel_module
import journalq.queue.topic as topic_module
from journalq.journal import Writer
from journalq.journal.segment import list_segments
from journalq.queue import Broker, Queue, Topic

WAIT = 30  # seconds: a step that never comes fails the test instead of hanging it


class Run(threading.Thread):
    """``call()`` in a thread, keeping its result or error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - ``outcome`` raises it in the test
            self.error = exc

    def outcome(self) -> Any:
        self.join(WAIT)
        assert not self.is_alive(), "the thread is stuck"
        if self.error is not None:
            raise self.error
        return self.result


class Steps:
    """Thread A pauses at ``pause_a()`` (once) until thread B reaches ``reached_b()``."""

    def __init__(self) -> None:
        self.a_paused, self.b_reached = threading.Event(), threading.Event()
        self.a: threading.Thread | None = None
        self.b: threading.Thread | None = None

    def pause_a(self) -> None:
        if threading.current_thread() is self.a and not self.a_paused.is_set():
            self.a_paused.set()
            assert self.b_reached.wait(WAIT)

    def reached_b(self) -> None:
        if threading.current_thread() is self.b:
            self.b_reached.set()

    def pause_or_note(self) -> None:
        """Where both come: A pauses, B lets it go on."""
        self.pause_a()
        self.reached_b()

    def run(self, call: Callable[[], Any], call_b: Callable[[], Any] | None = None) -> tuple[Any, Any]:
        """``call()`` in A, then, once A paused, in B (or ``call_b()``): their results."""
        self.a, self.b = Run(call), Run(call_b or call)
        self.a.start()
        if not self.a_paused.wait(WAIT):
            self.a.outcome()  # its error, if it failed before
            raise AssertionError("thread A never came to its pause")
        self.b.start()
        return self.a.outcome(), self.b.outcome()


def paused_before(steps_call: Callable[[], None], call: Callable[..., Any]) -> Callable[..., Any]:
    def paused(*args: Any, **kwargs: Any) -> Any:
        steps_call()
        return call(*args, **kwargs)

    return paused


def noted_after(steps_call: Callable[[], None], call: Callable[..., Any]) -> Callable[..., Any]:
    def noted(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        steps_call()
        return result

    return noted


def kept_in(results: list[Any], call: Callable[..., Any]) -> Callable[..., Any]:
    def keeping(*args: Any, **kwargs: Any) -> Any:
        results.append(call(*args, **kwargs))
        return results[-1]

    return keeping


@pytest.fixture
def collected_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Queue]:
    """A queue whose channel writer's segment another process's (broker's) compaction deleted."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 50)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", 4096)
    with Broker(tmp_path, sync="none") as mine, Broker(tmp_path, sync="none") as other:
        queue, elsewhere = mine.queue("jobs"), other.queue("jobs")
        queue.send_many([b"%d" % i for i in range(1000)])
        queue.receive(visibility_timeout=600, wait=0)
        while queue._writer.segment in list_segments(queue.path):
            got = elsewhere.receive(5, visibility_timeout=600, wait=0)
            assert got
            elsewhere.delete_many([m.receipt for m in got])
        yield queue


@pytest.fixture
def collected_topic(tmp_path: Path) -> Iterator[Topic]:
    """A topic whose writer's segment another process (broker) appended to and collected."""
    with Broker(tmp_path, sync="none") as mine, Broker(tmp_path, sync="none") as other:
        topic = mine.topic("events", segment_size=4096)
        topic.send(b"first")
        elsewhere = other.topic("events")
        elsewhere.send_many([b"x" * 100] * 100)
        for segment in list_segments(topic.path)[:-1]:
            segment.path.unlink()
            segment.index_path.unlink(missing_ok=True)
        yield topic


def receive_one(queue: Queue) -> Callable[[], list[str]]:
    return lambda: [m.id for m in queue.receive(visibility_timeout=600, wait=0)]


class NotingLock:
    """A lock that calls ``note()`` before it is waited for."""

    def __init__(self, lock: threading.Lock, note: Callable[[], None]) -> None:
        self.lock, self.note = lock, note

    def __enter__(self) -> bool:
        self.note()
        return self.lock.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self.lock.__exit__(*exc_info)


def test_a_receive_whose_writer_another_thread_reopened_goes_on_with_the_new_one(collected_queue: Queue) -> None:
    """Thread A's receive finds the state segment collected: it closes the writer and reopens.
    Thread B's receive took the old writer before A put the new one in its place: it goes on with
    that new one. (Before, B's receive failed, "writer of ... is closed": a 500 in the server.)"""
    queue, steps = collected_queue, Steps()
    queue._reopen_writer = paused_before(steps.pause_a, queue._reopen_writer)  # type: ignore[method-assign]
    queue._hold = noted_after(steps.reached_b, queue._hold)  # type: ignore[method-assign]
    got_a, got_b = steps.run(receive_one(queue))
    assert len(got_a) == len(got_b) == 1 and got_a != got_b


def test_receives_that_find_the_segment_collected_together_make_one_writer(collected_queue: Queue) -> None:
    """Threads A and B both find the state segment collected and both reopen: one new writer is
    made, and both hold it. (Before, each made one: one was left open, and the two threads held
    different writers, whose mutexes let them change the channel's state at once.)"""
    queue, steps = collected_queue, Steps()
    made: list[Writer] = []
    queue._new_writer = kept_in(made, queue._new_writer)  # type: ignore[method-assign]
    holds: list[Any] = []
    queue._hold = kept_in(holds, queue._hold)  # type: ignore[method-assign]
    check = queue.topic.check_present  # ``held``'s check, once the catch-up found the segment deleted
    queue.topic.check_present = paused_before(steps.pause_or_note, check)  # type: ignore[method-assign]
    got_a, got_b = steps.run(receive_one(queue))
    assert len(got_a) == len(got_b) == 1 and got_a != got_b
    assert len(made) == 1
    assert [h._writer for h in holds] == [made[0], made[0]]


def test_a_channel_closed_while_a_thread_reopens_its_writer_leaves_none_open(collected_queue: Queue) -> None:
    """Thread A's receive makes a new writer for the channel (its segment was collected) while
    thread B closes the channel: the close waits for it, and closes it too (A's receive may have
    held it first, or find it closed). (Before, the new writer was left open in the closed
    channel.)"""
    queue, steps = collected_queue, Steps()
    queue._new_writer = paused_before(steps.pause_a, queue._new_writer)  # type: ignore[method-assign]
    # B waits there for A's reopen (before the fix it does not wait: it notes it has closed).
    queue._reopen_lock = NotingLock(queue._reopen_lock, steps.reached_b)  # type: ignore[assignment]
    got_a, _ = steps.run(receive_one(queue), noted_after(steps.reached_b, queue.close))
    assert len(got_a) <= 1
    assert queue._writer.closed


def send_one(topic: Topic) -> Callable[[], list[str]]:
    return lambda: topic.send_many([b"late"])


def test_a_send_whose_writer_another_thread_reopened_goes_on_with_the_new_one(collected_topic: Topic) -> None:
    """As for a receive: thread B's send took the writer that thread A's send closed, before A's
    reopen put a new one in its place. (Before, B's send failed: "writer of ... is closed".)"""
    topic, steps = collected_topic, Steps()
    topic._reopen_writer = paused_before(steps.pause_a, topic._reopen_writer)  # type: ignore[method-assign]
    topic._get_writer = noted_after(steps.reached_b, topic._get_writer)  # type: ignore[method-assign]
    (id_a,), (id_b,) = steps.run(send_one(topic))
    assert sorted([int(id_a), int(id_b)]) == [101, 102]  # after the first and the other process's 100


def test_sends_that_find_the_segment_collected_together_make_one_writer(
    collected_topic: Topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for receives: threads A and B both find the writer's segment collected and reopen; one
    writer is made, and both send with it."""
    topic, steps = collected_topic, Steps()
    made: list[Writer] = []
    monkeypatch.setattr(topic_module, "Writer", kept_in(made, Writer))
    holds: list[Any] = []
    monkeypatch.setattr(topic_module, "held", kept_in(holds, topic_module.held))
    topic.check_present = paused_before(steps.pause_or_note, topic.check_present)  # type: ignore[method-assign]
    (id_a,), (id_b,) = steps.run(send_one(topic))
    assert sorted([int(id_a), int(id_b)]) == [101, 102]
    assert len(made) == 1
    assert [h._writer for h in holds] == [made[0], made[0]]


def test_first_sends_of_two_threads_to_a_shard_make_one_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded topic's shard opens its writer with its first message: two threads' first sends
    to it make one writer and both send with it. (Before, each made one: one was left open.)"""
    with Broker(tmp_path, sync="none") as broker:
        shard = broker.topic("events", shards=2).shards[0]
        assert shard._writer is None
        steps = Steps()
        made: list[Writer] = []
        monkeypatch.setattr(topic_module, "Writer", paused_before(steps.pause_or_note, kept_in(made, Writer)))
        # B waits there for the writer that A is making (it has no such lock before the fix).
        monkeypatch.setattr(shard, "_writer_lock", NotingLock(threading.Lock(), steps.reached_b), raising=False)
        holds: list[Any] = []
        monkeypatch.setattr(topic_module, "held", kept_in(holds, topic_module.held))
        (id_a,), (id_b,) = steps.run(send_one(shard))
        assert sorted([id_a, id_b]) == ["0", "1"]
        assert len(made) == 1
        assert [h._writer for h in holds] == [made[0], made[0]]
