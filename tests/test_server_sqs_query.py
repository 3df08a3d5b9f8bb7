"""SQS's Query protocol (form-encoded ``Action=...`` requests, XML answers), which the AWS SDK for
Java 1.x, boto3 before 1.34 and the AWS CLI before 2.15 speak: ``sqs_query``'s pure functions,
then the real server driven by boto3 with botocore's own model of that protocol
(``test_server_harness.QUERY_MODEL``: botocore serializes the requests and parses the XML), its
signatures checked (``--aws-key``), beside a client of the JSON protocol on the same queues."""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server_harness import ServerProcess, botocore_session, module_server, sqs_client
from test_server_sqs import error_code, new_name

from journalq.server.digests import md5_of_body
from journalq.server.sqs import BAD_CHARACTER, SqsError
from journalq.server.sqs_query import NAMESPACE, answer_xml, error_xml, request_of

KEY, SECRET = "AKIDQUERYTEST", "query-test-secret"
NS = {"sqs": NAMESPACE}


# -- requests -------------------------------------------------------------------------------------


def params(text: str) -> list[tuple[str, str]]:
    return [tuple(pair.split("=", 1)) for pair in text.split("&")]  # type: ignore[misc]


def test_numbered_parameters_become_the_payload_a_json_request_has() -> None:
    action, payload = request_of(params(
        "Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http://h/000000000000/q"
        "&SendMessageBatchRequestEntry.10.Id=last&SendMessageBatchRequestEntry.10.MessageBody=z"
        "&SendMessageBatchRequestEntry.2.Id=second&SendMessageBatchRequestEntry.2.MessageBody=b"
        "&SendMessageBatchRequestEntry.2.DelaySeconds=5"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.1.Name=size"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.DataType=Number"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.StringValue=3"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.2.Name=tags"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.2.Value.DataType=String"
        "&SendMessageBatchRequestEntry.2.MessageAttribute.2.Value.StringListValue.1=x"
        "&SendMessageBatchRequestEntry.1.Id=first&SendMessageBatchRequestEntry.1.MessageBody=a"
        "&X-Amz-Date=20261201T000000Z"
    ))
    assert action == "SendMessageBatch"
    assert payload == {
        "QueueUrl": "http://h/000000000000/q",
        "Entries": [
            {"Id": "first", "MessageBody": "a"},
            {"Id": "second", "MessageBody": "b", "DelaySeconds": 5, "MessageAttributes": {
                "size": {"DataType": "Number", "StringValue": "3"},
                "tags": {"DataType": "String", "StringListValues": ["x"]},
            }},
            {"Id": "last", "MessageBody": "z"},
        ],
    }
    assert request_of(params(
        "Action=CreateQueue&QueueName=q&Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=5"
        "&Tag.1.Key=team&Tag.1.Value=core"
    )) == ("CreateQueue", {"QueueName": "q", "Attributes": {"VisibilityTimeout": "5"}, "tags": {"team": "core"}})
    assert request_of(params("Action=TagQueue&Tag.1.Key=a&Tag.1.Value=1"), "/000000000000/q") == (
        "TagQueue", {"Tags": {"a": "1"}, "QueueUrl": "/000000000000/q"})  # the queue it was posted to
    assert request_of(params("Action=GetQueueAttributes&QueueUrl=u&AttributeName=")) == (
        "GetQueueAttributes", {"QueueUrl": "u", "AttributeNames": []})  # an empty list, as the Java SDK sends it
    assert request_of(params(
        "Action=ReceiveMessage&QueueUrl=u&AttributeName.1=All&MessageAttributeName.1=.*&MaxNumberOfMessages=10"
        "&WaitTimeSeconds=soon"
    ), "/000000000000/other") == ("ReceiveMessage", {
        "QueueUrl": "u", "AttributeNames": ["All"], "MessageAttributeNames": [".*"], "MaxNumberOfMessages": 10,
        "WaitTimeSeconds": "soon",  # not an integer: left for the checks to refuse by name, as JSON's
    })


