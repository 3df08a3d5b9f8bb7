"""mq's six REST endpoints against the real server (httpx), the two APIs on one queue, and the
service endpoints: /metrics (Prometheus text), /healthz, /readyz, /openapi.json."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import Counter
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from test_queue_lookahead import DAMAGED_AT, damaged_topic
from test_server_harness import (
    ServerProcess,
    await_waiting_receives,
    metric_families,
    metric_sample,
    module_server,
    raw_request,
    read_answer,
    sqs_client,
    status_of,
)

from journalq.queue import Broker


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def queue(client: httpx.Client) -> str:
    """A new queue's name."""
    name = f"q-{uuid.uuid4().hex[:12]}"
    assert client.put(f"/{name}").status_code == 201
    return name


# -- queues: GET, PUT, DELETE /{queue} ----------------------------------------------------------


def test_put_creates_201_then_finds_200(client: httpx.Client) -> None:
    name = f"made-{uuid.uuid4().hex[:8]}"
    first = client.put(f"/{name}")
    assert first.status_code == 201 and first.json() == {"name": name, "created": True}
    again = client.put(f"/{name}", content=b"the body is ignored")
    assert again.status_code == 200 and again.json() == {"name": name, "created": False}


def test_put_of_a_fifo_name_is_refused_and_finds_a_fifo_queue_made_through_sqs(
    server: ServerProcess, client: httpx.Client
) -> None:
    """SQS gives names ending in .fifo to FIFO queues only, and REST makes standard queues (its
    messages carry no group id): such a PUT is refused, naming the way to make one, and makes
    nothing that boto3 would see; a FIFO queue made through SQS is found (200), FIFO still."""
    sqs = sqs_client(server.url)
    name = f"orders-{uuid.uuid4().hex[:8]}.fifo"
    refused = client.put(f"/{name}")
    assert refused.status_code == 400, refused.text
    assert "CreateQueue" in refused.json()["error"] and "FifoQueue=true" in refused.json()["error"]
    assert client.get(f"/{name}").status_code == 404
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name)
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    found = client.put(f"/{name}")
    assert found.status_code == 200 and found.json() == {"name": name, "created": False}, found.text
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["FifoQueue"])["Attributes"] == {"FifoQueue": "true"}


def test_a_post_to_a_fifo_queue_is_refused_and_stores_nothing(server: ServerProcess, client: httpx.Client) -> None:
    """A FIFO queue takes a message only with its group id, which REST has no place for: the
    POST is refused (400, naming SQS's way), on the direct path as through ASGI, and boto3 finds
    nothing to receive."""
    sqs = sqs_client(server.url)
    name = f"jobs-{uuid.uuid4().hex[:8]}.fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    for headers in ({}, {"Expect": "100-continue"}):  # the second goes through ASGI
        refused = client.post(f"/{name}/messages", content=b"no group", headers=headers)
        assert refused.status_code == 400, refused.text
        assert "MessageGroupId" in refused.json()["error"] and "x-message-id" not in refused.headers
    assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []
    sqs.send_message(QueueUrl=url, MessageBody="grouped", MessageGroupId="g", MessageDeduplicationId="d")
    got = client.get(f"/{name}/messages")  # receiving through REST is as SQS's ReceiveMessage
    assert got.status_code == 200 and got.content == b"grouped"


def test_put_with_shards_finds_a_queue_of_as_many_and_refuses_another_number(client: httpx.Client) -> None:
    name = f"sharded-{uuid.uuid4().hex[:8]}"
    assert client.put(f"/{name}", params={"shards": 2}).status_code == 201
    again = client.put(f"/{name}", params={"shards": 2})
    assert again.status_code == 200 and again.json() == {"name": name, "created": False}, again.text
    assert client.put(f"/{name}").status_code == 200  # no shards asked: found as it is
    conflict = client.put(f"/{name}", params={"shards": 4})
    assert conflict.status_code == 409, conflict.text
    assert "2 shard(s), not 4" in conflict.json()["error"], conflict.text
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    assert client.put(f"/{plain}").status_code == 201
    assert client.put(f"/{plain}", params={"shards": 1}).status_code == 200
    assert client.put(f"/{plain}", params={"shards": 2}).status_code == 409
    # A shards that no queue can have is a bad parameter, whether the queue exists or not.
    for queue in (name, f"never-{uuid.uuid4().hex[:8]}"):
        bad = client.put(f"/{queue}", params={"shards": 3})
        assert bad.status_code == 400 and "power of two" in bad.json()["error"], bad.text
    assert client.get(f"/{name}").status_code == 200  # nothing changed on the way


