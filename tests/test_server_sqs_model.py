"""The queue model of ``test_queue_model`` through the Amazon SQS protocol: two ``journalq serve``
processes on one data directory, each spoken to by boto3, as the model's processes (sends in
batches, receives, deletes, releases, catch-ups). The same rules hold, with SQS's answer to a
stale receipt's delete: a success that deletes nothing. A standard queue, and a FIFO queue (its
messages in groups, some with deduplication ids); no zkmq filters (SQS has none), no purge (SQS
allows one a minute)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from test_queue_model import SETTINGS, SharedQueue
from test_server_harness import ServerProcess, sqs_client

SERVERS = 2
_servers: list[tuple[ServerProcess, Any]] = []  # (the server, a boto3 client of it)
_names = itertools.count()


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = tmp_path_factory.mktemp("sqs-model")
    servers = [ServerProcess(root / "data", "--sync", "none", log_dir=root) for _ in range(SERVERS)]
    try:
        for server in servers:
            server.start()
            _servers.append((server, sqs_client(server.url)))
        yield
    finally:
        _servers.clear()
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.check_clean_stop()


class SqsQueue:
    """The part of ``journalq.queue.Queue`` that the model calls, over SQS (one server's)."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url

    def send_many(self, items: Sequence[bytes | dict[str, Any]]) -> list[str]:
        ids: list[str] = []
        for start in range(0, len(items), 10):  # SendMessageBatch takes up to 10
            chunk = items[start : start + 10]
            entries = [_entry(str(i), item) for i, item in enumerate(chunk)]
            answer = self.client.send_message_batch(QueueUrl=self.url, Entries=entries)
            assert not answer.get("Failed"), answer["Failed"]
            by_entry = {entry["Id"]: entry["MessageId"] for entry in answer["Successful"]}
            ids += [by_entry[str(i)] for i in range(len(chunk))]
        return ids

    def receive(self, wanted: int, *, delete: Sequence[str] = (), filters: None = None) -> list[SimpleNamespace]:
        """A consumer loop's step as an SQS client makes it: the deletes, then the receive."""
        assert filters is None, "SQS carries no zkmq filters"
        if delete:
            assert self.delete_many(list(delete)) == [None] * len(delete)
        answer = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=wanted, WaitTimeSeconds=0,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "MessageGroupId"],
        )
        return [
            SimpleNamespace(
                id=m["MessageId"], receipt=m["ReceiptHandle"], body=m["Body"].encode(),
                group_id=m["Attributes"].get("MessageGroupId"), filters={},
                receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
            )
            for m in answer.get("Messages", [])
        ]

    def delete_many(self, receipts: list[str]) -> list[object | None]:
        """For each receipt, None, or the entry SQS listed under ``Failed``."""
        entries = [{"Id": str(i), "ReceiptHandle": receipt} for i, receipt in enumerate(receipts)]
        answer = self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
        failed = {entry["Id"]: entry for entry in answer.get("Failed", [])}
        assert len(answer.get("Successful", [])) + len(failed) == len(receipts)
        return [failed.get(str(i)) for i in range(len(receipts))]

    def change_visibility(self, receipt: str, seconds: float) -> None:
        self.client.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=int(seconds))

    def change_visibility_many(self, changes: list[tuple[str, float]]) -> list[object | None]:
        """For each change, None, or the entry SQS listed under ``Failed``."""
        entries = [
            {"Id": str(i), "ReceiptHandle": receipt, "VisibilityTimeout": int(seconds)}
            for i, (receipt, seconds) in enumerate(changes)
        ]
        answer = self.client.change_message_visibility_batch(QueueUrl=self.url, Entries=entries)
        failed = {entry["Id"]: entry for entry in answer.get("Failed", [])}
        return [failed.get(str(i)) for i in range(len(changes))]

    def stats(self) -> SimpleNamespace:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        found = self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)["Attributes"]
        return SimpleNamespace(available=int(found[names[0]]), in_flight=int(found[names[1]]))


class SqsBroker:
    """A model's process: a client of one of the servers, its queue ``q`` a queue of the
    example's own on the servers' data directory."""

    def __init__(self, process: int, name: str, fifo: bool) -> None:
        server, self.client = _servers[process % SERVERS]
        self.name = f"{name}.fifo" if fifo else name
        self.url = f"{server.url}/000000000000/{self.name}"
        self.fifo = fifo

    def queue(self, name: str, *, create: bool = True, **settings: Any) -> SqsQueue:
        assert name == "q", "the model's one queue"
        if settings:  # the model's first call makes it: of its settings, SQS carries the visibility
            attributes = {"VisibilityTimeout": str(int(settings["visibility_timeout"]))}
            if self.fifo:  # (messages with no deduplication id: their bodies, all different, are theirs)
                attributes |= {"FifoQueue": "true", "ContentBasedDeduplication": "true"}
            self.client.create_queue(QueueName=self.name, Attributes=attributes)
        return SqsQueue(self.client, self.url)

    def gc(self) -> dict[str, int]:
        """Nothing to ask: a server collects by itself, every ``task_gc_interval``."""
        return {}

    def close(self) -> None:
        """Nothing to let go: the clients are the module's."""


class SharedQueueOverSqs(SharedQueue):
    OFFSET_IDS = False  # (the server's ids carry the queue's token)
    STALE_REFUSED = False
    PURGES = False
    TASKS = False

    def new_broker(self) -> SqsBroker:  # type: ignore[override]
        if not hasattr(self, "name"):
            self.name, self.made = f"m{next(_names)}", 0
        self.made += 1  # processes 0, 1, 2, then each restart: the next server in turn
        return SqsBroker(self.made - 1, self.name, fifo=self.GROUP_ALWAYS)

    def check_refused(self, refused: object) -> None:
        """SQS's answer to it: InvalidParameterValue, as for any receipt that cannot change (a
        ``ClientError`` raised, or a batch's entry listed under ``Failed``)."""
        failed = refused.response["Error"] if isinstance(refused, ClientError) else refused
        assert isinstance(failed, dict), refused
        assert failed["Code"] == "InvalidParameterValue", failed
        assert "not available for visibility timeout change" in failed["Message"], failed


SharedQueueOverSqs.TestCase.settings = SETTINGS
TestSharedQueueOverSqs = pytest.mark.usefixtures("two_servers")(SharedQueueOverSqs.TestCase)


class SharedFifoQueueOverSqs(SharedQueueOverSqs):
    """An SQS FIFO queue: every message in one of two groups, some with deduplication ids."""

    GROUPS = ("a", "b")
    GROUP_ALWAYS = True
    DEDUP_IDS = ("x", "y")


SharedFifoQueueOverSqs.TestCase.settings = SETTINGS
TestSharedFifoQueueOverSqs = pytest.mark.usefixtures("two_servers")(SharedFifoQueueOverSqs.TestCase)


def _entry(entry_id: str, item: bytes | dict[str, Any]) -> dict[str, str]:
    """A SendMessageBatch entry of a model's message (a body, or a body with a group and a
    deduplication id)."""
    if isinstance(item, bytes):
        return {"Id": entry_id, "MessageBody": item.decode()}
    entry = {"Id": entry_id, "MessageBody": item["body"].decode(), "MessageGroupId": item["group_id"]}
    if item["dedup_id"] is not None:
        entry["MessageDeduplicationId"] = item["dedup_id"]
    return entry
