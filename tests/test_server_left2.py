"""Audit of the server (second pass of the session's leftovers): SQS reads that must not make a
channel, the h11 fallback's busy answer, a second stop signal, the SQS protocol against AWS's."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from test_server_direct import serving
from test_server_harness import ServerProcess, start_server  # noqa: F401 (fixture)
from test_server_sqs_unit import Client, broker, client, sqs  # noqa: F401 (fixtures)

import pytest

from journalq.queue import Broker
from journalq.server.h11_protocol import StoppingH11Protocol
from journalq.server.polling import BUSY_BODY
from journalq.server.sqs import SIDECAR, SqsProtocol


def test_get_queue_attributes_of_a_library_topic_makes_no_channel(client: Client, broker: Broker) -> None:
    topic = broker.topic("events")
    topic.channel("billing")
    topic.send(b"one")
    url = client("GetQueueUrl", QueueName="events")["QueueUrl"]
    for names in (["All"], ["ApproximateNumberOfMessages"], ["QueueArn"]):
        client("GetQueueAttributes", QueueUrl=url, AttributeNames=names)
        assert topic.channel_names() == ["billing"], names
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["QueueArn"].endswith(":events")
    assert not any(name.startswith("ApproximateNumberOfMessages") for name in attributes)  # no consumer to count
    # A queue's counts are there, and the same topic counts once SQS has a consumer on it.
    client("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0)
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes == {"Attributes": {"ApproximateNumberOfMessages": "1"}}


def test_the_h11_fallback_answers_a_request_past_the_concurrency_limit_as_httptools_does(tmp_path: Path) -> None:
    """Under h11 (``journalq serve`` without httptools) a request past ``limit_concurrency`` got
    uvicorn's own plain 503, with no Retry-After; it now gets the server's busy answer, as under
    httptools. With a limit of one, a request's own connection fills it; below it, all is served."""
    with serving(tmp_path / "data", StoppingH11Protocol, limit_concurrency=1) as port:
        base = f"http://127.0.0.1:{port}"
        for method, path, body in [("PUT", "/q", b""), ("POST", "/q/messages", b"hello"), ("GET", "/healthz", b"")]:
            answer = httpx.request(method, base + path, content=body)
            assert answer.status_code == 503, (method, path)
            assert answer.headers["retry-after"] == "1" and answer.headers["connection"] == "close"
            assert answer.content == BUSY_BODY
    assert not (tmp_path / "data" / "q").exists()
    with serving(tmp_path / "data", StoppingH11Protocol, limit_concurrency=2) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        assert [http.put("/q").status_code, http.post("/q/messages", content=b"hi").status_code] == [201, 201]
        assert http.get("/q/messages").content == b"hi"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigint_sent_again_while_the_server_stops_still_stops_it_gracefully(
    start_server: Callable[..., ServerProcess], workers: str,  # noqa: F811 (the fixture)
) -> None:
    """A second SIGINT (Ctrl-C pressed twice: the terminal signals every process of the group,
    the workers of ``--workers`` too) was uvicorn's forced exit: the request under way was cut
    off (a 500 for a long poll that would have ended with 204 within a second), the app's
    shutdown skipped (journals neither synced nor closed) and its lifespan cancelled, tracebacks
    in the log. Every signal now asks for the same graceful stop, as SIGTERM's do."""
    server = start_server("--workers", workers)
    httpx.put(f"{server.url}/q").raise_for_status()
    httpx.post(f"{server.url}/q/messages", content=b"kept").raise_for_status()
    httpx.put(f"{server.url}/empty").raise_for_status()
    polled: list[int] = []
    poll = threading.Thread(target=lambda: polled.append(
        httpx.get(f"{server.url}/empty/messages", params={"wait": 20}, timeout=30).status_code))
    poll.start()
    time.sleep(0.5)  # the poll waits
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGINT)  # as a terminal does (the server leads its group)
    time.sleep(0.1)  # the stop has begun: the poll is ending
    os.killpg(server.process.pid, signal.SIGINT)
    assert server.process.wait(30) == 0, server.log()
    poll.join(30)
    assert polled == [204], server.log()
    assert "Traceback" not in server.log(), server.log()
    with Broker(server.data) as broker:
        assert [m.body for m in broker.queue("q", create=False).receive(10)] == [b"kept"]