def test_get_queue_counts_and_404(client: httpx.Client, queue: str) -> None:
    client.post(f"/{queue}/messages", content=b"one").raise_for_status()
    got = client.get(f"/{queue}")
    assert got.status_code == 200
    info = got.json()
    assert info["name"] == queue and info["available"] == 1 and info["in_flight"] == 0
    assert client.get("/no-such-queue").status_code == 404
    assert "error" in client.get("/no-such-queue").json()


def test_delete_queue(client: httpx.Client, queue: str) -> None:
    client.post(f"/{queue}/messages", content=b"doomed").raise_for_status()
    deleted = client.delete(f"/{queue}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get(f"/{queue}").status_code == 404
    assert client.delete(f"/{queue}").status_code == 404
    assert client.get(f"/{queue}/messages").status_code == 404
    # made again, it is empty
    assert client.put(f"/{queue}").status_code == 201
    assert client.get(f"/{queue}/messages").status_code == 204


def test_endpoints_of_a_queue_that_does_not_exist_answer_404(client: httpx.Client) -> None:
    assert client.get("/nothing-here/messages").status_code == 404
    assert client.post("/nothing-here/messages", content=b"x").status_code == 404
    assert client.delete("/nothing-here/messages/0").status_code == 404
    assert client.delete("/nothing-here").status_code == 404
    assert client.get("/nothing-here").status_code == 404
    assert client.get("/nothing-here").status_code == 404  # and nothing was created on the way


# -- messages ----------------------------------------------------------------------------------


def test_post_then_get_then_204(client: httpx.Client, queue: str) -> None:
    body = bytes(range(256)) * 3  # any bytes, not only text
    posted = client.post(f"/{queue}/messages", content=body)
    assert posted.status_code == 201
    message_id = posted.headers["X-Message-Id"]
    got = client.get(f"/{queue}/messages")
    assert got.status_code == 200
    assert got.content == body
    assert got.headers["X-Message-Id"] == message_id
    assert got.headers["X-Receive-Count"] == "1"
    assert got.headers["X-Receipt"]
    empty = client.get(f"/{queue}/messages")
    assert empty.status_code == 204 and empty.content == b""
    assert "X-Message-Id" not in empty.headers


def test_messages_come_oldest_first_with_distinct_ids(client: httpx.Client, queue: str) -> None:
    ids = [client.post(f"/{queue}/messages", content=b"m%d" % i).headers["X-Message-Id"] for i in range(5)]
    assert len(set(ids)) == 5
    got = [client.get(f"/{queue}/messages") for _ in range(5)]
    assert [g.content for g in got] == [b"m%d" % i for i in range(5)]
    assert [g.headers["X-Message-Id"] for g in got] == ids


def test_fetched_message_is_hidden_then_delivered_again(client: httpx.Client, queue: str) -> None:
    message_id = client.post(f"/{queue}/messages", content=b"again").headers["X-Message-Id"]
    first = client.get(f"/{queue}/messages", params={"visibility_timeout": 1})
    assert first.status_code == 200 and first.headers["X-Receive-Count"] == "1"
    assert client.get(f"/{queue}/messages").status_code == 204  # hidden
    assert client.get(f"/{queue}").json()["in_flight"] == 1
    time.sleep(1.2)
    second = client.get(f"/{queue}/messages", params={"visibility_timeout": 30})
    assert second.status_code == 200
    assert second.content == b"again" and second.headers["X-Message-Id"] == message_id
    assert second.headers["X-Receive-Count"] == "2"
    assert second.headers["X-Receipt"] != first.headers["X-Receipt"]


def test_the_queue_visibility_timeout_is_the_default(server: ServerProcess, client: httpx.Client) -> None:
    sqs = sqs_client(server.url)
    name = f"vis-{uuid.uuid4().hex[:8]}"
    sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "1"})
    client.post(f"/{name}/messages", content=b"short").raise_for_status()
    assert client.get(f"/{name}/messages").status_code == 200
    assert client.get(f"/{name}/messages").status_code == 204
    # Back after the queue's one second, not the default thirty (a long poll to catch it).
    started = time.monotonic()
    again = client.get(f"/{name}/messages", params={"wait": 5})
    assert again.status_code == 200 and again.content == b"short"
    assert time.monotonic() - started < 3


