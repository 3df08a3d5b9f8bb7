"""Brokers and queue handles of the ZooKeeper store once closed, or closed under a call: a call on a
closed broker says so, a closed handle receives nothing and registers no consumer, the broker gives
a working handle after the one it gave was closed; kazoo's errors come out as journalq's."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from journalq.queue import Broker

from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_node_that_refuses_this_client_is_a_journalq_error(broker) -> None:  # noqa: F811
    from kazoo.security import OPEN_ACL_UNSAFE, make_acl

    from journalq import Error

    broker.client.set_acls(broker.path, [make_acl("world", "anyone", read=True, admin=True)])  # no create
    try:
        with pytest.raises(Error, match=r"refused a request while opening queue 'jobs' \(NoAuthError"):
            broker.queue("jobs")
    finally:
        broker.client.set_acls(broker.path, OPEN_ACL_UNSAFE)


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


def test_the_broker_gives_a_working_handle_after_the_one_it_gave_was_closed(broker) -> None:  # noqa: F811
    """The broker kept the closed handle and gave it again: its long polls returned at once with
    nothing (a closed handle's poll ends), and its consumer, unregistered by the close, still
    counted as registered (its first claims failed)."""
    q = broker.queue("jobs")
    held = q.send(b"held")
    (m,) = q.receive(visibility_timeout=60)
    q.close()
    again = broker.queue("jobs")
    assert again is not q and broker.topic("jobs").channel("default") is again
    sending = threading.Timer(0.5, lambda: again.send(b"later"))
    sending.start()
    try:
        start = time.monotonic()
        got = again.receive(wait=10)
    finally:
        sending.join()
    assert [x.body for x in got] == [b"later"] and time.monotonic() - start >= 0.4
    assert again.consumer_id in again.consumers()
    again.delete(m.receipt)  # the closed handle's delivery was kept: its receipt still good
    assert again.task(held).state == "finished"


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
