"""The direct path of ``POST /{queue}/messages`` (``DirectHttpToolsProtocol``): answered without
ASGI, it must answer exactly what the ASGI path answers, keep pipelined answers in order, leave
bodies still on their way (and their 408) to the ASGI path, and answer 503 with nothing visible
when the sync fails. The server runs in this process (uvicorn in a thread), so that faults can be
injected and the protocol's choices counted."""

from __future__ import annotations

import errno
import json
import re
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import SyncFault
import uvicorn
from test_server_harness import await_waiting_receives, sqs_client, status_of

from journalq.errors import StoreUnavailableError
from journalq.journal.inspect import check
from journalq.queue import Broker
from journalq.queue import sharded as sharded_module
from journalq.queue.channel import Channel
from journalq.server import app as app_module
from journalq.server import sqs as sqs_module
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.h11_protocol import StoppingH11Protocol
from journalq.server.protocol import DirectHttpToolsProtocol, HeadLimitedHttpToolsProtocol
from journalq.server.scopes import header


@contextmanager
def serving(
    data: Path, protocol: type, keep_alive: float = 5, limit_concurrency: int | None = None, **settings: Any
) -> Iterator[int]:
    """A journalq app under uvicorn with ``protocol`` (idle connections closed after
    ``keep_alive`` seconds; uvicorn's ``limit_concurrency``), in a thread; yields its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(ServerConfig(data=data, port=port, **settings))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_level="warning", access_log=False,
                                           timeout_keep_alive=keep_alive, timeout_graceful_shutdown=5,
                                           limit_concurrency=limit_concurrency))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.parametrize("protocol", [StoppingH11Protocol, DirectHttpToolsProtocol], ids=["h11", "httptools"])
def test_a_stop_ends_long_polls_under_either_protocol(tmp_path: Path, protocol: type) -> None:
    """uvicorn's h11 protocol (what ``journalq serve`` runs without httptools) tells the app that
    the server stops, as journalq's httptools protocol does: a REST poll of 600 s and an SQS one
    of 20 s end with no message (204; no Messages). Before, under h11 they held the stop until
    uvicorn's graceful-shutdown timeout (5 s here) cut them off, answered with nothing."""
    results: dict[str, Any] = {}

    def poll(name: str, ask: Any) -> None:
        try:
            results[name] = ask()
        except Exception as exc:  # noqa: BLE001 - what the client met is the test's finding
            results[name] = repr(exc)

    with serving(tmp_path, protocol) as port:
        url = f"http://127.0.0.1:{port}"
        httpx.put(f"{url}/idle").raise_for_status()
        queue_url = sqs_client(url).get_queue_url(QueueName="idle")["QueueUrl"]
        polls = [
            threading.Thread(target=poll, args=("rest", lambda: httpx.get(
                f"{url}/idle/messages", params={"wait": 600}, timeout=60).status_code)),
            threading.Thread(target=poll, args=("sqs", lambda: sqs_client(url, read_timeout=60).receive_message(
                QueueUrl=queue_url, WaitTimeSeconds=20).get("Messages", "none"))),
        ]
        for thread in polls:
            thread.start()
        # Both polls wait before the stop: a fixed sleep was too short on a loaded CI host, where
        # the clients had not yet connected when the server stopped, and met a refused connection.
        await_waiting_receives(url, "idle", 2)
        assert not results
    # (the server has stopped: ``serving`` waited for it)
    for thread in polls:
        thread.join(30)
    assert results == {"rest": 204, "sqs": "none"}, results


def test_serve_runs_h11_that_ends_long_polls_when_httptools_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from journalq.cli.serve import http_protocol

    assert http_protocol() is DirectHttpToolsProtocol
    monkeypatch.setitem(sys.modules, "journalq.server.protocol", None)  # its import fails, as without httptools
    assert http_protocol() is StoppingH11Protocol


def _note_direct(monkeypatch: pytest.MonkeyPatch, note: Any) -> None:
    """``note(cycle)`` of each request that the direct path takes."""
    real = DirectHttpToolsProtocol._direct

    def direct(self: DirectHttpToolsProtocol, cycle: Any, handler: Any) -> bool:
        took = real(self, cycle, handler)
        if took:
            note(cycle)
        return took

    monkeypatch.setattr(DirectHttpToolsProtocol, "_direct", direct)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies that the direct path took (so a test can tell that it was used)."""
    bodies: list[bytes] = []
    _note_direct(monkeypatch, lambda cycle: bodies.append(bytes(cycle.body)))
    return bodies


@pytest.fixture
def taken_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The method and path of each request that the direct path took."""
    requests: list[str] = []
    _note_direct(monkeypatch, lambda cycle: requests.append(f"{cycle.scope['method']} {cycle.scope['path']}"))
    return requests


