"""The server, left over from the fourth session: a queue named as its own dead-letter queue
(SQS's answer), and REST deletes of ids given before a library topic got its channel ``default``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
