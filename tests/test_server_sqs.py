"""The Amazon SQS protocols of the real server, through boto3 unchanged (``endpoint_url``) and
the AWS CLI when it is installed. The server requires SigV4 signatures here (``--aws-key``), so
every call below also proves that boto3's signatures are accepted. Each test that uses ``sqs``
runs twice: with boto3's client of the JSON protocol, and with one of the older Query protocol
(``test_server_harness.QUERY_MODEL``), but for those marked ``JSON_ONLY``: they use what that
protocol's model lacks (``MessageSystemAttributeNames``), or an empty list, which XML leaves out.

Digests are checked against this module's own hashlib computation, not the server's code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from test_server_harness import ServerProcess, await_waiting_receives, module_server, sqs_client

KEY, SECRET = "AKIDSQSTEST", "sqs-test-secret"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "--aws-key", f"{KEY}:{SECRET}")


@pytest.fixture(scope="module", params=["json", "query"])
def sqs(server: ServerProcess, request: pytest.FixtureRequest) -> Any:
    return sqs_client(server.url, KEY, SECRET, query=request.param == "query")


JSON_ONLY = pytest.mark.parametrize("sqs", ["json"], indirect=True)


def new_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def queue_url(sqs: Any) -> str:
    return sqs.create_queue(QueueName=new_name())["QueueUrl"]


def error_code(info: pytest.ExceptionInfo[ClientError]) -> str:
    return info.value.response["Error"]["Code"]


# -- the digests, computed here --------------------------------------------------------------


def md5_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8")).hexdigest()


def md5_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's MD5OfMessageAttributes: per attribute, sorted by name, the length-prefixed name,
    data type, a transport byte (1 string/number, 2 binary) and the length-prefixed value."""

    def field(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    out = b""
    for name in sorted(attributes):
        attribute = attributes[name]
        out += field(name.encode()) + field(attribute["DataType"].encode())
        if "BinaryValue" in attribute:
            value = attribute["BinaryValue"]
            out += b"\x02" + field(value if isinstance(value, bytes) else value.encode())
        else:
            out += b"\x01" + field(attribute["StringValue"].encode())
    return hashlib.md5(out).hexdigest()


ATTRIBUTES = {
    "b-string": {"DataType": "String", "StringValue": "h\u00e9llo \u2603"},
    "a.number": {"DataType": "Number", "StringValue": "-12.5e3"},
    "Z_binary": {"DataType": "Binary", "BinaryValue": bytes(range(200, 256)) + b"\x00\x01"},
    "custom": {"DataType": "String.custom-type", "StringValue": "x"},
}


def test_md5_helper_matches_a_published_digest() -> None:
    # AWS's example (moto's tests use it too): body "derp".
    assert md5_body("derp") == "58fd9edd83341c29f1aebba81c31e257"


# -- queues ---------------------------------------------------------------------------------------


def test_create_queue_with_attributes_and_get_them(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
    name = new_name("full")
    url = sqs.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": "45",
            "DelaySeconds": "2",
            "MessageRetentionPeriod": "3600",
            "ReceiveMessageWaitTimeSeconds": "4",
            "RedrivePolicy": policy,
        },
    )["QueueUrl"]
    assert url.endswith(f"/{name}")
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["DelaySeconds"] == "2"
    assert attributes["MessageRetentionPeriod"] == "3600"
    assert attributes["ReceiveMessageWaitTimeSeconds"] == "4"
    assert json.loads(attributes["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}
    assert attributes["QueueArn"].endswith(f":{name}")
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert int(attributes["CreatedTimestamp"]) <= time.time() + 1
    # Only what is asked for.
    some = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "DelaySeconds"])
    assert some["Attributes"] == {"VisibilityTimeout": "45", "DelaySeconds": "2"}
    # Creating it again with the same attributes is fine; with others it is QueueNameExists.
    assert sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})


def test_create_fifo_queue(sqs: Any) -> None:
    name = new_name("fifo") + ".fifo"
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "true"
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=new_name("nofifo"), Attributes={"FifoQueue": "true"})  # no .fifo suffix
    assert error_code(info) == "InvalidParameterValue"