def post(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: test", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Answers:
    """Reads answers one at a time from a connection that may carry several (pipelining);
    interim answers (``100 Continue``) are skipped."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.data = b""

    def next(self) -> bytes:
        while True:
            head, sep, rest = self.data.partition(b"\r\n\r\n")
            if sep and head.startswith(b"HTTP/1.1 1"):
                self.data = rest
                continue
            if sep:
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                size = int(length[1]) if length else 0
                if len(rest) >= size:
                    self.data = rest[size:]
                    return head + sep + rest[:size]
            chunk = self.s.recv(65536)
            if not chunk:
                answer, self.data = self.data, b""
                return answer
            self.data += chunk


def exchange(port: int, *requests: bytes) -> list[bytes]:
    """Writes the requests in one write on one connection and reads one answer each."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"".join(requests))
        answers = Answers(s)
        return [answers.next() for _ in requests]


def normalized(answer: bytes) -> bytes:
    """The answer without what differs from one server to another: dates, message and request ids."""
    answer = re.sub(rb"date: [^\r]*\r\n", b"", answer)
    answer = re.sub(rb"x-amzn-requestid: [^\r]*\r\n", b"", answer)
    answer = re.sub(rb'"MessageId": "[^"]*"', b'"MessageId": "ID"', answer)
    answer = re.sub(rb'Timestamp": "\d+"', b'Timestamp": "T"', answer)
    return re.sub(rb"x-message-id: [\w.]+", b"x-message-id: ID", answer)  # the offset and the queue's token


def sqs(action: str, payload: dict[str, Any] | bytes, *headers: str) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return post("/", body, f"X-Amz-Target: AmazonSQS.{action}", "Content-Type: application/x-amz-json-1.0", *headers)


REQUESTS = [
    post("/q/messages", b"hello"),
    post("/q/messages", b""),
    post("/nope/messages", b"nowhere"),
    post("/metrics/messages", b"reserved"),
    post("/q/messages", b"x" * 101),  # over the size limit
    post("/q/messages", b"kept", "Authorization: Bearer wrong"),
    post("/q/messages", b"one-zero", version="1.0"),  # answered, then the connection is closed
    # A query (one POST does not take: 400), an escape: uvicorn's request cycle.
    post("/q/messages?note=1", b"with query"),
    post("/%71/messages", b"escaped"),
    sqs("SendMessage", {"QueueUrl": "http://test/000000000000/q", "MessageBody": "by sqs"}),
    sqs("SendMessageBatch", {"QueueUrl": "http://test/000000000000/q", "Entries": [
        {"Id": "a", "MessageBody": "batch a"}, {"Id": "b", "MessageBody": "batch b", "DelaySeconds": 901}]}),
    sqs("SendMessage", {"QueueUrl": "http://test/000000000000/nope", "MessageBody": "nowhere"}),
    sqs("SendMessage", {"MessageBody": "no queue url"}),
    sqs("SendMessage", b"not json"),
    sqs("SendMessage", {"QueueUrl": "http://test/000000000000/q", "MessageBody": "x"}, "Authorization: Bearer wrong"),
    sqs("GetQueueAttributes", {"QueueUrl": "http://test/000000000000/q", "AttributeNames": ["All"]}),
    sqs("DeleteMessage", {"QueueUrl": "http://test/000000000000/q", "ReceiptHandle": "0.1.nothing.here"}),
    sqs("DeleteMessage", {"QueueUrl": "http://test/000000000000/q"}),
    sqs("DeleteMessage", {"QueueUrl": "http://test/000000000000/nope", "ReceiptHandle": "0.1.nothing.here"}),
]
STATUSES = [201, 201, 404, 400, 413, 401, 201, 400, 201, 200, 200, 400, 400, 400, 401, 200, 404, 400, 400]


def test_the_direct_path_answers_as_the_asgi_path(tmp_path: Path, taken: list[bytes]) -> None:
    answers = {}
    for protocol in (HeadLimitedHttpToolsProtocol, DirectHttpToolsProtocol):
        data = tmp_path / "data"  # the same path for both: 404's message names it
        with serving(data, protocol, max_message_size=100, rest_token="secret") as port:
            auth = "Authorization: Bearer secret"
            assert status_of(exchange(port, b"PUT /q HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n" + auth.encode()
                                      + b"\r\n\r\n")[0]) == 201
            requests = [re.sub(rb"Host: test", b"Host: test\r\n" + auth.encode(), r) if b"Bearer" not in r else r
                        for r in REQUESTS]
            answers[protocol] = [normalized(exchange(port, request)[0]) for request in requests]
            metrics = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")[0]
            counts = sorted(re.findall(rb'journalq_request_seconds_count\{api="(?:rest|sqs)",[^}]*\} \S+',
                                       metrics))
            answers[protocol].append(b"\n".join(counts))
        with Broker(data) as broker:
            assert broker.queue("q", create=False).stats().available == 6
        data.rename(tmp_path / protocol.__name__)
    assert answers[DirectHttpToolsProtocol] == answers[HeadLimitedHttpToolsProtocol]
    statuses = [status_of(a) for a in answers[DirectHttpToolsProtocol][:-1]]
    assert statuses == STATUSES
    assert b"connection: close" in answers[DirectHttpToolsProtocol][6]
    assert b"QueueDoesNotExist" in answers[DirectHttpToolsProtocol][11]
    # Sends that reached a queue went the direct way; the refused ones, and other actions, to ASGI.
    assert [body[:30] for body in taken] == [b"hello", b"", b"nowhere", b"one-zero", b"escaped",
                                             *[b'{"QueueUrl": "http://test/0000'] * 6]
    assert b"ReceiptHandleIsInvalid" in answers[DirectHttpToolsProtocol][16]
    assert b"MissingParameter" in answers[DirectHttpToolsProtocol][17]
    assert b"QueueDoesNotExist" in answers[DirectHttpToolsProtocol][18]


def _consumer_run(port: int) -> list[bytes]:
    """mq's consumer requests, fetches and deletes with their refusals, on a new server; the
    answers without what differs from one server to another (ids, receipts, tokens)."""
    auth = "Authorization: Bearer secret"

    def request(method: str, path: str, *headers: str) -> bytes:
        return ("\r\n".join([f"{method} {path} HTTP/1.1", "Host: t", *headers]) + "\r\n\r\n").encode()

    def go(method: str, path: str, *headers: str) -> bytes:
        return exchange(port, request(method, path, *headers))[0]

    assert status_of(go("PUT", "/q", auth, "Content-Length: 0")) == 201
    for body in (b"m0", b"m1", b"m2"):
        assert status_of(exchange(port, post("/q/messages", body, auth))[0]) == 201
    answers = [go("GET", "/q/messages", auth)]  # the first: FastAPI's, which learns the queue's wait
    answers += [go("GET", "/q/messages", auth), go("GET", "/q/messages?visibility_timeout=0", auth)]
    first, second = (re.search(rb"x-message-id: ([\w.]+)", a)[1].decode() for a in answers[:2])
    answers += [
        go("GET", "/q/messages"),  # no token
        go("GET", "/nope/messages", auth),
        go("DELETE", f"/q/messages/{first}", auth),
        go("DELETE", f"/q/messages/{first}", auth),  # again: not waiting
        go("DELETE", "/q/messages/0.zz", auth),
        go("DELETE", f"/q/messages/{second}"),  # no token
        go("DELETE", f"/q/messages/{second}?note=1", auth),
        go("DELETE", "/nope/messages/1", auth),
        go("DELETE", "/metrics/messages/1", auth),
        go("GET", "/q/messages", auth),  # m2 again (its visibility was 0)
        go("GET", "/q/messages", auth),  # none: m1 and m2 are hidden
        go("HEAD", "/q/messages", auth),
        go("DELETE", f"/q/messages/{second}", auth),
    ]
    metrics = go("GET", "/metrics", auth)
    counts = sorted(re.findall(rb'journalq_(?:request_seconds_count\{api="rest",[^}]*\}'
                               rb'|messages_(?:out|deleted)_total\{[^}]*\}) \S+', metrics))
    answers.append(b"\n".join(counts))
    return [re.sub(rb"x-receipt: [\w.]+|'\d+\.[0-9a-f]{8}'", b"R", normalized(a)) for a in answers]


def test_fetches_and_deletes_on_the_direct_path_answer_as_the_asgi_path(
    tmp_path: Path, taken_requests: list[str]
) -> None:
    """``GET /{queue}/messages`` and ``DELETE /{queue}/messages/{id}`` taken straight from the
    parser (and batched: one receive, or one delete and its sync, for the requests under way)
    answer byte for byte what FastAPI's routes answer, and count the same; a fetch that may wait
    (a queue not looked at yet, a query) and a refused request go on to those routes."""
    answers = {}
    for protocol in (HeadLimitedHttpToolsProtocol, DirectHttpToolsProtocol):
        data = tmp_path / "data"  # the same path for both: 404's message names it
        with serving(data, protocol, rest_token="secret") as port:
            answers[protocol] = _consumer_run(port)
        data.rename(tmp_path / protocol.__name__)
    assert answers[DirectHttpToolsProtocol] == answers[HeadLimitedHttpToolsProtocol]
    statuses = [status_of(a) for a in answers[DirectHttpToolsProtocol][:-1]]
    assert statuses == [200, 200, 200, 401, 404, 204, 404, 400, 401, 400, 404, 400, 200, 204, 405, 204]
    assert b"x-receive-count: 2" in answers[DirectHttpToolsProtocol][12]
    assert b'messages_out_total{queue="q"} 4.0' in answers[DirectHttpToolsProtocol][-1]
    assert b'messages_deleted_total{queue="q"} 2.0' in answers[DirectHttpToolsProtocol][-1]
    assert [re.sub(r"\d+\.[0-9a-f]{8}", "ID", request) for request in taken_requests] == [
        *["POST /q/messages"] * 3, "GET /q/messages", "DELETE /q/messages/ID", "DELETE /q/messages/ID",
        "DELETE /q/messages/0.zz", "DELETE /nope/messages/1", "GET /q/messages", "GET /q/messages",
        "DELETE /q/messages/ID",
    ]


def _sqs_consumer_run(port: int) -> tuple[list[bytes], list[str]]:
    """SQS consumer requests (ReceiveMessage, with and without a wait, on a standard and a FIFO
    queue, and DeleteMessage) on a new server: the answers without what differs from one
    server to another, and the bodies of the requests the direct path took, by action."""
    url = "http://test/000000000000/"

    def go(action: str, payload: dict[str, Any]) -> bytes:
        return exchange(port, sqs(action, payload))[0]

    for name, attributes in (("q", {}), ("f.fifo", {"FifoQueue": "true", "ContentBasedDeduplication": "true"})):
        assert status_of(go("CreateQueue", {"QueueName": name, "Attributes": attributes})) == 200
    for body in ("m0", "m1", "m2"):
        assert status_of(go("SendMessage", {"QueueUrl": url + "q", "MessageBody": body})) == 200
        assert status_of(go("SendMessage", {"QueueUrl": url + "f.fifo", "MessageBody": body,
                                            "MessageGroupId": "g"})) == 200
    everything = {"AttributeNames": ["All"], "MessageAttributeNames": ["All"]}
    answers = [
        go("ReceiveMessage", {"QueueUrl": url + "q", **everything}),  # the first: learns the queue's wait
        go("ReceiveMessage", {"QueueUrl": url + "q", "VisibilityTimeout": 0, **everything}),
        go("ReceiveMessage", {"QueueUrl": url + "q", "WaitTimeSeconds": 0, "MaxNumberOfMessages": 5}),
        go("ReceiveMessage", {"QueueUrl": url + "q", "WaitTimeSeconds": 1}),  # may wait: not direct
        go("ReceiveMessage", {"QueueUrl": url + "q", "WaitTimeSeconds": 0, "MaxNumberOfMessages": 11}),
        go("ReceiveMessage", {"QueueUrl": url + "nope", "WaitTimeSeconds": 0}),
        go("ReceiveMessage", {"QueueUrl": url + "f.fifo", "WaitTimeSeconds": 0, "MaxNumberOfMessages": 2}),
        go("ReceiveMessage", {"QueueUrl": url + "f.fifo", "WaitTimeSeconds": 0}),  # the group is held
    ]
    receipts = [m["ReceiptHandle"] for answer in answers[:3] + answers[6:7]
                for m in json.loads(answer.partition(b"\r\n\r\n")[2]).get("Messages", [])]
    answers += [go("DeleteMessage", {"QueueUrl": url + ("f.fifo" if i > 3 else "q"), "ReceiptHandle": receipt})
                for i, receipt in enumerate(receipts)]
    answers.append(go("ReceiveMessage", {"QueueUrl": url + "f.fifo", "WaitTimeSeconds": 0}))  # m2 of the group
    metrics = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")[0]
    answers.append(b"\n".join(sorted(re.findall(
        rb'journalq_(?:request_seconds_count\{api="sqs",[^}]*\}|messages_(?:out|deleted)_total\{[^}]*\}) \S+',
        metrics))))
    shown = [re.sub(rb'"(ReceiptHandle|MD5OfBody|SequenceNumber)": "[^"]*"|"\d+\.[0-9a-f]{8}"', b"R", normalized(a))
             for a in answers]
    return shown, receipts


def test_sqs_receives_that_cannot_wait_answer_on_the_direct_path_as_the_asgi_path(
    tmp_path: Path, taken: list[bytes]
) -> None:
    """A ReceiveMessage that cannot wait (WaitTimeSeconds 0, or none and a queue whose own wait
    is 0) is taken straight from the parser, its first look batched with the others under way,
    and answers byte for byte what the ASGI path answers (a FIFO queue's made whole in a thread,
    as there); one that may wait, and the first to a queue not looked at yet, go to ASGI."""
    answers = {}
    for protocol in (HeadLimitedHttpToolsProtocol, DirectHttpToolsProtocol):
        data = tmp_path / "data"
        with serving(data, protocol) as port:
            answers[protocol], receipts = _sqs_consumer_run(port)
        data.rename(tmp_path / protocol.__name__)
    direct = answers[DirectHttpToolsProtocol]
    assert direct == answers[HeadLimitedHttpToolsProtocol]
    assert [status_of(a) for a in direct[:-1]] == [200] * 4 + [400, 400] + [200] * 9
    bodies = [re.findall(rb'"Body": "(\w+)"', a) for a in direct[:-1]]
    assert bodies[:4] == [[b"m0"], [b"m1"], [b"m1", b"m2"], []]
    assert b"MaxNumberOfMessages" in direct[4] and b"QueueDoesNotExist" in direct[5]
    assert bodies[6:8] == [[b"m0", b"m1"], []] and bodies[-1] == [b"m2"]
    assert len(receipts) == 6
    assert b'messages_out_total{queue="q"} 4.0' in direct[-1]
    assert b'messages_deleted_total{queue="f.fifo"} 2.0' in direct[-1]
    # What went the direct way: the sends, the deletes, and the receives that cannot wait once
    # their queue's own wait is known (not the first to "q"; a refused one tried, then ASGI's).
    receives = [json.loads(body) for body in taken if b"ReceiptHandle" not in body and b"MessageBody" not in body]
    assert [(r["QueueUrl"].rsplit("/", 1)[1], r.get("WaitTimeSeconds")) for r in receives] == [
        ("q", None), ("q", 0), ("q", 0), ("nope", 0), ("f.fifo", 0), ("f.fifo", 0), ("f.fifo", 0)]


def test_a_direct_receive_that_waits_after_all_takes_nothing_for_a_client_gone(
    tmp_path: Path, taken: list[bytes]
) -> None:
    """Another process gives a queue a wait after the server last looked at it: a ReceiveMessage
    with no WaitTimeSeconds, taken by the direct path as one that cannot wait, long-polls after
    all (made whole in a thread). Its client goes away: its poll ends within about a second, and a
    message sent later goes to the next consumer, not to nobody for the visibility timeout."""
    queue_url = "http://test/000000000000/stale"
    with serving(tmp_path, DirectHttpToolsProtocol) as port:
        url = f"http://127.0.0.1:{port}"
        client = sqs_client(url)
        client.create_queue(QueueName="stale")
        request = sqs("ReceiveMessage", {"QueueUrl": queue_url})
        assert b'"Messages"' not in exchange(port, request)[0]  # (the server learns the queue's wait: 0)
        with Broker(tmp_path) as broker:  # another process
            broker.queue("stale", create=False).configure(receive_wait=20)
        time.sleep(1.2)  # (a process takes up settings changed by another once a second)
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request)
        time.sleep(0.5)
        s.close()
        time.sleep(1.5)
        client.send_message(QueueUrl=f"{url}/000000000000/stale", MessageBody="for someone there")
        got = client.receive_message(QueueUrl=f"{url}/000000000000/stale", WaitTimeSeconds=2).get("Messages", [])
        assert [m["Body"] for m in got] == ["for someone there"]
    assert taken.count(json.dumps({"QueueUrl": queue_url}).encode()) == 1  # (the second: the first learned the wait)


