"""Group commit at the request level: concurrent sends to one queue become one store call.

Each queue has at most one batch being stored at a time (the server's: one write, on the event
loop, and one sync, in a worker thread). Sends that arrive meanwhile wait on the event loop, not in
threads, and go together as the next batch. So under load the cost of a thread hop, a lock and a
sync is shared by every request of a batch, and each request is still answered only once its
message is stored.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
Done = Callable[[Result | BaseException], None]

log = logging.getLogger("journalq.server")


class SendBatcher(Generic[Item, Result]):
    """``send(queue, item)`` resolves to the item's result once the batch holding it is stored.

    ``store(queue, items)`` stores the batch (waiting for its sync in a thread) and returns one result per item,
    in order: a value, or an exception that only that item's send raises (an item refused by
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
        self._waiting: dict[str, list[tuple[Item, Callable[[Result | BaseException], None]]]] = {}
        self._storing: set[str] = set()

    async def send(self, queue: str, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.submit(queue, item, functools.partial(_settle, future))
        return await future

    def submit(self, queue: str, item: Item, done: Callable[[Result | BaseException], None]) -> None:
        """``send`` without a future: ``done(outcome)`` is called on the event loop once the batch
        holding ``item`` is stored, with its result or the exception that refused it (for the
        server's direct path, which answers from a callback instead of a task). ``done`` should
        not raise: one that does is logged, and the other sends of its batch are answered all the
        same."""
        self._waiting.setdefault(queue, []).append((item, done))
        if queue not in self._storing:
            self._storing.add(queue)
            asyncio.get_running_loop().create_task(self._drain(queue))

    async def _drain(self, queue: str) -> None:
        try:
            while waiting := self._waiting.pop(queue, None):
                batch, rest = waiting[: self._max_batch], waiting[self._max_batch :]
                if rest:
                    self._waiting[queue] = rest + self._waiting.get(queue, [])
                try:
                    results = await self._store(queue, [item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"storing {len(batch)} sends to {queue!r} gave {len(results)} results")
                except BaseException as exc:  # the batch failed as a whole: so does each send
                    _settle_each(batch, itertools.repeat(exc), queue)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    _settle_each(batch, results, queue)
        finally:
            self._storing.discard(queue)


def _settle_each(
    batch: Sequence[tuple[object, Done[Result]]], outcomes: Iterable[Result | BaseException], queue: str
) -> None:
    """``done(outcome)`` for each send of ``batch``. A ``done`` that raises (the direct path
    writing to a connection its client closed) is logged: leaving ``_drain`` on it left the rest
    of the batch, and the sends that came meanwhile, never answered."""
    for (_, done), outcome in zip(batch, outcomes):
        try:
            done(outcome)
        except Exception:
            log.exception("answering a send to %r failed", queue)


def _settle(future: asyncio.Future[Result], outcome: Result | BaseException) -> None:
    if future.done():  # its send was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
