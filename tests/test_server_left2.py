"""Audit of the server (second pass of the session's leftovers): SQS reads that must not make a
channel, the h11 fallback's busy answer, a second stop signal, the SQS protocol against AWS's."""

from __future__ import annotations

from pathlib import Path

from test_server_sqs_unit import BASE, Client, broker, client, sqs  # noqa: F401 (fixtures)

from journalq.queue import Broker


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
