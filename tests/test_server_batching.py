"""The request-level group commit: concurrent sends to a queue share one store call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from journalq.errors import StorageError
from journalq.server.batching import SendBatcher


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


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
