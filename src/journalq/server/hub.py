"""The hub's HTTP endpoints: an ``APIRouter`` over a ``journalq.hub.HubStore``.

``journalq hub serve`` serves only these (``create_hub_app``); ``journalq serve`` includes them
too, with its copies under ``DATA/.hub`` (a name no queue can take).

    GET  /hub/v1/status                                      every copy: client -> journal -> offsets
    GET  /hub/v1/journals/{client}/{journal}                 what the hub holds of one journal
    POST /hub/v1/journals/{client}/{journal}?first=&segment= a push: the journal's own bytes
    GET  /hub/v1/journals/{client}/{journal}/messages?offset=&max_bytes=
                                                             the copy's bytes from an offset (sej's Get)

A push is answered only once it is synced. Refusals are JSON ``{"error", "kind"}``: 400 for a bad
client id, journal path or damaged message, 409 for a gap (with ``next``, the offset the hub holds
up to) or messages that differ from the ones held, 503 with ``Retry-After`` when the storage fails
or another program (an exclusive writer) holds the copy's lock for now, the hub is shutting down,
or it is handling ``max_requests`` requests already (``kind`` busy, the connection closed),
500 for trouble with the hub's own copy (damaged, say, with ``damaged`` true: logged, and pushed
again by a following pusher; one that is not following stops that journal).
An error of the operating system met outside a journal (listing the copies, making the root) is
503 ``storage`` for a full disk, a quota or an I/O error (``STORAGE_ERRNOS``, as ``journalq
serve`` answers them), else 500 ``storage`` naming it; any other error is 500 ``internal``,
logged with its traceback. No answer names where the hub keeps its copies.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse

from journalq import __version__
from journalq.errors import (
    STORAGE_ERRNOS,
    CorruptionError,
    Error,
    HubConflictError,
    HubError,
    HubGapError,
    HubUnavailableError,
    JournalError,
    LockedError,
    OffsetOutOfRangeError,
    StorageError,
)
from journalq.hub.protocol import API_PREFIX, Push
from journalq.hub.store import HubStore, damage_reason
from journalq.server.config import ServerConfig
from journalq.server.tokens import bearer_matches

__all__ = ["DEFAULT_MAX_PUSH", "DEFAULT_MAX_REQUESTS", "HUB_DIR", "create_hub_app", "hub_router"]

log = logging.getLogger("journalq.server")
T = TypeVar("T")

HUB_DIR = ".hub"
"""Where ``journalq serve`` keeps the hub's copies in its data directory."""
DEFAULT_MAX_PUSH = 64 * 1024 * 1024
"""The largest push body taken (a client sends smaller ones; one message may need more)."""
DEFAULT_MAX_REQUESTS = 64
"""Requests the hub's endpoints handle at once; past it they answer 503 at once. Each may hold a
push body (up to ``max_push`` bytes) and, to store it, a thread (anyio lends 40)."""
DEFAULT_BODY_TIMEOUT = ServerConfig.body_timeout
"""Seconds a push body may bring no bytes before it is answered 408 (``journalq serve``'s)."""
BYTES_TYPE = "application/octet-stream"


class _Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