def test_get_queue_url_and_list_queues(sqs: Any) -> None:
    prefix = f"listed-{uuid.uuid4().hex[:6]}"
    urls = [sqs.create_queue(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(3)]
    assert [sqs.get_queue_url(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(3)] == urls
    assert sorted(sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]) == sorted(urls)
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert len(first["QueueUrls"]) == 2 and "NextToken" in first
    rest = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=first["NextToken"])
    assert sorted(first["QueueUrls"] + rest["QueueUrls"]) == sorted(urls)
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="no-such-prefix-at-all")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="never-made")


def test_set_queue_attributes(sqs: Any, queue_url: str) -> None:
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"VisibilityTimeout": "7", "DelaySeconds": "0",
                                                             "ReceiveMessageWaitTimeSeconds": "1",
                                                             "MessageRetentionPeriod": "120"})
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    assert (attributes["VisibilityTimeout"], attributes["ReceiveMessageWaitTimeSeconds"]) == ("7", "1")
    assert attributes["MessageRetentionPeriod"] == "120"
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"VisibilityTimeout": "99999999"})
    assert error_code(info) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"NoSuchAttribute": "1"})
    assert error_code(info) == "InvalidAttributeName"


def test_purge_and_delete_queue(sqs: Any, queue_url: str) -> None:
    for i in range(5):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"p{i}")
    sqs.purge_queue(QueueUrl=queue_url)
    assert "Messages" not in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    count = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert count["Attributes"]["ApproximateNumberOfMessages"] == "0"
    sqs.send_message(QueueUrl=queue_url, MessageBody="after the purge")
    assert sqs.receive_message(QueueUrl=queue_url)["Messages"][0]["Body"] == "after the purge"
    sqs.delete_queue(QueueUrl=queue_url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=queue_url, MessageBody="x")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.delete_queue(QueueUrl=queue_url)


# -- sending and receiving ------------------------------------------------------------------------


def test_send_message_digests_and_attributes(sqs: Any, queue_url: str) -> None:
    body = "b\u00f6dy with \U0001f600 and <xml/>"
    sent = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageAttributes=ATTRIBUTES,
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}},
    )
    assert sent["MD5OfMessageBody"] == md5_body(body)
    assert sent["MD5OfMessageAttributes"] == md5_attributes(ATTRIBUTES)
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}}
    assert sent["MD5OfMessageSystemAttributes"] == md5_attributes(trace)

    got = sqs.receive_message(QueueUrl=queue_url, MessageAttributeNames=["All"], AttributeNames=["All"])
    (message,) = got["Messages"]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == body
    assert message["MD5OfBody"] == md5_body(body)
    assert message["MessageAttributes"] == ATTRIBUTES
    assert message["MD5OfMessageAttributes"] == md5_attributes(message["MessageAttributes"])
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1"
    assert abs(int(system["SentTimestamp"]) / 1000 - time.time()) < 30
    assert system["AWSTraceHeader"] == "Root=1-abc"
    assert "AWS.TraceHeader" not in message["MessageAttributes"]


def test_message_attribute_names_select(sqs: Any, queue_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody="sel", MessageAttributes=ATTRIBUTES)
    receipts = []

    def receive(names: list[str] | None) -> dict[str, Any]:
        kwargs = {"MessageAttributeNames": names} if names is not None else {}
        (m,) = sqs.receive_message(QueueUrl=queue_url, VisibilityTimeout=0, **kwargs)["Messages"]
        receipts.append(m["ReceiptHandle"])
        return m

    none = receive(None)
    assert "MessageAttributes" not in none and "MD5OfMessageAttributes" not in none
    one = receive(["b-string"])
    assert set(one["MessageAttributes"]) == {"b-string"}
    assert one["MD5OfMessageAttributes"] == md5_attributes(one["MessageAttributes"])
    prefixed = receive(["a.*", "custom"])
    assert set(prefixed["MessageAttributes"]) == {"a.number", "custom"}
    assert prefixed["MD5OfMessageAttributes"] == md5_attributes(prefixed["MessageAttributes"])
    every = receive([".*"])
    assert every["MessageAttributes"] == ATTRIBUTES


