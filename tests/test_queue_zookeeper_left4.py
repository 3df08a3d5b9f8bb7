"""The ZooKeeper store, fourth audit: receives that read again, at each call, the entries of the
tasks they cannot take (delayed, for other filters, behind a blocked group), though what such an
entry holds never changes but its state."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from journalq.errors import QueueError, QueueNotFoundError
from conftest import returned_at_once
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


def _same_ids(broker: Any, monkeypatch: pytest.MonkeyPatch, ids: list[str]) -> None:
    """The broker's next sends take ``ids`` (with the times they say), as if made again."""
    given = iter(ids)
    monkeypatch.setattr(broker.ids, "make", lambda count: [(t, int(t[:19])) for t in itertools.islice(given, count)])


def test_a_queue_made_again_by_another_broker_with_the_same_task_names_is_not_taken_for_the_first(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    with Broker(url, sync="none") as mine, Broker(url, sync="none") as other:
        q = mine.queue("jobs")
        (task,) = q.send_many([{"body": b"later", "delay": 600}])
        assert q.receive() == [] and len(mine.known_tasks) == 1  # known: delayed
        other.delete("jobs")
        _same_ids(other, monkeypatch, [task])
        assert other.queue("jobs").send(b"now") == task  # another queue, its task of the same name
        with pytest.raises(QueueNotFoundError):
            q.receive()  # (the handle of the first refuses; the broker opens the name anew)
        got = mine.queue("jobs").receive()
        assert [(m.id, m.body) for m in got] == [(task, b"now")]


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


# -- a queue delete raced by senders -------------------------------------------------------------

RACES = 25  # more than any fixed number of tries (the delete gave up after 10)


def test_a_queue_delete_raced_by_a_sender_many_times_deletes_what_it_adds(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A sender whose writes were in flight as the delete began adds task nodes under the queue
    while it is being deleted: each is a lost race for the delete (its node not empty), and
    each is progress (a node it deletes in its next look)."""
    with Broker(url, sync="none") as mine, Broker(url, sync="none") as sender:
        sender.queue("jobs").send(b"before")
        tasks, delete, added = f"{mine.path}/jobs/tasks", mine.client.delete, []

        def delete_raced(path: str, *args: Any, **kwargs: Any) -> Any:
            if path == tasks and len(added) < RACES:  # the sender's next node lands first
                added.append(sender.client.create(f"{tasks}/{len(added):024d}", b""))
            return delete(path, *args, **kwargs)

        monkeypatch.setattr(mine.client, "delete", delete_raced)
        mine.delete("jobs")
        assert len(added) == RACES
        assert not mine.exists("jobs") and sender.client.exists(f"{mine.path}/jobs") is None


def test_a_queue_delete_that_cannot_empty_a_node_fails_naming_the_queue(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """A node that stays not empty though each look finds nothing under it to delete: no
    endless loop, but an error that names the queue and the node."""
    from kazoo.exceptions import NotEmptyError

    broker.queue("jobs").send(b"x")
    consumers, client = f"{broker.path}/jobs/consumers", broker.client
    delete, looks = client.delete, []

    def never_empty(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == consumers:
            looks.append(path)
            raise NotEmptyError()
        return delete(path, *args, **kwargs)

    monkeypatch.setattr(client, "delete", never_empty)
    error = returned_at_once(lambda: broker.delete("jobs"))
    assert isinstance(error, QueueError)
    assert str(error).startswith(f"queue 'jobs' in {broker.root} could not be deleted: {consumers} ")
    assert 1 < len(looks) < 10
    monkeypatch.undo()
    broker.delete("jobs")  # a delete cut short is finished by the next
    assert not broker.exists("jobs")


# -- a handle closed under a receive --------------------------------------------------------------


def test_a_handle_closed_while_its_receive_registers_leaves_no_consumer(
    broker, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """One thread receives; another closes the handle as the receive registers its consumer (the
    close found nothing to unregister): the receive registered it after the close, for the
    rest of the session, and claimed with it."""
    q = broker.queue("jobs")
    sent = q.send(b"x")
    transaction, at_register, closed = broker.client.transaction, threading.Event(), threading.Event()
    receiving: list[threading.Thread] = []

    def closed_meanwhile() -> Any:
        if threading.current_thread() in receiving and not at_register.is_set():
            at_register.set()  # the receive's registration: the handle is closed now
            assert closed.wait(10)
        return transaction()

    monkeypatch.setattr(broker.client, "transaction", closed_meanwhile)
    got: list[Any] = []
    receiving.append(threading.Thread(target=lambda: got.append(q.receive(visibility_timeout=60))))
    receiving[0].start()
    assert at_register.wait(10)
    q.close()
    closed.set()
    receiving[0].join(10)
    assert got == [[]]
    monkeypatch.undo()
    assert broker.client.get_children(f"{broker.path}/jobs/consumers") == []
    again = broker.queue("jobs")
    assert again.consumers() == {} and [m.id for m in again.receive()] == [sent]


def test_a_closed_handle_receives_nothing_and_registers_no_consumer(broker) -> None:  # noqa: F811
    q = broker.queue("jobs")
    sent = q.send(b"x")
    assert q.receive(visibility_timeout=0) != []  # registered
    q.close()
    assert q.receive() == []  # (as a receive whose handle is closed under it)
    assert broker.client.get_children(f"{broker.path}/jobs/consumers") == []
    assert [m.id for m in broker.queue("jobs").receive()] == [sent]