def _refusal(exc: Exception, root: Path) -> _Refused:
    """The answer to an error of the store whose copies are in ``root``. A journal's error says
    what is wrong (its reason; damage, in which copy's file), never where the data is kept: as
    journalq serve's answers."""
    if isinstance(exc, StorageError):
        return _Refused(503, {"error": f"not stored: {exc.reason}", "kind": "storage"}, {"Retry-After": "1"})
    if isinstance(exc, LockedError):  # another program's lock
        return _Refused(503, {"error": f"not stored: {exc.reason}", "kind": "locked"}, {"Retry-After": "1"})
    if isinstance(exc, HubUnavailableError):  # a shutdown
        return _Refused(503, {"error": f"not stored: {exc}", "kind": exc.kind}, {"Retry-After": "1"})
    if isinstance(exc, HubGapError):
        return _Refused(409, {"error": str(exc), "kind": exc.kind, "next": exc.held})
    if isinstance(exc, HubConflictError):
        return _Refused(409, {"error": str(exc), "kind": exc.kind})
    if isinstance(exc, OffsetOutOfRangeError):
        return _Refused(416, {"error": exc.reason, "kind": "offset"})
    if isinstance(exc, HubError):
        return _Refused(404 if type(exc) is HubError else 400, {"error": str(exc), "kind": exc.kind})
    # What is left is the hub's own trouble (a damaged copy, say), not the request's: a 500,
    # which a pusher waits out and pushes again, never a 4xx it would take as a refusal for good.
    if isinstance(exc, JournalError):
        log.error("hub journal failure: %s", exc)  # logged whole, with its file
        if isinstance(exc, CorruptionError):  # said so: a pusher would take it for its own journal's
            body = {"error": f"the copy is {damage_reason(exc, root)}", "kind": "journal", "damaged": True}
            return _Refused(500, body)
        return _Refused(500, {"error": exc.reason, "kind": "journal"})
    if isinstance(exc, OSError):  # met outside a journal: its message would name the file
        log.error("hub storage failure: %s", exc)
        reason = exc.strerror or type(exc).__name__
        if exc.errno in STORAGE_ERRNOS:
            return _Refused(503, {"error": f"not done: {reason}", "kind": "storage"}, {"Retry-After": "1"})
        return _Refused(500, {"error": f"the hub's storage failed: {reason}", "kind": "storage"})
    if isinstance(exc, Error):
        log.error("hub failure: %s", exc)
        return _Refused(500, {"error": str(exc), "kind": "journal"})
    log.error("hub failure", exc_info=exc)  # a bug: its traceback in the log, not in the answer
    return _Refused(
        500, {"error": f"the hub failed unexpectedly ({type(exc).__name__}); its log says more", "kind": "internal"}
    )


def hub_router(
    root: str | Path,
    *,
    sync: str = "always",
    max_push: int = DEFAULT_MAX_PUSH,
    token: str | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_requests: int = DEFAULT_MAX_REQUESTS,
) -> APIRouter:
    """The hub's endpoints over the copies in ``root`` (opened at the first request). ``token``:
    a bearer token every request must carry (401 otherwise). ``body_timeout``: a push whose
    body brings no bytes for this many seconds is answered 408. ``max_requests``: requests
    handled at once; past it, 503 at once."""
    box: list[HubStore] = []
    opening = anyio.Lock()
    under_way = [0]  # requests being handled: the event loop's alone, so no lock

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if box:
                await anyio.to_thread.run_sync(box.pop().close)

    async def authorized(request: Request) -> None:
        if token is None:
            return
        if not bearer_matches(request.headers.get("authorization", "").encode("latin-1"), token):
            raise _Refused(401, {"error": "a valid bearer token is required", "kind": "auth"},
                           {"WWW-Authenticate": 'Bearer realm="journalq hub"'})

    router = APIRouter(prefix=API_PREFIX, tags=["hub"], lifespan=lifespan, dependencies=[Depends(authorized)])

    async def store() -> HubStore:
        if not box:
            async with opening:
                if not box:
                    box.append(await blocking(lambda: HubStore(root, sync=sync)))  # makes the root
        return box[0]

    async def blocking(fn: Callable[..., T], *args: Any) -> T:
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except Exception as exc:  # every error an answer (``_refusal``), never a bare 500
            if isinstance(exc, StorageError):
                log.error("hub storage failure: %s", exc)
            refused = _refusal(exc, Path(root))
            raise refused from exc

    def answer(refused: _Refused) -> Response:
        return JSONResponse(refused.body, status_code=refused.status, headers=refused.headers)

    @contextmanager
    def admitted() -> Iterator[None]:
        """A place among the ``max_requests`` requests handled at once, or a 503: many pushers
        must not take every descriptor, thread and byte of memory (pushes hold their bodies)."""
        if under_way[0] >= max_requests:
            raise _Refused(
                503,
                {"error": f"the hub is busy: {max_requests} requests under way; push again later", "kind": "busy"},
                {"Retry-After": "1", "Connection": "close"},  # the body, if any, is not read
            )
        under_way[0] += 1
        try:
            yield
        finally:
            under_way[0] -= 1

    @router.get("/status")
    async def status() -> Response:
        """Every copy the hub holds: client id -> journal -> first, next (the offset it holds up
        to) and segment (where its last segment starts)."""
        try:
            with admitted():
                copies = await blocking((await store()).status)
        except _Refused as refused:
            return answer(refused)
        clients = {c: {j: held.to_json() for j, held in journals.items()} for c, journals in copies.items()}
        return JSONResponse({"version": __version__, "clients": clients})

    @router.get("/journals/{client_id}/{journal}")
    async def held(client_id: str, journal: str) -> Response:
        """What the hub holds of one journal of a client (first == next == 0: nothing)."""
        try:
            with admitted():
                got = await blocking((await store()).held, client_id, journal)
        except _Refused as refused:
            return answer(refused)
        return JSONResponse({"client_id": client_id, "journal": journal, **got.to_json()})

    @router.post("/journals/{client_id}/{journal}")
    async def push(
        client_id: str,
        journal: str,
        request: Request,
        first: int = Query(ge=0, lt=2**64),
        segment: int = Query(ge=0, lt=2**64),
    ) -> Response:
        """Append the body, the journal's own bytes for whole messages from offset ``first`` (all
        from the source segment starting at ``segment``); answered once synced, with the offsets
        the hub now holds and how many messages it appended and skipped."""
        try:
            with admitted():
                body = await _body(request, max_push, body_timeout)
                hub = await store()
                result = await blocking(lambda: hub.push(Push(client_id, journal, first, segment, body)))
        except _Refused as refused:
            return answer(refused)
        return JSONResponse({"client_id": client_id, "journal": journal, **result.to_json()})

    @router.get("/journals/{client_id}/{journal}/messages")
    async def messages(
        client_id: str, journal: str, offset: int = Query(ge=0, lt=2**64), max_bytes: int = Query(1 << 20, ge=1)
    ) -> Response:
        """The copy's bytes from ``offset``: whole messages within ``max_bytes`` (at least one;
        at most the push limit),
        from one segment; headers ``X-Journalq-First``, ``X-Journalq-Count`` and
        ``X-Journalq-Segment``. An empty body at the end of the copy."""
        try:
            with admitted():
                run = await blocking((await store()).read_raw, client_id, journal, offset, min(max_bytes, max_push))
        except _Refused as refused:
            return answer(refused)
        headers = {
            "X-Journalq-First": str(run.first),
            "X-Journalq-Count": str(run.count),
            "X-Journalq-Segment": str(run.segment),
        }
        return Response(run.data, media_type=BYTES_TYPE, headers=headers)

    return router


