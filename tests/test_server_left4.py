"""The server, left over from the fourth session: a queue named as its own dead-letter queue
(SQS's answer), and REST deletes of ids given before a library topic got its channel ``default``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server_rest_ids import served

from journalq.queue import Broker
from journalq.server.sqs import SqsError, SqsProtocol

BASE = "http://127.0.0.1:8080"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(tmp_path / "data", sync="none") as opened:
        yield opened


@pytest.fixture
def sqs(broker: Broker) -> SqsProtocol:
    return SqsProtocol(broker)


def _refusal(sqs: SqsProtocol, action: str, **request: Any) -> SqsError:
    with pytest.raises(SqsError) as caught:
        sqs.handle(action, request, BASE)
    return caught.value


# -- a queue named as its own dead-letter queue ------------------------------------------------

_OWN_REASON = "Dead-letter target can't be the source queue itself."


def _own_policy(name: str) -> str:
    return json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:000000000000:{name}", "maxReceiveCount": 3})


def _assert_own_queue_refused(error: SqsError, policy: str) -> None:
    """As AWS refuses every RedrivePolicy it does not take: InvalidParameterValue, 400, the
    sender's fault, "Value <policy> for parameter RedrivePolicy is invalid. Reason: <why>."."""
    assert error.code == "InvalidParameterValue"
    assert error.status == 400
    assert error.query_error == "InvalidParameterValue;Sender"
    assert error.message == f"Value {policy} for parameter RedrivePolicy is invalid. Reason: {_OWN_REASON}"


def test_set_queue_attributes_naming_the_queue_as_its_own_dead_letter_queue(sqs: SqsProtocol) -> None:
    url = sqs.handle("CreateQueue", {"QueueName": "jobs"}, BASE)["QueueUrl"]
    policy = _own_policy("jobs")
    error = _refusal(sqs, "SetQueueAttributes", QueueUrl=url, Attributes={"RedrivePolicy": policy})
    _assert_own_queue_refused(error, policy)
    # Nothing was changed: the queue has no redrive policy.
    attributes = sqs.handle("GetQueueAttributes", {"QueueUrl": url, "AttributeNames": ["All"]}, BASE)["Attributes"]
    assert "RedrivePolicy" not in attributes


@pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
def test_create_queue_naming_itself_as_its_own_dead_letter_queue(sqs: SqsProtocol, exists: bool) -> None:
    if exists:
        sqs.handle("CreateQueue", {"QueueName": "jobs"}, BASE)
    policy = _own_policy("jobs")
    error = _refusal(sqs, "CreateQueue", QueueName="jobs", Attributes={"RedrivePolicy": policy})
    _assert_own_queue_refused(error, policy)
    names = sqs.handle("ListQueues", {}, BASE).get("QueueUrls", [])
    assert names == ([f"{BASE}/000000000000/jobs"] if exists else [])  # none made by the refused create


def test_own_queue_is_refused_whatever_region_and_account_the_arn_names(sqs: SqsProtocol) -> None:
    """Any ARN whose name is the queue's names the queue (as URLs do: ``name_of_arn``)."""
    url = sqs.handle("CreateQueue", {"QueueName": "jobs"}, BASE)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:123456789012:jobs", "maxReceiveCount": 1})
    error = _refusal(sqs, "SetQueueAttributes", QueueUrl=url, Attributes={"RedrivePolicy": policy})
    _assert_own_queue_refused(error, policy)


# -- REST: an id given before a library topic had its channel ``default`` ----------------------


def test_an_untagged_id_of_a_topic_that_got_its_default_channel_since_is_refused_saying_why(tmp_path: Path) -> None:
    """A send to a topic whose channels are its own answers the topic's own id, with no token (no
    channel ``default`` to take one of); a fetch then gives the topic that channel. A DELETE of
    the untagged id cannot tell this topic's message from one of an earlier topic of the name
    (the token is what tells them apart), so it is refused: the 400 says why and what to do,
    and doing it (fetch, then delete by the id the fetch answers) deletes the message."""
    data = tmp_path / "data"
    with Broker(data, sync="none") as broker:
        broker.topic("t").channel("audit")  # a library topic: its channels are its own

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        sent = await client.post("/t/messages", content=b"m")
        fetched = await client.get("/t/messages")  # makes the channel default: a REST consumer
        refused = await client.delete(f"/t/messages/{sent.headers['x-message-id']}")
        deleted = await client.delete(f"/t/messages/{fetched.headers['x-message-id']}")
        return [sent, fetched, refused, deleted, await client.get("/t")]

    sent, fetched, refused, deleted, info = served(data, talk)
    untagged = sent.headers["x-message-id"]
    assert "." not in untagged  # the topic's own id, as its channels' consumers see it
    assert fetched.status_code == 200 and fetched.headers["x-message-id"].startswith(f"{untagged}.")
    assert refused.status_code == 400, refused.text
    detail = refused.json()["error"]
    assert f"message id {untagged!r} carries no token of queue 't'" in detail
    assert "no channel 'default'" in detail  # why it has none
    assert "earlier queue or topic of this name" in detail  # why it is not taken
    assert "GET /t/messages" in detail and "X-Message-Id" in detail  # what to do
    assert deleted.status_code == 204, deleted.text
    assert info.json()["available"] == 0 and info.json()["in_flight"] == 0


def test_an_id_with_a_malformed_token_keeps_its_plain_refusal(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q")
        given = (await client.post("/q/messages", content=b"m")).headers["x-message-id"]
        return await client.delete(f"/q/messages/{given.rpartition('.')[0]}.XYZ")

    refused = served(tmp_path / "data", talk)
    assert refused.status_code == 400
    assert "is not one of this queue's ids" in refused.json()["error"]
