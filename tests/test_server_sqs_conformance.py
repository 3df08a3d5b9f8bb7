"""Conformance of the Amazon SQS JSON protocol with what AWS documents and SDKs expect, through
boto3 against the real server: each test pins one place where the endpoint used to diverge."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from test_server_harness import ServerProcess, module_server, sqs_client

from journalq.queue import Broker
from journalq.server.sqs import SqsError, SqsProtocol


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
        QueueUrl=url,
        Entries=[{"Id": "a", "MessageBody": "later too", "MessageGroupId": "h", "DelaySeconds": 0}],
    )
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    delayed = "ApproximateNumberOfMessagesDelayed"
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[delayed])
    assert counts["Attributes"][delayed] == "2"


@pytest.mark.parametrize("after", [5, None, ["x"], {"a": 1}])
def test_a_list_queues_token_of_the_wrong_shape_is_invalid(sqs: Any, after: Any) -> None:
    """A NextToken that decodes but holds no queue name is the client's error (it was a 500)."""
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
    name = new_name()
    url = sqs.create_queue(QueueName=name, Attributes={attribute: values[attribute]})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])
    assert got["Attributes"] == {attribute: values[attribute]}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={attribute: ""})
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])
    every = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attribute not in every
    # the queue as it is now: created again with "" it is the same queue
    assert sqs.create_queue(QueueName=name, Attributes={attribute: ""})["QueueUrl"] == url


def test_concurrent_creates_of_one_name_with_other_attributes_let_one_win(tmp_path: Path) -> None:
    """Two CreateQueue of one name at once, with different attributes: one makes the queue, the
    other gets QueueNameExists, as if they had come one after the other. (Each used to find no
    queue and succeed, the second changing the attributes the first had just set.)"""
    sqs = SqsProtocol(Broker(tmp_path / "data"))
    for i in range(10):
        name = f"race-{i}"
        barrier = threading.Barrier(2)
        outcomes: dict[str, str] = {}

        def create(visibility: str, name: str = name, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            attributes = {"VisibilityTimeout": visibility, "MaximumMessageSize": visibility + "000"}
            request = {"QueueName": name, "Attributes": attributes}
            try:
                sqs.handle("CreateQueue", request, "http://127.0.0.1:8080")
                outcomes[visibility] = "created"
            except SqsError as exc:
                outcomes[visibility] = exc.code

        threads = [threading.Thread(target=create, args=(v,)) for v in ("5", "60")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes.values()) == ["QueueNameExists", "created"], (name, outcomes)
        winner = next(v for v, outcome in outcomes.items() if outcome == "created")
        url = sqs.queue_url("http://127.0.0.1:8080", name)
        request = {"QueueUrl": url, "AttributeNames": ["All"]}
        got = sqs.handle("GetQueueAttributes", request, "http://127.0.0.1:8080")
        assert got["Attributes"]["VisibilityTimeout"] == winner
        assert got["Attributes"]["MaximumMessageSize"] == winner + "000"


def test_a_second_purge_within_sixty_seconds_is_purge_queue_in_progress(sqs: Any) -> None:
    """SQS takes one PurgeQueue a queue every 60 seconds; the next one within them is
    PurgeQueueInProgress (403), which SDK users catch (it always succeeded). Other queues are
    not held up, and the messages sent after the purge stay."""
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    other = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="purged")
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress) as info:
        sqs.purge_queue(QueueUrl=url)
    assert error_of(info) == ("AWS.SimpleQueueService.PurgeQueueInProgress", 403)
    assert url.rsplit("/", 1)[-1] in info.value.response["Error"]["Message"]
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url)["Messages"]] == ["kept"]
    sqs.purge_queue(QueueUrl=other)


