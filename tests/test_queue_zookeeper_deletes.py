"""Deleting a queue on the ZooKeeper store: a delete that an outage or a lost connection cuts
short (finished by the next, or leaving the handle working), raced by senders, that cannot empty a
node; a broker whose path was deleted under it; a queue made again with the same task names."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from journalq.errors import QueueError, QueueNotFoundError, StoreUnavailableError
from journalq.queue import Broker

from conftest import RACES, own_zookeeper, returned_at_once
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_queue_delete_cut_short_after_its_first_step_is_finished_by_the_next(broker) -> None:  # noqa: F811
    q = broker.queue("jobs")
    q.send(b"x")
    # What a delete whose connection was lost (or whose process died) after its first step left:
    # the queue's node emptied (no longer a queue), the rest still there.
    broker.client.set(f"{broker.path}/jobs", b"")
    assert not broker.exists("jobs")
    broker.delete("jobs")  # a retry of the delete finishes it
    assert broker.client.exists(f"{broker.path}/jobs") is None
    with pytest.raises(QueueNotFoundError):
        broker.delete("jobs")  # (and a queue that is not there at all is still an error)
    q = broker.queue("jobs")  # the name can be used again
    q.send(b"y")
    assert [m.body for m in q.receive()] == [b"y"]


def test_a_broker_whose_path_was_deleted_under_it_lists_nothing_and_makes_it_again(broker) -> None:  # noqa: F811
    broker.queue("jobs").send(b"x")
    broker.client.delete(broker.path, recursive=True)  # an operator's `deleteall` of the store's path
    assert broker.names() == []
    assert broker.gc() == {}
    q = broker.queue("other")
    q.send(b"y")
    assert broker.names() == ["other"] and [m.body for m in q.receive()] == [b"y"]


_paths = iter(range(10**6))


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    with own_zookeeper() as zk:  # of this module's own: its tests freeze it
        yield zk


def _wait_for(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout:g}s"
        time.sleep(0.05)


def test_a_queue_delete_that_an_outage_stops_before_its_change_leaves_the_handle_working(
    own_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete marked the handle gone (and closed it) before its change: an outage between its
    look for the queue and its change left the queue whole and its handle refusing every call
    (QueueNotFoundError), and the broker's next ``queue(name)`` another handle."""
    url = own_server.url(f"/left3{os.getpid()}x{next(_paths)}")
    with Broker(url, session_timeout=1.0, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"before")
        client, node, frozen = broker.client, f"{broker.path}/jobs", []
        exists = client.exists

        def exists_then_outage(path: str, *args: Any, **kwargs: Any) -> Any:
            stat = exists(path, *args, **kwargs)
            if path == node and not frozen:  # the delete's look for the queue: then the outage
                frozen.append(True)
                own_server.process.send_signal(signal.SIGSTOP)
                _wait_for(lambda: not broker._connected.is_set(), "disconnected")
            return stat

        monkeypatch.setattr(client, "exists", exists_then_outage)
        try:
            with pytest.raises(StoreUnavailableError, match="deleting queue 'jobs'"):
                broker.delete("jobs")
        finally:
            own_server.process.send_signal(signal.SIGCONT)
            monkeypatch.undo()
        assert frozen
        _wait_for(lambda: broker._connected.is_set(), "reconnected")
        assert broker.exists("jobs")
        assert broker.queue("jobs") is q  # the handle of before, working
        q.send(b"after")
        assert sorted(m.body for m in q.receive(10)) == [b"after", b"before"]
        broker.delete("jobs")  # and a delete once the ensemble is back deletes it
        assert not broker.exists("jobs")


def test_a_deduplicated_send_whose_records_node_is_gone_ends_with_an_error(broker) -> None:  # noqa: F811
    """What a queue delete under way leaves for a moment (node by node): the records' node gone
    while the tasks are there. The record's create fails there every time: no race to try again
    (the send must end, with the queue's error, not loop)."""
    from journalq.errors import QueueNotFoundError

    q = broker.queue("jobs")
    q.send(b"a", dedup_id="d1")  # (the records' node is made, and known made)
    broker.client.delete(f"{broker.path}/jobs/dedup", recursive=True)
    outcome: list[object] = []

    def send() -> None:
        try:
            outcome.append(q.send(b"b", dedup_id="d2"))
        except Exception as exc:  # the outcome checked
            outcome.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "the send did not end"
    assert isinstance(outcome[0], QueueNotFoundError), outcome
    assert [m.body for m in q.receive(10)] == [b"a"]  # nothing of it can be received


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