@pytest.mark.parametrize("text, named", [
    ("Action=GetQueueAttributes&AttributeName.0=All", "AttributeName.0"),
    ("Action=GetQueueAttributes&AttributeName.one=All", "AttributeName.one"),
    ("Action=GetQueueAttributes&AttributeName.\u00b2=All", "AttributeName.\u00b2"),
    ("Action=GetQueueAttributes&AttributeName=All", "AttributeName"),
    ("Action=GetQueueAttributes&AttributeName.1.x=All", "AttributeName.1"),
    ("Action=CreateQueue&QueueName=q&Attribute.1.Value=5", "Attribute.1"),
    ("Action=CreateQueue&QueueName=q&Attribute.1=x&Attribute.1.Name=y", "Attribute.1.Name"),
    ("Action=DeleteMessageBatch&DeleteMessageBatchRequestEntry.1=x", "DeleteMessageBatchRequestEntry.1"),
])
def test_a_malformed_numbered_parameter_is_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(SqsError) as info:
        request_of(params(text))
    assert info.value.code == "InvalidParameterValue" and f"The parameter {named} is malformed" in info.value.message


def test_a_request_without_an_action_is_refused() -> None:
    with pytest.raises(SqsError) as info:
        request_of(params("Version=2012-11-05&QueueName=q"))
    assert info.value.code == "MissingAction" and info.value.status == 400


# -- answers -------------------------------------------------------------------------------------


def parsed(xml: bytes) -> ET.Element:
    return ET.fromstring(xml)


def test_an_answer_keeps_every_character_of_a_body_that_xml_can_carry() -> None:
    body = "a <b> & c\r\nd\t\U0001f600"
    answer = parsed(answer_xml("ReceiveMessage", {"Messages": [
        {"MessageId": "0.t", "ReceiptHandle": "r", "MD5OfBody": md5_of_body(body), "Body": body,
         "Attributes": {"ApproximateReceiveCount": "1"},
         "MessageAttributes": {"b": {"DataType": "Binary", "BinaryValue": "AAE="}}},
    ]}, "id-1"))
    assert answer.tag == f"{{{NAMESPACE}}}ReceiveMessageResponse"
    (message,) = answer.findall("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert message.findtext("sqs:Body", namespaces=NS) == body  # the carriage return too (&#xD;)
    assert message.findtext("sqs:MD5OfBody", namespaces=NS) == md5_of_body(body)
    assert message.findtext("sqs:Attribute[sqs:Name='ApproximateReceiveCount']/sqs:Value", namespaces=NS) == "1"
    attribute = message.find("sqs:MessageAttribute[sqs:Name='b']/sqs:Value", NS)
    assert attribute is not None and attribute.findtext("sqs:BinaryValue", namespaces=NS) == "AAE="
    assert answer.findtext("sqs:ResponseMetadata/sqs:RequestId", namespaces=NS) == "id-1"


def test_a_body_xml_cannot_carry_goes_out_with_u_fffd_and_the_digest_of_what_went_out() -> None:
    """A body sent through the REST API may hold any character; XML 1.0 cannot carry some."""
    body = "a\x01b\x00"
    answer = parsed(answer_xml("ReceiveMessage", {"Messages": [
        {"MessageId": "0.t", "ReceiptHandle": "r", "MD5OfBody": md5_of_body(body), "Body": body}]}, "id"))
    message = answer.find("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert message is not None and message.findtext("sqs:Body", namespaces=NS) == "a\ufffdb\ufffd"
    assert message.findtext("sqs:MD5OfBody", namespaces=NS) == md5_of_body("a\ufffdb\ufffd")


def test_batch_entries_are_named_by_their_action_and_actions_without_a_result_have_none() -> None:
    answer = parsed(answer_xml("DeleteMessageBatch", {
        "Successful": [{"Id": "a"}], "Failed": [{"Id": "b", "SenderFault": True, "Code": "X", "Message": "m"}]}, "id"))
    result = answer.find("sqs:DeleteMessageBatchResult", NS)
    assert result is not None
    assert result.findtext("sqs:DeleteMessageBatchResultEntry/sqs:Id", namespaces=NS) == "a"
    assert result.findtext("sqs:BatchResultErrorEntry/sqs:SenderFault", namespaces=NS) == "true"
    assert [child.tag.split("}")[1] for child in parsed(answer_xml("DeleteMessage", {}, "id"))] == ["ResponseMetadata"]


def test_an_error_answer_has_the_query_code_and_who_is_at_fault() -> None:
    error = parsed(error_xml(SqsError("QueueDoesNotExist", "The specified queue does not exist."), "id-2"))
    assert error.tag == f"{{{NAMESPACE}}}ErrorResponse"
    assert error.findtext("sqs:Error/sqs:Code", namespaces=NS) == "AWS.SimpleQueueService.NonExistentQueue"
    assert error.findtext("sqs:Error/sqs:Type", namespaces=NS) == "Sender"
    assert error.findtext("sqs:RequestId", namespaces=NS) == "id-2"
    failed = parsed(error_xml(SqsError("ServiceUnavailable", "a <full> disk", status=503, sender=False), "id"))
    assert failed.findtext("sqs:Error/sqs:Type", namespaces=NS) == "Receiver"
    assert failed.findtext("sqs:Error/sqs:Message", namespaces=NS) == "a <full> disk"


# -- the real server, through botocore's Query protocol ---------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "--aws-key", f"{KEY}:{SECRET}")


@pytest.fixture(scope="module")
def query(server: ServerProcess) -> Any:
    client = sqs_client(server.url, KEY, SECRET, query=True)
    assert client.meta.service_model.protocol == "query"
    return client


@pytest.fixture(scope="module")
def json_sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url, KEY, SECRET)


def test_a_query_client_sends_receives_and_deletes_with_attributes_and_digests(query: Any, json_sqs: Any) -> None:
    name = new_name("query")
    url = query.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "30"}, tags={"team": "core"})["QueueUrl"]
    assert url.endswith(f"/000000000000/{name}")
    assert query.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in query.list_queues(QueueNamePrefix=name)["QueueUrls"]
    body = "hello <&> \r\n"
    attributes = {"n": {"DataType": "Number", "StringValue": "3"},
                  "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}
    sent = query.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == json_sqs.send_message(
        QueueUrl=url, MessageBody="via json", MessageAttributes=attributes)["MD5OfMessageAttributes"]
    batch = query.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "one"}, {"Id": "b", "MessageBody": "two", "DelaySeconds": 600},
        {"Id": "c", "MessageBody": "three", "DelaySeconds": 100_000}])
    assert [e["Id"] for e in batch["Successful"]] == ["a", "b"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in batch["Failed"]] == [("c", "InvalidParameterValue", True)]

    got = query.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                MessageAttributeNames=["All"], WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == [body, "via json", "one"]  # "two" is delayed
    first = got[0]
    assert first["MD5OfBody"] == sent["MD5OfMessageBody"] and first["MessageId"] == sent["MessageId"]
    assert first["MessageAttributes"] == attributes
    assert first["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1" and int(first["Attributes"]["SentTimestamp"]) > 0

    query.change_message_visibility(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=0)
    changed = query.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": got[2]["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "y", "ReceiptHandle": "not-a-receipt", "VisibilityTimeout": 0}])
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert [(e["Id"], e["Code"]) for e in changed["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    query.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    again = json_sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]  # the JSON client's turn
    assert [m["Body"] for m in again] == ["via json", "one"]
    deleted = query.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(again)])
    assert [e["Id"] for e in deleted["Successful"]] == ["0", "1"] and not deleted.get("Failed")
    counts = query.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesDelayed"]) == ("0", "1")
    assert counts["VisibilityTimeout"] == "30"


