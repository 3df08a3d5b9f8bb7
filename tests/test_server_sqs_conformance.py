"""Conformance of the Amazon SQS JSON protocol with what AWS documents and SDKs expect, through
boto3 against the real server: each test pins one place where the endpoint used to diverge."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from test_server_harness import ServerProcess, module_server, sqs_client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory)


@pytest.fixture(scope="module")
def sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url)


def new_name(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def error_of(info: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = info.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_a_fifo_message_sent_with_delay_seconds_zero_keeps_the_queue_delay(sqs: Any) -> None:
    """FIFO queues have no per-message delay: DelaySeconds 0 is taken, but the queue's own
    DelaySeconds still applies (it used to deliver the message at once)."""
    url = sqs.create_queue(
        QueueName=new_name() + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true", "DelaySeconds": "60"},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", MessageGroupId="g", DelaySeconds=0)
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "later too", "MessageGroupId": "h", "DelaySeconds": 0}]
    )
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert counts["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "2"


@pytest.mark.parametrize("after", [5, None, ["x"], {"a": 1}])
def test_a_list_queues_token_of_the_wrong_shape_is_invalid_parameter_value(sqs: Any, after: Any) -> None:
    """A NextToken that decodes but does not hold a queue name is the client's error (it was a 500)."""
    token = base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode()
    with pytest.raises(ClientError) as info:
        sqs.list_queues(MaxResults=1, NextToken=token)
    assert error_of(info) == ("InvalidParameterValue", 400)


@pytest.mark.parametrize("attribute", ["Policy", "RedriveAllowPolicy", "KmsMasterKeyId"])
def test_an_empty_policy_or_key_removes_the_attribute(sqs: Any, attribute: str) -> None:
    """SetQueueAttributes with "" removes a Policy (and RedriveAllowPolicy, KmsMasterKeyId): the
    queue then has none, so GetQueueAttributes does not list it (it answered "")."""
    values = {
        "Policy": json.dumps({"Version": "2012-10-17", "Statement": []}),
        "RedriveAllowPolicy": json.dumps({"redrivePermission": "denyAll"}),
        "KmsMasterKeyId": "alias/aws/sqs",
    }
    url = sqs.create_queue(QueueName=new_name(), Attributes={attribute: values[attribute]})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])
    assert got["Attributes"] == {attribute: values[attribute]}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={attribute: ""})
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])
    assert attribute not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    # the queue as it is now: created again with "" it is the same queue
    assert sqs.create_queue(QueueName=url.rsplit("/", 1)[-1], Attributes={attribute: ""})["QueueUrl"] == url
