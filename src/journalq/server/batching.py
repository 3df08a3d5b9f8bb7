"""Group commit at the request level: concurrent requests of one kind to one queue (sends,
fetches, deletes) become one store call.

Each queue has at most one batch of a kind being stored at a time (the server's: one write, on
the event loop, and one sync, on the loop or in a worker thread as ``SyncPlacement`` says).
Requests that arrive meanwhile wait on the event loop, not in threads, and go together as the
next batch. So under load the cost of a lock and a sync is shared by every request of a batch,
and each request is still answered only once what it changed is stored.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Generic, TypeVar

# Syncs on the event loop that take longer than this (seconds), as a moving average, are slow:
# the syncs go to worker threads for ``SLOW_SYNC_BACKOFF`` seconds, twice as long each time the
# first sync tried on the loop after it is slow again, up to ``SLOW_SYNC_BACKOFF_MAX``.
QUICK_SYNC = 0.002
SLOW_SYNC_BACKOFF = 1.0
SLOW_SYNC_BACKOFF_MAX = 64.0
# The weight of each sync in the moving average: one outlier among quick syncs (the disk busy
# with another file for 5-10 ms) moves it too little to send the syncs to threads.
SYNC_WEIGHT = 0.1

Item = TypeVar("Item")
Result = TypeVar("Result")
Done = Callable[[Result | BaseException], None]

log = logging.getLogger("journalq.server")


class SyncPlacement:
    """Where a batch's sync runs: on the event loop while syncs are quick, else in a worker thread.

    On the loop, a sync costs no thread hop: the batch's requests are answered in the same step,
    and the GIL is not handed to a thread and back (measured at 64 clients: a fifth to a third
    less server CPU a request, and half as many syncs).
    But the loop does nothing else while the disk syncs, so syncs run there only while they are
    quick: when their moving average (``SYNC_WEIGHT``) passes ``quick`` seconds, they go to
    threads for ``backoff`` seconds; then they are tried on the loop again, judged afresh (the
    first slow one sends them back), and each time the first is slow the wait doubles, up to
    ``longest``. A disk that turns slow thus stalls the loop for a few syncs, then for one after
    1, 2, 4 ... seconds. Only syncs on the loop are timed: a thread's sync also waits for the busy
    loop to let the GIL go (up to the interpreter's switch interval, 5 ms), which says nothing
    of the disk.

    No I/O here: the caller times each sync on the loop (``took``) and passes the clock in."""

    __slots__ = ("quick", "first_backoff", "longest", "_typical", "_backoff", "_threads_until", "_retry")

    def __init__(self, quick: float | None = None, backoff: float | None = None, longest: float | None = None) -> None:
        self.quick = QUICK_SYNC if quick is None else quick
        self.first_backoff = SLOW_SYNC_BACKOFF if backoff is None else backoff
        self.longest = SLOW_SYNC_BACKOFF_MAX if longest is None else longest
        self._typical = 0.0  # the moving average of the syncs on the loop (seconds)
        self._backoff = self.first_backoff
        self._threads_until = float("-inf")
        self._retry = False  # the next sync on the loop is the first after a backoff

    def on_loop(self, now: float) -> bool:
        """Whether the next sync may run on the event loop (``now``: ``time.monotonic()``)."""
        return now >= self._threads_until

    def took(self, seconds: float, now: float) -> None:
        """A sync on the loop took ``seconds``, ending at ``now``."""
        retry, self._retry = self._retry, False
        self._typical += (seconds - self._typical) * SYNC_WEIGHT
        if self._typical <= self.quick:
            return
        self._backoff = min(self._backoff * 2, self.longest) if retry else self.first_backoff
        self._threads_until = now + self._backoff
        # Judged afresh after the wait: from the threshold, which the first slow sync passes.
        self._typical = self.quick
        self._retry = True


class Batcher(Generic[Item, Result]):
    """``call(queue, item)`` resolves to the item's result once the batch holding it is stored.

    ``store(queue, items)`` stores the batch (waiting for its sync) and returns one result per item,
    in order: a value, or an exception that only that item's call raises (an item refused by
    itself, as a bad SQS request). If ``store`` raises, every call of that batch raises the same
    error (a failed batch keeps nothing). The server's batchers: REST sends (bodies, which get
    message ids), SQS sends (whole SendMessage requests, which get their answers), REST fetches
    (their visibility timeouts; each gets a message or none) and REST deletes (message ids).
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

    @property
    def storing(self) -> int:
        """How many queues have a batch being stored, or about to be (its task made)."""
        return len(self._storing)

    async def call(self, queue: str, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.submit(queue, item, functools.partial(_settle, future))
        return await future

    def submit(self, queue: str, item: Item, done: Callable[[Result | BaseException], None]) -> None:
        """``call`` without a future: ``done(outcome)`` is called on the event loop once the batch
        holding ``item`` is stored, with its result or the exception that refused it (for the
        server's direct path, which answers from a callback instead of a task). ``done`` should
        not raise: one that does is logged, and the other calls of its batch are answered all the
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
                        raise RuntimeError(f"storing a batch of {len(batch)} for {queue!r} gave {len(results)} results")
                except BaseException as exc:  # the batch failed as a whole: so does each call
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
    """``done(outcome)`` for each call of ``batch``. A ``done`` that raises (the direct path
    writing to a connection its client closed) is logged: leaving ``_drain`` on it left the rest
    of the batch, and the sends that came meanwhile, never answered."""
    for (_, done), outcome in zip(batch, outcomes):
        try:
            done(outcome)
        except Exception:
            log.exception("answering a request to %r failed", queue)


def _settle(future: asyncio.Future[Result], outcome: Result | BaseException) -> None:
    if future.done():  # its call was cancelled meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
