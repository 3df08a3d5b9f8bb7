"""The Amazon SQS layer of the server without HTTP: the MD5 digests SQS answers with, SigV4
checking against requests signed by botocore, and ``SqsProtocol`` called directly over a Broker."""

from __future__ import annotations

import base64
import calendar
import errno
import hashlib
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from journalq.errors import InvalidMessageError, PartialSendError, StorageError
from journalq.queue import Broker
from journalq.queue.envelope import Attribute
from journalq.server import digests
from journalq.server import sqs as sqs_module
from journalq.server.digests import md5_of_body, md5_of_message_attributes, md5_of_message_system_attributes
from journalq.server.sigv4 import AuthError, verify
from journalq.server.sqs import ATTEMPT_SECONDS, SIDECAR, TRACE_ATTRIBUTE, SqsError, SqsProtocol, _ReceiveAttempts
from conftest import synced_paths

BASE = "http://127.0.0.1:8080"

# -- digests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "digest"),
    [
        # RFC 1321, appendix A.5 (the MD5 test suite)
        ("", "d41d8cd98f00b204e9800998ecf8427e"),
        ("abc", "900150983cd24fb0d6963f7d28e17f72"),
        ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
        # moto's SQS tests (test_message_send_with_attributes): MD5OfMessageBody of "derp"
        ("derp", "58fd9edd83341c29f1aebba81c31e257"),
    ],
)
def test_md5_of_body(body: str, digest: str) -> None:
    assert md5_of_body(body) == digest


def test_md5_of_body_is_of_the_utf8_bytes() -> None:
    assert md5_of_body("h\u00e9\U0001f600") == hashlib.md5("h\u00e9\U0001f600".encode()).hexdigest()


@pytest.mark.parametrize(
    "size", [0, 1, 55, 56, 64, 100, digests._SHORT - 1, digests._SHORT, digests._SHORT + 1, 70_000]
)
def test_md5_of_utf8_is_hashlib_md5_on_either_side_of_the_short_limit(size: int) -> None:
    """Short input goes through CPython's own MD5, the rest through OpenSSL's: the same digest."""
    data = bytes(i * 7 % 256 for i in range(size))
    assert digests.md5_of_utf8(data) == hashlib.md5(data).hexdigest()


def _number(value: str) -> Attribute:
    return Attribute("Number", value)


def _string(value: str) -> Attribute:
    return Attribute("String", value)


ATTRIBUTE_VECTORS = [
    # moto's SQS tests (tests/test_sqs/test_sqs.py: test_message_send_with_attributes and
    # test_send_receive_message_with_attributes), which pin what AWS answers; localstack's
    # test_sqs_message_attrs_md5 pins the first one too.
    ({"timestamp": _number("1493147359900")}, "235c5c510d26fb653d073faed50ae77c"),
    ({"timestamp": _number("1493147359901")}, "994258b45346a2cc3f9cbb611aa7af30"),
    # moto's test_sqs.py, test_message_send_with_attributes (newer versions): a name with '.', '-', '_'
    ({"SOME_Valid.attribute-Name": _number("1493147359900")}, "36655e7e9d7c0e8479fa3f3f42247ae7"),
    # moto's test_sqs.py, test_message_with_attributes_have_labels: a custom type suffix
    ({"timestamp": Attribute("Number.java.lang.Long", "1493147359900")}, "2e2e4876d8e0bd6b8c2c8f556831c349"),
    # YDB's SQS-compatible service, ymq/actor/attributes_md5_ut.cpp "AmazonSampleWithString"
    # and "AmazonSampleWithBinary" (samples from Amazon; the order given is not sorted)
    (
        {
            "test_attribute_name_2": _string("test_attribute_value_2"),
            "test_attribute_name_1": _string("test_attribute_value_1"),
        },
        "d53f3b558fe951154770f25cb63dbba9",
    ),
    (
        {"test_attribute_name": Attribute("Binary", b"test_attribute_value")},
        "23f6bd27ea87aab7dfeadcc9aebee495",
    ),
    # The SQS Developer Guide's message-attribute example (SellerName / City / Region /
    # PostalCode / PricePerGallon), as pinned by an open-source Node SQS checksum module's tests
    ({"SellerName": _string("Example Store")}, "cd28f3b68aeee4b2eac9c66f2f694b58"),
    (
        {
            "City": _string("Any City"),
            "PostalCode": _string("99065"),
            "Region": _string("WA"),
            "SellerName": _string("Example Store"),
        },
        "66d793da93becb551e41562575418975",
    ),
    (
        {
            "City": _string("Any City"),
            "PostalCode": _string("99065"),
            "PricePerGallon": _number("1.99"),
            "Region": _string("WA"),
            "SellerName": _string("Example Store"),
        },
        "10809b55e3d9b22c17220b7dbaf283ef",
    ),
]


@pytest.mark.parametrize(("attributes", "digest"), ATTRIBUTE_VECTORS)
def test_md5_of_message_attributes_published_vectors(attributes: dict[str, Attribute], digest: str) -> None:
    assert md5_of_message_attributes(attributes) == digest


def test_attribute_digest_layout() -> None:
    """The bytes digested, spelled out: name, type, transport byte (2: Binary), value."""
    expected = (
        struct.pack(">I", 3)
        + b"bin"
        + struct.pack(">I", 10)
        + b"Binary.gif"
        + b"\x02"
        + struct.pack(">I", 2)
        + b"\x00\xff"
        + struct.pack(">I", 1)
        + b"n"
        + struct.pack(">I", 12)
        + b"Number.float"
        + b"\x01"
        + struct.pack(">I", 3)
        + b"1.5"
    )
    attributes = {"n": Attribute("Number.float", "1.5"), "bin": Attribute("Binary.gif", b"\x00\xff")}
    assert digests.attributes_digest_input(attributes) == expected
    assert md5_of_message_attributes(attributes) == hashlib.md5(expected).hexdigest()


def _oracle(attributes: dict[str, tuple[str, str | bytes]]) -> str:
    """An independent rendering of the algorithm in the SQS Developer Guide ("Calculating the MD5
    message digest for message attributes"), over plain tuples."""
    md5 = hashlib.md5()
    for name in sorted(attributes):
        data_type, value = attributes[name]
        for part in (name.encode(), data_type.encode()):
            md5.update(len(part).to_bytes(4, "big") + part)
        raw = value if isinstance(value, bytes) else value.encode()
        md5.update(
            (b"\x02" if data_type.startswith("Binary") else b"\x01") + len(raw).to_bytes(4, "big") + raw
        )
    return md5.hexdigest()


_names = st.text(st.sampled_from("abcXYZ019_-."), min_size=1, max_size=12)
_values = st.one_of(
    st.tuples(
        st.sampled_from(["String", "Number", "String.x", "Number.int"]),
        st.text(min_size=1, max_size=20).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
    ),
    st.tuples(st.sampled_from(["Binary", "Binary.png"]), st.binary(min_size=1, max_size=20)),
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_names, _values, max_size=10))
def test_md5_of_message_attributes_matches_an_independent_oracle(attributes: dict[str, Any]) -> None:
    ours = md5_of_message_attributes({n: Attribute(t, v) for n, (t, v) in attributes.items()})
    assert ours == _oracle(attributes)


def test_md5_of_system_attributes_is_the_same_algorithm() -> None:
    trace = {"AWSTraceHeader": _string("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1")}
    assert md5_of_message_system_attributes(trace) == _oracle(
        {"AWSTraceHeader": ("String", trace["AWSTraceHeader"].value)}
    )


# -- SigV4 --------------------------------------------------------------------------------------

KEY_ID, SECRET = "AKIDJOURNALQ", "s3cr3t/K7MDENG+bPxRfiCYEXAMPLEKEY"
CREDENTIALS = {KEY_ID: SECRET, "OTHERKEY": "other-secret"}


def _signed(
    url: str = "http://127.0.0.1:8080/",
    body: bytes = b'{"QueueName":"jobs"}',
    *,
    method: str = "POST",
    key_id: str = KEY_ID,
    secret: str = SECRET,
    token: str | None = None,
    region: str = "us-east-1",
    service: str = "sqs",
) -> tuple[str, str, str, dict[str, str], bytes]:
    """A request signed by botocore: (method, path, query, headers, body) as a server sees them."""
    parts = urlsplit(url)
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={
            "Host": parts.netloc,
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.CreateQueue",
        },
    )
    SigV4Auth(Credentials(key_id, secret, token), service, region).add_auth(request)
    headers = {name: value for name, value in request.headers.items()}
    return method, parts.path or "/", parts.query, headers, body


def test_sigv4_accepts_a_request_signed_by_botocore() -> None:
    assert verify(*_signed(), CREDENTIALS) == KEY_ID
    # header names in any case; any region the client signed for
    method, path, query, headers, body = _signed(region="eu-west-3")
    assert (
        verify(method, path, query, {k.upper(): v for k, v in headers.items()}, body, CREDENTIALS) == KEY_ID
    )


def test_sigv4_query_strings_paths_and_session_tokens() -> None:
    url = "http://localhost:9324/000000000000/jobs?Action=ListQueues&Version=2012-11-05&QueueNamePrefix=a%20b&Z=1&A=%2F"
    assert verify(*_signed(url, b"", method="GET"), CREDENTIALS) == KEY_ID
    method, path, query, headers, body = _signed(url, b"", method="GET")
    with pytest.raises(AuthError) as caught:
        verify(method, path, query.replace("Z=1", "Z=2"), headers, body, CREDENTIALS)
    assert caught.value.code == "SignatureDoesNotMatch"
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        verify(method, "/000000000000/other", query, headers, body, CREDENTIALS)
    assert verify(*_signed(token="session-token"), CREDENTIALS) == KEY_ID


