"""Security of the real server: queue names that could leave the data directory, size limits,
the REST API's bearer token, SigV4 for the SQS API, and clients that are slow or go away.

One server for the module, started with ``--token``, ``--aws-key`` and a small
``--max-message-size``. The body timeout (10 s, ``ServerConfig.body_timeout``) has no command-line
option, so the dribbling client below takes that long; the other slow clients run meanwhile.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from test_server_harness import ServerProcess, module_server, raw_request, read_all, sqs_client, status_of

TOKEN = "rest-token-\u00e9".encode().hex()  # ascii, long
KEY, SECRET = "AKIDSECURITY", "security-secret"
OTHER_KEY, OTHER_SECRET = "AKIDSECOND", "second-secret"
MAX_MESSAGE = 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(
        tmp_path_factory,
        "--token", TOKEN,
        "--aws-key", f"{KEY}:{SECRET}",
        "--aws-key", f"{OTHER_KEY}:{OTHER_SECRET}",
        "--max-message-size", str(MAX_MESSAGE),
    )


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def queue(server: ServerProcess) -> str:
    httpx.put(f"{server.url}/secure", headers=AUTH).raise_for_status()
    return "secure"


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- names ---------------------------------------------------------------------------------------


TRAVERSALS = [
    "/..%2F..%2Fetc",
    "/..%2f..%2fescaped",
    "/a%2Fb",
    "/%2E%2E",
    "/%2e%2e%2f%2e%2e%2fup",
    "/..",
    "/.hidden",
    "/%00nul",
    "/a%5Cb",
    "/" + "n" * 81,
    "/" + "n" * 5000,
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_queue_names_cannot_leave_the_data_directory(server: ServerProcess, path: str) -> None:
    parent = server.data.parent
    before = tree(parent)
    for method, suffix, body in (("PUT", "", b""), ("POST", "/messages", b"payload"), ("GET", "", b""),
                                 ("GET", "/messages", b""), ("DELETE", "", b""), ("DELETE", "/messages/0", b"")):
        # Sent raw: an HTTP client could normalize the path before it leaves.
        answer = raw_request(
            server.port,
            f"{method} {path}{suffix} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body,
        )
        status = status_of(answer)
        assert status in (400, 404, 414), (method, path, answer[:300])
        assert b"root:" not in answer
    after = tree(parent)
    new = {p for p in after - before if not p.startswith("server-") or "/" in p}
    assert not {p for p in new if not p.startswith("data/")}, new  # nothing outside the data directory
    assert not [p for p in new if p.startswith("data/") and p.count("/") == 1], new  # and no new queue
    assert not (server.data.parent.parent / "etc").exists()


def test_sqs_queue_names_are_checked_too(server: ServerProcess) -> None:
    sqs = sqs_client(server.url, KEY, SECRET)
    parent = server.data.parent
    before = tree(parent)
    for name in ("../../etc", "..", "a/b", "x" * 81, ".hidden", "a%2Fb"):
        with pytest.raises(ClientError) as info:
            sqs.create_queue(QueueName=name)
        assert info.value.response["Error"]["Code"] == "InvalidParameterValue", name
        with pytest.raises(sqs.exceptions.QueueDoesNotExist):
            sqs.get_queue_url(QueueName=name)
    for url in (f"{server.url}/000000000000/..", f"{server.url}/000000000000/..%2F..%2Fetc", f"{server.url}/..%2F"):
        with pytest.raises(ClientError) as info:
            sqs.send_message(QueueUrl=url, MessageBody="x")
        assert info.value.response["Error"]["Code"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
    assert {p for p in tree(parent) - before if not p.startswith("server-")} == set()


# -- size limits ------------------------------------------------------------------------------


def test_message_size_limit_is_413(client: httpx.Client, queue: str) -> None:
    assert client.post(f"/{queue}/messages", content=b"x" * MAX_MESSAGE).status_code == 201
    too_big = client.post(f"/{queue}/messages", content=b"x" * (MAX_MESSAGE + 1))
    assert too_big.status_code == 413
    assert str(MAX_MESSAGE) in too_big.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b"y" * 300

    assert client.post(f"/{queue}/messages", content=chunks()).status_code == 413
    # A huge declared length is refused at once, before any body is sent.
    answer = raw_request(
        client.base_url.port or 0,  # type: ignore[arg-type]
        f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 1000000000000\r\n\r\n".encode(),
        timeout=5,
    )
    assert status_of(answer) == 413
    # Only the message that fit was stored.
    got = client.get(f"/{queue}/messages")
    assert got.status_code == 200 and got.content == b"x" * MAX_MESSAGE
    client.delete(f"/{queue}/messages/{got.headers['X-Message-Id']}").raise_for_status()
    assert client.get(f"/{queue}/messages").status_code == 204


def test_sqs_request_size_limit(server: ServerProcess) -> None:
    sqs = sqs_client(server.url, KEY, SECRET)
    url = sqs.create_queue(QueueName="sized")["QueueUrl"]
    # --max-message-size is the SQS protocol's limit too.
    sqs.send_message(QueueUrl=url, MessageBody="z" * MAX_MESSAGE)
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="z" * (MAX_MESSAGE + 1))
    assert info.value.response["Error"]["Code"] == "InvalidParameterValue"
    # A request body over the server's request limit (2 MiB) is 413 before anything else.
    body = json.dumps({"QueueUrl": url, "MessageBody": "z" * (3 * 1024 * 1024)}).encode()
    answer = httpx.post(server.url, content=body, headers={"X-Amz-Target": "AmazonSQS.SendMessage",
                                                          "Content-Type": "application/x-amz-json-1.0"})
    assert answer.status_code == 413
    assert answer.json()["__type"].endswith("RequestEntityTooLarge")


# -- the REST API's bearer token -------------------------------------------------------------


def test_rest_requires_the_bearer_token(server: ServerProcess, queue: str) -> None:
    with httpx.Client(base_url=server.url) as anonymous:
        for request in (
            anonymous.build_request("GET", f"/{queue}"),
            anonymous.build_request("PUT", "/not-made"),
            anonymous.build_request("DELETE", f"/{queue}"),
            anonymous.build_request("GET", f"/{queue}/messages"),
            anonymous.build_request("POST", f"/{queue}/messages", content=b"sneaky"),
            anonymous.build_request("DELETE", f"/{queue}/messages/0"),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                            {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}):
                request.headers.pop("Authorization", None)
                request.headers.update(headers)
                answer = anonymous.send(request)
                assert answer.status_code == 401, (request.method, request.url, headers)
                assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        # The scheme's name is case-insensitive.
        for scheme in ("bearer", "BEARER"):
            assert anonymous.get(f"/{queue}", headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200
        # Nothing was done: the queue is there, empty, and not-made was not made.
        authorized = httpx.Client(base_url=server.url, headers=AUTH)
        assert authorized.get(f"/{queue}").status_code == 200
        assert authorized.get("/not-made").status_code == 404
        assert authorized.get(f"/{queue}/messages").status_code == 204
        # The probes stay open; the metrics, which name the queues, need the token (Prometheus sends one).
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        assert anonymous.get("/metrics").status_code == 401
        assert authorized.get("/metrics").status_code == 200


# -- SigV4 for the SQS API ---------------------------------------------------------------------


def test_sigv4_right_keys_work(server: ServerProcess) -> None:
    for key, secret in ((KEY, SECRET), (OTHER_KEY, OTHER_SECRET)):
        sqs = sqs_client(server.url, key, secret)
        url = sqs.create_queue(QueueName="signed")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody=f"signed by {key}")
        (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
        assert m["Body"] == f"signed by {key}"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_sigv4_wrong_secret_is_signature_does_not_match(server: ServerProcess) -> None:
    sqs = sqs_client(server.url, KEY, "not-the-secret")
    with pytest.raises(ClientError) as info:
        sqs.list_queues()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # One key's id with the other key's secret is no better.
    with pytest.raises(ClientError) as info:
        sqs_client(server.url, KEY, OTHER_SECRET).create_queue(QueueName="not-made-either")
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert not (server.data / "not-made-either").exists()


def test_sigv4_unknown_key_is_invalid_client_token_id(server: ServerProcess) -> None:
    with pytest.raises(ClientError) as info:
        sqs_client(server.url, "AKIDUNKNOWN", SECRET).list_queues()
    assert info.value.response["Error"]["Code"] == "InvalidClientTokenId"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def _signed(server: ServerProcess, action: str, payload: dict[str, Any], path: str = "/") -> AWSRequest:
    request = AWSRequest(
        method="POST",
        url=f"{server.url}{path}",
        data=json.dumps(payload).encode(),
        headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
    )
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "us-east-1").add_auth(request)
    return request


def test_sigv4_covers_the_body_and_the_path(server: ServerProcess) -> None:
    sqs = sqs_client(server.url, KEY, SECRET)
    url = sqs.create_queue(QueueName="tamper")["QueueUrl"]
    request = _signed(server, "SendMessage", {"QueueUrl": url, "MessageBody": "original"})
    headers = dict(request.headers.items())
    ok = httpx.post(request.url, content=request.body, headers=headers)
    assert ok.status_code == 200, ok.text
    tampered = json.dumps({"QueueUrl": url, "MessageBody": "tampered"}).encode()
    bad = httpx.post(request.url, content=tampered, headers=headers)
    assert bad.status_code == 403 and bad.json()["__type"].endswith("SignatureDoesNotMatch")
    # Signed for "/", replayed at the queue's URL.
    moved = httpx.post(url, content=request.body, headers=headers)
    assert moved.status_code == 403 and moved.json()["__type"].endswith("SignatureDoesNotMatch")
    unsigned = httpx.post(server.url, content=request.body, headers={"X-Amz-Target": "AmazonSQS.SendMessage"})
    assert unsigned.status_code in (400, 403) and "MissingAuthenticationToken" in unsigned.json()["__type"]
    bodies = [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]]
    assert bodies == ["original"]


# -- slow and broken clients ------------------------------------------------------------------


def test_slow_and_broken_clients_cannot_hold_the_server(server: ServerProcess, client: httpx.Client) -> None:
    client.put("/slow").raise_for_status()
    outcome: dict[str, Any] = {}

    def dribble() -> None:
        """Headers, then a body one byte at a time, never finished within the body timeout."""
        started = time.monotonic()
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(f"POST /slow/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Length: 200\r\n\r\n".encode())
        s.setblocking(False)
        answer = b""
        for _ in range(60):
            try:
                s.send(b"d")
            except OSError:
                break
            time.sleep(0.25)
            try:
                answer += s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if answer:
                break
        s.setblocking(True)
        s.settimeout(5)
        answer += read_all(s) if not answer.endswith(b"}") else b""
        s.close()
        outcome["dribble"] = (answer, time.monotonic() - started)

    dribbler = threading.Thread(target=dribble)
    dribbler.start()

    # Connections that send nothing, or headers that never end.
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(100)]
    for s in idle[:20]:
        s.sendall(b"POST /slow/messages HTTP/1.1\r\nHost: x\r\n")

    # Clients that go away in the middle of a body: politely (FIN), or with a reset (RST).
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(f"POST /slow/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Length: 500\r\n\r\nhalf a body".encode())
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()

    # Meanwhile everybody else is served, and quickly.
    served = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        started = time.monotonic()
        posted = client.post("/slow/messages", content=b"good")
        assert posted.status_code == 201
        fetched = client.get("/slow/messages")
        assert fetched.status_code == 200 and fetched.content == b"good"
        client.delete(f"/slow/messages/{fetched.headers['X-Message-Id']}").raise_for_status()
        served.append(time.monotonic() - started)
        time.sleep(0.05)
    assert len(served) > 10 and max(served) < 2.0, served
    sqs = sqs_client(server.url, KEY, SECRET)
    assert sqs.get_queue_url(QueueName="slow")["QueueUrl"].endswith("/slow")

    dribbler.join(40)
    answer, took = outcome["dribble"]
    assert status_of(answer) == 408, answer
    assert 9 <= took <= 20, took
    for s in idle:
        s.close()
    # Nothing of the abandoned or timed-out bodies was stored; the server is as good as new.
    time.sleep(0.2)
    assert client.get("/slow").json()["available"] == 0
    assert client.get("/slow/messages").status_code == 204
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert "Traceback" not in server.log()


def test_a_response_nobody_reads_does_not_hold_the_server(server: ServerProcess, client: httpx.Client) -> None:
    """A client that asks for a message and disconnects: the message comes back after its
    visibility timeout (at-least-once), and the server is unharmed."""
    client.put("/gone").raise_for_status()
    client.post("/gone/messages", content=b"unread").raise_for_status()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"GET /gone/messages?wait=1&visibility_timeout=1 HTTP/1.1\r\nHost: x\r\n"
              f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    got = client.get("/gone/messages", params={"wait": 5})
    assert got.status_code == 200 and got.content == b"unread"
    assert os.path.isdir(server.data / "gone")


def test_sigv4_old_signatures_are_request_expired(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime

    import botocore.auth

    an_hour_ago = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - datetime.timedelta(hours=1)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: an_hour_ago)
    with pytest.raises(ClientError) as info:
        sqs_client(server.url, KEY, SECRET).list_queues()
    assert info.value.response["Error"]["Code"] == "RequestExpired"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400  # as AWS answers it
    # A request that is not SigV4 at all.
    answer = httpx.post(server.url, content=b"{}", headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                                                           "Authorization": "Basic dXNlcjpwYXNz"})
    assert answer.status_code == 400 and answer.json()["__type"].endswith("IncompleteSignature")


def test_a_token_guards_the_sqs_api_too_without_aws_keys(tmp_path: Path) -> None:
    """With --token and no --aws-key, SQS requests need the bearer token: no open side door."""
    from fastapi.testclient import TestClient

    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    app = create_app(ServerConfig(data=tmp_path, rest_token="s3cret"))
    headers = {"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": "application/x-amz-json-1.0"}
    body = b'{"QueueName": "sneaky"}'
    with TestClient(app) as client:
        refused = client.post("/", content=body, headers=headers)
        assert refused.status_code == 401
        assert refused.json()["__type"] == "com.amazonaws.sqs#MissingAuthenticationToken"
        assert not (tmp_path / "sneaky").exists()
        # Posting to a queue's REST path with an SQS target goes the same way.
        assert client.post("/sneaky/messages", content=body, headers=headers).status_code == 401
        allowed = client.post("/", content=body, headers={**headers, "Authorization": "Bearer s3cret"})
        assert allowed.status_code == 200 and allowed.json()["QueueUrl"].endswith("/sneaky")


# -- request heads ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["header", "url"])
def test_a_request_head_over_the_limit_is_431_and_the_server_goes_on(
    server: ServerProcess, client: httpx.Client, where: str
) -> None:
    """A header line (or URL) that never ends is not kept in memory however long it grows: past
    the limit (64 KiB) the answer is 431 and the connection is closed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(b"GET /" + (b"u" if where == "url" else b" HTTP/1.1\r\nHost: x\r\nX-Big: "))
        answer = b""
        for _ in range(13 * 16):  # up to 13 MB, 64 KiB at a time, until the server answers
            try:
                s.sendall(b"a" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                break
            s.settimeout(0.01)
            try:
                answer = s.recv(65536)
            except TimeoutError:
                continue
            finally:
                s.settimeout(20)
            if answer:
                break
        answer += read_all(s)
    assert status_of(answer) == 431, answer[:200]
    assert b"over 65536 bytes" in answer
    # Heads under the limit are taken, and the server serves on.
    assert client.get("/healthz", headers={"X-Large": "b" * 30000}).status_code == 200
