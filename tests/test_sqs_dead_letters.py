"""A dead letter as SQS shows it: it keeps its SentTimestamp, and its receive count goes on from
the receives in the queue it came from (its MessageId is new: journalq's ids are offsets)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_server_sqs_unit import Client

from journalq.journal import Message
from journalq.queue import Broker
from journalq.queue.envelope import Envelope, encode
from journalq.server.sqs import SqsProtocol

ATTRIBUTES = ["SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp"]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(tmp_path / "data", sync="none") as b:
        yield b


@pytest.fixture
def client(broker: Broker) -> Client:
    return Client(SqsProtocol(broker))


def _dead_letter_setup(client: Client) -> tuple[str, str]:
    """A queue ``jobs`` whose messages move to ``jobs-dlq`` after two receives."""
    dlq = client.create("jobs-dlq")
    arn = "arn:aws:sqs:us-east-1:000000000000:jobs-dlq"
    url = client.create(
        "jobs", RedrivePolicy=json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 2})
    )
    return url, dlq


def test_a_dead_letter_keeps_its_sent_timestamp_and_receive_count(client: Client) -> None:
    url, dlq = _dead_letter_setup(client)
    client("SendMessage", QueueUrl=url, MessageBody="poison")
    firsts = []
    for expected in ("1", "2"):
        (m,) = client.receive(url, VisibilityTimeout=0, AttributeNames=ATTRIBUTES)
        assert m["Attributes"]["ApproximateReceiveCount"] == expected
        firsts.append(m["Attributes"])
    first_id = m["MessageId"]
    sent = firsts[0]["SentTimestamp"]
    assert firsts[1]["SentTimestamp"] == sent
    time.sleep(0.05)  # so that a SentTimestamp of the move would differ from the first send's
    assert client("ReceiveMessage", QueueUrl=url) == {}  # the third try moves it
    (dead,) = client.receive(dlq, VisibilityTimeout=0, AttributeNames=["All"])
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["SentTimestamp"] == sent
    assert dead["Attributes"]["ApproximateReceiveCount"] == "3"
    # First received in the queue it came from (this process remembers it), as on SQS.
    assert (
        dead["Attributes"]["ApproximateFirstReceiveTimestamp"]
        == firsts[0]["ApproximateFirstReceiveTimestamp"]
    )
    assert dead["MessageId"] != first_id  # a new id, as the README says
    (again,) = client.receive(dlq, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount"])
    assert again["Attributes"] == {"ApproximateReceiveCount": "4"}


def test_a_source_without_the_fields_or_with_bad_ones_is_shown_as_the_message_itself(
    broker: Broker, client: Client
) -> None:
    """A source whose fields are missing or wrong (not one of ours: a send with such a source is
    refused, so they are stored raw, as another tool might): the message's own send time and
    count, never an error that would fail the whole receive."""
    url = client.create("plain")
    topic = broker.topic("plain")
    sources: list[Any] = [
        {"queue": "jobs", "channel": "default", "id": "0"},
        {"queue": "jobs", "count": True, "sent_at_ns": "soon"},
        {"queue": "jobs", "count": -5, "sent_at_ns": -1},
        {"count": 1.5, "sent_at_ns": 1.5},
        {"queue": "jobs", "count": "2", "sent_at_ns": 2.0e18},
        ["not", "a", "dict"],
    ]
    encoded = [encode(Envelope(str(i).encode(), source=s)) for i, s in enumerate(sources)]
    topic._get_writer().append_many([Message(timestamp_ns=time.time_ns(), type=t, value=v) for t, v in encoded])
    before = time.time() * 1000
    got = client.receive(url, MaxNumberOfMessages=10, AttributeNames=ATTRIBUTES)
    assert len(got) == len(sources)
    for m in got:
        assert m["Attributes"]["ApproximateReceiveCount"] == "1", m
        assert abs(int(m["Attributes"]["SentTimestamp"]) - before) < 60_000, m


def test_a_dead_letter_of_an_older_journalq_keeps_its_count(broker: Broker, client: Client) -> None:
    """Made before dead letters kept ``sent_at_ns``: its receive count goes on, its SentTimestamp
    is its own (the first send's is not known)."""
    url = client.create("old")
    before = time.time() * 1000
    broker.topic("old").send_many(
        [{"body": b"x", "source": {"queue": "jobs", "id": "0", "count": 2}}]
    )
    (m,) = client.receive(url, AttributeNames=ATTRIBUTES)
    assert m["Attributes"]["ApproximateReceiveCount"] == "3"
    assert abs(int(m["Attributes"]["SentTimestamp"]) - before) < 60_000


def test_the_first_receive_of_another_channel_s_dead_letter_is_not_the_queue_s(
    broker: Broker, client: Client
) -> None:
    """The SQS queue is its topic's channel ``default``: a dead letter of another channel of that
    topic was never received through SQS, so the queue's first receive of the message is not its."""
    url, dlq = _dead_letter_setup(client)
    client("SendMessage", QueueUrl=url, MessageBody="x")
    (m,) = client.receive(url, AttributeNames=ATTRIBUTES)
    queue_first = m["Attributes"]["ApproximateFirstReceiveTimestamp"]
    other = broker.topic("jobs").channel("other")
    for _ in range(2):
        assert len(other.receive(visibility_timeout=0)) == 1
    time.sleep(0.05)
    assert other.receive() == []  # moved
    (dead,) = client.receive(dlq, AttributeNames=ATTRIBUTES)
    assert dead["Attributes"]["ApproximateReceiveCount"] == "3"
    assert dead["Attributes"]["ApproximateFirstReceiveTimestamp"] != queue_first
