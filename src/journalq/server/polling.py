"""Long polls taken in slices, so that a poll ends soon after the server begins to stop (or its
client goes away) instead of holding the stop for the rest of its wait; and what both HTTP
protocols (httptools' and the h11 fallback's, which cannot import httptools) answer alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

POLL_SLICE = 1.0
"""Seconds a long poll waits at a time (each slice costs one more look at the queue)."""


def poll_slices(wait: float) -> Iterator[float]:
    """The waits, of at most ``POLL_SLICE`` each, that make up a long poll of ``wait`` seconds;
    the caller receives with each and stops when it got something or should end. At least one
    (0 for no wait)."""
    deadline = time.monotonic() + wait
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        yield min(POLL_SLICE, remaining)
        if remaining <= POLL_SLICE:
            return


DEFAULT_HEAD_TIMEOUT = 10.0
"""Seconds a request head may take, from when the connection began to wait for it, when the
application gives no ``head_timeout`` (journalq's gives its ``body_timeout``)."""


def slow_head_message(head_timeout: float) -> str:
    """The text of the 408 that answers a request head that took too long (either protocol's)."""
    return f"the request head (request line and headers) took over {head_timeout:g} s"


class AnswerStall:
    """Whether a client has taken nothing of an answer for ``limit`` seconds (one that never
    reads would hold its connection, its answers and its request slot for good), as pure logic
    over the times and the transport's buffered bytes the protocol reports. A client that takes
    any of it between two looks is not stalled, however slowly it reads: a large answer may
    keep the buffer over its high-water mark for longer than ``limit``."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.since: float | None = None  # when the client last took some (or writing paused)
        self._left = 0  # the bytes buffered then

    def paused(self, now: float, left: int) -> None:
        """Writing paused (the buffer over its high-water mark) at ``now``, ``left`` bytes buffered."""
        self.since, self._left = now, left

    def resumed(self) -> None:
        self.since = None

    def remaining(self, now: float, left: int) -> float | None:
        """Seconds until the client counts as stalled, as of ``now`` with ``left`` bytes still
        buffered: 0 once it is; None while writing is not paused."""
        if self.since is None:
            return None
        if left < self._left:  # it took some since the last look
            self.since, self._left = now, left
        return max(0.0, self.since + self.limit - now)


BUSY_BODY = b'{"error": "the server is busy: too many requests under way; send again later", "kind": "busy"}'


async def busy(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The answer to a request past the server's concurrency limit (uvicorn's ``limit_concurrency``):
    503 with ``Retry-After``, a JSON body, and the connection closed (as uvicorn's own)."""
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BUSY_BODY)).encode()),
                    (b"retry-after", b"1"), (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": BUSY_BODY, "more_body": False})


def stop_long_polls(app: Any) -> None:
    """Tell the application under uvicorn's middleware that the server is stopping: its
    ``stop_waiting()``, when it has one (journalq's app), ends its long polls within a slice. For
    the HTTP protocols' ``shutdown``; being told again does no harm."""
    stop_waiting = app_attribute(app, "stop_waiting")
    if stop_waiting is not None:
        stop_waiting()


def app_attribute(app: Any, name: str) -> Any:
    """The attribute ``name`` of the application under uvicorn's middleware (``.app`` of each),
    or None."""
    while app is not None:
        value = getattr(app, name, None)
        if value is not None:
            return value
        app = getattr(app, "app", None)
    return None