def test_a_direct_fetch_waits_once_an_sqs_call_gives_the_queue_a_wait(
    tmp_path: Path, taken_requests: list[str]
) -> None:
    """The direct path fetches only from a queue whose own wait was 0 when last looked at: once
    SQS's SetQueueAttributes gives the queue a wait, a fetch goes to FastAPI's route, which waits."""
    with serving(tmp_path, DirectHttpToolsProtocol) as port:
        url = f"http://127.0.0.1:{port}"
        assert httpx.put(f"{url}/w").status_code == 201
        assert [httpx.get(f"{url}/w/messages").status_code for _ in range(2)] == [204, 204]
        assert taken_requests == ["GET /w/messages"]  # the second: the first learned the queue's wait
        sqs = sqs_client(url)
        sqs.set_queue_attributes(QueueUrl=f"{url}/000000000000/w", Attributes={"ReceiveMessageWaitTimeSeconds": "1"})
        started = time.monotonic()
        assert httpx.get(f"{url}/w/messages", timeout=10).status_code == 204
        assert time.monotonic() - started >= 0.9
        assert taken_requests == ["GET /w/messages"]


def test_pipelined_requests_are_answered_in_order(tmp_path: Path, taken: list[bytes]) -> None:
    with serving(tmp_path, DirectHttpToolsProtocol) as port:
        exchange(port, b"PUT /p HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        requests = [post("/p/messages", b"m%d" % i) for i in range(5)]
        requests.insert(3, b"GET /p HTTP/1.1\r\nHost: t\r\n\r\n")
        requests.append(post("/p/messages", b"x" * 10, "Expect: 100-continue"))  # ASGI's
        requests.append(post("/p/messages", b"last"))
        answers = exchange(port, *requests)
    statuses = [status_of(a) for a in answers]
    assert statuses == [201, 201, 201, 200, 201, 201, 201, 201], statuses
    ids = [int(re.search(rb"x-message-id: (\d+)\.[0-9a-f]{8}\r", a).group(1)) for a in answers if b"x-message-id" in a]
    assert ids == sorted(ids) and len(set(ids)) == 7
    assert b'"available":3' in answers[3]  # the GET came after the first three were stored
    assert taken == [b"m0", b"m1", b"m2", b"m3", b"m4", b"last"]
    with Broker(tmp_path) as broker:
        got = broker.queue("p", create=False).receive(10)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"x" * 10, b"last"]