@JSON_ONLY
def test_receive_counts_and_timestamps(sqs: Any, queue_url: str) -> None:
    before = int(time.time() * 1000)
    sqs.send_message(QueueUrl=queue_url, MessageBody="counted")
    for expected in ("1", "2", "3"):
        (m,) = sqs.receive_message(
            QueueUrl=queue_url, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount", "SentTimestamp"]
        )["Messages"]
        assert m["Attributes"]["ApproximateReceiveCount"] == expected
        assert before - 1000 <= int(m["Attributes"]["SentTimestamp"]) <= int(time.time() * 1000) + 1000
    (m,) = sqs.receive_message(QueueUrl=queue_url, MessageSystemAttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert m["Attributes"] == {"ApproximateReceiveCount": "4"}


def test_send_message_batch(sqs: Any, queue_url: str) -> None:
    entries = [
        {"Id": "plain", "MessageBody": "one"},
        {"Id": "attrs", "MessageBody": "two", "MessageAttributes": ATTRIBUTES},
        {"Id": "delayed", "MessageBody": "three", "DelaySeconds": 1},
        {"Id": "bad", "MessageBody": "four", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "NaN"}}},
    ]
    answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
    ok = {e["Id"]: e for e in answer["Successful"]}
    assert set(ok) == {"plain", "attrs", "delayed"}
    assert ok["plain"]["MD5OfMessageBody"] == md5_body("one")
    assert ok["attrs"]["MD5OfMessageAttributes"] == md5_attributes(ATTRIBUTES)
    assert "MD5OfMessageAttributes" not in ok["plain"]
    (failed,) = answer["Failed"]
    assert failed["Id"] == "bad" and failed["SenderFault"] is True and failed["Code"] == "InvalidParameterValue"
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])["Messages"]
    assert sorted(m["Body"] for m in got) == ["one", "two"]  # "three" is still delayed
    for m in got:
        assert m["MessageId"] == ok["plain" if m["Body"] == "one" else "attrs"]["MessageId"]
    time.sleep(1.1)
    (late,) = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=2)["Messages"]
    assert late["Body"] == "three" and late["MessageId"] == ok["delayed"]["MessageId"]
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.send_message_batch(QueueUrl=queue_url, Entries=[{"Id": "x", "MessageBody": "a"}] * 2)
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=queue_url, Entries=[{"Id": f"e{i}", "MessageBody": "a"} for i in range(11)])
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.send_message_batch(QueueUrl=queue_url, Entries=[])


def test_messages_up_to_one_mebibyte(sqs: Any) -> None:
    """SQS's limit is 1 MiB (since August 2025): a message over the old 256 KiB is taken, a queue's
    MaximumMessageSize goes up to 1 MiB and is 1 MiB by default, and a larger message is refused."""
    url = sqs.create_queue(QueueName=new_name("big"), Attributes={"MaximumMessageSize": "1048576"})["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"] == {
        "MaximumMessageSize": "1048576"
    }
    body = "b" * (600 * 1024)
    sent = sqs.send_message(QueueUrl=url, MessageBody=body)
    (got,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert got["MessageId"] == sent["MessageId"] and got["Body"] == body
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="b" * (1024 * 1024 + 1))
    assert error_code(info) == "InvalidParameterValue"


def test_delay_seconds_of_message_and_queue(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("delay"), Attributes={"DelaySeconds": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="queue delay")
    sqs.send_message(QueueUrl=url, MessageBody="no delay", DelaySeconds=0)
    (first,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert first["Body"] == "no delay"
    delayed = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert delayed["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    started = time.monotonic()
    (second,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert second["Body"] == "queue delay" and time.monotonic() - started < 2.5


def test_receive_max_number_and_visibility_timeout(sqs: Any, queue_url: str) -> None:
    for i in range(15):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"m{i:02d}")
    first = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=1)["Messages"]
    assert len(first) == 10
    second = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=30)["Messages"]
    assert len(second) == 5
    assert not {m["MessageId"] for m in first} & {m["MessageId"] for m in second}
    assert "Messages" not in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    time.sleep(1.1)
    again = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    assert {m["MessageId"] for m in again} == {m["MessageId"] for m in first}
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}
    with pytest.raises(ClientError) as info:
        sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=11)
    assert error_code(info) == "InvalidParameterValue"


