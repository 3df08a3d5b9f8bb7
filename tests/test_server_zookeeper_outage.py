"""``journalq serve --data zk://...`` while its ZooKeeper server is frozen with SIGSTOP (the
connection open, nothing answering): posts and fetches answer 503 with ``Retry-After`` within the
broker's session timeout (10 s by default, ``--zk-session-timeout``), a long poll by the end of its
wait, ``/readyz`` too (not ready) while ``/healthz`` answers 200 (alive: no reason to restart the
server), and once the ZooKeeper server is thawed, requests succeed again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import own_zookeeper
from test_server_harness import ServerProcess

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")

SESSION = 10.0  # the session timeout of the broker that ``journalq serve`` opens
SLACK = 2.0


@pytest.fixture
def zookeeper() -> Iterator[Any]:
    """A ZooKeeper server of this test's own: it is frozen (the session's serves other tests)."""
    with own_zookeeper() as zk:
        yield zk


def test_a_frozen_ensemble_is_answered_503_in_time_and_requests_succeed_once_it_thaws(
    zookeeper: Any, tmp_path: Path, child_env: dict[str, str]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    # (the last --data given is the one taken: ServerProcess names a directory first)
    server = ServerProcess(tmp_path / "unused", "--data", zookeeper.url("/served"), "--sync", "none",
                           log_dir=tmp_path, env=child_env).start(timeout=60)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.put("/jobs").status_code == 201
            assert client.post("/jobs/messages", content=b"before").status_code == 201

            def timed(method: str, path: str, **options: Any) -> tuple[float, httpx.Response]:
                start = time.monotonic()
                # a bounded wait: a request that blocks (as before) fails the test, not hangs it
                answer = client.request(method, path, timeout=SESSION + SLACK + 10, **options)
                return time.monotonic() - start, answer

            def ask_all() -> dict[str, tuple[float, httpx.Response]]:
                with ThreadPoolExecutor(4) as pool:
                    asked = {
                        "post": pool.submit(timed, "POST", "/jobs/messages", content=b"during"),
                        "get": pool.submit(timed, "GET", "/jobs/messages"),
                        "long poll": pool.submit(timed, "GET", "/jobs/messages", params={"wait": 3}),
                        "healthz": pool.submit(timed, "GET", "/healthz"),
                        "readyz": pool.submit(timed, "GET", "/readyz"),
                    }
                    return {name: future.result() for name, future in asked.items()}

            zookeeper.process.send_signal(signal.SIGSTOP)
            try:
                at_once = ask_all()  # in flight when the freeze comes
                time.sleep(max(0.0, 3 - min(took for took, _ in at_once.values())))
                later = ask_all()  # once kazoo noticed, and reconnects to a server that does not answer
            finally:
                zookeeper.process.send_signal(signal.SIGCONT)
            for when, answers in (("at once", at_once), ("later", later)):
                for name, (took, answer) in answers.items():
                    bound = (3 + 1 if name == "long poll" else SESSION) + SLACK
                    assert took <= bound, f"{name} ({when}) answered after {took:.1f}s, over {bound:g}s"
                    if name == "healthz":
                        assert answer.status_code == 200 and answer.json() == {"status": "ok"}, (when, answer.text)
                        continue
                    if name == "readyz" and answer.status_code == 200:
                        continue  # (it may list the queues between the freeze and kazoo's noticing)
                    assert answer.status_code == 503 and answer.headers.get("Retry-After"), (name, when, answer.text)
                    assert zookeeper.hosts in answer.json()["error"], (name, when, answer.text)

            deadline = time.monotonic() + SESSION + SLACK
            while (posted := client.post("/jobs/messages", content=b"after")).status_code == 503:
                assert time.monotonic() < deadline, f"still 503 after the thaw: {posted.text}"
                time.sleep(0.2)
            assert posted.status_code == 201, posted.text
            bodies = set()
            while (fetched := client.get("/jobs/messages", params={"visibility_timeout": 600})).status_code == 200:
                bodies.add(fetched.content)
            assert fetched.status_code == 204 and {b"before", b"after"} <= bodies, (fetched, bodies)
            assert client.get("/healthz").status_code == 200
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()


def test_the_session_timeout_is_an_option_of_serve(zookeeper: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    """``--zk-session-timeout 2``: a request that meets the frozen ensemble gives up after 2 s
    (its 503 says so), not the default 10; the server is alive all along, ready again after."""
    server = ServerProcess(tmp_path / "unused", "--data", zookeeper.url("/timed"), "--sync", "none",
                           "--zk-session-timeout", "2", log_dir=tmp_path, env=child_env).start(timeout=60)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.get("/readyz").status_code == 200
            zookeeper.process.send_signal(signal.SIGSTOP)
            try:
                answers = [client.get("/readyz") for _ in range(4)]
                alive = client.get("/healthz")
            finally:
                zookeeper.process.send_signal(signal.SIGCONT)
            assert alive.status_code == 200, alive.text
            assert all(a.status_code == 503 and a.headers.get("Retry-After") for a in answers), [
                a.text for a in answers
            ]
            errors = [a.json()["error"] for a in answers]
            # (one asked just as the connection went is told so, without the wait)
            assert any("within 2s" in error for error in errors), errors
            assert not any("within 10s" in error for error in errors), errors
            deadline = time.monotonic() + SESSION + SLACK
            while (ready := client.get("/readyz")).status_code == 503:
                assert time.monotonic() < deadline, f"still not ready after the thaw: {ready.text}"
                time.sleep(0.2)
            assert ready.status_code == 200, ready.text
    finally:
        server.stop()