def test_delete_by_id_in_every_state(client: httpx.Client, queue: str) -> None:
    waiting = client.post(f"/{queue}/messages", content=b"never fetched").headers["X-Message-Id"]
    fetched = client.post(f"/{queue}/messages", content=b"fetched").headers["X-Message-Id"]
    # A message never fetched can be deleted by its id.
    assert client.delete(f"/{queue}/messages/{waiting}").status_code == 204
    got = client.get(f"/{queue}/messages", params={"visibility_timeout": 1})
    assert got.content == b"fetched" and got.headers["X-Message-Id"] == fetched
    # One in flight too; it is not delivered again when its visibility ends.
    assert client.delete(f"/{queue}/messages/{fetched}").status_code == 204
    time.sleep(1.2)
    assert client.get(f"/{queue}/messages").status_code == 204
    # Gone: deleting again is 404, as is an id never given.
    assert client.delete(f"/{queue}/messages/{fetched}").status_code == 404
    token = fetched.rpartition(".")[2]  # the queue's, which its ids carry
    assert client.delete(f"/{queue}/messages/999999.{token}").status_code == 404
    assert client.get(f"/{queue}").json()["available"] == 0


def test_long_poll_returns_as_soon_as_a_message_arrives(
    client: httpx.Client, queue: str, server: ServerProcess
) -> None:
    def post_later() -> None:
        time.sleep(0.5)
        httpx.post(f"{server.url}/{queue}/messages", content=b"late")

    threading.Thread(target=post_later).start()
    started = time.monotonic()
    got = client.get(f"/{queue}/messages", params={"wait": 10})
    took = time.monotonic() - started
    assert got.status_code == 200 and got.content == b"late"
    assert 0.4 < took < 3, took
    started = time.monotonic()
    assert client.get(f"/{queue}/messages", params={"wait": 1}).status_code == 204
    assert time.monotonic() - started >= 0.95


def test_bad_parameters_are_400(client: httpx.Client, queue: str) -> None:
    assert client.get(f"/{queue}/messages", params={"wait": -1}).status_code == 400
    assert client.get(f"/{queue}/messages", params={"visibility_timeout": -5}).status_code == 400
    assert client.delete(f"/{queue}/messages/not-an-id").status_code in (400, 404)


def test_a_body_that_cannot_be_read_is_400_and_stores_nothing(
    server: ServerProcess, client: httpx.Client, queue: str
) -> None:
    # Chunked transfer coding with a chunk size that is not hexadecimal.
    answer = raw_request(
        server.port,
        f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n".encode(),
    )
    assert status_of(answer) == 400, answer
    # A body cut short: the client goes away before its Content-Length is reached.
    answer = raw_request(
        server.port,
        f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part".encode(),
        timeout=0.5,
    )
    assert answer == b"" or status_of(answer) in (400, 408), answer
    time.sleep(0.2)
    assert client.get(f"/{queue}").json()["available"] == 0
    assert client.get(f"/{queue}/messages").status_code == 204
    # and the server goes on serving
    assert client.post(f"/{queue}/messages", content=b"fine").status_code == 201


def test_a_post_expecting_100_continue_to_no_queue_is_404_before_its_body(
    server: ServerProcess, queue: str
) -> None:
    head = "POST /{}/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    answer = raw_request(server.port, head.format("nothing-here").encode(), timeout=3)
    assert status_of(answer) == 404 and b"nothing-here" in answer, answer  # no 100 Continue first
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:  # a queue that exists
        s.sendall(head.format(queue).encode())
        assert status_of(s.recv(65536)) == 100
        s.sendall(b"hello")
        assert status_of(read_answer(s)) == 201


def test_reserved_names_are_not_queues(client: httpx.Client) -> None:
    for name in ("metrics", "healthz", "readyz", "openapi.json"):
        assert client.put(f"/{name}").status_code == 400
        assert client.post(f"/{name}/messages", content=b"x").status_code in (400, 404)


# -- both APIs on one queue --------------------------------------------------------------------


def test_posted_through_rest_received_with_boto3(server: ServerProcess, client: httpx.Client, queue: str) -> None:
    sqs = sqs_client(server.url)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    bodies = [f"from rest {i} \u00e9\u4e2d".encode() for i in range(3)]
    ids = [client.post(f"/{queue}/messages", content=b).headers["X-Message-Id"] for b in bodies]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    assert [m["Body"].encode() for m in got] == bodies
    assert [m["MessageId"] for m in got] == ids
    for m in got:
        assert m["MD5OfBody"] == hashlib.md5(m["Body"].encode()).hexdigest()
        assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    # Deleted through SQS: gone for REST too.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    # Deleted by id through REST while in flight under an SQS receipt.
    assert client.delete(f"/{queue}/messages/{ids[1]}").status_code == 204
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[2]["ReceiptHandle"], VisibilityTimeout=0)
    back = client.get(f"/{queue}/messages")
    assert back.status_code == 200 and back.content == bodies[2] and back.headers["X-Receive-Count"] == "2"
    assert client.get(f"/{queue}/messages").status_code == 204


