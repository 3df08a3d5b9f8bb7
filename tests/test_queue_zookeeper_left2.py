"""The ZooKeeper store under contention and outages, and where it must do as the file store does:
by-id, by-receipt and settings changes that lose many races in a row to other processes still
end as they must (done, or a clear error), never with a spurious failure or a success that changed
nothing; dead-letter moves that meet a deleted dead-letter queue, a failure, or metadata near the
limit; and the error of a call on a closed broker."""

from __future__ import annotations

import pytest

from journalq.queue import Broker
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

RACES = 25  # more races lost in a row than any fixed number of tries would take


def _changed_meanwhile(q, change, monkeypatch: pytest.MonkeyPatch, times: int = RACES) -> list[int]:
    """Call ``change`` (another consumer's write of the entry: a new version) between each of
    ``q``'s reads of its entries and its write of them, ``times`` times; returns a counter."""
    from journalq.queue.zookeeper.store import ZooKeeperQueue

    apply, done = ZooKeeperQueue._apply, [0]

    def change_first(self, changes, **options):
        if self is q and changes and done[0] < times:
            done[0] += 1
            change()
        return apply(self, changes, **options)

    monkeypatch.setattr(ZooKeeperQueue, "_apply", change_first)
    return done


@pytest.mark.parametrize("how", ["purge", "delete_id"])
def test_a_by_id_finish_that_loses_many_races_to_a_heartbeating_consumer_still_finishes(
    url: str, how: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q, holder = a.queue("jobs"), b.queue("jobs")
        task = q.send(b"x")
        (m,) = holder.receive(visibility_timeout=60)
        # the holder extends its visibility (a heartbeat) each time between q's read and write
        done = _changed_meanwhile(q, lambda: holder.change_visibility(m.receipt, 60), monkeypatch)
        if how == "purge":
            q.purge()
        else:
            q.delete_id(task)
        assert done[0] == RACES
        assert q.task(task).state == "finished"
        assert a.client.get_children(f"{a.path}/jobs/queue") == []


def test_a_receipt_delete_that_loses_many_races_to_its_heartbeat_deletes_or_says_why(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        q, holder = a.queue("jobs"), b.queue("jobs")
        task = q.send(b"x")
        (m,) = holder.receive(visibility_timeout=60)
        # the same delivery's receipt, used by two workers: one heartbeats, the other deletes
        done = _changed_meanwhile(q, lambda: holder.change_visibility(m.receipt, 60), monkeypatch)
        assert q.delete_many([m.receipt]) == [None]
        assert q.task(task).state == "finished"  # (None said it was deleted: it must be)
        assert done[0] == RACES
        assert a.client.get_children(f"{a.path}/jobs/queue") == []


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


def test_a_call_on_a_closed_broker_says_the_broker_was_closed(url: str) -> None:  # noqa: F811
    """kazoo's error for a closed client is a kind of its session-expired error: the call said
    that ZooKeeper had ended the session, sending an operator after the ensemble."""
    from journalq.errors import StoreUnavailableError

    b = Broker(url, sync="none")
    q = b.queue("jobs")
    b.close()
    for call in (lambda: q.send(b"x"), lambda: q.receive(), lambda: b.names()):
        with pytest.raises(StoreUnavailableError, match="the broker was closed") as raised:
            call()
        assert "ended the session" not in str(raised.value)


def test_a_settings_change_that_loses_many_races_to_other_processes_still_holds(
    url: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from journalq.queue.zookeeper.store import ZooKeeperBroker

    with Broker(url, sync="none") as a, Broker(url, sync="none") as b:
        a.queue("jobs")
        save, raced = ZooKeeperBroker._save, []

        def other_saves_first(self, name, settings, *args, **kwargs):
            if self is a and len(raced) < RACES:  # between each of a's reads of the settings and its write
                raced.append(b.configure("jobs", delay=len(raced) % 2 + 1))
            return save(self, name, settings, *args, **kwargs)

        monkeypatch.setattr(ZooKeeperBroker, "_save", other_saves_first)
        assert a.configure("jobs", visibility_timeout=5).visibility_timeout == 5
        assert len(raced) == RACES
    with Broker(url, sync="none") as c:
        settings = c.queue("jobs").settings
        assert (settings.visibility_timeout, settings.delay) == (5, (RACES - 1) % 2 + 1)  # (the last of the other's)


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


def test_a_message_with_metadata_near_the_limit_can_be_dead_lettered(broker) -> None:  # noqa: F811
    """The store took the message; its dead letter adds its source and a deduplication id to its
    metadata, which went over the limit: the move failed every time the message was met (each
    receive that met it then failed with InvalidMessageError, naming no message of the caller's),
    and the message never left the queue."""
    from journalq.errors import InvalidMessageError

    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="jobs-dlq")
    big = "m" * 999_900  # just under the limit
    poison = q.send(b"poison", metadata=big)
    (m,) = q.receive(visibility_timeout=0)
    assert m.id == poison
    assert q.receive(10) == []  # moved
    assert q.task(poison).state == "dead"
    dlq = broker.queue("jobs-dlq")
    (letter,) = dlq.receive(visibility_timeout=0)
    assert (letter.body, letter.metadata, letter.source["id"]) == (b"poison", big, poison)
    dlq.set_metadata(letter.id, big)  # (its source and id count no more here)
    assert dlq.redrive() == 1  # and back, with a deduplication id of the redrive's
    (back,) = q.receive()
    assert (back.body, back.metadata) == (b"poison", big)
    with pytest.raises(InvalidMessageError, match="over the ZooKeeper store's 1000000"):
        q.send(b"x", metadata=big + "m" * 100, dedup_id="d")  # the message's own still count
