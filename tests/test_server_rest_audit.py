"""mq's REST API, audited against the mq seed and the README: what the endpoints answer where the
other test modules do not look (a queue whose stored files are damaged)."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
from test_server_harness import ServerProcess
from test_server_rest import client, server  # noqa: F401 (fixtures: a server for this module, a client)

from journalq.queue import Broker




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


def test_a_fetch_without_wait_long_polls_for_the_queue_receive_wait(
    server: ServerProcess, client: httpx.Client
) -> None:
    """A queue's receive wait (SQS's ReceiveMessageWaitTimeSeconds, ``receive_wait``) is the
    default of a fetch's ``wait``, as the queue's visibility timeout is of ``visibility_timeout``
    and as SQS's ReceiveMessage and the library's receive take it: the fetch ended at once with
    204, and clients polled in a loop a queue made for long polling. ``?wait=0`` still asks for
    no wait."""
    name = f"polled-{uuid.uuid4().hex[:8]}"
    with Broker(server.data) as broker:
        broker.queue(name, receive_wait=3)
    started = time.monotonic()
    assert client.get(f"/{name}/messages", params={"wait": 0}).status_code == 204
    assert time.monotonic() - started < 1

    def post_later() -> None:
        time.sleep(0.5)
        httpx.post(f"{server.url}/{name}/messages", content=b"late").raise_for_status()

    poster = threading.Thread(target=post_later)
    poster.start()
    started = time.monotonic()
    got = client.get(f"/{name}/messages")
    took = time.monotonic() - started
    poster.join()
    assert got.status_code == 200 and got.content == b"late", (got.status_code, took)
    assert 0.4 < took < 2.5, took
    started = time.monotonic()
    assert client.get(f"/{name}/messages").status_code == 204  # after the queue's 3 s
    assert 2.9 < time.monotonic() - started < 5