def test_sent_with_boto3_fetched_through_rest(server: ServerProcess, client: httpx.Client) -> None:
    sqs = sqs_client(server.url)
    name = f"cross-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert client.get(f"/{name}").status_code == 200  # a queue made through SQS is a REST queue
    sent = sqs.send_message(QueueUrl=url, MessageBody="from boto3 \u2603",
                            MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}})
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "batched"}])
    got = client.get(f"/{name}/messages")
    assert got.status_code == 200
    assert got.content == "from boto3 \u2603".encode()
    assert got.headers["X-Message-Id"] == sent["MessageId"]
    assert client.delete(f"/{name}/messages/{sent['MessageId']}").status_code == 204
    second = client.get(f"/{name}/messages")
    assert second.content == b"batched" and second.headers["X-Message-Id"] == batch["Successful"][0]["MessageId"]
    assert client.delete(f"/{name}/messages/{second.headers['X-Message-Id']}").status_code == 204
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages") is None
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    # A queue deleted through REST no longer exists for SQS.
    assert client.delete(f"/{name}").status_code == 204
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name)


# -- metrics, health, OpenAPI ------------------------------------------------------------------


def test_healthz_and_readyz(client: httpx.Client, queue: str) -> None:
    """Liveness (the process serves) and readiness (the store lists its queues)."""
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ok" and ready.json()["queues"] >= 1