def _synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.fsync`` is called on from now on."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.parametrize("sync", ["always", "none"])
def test_sqs_json_is_written_as_durably_as_the_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     sync: str) -> None:
    """sqs.json (a queue's SQS attributes that journalq has no setting for, its tags, its last
    purge) was replaced by a file never synced: after a power cut, an empty or partial file that
    reads as no attributes at all (a FIFO queue's DeduplicationScope messageGroup gone, its
    RedriveAllowPolicy, MaximumMessageSize and tags too), though CreateQueue and
    SetQueueAttributes had been answered. With a durable sync policy it is now synced, and its
    rename with it, as queue.json is."""
    with Broker(tmp_path / "data", sync=sync) as broker:
        sqs_client = Client(SqsProtocol(broker))
        url = sqs_client("CreateQueue", QueueName="q.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        synced = _synced(monkeypatch)
        sqs_client("SetQueueAttributes", QueueUrl=url, Attributes={"DeduplicationScope": "messageGroup"})
        directory = broker.root / "q.fifo"
        if sync == "always":
            assert any(p.startswith(str(directory / SIDECAR)) for p in synced), synced  # the file (as its tmp)
            assert str(directory) in synced  # its rename
        else:
            assert synced == []
        attributes = sqs_client("GetQueueAttributes", QueueUrl=url, AttributeNames=["DeduplicationScope"])
        assert attributes["Attributes"] == {"DeduplicationScope": "messageGroup"}


def test_a_full_disk_leaves_sqs_json_as_it_was_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sqs.json that could not be written (a full disk: rename(2) too may answer ENOSPC) left
    its temporary file behind, one per thread that met the failure; the change is now refused
    and nothing is left but the file as it was."""
    with Broker(tmp_path / "data", sync="always") as broker:
        sqs_client = Client(SqsProtocol(broker))
        url = sqs_client("CreateQueue", QueueName="q", tags={"team": "a"})["QueueUrl"]
        directory = broker.root / "q"
        before = (directory / SIDECAR).read_bytes()

        def replace(source: object, target: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(OSError) as failed:
            sqs_client("TagQueue", QueueUrl=url, Tags={"team": "b"})
        assert failed.value.errno == errno.ENOSPC
        monkeypatch.undo()
        assert sorted(p.name for p in directory.iterdir() if p.name.startswith(SIDECAR)) == [SIDECAR]
        assert (directory / SIDECAR).read_bytes() == before
        assert sqs_client("ListQueueTags", QueueUrl=url) == {"Tags": {"team": "a"}}


def test_a_query_protocol_request_is_told_that_the_endpoint_speaks_json(tmp_path: Path) -> None:
    """An SQS client of the older Query protocol (a form-encoded ``Action=...``, no X-Amz-Target:
    AWS SDK for Java 1.x and boto3 releases from before SQS's JSON protocol) was answered
    ``X-Amz-Target '' is not an Amazon SQS action``, which does not say what to change. The
    answer now says that the endpoint speaks SQS's JSON protocol, and not the Query one."""
    with serving(tmp_path / "data", StoppingH11Protocol) as port:
        answer = httpx.post(f"http://127.0.0.1:{port}/", content=b"Action=ListQueues&Version=2012-11-05",
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert answer.status_code == 400 and answer.headers["x-amzn-query-error"] == "InvalidAction;Sender"
        message = answer.json()["message"]
        assert "X-Amz-Target" in message and "JSON protocol" in message and "Query protocol" in message
        named = httpx.post(f"http://127.0.0.1:{port}/", content=b"{}", headers={"X-Amz-Target": "Other.Thing"})
        assert named.json()["message"] == "X-Amz-Target 'Other.Thing' is not an Amazon SQS action"