def test_sigv4_tampering_is_refused() -> None:
    method, path, query, headers, body = _signed()
    for changed in (
        (method, path, query, headers, body + b" "),  # the body
        ("PUT", path, query, headers, body),  # the method
        (method, path, query, {**headers, "X-Amz-Target": "AmazonSQS.DeleteQueue"}, body),  # a signed header
        (method, path, query, {**headers, "Host": "evil.example"}, body),
    ):
        with pytest.raises(AuthError) as caught:
            verify(*changed, CREDENTIALS)
        assert caught.value.code == "SignatureDoesNotMatch"
    # an unsigned header may change
    assert verify(method, path, query, {**headers, "User-Agent": "other"}, body, CREDENTIALS) == KEY_ID


def test_sigv4_wrong_secret_unknown_key_and_missing_header() -> None:
    with pytest.raises(AuthError) as caught:
        verify(*_signed(secret="not-the-secret"), CREDENTIALS)
    assert caught.value.code == "SignatureDoesNotMatch" and caught.value.status == 403
    with pytest.raises(AuthError) as caught:
        verify(*_signed(key_id="AKIDUNKNOWN"), CREDENTIALS)
    assert caught.value.code == "InvalidClientTokenId"
    with pytest.raises(AuthError) as caught:
        verify(*_signed(key_id="OTHERKEY"), CREDENTIALS)  # a known key, signed with another's secret
    assert caught.value.code == "SignatureDoesNotMatch"
    method, path, query, headers, body = _signed()
    del headers["Authorization"]
    with pytest.raises(AuthError) as caught:
        verify(method, path, query, headers, body, CREDENTIALS)
    assert caught.value.code == "MissingAuthenticationToken"
    with pytest.raises(AuthError) as caught:
        verify(*_signed(service="s3"), CREDENTIALS)
    assert caught.value.code == "SignatureDoesNotMatch"


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer abc",
        "AWS4-HMAC-SHA256 Credential=AKIDJOURNALQ/20150830/us-east-1/sqs/aws4_request",
        "AWS4-HMAC-SHA256 Credential=AKIDJOURNALQ/us-east-1/sqs, SignedHeaders=host, Signature=00",
        "AWS4-HMAC-SHA256 Credential=AKIDJOURNALQ/20150830/us-east-1/sqs/aws4_request, "
        "SignedHeaders=x-amz-date, Signature=00",
    ],
)
def test_sigv4_malformed_headers(authorization: str) -> None:
    method, path, query, headers, body = _signed()
    headers["Authorization"] = authorization
    with pytest.raises(AuthError) as caught:
        verify(method, path, query, headers, body, CREDENTIALS)
    assert caught.value.code == "IncompleteSignature"


def test_sigv4_expired_and_future_requests() -> None:
    request = _signed()
    now = time.time()
    assert verify(*request, CREDENTIALS, now=now + 200) == KEY_ID
    for moment in (now + 400, now - 400):
        with pytest.raises(AuthError) as caught:
            verify(*request, CREDENTIALS, now=moment)
        assert caught.value.code == "RequestExpired"
    assert verify(*request, CREDENTIALS, now=now + 400, max_skew=900) == KEY_ID
    method, path, query, headers, body = request
    with pytest.raises(AuthError) as caught:
        verify(method, path, query, {**headers, "X-Amz-Date": "20000101T000000Z"}, body, CREDENTIALS)
    assert caught.value.code in ("RequestExpired", "SignatureDoesNotMatch")


