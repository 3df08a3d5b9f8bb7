"""The ZooKeeper store doing with dead letters as the file store does (``test_queue_dead_letter_moves``):
a dead letter moved on keeps its running receive count; a redrive's receives move nothing on by
the dead-letter queue's own policy; a dead-letter queue that cannot take its letters does not
block its source. Where the file store's test reads the same on this store, it is run here as
it is, on a ZooKeeper broker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

import test_queue_dead_letter_moves as on_files
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_dead_letter_moved_on_keeps_its_running_receive_count(broker) -> None:  # noqa: F811
    on_files.test_a_dead_letter_moved_on_keeps_its_running_receive_count(broker)


def test_a_redrive_does_not_move_dead_letters_on_by_the_dead_letter_queue_s_own_policy(broker) -> None:  # noqa: F811
    # (this store has no shards: the file store's test is run with one)
    on_files.test_a_redrive_does_not_move_dead_letters_on_by_the_dead_letter_queue_s_own_policy(broker, shards=1)


def _damage_settings(broker, name: str) -> tuple[str, Callable[[], None]]:  # noqa: F811
    """The settings of queue ``name`` damaged in its node: (what the warning names, the mending)."""
    node = f"{broker.path}/{name}"
    good = broker.client.get(node)[0]
    broker.client.set(node, b"{damaged")
    return node, lambda: broker.client.set(node, good)


def _refuse_tasks(broker, name: str) -> tuple[str, Callable[[], None]]:  # noqa: F811
    """The ensemble refuses to make tasks in queue ``name`` (an ACL that only lets them be read)."""
    from kazoo.security import OPEN_ACL_UNSAFE, make_acl

    node = f"{broker.path}/{name}/tasks"
    broker.client.set_acls(node, [make_acl("world", "anyone", read=True, admin=True)])
    return "NoAuthError", lambda: broker.client.set_acls(node, OPEN_ACL_UNSAFE)


@pytest.mark.parametrize("break_it", [_damage_settings, _refuse_tasks])
def test_a_dead_letter_queue_that_cannot_take_its_letters_does_not_block_the_source(
    broker, caplog: pytest.LogCaptureFixture, break_it: Callable[..., tuple[str, Callable[[], None]]]  # noqa: F811
) -> None:
    """As on files: the source queue goes on delivering what it can; its dead letters stay in it,
    not delivered again, not lost (nor their group's followers delivered before them), with a
    warning naming the cause once per ``task_gc_interval``, and move once the dead-letter queue
    can take them. (Every receive that met them failed with the dead-letter queue's error.)"""
    q = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dlq", task_gc_interval=1.5)
    broker.queue("dlq")
    cause, mend = break_it(broker, "dlq")
    poison = q.send(b"poison", group_id="g")
    q.send(b"after poison", group_id="g")
    q.send(b"fine")
    (first,) = q.receive(visibility_timeout=0)
    assert first.body == b"poison"
    with caplog.at_level(logging.WARNING, logger="journalq.queue"):
        (fine,) = q.receive(10)
        assert fine.body == b"fine"
        q.delete(fine.receipt)
        assert q.receive(10) == [] and q.receive(10) == []
    warnings = [r.getMessage() for r in caplog.records if "cannot move" in r.getMessage()]
    assert len(warnings) == 1 and cause in warnings[0], warnings
    assert q.task(poison).state == "inserted"  # kept, given back by the mover
    mend()
    time.sleep(1.6)
    assert [m.body for m in q.receive(10)] == [b"after poison"]  # the poison moved first
    assert q.task(poison).state == "dead" and q.stats().dead == 1
    (letter,) = broker.queue("dlq").receive(10)
    assert (letter.body, letter.source["id"], letter.source["count"]) == (b"poison", poison, 1)