def test_a_body_still_on_its_way_goes_through_asgi_and_its_timeout(tmp_path: Path, taken: list[bytes]) -> None:
    with serving(tmp_path, DirectHttpToolsProtocol, body_timeout=1.0) as port:
        exchange(port, b"PUT /s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        request = post("/s/messages", b"split body")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(request[:-4])
            time.sleep(0.2)
            s.sendall(request[-4:])
            answers = Answers(s)
            assert status_of(answers.next()) == 201
            s.sendall(request[:-4])  # and never the rest: 408 from the ASGI path's watchdog
            started = time.monotonic()
            answer = answers.next()
        assert status_of(answer) == 408 and time.monotonic() - started < 5
    assert taken == []
    with Broker(tmp_path) as broker:
        assert [m.body for m in broker.queue("s", create=False).receive(10)] == [b"split body"]


def test_a_client_gone_before_its_answer_leaves_the_connection_and_the_server_well(
    tmp_path: Path, taken: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client closes while its send is being stored: the message is stored (its success was
    not answered, as a send cut off may be), nothing is written to the closed connection, and the
    server goes on serving."""
    from journalq.queue.topic import Topic

    stored = threading.Event()
    real = Topic._send_plain

    def slow(self: Topic, bodies: list[bytes]) -> list[str]:
        time.sleep(0.3)  # the client is gone by now
        try:
            return real(self, bodies)
        finally:
            stored.set()

    with serving(tmp_path, DirectHttpToolsProtocol) as port:
        exchange(port, b"PUT /g HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        monkeypatch.setattr(Topic, "_send_plain", slow)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(post("/g/messages", b"left early"))
        assert stored.wait(10)
        time.sleep(0.1)  # its answer's turn on the event loop
        monkeypatch.setattr(Topic, "_send_plain", real)
        assert [status_of(a) for a in exchange(port, post("/g/messages", b"after"), post("/g/messages", b"again"))] \
            == [201, 201]
    assert taken == [b"left early", b"after", b"again"]
    with Broker(tmp_path) as broker:
        assert [m.body for m in broker.queue("g", create=False).receive(10)] == [b"left early", b"after", b"again"]


def test_the_first_send_to_a_queue_after_a_start_opens_it_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_requests: list[str]
) -> None:
    """A queue is opened (its topic's journal recovered, its channel's state loaded: up to
    hundreds of ms at a deep backlog) by the first request that uses it after the server starts:
    in a store thread, not on the event loop, which every other client waits for meanwhile.
    Before, a send taken by the direct path opened it on the loop. (A topic whose channels are
    its own is opened alike: ``Broker.opened``'s other answer.)"""
    with serving(tmp_path, DirectHttpToolsProtocol) as port:
        assert status_of(exchange(port, sqs("CreateQueue", {"QueueName": "q"}))[0]) == 200
    with Broker(tmp_path) as broker:
        broker.topic("t").channel("own").receive()
    opened_in: list[tuple[str, str]] = []

    def noted(what: str, real: Any) -> Any:
        def opening(*args: Any) -> Any:
            opened_in.append((what, threading.current_thread().name))
            return real(*args)
        return opening

    monkeypatch.setattr(sharded_module, "open_topic", noted("topic", sharded_module.open_topic))
    monkeypatch.setattr(Channel, "_load", noted("channel", Channel._load))
    url = "http://test/000000000000/q"
    cases = [
        (post("/q/messages", b"rest"), 201, ["topic", "channel"]),
        (sqs("SendMessage", {"QueueUrl": url, "MessageBody": "sqs"}), 200, ["topic", "channel"]),
        (post("/t/messages", b"to the topic"), 201, ["topic"]),
    ]
    for request, status, opened in cases:
        opened_in.clear()
        taken_requests.clear()
        with serving(tmp_path, DirectHttpToolsProtocol) as port:
            assert [status_of(a) for a in exchange(port, request, request)] == [status, status]
        assert len(taken_requests) == 2, taken_requests  # both on the direct path
        assert [what for what, _ in opened_in] == opened, opened_in
        assert all(thread.startswith("journalq-store") for _, thread in opened_in), opened_in
    with Broker(tmp_path) as broker:
        assert [m.body for m in broker.queue("q", create=False).receive(10)] == [b"rest"] * 2 + [b"sqs"] * 2
        assert [m.body for m in broker.topic("t").channel("own").receive(10)] == [b"to the topic"] * 2


def test_a_failed_sync_on_the_direct_path_is_503(tmp_path: Path, taken: list[bytes], sync_fault: SyncFault) -> None:
    with serving(tmp_path, DirectHttpToolsProtocol, retry_after=3) as port:
        exchange(port, b"PUT /f HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        assert status_of(exchange(port, post("/f/messages", b"kept"))[0]) == 201
        sync_fault.armed = True
        refused, after = exchange(port, post("/f/messages", b"unsure"), post("/f/messages", b"after"))
        assert sync_fault.count == 1, "the fault did not happen"
        assert status_of(refused) == 503 and b"retry-after: 3\r\n" in refused
        assert b"Input/output error" in refused
        assert status_of(after) == 201  # the queue was reopened
    assert taken == [b"kept", b"unsure", b"after"]
    report = check(tmp_path / "f")
    assert report.ok, report.remaining
    with Broker(tmp_path) as broker:
        got = [m.body for m in broker.queue("f", create=False).receive(10)]
    # As on the ASGI path: what was answered 201 is there, in order; the message whose sync
    # failed may be there too (a 503 after an EIO means "maybe not stored").
    assert [b for b in got if b != b"unsure"] == [b"kept", b"after"]


def test_a_failed_sync_of_a_direct_delete_is_503_and_the_delete_can_be_made_again(
    tmp_path: Path, taken_requests: list[str], sync_fault: SyncFault
) -> None:
    """A delete taken by the direct path whose sync fails is answered 503 with Retry-After, as
    FastAPI's route answers it; the queue is reopened, and the delete made again passes (or
    finds the message gone: a 503 after an EIO means "maybe done")."""
    with serving(tmp_path, DirectHttpToolsProtocol, retry_after=3) as port:
        exchange(port, b"PUT /f HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        assert status_of(exchange(port, post("/f/messages", b"kept"))[0]) == 201
        assert status_of(exchange(port, post("/f/messages", b"done"))[0]) == 201
        fetched = exchange(port, b"GET /f/messages HTTP/1.1\r\nHost: t\r\n\r\n")[0]  # learns the queue's wait
        first = re.search(rb"x-message-id: ([\w.]+)", fetched)[1].decode()
        sync_fault.armed = True
        refused = exchange(port, f"DELETE /f/messages/{first} HTTP/1.1\r\nHost: t\r\n\r\n".encode())[0]
        assert sync_fault.count == 1, "the fault did not happen"
        assert status_of(refused) == 503 and b"retry-after: 3\r\n" in refused and b"Input/output error" in refused
        again = exchange(port, f"DELETE /f/messages/{first} HTTP/1.1\r\nHost: t\r\n\r\n".encode())[0]
        assert status_of(again) in (204, 404), again
        left = exchange(port, b"GET /f/messages HTTP/1.1\r\nHost: t\r\n\r\n")[0]
        assert status_of(left) == 200 and left.endswith(b"\r\n\r\ndone")
    assert [request.split("/")[1] + " " + request.split(" ")[0] for request in taken_requests] == [
        "f POST", "f POST", "f DELETE", "f DELETE", "f GET"]
    report = check(tmp_path / "f")
    assert report.ok, report.remaining


@pytest.mark.parametrize("failure", [
    OSError(errno.EIO, "Input/output error"),
    StoreUnavailableError("the store is out of reach"),  # a ConnectionError: an OSError with no errno
], ids=["EIO", "store unavailable"])
def test_a_failure_reading_an_sqs_queues_rules_is_503_for_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: OSError
) -> None:
    """An SQS send's queue and rules are looked up on the event loop, once a batch, before the
    batch goes to the thread that stores it: a failure of the storage there is answered as the
    storage's failure (503, Retry-After), as in the thread, not as the server's (500) or the
    request's (400), and nothing is stored; the next batch finds the queue again."""
    real_read = sqs_module._Sidecar.read
    failures: list[str] = []

    def failing_once(self: Any, name: str) -> dict[str, Any]:
        if not failures:
            failures.append(name)
            raise failure
        return real_read(self, name)

    url = "http://test/000000000000/s"
    with serving(tmp_path, DirectHttpToolsProtocol, retry_after=3) as port:
        assert status_of(exchange(port, sqs("CreateQueue", {"QueueName": "s"}))[0]) == 200
        monkeypatch.setattr(sqs_module._Sidecar, "read", failing_once)
        (refused,) = exchange(port, sqs("SendMessage", {"QueueUrl": url, "MessageBody": "unsure"}))
        assert failures == ["s"], "the fault did not happen"
        assert status_of(refused) == 503 and b"retry-after: 3\r\n" in refused
        assert b'"__type": "com.amazonaws.sqs#ServiceUnavailable"' in refused
        (after,) = exchange(port, sqs("SendMessage", {"QueueUrl": url, "MessageBody": "after"}))
        assert status_of(after) == 200
    with Broker(tmp_path) as broker:
        assert [m.body for m in broker.queue("s", create=False).receive(10)] == [b"after"]


def closed_at(sockets: dict[str, socket.socket], limit: float) -> dict[str, float]:
    """When (``time.monotonic()``) the server closed each socket; all must be closed within
    ``limit`` seconds. What they still had to read is dropped."""
    closed: dict[str, float] = {}
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as selector:
        for name, s in sockets.items():
            selector.register(s, selectors.EVENT_READ, name)
        while len(closed) < len(sockets):
            ready = selector.select(deadline - time.monotonic())
            assert ready, f"still open after {limit} s: {sorted(set(sockets) - set(closed))}"
            for key, _ in ready:
                if not key.fileobj.recv(65536):  # type: ignore[union-attr]
                    closed[key.data] = time.monotonic()
                    selector.unregister(key.fileobj)
    return closed


def test_idle_connections_are_closed_after_the_keep_alive_timeout(tmp_path: Path, taken: list[bytes]) -> None:
    """One sweep for all connections (not uvicorn's timer per answer) closes a connection once
    it has waited ``timeout_keep_alive`` for a request: after an answer, and also when it never
    sent one. A connection that keeps asking is not closed, however long it lives, nor is one
    whose request is being answered."""
    with serving(tmp_path, DirectHttpToolsProtocol, keep_alive=0.5) as port:
        for name in (b"k", b"empty"):
            exchange(port, b"PUT /%s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" % name)
        silent = socket.create_connection(("127.0.0.1", port))
        idle_from = {"silent": time.monotonic()}
        answered = socket.create_connection(("127.0.0.1", port), timeout=5)
        answered.sendall(post("/k/messages", b"once"))
        assert status_of(Answers(answered).next()) == 201
        idle_from["answered"] = time.monotonic()
        long_poll = socket.create_connection(("127.0.0.1", port), timeout=5)
        long_poll.sendall(b"GET /empty/messages?wait=1.5 HTTP/1.1\r\nHost: t\r\n\r\n")
        closed = closed_at({"silent": silent, "answered": answered}, 2)
        waited = {name: closed[name] - idle_from[name] for name in closed}
        # Each closed between the timeout and the timeout plus one sweep (a fifth of it).
        assert all(0.45 <= took <= 0.85 for took in waited.values()), waited
        busy = socket.create_connection(("127.0.0.1", port), timeout=5)
        busy_answers = Answers(busy)
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # three timeouts, asking every 0.1 s
            busy.sendall(post("/k/messages", b"again"))
            assert status_of(busy_answers.next()) == 201
            time.sleep(0.1)
        # The long poll waited its 1.5 s for a message (none came) and was answered.
        assert status_of(Answers(long_poll).next()) == 204
        done = time.monotonic()
        assert closed_at({"busy": busy}, 2)["busy"] - done < 0.85
    assert taken[0] == b"once" and taken.count(b"again") >= 10


def test_a_server_process_settles_its_heap() -> None:
    """``journalq serve`` freezes what it loaded out of the garbage collector's reach and lets
    the young generation grow (see ``settle_heap``): checked in a process of its own, since the
    settings are the process's."""
    code = ("import gc; from journalq.server.app import YOUNG_OBJECTS, settle_heap; settle_heap(); "
            "assert gc.get_freeze_count() > 1000, gc.get_freeze_count(); "
            "assert gc.get_threshold()[0] == YOUNG_OBJECTS; print('settled')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "settled", done.stderr


def test_a_request_head_that_does_not_end_in_time_is_answered_408(tmp_path: Path, taken: list[bytes]) -> None:
    """A head must be whole within the head timeout (the server's ``body_timeout``) of when the
    connection began to wait for it: one that stops half-way, and one dribbled a byte at a time
    (which uvicorn alone would hold for ever), get 408 and are closed. A head that comes whole,
    late in the connection's keep-alive time, is answered."""
    with serving(tmp_path, DirectHttpToolsProtocol, keep_alive=0.5, body_timeout=1.0) as port:
        exchange(port, b"PUT /h HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
        began = time.monotonic()
        stalled.sendall(b"POST /h/messages HTTP/1.1\r\nHost: t\r\n")
        dribbled = socket.create_connection(("127.0.0.1", port), timeout=5)
        late = socket.create_connection(("127.0.0.1", port), timeout=5)
        head = b"POST /h/messages HTTP/1.1\r\nHost: t\r\nX-Padding: " + b"p" * 100
        for i in range(len(head)):  # a byte every 0.1 s, until the server answers
            if i == 3:
                late.sendall(post("/h/messages", b"late"))  # 0.3 s after it connected: in time
            dribbled.send(head[i:i + 1])
            if select.select([dribbled], [], [], 0.1)[0] or time.monotonic() - began > 3:
                break
        for s in (stalled, dribbled):
            answer = Answers(s).next()
            assert status_of(answer) == 408 and answer.endswith(b"took over 1 s"), answer
            assert b"connection: close" in answer
            assert s.recv(10) == b""  # closed
        took = time.monotonic() - began
        assert 1.0 <= took <= 2.0, took
        assert status_of(Answers(late).next()) == 201
    assert taken == [b"late"]


def _loaded(load: Any, body: bytes) -> Any:
    """What ``load(body)`` gives: its value, or its error's type and text."""
    try:
        return ("value", load(body))
    except ValueError as exc:
        return ("error", type(exc), str(exc))


_JSON_BODIES = [
    b"", b"{", b"{}", b'{"a": 1}', b"{\x00", b"{\x00\x00\x00", b'{"a": "\xed\xa0\x80"}', b'{"a": "\xff"}', b"[1]",
    b'"s"', b"\xef\xbb\xbf{}", '{"é": "\U0001f600"}'.encode("utf-16-le"), '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32"), b'{"a": 1} x', b"{'a': 1}", b'{"a": NaN}', b" {}",
    # the object scanned alone, then decode for what follows it: whitespace, more, a second object
    b'{"a": 1} ', b'{"a": 1}\r\n\t', b'{"a": 1}}', b'{"a": 1}{}', b'{"a": [1, 2}', b'{"a": 1', b'{"a"}', b"{ }",
]


@pytest.mark.parametrize("body", _JSON_BODIES)
def test_the_sqs_body_parser_is_json_loads(body: bytes) -> None:
    assert _loaded(app_module._json_of, body) == _loaded(json.loads, body)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=12).map(lambda tail: b"{" + tail),
                 st.tuples(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
                           st.sampled_from([b"", b"", b" ", b"\n", b"}", b" x", b"{}"])).map(
                     lambda d: json.dumps(d[0], ensure_ascii=False).encode("utf-8", "surrogatepass") + d[1])))
def test_the_sqs_body_parser_is_json_loads_for_any_object_or_brace(body: bytes) -> None:
    assert _loaded(app_module._json_of, body) == _loaded(json.loads, body)


@pytest.mark.parametrize("headers", [
    [], [(b"x-amz-target", b"AmazonSQS.SendMessage")], [(b"host", b"h"), (b"x-amz-target", b"A.\xe9")],
    [(b"x-amz-target", b"first"), (b"host", b"h"), (b"x-amz-target", b"last")], [(b"x-amz-target-not", b"x")],
])
def test_one_header_is_what_all_of_them_give(headers: list[tuple[bytes, bytes]]) -> None:
    scope = {"headers": headers}
    found = header(scope, b"x-amz-target")
    assert (found or b"").decode("latin-1") == app_module._text_headers(scope).get("x-amz-target", "")
    assert (found is not None) == any(name == b"x-amz-target" for name, _ in headers)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_the_sqs_answers_encoder_is_json_dumps(value: Any) -> None:
    assert app_module._json_text(value) == json.dumps(value)


def test_the_sqs_answers_encoder_refuses_what_json_dumps_refuses() -> None:
    for value in ({"a": b"bytes"}, {"a": {1, 2}}, {(1, 2): "key"}):
        with pytest.raises(TypeError) as dumped:
            json.dumps(value)
        with pytest.raises(TypeError) as encoded:
            app_module._json_text(value)
        assert str(encoded.value) == str(dumped.value)


# -- the plain SendMessage lane: a body alone to a standard queue, stored and answered without the
# -- full checks' objects (``sqs._plain_body``, ``app._plain_sent_answer``)

_URL = "http://test/000000000000/"
_ATTRIBUTE = {"k": {"DataType": "String", "StringValue": "v"}}
_LANE_SETUP = [
    sqs("CreateQueue", {"QueueName": "q"}),
    sqs("CreateQueue", {"QueueName": "f.fifo", "Attributes": {"FifoQueue": "true"}}),
    sqs("CreateQueue", {"QueueName": "small", "Attributes": {"MaximumMessageSize": "1024"}}),
    sqs("CreateQueue", {"QueueName": "lowered"}),
    sqs("CreateQueue", {"QueueName": "elsewhere"}),
]
_LANE_CASES: list[tuple[str, bytes, bool]] = [
    # (what, request, whether the lane answers it)
    ("plain", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "hello"}), True),
    ("plain, a bare queue name", sqs("SendMessage", {"QueueUrl": "q", "MessageBody": "by name"}), True),
    ("non-ASCII", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "h\u00e9 \U0001f600 \ue000"}), True),
    ("JSON escapes", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": 'tab\t"quoted" \\ new\nline\r'}),
     True),
    ("an unknown parameter", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x", "Other": 1}), True),
    ("1,500 bytes", sqs("SendMessage", {"QueueUrl": _URL + "lowered", "MessageBody": "b" * 1500}), True),
    ("the size limit", sqs("SendMessage", {"QueueUrl": _URL + "small", "MessageBody": "s" * 1024}), True),
    ("over the size limit", sqs("SendMessage", {"QueueUrl": _URL + "small", "MessageBody": "s" * 1025}), False),
    ("over it in UTF-8", sqs("SendMessage", {"QueueUrl": _URL + "small", "MessageBody": "\u00e9" * 513}), False),
    ("FIFO", sqs("SendMessage", {"QueueUrl": _URL + "f.fifo", "MessageBody": "x"}), False),
    ("FIFO with a group", sqs("SendMessage", {"QueueUrl": _URL + "f.fifo", "MessageBody": "x", "MessageGroupId": "g",
                                              "MessageDeduplicationId": "d"}), False),
    ("attributes", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x", "MessageAttributes": _ATTRIBUTE}),
     False),
    ("no attributes", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x", "MessageAttributes": {}}),
     False),
    ("DelaySeconds", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x", "DelaySeconds": 5}), False),
    ("DelaySeconds out of range", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x",
                                                      "DelaySeconds": 901}), False),
    ("a tenant", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "x", "MessageGroupId": "t"}), False),
    ("a bad character", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": "bell\x07"}), False),
    ("a lone surrogate", sqs("SendMessage", b'{"QueueUrl": "q", "MessageBody": "\\ud800"}'), False),
    ("no body", sqs("SendMessage", {"QueueUrl": _URL + "q"}), False),
    ("an empty body", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": ""}), False),
    ("a number", sqs("SendMessage", {"QueueUrl": _URL + "q", "MessageBody": 5}), False),
    ("an unknown queue", sqs("SendMessage", {"QueueUrl": _URL + "nope", "MessageBody": "x"}), False),
    ("a batch", sqs("SendMessageBatch", {"QueueUrl": _URL + "q", "Entries": [{"Id": "a", "MessageBody": "x"}]}), False),
    ("lowered", sqs("SetQueueAttributes", {"QueueUrl": _URL + "lowered", "Attributes": {"MaximumMessageSize": "1024"}}),
     False),
    ("1,500 bytes once lowered", sqs("SendMessage", {"QueueUrl": _URL + "lowered", "MessageBody": "b" * 1500}), False),
    ("1,024 bytes once lowered", sqs("SendMessage", {"QueueUrl": _URL + "lowered", "MessageBody": "b" * 1024}), True),
    ("1,500 bytes, before another process lowers", sqs("SendMessage", {"QueueUrl": _URL + "elsewhere",
                                                                        "MessageBody": "e" * 1500}), True),
    ("1,500 bytes once another process lowered", sqs("SendMessage", {"QueueUrl": _URL + "elsewhere",
                                                                      "MessageBody": "e" * 1500}), False),
]
_LOWERED_ELSEWHERE = "1,500 bytes once another process lowered"


def _lane_run(data: Path, protocol: type, counted: list[int]) -> list[bytes]:
    """The answers to ``_LANE_CASES`` (one at a time, so that message ids are the same from run to
    run) with only their dates and request ids left out, then the sends' counts of ``/metrics``;
    ``counted`` gets how many sends the lane answered."""
    from journalq.server.sqs import SqsProtocol

    real = app_module._plain_sent_answer
    answered = []

    def counting(message_id: str, md5: str) -> Any:
        answered.append(message_id)
        return real(message_id, md5)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "_plain_sent_answer", counting)
        with serving(data, protocol) as port:
            for request in _LANE_SETUP:
                assert status_of(exchange(port, request)[0]) == 200
            answers = []
            for what, request, _ in _LANE_CASES:
                if what == _LOWERED_ELSEWHERE:  # what another process's SetQueueAttributes leaves
                    with Broker(data) as broker:
                        SqsProtocol(broker).handle("SetQueueAttributes", {
                            "QueueUrl": _URL + "elsewhere", "Attributes": {"MaximumMessageSize": "1024"}}, "http://x")
                answer = re.sub(rb"(date|x-amzn-requestid): [^\r]*\r\n", b"", exchange(port, request)[0])
                # The same ids from run to run but for the queue's token (journalq.server.ids), each run's own.
                answers.append(re.sub(rb'("MessageId": "[0-9.]+)\.[0-9a-f]{8}"', rb'\1.TOKEN"', answer))
            metrics = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")[0]
    counts = re.findall(rb'journalq_messages_in_total\{[^}]*\} \S+|journalq_request_seconds_count'
                        rb'\{api="sqs",[^}]*operation="SendMessage[^}]*\} \S+', metrics)
    counted.append(len(answered))
    return [*answers, b"\n".join(sorted(counts))]


