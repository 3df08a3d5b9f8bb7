"""Receives and dead letters on the ZooKeeper store: receives that look past any number of tasks
they cannot take (delayed, for other filters, behind a blocked group) without reading their entries
again, what a broker remembers of tasks, and dead-letter moves that meet a deleted dead-letter
queue or fail, as on files."""

from __future__ import annotations

from typing import Any

import pytest

from journalq.queue import Broker

from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


class Reads:
    """Counts the reads of queue entries (``.../queue/<task>``) that a broker's client makes."""

    def __init__(self, broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        client = broker.client
        for name in ("get", "get_async"):
            monkeypatch.setattr(client, name, self._counting(getattr(client, name)))

    def _counting(self, read: Any) -> Any:
        def counted(path: str, *args: Any, **kwargs: Any) -> Any:
            if "/queue/" in path:
                self.count += 1
            return read(path, *args, **kwargs)
        return counted

    def during(self, call: Any) -> tuple[Any, int]:
        before = self.count
        result = call()
        return result, self.count - before


def _send(q: Any, count: int, **options: Any) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 500):
        ids += q.send_many([{"body": b"x", **options}] * min(500, count - start))
    return ids


BEHIND = 2_000


@pytest.mark.parametrize("ahead", ["delayed", "other filters", "a blocked group"])
def test_receives_behind_tasks_they_cannot_take_do_not_read_those_again(
    broker, ahead: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    q = broker.queue("jobs", enums={"class": ["low", "high"]})
    wanted = {"class": ("high", "absolute")} if ahead == "other filters" else None
    if ahead == "a blocked group":
        q.send(b"head", group_id="a")
        (head,) = q.receive(visibility_timeout=60)
        _send(q, BEHIND, group_id="a")
    elif ahead == "delayed":
        _send(q, BEHIND, delay=600)
    else:
        _send(q, BEHIND, filters={"class": "low"})
    reads = Reads(broker, monkeypatch)
    got, first = reads.during(lambda: q.receive(10, filters=wanted))
    assert got == [] and first >= BEHIND  # the first receive reads them all
    for _ in range(3):
        got, again = reads.during(lambda: q.receive(10, filters=wanted))
        # (at most the read-ahead of the first chunk, 20 for a receive of 10, in each look)
        assert got == [] and again < 100, f"{again} entries read again behind {BEHIND} {ahead} tasks"
    mine = q.send(b"mine", filters={"class": "high"})
    (got,) = q.receive(10, filters=wanted)  # the one it can take is found, behind them
    assert got.id == mine


def test_a_delayed_task_ended_by_another_broker_holds_back_neither_its_group_nor_memory(
    url: str,  # noqa: F811
) -> None:
    with Broker(url, sync="none") as mine, Broker(url, sync="none") as other:
        q = mine.queue("jobs")
        head = q.send(b"later", group_id="g", delay=600)
        assert q.receive() == [] and len(mine.known_tasks) == 1  # known: delayed, at its group's head
        next_in_group = other.queue("jobs").send(b"next", group_id="g")
        other.queue("jobs").delete_id(head)
        got = q.receive()  # (its listing of before is looked at again: the head is known gone)
        assert [m.id for m in got] == [next_in_group]
        assert len(mine.known_tasks) == 1  # the head forgotten; the one received known


def test_what_a_broker_knows_of_tasks_is_bounded_and_forgotten_with_its_queue() -> None:
    from journalq.queue.zookeeper.layout import KnownTasks, SentFacts

    known, first, again = KnownTasks(limit=3), ("/q", 1), ("/q", 2)
    facts = SentFacts(None, {}, due=10)
    for task in "abcde":
        known.add(first, task, facts)
    assert len(known) == 3 and sorted(known.facts(first)) == ["a", "b", "c"]
    known.retain(first, ["b", "c", "e"])
    known.add(first, "e", facts)
    assert sorted(known.facts(first)) == ["b", "c", "e"]
    assert known.facts(again) == {} and len(known) == 0  # the queue made again: none of the first's
    known.add(again, "x", facts)
    known.drop("/q")
    assert len(known) == 0 and known.facts(again) == {}


BEHIND_ANY_READ_AHEAD = 2_100  # more than any read-ahead of 1,024 (the file store's was), twice over


@pytest.mark.parametrize("ahead", ["other filters", "delayed", "a blocked group"])
def test_a_receive_finds_the_one_message_it_can_take_behind_thousands_it_cannot(
    broker, ahead: str  # noqa: F811
) -> None:
    q = broker.queue("jobs", enums={"class": ["low", "high"]})
    if ahead == "a blocked group":
        q.send(b"head", group_id="a")
        (head,) = q.receive(visibility_timeout=60)  # its group waits for it
        assert head.body == b"head"
    for start in range(0, BEHIND_ANY_READ_AHEAD, 500):
        count = min(500, BEHIND_ANY_READ_AHEAD - start)
        if ahead == "other filters":
            q.send_many([{"body": b"low", "filters": {"class": "low"}}] * count)
        elif ahead == "delayed":
            q.send_many([{"body": b"later", "delay": 600}] * count)
        else:
            q.send_many([{"body": b"a", "group_id": "a"}] * count)
    last = q.send(b"mine", filters={"class": "high"}, group_id="b" if ahead == "a blocked group" else None)
    wanted = {"class": ("high", "absolute")} if ahead == "other filters" else None
    got = q.receive(10, filters=wanted)
    assert [(m.id, m.body) for m in got] == [(last, b"mine")]
    q.delete(got[0].receipt)
    assert q.receive(10, filters=wanted) == []  # nothing more to take, none taken wrongly


def test_stats_do_not_count_dead_letters_kept_back_as_available(
    broker: Broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """As on files: a task past max_receive_count whose move the dead-letter queue refused is
    kept, undelivered, until the move is tried again: not available (a receive gives nothing)."""
    from journalq.errors import StorageError

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq", task_gc_interval=60)
    q.send(b"poison")
    (got,) = q.receive(visibility_timeout=0)

    def refuse(items: object) -> list[str]:
        raise StorageError("the disk is full")

    monkeypatch.setattr(broker.queue("jobs-dlq"), "send_many", refuse)
    assert q.receive(wait=0) == []  # the move is refused: kept here
    stats = q.stats()
    assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 1, 0)
    monkeypatch.undo()
    q.send(b"fine")  # (what comes after it goes on meanwhile)
    assert q.stats().available == 1


def test_a_dead_letter_queue_deleted_by_another_process_is_made_again_by_the_move(url: str) -> None:  # noqa: F811
    """As on files: the move sends to the dead-letter queue this broker had open, which another
    process deleted; the move makes it again rather than failing the source queue's receive
    with the dead-letter queue's QueueNotFoundError."""
    with Broker(url, sync="none") as here, Broker(url, sync="none") as there:
        q = here.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
        here.queue("jobs-dlq").send(b"earlier")
        poison = q.send(b"poison")
        q.receive(visibility_timeout=0)
        there.delete("jobs-dlq")
        assert q.receive() == []  # moved
        assert q.task(poison).state == "dead"
        assert [m.body for m in here.queue("jobs-dlq").receive(10)] == [b"poison"]


def test_a_dead_letter_move_that_fails_withholds_none_of_the_messages_received_with_it(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """As on files, where a receive records its deliveries after the move: a move that fails
    (here the dead-letter queue's ensemble stops answering) fails the receive, and the messages
    that it would have delivered stay available, not hidden for their visibility timeout with
    nobody holding them."""
    from journalq.errors import StoreUnavailableError
    from journalq.queue.zookeeper.store import ZooKeeperTopic

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq", visibility_timeout=60)
    poison = q.send(b"poison")
    good = q.send(b"good")
    (m,) = q.receive(visibility_timeout=0)
    assert m.id == poison
    send_many = ZooKeeperTopic.send_many

    def unavailable_for_the_dead_letters(self, items):
        if self.name == "jobs-dlq":
            raise StoreUnavailableError("ZooKeeper did not answer (as in an outage)")
        return send_many(self, items)

    monkeypatch.setattr(ZooKeeperTopic, "send_many", unavailable_for_the_dead_letters)
    with pytest.raises(StoreUnavailableError):
        q.receive(10)
    assert [m.id for m in q.receive(10)] == [good]
