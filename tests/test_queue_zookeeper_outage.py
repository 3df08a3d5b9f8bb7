"""The ZooKeeper store while its server is out of reach: frozen with SIGSTOP (the connection stays
open, nothing answers: the worst case) or killed (connections refused). Every public call ends
within the broker's ``session_timeout`` (give or take kazoo's own detection) with a
``StoreUnavailableError`` that names the ensemble and what the call was doing; a long poll ends
with the error by the end of its wait; once the server is back, the next call works, and the
receipts of before follow the store's session rules. These tests freeze and kill a server of
their own (the session's is shared by the other tests)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from journalq.errors import StaleReceiptError, StoreUnavailableError
from conftest import own_zookeeper
from journalq.queue import Broker

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

SESSION = 1.0  # the brokers' session timeout: the bound of every wait for the ensemble
SLACK = 2.0  # what a loaded 2-core machine may add to it (1.0 was once not enough in a long run)
_paths = iter(range(10**6))


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with own_zookeeper() as zk:  # of this module's own: its tests freeze and kill it
        yield zk


def url(server: Any) -> str:
    return server.url(f"/out{os.getpid()}x{next(_paths)}")


def take_down(server: Any, how: str) -> None:
    if how == "freeze":
        server.process.send_signal(signal.SIGSTOP)
    else:
        server.kill()


def bring_back(server: Any, how: str) -> None:
    if how == "freeze":
        server.process.send_signal(signal.SIGCONT)
    else:
        server.start()


def timed(calls: dict[str, Callable[[], object]], join: float) -> dict[str, tuple[float, object]]:
    """Run the calls side by side; for each, how long it took and what it raised (or returned).
    One still running after ``join`` seconds is missing from the answer."""
    outcomes: dict[str, tuple[float, object]] = {}

    def run(name: str, call: Callable[[], object]) -> None:
        start = time.monotonic()
        try:
            outcome: object = call()
        except Exception as exc:  # what is raised is the outcome checked
            outcome = exc
        outcomes[name] = (time.monotonic() - start, outcome)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + join
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(outcomes)


def send_when_back(queue: Any, bound: float) -> None:
    """Send b"after" once the server is back: calls work again within ``bound`` seconds. The
    first ones may still be refused, and say so, as they should: a loaded machine's reconnection
    may outlast one call's wait, and a server thawed after longer than the session may end that
    session just after kazoo reconnected to it (the call then in flight loses its connection)."""
    start = time.monotonic()
    while True:
        try:
            assert queue.send(b"after")
            break
        except StoreUnavailableError:
            if time.monotonic() - start > bound:
                raise
            time.sleep(0.05)  # (a lost connection is said at once)
    assert time.monotonic() - start <= bound


def check_unavailable(outcomes: dict[str, tuple[float, object]], doing: dict[str, str], hosts: str,
                      bound: float) -> None:
    """Each call raised ``StoreUnavailableError`` naming ``hosts`` and what it did, within ``bound``."""
    blocked = sorted(set(doing) - set(outcomes))
    assert not blocked, f"still blocked after {bound:g}s: {blocked}"
    for name, (took, outcome) in outcomes.items():
        assert isinstance(outcome, StoreUnavailableError), (name, outcome)
        assert took <= bound, f"{name} blocked {took:.1f}s, over {bound:g}s: {outcome}"
    for name, (_, outcome) in outcomes.items():
        assert hosts in str(outcome) and doing[name] in str(outcome), (name, str(outcome))


@pytest.mark.parametrize("how, outage", [("freeze", 4.0), ("kill", 13.0)])
def test_every_call_during_an_outage_raises_within_the_session_timeout(server: Any, how: str, outage: float) -> None:
    """Before, a call made while kazoo reconnected waited until the server came back (calls
    queued by kazoo wait without a bound), and after a long outage kazoo's reconnection had
    backed off for as long again (up to an hour): the call after the server's return waited too.
    The outages outlast the session (a kill of 13 s: twice kazoo's old back-off)."""
    with Broker(url(server), session_timeout=SESSION, sync="none") as broker:
        jobs, other = broker.queue("jobs"), broker.queue("other")
        other.send(b"z")
        jobs.send_many([b"%d" % i for i in range(6)])
        got = jobs.receive(6, visibility_timeout=600)
        receipts = [m.receipt for m in got]
        calls: dict[str, tuple[Callable[[], object], str]] = {
            "send": (lambda: jobs.send(b"x"), "sending 1 message to 'jobs'"),
            "send_many": (lambda: jobs.send_many([b"x", b"y"]), "sending 2 messages to 'jobs'"),
            "receive": (lambda: jobs.receive(), "receiving from 'jobs'"),
            "receive_wait": (lambda: jobs.receive(wait=30), "receiving from 'jobs'"),
            "delete": (lambda: jobs.delete(receipts[0]), "deleting 1 receipt(s) in 'jobs'"),
            "delete_many": (lambda: jobs.delete_many(receipts[1:3]), "deleting 2 receipt(s) in 'jobs'"),
            "change_visibility": (lambda: jobs.change_visibility(receipts[3], 5), "changing the visibility"),
            "release": (lambda: jobs.release(receipts[4]), "changing the visibility"),
            "stats": (lambda: jobs.stats(), "counting the messages of 'jobs'"),
            "task": (lambda: jobs.task(got[5].id), f"reading task {got[5].id} of 'jobs'"),
            "purge": (lambda: other.purge(), "purging 'other'"),
            "consumers": (lambda: jobs.consumers(), "listing the consumers of 'jobs'"),
            "gc": (lambda: broker.gc(), "listing the queues"),
            "open a queue": (lambda: broker.queue("new"), "opening queue 'new'"),
        }
        doing = {name: text for name, (_, text) in calls.items()}
        session = broker.client.client_id[0]
        down_at = time.monotonic()
        take_down(server, how)
        try:
            outcomes = timed({name: call for name, (call, _) in calls.items()}, SESSION + SLACK + 5)
            check_unavailable(outcomes, doing, server.hosts, SESSION + SLACK)
            # late in the outage too (kazoo has tried to reconnect for seconds)
            time.sleep(max(0.0, outage - 1.5 - (time.monotonic() - down_at)))
            late = {name: calls[name][0] for name in ("send", "receive")}
            check_unavailable(timed(late, SESSION + SLACK + 5), {name: doing[name] for name in late}, server.hosts,
                              SESSION + SLACK)
        finally:
            bring_back(server, how)
        send_when_back(jobs, SESSION + SLACK)
        # The receipts of before: good while the session lives; refused once it ended (ZooKeeper
        # gives a frozen server's sessions, and a restarted one's, time to come back: either may be).
        refused = jobs.delete_many([receipts[5]])[0]
        if broker.client.client_id[0] == session:
            assert refused is None
        else:
            assert isinstance(refused, StaleReceiptError) and "session" in str(refused)
        assert any(m.body == b"after" for m in jobs.receive(10, visibility_timeout=600))


def test_a_long_poll_during_an_outage_ends_with_the_error_by_the_end_of_its_wait(server: Any) -> None:
    """A long session (10 s asked for): a long poll of 2 s that the outage meets while it waits,
    and one that begins once the broker knows the connection is lost, both end with the error by
    the end of their wait (give or take a second for the last answer). Before, the second one
    waited for the server's return: kazoo keeps the requests made while it reconnects."""
    with Broker(url(server), session_timeout=10, sync="none") as broker:
        jobs = broker.queue("jobs")
        jobs.send(b"before")
        jobs.delete(jobs.receive()[0].receipt)
        freezing = threading.Timer(0.3, take_down, (server, "freeze"))
        freezing.start()
        try:
            polled = timed({"receive": lambda: jobs.receive(wait=2)}, 2 + SLACK + 10)
            deadline = time.monotonic() + 10
            while broker.client.connected and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not broker.client.connected, "kazoo did not notice that the server froze"
            polled_later = timed({"receive": lambda: jobs.receive(wait=2)}, 2 + SLACK + 10)
        finally:
            freezing.join()
            bring_back(server, "freeze")
        for outcomes in (polled, polled_later):
            check_unavailable(outcomes, {"receive": "receiving from 'jobs'"}, server.hosts, 2 + SLACK + 0.5)
        send_when_back(jobs, 10 + SLACK)
        assert [m.body for m in jobs.receive(wait=10)] == [b"after"]