async def _body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, refused past ``limit`` bytes (413), when it breaks off (400) or when it
    stops arriving: no bytes for ``timeout`` seconds (408; a deadline for each part, not the
    whole, so that a large push over a slow link still arrives)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Refused(413, {"error": f"the push is {declared} bytes; at most {limit} are taken", "kind": "size"})
    chunks: list[bytes] = []
    size = 0
    parts = request.stream()
    try:
        while True:
            with anyio.move_on_after(timeout) as waited:
                chunk = await anext(parts, None)
            if waited.cancelled_caught:
                raise _Refused(
                    408,
                    {"error": f"the push stopped arriving: no bytes for {timeout:g} s", "kind": "timeout"},
                    {"Connection": "close"},  # the rest of the body is not read
                )
            if chunk is None:
                break
            size += len(chunk)
            if size > limit:
                raise _Refused(413, {"error": f"the push is over {limit} bytes", "kind": "size"})
            chunks.append(chunk)
    except _Refused:
        raise
    except Exception as exc:  # the client went away mid-body
        raise _Refused(400, {"error": f"the push could not be read: {exc}", "kind": "body"}) from None
    return b"".join(chunks)


def create_hub_app(
    root: str | Path,
    *,
    sync: str = "always",
    max_push: int = DEFAULT_MAX_PUSH,
    token: str | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_requests: int = DEFAULT_MAX_REQUESTS,
) -> FastAPI:
    """An app serving only the hub's endpoints over ``root``."""
    app = FastAPI(
        title="journalq hub", version=__version__, description="The journalq hub: copies of clients' journals."
    )
    app.include_router(hub_router(
        root, sync=sync, max_push=max_push, token=token, body_timeout=body_timeout, max_requests=max_requests
    ))

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> Response:  # from the token check
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