def test_sigv4_payload_hash_header() -> None:
    method, path, query, headers, body = _signed()
    headers_with_hash = {**headers, "X-Amz-Content-SHA256": hashlib.sha256(b"other").hexdigest()}
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        verify(method, path, query, headers_with_hash, body, CREDENTIALS)
    with pytest.raises(AuthError, match="must be signed"):
        verify(
            method, path, query, {**headers, "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}, body, CREDENTIALS
        )
    # botocore puts the header in the signature when it is present: then it must be the body's
    request = AWSRequest(
        method="POST",
        url="http://127.0.0.1:8080/",
        data=body,
        headers={"Host": "127.0.0.1:8080", "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()},
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sqs", "us-east-1").add_auth(request)
    assert verify("POST", "/", "", dict(request.headers.items()), body, CREDENTIALS) == KEY_ID


@pytest.mark.parametrize(
    ("query", "signature"),
    [
        # AWS's Signature Version 4 test suite (aws-sig-v4-test-suite), "get-vanilla" and
        # "get-vanilla-query-order-key-case": AKIDEXAMPLE, us-east-1, service "service"
        ("", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        ("Param2=value2&Param1=value1", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    ],
)
def test_sigv4_aws_test_suite_vectors(query: str, signature: str) -> None:
    headers = {
        "Host": "example.amazonaws.com",
        "X-Amz-Date": "20150830T123600Z",
        "Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={signature}",
    }
    now = calendar.timegm((2015, 8, 30, 12, 36, 0))
    credentials = {"AKIDEXAMPLE": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
    assert verify("GET", "/", query, headers, b"", credentials, service="service", now=now) == "AKIDEXAMPLE"
    with pytest.raises(AuthError, match="SignatureDoesNotMatch"):
        verify("GET", "/", query, headers, b"", {"AKIDEXAMPLE": "wrong"}, service="service", now=now)


# -- the SQS protocol -------------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path):
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


@pytest.fixture
def sqs(broker: Broker) -> SqsProtocol:
    return SqsProtocol(broker)


class Client:
    """Calls ``SqsProtocol.handle`` the way the app does."""

    def __init__(self, sqs: SqsProtocol) -> None:
        self.sqs = sqs

    def __call__(self, action: str, **request: Any) -> dict[str, Any]:
        answer = self.sqs.handle(action, request, BASE)
        json.dumps(answer)  # every answer must be JSON
        return answer

    def error(self, action: str, **request: Any) -> SqsError:
        with pytest.raises(SqsError) as caught:
            self.sqs.handle(action, request, BASE)
        return caught.value

    def create(self, name: str, **attributes: Any) -> str:
        return self("CreateQueue", QueueName=name, Attributes={k: str(v) for k, v in attributes.items()})[
            "QueueUrl"
        ]

    def receive(self, url: str, **request: Any) -> list[dict[str, Any]]:
        return self("ReceiveMessage", QueueUrl=url, **request).get("Messages", [])


@pytest.fixture
def client(sqs: SqsProtocol) -> Client:
    return Client(sqs)


def test_sqs_error_shapes() -> None:
    error = SqsError("QueueDoesNotExist", "gone")
    assert error.type == "com.amazonaws.sqs#QueueDoesNotExist"
    assert error.query_error == "AWS.SimpleQueueService.NonExistentQueue;Sender" and error.status == 400
    exists = SqsError("QueueAlreadyExists", "taken")  # the Query code names the modeled shape
    assert (
        exists.type == "com.amazonaws.sqs#QueueNameExists"
        and exists.query_error == "QueueAlreadyExists;Sender"
    )
    assert (
        SqsError("ServiceUnavailable", "full", status=503, sender=False).query_error
        == "ServiceUnavailable;Receiver"
    )
    assert SqsError("SignatureDoesNotMatch", "no", status=403).status == 403
    assert SqsError("ResourceNotFoundException", "x").status == 404
    assert SqsError("ReceiptHandleIsInvalid", "x").status == 404  # as AWS answers (the SDKs say so)


def test_create_get_list_and_delete_queues(client: Client) -> None:
    url = client.create("jobs")
    assert url == f"{BASE}/000000000000/jobs"
    assert client.create("jobs") == url  # the same attributes: its URL again
    assert client("GetQueueUrl", QueueName="jobs") == {"QueueUrl": url}
    for name in ("jobs-b", "jobs-c", "other"):
        client.create(name)
    assert client("ListQueues") == {
        "QueueUrls": [f"{BASE}/000000000000/{n}" for n in ("jobs", "jobs-b", "jobs-c", "other")]
    }
    assert client("ListQueues", QueueNamePrefix="jobs-")["QueueUrls"] == [
        f"{BASE}/000000000000/jobs-b",
        f"{BASE}/000000000000/jobs-c",
    ]
    assert client("ListQueues", QueueNamePrefix="nothing") == {}
    page = client("ListQueues", MaxResults=3)
    assert len(page["QueueUrls"]) == 3 and page["NextToken"]
    rest = client("ListQueues", MaxResults=3, NextToken=page["NextToken"])
    assert rest == {"QueueUrls": [f"{BASE}/000000000000/other"]}
    assert client.error("ListQueues", MaxResults=0).code == "InvalidParameterValue"
    assert client.error("ListQueues", NextToken="garbage!").code == "InvalidParameterValue"
    # any URL whose last segment is the name reaches the queue
    assert client(
        "GetQueueAttributes",
        QueueUrl="https://sqs.eu-west-1.amazonaws.com/123456789012/jobs/",
        AttributeNames=["QueueArn"],
    ) == {"Attributes": {"QueueArn": "arn:aws:sqs:us-east-1:000000000000:jobs"}}
    assert client("DeleteQueue", QueueUrl=url) == {}
    error = client.error("GetQueueUrl", QueueName="jobs")
    assert (error.code, error.query_error, error.status) == (
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue;Sender",
        400,
    )
    for action in (
        "SendMessage",
        "ReceiveMessage",
        "PurgeQueue",
        "DeleteQueue",
        "GetQueueAttributes",
        "ListQueueTags",
    ):
        assert client.error(action, QueueUrl=url, MessageBody="x").code == "QueueDoesNotExist", action
    assert client.error("GetQueueUrl", QueueName="../etc").code == "QueueDoesNotExist"
    assert (
        client.error("SendMessage", QueueUrl=f"{BASE}/000000000000/..", MessageBody="x").code
        == "QueueDoesNotExist"
    )


def test_create_queue_rules(client: Client) -> None:
    assert client.error("CreateQueue").code == "MissingParameter"
    for bad in ("has space", "a" * 81, "dots.in.name", ""):
        assert client.error("CreateQueue", QueueName=bad).code in (
            "InvalidParameterValue",
            "MissingParameter",
        ), bad
    assert (
        client.error("CreateQueue", QueueName="jobs.fifo").code == "InvalidParameterValue"
    )  # FifoQueue missing
    assert (
        client.error("CreateQueue", QueueName="jobs", Attributes={"FifoQueue": "true"}).code
        == "InvalidParameterValue"
    )
    assert client.create("a" * 80)
    assert client.create("a" * 75 + ".fifo", FifoQueue="true")
    url = client.create("slow", VisibilityTimeout=60, DelaySeconds=5)
    error = client.error("CreateQueue", QueueName="slow", Attributes={"VisibilityTimeout": "61"})
    assert (error.code, error.query_error) == ("QueueNameExists", "QueueAlreadyExists;Sender")
    assert "VisibilityTimeout" in error.message
    # the same values given again (in another form), or fewer of them: the URL
    assert client("CreateQueue", QueueName="slow", Attributes={"VisibilityTimeout": 60})["QueueUrl"] == url
    assert (
        client("CreateQueue", QueueName="slow", Attributes={"DelaySeconds": "5", "FifoQueue": "false"})[
            "QueueUrl"
        ]
        == url
    )
    assert (
        client.error("CreateQueue", QueueName="slow", Attributes={"MaximumMessageSize": "2048"}).code
        == "QueueNameExists"
    )


def test_queue_attributes(client: Client, broker: Broker) -> None:
    before = int(time.time())
    url = client.create(
        "jobs",
        VisibilityTimeout=45,
        DelaySeconds=0,
        MessageRetentionPeriod=3600,
        ReceiveMessageWaitTimeSeconds=2,
        MaximumMessageSize=4096,
    )
    settings = broker.queue("jobs", create=False).settings
    assert (settings.visibility_timeout, settings.retention_seconds, settings.receive_wait) == (45, 3600, 2)
    client("SendMessage", QueueUrl=url, MessageBody="one")
    client("SendMessage", QueueUrl=url, MessageBody="two")
    client("SendMessage", QueueUrl=url, MessageBody="later", DelaySeconds=60)
    client.receive(url, WaitTimeSeconds=0)
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "45" and attributes["MessageRetentionPeriod"] == "3600"
    assert attributes["ReceiveMessageWaitTimeSeconds"] == "2" and attributes["DelaySeconds"] == "0"
    assert attributes["MaximumMessageSize"] == "4096"
    assert attributes["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:jobs"
    assert (
        attributes["ApproximateNumberOfMessages"],
        attributes["ApproximateNumberOfMessagesNotVisible"],
        attributes["ApproximateNumberOfMessagesDelayed"],
    ) == ("1", "1", "1")
    assert (
        before - 2
        <= int(attributes["CreatedTimestamp"])
        <= int(attributes["LastModifiedTimestamp"])
        <= time.time() + 2
    )
    assert "FifoQueue" not in attributes and "RedrivePolicy" not in attributes
    assert client("GetQueueAttributes", QueueUrl=url) == {}
    some = client(
        "GetQueueAttributes", QueueUrl=url, AttributeNames=["DelaySeconds", "ApproximateNumberOfMessages"]
    )
    assert some == {"Attributes": {"DelaySeconds": "0", "ApproximateNumberOfMessages": "1"}}
    assert (
        client.error("GetQueueAttributes", QueueUrl=url, AttributeNames=["Nope"]).code
        == "InvalidAttributeName"
    )

    assert (
        client(
            "SetQueueAttributes",
            QueueUrl=url,
            Attributes={"VisibilityTimeout": "10", "DelaySeconds": "3", "Policy": '{"Version":"2012-10-17"}'},
        )
        == {}
    )
    assert broker.queue("jobs", create=False).settings.visibility_timeout == 10
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "10" and attributes["DelaySeconds"] == "3"
    assert attributes["Policy"] == '{"Version":"2012-10-17"}'
    for bad, code in (
        ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
        ({"VisibilityTimeout": "ten"}, "InvalidAttributeValue"),
        ({"DelaySeconds": "901"}, "InvalidAttributeValue"),
        ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
        ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue"),
        ({"MaximumMessageSize": "1023"}, "InvalidAttributeValue"),
        ({"MaximumMessageSize": "1048577"}, "InvalidAttributeValue"),
        ({"Policy": "{not json"}, "InvalidAttributeValue"),
        ({"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),  # not a FIFO queue
        ({"FifoQueue": "true"}, "InvalidAttributeName"),  # only at creation
        ({"QueueArn": "x"}, "InvalidAttributeName"),
        ({"Bogus": "1"}, "InvalidAttributeName"),
    ):
        assert client.error("SetQueueAttributes", QueueUrl=url, Attributes=bad).code == code, bad
    assert client.error("SetQueueAttributes", QueueUrl=url).code == "MissingParameter"


def test_maximum_message_size(client: Client) -> None:
    url = client.create("small", MaximumMessageSize=1024)
    assert client("SendMessage", QueueUrl=url, MessageBody="x" * 1024)["MessageId"]
    error = client.error("SendMessage", QueueUrl=url, MessageBody="x" * 1025)
    assert error.code == "InvalidParameterValue" and "1024" in error.message
    # attributes count: name, type and value
    attribute = {"ab": {"DataType": "String", "StringValue": "xyz"}}
    assert (
        client.error("SendMessage", QueueUrl=url, MessageBody="x" * 1014, MessageAttributes=attribute).code
        == "InvalidParameterValue"
    )
    assert client("SendMessage", QueueUrl=url, MessageBody="x" * 1013, MessageAttributes=attribute)[
        "MessageId"
    ]
    big = client.create("big")
    error = client.error("SendMessage", QueueUrl=big, MessageBody="\u00e9" * 524289)  # 1048578 bytes of UTF-8
    assert error.code == "InvalidParameterValue" and "1048576" in error.message  # SQS's limit by default
    assert client("SendMessage", QueueUrl=big, MessageBody="\u00e9" * 524288)["MessageId"]


def test_send_and_receive_with_digests(client: Client) -> None:
    url = client.create("jobs")
    attributes = {
        "kind": {"DataType": "String", "StringValue": "resize"},
        "size": {"DataType": "Number", "StringValue": "1024"},
        "ratio": {"DataType": "Number.float", "StringValue": "1.5"},
        "thumb": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x00\x01\xff").decode()},
        "meta.a": {"DataType": "String", "StringValue": "A"},
        "meta.b": {"DataType": "String.custom", "StringValue": "B"},
    }
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    body = "r\u00e9sum\u00e9 \U0001f600 <xml/> &amp;"
    sent = client(
        "SendMessage",
        QueueUrl=url,
        MessageBody=body,
        MessageAttributes=attributes,
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": trace}},
    )
    plain = {
        "kind": Attribute("String", "resize"),
        "size": Attribute("Number", "1024"),
        "ratio": Attribute("Number.float", "1.5"),
        "thumb": Attribute("Binary", b"\x00\x01\xff"),
        "meta.a": Attribute("String", "A"),
        "meta.b": Attribute("String.custom", "B"),
    }
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == _oracle({n: (a.data_type, a.value) for n, a in plain.items()})
    assert sent["MD5OfMessageSystemAttributes"] == _oracle({"AWSTraceHeader": ("String", trace)})
    assert "SequenceNumber" not in sent

    (message,) = client.receive(
        url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], VisibilityTimeout=0
    )
    assert message["MessageId"] == sent["MessageId"] and message["Body"] == body
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["MessageAttributes"]["thumb"] == {
        "DataType": "Binary",
        "BinaryValue": base64.b64encode(b"\x00\x01\xff").decode(),
    }
    assert message["MessageAttributes"]["ratio"] == {"DataType": "Number.float", "StringValue": "1.5"}
    assert (
        TRACE_ATTRIBUTE not in message["MessageAttributes"]
        and "AWSTraceHeader" not in message["MessageAttributes"]
    )
    system = message["Attributes"]
    assert system["AWSTraceHeader"] == trace and system["ApproximateReceiveCount"] == "1"
    assert abs(int(system["SentTimestamp"]) - time.time() * 1000) < 10_000
    assert system["SenderId"] == "000000000000"
    first = system["ApproximateFirstReceiveTimestamp"]
    assert "SequenceNumber" not in system and "MessageGroupId" not in system

    # only the attributes asked for, and a digest of just those
    (message,) = client.receive(
        url,
        MessageAttributeNames=["meta.*", "size"],
        AttributeNames=["ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp"],
        VisibilityTimeout=0,
    )
    assert sorted(message["MessageAttributes"]) == ["meta.a", "meta.b", "size"]
    chosen = {n: plain[n] for n in ("meta.a", "meta.b", "size")}
    assert (
        message["MD5OfMessageAttributes"]
        == md5_of_message_attributes(chosen)
        == _oracle({n: (a.data_type, a.value) for n, a in chosen.items()})
    )
    assert message["Attributes"] == {
        "ApproximateReceiveCount": "2",
        "ApproximateFirstReceiveTimestamp": first,
    }
    # nothing asked for: no attributes, no attribute digest
    (message,) = client.receive(url)
    assert (
        "MessageAttributes" not in message
        and "MD5OfMessageAttributes" not in message
        and "Attributes" not in message
    )
    assert client("ReceiveMessage", QueueUrl=url) == {}  # hidden now


def test_message_validation(client: Client) -> None:
    url = client.create("jobs")
    send = lambda **r: client.error("SendMessage", QueueUrl=url, **r)  # noqa: E731
    assert send().code == "MissingParameter"
    assert send(MessageBody="").code == "MissingParameter"
    for bad in ("bell \x07", "nul \x00", "lone \ud800 surrogate", "\ufffe"):
        error = send(MessageBody=bad)
        assert (
            error.code == "InvalidMessageContents" and error.query_error == "InvalidMessageContents;Sender"
        ), repr(bad)
    assert client("SendMessage", QueueUrl=url, MessageBody="tab\tnewline\ncr\r \ud7ff \ue000 \U0010ffff")[
        "MessageId"
    ]
    assert send(MessageBody="x", DelaySeconds=901).code == "InvalidParameterValue"
    assert send(MessageBody="x", MessageGroupId="g" * 129).code == "InvalidParameterValue"
    assert send(MessageBody="x", MessageDeduplicationId="d").code == "InvalidParameterValue"  # not a FIFO queue
    for attributes in (
        {"AWS.x": {"DataType": "String", "StringValue": "v"}},
        {"amazon.x": {"DataType": "String", "StringValue": "v"}},
        {"bad name": {"DataType": "String", "StringValue": "v"}},
        {".lead": {"DataType": "String", "StringValue": "v"}},
        {"a..b": {"DataType": "String", "StringValue": "v"}},
        {"n": {"DataType": "Number", "StringValue": "12x"}},
        {"n": {"DataType": "Number", "StringValue": "1" * 39}},
        {"n": {"DataType": "Text", "StringValue": "v"}},
        {"n": {"StringValue": "v"}},
        {"n": {"DataType": "String", "StringValue": ""}},
        {"n": {"DataType": "String", "StringValue": "bell\x07"}},
        {"n": {"DataType": "Binary", "BinaryValue": "not base64!"}},
        {"n": {"DataType": "String", "StringListValues": ["a"]}},
        {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ):
        assert send(MessageBody="x", MessageAttributes=attributes).code == "InvalidParameterValue", attributes
    assert send(
        MessageBody="x", MessageSystemAttributes={"Other": {"DataType": "String", "StringValue": "v"}}
    ).code == ("InvalidParameterValue")
    numbers = {
        f"n{i}": {"DataType": "Number", "StringValue": v}
        for i, v in enumerate(["-1", "+2.5", "1e10", ".5", "1" * 38])
    }
    assert client("SendMessage", QueueUrl=url, MessageBody="x", MessageAttributes=numbers)[
        "MD5OfMessageAttributes"
    ]


def test_bodies_that_are_not_utf8_are_delivered_with_replacement_characters(
    client: Client, broker: Broker
) -> None:
    url = client.create("raw")
    broker.queue("raw", create=False).send(b"ok \xff\xfe end")  # as the REST API may store it
    (message,) = client.receive(url)
    assert message["Body"] == "ok \ufffd\ufffd end"
    assert message["MD5OfBody"] == hashlib.md5("ok \ufffd\ufffd end".encode()).hexdigest()


def test_receive_parameters(client: Client) -> None:
    url = client.create("jobs")
    for i in range(12):
        client("SendMessage", QueueUrl=url, MessageBody=f"m{i}")
    assert len(client.receive(url, MaxNumberOfMessages=10, VisibilityTimeout=0)) == 10
    assert len(client.receive(url)) == 1
    for bad in (
        {"MaxNumberOfMessages": 0},
        {"MaxNumberOfMessages": 11},
        {"WaitTimeSeconds": 21},
        {"WaitTimeSeconds": -1},
        {"VisibilityTimeout": 43201},
        {"MaxNumberOfMessages": "ten"},
    ):
        error = client.error("ReceiveMessage", QueueUrl=url, **bad)
        assert error.code == "InvalidParameterValue", bad
    assert "between 1 and 10" in client.error("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=11).message


def test_long_polling_returns_as_soon_as_a_message_arrives(client: Client, broker: Broker) -> None:
    url = client.create("jobs")
    sender = threading.Timer(0.3, lambda: broker.queue("jobs", create=False).send(b"late"))
    started = time.monotonic()
    sender.start()
    try:
        messages = client.receive(url, WaitTimeSeconds=10)
    finally:
        sender.join()
    assert [m["Body"] for m in messages] == ["late"]
    assert 0.2 <= time.monotonic() - started < 5
    started = time.monotonic()
    assert client("ReceiveMessage", QueueUrl=url, WaitTimeSeconds=1) == {}
    assert 0.9 <= time.monotonic() - started < 5


def test_long_polling_uses_the_queue_wait_and_another_thread_of_the_protocol(client: Client) -> None:
    url = client.create("waits", ReceiveMessageWaitTimeSeconds=10)
    got: list[Any] = []
    receiver = threading.Thread(target=lambda: got.append(client.receive(url)))
    started = time.monotonic()
    receiver.start()
    time.sleep(0.3)
    client("SendMessage", QueueUrl=url, MessageBody="through SendMessage")
    receiver.join(10)
    assert [m["Body"] for m in got[0]] == ["through SendMessage"] and time.monotonic() - started < 5


def test_delete_and_change_visibility(client: Client) -> None:
    url = client.create("jobs")
    other = client.create("other")
    client("SendMessage", QueueUrl=url, MessageBody="a")
    client("SendMessage", QueueUrl=other, MessageBody="b")
    (message,) = client.receive(url)
    (foreign,) = client.receive(other)
    assert (
        client(
            "ChangeMessageVisibility",
            QueueUrl=url,
            ReceiptHandle=message["ReceiptHandle"],
            VisibilityTimeout=0,
        )
        == {}
    )
    (again,) = client.receive(url)
    assert again["MessageId"] == message["MessageId"] and again["ReceiptHandle"] != message["ReceiptHandle"]
    # the older receipt: delete succeeds without deleting (as SQS), a visibility change fails
    assert client("DeleteMessage", QueueUrl=url, ReceiptHandle=message["ReceiptHandle"]) == {}
    error = client.error(
        "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=5
    )
    assert error.code == "InvalidParameterValue"
    assert (
        client(
            "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=0
        )
        == {}
    )
    (third,) = client.receive(url, AttributeNames=["ApproximateReceiveCount"])
    assert third["Attributes"]["ApproximateReceiveCount"] == "3"
    assert client("DeleteMessage", QueueUrl=url, ReceiptHandle=third["ReceiptHandle"]) == {}
    assert client("DeleteMessage", QueueUrl=url, ReceiptHandle=third["ReceiptHandle"]) == {}  # twice: fine
    assert client("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0) == {}
    for receipt in ("garbage", foreign["ReceiptHandle"], "1.1.00000000"):
        error = client.error("DeleteMessage", QueueUrl=url, ReceiptHandle=receipt)
        assert (error.code, error.query_error) == (
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid;Sender",
        ), receipt
        error = client.error(
            "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=1
        )
        assert error.code == "ReceiptHandleIsInvalid"
    assert client.error("DeleteMessage", QueueUrl=url).code == "MissingParameter"
    assert (
        client.error("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=foreign["ReceiptHandle"]).code
        == "MissingParameter"
    )
    assert (
        client.error(
            "ChangeMessageVisibility",
            QueueUrl=other,
            ReceiptHandle=foreign["ReceiptHandle"],
            VisibilityTimeout=43201,
        ).code
        == "InvalidParameterValue"
    )


def test_a_stale_receipt_of_a_sharded_queue_is_still_one_of_its_receipts(client: Client) -> None:
    """A sharded queue's receipt whose delivery is over (the message went out again) is still
    one of the queue's: DeleteMessage succeeds and deletes nothing, as on any queue (it was
    ``ReceiptHandleIsInvalid``: the check that tells a stale receipt from a foreign one knew
    unsharded queues only); ChangeMessageVisibility is InvalidParameterValue."""
    url = client.create("spread", Shards=2)
    client("SendMessage", QueueUrl=url, MessageBody="a")
    (first,) = client.receive(url, VisibilityTimeout=0)
    (again,) = client.receive(url, VisibilityTimeout=60)
    assert again["MessageId"] == first["MessageId"] and again["ReceiptHandle"] != first["ReceiptHandle"]
    stale = first["ReceiptHandle"]
    assert client("DeleteMessage", QueueUrl=url, ReceiptHandle=stale) == {}
    batch = client("DeleteMessageBatch", QueueUrl=url, Entries=[{"Id": "old", "ReceiptHandle": stale}])
    assert batch == {"Successful": [{"Id": "old"}], "Failed": []}
    error = client.error("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=stale, VisibilityTimeout=5)
    assert error.code == "InvalidParameterValue"
    # Nothing was deleted: the current delivery's receipt acts, and the message comes back.
    assert client("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=again["ReceiptHandle"],
                  VisibilityTimeout=0) == {}
    (third,) = client.receive(url)
    assert third["MessageId"] == first["MessageId"]
    for receipt in ("garbage", "7." + stale.partition(".")[2], stale.partition(".")[0] + ".1.2.ffff"):
        error = client.error("DeleteMessage", QueueUrl=url, ReceiptHandle=receipt)
        assert error.code == "ReceiptHandleIsInvalid", receipt


def test_send_message_batch(client: Client) -> None:
    url = client.create("jobs")
    entries = [
        {
            "Id": "a",
            "MessageBody": "one",
            "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
        },
        {"Id": "b-2", "MessageBody": "bad \x01"},
        {"Id": "c_3", "MessageBody": "three", "DelaySeconds": 0},
        {"Id": "d", "MessageBody": ""},
    ]
    answer = client("SendMessageBatch", QueueUrl=url, Entries=entries)
    assert [e["Id"] for e in answer["Successful"]] == ["a", "c_3"]
    one, three = answer["Successful"]
    assert one["MD5OfMessageBody"] == md5_of_body("one")
    assert one["MD5OfMessageAttributes"] == md5_of_message_attributes({"k": Attribute("String", "v")})
    assert "MD5OfMessageAttributes" not in three
    assert answer["Failed"] == [
        {
            "Id": "b-2",
            "SenderFault": True,
            "Code": "InvalidMessageContents",
            "Message": answer["Failed"][0]["Message"],
        },
        {
            "Id": "d",
            "SenderFault": True,
            "Code": "MissingParameter",
            "Message": "The request must contain the parameter MessageBody.",
        },
    ]
    assert [m["Body"] for m in client.receive(url, MaxNumberOfMessages=10)] == ["one", "three"]

    error = client.error("SendMessageBatch", QueueUrl=url, Entries=[])
    assert (error.code, error.query_error) == (
        "EmptyBatchRequest",
        "AWS.SimpleQueueService.EmptyBatchRequest;Sender",
    )
    assert client.error("SendMessageBatch", QueueUrl=url).code == "EmptyBatchRequest"
    many = [{"Id": f"m{i}", "MessageBody": "x"} for i in range(11)]
    error = client.error("SendMessageBatch", QueueUrl=url, Entries=many)
    assert (error.code, error.query_error) == (
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest;Sender",
    )
    error = client.error(
        "SendMessageBatch",
        QueueUrl=url,
        Entries=[{"Id": "x", "MessageBody": "1"}, {"Id": "x", "MessageBody": "2"}],
    )
    assert (error.code, error.query_error) == (
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct;Sender",
    )
    for bad_id in ("has space", "", "x" * 81, None):
        error = client.error("SendMessageBatch", QueueUrl=url, Entries=[{"Id": bad_id, "MessageBody": "1"}])
        assert error.code == "InvalidBatchEntryId", bad_id
    large = [{"Id": f"m{i}", "MessageBody": "x" * 120000} for i in range(9)]  # over 1 MiB together
    error = client.error("SendMessageBatch", QueueUrl=url, Entries=large)
    assert (error.code, error.query_error) == (
        "BatchRequestTooLong",
        "AWS.SimpleQueueService.BatchRequestTooLong;Sender",
    )
    assert client("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0) == {}  # nothing of the refused batches


def test_delete_and_change_visibility_batches(client: Client) -> None:
    url = client.create("jobs")
    client(
        "SendMessageBatch", QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(3)]
    )
    received = client.receive(url, MaxNumberOfMessages=3)
    receipts = [m["ReceiptHandle"] for m in received]
    answer = client(
        "ChangeMessageVisibilityBatch",
        QueueUrl=url,
        Entries=[
            {"Id": "zero", "ReceiptHandle": receipts[0], "VisibilityTimeout": 0},
            {"Id": "long", "ReceiptHandle": receipts[1], "VisibilityTimeout": 600},
            {"Id": "bad", "ReceiptHandle": "junk", "VisibilityTimeout": 1},
            {"Id": "range", "ReceiptHandle": receipts[2], "VisibilityTimeout": 50000},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["zero", "long"]
    assert {e["Id"]: e["Code"] for e in answer["Failed"]} == {
        "bad": "ReceiptHandleIsInvalid",
        "range": "InvalidParameterValue",
    }
    assert all(e["SenderFault"] is True for e in answer["Failed"])
    (back,) = client.receive(url)
    assert back["MessageId"] == received[0]["MessageId"]
    answer = client(
        "DeleteMessageBatch",
        QueueUrl=url,
        Entries=[
            {"Id": "new", "ReceiptHandle": back["ReceiptHandle"]},
            {"Id": "stale", "ReceiptHandle": receipts[0]},  # a delivery that is over: success, as SQS
            {"Id": "other", "ReceiptHandle": receipts[1]},
            {"Id": "junk", "ReceiptHandle": "junk"},
            {"Id": "none"},
        ],
    )
    assert [e["Id"] for e in answer["Successful"]] == ["new", "stale", "other"]
    assert {e["Id"]: e["Code"] for e in answer["Failed"]} == {
        "junk": "ReceiptHandleIsInvalid",
        "none": "MissingParameter",
    }
    stats = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (stats["ApproximateNumberOfMessages"], stats["ApproximateNumberOfMessagesNotVisible"]) == (
        "0",
        "1",
    )
    assert client.error("DeleteMessageBatch", QueueUrl=url, Entries=[]).code == "EmptyBatchRequest"
    assert (
        client.error(
            "ChangeMessageVisibilityBatch", QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "x"}] * 2
        ).code
        == "BatchEntryIdsNotDistinct"
    )


def test_fifo_queues(client: Client) -> None:
    url = client.create("orders.fifo", FifoQueue="true")
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "false"
    send = lambda **r: client("SendMessage", QueueUrl=url, **r)  # noqa: E731
    assert (
        client.error("SendMessage", QueueUrl=url, MessageBody="x", MessageDeduplicationId="d").code
        == "MissingParameter"
    )
    error = client.error("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert error.code == "InvalidParameterValue" and "ContentBasedDeduplication" in error.message
    error = client.error(
        "SendMessage",
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        DelaySeconds=5,
    )
    assert error.code == "InvalidParameterValue"
    assert (
        client.error(
            "SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g" * 129, MessageDeduplicationId="d"
        ).code
        == "InvalidParameterValue"
    )
    first = send(MessageBody="first", MessageGroupId="g1", MessageDeduplicationId="d1")
    second = send(MessageBody="second", MessageGroupId="g1", MessageDeduplicationId="d2")
    again = send(MessageBody="first, again", MessageGroupId="g1", MessageDeduplicationId="d1")
    other = send(MessageBody="other group", MessageGroupId="g2", MessageDeduplicationId="d3")
    assert again["MessageId"] == first["MessageId"] and again["SequenceNumber"] == first["SequenceNumber"]
    assert first["SequenceNumber"] == f"{int(first['MessageId'].partition('.')[0]):020d}"
    assert len(first["SequenceNumber"]) == 20
    assert int(first["SequenceNumber"]) < int(second["SequenceNumber"]) < int(other["SequenceNumber"])
    messages = client.receive(url, MaxNumberOfMessages=10, AttributeNames=["All"])
    assert [m["Body"] for m in messages] == ["first", "second", "other group"]  # a group's together, in order
    head = messages[0]["Attributes"]
    assert (head["MessageGroupId"], head["MessageDeduplicationId"], head["SequenceNumber"]) == (
        "g1",
        "d1",
        first["SequenceNumber"],
    )
    assert client("ReceiveMessage", QueueUrl=url) == {}  # g1 and g2 are in flight
    client("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=messages[1]["ReceiptHandle"], VisibilityTimeout=0)
    assert client("ReceiveMessage", QueueUrl=url) == {}  # "second" waits while "first" is in flight
    client("DeleteMessage", QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
    assert [m["Body"] for m in client.receive(url)] == ["second"]

    cbd = client.create("cbd.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    one = client("SendMessage", QueueUrl=cbd, MessageBody="same", MessageGroupId="g")
    two = client("SendMessage", QueueUrl=cbd, MessageBody="same", MessageGroupId="g")
    assert one["MessageId"] == two["MessageId"]
    (message,) = client.receive(cbd, MessageSystemAttributeNames=["MessageDeduplicationId"])
    assert message["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"same").hexdigest()
    batch = client(
        "SendMessageBatch",
        QueueUrl=cbd,
        Entries=[
            {"Id": "a", "MessageBody": "b1", "MessageGroupId": "g"},
            {"Id": "b", "MessageBody": "b2"},
        ],
    )
    assert [e["Id"] for e in batch["Successful"]] == ["a"] and batch["Successful"][0]["SequenceNumber"]
    assert batch["Failed"][0]["Code"] == "MissingParameter"
    assert client.error(
        "SetQueueAttributes", QueueUrl=cbd, Attributes={"DeduplicationScope": "perGroup"}
    ).code == ("InvalidAttributeValue")
    assert (
        client(
            "SetQueueAttributes",
            QueueUrl=cbd,
            Attributes={
                "ContentBasedDeduplication": "false",
                "DeduplicationScope": "messageGroup",  # which perMessageGroupId needs
                "FifoThroughputLimit": "perMessageGroupId",
            },
        )
        == {}
    )
    attributes = client("GetQueueAttributes", QueueUrl=cbd, AttributeNames=["All"])["Attributes"]
    assert (
        attributes["ContentBasedDeduplication"] == "false"
        and attributes["FifoThroughputLimit"] == "perMessageGroupId"
    )


def test_dead_letters_redrive_and_move_tasks(client: Client) -> None:
    dlq = client.create("jobs-dlq")
    dlq_arn = "arn:aws:sqs:us-east-1:000000000000:jobs-dlq"
    error = client.error(
        "CreateQueue",
        QueueName="jobs",
        Attributes={
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:missing", "maxReceiveCount": 2}
            )
        },
    )
    assert error.code == "InvalidParameterValue" and "does not exist" in error.message
    for bad in (
        '{"maxReceiveCount": 2}',
        "not json",
        json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 0}),
        json.dumps({"deadLetterTargetArn": "not-an-arn", "maxReceiveCount": 2}),
    ):
        assert client.error("CreateQueue", QueueName="jobs", Attributes={"RedrivePolicy": bad}).code in (
            "InvalidAttributeValue",
            "InvalidParameterValue",
        ), bad
    fifo_dlq = client.create("dlq.fifo", FifoQueue="true")
    assert fifo_dlq
    error = client.error(
        "CreateQueue",
        QueueName="jobs",
        Attributes={
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq.fifo", "maxReceiveCount": 2}
            )
        },
    )
    assert error.code == "InvalidParameterValue"
    url = client.create(
        "jobs", RedrivePolicy=json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    )
    policy = json.loads(
        client("GetQueueAttributes", QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )
    assert policy == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert client("ListDeadLetterSourceQueues", QueueUrl=dlq) == {"queueUrls": [url]}
    assert client("ListDeadLetterSourceQueues", QueueUrl=url) == {"queueUrls": []}

    client(
        "SendMessage",
        QueueUrl=url,
        MessageBody="poison",
        MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}},
    )
    for _ in range(2):
        assert [m["Body"] for m in client.receive(url, VisibilityTimeout=0)] == ["poison"]
    assert client("ReceiveMessage", QueueUrl=url) == {}  # the third try moves it
    (dead,) = client.receive(
        dlq, MessageAttributeNames=["All"], AttributeNames=["DeadLetterQueueSourceArn"], VisibilityTimeout=0
    )
    assert dead["Body"] == "poison" and dead["MessageAttributes"]["k"]["StringValue"] == "v"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"] == "arn:aws:sqs:us-east-1:000000000000:jobs"

    assert client.error("StartMessageMoveTask", SourceArn="arn:aws:sqs:us-east-1:000000000000:nope").code == (
        "ResourceNotFoundException"
    )
    assert client.error("StartMessageMoveTask", SourceArn="arn:aws:sqs:us-east-1:000000000000:jobs").code == (
        "InvalidParameterValue"
    )  # not a dead-letter queue
    assert client.error("StartMessageMoveTask").code == "MissingParameter"
    handle = client("StartMessageMoveTask", SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=10)["TaskHandle"]
    assert [m["Body"] for m in client.receive(url)] == ["poison"]
    assert client("ReceiveMessage", QueueUrl=dlq) == {}
    (task,) = client("ListMessageMoveTasks", SourceArn=dlq_arn)["Results"]
    assert task["Status"] == "COMPLETED" and task["SourceArn"] == dlq_arn
    assert task["ApproximateNumberOfMessagesMoved"] == 1 and task["ApproximateNumberOfMessagesToMove"] == 1
    assert (
        task["MaxNumberOfMessagesPerSecond"] == 10
        and abs(task["StartedTimestamp"] - time.time() * 1000) < 60_000
    )
    error = client.error("CancelMessageMoveTask", TaskHandle=handle)
    assert (error.code, error.query_error) == (
        "UnsupportedOperation",
        "AWS.SimpleQueueService.UnsupportedOperation;Sender",
    )
    assert client.error("CancelMessageMoveTask", TaskHandle="bogus").code == "ResourceNotFoundException"
    # to another destination; tasks listed newest first
    other = client.create("elsewhere")
    client("SendMessage", QueueUrl=dlq, MessageBody="stray")
    client(
        "StartMessageMoveTask",
        SourceArn=dlq_arn,
        DestinationArn="arn:aws:sqs:us-east-1:000000000000:elsewhere",
    )
    assert [m["Body"] for m in client.receive(other)] == ["stray"]
    tasks = client("ListMessageMoveTasks", SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert [t.get("DestinationArn") for t in tasks] == ["arn:aws:sqs:us-east-1:000000000000:elsewhere", None]
    assert (
        client.error("ListMessageMoveTasks", SourceArn=dlq_arn, MaxResults=11).code == "InvalidParameterValue"
    )
    # removing the redrive policy
    assert client("SetQueueAttributes", QueueUrl=url, Attributes={"RedrivePolicy": ""}) == {}
    assert client("ListDeadLetterSourceQueues", QueueUrl=dlq) == {"queueUrls": []}


def test_tags_persist_beside_the_queue(client: Client, broker: Broker) -> None:
    url = client("CreateQueue", QueueName="tagged", tags={"team": "infra"})["QueueUrl"]
    assert client("ListQueueTags", QueueUrl=url) == {"Tags": {"team": "infra"}}
    assert client("TagQueue", QueueUrl=url, Tags={"env": "test", "team": "core"}) == {}
    assert client("UntagQueue", QueueUrl=url, TagKeys=["env", "absent"]) == {}
    assert Client(SqsProtocol(broker))("ListQueueTags", QueueUrl=url) == {
        "Tags": {"team": "core"}
    }  # stored, not in memory
    assert client.error("TagQueue", QueueUrl=url).code == "MissingParameter"
    assert client.error("TagQueue", QueueUrl=url, Tags={"": "x"}).code == "InvalidParameterValue"
    assert (
        client.error("TagQueue", QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)}).code
        == "InvalidParameterValue"
    )
    assert client.error("UntagQueue", QueueUrl=url).code == "MissingParameter"
    client("UntagQueue", QueueUrl=url, TagKeys=["team"])
    assert client("ListQueueTags", QueueUrl=url) == {}
    # the sidecar goes with the queue
    client("TagQueue", QueueUrl=url, Tags={"a": "b"})
    client("DeleteQueue", QueueUrl=url)
    client.create("tagged")
    assert client("ListQueueTags", QueueUrl=url) == {}


def test_purge_queue(client: Client) -> None:
    url = client.create("jobs")
    for i in range(5):
        client("SendMessage", QueueUrl=url, MessageBody=f"m{i}")
    assert client("PurgeQueue", QueueUrl=url) == {}
    assert client("ReceiveMessage", QueueUrl=url) == {}
    client("SendMessage", QueueUrl=url, MessageBody="after")
    assert [m["Body"] for m in client.receive(url)] == ["after"]


def test_unknown_and_unsupported_actions(client: Client) -> None:
    error = client.error("Frobnicate")
    assert (error.code, error.type, error.query_error) == (
        "InvalidAction",
        "com.amazonaws.sqs#InvalidAction",
        "InvalidAction;Sender",
    )
    assert client.error("AddPermission", QueueUrl="x").code == "UnsupportedOperation"
    assert client.error("SendMessage", MessageBody="x").code == "MissingParameter"  # no QueueUrl
    with pytest.raises(SqsError):
        SqsProtocol.handle(client.sqs, "ListQueues", [], BASE)  # type: ignore[arg-type]


def test_storage_errors_propagate(client: Client, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    url = client.create("jobs")
    queue = broker.queue("jobs", create=False)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise StorageError("no space left on device", errno=28)

    monkeypatch.setattr(queue, "send_many", full)
    with pytest.raises(StorageError) as caught:
        client("SendMessage", QueueUrl=url, MessageBody="x")
    assert caught.value.errno == 28


# -- sends stored together (the server's group commit for SQS) ---------------------------------------


def test_send_together_stores_requests_in_one_write_and_refuses_bad_ones_alone(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = client.create("together")
    queue = sqs.broker.queue("together", create=False)
    writes: list[int] = []
    real_send_many = type(queue.topic).send_many

    def counting_send_many(topic: Any, items: Any) -> list[str]:
        items = list(items)
        writes.append(len(items))
        return real_send_many(topic, items)

    monkeypatch.setattr(type(queue.topic), "send_many", counting_send_many)
    attribute = {"k": {"DataType": "String", "StringValue": "v"}}
    requests = [
        ("SendMessage", {"QueueUrl": url, "MessageBody": "one", "MessageAttributes": attribute}),
        ("SendMessage", {"QueueUrl": url}),  # no body: refused, alone
        ("SendMessageBatch", {"QueueUrl": url, "Entries": [
            {"Id": "a", "MessageBody": "two"}, {"Id": "b", "MessageBody": ""}]}),
        ("SendMessageBatch", {"QueueUrl": url, "Entries": []}),  # refused as a whole, alone
        ("SendMessage", {"QueueUrl": url, "MessageBody": "three"}),
    ]
    assert sqs.queue_of(requests[0][1]) == "together"
    one, missing, batch, empty, three = sqs.send_together("together", requests)
    assert writes == [3]  # the three good messages of four requests: one write
    assert isinstance(missing, SqsError) and missing.code == "MissingParameter"
    assert isinstance(empty, SqsError) and empty.code == "EmptyBatchRequest"
    assert isinstance(one, dict) and one["MD5OfMessageBody"] == md5_of_body("one")
    assert one["MD5OfMessageAttributes"] == md5_of_message_attributes({"k": Attribute("String", "v")})
    assert isinstance(batch, dict) and [e["Id"] for e in batch["Successful"]] == ["a"]
    assert [(e["Id"], e["Code"]) for e in batch["Failed"]] == [("b", "MissingParameter")]
    assert isinstance(three, dict)
    ids = [one["MessageId"], batch["Successful"][0]["MessageId"], three["MessageId"]]
    offsets = [int(i.partition(".")[0]) for i in ids]
    assert offsets == list(range(offsets[0], offsets[0] + 3))  # in order, one batch
    assert [m["Body"] for m in client.receive(url, MaxNumberOfMessages=10)] == ["one", "two", "three"]


@pytest.mark.parametrize(
    "check", [lambda text: sqs_module._check_characters(text, "the message body"), sqs_module._encoded_body]
)
def test_the_character_check_refuses_what_the_pattern_refuses_and_no_more(check: Any) -> None:
    """``_check_characters`` passes printable ASCII without its pattern, and ``_encoded_body`` checks
    ASCII in its bytes: every ASCII character, alone and in printable text, is judged as the
    pattern judges it."""
    for code in range(128):
        for text in (chr(code), f"ab{chr(code)}cd"):
            refused = sqs_module.BAD_CHARACTER.search(text) is not None
            try:
                encoded = check(text)
            except SqsError as exc:
                assert refused and exc.message.startswith(f"Invalid binary character '#x{code:X}'"), repr(text)
            else:
                assert not refused, repr(text)
                assert encoded in (None, text.encode()), repr(text)


def _outcome(make: Any, *args: Any) -> Any:
    """What ``make(*args)`` returns, or the code and message of the ``SqsError`` it raises."""
    try:
        return make(*args)
    except SqsError as exc:
        return (exc.code, exc.message)


@pytest.mark.parametrize(
    "body",
    ["x" * 100, "a", "tab\tnew\nline\r", "del\x7f", "h\u00e9\U0001f600", "\ue000\ufffd", "x" * 1024,
     "bell\x07", "nul\x00", "\ufffe", "lone \ud800"],
)
def test_the_plain_send_fast_path_gives_what_the_full_checks_give(client: Client, sqs: SqsProtocol, body: str) -> None:
    """A body alone to a standard queue takes ``_plain_outgoing``: the same message, answer and
    size as ``_checked_outgoing`` makes, or the same error for characters SQS refuses."""
    client.create("plain")
    queue, rules = sqs._queue("plain"), sqs._send_rules("plain")
    for entry in ({"QueueUrl": "u", "MessageBody": body}, {"Id": "e", "MessageBody": body}):
        fast = _outcome(sqs_module._plain_outgoing, entry, queue.settings, rules)
        assert fast is not None
        assert fast == _outcome(sqs._checked_outgoing, entry, queue.settings, rules)
        if not isinstance(fast, tuple):  # stored as the body alone, answered with its digest
            assert fast.item == body.encode() and fast.answer == {"MD5OfMessageBody": md5_of_body(body)}


@pytest.mark.parametrize(
    ("queue_name", "entry"),
    [
        ("plain.fifo", {"MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "d"}),
        ("plain.fifo", {"MessageBody": "x"}),
        ("plain", {"MessageBody": "x", "DelaySeconds": 5}),
        ("plain", {"MessageBody": "x", "DelaySeconds": None}),
        ("plain", {"MessageBody": "x", "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}}),
        ("plain", {"MessageBody": "x", "MessageAttributes": {}}),
        ("plain", {"MessageBody": "x", "MessageSystemAttributes": {
            "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1"}}}),
        ("plain", {"MessageBody": "x", "MessageGroupId": "tenant"}),
        ("plain", {"MessageBody": "x", "MessageDeduplicationId": "d"}),
        ("plain", {"MessageBody": ""}),
        ("plain", {"MessageBody": None}),
        ("plain", {"MessageBody": 5}),
        ("plain", {}),
        ("small", {"MessageBody": "x" * 1025}),
        ("small", {"MessageBody": "\u00e9" * 513}),  # 1,026 bytes in UTF-8
    ],
)
def test_the_plain_send_fast_path_declines_every_other_message(
    client: Client, sqs: SqsProtocol, queue_name: str, entry: dict[str, Any]
) -> None:
    client.create("plain")
    client.create("plain.fifo", FifoQueue="true")
    client.create("small", MaximumMessageSize=1024)
    queue, rules = sqs._queue(queue_name), sqs._send_rules(queue_name)
    assert sqs_module._plain_outgoing(entry, queue.settings, rules) is None
    assert _outcome(sqs._outgoing, entry, queue.settings, rules) == _outcome(
        sqs._checked_outgoing, entry, queue.settings, rules)


def test_send_together_deduplicates_across_requests(client: Client, sqs: SqsProtocol) -> None:
    url = client.create("together.fifo", FifoQueue="true")
    send = {"QueueUrl": url, "MessageGroupId": "g", "MessageDeduplicationId": "same"}
    first, again = sqs.send_together("together.fifo", [
        ("SendMessage", {**send, "MessageBody": "first"}), ("SendMessage", {**send, "MessageBody": "again"})])
    assert isinstance(first, dict) and isinstance(again, dict)
    assert first["MessageId"] == again["MessageId"]  # as if sent one after the other
    assert [m["Body"] for m in client.receive(url, MaxNumberOfMessages=10)] == ["first"]


def test_send_together_fails_as_a_whole_when_the_store_fails(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = client.create("full")
    queue = sqs.broker.queue("full", create=False)

    def full(topic: Any, items: Any) -> list[str]:
        raise StorageError("disk full")

    monkeypatch.setattr(type(queue.topic), "send_many", full)
    with pytest.raises(StorageError):
        sqs.send_together("full", [("SendMessage", {"QueueUrl": url, "MessageBody": "x"})] * 3)


def test_send_together_answers_each_send_as_it_fared_when_part_is_stored(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = client.create("partly")
    queue = sqs.broker.queue("partly", create=False)

    def half(topic: Any, items: Any) -> list[str]:  # every other message stored
        raise PartialSendError([str(100 + i) if i % 2 == 0 else None for i in range(len(items))],
                               StorageError("disk full"))

    monkeypatch.setattr(type(queue.topic), "send_many", half)
    unsent = SqsError("ServiceUnavailable", "not stored", status=503, sender=False)
    made: list[PartialSendError] = []
    answers = sqs.send_together("partly", [
        ("SendMessage", {"QueueUrl": url, "MessageBody": "zero"}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "one"}),
        ("SendMessageBatch", {"QueueUrl": url, "Entries": [{"Id": f"e{i}", "MessageBody": f"e{i}"} for i in range(3)]}),
        ("SendMessage", {"QueueUrl": url}),  # refused by the checks: no message
    ], partly_stored=lambda exc: made.append(exc) or unsent)
    answers = queue_ids(answers, queue.token)
    assert len(made) == 1
    assert answers[0] == {"MessageId": "100", "MD5OfMessageBody": md5_of_body("zero")}
    assert answers[1] is unsent
    assert answers[2] == {
        "Successful": [{"Id": e, "MessageId": i, "MD5OfMessageBody": md5_of_body(e)} for e, i in (("e0", "102"),
                                                                                                  ("e2", "104"))],
        "Failed": [
            {"Id": "e1", "SenderFault": False, "Code": "ServiceUnavailable", "Message": f"not stored: {made[0]}"}
        ],
    }
    assert isinstance(answers[3], SqsError) and answers[3].code == "MissingParameter"


def queue_ids(value: Any, token: str) -> Any:
    """``value`` with each ``MessageId`` the queue's own: without the queue's token, which it
    must carry (``journalq.server.ids``)."""
    if isinstance(value, dict):
        return {key: _queue_id(item, token) if key == "MessageId" else queue_ids(item, token)
                for key, item in value.items()}
    if isinstance(value, list):
        return [queue_ids(item, token) for item in value]
    return value


def _queue_id(message_id: str, token: str) -> str:
    inner, _, tagged = message_id.rpartition(".")
    assert tagged == token, (message_id, token)
    return inner


_TOGETHER = [
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "one"}),
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "h\u00e9\U0001f600"}),
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "two", "DelaySeconds": 0}),
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "bell\x07"}),
    ("SendMessageBatch", {"QueueUrl": "u", "Entries": [{"Id": "a", "MessageBody": "three"}]}),
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "x" * 1025}),  # over the queue's limit
    ("SendMessage", {"QueueUrl": "u"}),
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "four"}),
]


@pytest.mark.parametrize("requests", [_TOGETHER, [_TOGETHER[i] for i in (0, 1, 7)], [_TOGETHER[i] for i in (0, 3, 7)]],
                         ids=["mixed", "plain only", "plain and a bad character"])
def test_send_together_answers_plain_sends_as_the_full_checks_do(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch, requests: list[tuple[str, dict[str, Any]]]
) -> None:
    """Plain SendMessages (a body alone, ``_plain_body``) are stored and answered as the full
    checks store and answer them, alone in a batch or among other sends and refusals: the same
    answers (the same message ids, each queue beginning at 0), the same messages."""
    answers, bodies = {}, {}
    for run in ("lane", "full"):
        client.create(run, MaximumMessageSize=1024)
        with monkeypatch.context() as patch:
            if run == "full":
                patch.setattr(sqs_module, "_plain_body", lambda entry, settings, rules: None)
            got = sqs.send_together(run, requests)
        answers[run] = [(a.code, a.message) if isinstance(a, SqsError) else a
                        for a in queue_ids(got, sqs.broker.queue(run, create=False).token)]
        bodies[run] = [m["Body"] for m in client.receive(f"{BASE}/000000000000/{run}", MaxNumberOfMessages=10)]
    assert answers["lane"] == answers["full"]
    assert bodies["lane"] == bodies["full"]
    assert [a for a in answers["lane"] if isinstance(a, dict) and "MD5OfMessageBody" in a]  # some were sent


def test_send_together_of_plain_sends_only_answers_each_as_it_fared_when_part_is_stored(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = client.create("partly")
    queue = sqs.broker.queue("partly", create=False)

    def half(topic: Any, items: Any) -> list[str]:
        raise PartialSendError([str(100 + i) if i % 2 == 0 else None for i in range(len(items))],
                               StorageError("disk full"))

    monkeypatch.setattr(type(queue.topic), "send_many", half)
    unsent = SqsError("ServiceUnavailable", "not stored", status=503, sender=False)
    bodies = ["zero", "one", "two"]
    answers = sqs.send_together("partly", [("SendMessage", {"QueueUrl": url, "MessageBody": b}) for b in bodies],
                                partly_stored=lambda exc: unsent)
    assert queue_ids(answers, queue.token) == [
        {"MessageId": "100", "MD5OfMessageBody": md5_of_body("zero")},
        unsent,
        {"MessageId": "102", "MD5OfMessageBody": md5_of_body("two")},
    ]


def test_send_together_of_plain_sends_only_stores_each_alone_when_the_queue_refuses_one(
    client: Client, sqs: SqsProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message the queue refuses (not the checks) fails its send alone, plain sends too."""
    url = client.create("picky")
    queue = sqs.broker.queue("picky", create=False)
    real = type(queue.topic).send_many

    def picky(topic: Any, items: Any) -> list[str]:
        items = list(items)
        if b"refused" in items:
            raise InvalidMessageError("not this one")
        return real(topic, items)

    monkeypatch.setattr(type(queue.topic), "send_many", picky)
    first, refused, last = sqs.send_together("picky", [
        ("SendMessage", {"QueueUrl": url, "MessageBody": b}) for b in ("first", "refused", "last")])
    assert isinstance(refused, SqsError) and refused.code == "InvalidParameterValue"
    assert "not this one" in refused.message
    assert first["MD5OfMessageBody"] == md5_of_body("first") and last["MD5OfMessageBody"] == md5_of_body("last")
    assert [m["Body"] for m in client.receive(url, MaxNumberOfMessages=10)] == ["first", "last"]


def test_receive_attempts_are_kept_five_minutes_and_bounded() -> None:
    attempts = _ReceiveAttempts(limit=2)
    one, two = [object()], [object()]  # the memo keeps what it is given, whatever it is
    attempts.remember("q.fifo", "a", one, now=100.0)  # type: ignore[arg-type]
    attempts.remember("other.fifo", "a", two, now=110.0)  # type: ignore[arg-type]
    assert attempts.recall("q.fifo", "a", now=100.0 + ATTEMPT_SECONDS) == one
    assert attempts.recall("q.fifo", "b", now=100.0) is None
    assert attempts.recall("q.fifo", "a", now=100.5 + ATTEMPT_SECONDS) is None  # expired
    assert attempts.recall("other.fifo", "a", now=100.5 + ATTEMPT_SECONDS) == two
    attempts.remember("q.fifo", "c", one, now=120.0)  # type: ignore[arg-type]
    attempts.remember("q.fifo", "d", one, now=121.0)  # type: ignore[arg-type]
    assert attempts.recall("other.fifo", "a", now=130.0) is None  # over the limit: the oldest goes
    attempts.forget("q.fifo")
    assert attempts.recall("q.fifo", "d", now=130.0) is None


def test_receive_request_attempt_id(client: Client, broker: Broker) -> None:
    fifo = client.create("retry.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    for body in ("m1", "m2"):
        client("SendMessage", QueueUrl=fifo, MessageBody=body, MessageGroupId="g")
    (first,) = client.receive(fifo, ReceiveRequestAttemptId="t", VisibilityTimeout=5)
    # The retry hides the message anew, for its own visibility timeout (here: none at all).
    (again,) = client.receive(fifo, ReceiveRequestAttemptId="t", VisibilityTimeout=0)
    assert again["ReceiptHandle"] == first["ReceiptHandle"]
    (later,) = client.receive(fifo)  # available at once: the retry's timeout of 0 took effect
    assert later["Body"] == "m1" and later["ReceiptHandle"] != first["ReceiptHandle"]
    # Delivered again since: the attempt's receipt is over, so the same id receives anew.
    assert client.receive(fifo, ReceiveRequestAttemptId="t") == []
    # A deleted queue forgets its attempts (a new queue of the name has other messages).
    client("DeleteQueue", QueueUrl=fifo)
    fifo = client.create("retry.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    client("SendMessage", QueueUrl=fifo, MessageBody="new", MessageGroupId="g")
    assert [m["Body"] for m in client.receive(fifo, ReceiveRequestAttemptId="t")] == ["new"]
    # The id applies only to FIFO queues: a standard queue ignores it, as SQS does.
    standard = client.create("retry-standard")
    for body in ("s1", "s2"):
        client("SendMessage", QueueUrl=standard, MessageBody=body)
    bodies = [m["Body"] for m in client.receive(standard, ReceiveRequestAttemptId="t")]
    bodies += [m["Body"] for m in client.receive(standard, ReceiveRequestAttemptId="t")]
    assert sorted(bodies) == ["s1", "s2"]
    for bad in ("", "x" * 129, "with space", 5):
        assert client.error("ReceiveMessage", QueueUrl=fifo, ReceiveRequestAttemptId=bad).code == (
            "InvalidParameterValue"
        )


def test_a_standard_queue_message_group_id_names_a_tenant(client: Client, broker: Broker) -> None:
    """SQS's fair queues: MessageGroupId on a standard queue is taken and delivered back, but its
    messages go out in parallel (no group order), and it is never among MessageAttributes."""
    url = client.create("tenants")
    attributes = {"a": {"DataType": "String", "StringValue": "v"}}
    sent = client(
        "SendMessage", QueueUrl=url, MessageBody="one", MessageGroupId="tenant-1", MessageAttributes=attributes
    )
    client("SendMessage", QueueUrl=url, MessageBody="two", MessageGroupId="tenant-1")
    assert "SequenceNumber" not in sent
    assert sent["MD5OfMessageAttributes"] == md5_of_message_attributes({"a": Attribute("String", "v")})
    got = client.receive(
        url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"]
    )
    assert [m["Body"] for m in got] == ["one", "two"]  # both at once: a tenant is no FIFO group
    assert [m["Attributes"]["MessageGroupId"] for m in got] == ["tenant-1", "tenant-1"]
    assert got[0]["MessageAttributes"] == {"a": {"DataType": "String", "StringValue": "v"}}
    assert got[0]["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert "MessageAttributes" not in got[1]
    batch = client(
        "SendMessageBatch", QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "three", "MessageGroupId": "t2"}]
    )
    assert [e["Id"] for e in batch["Successful"]] == ["1"] and batch["Failed"] == []
    (three,) = client.receive(url, AttributeNames=["MessageGroupId"])
    assert (three["Body"], three["Attributes"]) == ("three", {"MessageGroupId": "t2"})


def test_deduplication_per_message_group(client: Client) -> None:
    """DeduplicationScope messageGroup (SQS's high-throughput FIFO): one deduplication id in two
    groups is two messages; in one group, one. The id is delivered as the client gave it."""
    url = client.create(
        "scoped.fifo", FifoQueue="true", DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId"
    )
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["DeduplicationScope"] == "messageGroup"
    assert attributes["FifoThroughputLimit"] == "perMessageGroupId"

    def send(body: str, group: str, dedup: str | None = None) -> str:
        extra = {} if dedup is None else {"MessageDeduplicationId": dedup}
        return client("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId=group, **extra)["MessageId"]

    a = send("a", "g1", "same")
    b = send("b", "g2", "same")
    assert a != b and send("a again", "g1", "same") == a
    got = client.receive(
        url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"]
    )
    assert sorted(m["Body"] for m in got) == ["a", "b"]
    assert {m["Attributes"]["MessageDeduplicationId"] for m in got} == {"same"}
    assert all("MessageAttributes" not in m for m in got)
    # Content-based: the body's hash, per group too.
    client("SetQueueAttributes", QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    c = send("body", "g3")
    assert send("body", "g4") != c and send("body", "g3") == c
    received = client.receive(url, MaxNumberOfMessages=10, AttributeNames=["MessageDeduplicationId"])
    (m,) = [m for m in received if m["MessageId"] == c]
    assert m["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"body").hexdigest()
    # Back to one scope for the queue: the same id in another group is a duplicate again.
    # (with the throughput limit per queue again: perMessageGroupId needs the messageGroup scope)
    one_scope = {"DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
    client("SetQueueAttributes", QueueUrl=url, Attributes=one_scope)
    assert send("x", "g5", "q") == send("y", "g6", "q")
    # What the existing queue is, CreateQueue compares with.
    assert client.error("CreateQueue", QueueName="scoped.fifo", Attributes={
        "FifoQueue": "true", "DeduplicationScope": "messageGroup"}).code == "QueueNameExists"


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/000000000000/q", "http://h/0/q/", "https://h:1/0/q?x=1#f", "q", "/0/q", "http://h",
    "http://h/", "http://h/0/bad name", "http://h/0/" + "n" * 81, " http://h/0/q", "ht tp://h/0/q",
])
def test_the_queue_of_a_url_is_the_same_when_remembered(sqs: SqsProtocol, url: str) -> None:
    first = _outcome(sqs.queue_of, {"QueueUrl": url})
    assert first == _outcome(sqs_module._name_in_url, url)
    assert _outcome(sqs.queue_of, {"QueueUrl": url}) == first  # a second time: from what was kept, if kept
    assert (url in sqs._names_of_urls) == (not isinstance(first, tuple))  # refusals are not kept


def test_the_urls_remembered_are_bounded(sqs: SqsProtocol) -> None:
    for i in range(sqs_module._URLS_KEPT * 2 + 1):
        assert sqs.queue_of({"QueueUrl": f"http://h/0/q{i}"}) == f"q{i}"
        assert len(sqs._names_of_urls) <= sqs_module._URLS_KEPT


# -- a queue named as its own dead-letter queue ----------------------------------------------------


def _refusal(sqs: SqsProtocol, action: str, **request: Any) -> SqsError:
    with pytest.raises(SqsError) as caught:
        sqs.handle(action, request, BASE)
    return caught.value


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


# -- sqs.json on stable storage and on a full disk -------------------------------------------------


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
        synced = synced_paths(monkeypatch)
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


def test_a_missing_sqs_json_is_remembered_and_one_made_since_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue made through the library or REST has no sqs.json: every read of it raised and
    caught a FileNotFoundError (~0.9 µs; several an SQS batch). Its absence is remembered, and the
    file system still asked: a file another process writes, and a queue made again, are seen."""
    with Broker(tmp_path / "data", sync="none") as broker, Broker(tmp_path / "data", sync="none") as other:
        broker.queue("q")
        mine, theirs = Client(SqsProtocol(broker)), Client(SqsProtocol(other))
        url = mine("GetQueueUrl", QueueName="q")["QueueUrl"]
        assert mine("ListQueueTags", QueueUrl=url).get("Tags", {}) == {}
        failed = []
        real_stat = os.stat

        def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            try:
                return real_stat(path, *args, **kwargs)
            except FileNotFoundError:
                failed.append(path)
                raise

        with monkeypatch.context() as patched:
            patched.setattr(os, "stat", stat)
            for _ in range(3):
                assert mine("ListQueueTags", QueueUrl=url).get("Tags", {}) == {}
        assert [p for p in failed if str(p).endswith(SIDECAR)] == []
        theirs("TagQueue", QueueUrl=url, Tags={"team": "a"})  # another process writes it
        assert mine("ListQueueTags", QueueUrl=url)["Tags"] == {"team": "a"}
        other.delete("q")
        other.queue("q")  # made again, through the library: no sqs.json
        assert mine("ListQueueTags", QueueUrl=url).get("Tags", {}) == {}
        theirs("TagQueue", QueueUrl=url, Tags={"team": "b"})
        assert mine("ListQueueTags", QueueUrl=url)["Tags"] == {"team": "b"}
