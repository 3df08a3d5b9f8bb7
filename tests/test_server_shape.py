"""The server's APIs over the shapes of what the library makes: a topic whose channels are its own
(made with ``broker.topic``, none named ``default``) takes sends, deletes and purges through the
server without being given a channel ``default``, which would take every message of it again and
hold its garbage collection back for a consumer that never comes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from test_server_rest_ids import served
from test_server_sqs_unit import BASE, Client, broker, client, sqs  # noqa: F401 (fixtures)

from journalq.queue import Broker


def make_topic(data: Path, **settings: object) -> list[str]:
    """Topic ``t`` with the channels ``a`` and ``b``, and one message; returns its channels."""
    with Broker(data) as broker:
        topic = broker.topic("t", **settings)
        topic.channel("a")
        topic.channel("b")
        topic.send(b"first")
        return topic.channel_names()


def channels_of(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "t" / "channels").iterdir())


def test_a_rest_send_to_a_library_topic_makes_no_default_channel_and_answers_the_topic_id(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        sent = [await client.post("/t/messages", content=b"m%d" % i) for i in range(3)]
        # Expect: 100-continue looks the queue up before the body: that made the channel too.
        sent.append(await client.post("/t/messages", content=b"m3", headers={"expect": "100-continue"}))
        return [*sent, await client.get("/t")]

    *sent, info = served(tmp_path, talk)
    assert [answer.status_code for answer in sent] == [201] * 4, [answer.text for answer in sent]
    assert channels_of(tmp_path) == ["a", "b"]
    counts = info.json()
    assert "default" not in counts["channels"] and counts["channels"]["a"]["available"] == 5
    with Broker(tmp_path) as broker:
        got = broker.topic("t").channel("a").receive(10)
    # The ids answered are the topic's own: what its channels' consumers see of the messages.
    assert [answer.headers["x-message-id"] for answer in sent] == [m.id for m in got[1:]]


def test_consumed_segments_of_a_topic_sent_to_through_rest_are_collected(tmp_path: Path) -> None:
    """The bug's harm: the channel ``default`` a send made read nothing, so the topic's gc kept
    every segment that its own channels had consumed, for ever."""
    make_topic(tmp_path, segment_size=4096, retention_seconds=None)

    async def talk(client: httpx.AsyncClient) -> None:
        for _ in range(12):
            assert (await client.post("/t/messages", content=b"x" * 1000)).status_code == 201

    served(tmp_path, talk)
    with Broker(tmp_path) as broker:
        topic = broker.topic("t")
        for name in ("a", "b"):
            channel = topic.channel(name)
            while got := channel.receive(10):
                channel.delete_many([m.receipt for m in got])
            channel.commit_cursor()
        assert topic.gc(), "consumed segments stayed"
        assert topic.channel_names() == ["a", "b"]


def test_a_rest_delete_by_id_of_a_library_topic_is_refused_and_makes_no_channel(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        message_id = (await client.post("/t/messages", content=b"m")).headers["x-message-id"]
        return await client.delete(f"/t/messages/{message_id}")

    refused = served(tmp_path, talk)
    assert refused.status_code == 404, refused.text
    assert "'default'" in refused.json()["error"] and "a, b" in refused.json()["error"]
    assert channels_of(tmp_path) == ["a", "b"]
    with Broker(tmp_path) as broker:
        assert broker.topic("t").channel("a").stats().available == 2  # deleted from no channel


def test_an_sqs_send_to_a_library_topic_makes_no_default_channel(client: Client, broker: Broker) -> None:  # noqa: F811
    topic = broker.topic("t")
    topic.channel("a")
    topic.channel("b")
    url = client("GetQueueUrl", QueueName="t")["QueueUrl"]
    one = client("SendMessage", QueueUrl=url, MessageBody="one")
    two = client("SendMessage", QueueUrl=url, MessageBody="two", MessageAttributes={
        "n": {"DataType": "Number", "StringValue": "2"}})
    batch = client("SendMessageBatch", QueueUrl=url, Entries=[{"Id": "x", "MessageBody": "three"}])
    assert topic.channel_names() == ["a", "b"]
    got = topic.channel("b").receive(10)
    assert [m.body for m in got] == [b"one", b"two", b"three"]
    assert [one["MessageId"], two["MessageId"], batch["Successful"][0]["MessageId"]] == [m.id for m in got]
    # Its counts are still left out (it has no SQS consumer), not every message counted unread.
    attributes = client("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert not any(name.startswith("ApproximateNumberOfMessages") for name in attributes)
    assert topic.channel_names() == ["a", "b"]


def test_sqs_purge_of_a_library_topic_purges_every_channel_and_makes_none(
    client: Client, broker: Broker,  # noqa: F811
) -> None:
    topic = broker.topic("t")
    for name in ("a", "b"):
        topic.channel(name)
    topic.send_many([b"1", b"2"])
    url = client("GetQueueUrl", QueueName="t")["QueueUrl"]
    assert client("PurgeQueue", QueueUrl=url) == {}
    assert topic.channel_names() == ["a", "b"]
    assert [topic.channel(name).stats().available for name in ("a", "b")] == [0, 0]
    topic.send(b"3")  # what comes after the purge is received
    assert [m.body for m in topic.channel("a").receive(10)] == [b"3"]


def test_sqs_deletes_and_visibility_changes_on_a_library_topic_make_no_channel(
    client: Client, broker: Broker,  # noqa: F811
) -> None:
    topic = broker.topic("t")
    topic.channel("a")
    topic.send(b"1")
    receipt = topic.channel("a").receive(1)[0].receipt  # a's, not the SQS queue's
    url = client("GetQueueUrl", QueueName="t")["QueueUrl"]
    for action, request in [
        ("DeleteMessage", {"ReceiptHandle": receipt}),
        ("ChangeMessageVisibility", {"ReceiptHandle": receipt, "VisibilityTimeout": 0}),
    ]:
        assert client.error(action, QueueUrl=url, **request).code == "ReceiptHandleIsInvalid"
    for action, extra in [("DeleteMessageBatch", {}), ("ChangeMessageVisibilityBatch", {"VisibilityTimeout": 0})]:
        answer = client(action, QueueUrl=url, Entries=[{"Id": "e", "ReceiptHandle": receipt, **extra}])
        assert answer["Successful"] == [] and answer["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    assert topic.channel_names() == ["a"]
    assert topic.channel("a").stats().in_flight == 1  # a's receipt acted on nothing


def test_sends_to_a_queue_still_answer_ids_with_its_token(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/q")
        sent = await client.post("/q/messages", content=b"m")
        return [sent, await client.delete(f"/q/messages/{sent.headers['x-message-id']}")]

    sent, deleted = served(tmp_path, talk)
    assert sent.headers["x-message-id"].startswith("0.") and deleted.status_code == 204


@pytest.mark.parametrize("shards", [1, 2])
def test_a_send_to_a_topic_with_no_channel_makes_none(tmp_path: Path, shards: int) -> None:
    with Broker(tmp_path) as broker:
        broker.topic("t", shards=shards)

    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/t/messages", content=b"m")

    assert served(tmp_path, talk).status_code == 201
    with Broker(tmp_path) as broker:
        assert broker.topic("t").channel_names() == []


def test_sqs_refuses_a_fifo_queue_that_a_standard_queue_names_as_dead_letter_queue(
    client: Client, broker: Broker,  # noqa: F811
) -> None:
    broker.queue("jobs", max_receive_count=2, dead_letter_queue="later.fifo")  # not there yet: made standard
    error = client.error("CreateQueue", QueueName="later.fifo", Attributes={"FifoQueue": "true"})
    assert error.code == "InvalidParameterValue" and "'jobs'" in error.message
    assert not broker.exists("later.fifo")
    url = client.create("dlq.fifo", FifoQueue="true")
    policy = '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlq.fifo", "maxReceiveCount": 2}'
    jobs = client("GetQueueUrl", QueueName="jobs")["QueueUrl"]
    assert client.error("SetQueueAttributes", QueueUrl=jobs, Attributes={"RedrivePolicy": policy}).code == (
        "InvalidParameterValue")
    assert url


def test_sqs_sends_to_a_sharded_fifo_queue_answer_sequence_numbers(client: Client, broker: Broker) -> None:  # noqa: F811
    """A FIFO queue made through the library with shards: SendMessage stored the message, then
    failed (500) making its SequenceNumber of the id "SHARD.OFFSET"; the client, told it failed,
    sent it again. Each shard's offsets start at 0: the shard is the number's first digits."""
    broker.queue("f", fifo=True, shards=2)
    url = client("GetQueueUrl", QueueName="f")["QueueUrl"]
    sent = [client("SendMessage", QueueUrl=url, MessageBody="m", MessageGroupId=f"g{i}",
                   MessageDeduplicationId=f"d{i}") for i in range(4)]
    numbers = [answer["SequenceNumber"] for answer in sent]
    assert all(len(n) == 20 and n.isdigit() for n in numbers) and len(set(numbers)) == 4
    got = client.receive(url, MaxNumberOfMessages=10, AttributeNames=["SequenceNumber"])
    by_id = {answer["MessageId"]: answer["SequenceNumber"] for answer in sent}
    assert {m["MessageId"]: m["Attributes"]["SequenceNumber"] for m in got} == {m["MessageId"]: by_id[m["MessageId"]]
                                                                               for m in got}
    assert got


def test_sqs_sequence_numbers_of_a_fifo_queue_are_its_offsets(client: Client) -> None:
    url = client.create("plain.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    assert client("SendMessage", QueueUrl=url, MessageBody="m", MessageGroupId="g")["SequenceNumber"] == "0" * 20
    (got,) = client.receive(url, AttributeNames=["SequenceNumber"])
    assert got["Attributes"]["SequenceNumber"] == "0" * 20


def test_a_put_of_a_library_topic_finds_it_and_makes_no_channel(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.put("/t"), await client.put("/t", params={"shards": 2})]

    found, other_shards = served(tmp_path, talk)
    assert found.status_code == 200 and found.json() == {"name": "t", "created": False}
    assert other_shards.status_code == 409
    assert channels_of(tmp_path) == ["a", "b"]


def test_a_refused_sqs_receive_of_a_library_topic_makes_no_channel(client: Client, broker: Broker) -> None:  # noqa: F811
    topic = broker.topic("t")
    topic.channel("a")
    url = client("GetQueueUrl", QueueName="t")["QueueUrl"]
    for bad in ({"MaxNumberOfMessages": 11}, {"WaitTimeSeconds": 21}, {"VisibilityTimeout": -1},
                {"AttributeNames": "All"}, {"ReceiveRequestAttemptId": " "}):
        assert client.error("ReceiveMessage", QueueUrl=url, **bad).code == "InvalidParameterValue", bad
    assert topic.channel_names() == ["a"]
    assert client.error("ReceiveMessage", QueueUrl=url + "-missing", MaxNumberOfMessages=11).code == (
        "QueueDoesNotExist")  # the queue is looked for first, as before


def test_a_refused_rest_fetch_of_a_library_topic_makes_no_channel(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.get("/t/messages", params={"visibility_timeout": value}) for value in (-1, 43201)]

    refused = served(tmp_path, talk)
    assert [answer.status_code for answer in refused] == [400, 400], [answer.text for answer in refused]
    assert all("visibility_timeout" in answer.json()["error"] for answer in refused)
    assert channels_of(tmp_path) == ["a", "b"]


def test_a_message_move_from_a_dead_letter_topic_with_channels_of_its_own_is_refused(
    client: Client, broker: Broker,  # noqa: F811
) -> None:
    """A move reads the dead-letter queue through the SQS queue's channel ``default``: made on a
    topic whose own channels had read (and finished) its dead letters, it took them all again and
    sent every one back to its source, handled already. A dead-letter queue made by the first
    move (no channel at all) is moved from as before."""
    dead = broker.topic("dead")
    dead.channel("audit")
    source = broker.queue("jobs", max_receive_count=1, dead_letter_queue="dead")
    source.send(b"poison")
    source.receive(1, visibility_timeout=0)
    assert source.receive(1) == []  # moved
    arn = "arn:aws:sqs:us-east-1:000000000000:"
    error = client.error("StartMessageMoveTask", SourceArn=arn + "dead")
    assert error.code == "InvalidParameterValue" and "audit" in error.message
    assert dead.channel_names() == ["audit"]
    made = broker.queue("tasks", max_receive_count=1, dead_letter_queue="made-by-move")
    made.send(b"poison")
    made.receive(1, visibility_timeout=0)
    assert made.receive(1) == [] and broker.topic("made-by-move").channel_names() == []
    client("StartMessageMoveTask", SourceArn=arn + "made-by-move")
    assert [m.body for m in made.receive(1)] == [b"poison"]


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