def test_long_polling_returns_as_soon_as_a_message_arrives(sqs: Any, server: ServerProcess, queue_url: str) -> None:
    other = sqs_client(server.url, KEY, SECRET)

    def send_later() -> None:
        time.sleep(0.6)
        other.send_message(QueueUrl=queue_url, MessageBody="worth the wait")

    threading.Thread(target=send_later).start()
    started = time.monotonic()
    got = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=10)
    took = time.monotonic() - started
    assert got["Messages"][0]["Body"] == "worth the wait"
    assert 0.5 < took < 3, took
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1)
    assert 0.95 <= time.monotonic() - started < 3
    # The queue's ReceiveMessageWaitTimeSeconds is the default wait.
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"ReceiveMessageWaitTimeSeconds": "1"})
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue_url)
    assert time.monotonic() - started >= 0.95


def test_delete_message_and_batch(sqs: Any, queue_url: str) -> None:
    for i in range(4):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"d{i}")
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=1)["Messages"]
    assert len(got) == 4
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=got[0]["ReceiptHandle"])
    answer = sqs.delete_message_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[1:3])]
        + [{"Id": "bogus", "ReceiptHandle": "not-a-receipt"}],
    )
    assert sorted(e["Id"] for e in answer["Successful"]) == ["e0", "e1"]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [("bogus", "ReceiptHandleIsInvalid")]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle="not-a-receipt")
    time.sleep(1.1)
    (left,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert left["Body"] == got[3]["Body"]
    # A receipt of a delivery that is over: deleting succeeds without deleting (as on SQS).
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=got[3]["ReceiptHandle"])
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=left["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessagesNotVisible"
    ] == "0"