def test_the_plain_send_lane_answers_as_the_full_checks_and_declines_the_rest(tmp_path: Path) -> None:
    """SendMessages of a body alone to a standard queue within its size limit are answered by
    the lane, byte for byte as the full checks answer them (the lane switched off: the same
    requests, the same message ids), through the direct path and through ASGI; every other
    shape is declined (the lane's answer is never made for it) and answered as before. The
    messages stored and the sends' metrics (``journalq_messages_in``, the SendMessage latencies
    by status) are the same too."""
    from journalq.server import sqs as sqs_module

    runs: dict[str, list[bytes]] = {}
    counted: dict[str, list[int]] = {"lane": [], "asgi": [], "full checks": []}
    stored: dict[str, list[bytes]] = {}
    for run, protocol in (("lane", DirectHttpToolsProtocol), ("asgi", HeadLimitedHttpToolsProtocol),
                          ("full checks", DirectHttpToolsProtocol)):
        data = tmp_path / "data"
        with pytest.MonkeyPatch.context() as patch:
            if run == "full checks":  # every send through _check_send and _checked_outgoing, as before the lane
                patch.setattr(sqs_module, "_plain_body", lambda entry, settings, rules: None)
            runs[run] = _lane_run(data, protocol, counted[run])
        with Broker(data) as broker:
            stored[run] = [m.body for name in ("q", "small", "lowered", "elsewhere")
                           for m in broker.queue(name, create=False).receive(10)]
        data.rename(tmp_path / run.replace(" ", "-"))
    taken = sum(lane for _, _, lane in _LANE_CASES)
    assert counted == {"lane": [taken], "asgi": [taken], "full checks": [0]}
    for (what, _, _), lane, asgi, full in zip(_LANE_CASES, runs["lane"], runs["asgi"], runs["full checks"]):
        assert lane == full, what
        assert asgi == full, what
    assert runs["lane"][-1] == runs["full checks"][-1] == runs["asgi"][-1]  # the metrics
    assert b'queue="q"} 10.0' in runs["lane"][-1]  # 5 by the lane, 4 by the full checks, the batch's
    assert stored["lane"] == stored["full checks"] == stored["asgi"]
    statuses = {what: status_of(answer) for (what, _, _), answer in zip(_LANE_CASES, runs["lane"])}
    assert [what for what, status in statuses.items() if status != 200] == [
        "over the size limit", "over it in UTF-8", "FIFO", "DelaySeconds out of range", "a bad character",
        "a lone surrogate", "no body", "an empty body", "a number", "an unknown queue", "1,500 bytes once lowered",
        _LOWERED_ELSEWHERE]