def test_readyz_is_503_while_the_queues_cannot_be_listed_and_healthz_200(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that fails (here the data directory refuses to be listed) makes the server not
    ready, with the reason and Retry-After; it is still alive: no probe should restart it for that."""
    import warnings

    with warnings.catch_warnings():  # starlette's note that httpx2 will replace httpx
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from journalq.queue import Broker
    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    def refused(self: Broker) -> list[str]:
        raise PermissionError(13, "Permission denied", str(self.root))

    with TestClient(create_app(ServerConfig(data=tmp_path))) as http:
        assert http.get("/readyz").json() == {"status": "ok", "queues": 0}
        monkeypatch.setattr(Broker, "names", refused)
        ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "1", ready.text
        assert ready.json() == {"error": "the queues cannot be listed: Permission denied"}
        assert http.get("/healthz").json() == {"status": "ok"}
        document = http.get("/openapi.json").json()["paths"]
        assert "503" in document["/readyz"]["get"]["responses"]
        assert "Retry-After" in document["/readyz"]["get"]["responses"]["503"]["headers"]


def test_openapi_lists_the_six_mq_endpoints(client: httpx.Client) -> None:
    got = client.get("/openapi.json")
    assert got.status_code == 200
    document = got.json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert set(paths["/{queue}"]) >= {"get", "put", "delete"}
    assert set(paths["/{queue}/messages"]) >= {"get", "post"}
    assert set(paths["/{queue}/messages/{message_id}"]) >= {"delete"}
    operations = [
        (path, method) for path, item in paths.items() if "{queue}" in path for method in item
    ]
    assert len(operations) == 6, operations


def test_openapi_gives_every_status_each_endpoint_answers(
    server: ServerProcess, client: httpx.Client, queue: str
) -> None:
    """Each of the six endpoints driven to the answers it can give here (all but 401, 408 and
    503, checked below and in their own tests): every status met is in the document."""
    other = f"q-{uuid.uuid4().hex[:12]}"
    message_id = client.post(f"/{queue}/messages", content=b"m").headers["X-Message-Id"]
    met: dict[tuple[str, str], set[int]] = {}
    for path, method, url, kwargs in [
        ("/{queue}", "get", f"/{queue}", {}), ("/{queue}", "get", "/nothing-here", {}),
        ("/{queue}", "get", "/a%2Fb", {}),
        ("/{queue}", "put", f"/{other}", {}), ("/{queue}", "put", f"/{other}", {}),
        ("/{queue}", "put", "/sharded-badly", {"params": {"shards": "three"}}),
        ("/{queue}", "put", f"/{queue}", {"params": {"shards": 2}}), ("/{queue}", "put", "/a.fifo", {}),
        ("/{queue}/messages", "get", f"/{queue}/messages", {}), ("/{queue}/messages", "get", f"/{queue}/messages", {}),
        ("/{queue}/messages", "get", "/nothing-here/messages", {}),
        ("/{queue}/messages", "get", f"/{queue}/messages", {"params": {"wait": "soon"}}),
        ("/{queue}/messages", "post", f"/{queue}/messages", {"content": b"x"}),
        ("/{queue}/messages", "post", "/nothing-here/messages", {"content": b"x"}),
        ("/{queue}/messages", "post", "/metrics/messages", {"content": b"x"}),
        ("/{queue}/messages", "post", f"/{queue}/messages", {"content": b"x" * (1024 * 1024 + 1)}),
        ("/{queue}/messages/{message_id}", "delete", f"/{queue}/messages/{message_id}", {}),
        ("/{queue}/messages/{message_id}", "delete", f"/{queue}/messages/{message_id}", {}),
        ("/{queue}/messages/{message_id}", "delete", f"/{queue}/messages/not-an-id", {}),
        ("/{queue}", "delete", f"/{other}", {}), ("/{queue}", "delete", f"/{other}", {}),
        ("/{queue}", "delete", "/healthz", {}),
    ]:
        met.setdefault((path, method), set()).add(client.request(method.upper(), url, **kwargs).status_code)
    assert met[("/{queue}/messages", "post")] == {201, 400, 404, 413}, met  # the drive did what it meant to
    assert met[("/{queue}", "put")] == {200, 201, 400, 409}, met
    paths = client.get("/openapi.json").json()["paths"]
    for (path, method), statuses in met.items():
        documented = paths[path][method]["responses"]
        assert {str(status) for status in statuses} <= set(documented), (path, method, statuses, sorted(documented))
        assert "422" not in documented and "503" in documented, (path, method)  # 422 is answered 400
        assert "Retry-After" in documented["503"]["headers"]
        assert "401" not in documented  # this server takes no token
    assert "X-Message-Id" in paths["/{queue}/messages"]["post"]["responses"]["201"]["headers"]
    assert "X-Message-Id" in paths["/{queue}/messages"]["get"]["responses"]["200"]["headers"]
    assert "application/octet-stream" in paths["/{queue}/messages"]["get"]["responses"]["200"]["content"]
    assert "requestBody" in paths["/{queue}/messages"]["post"]


def test_openapi_of_a_server_with_a_token_asks_for_it(tmp_path) -> None:
    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    document = create_app(ServerConfig(data=tmp_path, rest_token="t")).openapi()
    assert document["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    operations = [op for path, item in document["paths"].items() if "{queue}" in path for op in item.values()]
    assert len(operations) == 6
    assert all(op["security"] == [{"bearer": []}] and "401" in op["responses"] for op in operations)


@pytest.mark.parametrize("token", [None, "t"])
def test_the_openapi_documents_are_valid_openapi(tmp_path, token: str | None) -> None:
    import openapi_spec_validator

    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    openapi_spec_validator.validate(create_app(ServerConfig(data=tmp_path, rest_token=token)).openapi())


def test_a_wrong_method_is_405_allowing_every_method_of_the_path(client: httpx.Client, queue: str) -> None:
    for method, path, allowed in [
        ("POST", f"/{queue}", "GET, HEAD, PUT, DELETE"),
        ("PATCH", f"/{queue}", "GET, HEAD, PUT, DELETE"),
        ("OPTIONS", f"/{queue}", "GET, HEAD, PUT, DELETE"),
        ("PUT", f"/{queue}/messages", "GET, POST"),
        ("DELETE", f"/{queue}/messages", "GET, POST"),
        ("HEAD", f"/{queue}/messages", "GET, POST"),  # a HEAD would take a message
        ("GET", f"/{queue}/messages/0", "DELETE"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
        ("GET", "/", "POST"),  # the SQS protocol's
    ]:
        answer = client.request(method, path)
        assert answer.status_code == 405, (method, path, answer)
        assert answer.headers["Allow"] == allowed, (method, path, answer.headers)
        if method != "HEAD":
            assert answer.json()["error"].startswith(f"{method} {path}: the method is not allowed"), answer.text
    assert client.get(f"/{queue}").json()["available"] == 0  # the HEAD took nothing


def test_head_is_get_without_the_body(client: httpx.Client, queue: str) -> None:
    for path in (f"/{queue}", "/healthz", "/readyz", "/metrics", "/openapi.json"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
    assert client.head("/nothing-here").status_code == 404


def test_unknown_endpoints_and_unreadable_parameters_are_named(client: httpx.Client, queue: str) -> None:
    for path in ("/a/b/c", f"/{queue}/messages/0/more"):
        answer = client.get(path)
        assert answer.status_code == 404 and answer.json() == {"error": f"GET {path}: no such endpoint"}
    answer = client.get(f"/{queue}/messages", params={"wait": "soon"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("wait: "), answer.text
    assert "'soon'" in answer.json()["error"]
    answer = client.get(f"/{queue}/messages", params={"visibility_timeout": "long"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("visibility_timeout: "), answer.text
    answer = client.put(f"/q-{uuid.uuid4().hex[:8]}", params={"shards": "many"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("shards: "), answer.text


def test_a_queue_stopped_at_damage_is_seen_in_its_counts_and_metrics(
    server: ServerProcess, client: httpx.Client
) -> None:
    """Damage in a queue's journal stops its receives (after every message before it): monitoring
    sees it, in ``GET /{queue}`` (``damage``: file, byte, offset) and in the gauge
    ``journalq_queue_damaged``, 1 for that queue and 0 for a sound one."""
    damaged, sound = f"damaged-{uuid.uuid4().hex[:8]}", f"sound-{uuid.uuid4().hex[:8]}"
    segment, _ = damaged_topic(server.data, "value length", name=damaged)
    client.put(f"/{sound}").raise_for_status()
    counts = client.get(f"/{damaged}").json()
    assert str(segment) in counts["damage"] and f"offset {DAMAGED_AT}" in counts["damage"], counts
    assert counts["available"] == 3000 and client.get(f"/{sound}").json()["damage"] is None
    families = metric_families(client.get("/metrics").text)
    assert families["journalq_queue_damaged"].type == "gauge"
    assert metric_sample(families, "journalq_queue_damaged", "journalq_queue_damaged", queue=damaged) == 1
    assert metric_sample(families, "journalq_queue_damaged", "journalq_queue_damaged", queue=sound) == 0


def test_metrics_in_prometheus_text_format(server: ServerProcess, client: httpx.Client) -> None:
    name = f"metered-{uuid.uuid4().hex[:8]}"
    client.put(f"/{name}").raise_for_status()
    for i in range(4):
        client.post(f"/{name}/messages", content=b"m%d" % i).raise_for_status()
    fetched = client.get(f"/{name}/messages")
    client.delete(f"/{name}/messages/{fetched.headers['X-Message-Id']}").raise_for_status()
    client.get(f"/{name}/messages")  # one in flight
    sqs = sqs_client(server.url)
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="via sqs")

    got = client.get("/metrics")
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/plain")
    families = metric_families(got.text)
    assert families["journalq_messages_in"].type == "counter"
    assert metric_sample(families, "journalq_messages_in", "journalq_messages_in_total", queue=name) == 5
    assert metric_sample(families, "journalq_messages_out", "journalq_messages_out_total", queue=name) == 2
    assert metric_sample(families, "journalq_messages_deleted", "journalq_messages_deleted_total", queue=name) == 1
    assert metric_sample(families, "journalq_queue_available", "journalq_queue_available", queue=name) == 3
    assert metric_sample(families, "journalq_queue_in_flight", "journalq_queue_in_flight", queue=name) == 1
    assert metric_sample(families, "journalq_queue_dead", "journalq_queue_dead", queue=name) == 0
    assert "journalq_queue_delayed" in families
    # syncs: the server answers only once data is synced (sync=always)
    assert families["journalq_syncs"].type == "counter"
    assert metric_sample(families, "journalq_syncs", "journalq_syncs_total") > 0
    # latency histograms, by API and operation
    latency = families["journalq_request_seconds"]
    assert latency.type == "histogram"
    operations = {(s.labels["api"], s.labels["operation"]) for s in latency.samples}
    assert ("rest", "POST /{queue}/messages") in operations
    assert ("rest", "GET /{queue}/messages") in operations
    assert ("sqs", "SendMessage") in operations
    count = metric_sample(families, "journalq_request_seconds", "journalq_request_seconds_count",
                    api="rest", operation="POST /{queue}/messages", status="201")
    assert count is not None and count >= 4
    buckets = [s for s in latency.samples if s.name == "journalq_request_seconds_bucket"
               and s.labels["operation"] == "POST /{queue}/messages" and s.labels["status"] == "201"]
    assert any(s.labels["le"] == "+Inf" and s.value == count for s in buckets)


# -- long polls do not hold up the rest ------------------------------------------------------------


def test_many_long_polls_do_not_hold_up_writes(server: ServerProcess) -> None:
    """300 consumers long-polling an empty queue (half REST, half SQS) is an ordinary deployment:
    the writes of producers meanwhile are answered at once, and one of the pollers gets each."""
    import asyncio
    import json

    idle, busy = f"idle-{uuid.uuid4().hex[:8]}", f"busy-{uuid.uuid4().hex[:8]}"
    for name in (idle, busy):
        httpx.put(f"{server.url}/{name}").raise_for_status()
    results: list[int] = []

    async def poll_all() -> None:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:
            rest = [c.get(f"/{idle}/messages", params={"wait": 4}) for _ in range(150)]
            headers = {"X-Amz-Target": "AmazonSQS.ReceiveMessage", "Content-Type": "application/x-amz-json-1.0"}
            payload = json.dumps({"QueueUrl": f"/000000000000/{idle}", "WaitTimeSeconds": 4})
            sqs = [c.post("/", content=payload, headers=headers) for _ in range(150)]
            answers = await asyncio.gather(*rest, *sqs)
            results.extend(a.status_code for a in answers)

    pollers = threading.Thread(target=lambda: asyncio.run(poll_all()))
    pollers.start()
    time.sleep(1.5)  # every poll is waiting now
    sqs = sqs_client(server.url)
    timings = {}
    started = time.monotonic()
    assert httpx.post(f"{server.url}/{busy}/messages", content=b"w", timeout=30).status_code == 201
    timings["rest post"] = time.monotonic() - started
    started = time.monotonic()
    sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName=busy)["QueueUrl"], MessageBody="w")
    timings["sqs send"] = time.monotonic() - started
    started = time.monotonic()
    assert httpx.get(f"{server.url}/{busy}/messages", timeout=30).status_code == 200
    timings["rest get"] = time.monotonic() - started
    assert max(timings.values()) < 1.5, timings  # without a pool of their own: until the polls end
    pollers.join(60)
    assert len(results) == 300 and set(results) <= {200, 204}, Counter(results)  # 204: REST, 200: SQS


def test_clients_cannot_make_metric_labels_without_bound(server: ServerProcess, client: httpx.Client) -> None:
    """X-Amz-Target comes from the client: made-up actions share one label, not one each."""
    for i in range(20):
        answer = client.post("/", headers={"X-Amz-Target": f"AmazonSQS.MadeUp{uuid.uuid4().hex}"}, content=b"{}")
        assert answer.status_code == 400 and answer.json()["__type"].endswith("InvalidAction")
    client.get(f"/{uuid.uuid4().hex}/{uuid.uuid4().hex}/deep", headers={"X-Amz-Target": f"Evil.{uuid.uuid4().hex}"})
    text = client.get("/metrics").text
    assert "MadeUp" not in text and "Evil" not in text
    operations = {s.labels["operation"] for s in metric_families(text)["journalq_request_seconds"].samples}
    assert "other" in operations


def test_every_sqs_action_has_its_metric_label(tmp_path) -> None:
    from journalq.queue import Broker
    from journalq.server.metrics import SQS_ACTIONS
    from journalq.server.sqs import SqsProtocol

    with Broker(tmp_path) as broker:
        assert set(SqsProtocol(broker).actions) <= SQS_ACTIONS


def test_deleting_a_queue_under_long_polls(server: ServerProcess, client: httpx.Client) -> None:
    """The polls end at once with nothing (or with "no such queue"), in each API's own shape."""
    sqs = sqs_client(server.url)
    name = f"doomed-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    results: dict[str, Any] = {}

    def rest_poll() -> None:
        answer = httpx.get(f"{server.url}/{name}/messages", params={"wait": 10}, timeout=30)
        results["rest"] = (answer.status_code, answer.text)

    def sqs_poll() -> None:
        try:
            results["sqs"] = sqs_client(server.url).receive_message(QueueUrl=url, WaitTimeSeconds=10)
        except ClientError as exc:
            results["sqs"] = exc.response["Error"]["Code"]

    threads = [threading.Thread(target=rest_poll), threading.Thread(target=sqs_poll)]
    for t in threads:
        t.start()
    time.sleep(0.7)
    started = time.monotonic()
    assert client.delete(f"/{name}").status_code == 204
    for t in threads:
        t.join(30)
    assert time.monotonic() - started < 5, "the polls waited on after their queue was deleted"
    assert results["rest"][0] in (204, 404), results
    assert results["sqs"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist") or (
        isinstance(results["sqs"], dict) and "Messages" not in results["sqs"]
    ), results
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.receive_message(QueueUrl=url)


def test_a_queue_another_process_is_removing_under_long_polls_is_not_found(
    server: ServerProcess, client: httpx.Client
) -> None:
    """Another process's delete renames the queue's directory away, then removes its files: the
    polls waiting on it end with 404 and QueueDoesNotExist (SQS's answer was a 500)."""
    sqs = sqs_client(server.url, read_timeout=60)
    name = f"removed-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    results: dict[str, Any] = {}

    def rest_poll() -> None:
        answer = httpx.get(f"{server.url}/{name}/messages", params={"wait": 20}, timeout=60)
        results["rest"] = (answer.status_code, answer.json() if answer.content else None)

    def sqs_poll() -> None:
        try:
            results["sqs"] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)
        except ClientError as exc:
            results["sqs"] = exc.response["Error"]["Code"]

    threads = [threading.Thread(target=rest_poll), threading.Thread(target=sqs_poll)]
    for t in threads:
        t.start()
    await_waiting_receives(server.url, name, 2)
    doomed = server.data / f".deleted-{name}-1-0badcafe"
    os.replace(server.data / name, doomed)  # a deleter's first step (journalq.queue.removal)
    for lock in (doomed / "channels" / "default" / "jnl.lck", doomed / "jnl.lck"):
        lock.unlink()  # and the first files its removal takes
    for t in threads:
        t.join(60)
    assert results["rest"][0] == 404 and "deleted" in results["rest"][1]["error"], results
    assert results["sqs"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"), results
    shutil.rmtree(doomed)


def test_a_long_poll_whose_client_went_away_takes_nothing(
    server: ServerProcess, client: httpx.Client, queue: str
) -> None:
    """A client that long-polls and disconnects: its poll stops within about a second, so a
    message posted later goes to the next consumer, not to nobody for a visibility timeout; and
    one posted within that second, which the poll takes, it gives back at once."""
    for pause in (1.5, 0.2):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(f"GET /{queue}/messages?wait=30 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(0.3)
        s.close()
        time.sleep(pause)
        client.post(f"/{queue}/messages", content=b"for someone there").raise_for_status()
        got = client.get(f"/{queue}/messages", params={"wait": 2})
        assert got.status_code == 200 and got.content == b"for someone there"
        client.delete(f"/{queue}/messages/{got.headers['x-message-id']}").raise_for_status()


# -- mq's daemons: the mover's delayed redelivery and the reaper, through the server ----------------


def test_a_queue_delay_holds_new_messages_then_delivers_them(server: ServerProcess, client: httpx.Client) -> None:
    """mq-mover's ``--delay``: a queue's delay (SQS's DelaySeconds) holds a posted message back."""
    name = f"delayed-{uuid.uuid4().hex[:8]}"
    sqs_client(server.url).create_queue(QueueName=name, Attributes={"DelaySeconds": "1"})
    client.post(f"/{name}/messages", content=b"later").raise_for_status()
    assert client.get(f"/{name}/messages").status_code == 204
    families = metric_families(client.get("/metrics").text)
    assert metric_sample(families, "journalq_queue_delayed", "journalq_queue_delayed", queue=name) == 1
    got = client.get(f"/{name}/messages", params={"wait": 5})
    assert got.status_code == 200 and got.content == b"later"


def test_the_reaper_removes_what_was_deleted_from_the_disk(server: ServerProcess, client: httpx.Client) -> None:
    """mq-reaper: messages deleted through the API leave the disk (their segments), some time
    after (every ``task_gc_interval``), with no daemon of its own."""
    from journalq.queue import Broker

    name = f"reaped-{uuid.uuid4().hex[:8]}"
    with Broker(server.data) as broker:  # small segments, collected often
        broker.queue(name, segment_size=4096, task_gc_interval=0.2)
    segments = server.data / name / "jnl"
    for i in range(30):
        client.post(f"/{name}/messages", content=b"%03d" % i * 300).raise_for_status()
    written = sorted(segments.glob("*.jnl"))
    assert len(written) >= 5, written
    for _ in range(30):
        got = client.get(f"/{name}/messages")
        assert client.delete(f"/{name}/messages/{got.headers['X-Message-Id']}").status_code == 204
    time.sleep(0.3)
    assert client.get(f"/{name}/messages").status_code == 204  # a step of the queue's, which collects
    left = sorted(segments.glob("*.jnl"))
    assert left == written[-1:], left  # all but the segment being written


def test_dead_letters_and_syncs_move_the_metrics(server: ServerProcess, client: httpx.Client) -> None:
    sqs = sqs_client(server.url)
    source, dead = f"src-{uuid.uuid4().hex[:8]}", f"dlq-{uuid.uuid4().hex[:8]}"
    sqs.create_queue(QueueName=dead)
    policy = f'{{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:{dead}", "maxReceiveCount": 1}}'
    sqs.create_queue(QueueName=source, Attributes={"RedrivePolicy": policy})

    def scrape() -> dict[str, object]:
        return metric_families(client.get("/metrics").text)

    syncs = metric_sample(scrape(), "journalq_syncs", "journalq_syncs_total")
    client.post(f"/{source}/messages", content=b"poison").raise_for_status()
    after_post = scrape()
    assert metric_sample(after_post, "journalq_syncs", "journalq_syncs_total") > syncs  # sync=always
    assert client.get(f"/{source}/messages", params={"visibility_timeout": 0}).status_code == 200
    assert client.get(f"/{source}/messages").status_code == 204  # received once: now dead
    families = scrape()
    assert metric_sample(families, "journalq_queue_dead", "journalq_queue_dead", queue=source) == 1
    assert metric_sample(families, "journalq_queue_available", "journalq_queue_available", queue=dead) == 1
    assert metric_sample(families, "journalq_messages_out", "journalq_messages_out_total", queue=source) == 1


# -- a queue whose settings file is damaged, a queue's receive wait --------------------------------


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