def test_change_message_visibility_and_batch(sqs: Any, queue_url: str) -> None:
    for i in range(3):
        sqs.send_message(QueueUrl=queue_url, MessageBody=f"v{i}")
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    assert len(got) == 3
    sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=0)
    (back,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    assert back["MessageId"] == got[0]["MessageId"]
    answer = sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "a", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "b", "ReceiptHandle": got[2]["ReceiptHandle"], "VisibilityTimeout": 1},
            {"Id": "stale", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert sorted(e["Id"] for e in answer["Successful"]) == ["a", "b"]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [("stale", "InvalidParameterValue")]
    (now,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert now["MessageId"] == got[1]["MessageId"]
    time.sleep(1.1)
    (later,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert later["MessageId"] == got[2]["MessageId"]
    with pytest.raises(ClientError) as info:  # the receipt of a delivery that is over
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=5)
    assert error_code(info) == "InvalidParameterValue"
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle="garbage", VisibilityTimeout=5)


def test_a_change_of_visibility_past_12_hours_after_the_receive_is_refused(sqs: Any, queue_url: str) -> None:
    """As on SQS: a message's visibility may not end more than 12 hours after its receive."""
    sqs.send_message_batch(QueueUrl=queue_url, Entries=[{"Id": str(i), "MessageBody": f"v{i}"} for i in range(2)])
    got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    assert len(got) == 2
    time.sleep(1.1)
    receipt = got[0]["ReceiptHandle"]
    with pytest.raises(ClientError) as info:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt, VisibilityTimeout=43199)
    assert error_code(info) == "InvalidParameterValue"
    assert info.value.response["Error"]["Message"] == (
        "Value 43199 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is "
        "beyond the limit [43200 seconds]"
    )
    sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=receipt, VisibilityTimeout=43000)
    answer = sqs.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "past", "ReceiptHandle": receipt, "VisibilityTimeout": 43200},
            {"Id": "back", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["back"]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [("past", "InvalidParameterValue")]
    (again,) = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert again["MessageId"] == got[1]["MessageId"]  # the other still hidden, for its 43,000 s


def test_fifo_groups_and_deduplication(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("order") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a", MessageDeduplicationId="d1")
    again = sqs.send_message(QueueUrl=url, MessageBody="a1 again", MessageGroupId="a", MessageDeduplicationId="d1")
    assert again["MessageId"] == first["MessageId"]  # a duplicate within the window is dropped
    assert first["SequenceNumber"].isdigit() and len(first["SequenceNumber"]) == 20
    sqs.send_message(QueueUrl=url, MessageBody="a2", MessageGroupId="a", MessageDeduplicationId="d2")
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "b1", "MessageBody": "b1", "MessageGroupId": "b", "MessageDeduplicationId": "d3"},
    ])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    # A group's messages together, in order (as SQS's FIFO receives give them); none of a group
    # while some of it is in flight.
    assert [m["Body"] for m in got] == ["a1", "a2", "b1"]
    for m in got:
        assert m["Attributes"]["MessageGroupId"] in ("a", "b")
        assert m["Attributes"]["SequenceNumber"].isdigit()
        assert "MessageDeduplicationId" in m["Attributes"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)  # a1 is in flight
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    (a2,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    assert a2["Body"] == "a2" and a2["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="no group", MessageDeduplicationId="x")
    assert error_code(info) == "MissingParameter"
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="no dedup", MessageGroupId="a")
    assert error_code(info) == "InvalidParameterValue"


def test_a_fifo_receipt_given_back_cannot_hide_its_message_once_another_receive_took_the_group(sqs: Any) -> None:
    """Two holders of one group would work on its messages at once, out of order: a receipt
    whose message came back may not hide it again once another receive holds the group."""
    url = sqs.create_queue(
        QueueName=new_name("held") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"g{i}", "MessageGroupId": "g"} for i in range(3)]
    )
    first, second = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=60)["Messages"]
    entries = [{"Id": m["Body"], "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for m in (first, second)]
    answer = sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries)
    assert len(answer["Successful"]) == 2  # both given back
    (again,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)["Messages"]
    assert again["Body"] == "g0"
    with pytest.raises(ClientError) as info:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=30)
    assert error_code(info) == "InvalidParameterValue"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in got] == ["g1", "g2"]


def test_a_retried_fifo_receive_gets_the_same_messages(sqs: Any) -> None:
    """ReceiveRequestAttemptId: a receive whose answer was lost (a network error) is retried with
    the same id and gets the same messages and receipts, not the next ones (nor nothing, while
    the group waits for messages that no one holds)."""
    url = sqs.create_queue(
        QueueName=new_name("retry") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    for body, group in (("m1", "a"), ("m2", "b"), ("m3", "a")):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")["Messages"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1")["Messages"]
    assert sorted(m["Body"] for m in first) == ["m1", "m2"]
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in again] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first
    ]
    # Another attempt id is another receive: the group is held by the first one's messages.
    assert "Messages" not in sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="try-2")
    for m in again:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    # Its messages deleted, the same id receives anew.
    (m3,) = sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="try-1")["Messages"]
    assert m3["Body"] == "m3"
    with pytest.raises(ClientError) as info:
        sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="x" * 129)
    assert error_code(info) == "InvalidParameterValue"


