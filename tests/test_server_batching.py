"""The request-level group commit: concurrent sends to a queue share one store call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from journalq.errors import StorageError, TaskNotFoundError
from journalq.journal.sync import syncs_done
from journalq.server.app import create_app
from journalq.server.batching import SendBatcher
from journalq.server.config import ServerConfig


def test_concurrent_sends_share_store_calls_and_keep_their_ids() -> None:
    calls: list[tuple[str, list[bytes]]] = []
    stored: dict[str, list[bytes]] = {}

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        calls.append((queue, list(bodies)))
        await asyncio.sleep(0.01)  # a slow sync: sends pile up behind it
        log = stored.setdefault(queue, [])
        first = len(log)
        log.extend(bodies)
        return [f"{queue}:{first + i}" for i in range(len(bodies))]

    async def main() -> list[str]:
        batcher = SendBatcher(store)
        return await asyncio.gather(*(batcher.send("q" if i % 2 else "r", b"%d" % i) for i in range(200)))

    ids = asyncio.run(main())
    assert len(calls) < 20  # 200 sends, a few batches per queue
    assert all(len({q for q, _ in calls if q == name}) == 1 for name in ("q", "r"))
    for i, message_id in enumerate(ids):
        queue, offset = message_id.split(":")
        assert stored[queue][int(offset)] == b"%d" % i  # every id names its own body


def test_a_failed_batch_fails_each_of_its_sends_and_the_next_batch_goes_on() -> None:
    attempts = 0

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.01)
        if attempts == 1:
            raise StorageError("disk full")
        return [str(i) for i in range(len(bodies))]

    async def main() -> tuple[list[object], str]:
        batcher = SendBatcher(store)
        first = await asyncio.gather(*(batcher.send("q", b"x") for _ in range(5)), return_exceptions=True)
        return first, await batcher.send("q", b"y")

    first, later = asyncio.run(main())
    assert all(isinstance(result, StorageError) for result in first)
    assert later == "0"


def test_batches_are_bounded() -> None:
    sizes: list[int] = []

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        sizes.append(len(bodies))
        await asyncio.sleep(0)
        return ["i"] * len(bodies)

    async def main() -> None:
        batcher = SendBatcher(store, max_batch=10)
        await asyncio.gather(*(batcher.send("q", b"x") for _ in range(35)))

    asyncio.run(main())
    assert sum(sizes) == 35 and max(sizes) <= 10


def test_a_send_refused_by_itself_fails_alone() -> None:
    async def store(queue: str, items: Sequence[bytes]) -> list[str | Exception]:
        await asyncio.sleep(0)
        return [TaskNotFoundError("refused") if item == b"bad" else item.decode() for item in items]

    async def main() -> list[object]:
        batcher: SendBatcher[bytes, str] = SendBatcher(store)
        return await asyncio.gather(*(batcher.send("q", b) for b in (b"a", b"bad", b"c")), return_exceptions=True)

    a, bad, c = asyncio.run(main())
    assert (a, c) == ("a", "c") and isinstance(bad, TaskNotFoundError)


def test_a_store_giving_too_few_results_fails_its_batch_not_hangs() -> None:
    async def store(queue: str, items: Sequence[bytes]) -> list[str]:
        return ["only one"]

    async def main() -> list[object]:
        batcher: SendBatcher[bytes, str] = SendBatcher(store)
        return await asyncio.gather(*(batcher.send("q", b"x") for _ in range(3)), return_exceptions=True)

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(main()))


SQS = {"Content-Type": "application/x-amz-json-1.0"}


def test_concurrent_sqs_and_rest_sends_share_syncs(tmp_path: Path) -> None:
    """Through the app (sync always): 40 concurrent SendMessage and 40 REST POSTs take far
    fewer syncs than 80, and every one is answered with its own message, stored once."""

    async def scenario() -> tuple[int, list[httpx.Response], list[httpx.Response]]:
        app = create_app(ServerConfig(data=tmp_path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.put("/q")).status_code == 201
                url = "http://testserver/000000000000/q"
                before = syncs_done()
                sqs = [client.post("/", headers={**SQS, "X-Amz-Target": "AmazonSQS.SendMessage"},
                                   content=json.dumps({"QueueUrl": url, "MessageBody": f"sqs {i}"}))
                       for i in range(40)]
                rest = [client.post("/q/messages", content=b"rest %d" % i) for i in range(40)]
                answers = await asyncio.gather(*sqs, *rest)
                syncs = syncs_done() - before
                received = []
                while (got := await client.get("/q/messages")).status_code == 200:
                    received.append(got)
        return syncs, answers, received

    syncs, answers, received = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 40 + [201] * 40
    ids = [a.json()["MessageId"] for a in answers[:40]] + [a.headers["X-Message-Id"] for a in answers[40:]]
    assert len(set(ids)) == 80
    assert sorted(r.content for r in received) == sorted(
        [b"sqs %d" % i for i in range(40)] + [b"rest %d" % i for i in range(40)]
    )
    # One per batch: a few. (Sent one request per thread, the SQS sends took about 24: the
    # journal's own group commit shares syncs only between threads that overlap.)
    assert 0 < syncs <= 10, syncs


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