def test_a_visibility_batch_entry_without_visibility_timeout_is_missing_parameter(sqs: Any) -> None:
    """ChangeMessageVisibilityBatch: an entry without VisibilityTimeout fails alone with
    MissingParameter, as SQS answers it (the SDK model does not mark it required); it used to
    count as 0 and give the message back at once. The other entries are done."""
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": i, "MessageBody": i} for i in ("a", "b")])
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(received) == 2
    answer = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "kept", "ReceiptHandle": received[0]["ReceiptHandle"]},
            {"Id": "shown", "ReceiptHandle": received[1]["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert [entry["Id"] for entry in answer["Successful"]] == ["shown"]
    (failed,) = answer["Failed"]
    assert failed["Id"] == "kept" and failed["Code"] == "MissingParameter" and failed["SenderFault"]
    assert "ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout" in failed["Message"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in again] == [received[1]["Body"]]


def test_every_answer_carries_a_request_id(sqs: Any) -> None:
    """SQS sends ``x-amzn-RequestId`` with every answer, success or error; boto3 gives it as
    ``ResponseMetadata["RequestId"]`` (code that logs it used to get a KeyError)."""
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    ids = [
        sqs.send_message(QueueUrl=url, MessageBody="one")["ResponseMetadata"]["RequestId"],  # the direct path
        sqs.send_message(QueueUrl=url, MessageBody="two")["ResponseMetadata"]["RequestId"],
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["ResponseMetadata"]["RequestId"],
    ]
    with pytest.raises(ClientError) as info:
        sqs.get_queue_url(QueueName=new_name("missing"))
    ids.append(info.value.response["ResponseMetadata"]["RequestId"])
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        assert str(uuid.UUID(request_id)) == request_id  # a UUID's shape, as SQS's


def test_a_queue_whose_settings_file_is_damaged_is_an_internal_failure_naming_no_path(
    server: ServerProcess, sqs: Any
) -> None:
    """Stored data that cannot be read is the server's problem (500, InternalFailure), not the
    request's: it was InvalidParameterValue (400), with the data directory's path in it."""
    name = new_name("damaged")
    with Broker(server.data) as broker:  # made beside the server, which has not opened it yet
        broker.queue(name).send(b"kept")
    (server.data / name / "queue.json").write_text('{"visibility_timeout": -5}')
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"].rsplit("/", 1)[0] + "/" + name
    for call in (
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x"),
        lambda: sqs.receive_message(QueueUrl=url),
        lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
    ):
        with pytest.raises(ClientError) as info:
            call()
        assert error_of(info)[1] == 500
        message = info.value.response["Error"]["Message"]
        assert "visibility_timeout" in message and str(server.data) not in message


def _aws_md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes as AWS's developer guide gives it, computed here on its own."""
    def field(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        digest.update(field(name.encode()) + field(value["DataType"].encode()))
        if "BinaryValue" in value:
            digest.update(b"\x02" + field(value["BinaryValue"]))
        else:
            digest.update(b"\x01" + field(value["StringValue"].encode()))
    return digest.hexdigest()


def test_a_custom_type_label_takes_what_a_message_body_takes(sqs: Any) -> None:
    """A message attribute's custom type label has the message body's restrictions (AWS's
    "Message attribute data types"): "Binary.image/png" or "String.JSON; charset=utf-8" are
    taken, and delivered as given, with the MD5 the SDKs compute (they were refused: only
    letters, digits, '_', '-' and '.'). A character a body may not have is still refused."""
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    attributes = {
        "picture": {"DataType": "Binary.image/png", "BinaryValue": b"\x89PNG"},
        "doc": {"DataType": "String.JSON; charset=utf-8", "StringValue": "{}"},
        "count": {"DataType": "Number.int:32 é", "StringValue": "7"},
        "longest": {"DataType": "String." + "x" * 249, "StringValue": "v"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="b", MessageAttributes=attributes)
    assert sent["MD5OfMessageAttributes"] == _aws_md5_of_attributes(attributes)
    (message,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    for data_type in ("String.a\x01b", "String." + "x" * 250, "Strings", "string.x", "String."):
        with pytest.raises(ClientError) as info:
            sqs.send_message(
                QueueUrl=url, MessageBody="b", MessageAttributes={"a": {"DataType": data_type, "StringValue": "v"}}
            )
        assert error_of(info) == ("InvalidParameterValue", 400), data_type


def test_fifo_throughput_per_message_group_needs_deduplication_per_message_group(sqs: Any) -> None:
    """FifoThroughputLimit perMessageGroupId is allowed only with DeduplicationScope messageGroup
    (SQS's CreateQueue and SetQueueAttributes): CreateQueue and SetQueueAttributes that would
    pair it with the queue scope are InvalidAttributeValue and change nothing (they were taken)."""
    name = new_name() + ".fifo"
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"})
    assert error_of(info) == ("InvalidAttributeValue", 400)
    high = {"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **high})["QueueUrl"]
    for attributes in ({"DeduplicationScope": "queue"}, {"DeduplicationScope": "queue", "VisibilityTimeout": "5"}):
        with pytest.raises(ClientError) as info:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
        assert error_of(info) == ("InvalidAttributeValue", 400)
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (got["DeduplicationScope"], got["FifoThroughputLimit"], got["VisibilityTimeout"]) == (
        "messageGroup", "perMessageGroupId", "30"
    )
    # both back to the queue's scope at once, or the limit first: taken
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoThroughputLimit": "perQueue"})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "queue"})
    sqs.set_queue_attributes(QueueUrl=url, Attributes=high)