@JSON_ONLY
def test_high_throughput_fifo_deduplicates_per_message_group(sqs: Any) -> None:
    """A high-throughput FIFO queue (DeduplicationScope messageGroup, FifoThroughputLimit
    perMessageGroupId, as CloudFormation, CDK and Terraform create it): a deduplication id is
    per group, so the same id in two groups sends two messages."""
    attributes = {"FifoQueue": "true", "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    url = sqs.create_queue(QueueName=new_name("high") + ".fifo", Attributes=attributes)["QueueUrl"]
    one = sqs.send_message(QueueUrl=url, MessageBody="1", MessageGroupId="a", MessageDeduplicationId="order-7")
    two = sqs.send_message(QueueUrl=url, MessageBody="2", MessageGroupId="b", MessageDeduplicationId="order-7")
    again = sqs.send_message(QueueUrl=url, MessageBody="1", MessageGroupId="a", MessageDeduplicationId="order-7")
    assert one["MessageId"] != two["MessageId"] and again["MessageId"] == one["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])["Messages"]
    assert sorted(m["Body"] for m in got) == ["1", "2"]
    assert {m["Attributes"]["MessageDeduplicationId"] for m in got} == {"order-7"}


def test_content_based_deduplication(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName=new_name("cbd") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    one = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="h")
    assert one["MessageId"] == two["MessageId"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["other", "same"]


@JSON_ONLY
def test_a_standard_queue_takes_message_group_ids_but_not_deduplication_ids(sqs: Any, queue_url: str) -> None:
    """Fair queues: a standard queue takes MessageGroupId (a tenant; its messages still go out in
    parallel) and gives it back as a system attribute; MessageDeduplicationId is FIFO's alone."""
    for body in ("t1", "t2"):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body, MessageGroupId="tenant-a")
    got = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"]
    )
    assert sorted(m["Body"] for m in got["Messages"]) == ["t1", "t2"]
    assert {m["Attributes"]["MessageGroupId"] for m in got["Messages"]} == {"tenant-a"}
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=queue_url, MessageBody="x", MessageDeduplicationId="d")
    assert error_code(info) == "InvalidParameterValue"


# -- dead letters -----------------------------------------------------------------------------


@JSON_ONLY
def test_redrive_policy_dead_letter_sources_and_move_task(sqs: Any, server: ServerProcess) -> None:
    dlq = sqs.create_queue(QueueName=new_name("dead"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    source_name = new_name("source")
    source = sqs.create_queue(
        QueueName=source_name,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})},
    )["QueueUrl"]
    sent = sqs.send_message(QueueUrl=source, MessageBody="poison")
    (m,) = sqs.receive_message(QueueUrl=source, VisibilityTimeout=0)["Messages"]
    assert m["MessageId"] == sent["MessageId"]
    # Received once already: the next receive moves it to the dead-letter queue.
    assert "Messages" not in sqs.receive_message(QueueUrl=source)
    (dead,) = sqs.receive_message(QueueUrl=dlq, AttributeNames=["All"], VisibilityTimeout=0)["Messages"]
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"].endswith(f":{source_name}")
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'journalq_queue_dead{{queue="{source_name}"}} 1.0' in metrics
    assert sqs.list_dead_letter_source_queues(QueueUrl=source)["queueUrls"] == []
    # Redrive: back to the queue it came from.
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert handle
    tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert tasks[0]["Status"] == "COMPLETED" and tasks[0]["ApproximateNumberOfMessagesMoved"] == 1
    (back,) = sqs.receive_message(QueueUrl=source)["Messages"]
    assert back["Body"] == "poison"
    assert "Messages" not in sqs.receive_message(QueueUrl=dlq)
    with pytest.raises(sqs.exceptions.ResourceNotFoundException):
        sqs.start_message_move_task(SourceArn="arn:aws:sqs:us-east-1:000000000000:no-such-queue")
    # A queue that is no dead-letter queue cannot be a move task's source.
    source_arn = sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    with pytest.raises(ClientError) as info:
        sqs.start_message_move_task(SourceArn=source_arn)
    assert error_code(info) == "InvalidParameterValue"


def test_redrive_policy_with_a_missing_target_is_refused(sqs: Any) -> None:
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:nowhere", "maxReceiveCount": 2})
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=new_name("bad"), Attributes={"RedrivePolicy": policy})
    assert error_code(info) == "InvalidParameterValue"


