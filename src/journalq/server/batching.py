"""Group commit at the request level: concurrent sends to one queue become one store call.

Each queue has at most one batch being stored at a time (in a worker thread: one write, one sync).
Sends that arrive meanwhile wait on the event loop, not in threads, and go together as the next
batch, which is handed to the store as soon as the one before is stored, before that one's
answers are written. So under load the cost of a thread hop, a lock and a sync is shared by every request of a
batch, and each request is still answered only once its message is stored.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
Waiting = tuple[Item, Callable[[Result | BaseException], None]]
"""A send waiting for its batch: the item, and what to call with its outcome."""


class SendBatcher(Generic[Item, Result]):
    """``send(queue, item)`` resolves to the item's result once the batch holding it is stored.

    ``store(queue, items)`` begins the blocking store at once (hands it to a thread) and returns an
    awaitable of one result per item, in order: a value, or an exception that only that item's send raises (an item refused by
    itself, as a bad SQS request). If ``store`` raises, every send of that batch raises the same
    error (a failed batch keeps nothing). REST sends are bodies and get message ids; SQS sends are
    whole SendMessage requests and get their answers.
    """

    def __init__(
        self,
        store: Callable[[str, Sequence[Item]], Awaitable[Sequence[Result | Exception]]],
        max_batch: int = 1000,
    ) -> None:
        self._store = store
        self._max_batch = max_batch
        self._waiting: dict[str, list[Waiting[Item, Result]]] = {}
        self._storing: set[str] = set()

    async def send(self, queue: str, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.submit(queue, item, functools.partial(_settle, future))
        return await future

    def submit(self, queue: str, item: Item, done: Callable[[Result | BaseException], None]) -> None:
        """``send`` without a future: ``done(outcome)`` is called on the event loop once the batch
        holding ``item`` is stored, with its result or the exception that refused it (for the
        server's direct path, which answers from a callback instead of a task). ``done`` must not
        raise."""
        self._waiting.setdefault(queue, []).append((item, done))
        if queue not in self._storing:
            self._storing.add(queue)
            asyncio.get_running_loop().create_task(self._drain(queue))

    async def _drain(self, queue: str) -> None:
        try:
            storing = self._next_batch(queue)
            while storing is not None:
                batch, stored = storing
                storing = None
                outcomes: Sequence[Result | BaseException]
                try:
                    outcomes = await stored
                    if len(outcomes) != len(batch):
                        raise RuntimeError(f"storing {len(batch)} sends to {queue!r} gave {len(outcomes)} results")
                except BaseException as exc:  # the batch failed as a whole: so does each send
                    for _, done in batch:
                        done(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    # The sends that came meanwhile begin storing before this batch is answered:
                    # the store's thread (writing, syncing) then works while the event loop
                    # answers, instead of waiting for every answer to be written first.
                    storing = self._next_batch(queue)
                    for (_, done), outcome in zip(batch, outcomes):
                        done(outcome)
                if storing is None:  # sends made by the answers (a connection's pipelined requests)
                    storing = self._next_batch(queue)
        finally:
            self._storing.discard(queue)

    def _next_batch(self, queue: str) -> tuple[list[Waiting[Item, Result]], asyncio.Future[Sequence[Result | Exception]]] | None:
        """The sends waiting for ``queue`` (at most ``max_batch``) and their store, begun; or None."""
        waiting = self._waiting.pop(queue, None)
        if not waiting:
            return None
        batch, rest = waiting[: self._max_batch], waiting[self._max_batch :]
        if rest:
            self._waiting[queue] = rest
        stored: asyncio.Future[Sequence[Result | Exception]]
        try:
            stored = asyncio.ensure_future(self._store(queue, [item for item, _ in batch]))
        except Exception as exc:  # it could not even begin: the batch fails as any failed store
            stored = asyncio.get_running_loop().create_future()
            stored.set_exception(exc)
        return batch, stored


def _settle(future: asyncio.Future[Result], outcome: Result | BaseException) -> None:
    if future.done():  # its send was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