def test_queue_attributes_tags_purges_and_errors_through_the_query_protocol(query: Any) -> None:
    name = new_name("query")
    url = query.create_queue(QueueName=name)["QueueUrl"]
    dead = query.create_queue(QueueName=name + "-dead")["QueueUrl"]
    dead_arn = query.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    query.set_queue_attributes(QueueUrl=url, Attributes={
        "RedrivePolicy": f'{{"deadLetterTargetArn": "{dead_arn}", "maxReceiveCount": "2"}}', "DelaySeconds": "0"})
    assert query.list_dead_letter_source_queues(QueueUrl=dead)["queueUrls"] == [url]
    query.tag_queue(QueueUrl=url, Tags={"a": "1", "b": "2"})
    query.untag_queue(QueueUrl=url, TagKeys=["a"])
    assert query.list_queue_tags(QueueUrl=url)["Tags"] == {"b": "2"}
    query.send_message(QueueUrl=url, MessageBody="m")
    query.purge_queue(QueueUrl=url)
    assert "Messages" not in query.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    with pytest.raises(ClientError) as info:
        query.purge_queue(QueueUrl=url)  # once a minute, as on SQS
    assert error_code(info) == "AWS.SimpleQueueService.PurgeQueueInProgress"
    with pytest.raises(ClientError) as info:
        query.get_queue_url(QueueName=new_name("query"))
    assert error_code(info) == "AWS.SimpleQueueService.NonExistentQueue"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as info:
        query.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert error_code(info) == "InvalidParameterValue"
    query.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as info:
        query.send_message(QueueUrl=url, MessageBody="m")
    assert error_code(info) == "AWS.SimpleQueueService.NonExistentQueue"