def test_redrive_allow_policy_is_checked_and_enforced(sqs: Any) -> None:
    """A dead-letter queue's RedriveAllowPolicy says which queues may name it in their
    RedrivePolicy: a malformed one is refused, and a source it does not allow is refused."""
    def arn(url: str) -> str:
        return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    def redrive(target: str) -> dict[str, str]:
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": 3})}

    dlq = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    allowed, other = new_name("allowed"), new_name("other")
    allowed_arn = arn(dlq).rsplit(":", 1)[0] + ":" + allowed  # named before the queue exists, as IaC tools do
    for bad in (
        "not json",
        json.dumps({"redrivePermission": "maybe"}),
        json.dumps({"redrivePermission": "byQueue"}),
        json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": ["not-an-arn"]}),
        json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [allowed_arn] * 11}),
        json.dumps({"redrivePermission": "allowAll", "sourceQueueArns": [allowed_arn]}),
    ):
        with pytest.raises(ClientError) as info:
            sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": bad})
        assert error_code(info) == "InvalidParameterValue", bad
    by_queue = json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [allowed_arn]})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": by_queue})
    assert sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])["Attributes"] == {
        "RedriveAllowPolicy": by_queue
    }
    sqs.create_queue(QueueName=allowed, Attributes=redrive(arn(dlq)))
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=other, Attributes=redrive(arn(dlq)))
    assert error_code(info) == "InvalidParameterValue" and "RedriveAllowPolicy" in str(info.value)
    other_url = sqs.create_queue(QueueName=other)["QueueUrl"]
    deny = json.dumps({"redrivePermission": "denyAll"})
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": deny})
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=other_url, Attributes=redrive(arn(dlq)))
    assert error_code(info) == "InvalidParameterValue"
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": ""})  # removed: all allowed
    sqs.set_queue_attributes(QueueUrl=other_url, Attributes=redrive(arn(dlq)))
    # A malformed RedrivePolicy names what it lacks, as SQS does.
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=other_url, Attributes={"RedrivePolicy": json.dumps({"maxReceiveCount": 2})})
    assert error_code(info) == "InvalidParameterValue" and "mandatory attribute: deadLetterTargetArn" in str(info.value)


# -- errors ------------------------------------------------------------------------------------


def test_errors_carry_sqs_codes(sqs: Any, server: ServerProcess) -> None:
    missing = f"{server.url}/000000000000/missing-queue"
    for call in (
        lambda: sqs.send_message(QueueUrl=missing, MessageBody="x"),
        lambda: sqs.receive_message(QueueUrl=missing),
        lambda: sqs.purge_queue(QueueUrl=missing),
        lambda: sqs.delete_message(QueueUrl=missing, ReceiptHandle="r"),
    ):
        with pytest.raises(sqs.exceptions.QueueDoesNotExist) as info:
            call()
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName="bad/name")
    assert error_code(info) == "InvalidParameterValue"
    url = sqs.create_queue(QueueName=new_name())["QueueUrl"]
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1))
    assert error_code(info) == "InvalidParameterValue"
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=url, MessageBody="bad \u0000 character")
    assert error_code(info) == "InvalidMessageContents"


