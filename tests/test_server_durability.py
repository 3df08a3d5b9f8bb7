"""What the server promises about storage: a success is on stable storage (so a SIGKILL loses
nothing answered 201/200, and stores nothing twice), concurrent requests share syncs, and a full
disk or an I/O error is a 503 with Retry-After that leaves nothing half-written, keeps reads
served, and passes once space returns.

The full disk is real where it can be: a 2 MiB tmpfs mounted as the data directory (needs root;
skipped with its reason otherwise). The in-process tests beneath it inject the faults instead
(``journalq.journal.writer.os`` for ENOSPC, ``journalq.journal.writer.fdatasync`` for EIO, which
no tmpfs can produce), with the app under httpx's ASGI transport: they run everywhere.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SyncFault
from test_server_harness import ServerProcess, sqs_client

import journalq.journal.writer as writer_mod
import journalq.queue.settings as settings_mod
import journalq.server.batching as batching_mod
from journalq.journal.codec import OVERHEAD
from journalq.journal.inspect import check
from journalq.journal.lock import FileLock
from journalq.journal.scanner import Scanner
from journalq.queue import Broker
from journalq.queue.channel import Channel
from journalq.server.app import create_app
from journalq.server.config import ServerConfig

SQS_HEADERS = {"Content-Type": "application/x-amz-json-1.0"}


def sqs_call(client: httpx.Client, action: str, payload: dict[str, Any]) -> httpx.Response:
    return client.post("/", content=json.dumps(payload), headers={**SQS_HEADERS, "X-Amz-Target": f"AmazonSQS.{action}"})


def drain(url: str, queue: str) -> Counter[str]:
    """Every message of the queue, received through SQS (10 at a time, hidden for 10 minutes)."""
    got: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=30) as client:
        queue_url = f"{url}/000000000000/{queue}"
        while True:
            answer = sqs_call(client, "ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": 10,
                                                         "VisibilityTimeout": 600, "WaitTimeSeconds": 0})
            assert answer.status_code == 200, answer.text
            messages = answer.json().get("Messages", [])
            if not messages:
                return got
            got.update(m["Body"] for m in messages)


# -- SIGKILL under load -------------------------------------------------------------------------


def _load(url: str, queue: str, round_: int, stop: threading.Event,
          acked: list[str], attempted: list[str], lock: threading.Lock) -> list[threading.Thread]:
    """8 clients x up to 500 messages: 6 post through REST, 2 send batches of 10 through SQS."""

    def rest_client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(500):
                if stop.is_set():
                    return
                body = f"r{round_}-rest{c}-{i}-" + "x" * random.randrange(0, 200)
                with lock:
                    attempted.append(body)
                try:
                    answer = client.post(f"/{queue}/messages", content=body.encode())
                except httpx.TransportError:
                    return  # the server died: this one's fate is unknown
                if answer.status_code == 201:
                    with lock:
                        acked.append(body)

    def sqs_client_thread(c: int) -> None:
        queue_url = f"{url}/000000000000/{queue}"
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(50):
                if stop.is_set():
                    return
                bodies = [f"r{round_}-sqs{c}-{i}-{j}-" + "y" * random.randrange(0, 200) for j in range(10)]
                with lock:
                    attempted.extend(bodies)
                entries = [{"Id": f"e{j}", "MessageBody": b} for j, b in enumerate(bodies)]
                try:
                    answer = sqs_call(client, "SendMessageBatch", {"QueueUrl": queue_url, "Entries": entries})
                except httpx.TransportError:
                    return
                if answer.status_code == 200:
                    ok = {e["Id"] for e in answer.json()["Successful"]}
                    with lock:
                        acked.extend(b for j, b in enumerate(bodies) if f"e{j}" in ok)

    threads = [threading.Thread(target=rest_client, args=(c,)) for c in range(6)]
    threads += [threading.Thread(target=sqs_client_thread, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    return threads


def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", log_dir=tmp_path)
    history: dict[str, set[str]] = {}
    try:
        server.start()
        for round_ in range(4):
            # Three rounds end in SIGKILL; the last in SIGTERM, which must let the requests under
            # way finish and exit 0.
            graceful = round_ == 3
            queue = f"kill{round_}"
            httpx.put(f"{server.url}/{queue}").raise_for_status()
            acked: list[str] = []
            attempted: list[str] = []
            lock = threading.Lock()
            stop = threading.Event()
            threads = _load(server.url, queue, round_, stop, acked, attempted, lock)
            target = random.randrange(400, 2500)
            deadline = time.monotonic() + 60
            while len(acked) < target and time.monotonic() < deadline and any(t.is_alive() for t in threads):
                time.sleep(0.005)
            if graceful:
                assert server.stop(signal.SIGTERM) == 0, server.log()
            else:
                server.kill()  # SIGKILL, mid-load
            stop.set()
            for t in threads:
                t.join(30)
            assert len(acked) < 4000, "the load ended before the kill: nothing was tested"
            server.start()  # on the same data directory: recovery
            got = drain(server.url, queue)
            twice = {body: n for body, n in got.items() if n > 1}
            assert not twice, f"round {round_}: stored twice: {list(twice)[:5]}"
            missing = set(acked) - set(got)
            assert not missing, f"round {round_}: {len(missing)} of {len(acked)} acknowledged messages lost"
            unexpected = set(got) - set(attempted)
            assert not unexpected, f"round {round_}: messages nobody sent (torn?): {list(unexpected)[:5]}"
            history[queue] = set(got)
            if graceful:  # every request in flight was answered: what is there was acknowledged
                assert set(got) == set(acked), f"{len(set(got) - set(acked))} stored unanswered"
        # Everything of the earlier rounds is still there after the later kills (in flight now).
        for queue, bodies in history.items():
            stats = httpx.get(f"{server.url}/{queue}").json()
            assert stats["in_flight"] + stats["available"] == len(bodies), (queue, stats)
        server.check_clean_stop()
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()


def test_concurrent_writes_share_syncs(tmp_path: Path) -> None:
    """Group commit: 8 clients x 100 POSTs take far fewer syncs than 800 (metrics' syncs count
    this process's fdatasync calls)."""
    server = ServerProcess(tmp_path / "data", log_dir=tmp_path).start()
    try:
        httpx.put(f"{server.url}/group").raise_for_status()

        def syncs() -> float:
            for line in httpx.get(f"{server.url}/metrics").text.splitlines():
                if line.startswith("journalq_syncs_total "):
                    return float(line.split()[1])
            raise AssertionError("no journalq_syncs_total")

        before = syncs()

        def post(c: int) -> None:
            with httpx.Client(base_url=server.url) as client:
                for i in range(100):
                    assert client.post("/group/messages", content=b"%d-%d" % (c, i)).status_code == 201

        threads = [threading.Thread(target=post, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        used = syncs() - before
        assert 0 < used < 800, used
        assert httpx.get(f"{server.url}/group").json()["available"] == 800
        server.check_clean_stop()
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()


class SlowSyncs:
    """Stands in for the writer's ``fdatasync``: slow, and noting for each sync of a message
    journal (``.../q/jnl/*.jnl``) the file's size when it began and the time it ended."""

    def __init__(self, real: Any, seconds: float) -> None:
        self.real, self.seconds = real, seconds
        self.done: list[tuple[int, float]] = []  # (size synced, time it was done)
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        size = os.fstat(fd).st_size
        time.sleep(self.seconds)
        self.real(fd)
        if "/q/jnl/" in path:
            with self.lock:
                self.done.append((size, time.monotonic()))

    def synced_before(self, moment: float) -> int:
        with self.lock:
            return max((size for size, at in self.done if at <= moment), default=0)


def _message_ends(segment: Path) -> dict[str, int]:
    """Message id (the offset) -> the position in ``segment`` where that message ends."""
    ends, position = {}, 0
    with Scanner(segment.parent.parent, 0) as scanner:
        while batch := scanner.read_batch():
            for message in batch:
                position += OVERHEAD + len(message.key) + len(message.value)
                ends[str(message.offset)] = position
    assert position == segment.stat().st_size
    return ends


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd to tell the files synced")
def test_success_is_answered_only_after_the_sync_and_syncs_are_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, with a slow fdatasync that notes what it synced: every 201 comes after a sync
    that covered its message, and concurrent POSTs share syncs (group commit)."""
    syncs = SlowSyncs(writer_mod.fdatasync, 0.15)
    monkeypatch.setattr(writer_mod, "fdatasync", syncs)
    segment = tmp_path / "q" / "jnl" / "0000000000000000.jnl"
    answers: list[tuple[str, int]] = []  # (message id, bytes of the journal synced when answered)

    async def post(client: httpx.AsyncClient, body: bytes) -> None:
        answer = await client.post("/q/messages", content=body)
        synced = syncs.synced_before(time.monotonic())
        assert answer.status_code == 201
        answers.append((answer.headers["X-Message-Id"].rpartition(".")[0], synced))  # the queue's id, without its token

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            started = time.monotonic()
            await post(client, b"alone")
            assert time.monotonic() - started >= 0.15  # it waited for its sync
            count_before = len(syncs.done)
            started = time.monotonic()
            await asyncio.gather(*(post(client, b"together %d" % i) for i in range(16)))
            took = time.monotonic() - started
            shared = len(syncs.done) - count_before
            # Group commit: one sync covers every append made while the one before ran.
            assert shared <= 4, shared
            assert took < 16 * 0.15, took

    asyncio.run(scenario())
    ends = _message_ends(segment)
    assert len(answers) == 17 and len(ends) == 17
    for message_id, synced in answers:
        assert synced >= ends[message_id], f"message {message_id} was answered before a sync covered it"


# -- a real full disk: a small tmpfs ----------------------------------------------------------------


def test_full_disk_is_503_and_recovers(tmpfs: Path, tmp_path: Path) -> None:
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (768 * 1024))
    server = ServerProcess(tmpfs / "data", log_dir=tmp_path)
    try:
        server.start()
        client = httpx.Client(base_url=server.url, timeout=30)
        assert client.put("/full").status_code == 201
        # One delivery before the disk fills, so that the channel's journal has its first page.
        assert client.post("/full/messages", content=b"first").status_code == 201
        first = client.get("/full/messages", params={"visibility_timeout": 0})
        assert first.status_code == 200 and first.content == b"first"
        acked: list[str] = ["first"]
        refused: list[str] = []
        for i in range(2000):
            body = f"{i:05d}-" + "f" * 4000
            answer = client.post("/full/messages", content=body.encode())
            if answer.status_code == 503:
                refused.append(body)
                assert int(answer.headers["Retry-After"]) >= 1
                assert "not stored" in answer.json()["error"]
                break
            assert answer.status_code == 201, answer.text
            acked.append(body)
        assert refused, "the 2 MiB tmpfs never filled up"
        assert len(acked) > 10
        # Still full: more writes are refused the same way, through both APIs.
        for i in range(3):
            body = f"again-{i}-" + "f" * 4000
            answer = client.post("/full/messages", content=body.encode())
            assert answer.status_code == 503 and "Retry-After" in answer.headers
            refused.append(body)
        sqs = sqs_client(server.url)
        queue_url = sqs.get_queue_url(QueueName="full")["QueueUrl"]
        with pytest.raises(sqs.exceptions.ClientError) as info:
            sqs.send_message(QueueUrl=queue_url, MessageBody="s" * 8000)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert info.value.response["Error"]["Code"] == "ServiceUnavailable"
        assert "retry-after" in info.value.response["ResponseMetadata"]["HTTPHeaders"]
        query = sqs_client(server.url, query=True)  # the Query protocol's answer: the same, in XML
        with pytest.raises(query.exceptions.ClientError) as info:
            query.send_message_batch(QueueUrl=queue_url, Entries=[{"Id": "a", "MessageBody": "q" * 8000}])
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert info.value.response["Error"]["Code"] == "ServiceUnavailable"
        assert "retry-after" in info.value.response["ResponseMetadata"]["HTTPHeaders"]
        # Making a queue needs space too: refused (not a 500), and no half-made queue is left.
        made = client.put("/another")
        assert made.status_code in (201, 503), made.text
        if made.status_code == 503:
            assert "Retry-After" in made.headers
            assert client.get("/another").status_code == 404
        # Reads are served.
        attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
        assert attributes["ApproximateNumberOfMessages"] == str(len(acked))
        assert queue_url in sqs.list_queues()["QueueUrls"]
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200
        stats = client.get("/full")
        assert stats.status_code == 200 and stats.json()["available"] == len(acked)
        # A receive must record its delivery durably: served while that fits (the state journal's
        # page has room), refused alike when not; never a 500, never a message cut short.
        fetched = client.get("/full/messages", params={"visibility_timeout": 0})
        assert fetched.status_code in (200, 503), fetched.text
        if fetched.status_code == 200:
            assert fetched.content.decode() == acked[0]
        else:
            assert "Retry-After" in fetched.headers

        # Space comes back: writes pass again.
        filler.unlink()
        after = [f"after-{i}-" + "a" * 4000 for i in range(5)]
        for body in after:
            assert client.post("/full/messages", content=body.encode()).status_code == 201
        assert client.put("/another").status_code in (200, 201)
        client.close()
        server.check_clean_stop()

        # Every message answered 201 is there, whole, once; none of those refused is.
        server.start()
        got = drain(server.url, "full")
        assert max(got.values()) == 1
        assert set(got) == set(acked) | set(after)
        assert not set(got) & set(refused)
        server.check_clean_stop()
        report = check(tmpfs / "data" / "full")
        assert report.ok and report.messages == len(acked) + len(after), report.remaining
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()


# -- injected faults, in process --------------------------------------------------------------


class FaultyOs:
    """Stands in for ``os`` in the writer module: while ``full``, every write puts part of its
    data down and then fails with ENOSPC, as a disk filling up does."""

    def __init__(self) -> None:
        self.full = False
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        if self.full:
            self.failures += 1
            os.write(fd, bytes(data[: max(1, len(data) // 2)]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


@asynccontextmanager
async def app_client(data: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ServerConfig(data=data, retry_after=3))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client


def test_injected_enospc_is_503_and_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FaultyOs()
    monkeypatch.setattr(writer_mod, "os", fake)
    real_write = settings_mod.write_temporary

    def write_temporary(file: Path, data: bytes, *, durable: bool) -> Path:  # a queue's settings: outside any journal
        if fake.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(file, data, durable=durable)

    monkeypatch.setattr(settings_mod, "write_temporary", write_temporary)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            acked = []
            for i in range(5):
                answer = await client.post("/q/messages", content=b"before %d" % i)
                assert answer.status_code == 201
                acked.append(b"before %d" % i)
            fake.full = True
            answer = await client.post("/q/messages", content=b"lost")
            assert answer.status_code == 503
            assert answer.headers["Retry-After"] == "3"
            assert fake.failures >= 1, "the fault did not happen"
            sqs = await client.post("/", headers={**SQS_HEADERS, "X-Amz-Target": "AmazonSQS.SendMessageBatch"},
                                    content=json.dumps({"QueueUrl": "/000000000000/q", "Entries": [
                                        {"Id": "a", "MessageBody": "lost a"}, {"Id": "b", "MessageBody": "lost b"}]}))
            assert sqs.status_code == 503 and sqs.headers["Retry-After"] == "3"
            assert sqs.json()["__type"].endswith("ServiceUnavailable")
            # Making a queue needs space too: 503 as well, not a 500, and no queue appears.
            made = await client.put("/new")
            assert made.status_code == 503 and made.headers["Retry-After"] == "3"
            assert (await client.get("/new")).status_code == 404
            # Reads that write nothing are served.
            assert (await client.get("/healthz")).status_code == 200
            stats = await client.get("/q")
            assert stats.status_code == 200 and stats.json()["available"] == 5
            # A receive must record its delivery: refused as well, with nothing delivered.
            refused = await client.get("/q/messages")
            assert refused.status_code == 503
            fake.full = False
            # Space is back: the same queue takes writes again, no reopening needed.
            assert (await client.post("/q/messages", content=b"after")).status_code == 201
            acked.append(b"after")
            got = []
            while (answer := await client.get("/q/messages")).status_code == 200:
                got.append(answer.content)
            assert got == acked  # in order, whole, and nothing of what was refused

    asyncio.run(scenario())
    report = check(tmp_path / "q")
    assert report.ok and report.messages == 6, report.remaining
    with Broker(tmp_path) as broker:
        assert broker.queue("q", create=False).stats().in_flight == 6


def test_a_delete_on_a_full_disk_is_503_and_deletes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``DELETE /{queue}/messages/{id}`` is a write too (the channel records it): refused with
    503 and ``Retry-After``, the message is still there, and the delete passes once space is back."""
    fake = FaultyOs()
    monkeypatch.setattr(writer_mod, "os", fake)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            message_id = (await client.post("/q/messages", content=b"kept")).headers["X-Message-Id"]
            fake.full = True
            refused = await client.delete(f"/q/messages/{message_id}")
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "3", refused.text
            assert fake.failures >= 1, "the fault did not happen"
            fake.full = False
            got = await client.get("/q/messages")
            assert got.status_code == 200 and got.content == b"kept"
            assert (await client.delete(f"/q/messages/{message_id}")).status_code == 204
            assert (await client.get("/q")).json()["in_flight"] == 0

    asyncio.run(scenario())


def _receives_asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``max_messages`` of each ``Channel.receive`` from now on, in a list kept up to date."""
    asked: list[int] = []
    real_receive = Channel.receive

    def receive(self: Channel, max_messages: int = 1, **options: Any) -> Any:
        asked.append(max_messages)
        return real_receive(self, max_messages, **options)

    monkeypatch.setattr(Channel, "receive", receive)
    return asked


def test_concurrent_fetches_share_a_receive_and_concurrent_deletes_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mq's consumers: concurrent fetches of a queue are taken in batches, one receive each, every
    fetch its own message; concurrent deletes (writes too) in batches, one sync each (group commit),
    each answered 204, or 404 for an id given twice (one of the two)."""
    with Broker(tmp_path) as broker:
        broker.queue("q").send_many([b"%d" % i for i in range(16)])
    asked = _receives_asked(monkeypatch)
    pause: dict[str, float] = {}
    where = _where_stored(monkeypatch, pause)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            fetched = await asyncio.gather(*(client.get("/q/messages") for _ in range(16)))
            assert [answer.status_code for answer in fetched] == [200] * 16
            assert sorted(answer.content for answer in fetched) == sorted(b"%d" % i for i in range(16))
            assert sum(asked) == 16 and len(asked) < 16, asked
            ids = [answer.headers["X-Message-Id"] for answer in fetched]
            where.clear()
            pause["sync"] = 0.1
            deleted = await asyncio.gather(*(client.delete(f"/q/messages/{i}") for i in [*ids, ids[0]]))
            assert sorted(answer.status_code for answer in deleted) == [204] * 16 + [404]
            assert 1 <= [what for what, _ in where].count("sync") <= 4, where
            assert (await client.get("/q")).json()["in_flight"] == 0
            metrics = (await client.get("/metrics")).text
            assert 'journalq_messages_out_total{queue="q"} 16.0' in metrics
            assert 'journalq_messages_deleted_total{queue="q"} 16.0' in metrics

    asyncio.run(scenario())


def test_concurrent_sqs_receives_share_a_receive_and_deletes_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS's consumers, as mq's: concurrent ReceiveMessages of a standard queue take their first
    look in batches, one receive each, every message to one of them; concurrent DeleteMessages
    are stored in batches, one sync each, each answered as alone: a receipt given twice is
    deleted once and both are answered success (as SQS answers a delivery that is over), a
    malformed one ReceiptHandleIsInvalid, a missing one MissingParameter."""
    with Broker(tmp_path) as broker:
        broker.queue("q").send_many([b"%d" % i for i in range(24)])
    asked = _receives_asked(monkeypatch)
    pause: dict[str, float] = {}
    where = _where_stored(monkeypatch, pause)
    url = "http://testserver/000000000000/q"

    async def call(client: httpx.AsyncClient, action: str, payload: dict[str, Any]) -> httpx.Response:
        return await client.post("/", content=json.dumps({"QueueUrl": url, **payload}),
                                 headers={**SQS_HEADERS, "X-Amz-Target": f"AmazonSQS.{action}"})

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            got = await asyncio.gather(*(call(client, "ReceiveMessage", {"MaxNumberOfMessages": 2}) for _ in range(12)))
            assert [answer.status_code for answer in got] == [200] * 12
            messages = [m for answer in got for m in answer.json()["Messages"]]
            assert sorted(m["Body"] for m in messages) == sorted(str(i) for i in range(24))
            assert sum(asked) == 24 and len(asked) < 12, asked
            receipts = [m["ReceiptHandle"] for m in messages]
            where.clear()
            pause["sync"] = 0.1
            payloads = [{"ReceiptHandle": r} for r in [*receipts, receipts[0], "0.1.nothing.here"]] + [{}]
            deleted = await asyncio.gather(*(call(client, "DeleteMessage", payload) for payload in payloads))
            assert [answer.status_code for answer in deleted[:25]] == [200] * 25
            assert deleted[25].json()["__type"].endswith("ReceiptHandleIsInvalid"), deleted[25].text
            assert deleted[26].json()["__type"].endswith("MissingParameter"), deleted[26].text
            assert 1 <= [what for what, _ in where].count("sync") <= 4, where
            assert (await client.get("/q")).json()["in_flight"] == 0
            metrics = (await client.get("/metrics")).text
            assert 'journalq_messages_out_total{queue="q"} 24.0' in metrics
            assert 'journalq_messages_deleted_total{queue="q"} 25.0' in metrics

    asyncio.run(scenario())


def test_injected_eio_on_sync_is_503_and_the_queue_is_reopened(tmp_path: Path, sync_fault: SyncFault) -> None:
    """A failed fdatasync leaves the writer unusable by design; the server answers 503, closes
    it, and the next request reopens (and recovers) the journal."""

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            for i in range(3):
                assert (await client.post("/q/messages", content=b"kept %d" % i)).status_code == 201
            sync_fault.armed = True
            answer = await client.post("/q/messages", content=b"unsure")
            assert sync_fault.count == 1, "the fault did not happen"
            assert answer.status_code == 503
            assert answer.headers["Retry-After"] == "3"
            assert "Input/output error" in answer.json()["error"]
            # The next request gets a reopened queue: the writer that failed would refuse it.
            assert (await client.post("/q/messages", content=b"after")).status_code == 201
            # An EIO while a delete syncs: the same, on the channel's journal. (A receive alone
            # syncs nothing under sync="always": a lost delivery is only delivered again.)
            fetched = await client.get("/q/messages", params={"visibility_timeout": 0.5})
            assert fetched.status_code == 200 and fetched.content == b"kept 0"
            sync_fault.armed = True
            assert (await client.delete(f"/q/messages/{fetched.headers['X-Message-Id']}")).status_code == 503
            assert sync_fault.count == 2
            await asyncio.sleep(0.6)
            got = []
            while (answer := await client.get("/q/messages")).status_code == 200:
                got.append(answer.content)
            # Everything answered 201 is there, whole and in order. The message whose sync failed
            # reached the page cache before the error, so it may be there too: a 503 after an EIO
            # means "maybe not stored", and the client's retry may make it twice (at least once).
            # Likewise the delete: "kept 0" is gone, or back after its visibility timeout.
            assert [b for b in got if b not in (b"unsure", b"kept 0")] == [b"kept 1", b"kept 2", b"after"]
            assert got.count(b"unsure") <= 1 and got.count(b"kept 0") <= 1

    asyncio.run(scenario())
    report = check(tmp_path / "q")
    assert report.ok, report.remaining


def test_a_sigterm_stop_syncs_and_closes(tmp_path: Path) -> None:
    """After SIGTERM the journal needs no recovery: the writer closed it (nothing torn, lock free)."""
    server = ServerProcess(tmp_path / "data", "--sync", "none", log_dir=tmp_path).start()
    with httpx.Client(base_url=server.url) as client:
        client.put("/closed").raise_for_status()
        for i in range(50):
            client.post("/closed/messages", content=b"m%d" % i).raise_for_status()
    server.check_clean_stop(signal.SIGTERM)
    report = check(tmp_path / "data" / "closed")
    assert report.ok and report.messages == 50
    with Broker(tmp_path / "data") as broker:  # the exclusive writer's lock was let go
        queue = broker.queue("closed", create=False)
        queue.send(b"from another process")
        assert queue.stats().available == 51


def test_a_batch_partly_stored_in_a_sharded_queue_answers_each_send_as_it_fared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded queue writes each shard's part of a group commit on its own: when a later part
    fails, the sends already stored are answered as stored (201, or SQS's Successful), and only
    the others get the 503 (or SQS's Failed), so that clients send again just those."""
    from journalq.queue import sharded

    real_batch, real_part = sharded.ShardedTopic.send_many, sharded._ShardTopic.send_many
    failing = {"on": False, "parts": 0, "failures": 0}

    def batch(self: Any, items: Any) -> list[str]:
        failing["parts"] = 0
        return real_batch(self, items)

    def part(self: Any, items: Any) -> list[str]:
        failing["parts"] += 1
        if failing["on"] and failing["parts"] == 2:  # a batch's second part: the first is stored
            failing["failures"] += 1
            raise writer_mod.StorageError("no space left", errno=errno.ENOSPC, file=self.path)
        return real_part(self, items)

    monkeypatch.setattr(sharded.ShardedTopic, "send_many", batch)
    monkeypatch.setattr(sharded._ShardTopic, "send_many", part)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/s", params={"shards": 4})).status_code == 201
            failing["on"] = True
            bodies = [b"rest %d" % i for i in range(12)]
            answers = await asyncio.gather(*(client.post("/s/messages", content=b) for b in bodies))
            assert failing["failures"] == 1, "the fault did not happen"
            statuses = Counter(a.status_code for a in answers)
            assert set(statuses) == {201, 503} and statuses[201] >= 1, statuses
            assert all(a.headers["Retry-After"] == "3" for a in answers if a.status_code == 503)
            stored = {a.headers["X-Message-Id"]: b for a, b in zip(answers, bodies) if a.status_code == 201}

            failing["failures"] = 0
            entries = [{"Id": f"e{i}", "MessageBody": f"sqs {i}"} for i in range(8)]
            batch = await client.post("/", headers={**SQS_HEADERS, "X-Amz-Target": "AmazonSQS.SendMessageBatch"},
                                      content=json.dumps({"QueueUrl": "/000000000000/s", "Entries": entries}))
            assert failing["failures"] == 1, "the fault did not happen"
            assert batch.status_code == 200
            result = batch.json()
            assert result["Successful"] and result["Failed"]
            assert len(result["Successful"]) + len(result["Failed"]) == 8
            assert all(f["Code"] == "ServiceUnavailable" and f["SenderFault"] is False for f in result["Failed"])
            by_entry = {e["Id"]: e["MessageBody"].encode() for e in entries}
            stored.update({s["MessageId"]: by_entry[s["Id"]] for s in result["Successful"]})

            failing["on"] = False
            got = {}
            while (answer := await client.get("/s/messages")).status_code == 200:
                got[answer.headers["X-Message-Id"]] = answer.content
            assert got == stored  # every send answered as stored is there, and no other

    asyncio.run(scenario())


def test_a_batch_of_deletes_partly_stored_in_a_sharded_queue_answers_each_as_it_fared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of mq deletes over a sharded queue's shards, one of which fails for the storage:
    the ids deleted in the other shards are answered 204, only the failed shard's get the 503,
    so that a client deletes again just those (an id answered 503 that was deleted would be a
    404 the second time)."""
    from journalq.queue import sharded

    real_shard, real_batch = Channel.delete_ids, sharded.ShardedChannel.delete_ids
    failing: set[str] = set()
    mixed: list[bool] = []

    def shard_step(self: Channel, ids: list[str]) -> list:
        if self.receipt_prefix in failing:
            raise writer_mod.StorageError("no space left", errno=errno.ENOSPC, file=self.path)
        return real_shard(self, ids)

    def batch(self: Any, ids: list[str]) -> list:
        outcomes = real_batch(self, ids)
        mixed.append(None in outcomes and any(isinstance(o, writer_mod.StorageError) for o in outcomes))
        return outcomes

    monkeypatch.setattr(Channel, "delete_ids", shard_step)
    monkeypatch.setattr(sharded.ShardedChannel, "delete_ids", batch)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/s", params={"shards": 4})).status_code == 201
            sent = await asyncio.gather(*(client.post("/s/messages", content=b"%d" % i) for i in range(24)))
            ids = [answer.headers["X-Message-Id"] for answer in sent]
            first, last = ids[0].split(".")[0], ids[-1].split(".")[0]
            assert first != last
            failing.add(f"{last}.")  # (a batch's shards go in the order its ids came)
            answers = await asyncio.gather(*(client.delete(f"/s/messages/{id}") for id in ids))
            assert any(mixed), "no batch had a shard stored and one failed"
            refused = [id for id, answer in zip(ids, answers) if answer.status_code == 503]
            assert refused and {id.split(".")[0] for id in refused} == {last}
            assert all(a.headers["Retry-After"] == "3" for a in answers if a.status_code == 503)
            assert {a.status_code for a in answers} == {204, 503}
            failing.clear()
            again = await asyncio.gather(*(client.delete(f"/s/messages/{id}") for id in ids))
            assert [a.status_code for a in again] == [204 if id in refused else 404 for id in ids]

    asyncio.run(scenario())


@pytest.mark.parametrize("action", ["DeleteMessageBatch", "ChangeMessageVisibilityBatch"])
def test_sqs_receipts_in_a_sharded_queue_whose_shard_fails_are_a_503_and_can_be_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """A sharded queue gives the receipts of a shard whose step failed for the storage that error
    as their outcome, the other shards' steps stored. SQS answers the request 503 with
    Retry-After, as it does an unsharded queue's failure (never ReceiptHandleIsInvalid): sent
    again, the entries stored the first time succeed again, and the rest are done."""
    real = getattr(Channel, "delete_many" if action == "DeleteMessageBatch" else "change_visibility_many")
    failing: set[str] = set()

    def shard_step(self: Channel, *args: Any, **kwargs: Any) -> list:
        if self.receipt_prefix in failing:
            raise writer_mod.StorageError("no space left", errno=errno.ENOSPC, file=self.path)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Channel, real.__name__, shard_step)

    async def call(client: httpx.AsyncClient, name: str, payload: dict[str, Any]) -> httpx.Response:
        return await client.post("/", content=json.dumps({"QueueUrl": "/000000000000/s", **payload}),
                                 headers={**SQS_HEADERS, "X-Amz-Target": f"AmazonSQS.{name}"})

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            assert (await client.put("/s", params={"shards": 4})).status_code == 201
            for i in range(10):
                assert (await client.post("/s/messages", content=b"%d" % i)).status_code == 201
            got = (await call(client, "ReceiveMessage", {"MaxNumberOfMessages": 10, "VisibilityTimeout": 60})).json()
            receipts = [m["ReceiptHandle"] for m in got["Messages"]]
            shards = sorted({receipt.split(".")[0] for receipt in receipts})
            assert len(receipts) == 10 and len(shards) > 1
            failing.add(f"{shards[-1]}.")
            entries = [{"Id": f"e{i}", "ReceiptHandle": r, "VisibilityTimeout": 0} for i, r in enumerate(receipts)]
            refused = await call(client, action, {"Entries": entries})
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "3"
            assert refused.json()["__type"].endswith("ServiceUnavailable")
            failing.clear()
            again = await call(client, action, {"Entries": entries})
            assert again.status_code == 200 and again.json()["Failed"] == [], again.text
            assert len(again.json()["Successful"]) == 10
            left = (await call(client, "ReceiveMessage", {"MaxNumberOfMessages": 10})).json().get("Messages", [])
            assert len(left) == (0 if action == "DeleteMessageBatch" else 10)

    asyncio.run(scenario())


def _where_stored(monkeypatch: pytest.MonkeyPatch, pause: dict[str, float] | None = None) -> list[tuple[str, int]]:
    """("write" or "sync", thread) of each journal write and fdatasync from now on, in a list kept
    up to date; each sync first sleeps ``pause["sync"]`` seconds (a slow disk, when set)."""
    pause = {} if pause is None else pause
    where: list[tuple[str, int]] = []
    real_write, real_sync = writer_mod._write_all, writer_mod.fdatasync

    def write_all(fd: int, data: bytes | memoryview) -> None:
        where.append(("write", threading.get_ident()))
        real_write(fd, data)

    def fdatasync(fd: int) -> None:
        time.sleep(pause.get("sync", 0.0))
        real_sync(fd)
        where.append(("sync", threading.get_ident()))

    monkeypatch.setattr(writer_mod, "_write_all", write_all)
    monkeypatch.setattr(writer_mod, "fdatasync", fdatasync)
    return where


async def _send_rest_and_sqs(client: httpx.AsyncClient, queue: str = "q") -> None:
    answers = await asyncio.gather(*(client.post(f"/{queue}/messages", content=b"%d" % i) for i in range(8)))
    assert [answer.status_code for answer in answers] == [201] * 8
    url = f"http://testserver/000000000000/{queue}"
    sent = await client.post("/", content=json.dumps({"QueueUrl": url, "MessageBody": "sqs"}),
                             headers={**SQS_HEADERS, "X-Amz-Target": "AmazonSQS.SendMessage"})
    assert sent.status_code == 200, sent.text


def test_a_batch_is_written_on_the_event_loop_and_synced_there_while_syncs_are_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's append (lock, catch-up, write) is made on the event loop, and so is its
    fdatasync while syncs are quick (no thread hop), each send answered once that sync returned:
    REST and SQS. (Whole in a thread, each of the append's system calls handed the GIL to the
    loop and waited for it.) Not a send that collects too (the first of a process, then one every
    task_gc_interval): that one goes whole to the thread."""
    monkeypatch.setattr(batching_mod, "QUICK_SYNC", 60.0)  # every sync is quick, on any disk
    where = _where_stored(monkeypatch)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            assert (await client.post("/q/messages", content=b"the first: it collects")).status_code == 201
            assert where and all(thread != loop_thread for _, thread in where)
            where.clear()
            await _send_rest_and_sqs(client)
            assert {thread for _, thread in where} == {loop_thread}
            assert [what for what, _ in where].count("sync") >= 2
            assert where[-1][0] == "sync"  # the SQS send's, before its answer

    asyncio.run(scenario())


def test_after_a_slow_sync_the_syncs_go_to_a_thread_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Syncs on the event loop slower than QUICK_SYNC (here one is enough) stall it once: the
    next batches' syncs run in a worker thread (their appends stay on the loop) for
    SLOW_SYNC_BACKOFF, then on the loop again."""
    monkeypatch.setattr(batching_mod, "QUICK_SYNC", 0.02)
    monkeypatch.setattr(batching_mod, "SYNC_WEIGHT", 1.0)  # each sync judged alone
    monkeypatch.setattr(batching_mod, "SLOW_SYNC_BACKOFF", 1.5)  # long enough for a slow machine's sends
    pause: dict[str, float] = {}
    where = _where_stored(monkeypatch, pause)

    def syncs_in(thread: int) -> int:
        return sum(1 for what, t in where if what == "sync" and t == thread)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            assert (await client.post("/q/messages", content=b"the first: it collects")).status_code == 201
            where.clear()
            pause["sync"] = 0.05  # the disk turns slow
            assert (await client.post("/q/messages", content=b"synced slowly, on the loop")).status_code == 201
            assert syncs_in(loop_thread) == 1
            where.clear()
            await _send_rest_and_sqs(client)
            writes = [thread for what, thread in where if what == "write"]
            assert writes and set(writes) == {loop_thread}
            assert syncs_in(loop_thread) == 0 and len([w for w, _ in where if w == "sync"]) >= 2
            pause["sync"] = 0.0  # quick again
            await asyncio.sleep(1.6)  # the backoff has passed
            where.clear()
            await _send_rest_and_sqs(client)
            assert {thread for _, thread in where} == {loop_thread}

    asyncio.run(scenario())


def test_while_another_queue_is_being_stored_a_batch_is_synced_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends to two queues at once: a sync on the loop would hold back the other queue's batch,
    whose sync can run meanwhile in a thread, so neither is synced on the loop."""
    monkeypatch.setattr(batching_mod, "QUICK_SYNC", 60.0)
    where = _where_stored(monkeypatch)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with app_client(tmp_path) as client:
            for queue in ("a", "b"):
                assert (await client.put(f"/{queue}")).status_code == 201
                assert (await client.post(f"/{queue}/messages", content=b"collects")).status_code == 201
            where.clear()
            answers = await asyncio.gather(
                *(client.post(f"/{'ab'[i % 2]}/messages", content=b"%d" % i) for i in range(8))
            )
            assert [answer.status_code for answer in answers] == [201] * 8
            syncs = [thread for what, thread in where if what == "sync"]
            assert syncs and loop_thread not in syncs

    asyncio.run(scenario())


def test_under_group_sync_a_batch_is_still_stored_in_a_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sync group``: the writer's timer syncs holding its mutex, which an append on the event
    loop would wait for: there the whole store stays in the worker thread."""
    where = _where_stored(monkeypatch)

    async def scenario() -> None:
        app = create_app(ServerConfig(data=tmp_path, sync="group:5ms"))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.put("/q")).status_code == 201
                where.clear()
                assert (await client.post("/q/messages", content=b"one")).status_code == 201
        writers = [thread for what, thread in where if what == "write"]
        assert writers and threading.get_ident() not in writers

    asyncio.run(scenario())


def test_a_send_that_collects_too_is_stored_in_a_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A send due to maintain its queue (collect finished tasks, gc, compact: milliseconds, or
    more) is stored whole in the worker thread, not on the event loop: every one, here."""
    Broker(tmp_path).queue("q", task_gc_interval=0.001).topic.broker.close()
    where = _where_stored(monkeypatch)

    async def scenario() -> None:
        async with app_client(tmp_path) as client:
            for i in range(3):
                assert (await client.post("/q/messages", content=b"%d" % i)).status_code == 201
                await asyncio.sleep(0.002)
        writers = [thread for what, thread in where if what == "write"]
        assert writers and threading.get_ident() not in writers

    asyncio.run(scenario())


def test_a_queue_another_process_holds_waits_in_a_thread_while_the_loop_answers_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's journal held by another process (its compaction: hundreds of ms at a deep
    backlog): the batch that finds it held waits for it in a thread, not on the event loop,
    which meanwhile answers the requests to other queues; then it is stored and answered as
    usual. For sends (the topic's lock), fetches and deletes (the channel's). (Before, the loop
    waited on the lock: every queue's requests with it; a timer lets go after 10 s.)"""
    where = _where_stored(monkeypatch)
    topic_lock, channel_lock = tmp_path / "q" / "jnl.lck", tmp_path / "q" / "channels" / "default" / "jnl.lck"

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with app_client(tmp_path) as client:
            for queue in ("q", "r"):  # (the first send and fetch of a queue collect: in a thread)
                assert (await client.put(f"/{queue}")).status_code == 201
                for body in (b"collects", b"fetched", b"deleted", b"left"):
                    assert (await client.post(f"/{queue}/messages", content=body)).status_code == 201
                assert (await client.get(f"/{queue}/messages")).content == b"collects"
            fetched = await client.get("/q/messages")
            assert fetched.content == b"fetched"
            deleted = await client.get("/q/messages")
            assert deleted.content == b"deleted"
            cases = (
                (topic_lock, client.post("/q/messages", content=b"sent"), 201),
                (channel_lock, client.get("/q/messages"), 200),
                (channel_lock, client.delete(f"/q/messages/{deleted.headers['X-Message-Id']}"), 204),
            )
            for path, request, status in cases:
                other = FileLock(path)
                assert other.try_acquire()
                let_go = threading.Event()

                def after_ten_seconds(other: FileLock = other, let_go: threading.Event = let_go) -> None:
                    let_go.set()
                    other.close()

                timer = threading.Timer(10.0, after_ten_seconds)
                timer.start()
                try:
                    where.clear()
                    waiting = asyncio.ensure_future(request)
                    await asyncio.sleep(0.2)  # its batch found the lock held
                    assert not waiting.done(), "answered after the lock was let go: the loop waited for it"
                    assert (await client.post("/r/messages", content=b"meanwhile")).status_code == 201
                    assert not let_go.is_set(), "the loop waited for the other process's lock"
                finally:
                    timer.cancel()
                    other.close()
                answer = await waiting
                assert answer.status_code == status, answer.text
                writes = [thread for what, thread in where if what == "write"]
                assert writes.count(loop_thread) == 1  # r's send; q's batch wrote in a thread
                assert len(writes) > 1
            assert (await client.get("/q/messages")).content in (b"left", b"sent")

    asyncio.run(scenario())


def test_a_fetch_or_delete_that_compacts_too_is_stored_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch or delete due to compact its channel's state (a snapshot written under the lock:
    0.2-0.3 s with 200,000 messages in flight) is stored whole in a worker thread, not on the
    event loop (``upkeep_due``), as a send that collects is."""
    monkeypatch.setattr("journalq.queue.channel.SNAPSHOT_EVERY", 4)
    compactions: list[int] = []
    real_compact = Channel._compact

    def compact(self: Channel) -> None:
        compactions.append(threading.get_ident())
        real_compact(self)

    monkeypatch.setattr(Channel, "_compact", compact)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        async with app_client(tmp_path) as client:
            assert (await client.put("/q")).status_code == 201
            for i in range(12):
                assert (await client.post("/q/messages", content=b"%d" % i)).status_code == 201
            for i in range(12):
                fetched = await client.get("/q/messages")
                assert fetched.content == b"%d" % i
                assert (await client.delete(f"/q/messages/{fetched.headers['X-Message-Id']}")).status_code == 204
        assert len(compactions) >= 4 and loop_thread not in compactions

    asyncio.run(scenario())