def test_a_wrong_signature_is_refused_in_xml(server: ServerProcess) -> None:
    impostor = sqs_client(server.url, KEY, "not-the-secret", query=True)
    with pytest.raises(ClientError) as info:
        impostor.list_queues()
    assert error_code(info) == "SignatureDoesNotMatch"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


# -- requests to the queue's URL, as the Java SDK sends them ------------------------------------------


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that asks for no signature: requests made by hand."""
    yield from module_server(tmp_path_factory)


def test_a_form_posted_to_the_queue_s_url_names_the_queue_and_a_get_takes_its_action_from_the_query(
    open_server: ServerProcess,
) -> None:
    """The AWS SDK for Java 1.x posts each request of a queue to the queue's URL and leaves the
    QueueUrl parameter out; the Query protocol also takes GET with the parameters in the URL."""
    name = new_name("query")
    form = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    with httpx.Client(base_url=open_server.url, timeout=30) as http:
        made = http.post("/", content=f"Action=CreateQueue&QueueName={name}", headers=form)
        assert made.status_code == 200 and made.headers["content-type"] == "text/xml", made.text
        sent = http.post(f"/000000000000/{name}", headers=form,
                         content=b"Action=SendMessage&MessageBody=" + base64.b64encode(b"hi").replace(b"=", b"%3D"))
        assert sent.status_code == 200, sent.text
        message_id = ET.fromstring(sent.content).findtext("sqs:SendMessageResult/sqs:MessageId", namespaces=NS)
        assert message_id is not None
        got = http.get(f"/000000000000/{name}", params={"Action": "ReceiveMessage", "AttributeName.1": "All"})
        assert got.status_code == 200, got.text
        message = ET.fromstring(got.content).find("sqs:ReceiveMessageResult/sqs:Message", NS)
        assert message is not None and message.findtext("sqs:MessageId", namespaces=NS) == message_id
        assert message.findtext("sqs:Body", namespaces=NS) == "aGk="
        missing = http.post("/000000000000/no-such-queue", content="Action=PurgeQueue", headers=form)
        assert missing.status_code == 400 and "AWS.SimpleQueueService.NonExistentQueue" in missing.text
        flood = http.post("/", content="Action=ListQueues" + "&x=1" * 5000, headers=form)
        assert flood.status_code == 400 and "more than 4000 parameters" in flood.text
        not_utf8 = http.post("/", content=b"Action=ListQueues&QueueNamePrefix=%ff", headers=form)
        assert not_utf8.status_code == 400 and "not UTF-8" in not_utf8.text
        latency = http.get("/metrics").text  # by action, as JSON's requests are
        assert 'journalq_request_seconds_count{api="sqs",operation="SendMessage",status="200"}' in latency
        assert 'journalq_request_seconds_count{api="sqs",operation="ReceiveMessage",status="200"}' in latency
        # mq's REST API is where it was: a form posted to a queue's messages is a message.
        assert http.put(f"/{name}-rest").status_code == 201
        posted = http.post(f"/{name}-rest/messages", content="Action=SendMessage", headers=form)
        assert posted.status_code == 201 and http.get(f"/{name}-rest/messages").content == b"Action=SendMessage"


# -- round trips through botocore's own serializer and parser of the Query protocol -----------------


MODEL = botocore_session(query=True).get_service_model("sqs")
SQS_CHARACTER = st.characters(blacklist_categories=("Cs",)).filter(lambda c: BAD_CHARACTER.match(c) is None)
TEXT = st.text(SQS_CHARACTER, max_size=12)
NAME = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,8}", fullmatch=True)
BLOB = st.binary(max_size=8)
ATTRIBUTE = st.one_of(
    st.builds(lambda v: {"DataType": "String", "StringValue": v}, TEXT),
    st.builds(lambda v: {"DataType": "Number.int", "StringValue": v}, st.integers().map(str)),
    st.builds(lambda v: {"DataType": "Binary", "BinaryValue": v}, BLOB),
    st.builds(lambda v: {"DataType": "String", "StringListValues": v}, st.lists(TEXT, max_size=2)),
)
MESSAGE = st.fixed_dictionaries({"MessageBody": TEXT}, optional={
    "DelaySeconds": st.integers(0, 900),
    "MessageAttributes": st.dictionaries(NAME, ATTRIBUTE, max_size=3),
    "MessageSystemAttributes": st.fixed_dictionaries({"AWSTraceHeader": st.builds(
        lambda v: {"DataType": "String", "StringValue": v}, TEXT)}),
    "MessageGroupId": NAME, "MessageDeduplicationId": NAME,
})
ENTRY_IDS = st.lists(NAME, min_size=1, max_size=10, unique=True)
REQUESTS = st.one_of(
    st.tuples(st.just("SendMessage"), MESSAGE.map(lambda m: {"QueueUrl": "u", **m})),
    st.tuples(st.just("SendMessageBatch"), ENTRY_IDS.flatmap(lambda ids: st.tuples(*[
        MESSAGE.map(lambda m, i=i: {"Id": i, **m}) for i in ids])).map(lambda entries: {
            "QueueUrl": "u", "Entries": list(entries)})),
    st.tuples(st.just("CreateQueue"), st.fixed_dictionaries({"QueueName": NAME}, optional={
        "Attributes": st.dictionaries(st.sampled_from(["DelaySeconds", "VisibilityTimeout", "Policy"]), TEXT),
        "tags": st.dictionaries(NAME, TEXT, max_size=3)})),
    st.tuples(st.just("ReceiveMessage"), st.fixed_dictionaries({"QueueUrl": TEXT}, optional={
        "AttributeNames": st.lists(st.sampled_from(["All", "SentTimestamp"]), max_size=2),
        "MessageAttributeNames": st.lists(NAME, max_size=3), "MaxNumberOfMessages": st.integers(-5, 20),
        "VisibilityTimeout": st.integers(0, 43200), "WaitTimeSeconds": st.integers(0, 20),
        "ReceiveRequestAttemptId": NAME})),
    st.tuples(st.just("ChangeMessageVisibilityBatch"), ENTRY_IDS.map(lambda ids: {"QueueUrl": "u", "Entries": [
        {"Id": i, "ReceiptHandle": f"r{n}", "VisibilityTimeout": n} for n, i in enumerate(ids)]})),
    st.tuples(st.just("TagQueue"), st.builds(lambda tags: {"QueueUrl": "u", "Tags": tags},
                                              st.dictionaries(NAME, TEXT, max_size=3))),
    st.tuples(st.just("UntagQueue"), st.builds(lambda keys: {"QueueUrl": "u", "TagKeys": keys},
                                                st.lists(NAME, max_size=3))),
)


def _as_json(value: Any) -> Any:
    """A request's parameters as a JSON body carries them: blobs in base64; empty maps left out,
    as the Query protocol cannot send them (an empty list it sends as its name alone)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items() if v != {}}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(REQUESTS)