def test_the_queue_url_path_works_as_endpoint(sqs: Any, server: ServerProcess) -> None:
    """Some SDKs post to the queue's URL instead of ``/``: the same actions answer there, and the
    signature covers that path."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    name = new_name("path")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    payload = json.dumps({"QueueUrl": url, "MessageBody": "posted to the queue's URL"}).encode()
    headers = {"X-Amz-Target": "AmazonSQS.SendMessage", "Content-Type": "application/x-amz-json-1.0"}
    request = AWSRequest(method="POST", url=url, data=payload, headers=headers)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "us-east-1").add_auth(request)
    answer = httpx.post(url, content=payload, headers=dict(request.headers.items()))
    assert answer.status_code == 200, answer.text
    assert answer.json()["MD5OfMessageBody"] == md5_body("posted to the queue's URL")
    (m,) = sqs.receive_message(QueueUrl=url)["Messages"]
    assert m["Body"] == "posted to the queue's URL"
    unsigned = httpx.post(url, content=payload, headers={"X-Amz-Target": "AmazonSQS.SendMessage"})
    assert unsigned.status_code == 403 and unsigned.json()["__type"].endswith("MissingAuthenticationToken")


def test_a_long_poll_whose_client_went_away_takes_no_message(sqs: Any, server: ServerProcess, queue_url: str) -> None:
    """A ReceiveMessage long poll whose client closed its connection ends (within a poll slice)
    instead of taking the next message for no one, which would hide it for the visibility
    timeout: another consumer receives that message at once."""
    import socket

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    payload = json.dumps({"QueueUrl": queue_url, "WaitTimeSeconds": 20, "MaxNumberOfMessages": 1}).encode()
    headers = {"X-Amz-Target": "AmazonSQS.ReceiveMessage", "Content-Type": "application/x-amz-json-1.0"}
    request = AWSRequest(method="POST", url=server.url + "/", data=payload, headers=headers)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "us-east-1").add_auth(request)
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    raw = f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: {len(payload)}\r\n{head}\r\n"
    for pause in (2.5, 0.2):  # past the slice in which the poll notices; within it
        with socket.create_connection(("127.0.0.1", server.port)) as departing:
            departing.sendall(raw.encode() + payload)
            await_waiting_receives(server.url, queue_url.rsplit("/", 1)[1], 1)
        time.sleep(pause)
        # Within the slice, the departed poll takes the message: and gives it back at once.
        sqs.send_message(QueueUrl=queue_url, MessageBody="for whoever is there")
        got = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5)["Messages"]
        assert [m["Body"] for m in got] == ["for whoever is there"]
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=got[0]["ReceiptHandle"])


# -- the AWS CLI --------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("aws") is None, reason="the AWS CLI (`aws`) is not on PATH")
def test_aws_cli_round_trip(server: ServerProcess, tmp_path) -> None:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_PAGER": "",
    }
    env.pop("AWS_PROFILE", None)
    env.pop("AWS_SESSION_TOKEN", None)

    def aws(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            ["aws", "sqs", *args, "--endpoint-url", server.url, "--output", "json"],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout) if done.stdout.strip() else {}

    name = new_name("cli")
    url = aws("create-queue", "--queue-name", name)["QueueUrl"]
    assert url.endswith(f"/{name}")
    sent = aws("send-message", "--queue-url", url, "--message-body", "from the CLI",
               "--message-attributes", '{"k":{"DataType":"String","StringValue":"v"}}')
    assert sent["MD5OfMessageBody"] == md5_body("from the CLI")
    assert sent["MD5OfMessageAttributes"] == md5_attributes({"k": {"DataType": "String", "StringValue": "v"}})
    got = aws("receive-message", "--queue-url", url, "--message-attribute-names", "All",
              "--attribute-names", "All", "--wait-time-seconds", "1")
    (message,) = got["Messages"]
    assert message["Body"] == "from the CLI" and message["MessageId"] == sent["MessageId"]
    assert message["MD5OfBody"] == md5_body("from the CLI")
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    aws("delete-message", "--queue-url", url, "--receipt-handle", message["ReceiptHandle"])
    sqs = sqs_client(server.url, KEY, SECRET)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    # An error comes back as the CLI's failure with SQS's code.
    done = subprocess.run(
        ["aws", "sqs", "get-queue-url", "--queue-name", "no-such-queue", "--endpoint-url", server.url],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert done.returncode != 0
    assert "NonExistentQueue" in done.stderr or "QueueDoesNotExist" in done.stderr, done.stderr


def test_messages_received_and_deleted_are_counted_under_the_queue_the_url_names(
    sqs: Any, server: ServerProcess
) -> None:
    """A QueueUrl with a query string names the queue its path ends with, for the action and for
    its counts alike. (Before, the counts took the URL's last part, query and all, as the queue:
    ``journalq_messages_out_total{queue="q-...?via=test"}``.)"""
    name = new_name()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="counted")
    (got,) = sqs.receive_message(QueueUrl=f"{url}?via=test", WaitTimeSeconds=1)["Messages"]
    sqs.delete_message(QueueUrl=f"{url}?via=test", ReceiptHandle=got["ReceiptHandle"])
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'journalq_messages_out_total{{queue="{name}"}} 1.0' in metrics
    assert f'journalq_messages_deleted_total{{queue="{name}"}} 1.0' in metrics
    assert "?via=test" not in metrics
