"""Uvicorn's h11 protocol, which ``journalq serve`` runs when httptools is missing, held to what
journalq's httptools protocol does:

- It tells the application when the server begins to stop: long polls (REST's ``wait``, SQS's
  ``WaitTimeSeconds``) end within a second with no message, instead of holding the stop for the
  rest of their wait (up to an hour) and then being cut off by uvicorn's graceful-shutdown timeout.
- It closes connections that wait too long for a request: silently after the keep-alive timeout
  when nothing came, with a 408 when a request head is still not whole after the head timeout.
  Uvicorn's h11 protocol times only the wait after an answer, and stops that timer at the first
  byte that comes: a client that never sent anything, or sent its head a byte at a time, held its
  connection for as long as it liked.
- It cuts off a connection whose client has taken nothing of an answer for the head timeout (one
  that never reads would hold the connection, its answers and its request slot for good).
- A request past the concurrency limit gets the server's busy answer (503 with Retry-After,
  ``polling.busy``), as under httptools, not uvicorn's plain 503.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from journalq.server.polling import (
    DEFAULT_HEAD_TIMEOUT,
    AnswerStall,
    app_attribute,
    busy,
    slow_head_message,
    stop_long_polls,
)


class StoppingH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout: float = app_attribute(self.app, "head_timeout") or DEFAULT_HEAD_TIMEOUT
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall = AnswerStall(self.head_timeout)
        self._stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
        self._wait_for_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # (arms the keep-alive timer)
        if not self.transport.is_closing():
            self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self.resume_writing()  # (stops the stall timer)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall.paused(self.loop.time(), self.transport.get_write_buffer_size())
            self._stall_timer = self.loop.call_later(self.head_timeout, self._look_at_stall)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stall.resumed()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _look_at_stall(self) -> None:
        self._stall_timer = None
        remaining = self._stall.remaining(self.loop.time(), self.transport.get_write_buffer_size())
        if remaining is None:
            return
        if remaining > 0:  # the client took some meanwhile: look again when it could be stalled
            self._stall_timer = self.loop.call_later(remaining, self._look_at_stall)
            return
        if not self.transport.is_closing():
            self.logger.warning("connection closed: its client took nothing of its answer for %g s", self.head_timeout)
        self.transport.abort()  # close() would wait for the buffer to drain: it never does

    def _wait_for_head(self) -> None:
        """The connection waits for a request head from now on: it has ``head_timeout`` seconds."""
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # A head that came whole since the wait began moved h11 on from IDLE (and the answer to
        # its request set a new timer): still IDLE, the wait has lasted the whole head timeout.
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if not self.conn.trailing_data[0]:  # nothing came: closed as an idle one
            self.timeout_keep_alive_handler()
            return
        self.logger.warning("request refused: its head took over %g s", self.head_timeout)
        text = slow_head_message(self.head_timeout).encode()
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(text), text)
        )
        self.transport.close()

    def handle_events(self) -> None:
        # uvicorn makes its limit_concurrency test inline, with no hook to change its plain 503
        # (httptools has _start_asgi_task): the same test, made first, runs the busy answer as
        # the application instead. Connections and tasks cannot change while the events are
        # handled (no await), and a request that begins within them is answered busy.
        limit = self.limit_concurrency
        if limit is None or (len(self.connections) < limit and len(self.tasks) < limit):
            super().handle_events()
            return
        app, self.app, self.limit_concurrency = self.app, self._busy, None
        try:
            super().handle_events()
        finally:
            self.app, self.limit_concurrency = app, limit

    async def _busy(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.logger.warning("Exceeded concurrency limit.")  # (what uvicorn logs of its own 503)
        await busy(scope, receive, send)

    def shutdown(self) -> None:
        # uvicorn calls this on every connection once the server begins to stop, then waits for
        # the requests under way (see ``DirectHttpToolsProtocol.shutdown``).
        stop_long_polls(self.app)
        super().shutdown()


__all__ = ["StoppingH11Protocol"]