def test_what_botocore_serializes_reads_as_the_json_request(request: tuple[str, dict[str, Any]]) -> None:
    from botocore.serialize import create_serializer

    action, parameters = request
    serialized = create_serializer("query").serialize_to_request(parameters, MODEL.operation_model(action))
    form = [(name, str(value)) for name, value in serialized["body"].items()]  # (as urlencode sends them)
    assert request_of(form) == (action, _as_json(parameters))


RECEIVED = st.fixed_dictionaries({
    "MessageId": NAME, "ReceiptHandle": NAME, "Body": TEXT,
    "Attributes": st.dictionaries(st.sampled_from(["SentTimestamp", "ApproximateReceiveCount", "SenderId"]),
                                  st.integers(0, 2**40).map(str)),
    "MessageAttributes": st.dictionaries(NAME, st.one_of(
        st.builds(lambda v: {"DataType": "String", "StringValue": v}, TEXT),
        st.builds(lambda v: {"DataType": "Binary", "BinaryValue": base64.b64encode(v).decode()}, BLOB)), max_size=3),
}).map(lambda m: {**m, "MD5OfBody": md5_of_body(m["Body"])})
RESULTS = st.one_of(
    st.tuples(st.just("ReceiveMessage"), st.builds(lambda ms: {"Messages": ms}, st.lists(RECEIVED, max_size=3))),
    st.tuples(st.just("SendMessageBatch"), st.fixed_dictionaries({
        "Successful": st.lists(st.fixed_dictionaries({"Id": NAME, "MessageId": NAME, "MD5OfMessageBody": NAME},
                                                     optional={"SequenceNumber": NAME}), max_size=3),
        "Failed": st.lists(st.fixed_dictionaries({"Id": NAME, "SenderFault": st.booleans(), "Code": NAME,
                                                  "Message": TEXT}), max_size=3)})),
    st.tuples(st.just("GetQueueAttributes"), st.builds(lambda a: {"Attributes": a}, st.dictionaries(NAME, TEXT))),
    st.tuples(st.just("ListQueueTags"), st.builds(lambda t: {"Tags": t}, st.dictionaries(NAME, TEXT))),
    st.tuples(st.just("ListQueues"), st.fixed_dictionaries({"QueueUrls": st.lists(TEXT, max_size=3)},
                                                           optional={"NextToken": NAME})),
    st.tuples(st.just("ListDeadLetterSourceQueues"), st.fixed_dictionaries(
        {"queueUrls": st.lists(TEXT, max_size=3)}, optional={"NextToken": NAME})),
    st.tuples(st.sampled_from(["DeleteMessageBatch", "ChangeMessageVisibilityBatch"]), st.fixed_dictionaries({
        "Successful": st.lists(st.builds(lambda i: {"Id": i}, NAME), max_size=3),
        "Failed": st.lists(st.fixed_dictionaries({"Id": NAME, "SenderFault": st.booleans(), "Code": NAME,
                                                  "Message": TEXT}), max_size=3)})),
    st.tuples(st.sampled_from(["CreateQueue", "GetQueueUrl"]), st.builds(lambda u: {"QueueUrl": u}, TEXT)),
    st.tuples(st.just("SendMessage"), st.fixed_dictionaries({"MessageId": NAME, "MD5OfMessageBody": NAME}, optional={
        "MD5OfMessageAttributes": NAME, "MD5OfMessageSystemAttributes": NAME, "SequenceNumber": NAME})),
    st.tuples(st.just("StartMessageMoveTask"), st.builds(lambda h: {"TaskHandle": h}, TEXT)),
    st.tuples(st.just("CancelMessageMoveTask"), st.builds(
        lambda n: {"ApproximateNumberOfMessagesMoved": n}, st.integers(0, 2**40))),
    st.tuples(st.just("ListMessageMoveTasks"), st.builds(lambda r: {"Results": r}, st.lists(st.fixed_dictionaries({
        "TaskHandle": NAME, "Status": st.sampled_from(["RUNNING", "COMPLETED"]), "SourceArn": NAME,
        "ApproximateNumberOfMessagesMoved": st.integers(0, 2**40), "StartedTimestamp": st.integers(0, 2**45)}),
        max_size=2))),
)


