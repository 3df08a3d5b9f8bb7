"""Group commit at the request level: concurrent sends to one queue become one ``send_many``.

Each queue has at most one batch being stored at a time (in a worker thread: one write, one sync).
Sends that arrive meanwhile wait on the event loop, not in threads, and go together as the next
batch. So under load the cost of a thread hop, a lock and a sync is shared by every request of a
batch, and each request is still answered only once its message is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence


class SendBatcher:
    """``send(queue, body)`` resolves to the message id once the batch holding it is stored.

    ``store(queue, bodies)`` runs the blocking ``send_many`` (in a thread) and returns the ids; if
    it raises, every send of that batch raises the same error (nothing of a failed batch is kept).
    """

    def __init__(self, store: Callable[[str, Sequence[bytes]], Awaitable[list[str]]], max_batch: int = 1000) -> None:
        self._store = store
        self._max_batch = max_batch
        self._waiting: dict[str, list[tuple[bytes, asyncio.Future[str]]]] = {}
        self._storing: set[str] = set()

    async def send(self, queue: str, body: bytes) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(queue, []).append((body, future))
        if queue not in self._storing:
            self._storing.add(queue)
            asyncio.get_running_loop().create_task(self._drain(queue))
        return await future

    async def _drain(self, queue: str) -> None:
        try:
            while waiting := self._waiting.pop(queue, None):
                batch, rest = waiting[: self._max_batch], waiting[self._max_batch :]
                if rest:
                    self._waiting[queue] = rest + self._waiting.get(queue, [])
                try:
                    ids = await self._store(queue, [body for body, _ in batch])
                except BaseException as exc:  # the batch failed as a whole: so does each send
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for (_, future), message_id in zip(batch, ids):
                        if not future.done():
                            future.set_result(message_id)
        finally:
            self._storing.discard(queue)
