"""mq's REST API, audited against the mq seed and the README: what the endpoints answer where the
other test modules do not look (a queue whose stored files are damaged)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from test_server_harness import ServerProcess, module_server

from journalq.queue import Broker


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_a_queue_whose_settings_file_is_damaged_is_a_500_that_names_no_path(
    server: ServerProcess, client: httpx.Client
) -> None:
    """The README: answers never name the data directory, and stored data that cannot be read is
    the server's problem (500), not the request's. A queue's settings file that does not load
    (damaged, or written by hand) was answered 400, as if the request were wrong, with the file's
    full path in the error."""
    name = f"damaged-{uuid.uuid4().hex[:8]}"
    with Broker(server.data) as broker:  # made beside the server, which has not opened it yet
        broker.queue(name).send(b"kept")
    (server.data / name / "queue.json").write_text('{"visibility_timeout": -5}')
    answers = {
        "GET /q": client.get(f"/{name}"),
        "PUT /q": client.put(f"/{name}"),
        "GET /q/messages": client.get(f"/{name}/messages"),
        "POST /q/messages": client.post(f"/{name}/messages", content=b"new"),
        "DELETE /q/messages/0": client.delete(f"/{name}/messages/0"),
    }
    for what, answer in answers.items():
        assert answer.status_code == 500, (what, answer.status_code, answer.text)
        error = answer.json()["error"]
        assert "visibility_timeout" in error, (what, error)  # the problem, named
        assert str(server.data) not in error, (what, error)
