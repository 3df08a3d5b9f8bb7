"""Uvicorn's httptools protocol with a limit on the request head, and a direct path for the
busiest requests.

httptools keeps a header line that has not ended in memory however long it grows (a 13 MB header
line was taken whole), and uvicorn sets no limit on it (only its h11 protocol has one,
``h11_max_incomplete_event_size``). ``HeadLimitedHttpToolsProtocol`` answers 431 and closes the
connection once a request's head (request line and headers) passes the limit that uvicorn gives
its h11 protocol (``h11_max_incomplete_event_size``), so that both protocols take the same heads.

``DirectHttpToolsProtocol`` (what ``journalq serve`` runs) also hands the busiest requests
(``POST /{queue}/messages`` and SQS's sends, mq's fetches and deletes: those the application's
``direct_route`` takes) to the application without ASGI when the whole body came with the head:
uvicorn's ASGI layer (a task, a request cycle's coroutines, two ``send`` calls) costs more CPU
per request than journalq's own work on it, and with durable writes sharing their syncs, CPU
per request is what bounds throughput. Everything else goes through ASGI as before. It also
closes connections that wait too long for a request (idle ones, and heads that do not end: 408)
with one timer for all of them (``_IdleSweep``) instead of uvicorn's timer per answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from journalq.server.polling import (
    DEFAULT_HEAD_TIMEOUT,
    AnswerStall,
    app_attribute,
    busy,
    slow_head_message,
    stop_long_polls,
)

DEFAULT_MAX_HEAD = 16 * 1024
"""The limit when uvicorn's configuration gives none (h11's default)."""


class HeadLimitedHttpToolsProtocol(HttpToolsProtocol):
    """Counts the bytes of each request's head as they arrive and refuses it past the limit.

    The parser's callbacks do not say where in a chunk a head began, so only chunks that fall
    whole inside one head are counted: a head is refused at most one chunk (one socket read)
    past the limit, and never before it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._heads_begun = 0
        self._head_bytes = 0
        self.max_head: int = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_HEAD

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._heads_begun += 1
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        begun = self._heads_begun
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if begun == self._heads_begun:  # this whole chunk is part of the head under way
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._refuse_head()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Past ``limit_concurrency`` uvicorn answers with its own plain 503, which says nothing of
        # when to come back: the server's other 503s carry Retry-After, and so does this one.
        super()._start_asgi_task(cycle, busy if app is service_unavailable else app)

    def _refuse_head(self) -> None:
        self.logger.warning("request refused: its head is over %d bytes", self.max_head)
        self._refuse(431, f"the request head (request line and headers) is over {self.max_head} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with ``message`` (plain text) and close the connection."""
        text = message.encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"),
                   (b"content-length", str(len(text)).encode()), _CLOSE]
        self.transport.write(_encoded(status, self.server_state.default_headers, headers, text))
        self.transport.close()


DirectRoute = Callable[[dict[str, Any]], Any]
"""``route(scope)``: the application's direct handler for the request, or None. A handler is
called as ``handler(scope, body, respond)`` and returns whether it took the request; it answers
later with ``respond(status, headers, body)`` (headers with content-length)."""

_CLOSE = (b"connection", b"close")