def _as_parsed(value: Any, key: str = "") -> Any:
    """A result as botocore parses it from XML: binary values decoded, empty lists and maps not
    there (XML has no element for them)."""
    if isinstance(value, dict):
        return {k: _as_parsed(v, k) for k, v in value.items() if v != [] and v != {}}
    if isinstance(value, list):
        return [_as_parsed(v) for v in value]
    return base64.b64decode(value) if key == "BinaryValue" else value


@settings(max_examples=300, deadline=None)
@given(RESULTS)
def test_botocore_parses_each_answer_as_the_result_it_was(result: tuple[str, dict[str, Any]]) -> None:
    from botocore.parsers import create_parser

    action, fields = result
    parsed_answer = create_parser("query").parse(
        {"body": answer_xml(action, fields, "id-3"), "headers": {}, "status_code": 200},
        MODEL.operation_model(action).output_shape)
    assert parsed_answer.pop("ResponseMetadata")["RequestId"] == "id-3"
    assert parsed_answer == _as_parsed(fields)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["SendMessageBatch", "CreateQueue", "TagQueue", "ReceiveMessage"]), st.lists(st.tuples(
    st.lists(st.sampled_from(["Entries", "SendMessageBatchRequestEntry", "Attribute", "Tag", "Name", "Key", "Value",
                              "MessageAttribute", "AttributeName", "1", "2", "0", "x", "\u00b2", ""]),
             min_size=1, max_size=4).map(".".join),
    st.sampled_from(["", "5", "x"])), max_size=8))
def test_any_form_reads_as_a_request_or_is_refused_with_an_sqs_error(action: str, form: list[tuple[str, str]]) -> None:
    """Whatever a client sends, the translation answers with a request or an ``SqsError`` (a 400),
    never another exception (a 500)."""
    try:
        request_of([("Action", action), *form], "/000000000000/q")
    except SqsError as exc:
        assert exc.status == 400