def test_a_plain_sends_answer_is_its_dict_through_the_encoder(tmp_path: Path) -> None:
    """``_plain_sent_answer`` formats what the encoder makes of ``plain_answer``'s dict, for the
    ids that queues give (a standard queue's offsets, a sharded queue's shard and offset)."""
    from journalq.server.digests import md5_of_body
    from journalq.server.sqs import plain_answer

    with Broker(tmp_path, sync="none") as broker:
        ids = broker.queue("one").send_many([b"m"] * 12) + broker.queue("four", shards=4).send_many([b"m"] * 12)
    assert any("." in i for i in ids) and any("." not in i for i in ids)
    for message_id in [*ids, "0", "18446744073709551615", "1023.18446744073709551615"]:
        md5 = md5_of_body(message_id)
        expected = app_module._whole(200, app_module._json_text(plain_answer(message_id, md5)).encode(),
                                     app_module._sqs_headers())
        assert without_request_id(app_module._plain_sent_answer(message_id, md5)) == without_request_id(expected)


def without_request_id(answer: app_module.Answer) -> app_module.Answer:
    status, headers, body = answer
    return status, [header for header in headers if header[0] != b"x-amzn-requestid"], body


def test_request_ids_stay_unique_and_uuid_shaped_across_blocks_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request ids come in blocks of 4,096 (a head formatted once, a table's last digits):
    across blocks, with several threads taking them at once (the store thread answers plain
    SendMessages while the event loop answers errors), each is given once, in a UUID's shape,
    and one thread's run counts on in hex as ``b"%012x"`` of a count did."""
    import uuid

    taken: list[list[bytes]] = [[] for _ in range(4)]

    def take(into: list[bytes]) -> None:
        for _ in range(5000):
            into.append(app_module._request_id())

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [request_id for into in taken for request_id in into]
    assert len(set(ids)) == len(ids) == 20_000
    for request_id in ids:
        assert str(uuid.UUID(request_id.decode())).encode() == request_id
    monkeypatch.setattr(app_module, "_request_ids", iter(()))  # (a block a thread left half used)
    run = [app_module._request_id() for _ in range(5000)]  # one thread: the count goes on by one
    numbers = [int(request_id[-12:], 16) for request_id in run]
    assert numbers == list(range(numbers[0], numbers[0] + 5000))
    assert {request_id[:-12] for request_id in run} == {app_module._request_id_prefix}


def test_an_answer_to_a_connection_that_is_closing_is_not_written() -> None:
    """A pipelined request's cycle is not told that its client went away (uvicorn marks the one
    under way), but the transport is closing: its direct answer is not written, since uvloop
    raises on a write to a lost connection (which failed the answering of its whole batch)."""
    from types import SimpleNamespace

    class LostTransport:
        def is_closing(self) -> bool:
            return True

        def write(self, data: bytes) -> None:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    protocol = SimpleNamespace(transport=LostTransport())
    cycle = SimpleNamespace(disconnected=False, response_complete=False, keep_alive=True)
    DirectHttpToolsProtocol._answer(protocol, cycle, 200, [], b"{}")  # type: ignore[arg-type]
    assert not cycle.response_complete


def test_a_direct_answer_carries_the_default_headers_it_is_given() -> None:
    """``_encoded`` joins each status's line with uvicorn's default headers once while uvicorn
    keeps them (it makes new ones each second, for the date): an answer still carries the ones
    it is given, after a change and back, for each status."""
    from journalq.server.protocol import _encoded

    first = [(b"date", b"Sun, 29 Nov 2026 04:00:00 GMT"), (b"server", b"uvicorn")]
    later = [(b"date", b"Sun, 29 Nov 2026 04:00:01 GMT"), (b"server", b"uvicorn")]
    own = [(b"x-message-id", b"7.0badcafe"), (b"content-length", b"0")]

    def expected(line: bytes, defaults: list[tuple[bytes, bytes]]) -> bytes:
        return line + b"".join(b"%s: %s\r\n" % header for header in [*defaults, *own]) + b"\r\n"

    for defaults in (first, later, first):
        for status, line in ((201, b"HTTP/1.1 201 Created\r\n"), (503, b"HTTP/1.1 503 Service Unavailable\r\n")):
            assert _encoded(status, defaults, own, b"") == expected(line, defaults)
    assert _encoded(201, [], own, b"body") == expected(b"HTTP/1.1 201 Created\r\n", [])[:-2] + b"\r\nbody"