class DirectHttpToolsProtocol(HeadLimitedHttpToolsProtocol):
    """Requests that the application's ``direct_route(scope)`` has a handler for, and whose whole
    body arrived in the same read as the rest of them (nearly all small bodies), are given to
    that handler instead of an ASGI task; it answers through ``_answer``, which writes what
    uvicorn's ``send`` would (its default headers, ``connection: close`` when the connection is
    not kept alive) and then lets the connection go on as uvicorn does (pipelined requests,
    graceful shutdown, which waits for the answer as for any other). Such a request in its
    plainest shape does without uvicorn's request cycle too (``_begin_direct``, ``_DirectCycle``).

    Connections waiting for a request are closed by one sweep per server (``_IdleSweep``), not
    by uvicorn's timer per answer: after the keep-alive timeout when nothing came (also when
    nothing ever did), with a 408 when a request head is not whole after ``head_timeout``. The
    sweep also cuts off a connection whose client has taken nothing of an answer for
    ``head_timeout`` (one that never reads).

    The rest goes through ASGI unchanged: a body still on its way (read by the application, with
    its timeout), ``Expect: 100-continue``, requests refused for the concurrency limit, and those
    that the handler declines (it answers nothing then).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._direct_route: DirectRoute | None = app_attribute(self.app, "direct_route")
        self._reading = False
        self._pending: tuple[RequestResponseCycle, Any, Any] | None = None  # cycle, app, handler
        # Loop time since when the connection waits for a request head: since it was made, or its
        # last answer went out; None while a request is read or answered.
        self.idle_since: float | None = None
        self.head_timeout: float = app_attribute(self.app, "head_timeout") or DEFAULT_HEAD_TIMEOUT
        # Whether an answer waits for a client that takes none of it (looked at by the sweep).
        self.stall = AnswerStall(self.head_timeout)

    def shutdown(self) -> None:
        # uvicorn calls this on every connection once the server begins to stop, then waits for
        # the requests under way: tell the application (once is enough; it may be told again),
        # so that its long polls end now rather than when their wait is over.
        stop_long_polls(self.app)
        super().shutdown()

    # -- waiting for requests: the server's sweep closes connections, not a timer each ---------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that never sends a request is idle too (uvicorn would hold it forever).
        self.idle_since = self.loop.time()
        _IdleSweep.of(self.server_state, self.loop, self.timeout_keep_alive).watch()

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when bytes come in and when the connection is lost: the wait for a
        # head ends when the head is whole (``on_headers_complete``), not at its first bytes.
        pass

    def on_headers_complete(self) -> None:
        self.idle_since = None
        if not self._begin_direct():
            super().on_headers_complete()

    def _begin_direct(self) -> bool:
        """The head of a request that the direct path may take, in the plainest shape (an HTTP/1.1
        POST to a path with no query nor escapes, no upgrade, no ``Expect``, nothing before it
        still unanswered, under the concurrency limit): its scope completed and a ``_DirectCycle``
        begun, without uvicorn's request cycle, its event and the URL's parsing (~0.7 µs of the
        ~5 µs that the protocol costs a request). Anything else (False) takes uvicorn's way."""
        parser = self.parser
        url = self.url
        if (
            self._direct_route is None
            or self.expect_100_continue
            or (self.cycle is not None and not self.cycle.response_complete)
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or url[:1] != b"/"
            or self.root_path
            or (self.limit_concurrency is not None
                and (len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency))
        ):
            return False
        try:
            path = url.decode("ascii")
        except UnicodeDecodeError:
            return False
        # Looked for in the text, not in ``url``: ``bytes in bytes`` first tries its operand as an
        # int, raising and clearing a TypeError each time (~1,800 instructions, three a request).
        if "?" in path or "%" in path or "#" in path:
            return False
        scope = self.scope
        scope["path"] = path
        scope["method"] = "POST"
        scope["raw_path"] = url
        scope["query_string"] = b""
        handler = self._direct_route(scope)
        if handler is None:
            return False
        self._in_head = False  # what ``HeadLimitedHttpToolsProtocol.on_headers_complete`` notes
        self.cycle = cycle = _DirectCycle(  # type: ignore[assignment]
            scope, parser.should_keep_alive(), self.server_state.default_headers, self.on_response_complete
        )
        self._pending = (cycle, self.app, handler)  # taken in on_message_complete, or by ASGI
        return True

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stall.paused(self.loop.time(), self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stall.resumed()

    def timed_out(self, now: float) -> None:
        """Called by the sweep: close the connection if it has waited too long for a request, with
        a 408 if one had begun to come (its head unfinished), silently if none had; and if its
        client has taken nothing of an answer for ``head_timeout`` (a client that never reads would
        hold the connection, its answers and its request slot for good)."""
        stalled = self.stall.remaining(now, self.transport.get_write_buffer_size()) == 0
        if stalled and not self.transport.is_closing():
            self.stall.resumed()
            self.logger.warning("connection closed: its client took nothing of its answer for %g s", self.head_timeout)
            self.transport.abort()  # close() would wait for the buffer to drain: it never does
            return
        since = self.idle_since
        if since is None or self.transport.is_closing():
            return
        if self._in_head:
            if now - since >= self.head_timeout:
                self.idle_since = None
                self.logger.warning("request refused: its head took over %g s", self.head_timeout)
                self._refuse(408, slow_head_message(self.head_timeout))
        elif now - since >= self.timeout_keep_alive:
            self.idle_since = None
            self.timeout_keep_alive_handler()  # closes the transport

    def on_response_complete(self) -> None:
        # uvicorn's, but for the keep-alive timer: a loop timer set and cancelled for every request
        # cost about a third of the direct path's HTTP handling (~2.6 of ~8 µs of CPU here).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        flow = self.flow
        if flow.read_paused:  # (what resume_reading looks at first: a call less per answer)
            flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            super().data_received(data)
        finally:
            self._reading = False
        if self._pending is not None:  # its body is not all there: the application reads it
            cycle, app, _ = self._pending
            self._pending = None
            self._asgi(cycle, app)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Called once a request's turn comes: at once, or after the answer before it (pipelining).
        if self._direct_route is not None and app is self.app and not cycle.waiting_for_100_continue:
            handler = self._direct_route(cycle.scope)
            if handler is not None:
                if cycle.more_body:
                    if self._reading:  # the rest may be in this read: see on_message_complete
                        self._pending = (cycle, app, handler)
                        return
                elif self._direct(cycle, handler):
                    return
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not _DirectCycle:
            super().on_body(body)
        elif not cycle.response_complete:
            # uvicorn's, for a request on its way to the direct path: with no upgrade to look for
            # (``_begin_direct`` takes none) and no reader to wake (``_NoWaiter``).
            cycle.body += body
            if len(cycle.body) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not _DirectCycle:
            super().on_message_complete()
        elif not cycle.response_complete:  # as on_body
            cycle.more_body = False
        pending = self._pending
        if pending is not None and pending[0] is self.cycle:
            self._pending = None
            cycle, app, handler = pending
            if not self._direct(cycle, handler):
                self._asgi(cycle, app)

    def _asgi(self, cycle: Any, app: Any) -> None:
        """An ASGI task for a request that the direct path does not take, with uvicorn's own
        request cycle in place of a ``_DirectCycle`` (holding what came of the body so far)."""
        if isinstance(cycle, _DirectCycle):
            light, cycle = cycle, RequestResponseCycle(
                scope=cycle.scope, transport=self.transport, flow=self.flow, logger=self.logger,
                access_logger=self.access_logger, access_log=self.access_log,
                default_headers=cycle.default_headers, message_event=asyncio.Event(), expect_100_continue=False,
                keep_alive=cycle.keep_alive, on_response=self.on_response_complete,
            )
            cycle.body, cycle.more_body, cycle.disconnected = light.body, light.more_body, light.disconnected
            if cycle.body or not cycle.more_body or cycle.disconnected:
                cycle.message_event.set()  # what came is there to be received
            if self.cycle is light:
                self.cycle = cycle
        super()._start_asgi_task(cycle, app)

    def _direct(self, cycle: RequestResponseCycle, handler: Any) -> bool:
        taken: bool = handler(cycle.scope, bytes(cycle.body), DirectReply(self, cycle))
        return taken

    def _answer(
        self, cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        # The client went away meanwhile (a pipelined request's cycle is not told: the transport
        # is, and uvloop raises on a write to a lost connection).
        if cycle.disconnected or cycle.response_complete or self.transport.is_closing():
            return
        cycle.response_started = True
        if _CLOSE in headers:
            cycle.keep_alive = False
        elif not cycle.keep_alive:  # HTTP/1.0, Connection: close, or shutting down
            headers = [*headers, _CLOSE]
        self.transport.write(_encoded(status, cycle.default_headers, headers, body))
        cycle.response_complete = True
        if type(cycle) is not _DirectCycle:  # (whose event wakes nobody)
            cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()


class DirectReply:
    """The ``respond`` that a direct request's handler is given: called with the whole answer
    (status, headers with content-length, body), which it writes as uvicorn's ``send`` would;
    ``gone()`` tells whether the client went away meanwhile (a long poll then ends early)."""

    __slots__ = ("_protocol", "_cycle")

    def __init__(self, protocol: DirectHttpToolsProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle

    def __call__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self._protocol._answer(self._cycle, status, headers, body)

    def gone(self) -> bool:
        """Whether the client went away (asked from a worker thread too: two flags read). A
        pipelined request's cycle is not told, but the transport is closing."""
        return self._cycle.disconnected or self._protocol.transport.is_closing()


class _NoWaiter:
    """The event of a ``_DirectCycle``: nobody waits for its body (uvicorn's parser callbacks and
    ``connection_lost`` set it; the ASGI app that would wait has a real event)."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_WAITER = _NoWaiter()


class _DirectCycle:
    """What uvicorn's protocol and ``DirectHttpToolsProtocol._answer`` use of a request cycle, for
    a request on its way to the direct path: the scope, the body as it comes, and the state of
    the connection and the answer. ``_asgi`` trades it for uvicorn's own cycle if the request
    goes to the application after all."""

    __slots__ = ("scope", "body", "more_body", "keep_alive", "default_headers", "on_response", "disconnected",
                 "response_started", "response_complete")
    message_event = _NO_WAITER

    def __init__(
        self, scope: Any, keep_alive: bool, default_headers: list[tuple[bytes, bytes]], on_response: Callable[[], None]
    ) -> None:
        self.scope = scope
        self.body = bytearray()
        self.more_body = True
        self.keep_alive = keep_alive
        self.default_headers = default_headers
        self.on_response = on_response
        self.disconnected = False
        self.response_started = False
        self.response_complete = False


class _IdleSweep:
    """Offers every connection of one server (its ``ServerState``) to close itself if it has
    waited too long for a request (``DirectHttpToolsProtocol.timed_out``): one timer for all of
    them, firing every ``timeout / 5`` seconds (the keep-alive timeout), at most every second,
    while the server has connections. So a connection is closed between its timeout and that
    plus a fifth of the keep-alive timeout (at most 1 s)."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._state = state
        self._loop = loop
        self._every = min(1.0, timeout / 5)
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, state: ServerState, loop: asyncio.AbstractEventLoop, timeout: float) -> _IdleSweep:
        sweep: _IdleSweep | None = getattr(state, "journalq_idle_sweep", None)
        if sweep is None or sweep._loop is not loop:
            sweep = cls(state, loop, timeout)
            state.journalq_idle_sweep = sweep  # type: ignore[attr-defined]
        return sweep

    def watch(self) -> None:
        """Sweep from now on (a connection was made)."""
        if self._timer is None:
            self._timer = self._loop.call_later(self._every, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = self._loop.time()
        for connection in list(self._state.connections):
            if isinstance(connection, DirectHttpToolsProtocol):
                connection.timed_out(now)
        if self._state.connections:
            self.watch()


def _encoded(
    status: int, default_headers: list[tuple[bytes, bytes]], headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A whole HTTP/1.1 answer as uvicorn writes it: status line, its default headers (server,
    date), the answer's own, and the body."""
    heads = _heads
    if heads[0] is not default_headers:
        heads = _new_heads(default_headers)
    head = heads[1].get(status)
    if head is None:
        head = heads[1][status] = b"".join(
            [STATUS_LINE[status], *(b"%s: %s\r\n" % (name, value) for name, value in default_headers)]
        )
    content = [head]
    for name, value in headers:
        content += (name, b": ", value, b"\r\n")
    content += (b"\r\n", body)
    return b"".join(content)


_heads: tuple[object, dict[int, bytes]] = (None, {})
"""(uvicorn's default headers, each status's line with them): what begins an answer, joined
once per status while uvicorn keeps the same headers (it makes new ones each second, for the
date), not at each answer. One tuple, read and replaced whole: the servers of other threads
(their own default headers) never use each other's."""


def _new_heads(default_headers: list[tuple[bytes, bytes]]) -> tuple[object, dict[int, bytes]]:
    global _heads
    _heads = (default_headers, {})
    return _heads


__all__ = [
    "DEFAULT_HEAD_TIMEOUT",
    "DEFAULT_MAX_HEAD",
    "DirectHttpToolsProtocol",
    "HeadLimitedHttpToolsProtocol",
]
