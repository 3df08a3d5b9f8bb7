"""``journalq serve --data zk://...`` while its ZooKeeper server is frozen with SIGSTOP (the
connection open, nothing answering): posts and fetches answer 503 with ``Retry-After`` within the
broker's session timeout (10 s: ``serve``'s), a long poll by the end of its wait, ``/healthz``
answers all the same, and once the ZooKeeper server is thawed, requests succeed again."""

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
                    if name == "healthz" and answer.status_code == 200:
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
    finally:
        server.stop()
