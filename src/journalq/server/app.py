"""The HTTP application: mq's REST API, the Amazon SQS JSON protocol at ``POST /``, metrics.

The busiest requests (mq's sends, fetches and deletes; SQS's sends, receives and deletes) to a
queue are taken in batches (``journalq.server.batching``): one store call for the requests under
way together, its append made on the event loop and its one sync on the loop or in a worker
thread, so a durable answer costs little throughput. Every other queue operation is blocking file
I/O, run in a worker thread. Nothing is answered as stored before it is on stable storage (with the default
``sync="always"``); when the storage refuses (a full disk, an I/O error) the answer is 503 with
``Retry-After``, the write leaves nothing half-done, and reads go on being served.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, parse_qsl

import anyio
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from journalq import __version__
from journalq.errors import (
    STORAGE_ERRNOS,
    BusyError,
    Error,
    InvalidMessageError,
    InvalidSettingError,
    JournalError,
    PartialSendError,
    QueueNotFoundError,
    StorageError,
    StoreUnavailableError,
    TaskNotFoundError,
)
from journalq.journal.sync import SyncPolicy
from journalq.journal.writer import DeferredSyncs
from journalq.queue import DEFAULT_CHANNEL, Broker, ReceivedMessage
from journalq.queue.channel import MAX_VISIBILITY, MAX_WAIT
from journalq.queue.settings import QueueSettings, check_number
from journalq.queue.zookeeper import is_zookeeper_url
from journalq.server import metrics
from journalq.server.batching import Batcher, SyncPlacement
from journalq.server.config import ServerConfig
from journalq.server.deadlines import Deadlines
from journalq.server.hub import HUB_DIR, hub_router
from journalq.server.ids import given_id, given_ids, queue_id
from journalq.server.polling import poll_slices
from journalq.server.reading import queue_to_read, received_in_turn
from journalq.server.scopes import header
from journalq.server.sigv4 import AuthError, verify
from journalq.server import sqs_query
from journalq.server.sqs import FIFO_SUFFIX, SqsError, SqsProtocol, plain_answer, sending_to
from journalq.server.tokens import bearer_matches

log = logging.getLogger("journalq.server")
T = TypeVar("T")

RESERVED = {"metrics", "healthz", "readyz", "docs", "redoc", "openapi.json"}
"""Paths of the server's own that no queue can be reached at through the REST API."""


class HTTPProblem(Exception):
    """An answer other than success, with its status, message and headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class SqsRefusal(Exception):
    """An SQS request refused before it reaches a queue: its error, and the answer's extra headers
    (as ``HTTPProblem``, a way out of the checks, not an error of journalq's)."""

    def __init__(self, error: SqsError, headers: dict[str, str] | None = None) -> None:
        super().__init__(error.message)
        self.error, self.headers = error, headers


def create_app(config: ServerConfig) -> App:
    broker_box: list[Broker] = []
    limiter = anyio.CapacityLimiter(256)  # blocking operations but receives
    # Receives may long-poll (up to 20 s for SQS, ``wait`` for REST): with one pool for all, a few
    # hundred waiting consumers would hold up every write, and the messages they wait for.
    receive_limiter = anyio.CapacityLimiter(1024)
    # The batches' syncs that do not run on the loop (one at a time per queue; their whole
    # stores where ``appended`` says) go straight to threads of their own:
    # anyio's run_sync first yields to the event loop for a whole iteration, which under load
    # (the loop reading and answering dozens of requests) held each batch back ~0.3 ms, and the
    # requests of the next batch with it; the loop then idled ~20 % of the time waiting.
    store_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="journalq-store")
    stores_open = threading.Event()  # set until the store pool shuts down (see ``appended``)
    stores_open.set()
    body_deadlines = Deadlines(config.body_timeout)  # slow bodies: 408
    stopping = asyncio.Event()  # set once the server begins to stop: long polls end
    on_zookeeper = is_zookeeper_url(config.data)  # what Broker(config.data) decides too

    @asynccontextmanager
    async def lifespan(app: App) -> AsyncIterator[None]:
        broker = Broker(config.data, sync=config.sync, **config.store_options())
        broker_box.append(broker)
        app.state.metrics.watch(broker)
        log.info("journalq %s serving %s on http://%s (sync=%s)",
                 __version__, config.data, config.address, config.sync)
        watchdog = asyncio.get_running_loop().create_task(body_deadlines.run())
        syncs = asyncio.get_running_loop().create_task(app.state.metrics.keep_publishing_syncs())
        try:
            yield
        finally:
            watchdog.cancel()
            syncs.cancel()
            stores_open.clear()  # before the shutdown: no batch is appended on the loop past it
            await anyio.to_thread.run_sync(store_pool.shutdown)  # no store may outlive the broker
            await anyio.to_thread.run_sync(broker.close)  # syncs and closes every journal
            app.state.metrics.publish_syncs()  # a worker retired alone (SIGHUP, SIGTTOU): its last ones count

    app = App(
        title="journalq",
        version=__version__,
        description="mq's REST API over journalq queues. The Amazon SQS JSON protocol is served at "
        "`POST /` (see the SQS API reference); Prometheus metrics at `/metrics`.",
        lifespan=lifespan,
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document_rest(FastAPI.openapi(app), token=config.rest_token is not None)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    counts = app.metrics
    note_latency = counts.note

    def broker() -> Broker:
        return broker_box[0]

    def sending_to_queue(name: str) -> tuple[Any, str | None]:
        """``journalq.server.sqs.sending_to``: what a send to ``name`` goes through, and the token
        its ids carry; on the ZooKeeper store, the queue and None (its ids are never made twice)."""
        if on_zookeeper:
            return broker().queue(name, create=False), None
        return sending_to(broker(), name)

    def send_bodies(queue: str, bodies: Sequence[bytes]) -> list[str | Exception]:
        found, token = sending_to_queue(queue)
        if found.settings.fifo:
            # SQS's FIFO queues take a message only with its group id, which REST has no place
            # for: stored without one, boto3 would receive a FIFO message of no group.
            refusal = HTTPProblem(400, f"queue {queue!r} is a FIFO queue: its messages need a group id, which "
                                  "mq's REST API does not carry; send them with SQS's SendMessage and MessageGroupId")
            return [refusal] * len(bodies)
        if token is None:
            return list(found.send_many(bodies))
        try:
            return given_ids(found.send_many(bodies), token)
        except PartialSendError as exc:  # (the 503 made of it keeps it as its cause: ``store``)
            exc.ids = [None if message_id is None else given_id(message_id, token) for message_id in exc.ids]
            raise

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str | Exception]:
        try:
            ids: list[str | Exception] = await appended(send_bodies, queue, bodies)
        except (HTTPProblem, PartialSendError) as exc:
            partial = exc if isinstance(exc, PartialSendError) else exc.__cause__
            if not isinstance(partial, PartialSendError):
                raise
            # A sharded queue stored part of the batch: those are answered as stored (a client
            # that got an error would send them again), the others get the 503 (a storage
            # failure's, made by ``blocking``) or the error that stopped the send.
            unsent = exc if isinstance(exc, HTTPProblem) else partial.cause
            ids = [unsent if message_id is None else message_id for message_id in partial.ids]
        counts.counted(counts.messages_in, queue).inc(sum(isinstance(i, str) for i in ids))  # once a batch
        return ids

    sends = Batcher(store)

    async def blocking(fn: Callable[..., T], *args: Any, receiving: bool = False, storing: bool = False) -> T:
        """Run a queue operation in a worker thread, mapping storage failures to 503.
        ``storing``: a batch's store, run in ``store_pool``."""
        with storage_failures:
            if storing:
                try:
                    stored = asyncio.get_running_loop().run_in_executor(store_pool, functools.partial(fn, *args))
                except RuntimeError:  # shut down: a request still open past the server's stop
                    raise HTTPProblem(503, "not stored: the server is stopping",
                                      {"Retry-After": str(config.retry_after)}) from None
                try:
                    return await asyncio.shield(stored)
                except asyncio.CancelledError:  # as anyio's run_sync: the store finishes first
                    await asyncio.wait([stored])
                    if not stored.cancelled():
                        stored.exception()  # its failure, if any, goes with the cancellation
                    raise
            return await anyio.to_thread.run_sync(fn, *args, limiter=receive_limiter if receiving else limiter)

    appends_on_loop = not on_zookeeper and SyncPolicy.parse(config.sync).mode != "group"

    def upkeep_due(queue: str) -> bool:
        """Whether a batch's store for ``queue`` would do more than its own appends: open the
        queue (its first use in this process recovers its journals and loads its channel's state,
        for up to hundreds of ms at a deep backlog) or collect it (``Channel.upkeep_due``)."""
        try:
            found = broker().opened(queue)
        except OSError:
            return False  # (the store raises it again, on the loop: no upkeep for it to do)
        return found is None or found.upkeep_due()

    sync_placement = SyncPlacement()

    def batches_storing() -> int:
        """How many batches that sync are being stored, over every queue (``Batcher.storing``):
        not fetches, whose deliveries are not synced."""
        return sends.storing + sqs_sends.storing + deletes.storing + sqs_deletes.storing

    async def appended(fn: Callable[..., T], queue: str, *args: Any) -> T:
        """A batch's store ``fn(queue, *args)`` (sends, fetches, deletes): run on the event loop
        with its syncs deferred, then those syncs (a fetch has none, but for a dead letter), on
        the loop while they are quick (``SyncPlacement``) and no other batch is being stored
        (whose sync could run meanwhile, in a thread), else in ``store_pool``; returns (or
        raises) once what it appended is on stable storage. Run whole in a thread
        (``blocking``), its system calls (lock, catch-up, write, sync: seven a batch) each let
        the GIL go to the busy loop and waited to get it back. A failure of the append
        still syncs what it did append (a sharded queue's stored part, answered as stored) first:
        a sync that fails fails the whole batch.

        All of it in the thread, as before: on ZooKeeper (the network); under ``group`` (its
        timer syncs holding the writer's mutex, which the loop would wait for); and when the
        call would also open the queue or collect it (``upkeep_due``: the first request to a
        queue after a start, a gc, a compaction);
        and once the store pool is shut down (the server stopped), which refuses the batch with
        nothing stored: appended here, it would be stored and answered 503. (Between the append
        and the sync's submission to the pool the loop does nothing else: no shutdown between.)
        And when the queue's journal is held by another process (its compaction: hundreds of ms
        at a deep backlog) or by a thread of this one: the loop does not wait for it
        (``DeferredSyncs(wait=False)``: ``BusyError`` before anything was done)."""
        if not appends_on_loop or not stores_open.is_set() or upkeep_due(queue):
            return await blocking(fn, queue, *args, storing=True)
        failure: Exception | None = None
        busy = False
        with DeferredSyncs(wait=False) as syncs:
            try:
                with storage_failures:
                    result = fn(queue, *args)
            except BusyError:
                busy = True
            except Exception as exc:
                failure = exc
        if syncs:
            started = time.monotonic()
            if batches_storing() <= 1 and sync_placement.on_loop(started):
                try:
                    with storage_failures:
                        syncs.sync()
                finally:
                    ended = time.monotonic()
                    sync_placement.took(ended - started, ended)
            else:
                await blocking(syncs.sync, storing=True)
        if busy:  # (having synced what it did append: a sharded receive's other shards, say)
            return await blocking(fn, queue, *args, storing=True)
        if failure is not None:
            raise failure
        return result

    class StorageFailures:
        """``with storage_failures:`` a failure of the storage raised in the block raises as its
        503 (``storage_problem``); a queue that is not there, without where the store keeps its
        queues (the data directory's path is the server's business, not its clients')."""

        def __enter__(self) -> None:
            return None

        def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
            if isinstance(exc, QueueNotFoundError):
                told = str(exc).replace(f" in {broker().root}", "")
                if told != str(exc):
                    raise QueueNotFoundError(told) from exc
                return False
            # First: a StoreUnavailableError is a ConnectionError, an OSError with no errno.
            if isinstance(exc, (StorageError, StoreUnavailableError)):
                raise storage_problem(exc) from exc
            # An OSError is the same failure met outside a journal (a queue's settings file, its
            # channel's token, an offset file): still the storage's, not a bug of the server's.
            if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
                raise storage_problem(exc) from exc
            return False

    storage_failures = StorageFailures()

    def storage_problem(exc: StorageError | StoreUnavailableError | OSError) -> HTTPProblem:
        """The 503 for a failure of the storage, once logged (and the failed writers let go)."""
        retry = {"Retry-After": str(config.retry_after)}
        if isinstance(exc, StorageError):
            # A failed sync leaves a writer unusable by design: close it, and the next request
            # reopens (and recovers) the journal. A failed write was taken back already.
            reopened = broker().reopen_failed()
            log.error("storage failure: %s%s", exc, f" (reopening {', '.join(reopened)})" if reopened else "")
            return HTTPProblem(503, f"not stored: {exc.reason}", retry)
        if isinstance(exc, StoreUnavailableError):  # ZooKeeper out of reach: kazoo reconnects meanwhile
            log.error("store unavailable: %s", exc)
            return HTTPProblem(503, f"not done: {exc}", retry)
        log.error("storage failure: %s", exc)
        return HTTPProblem(503, f"not stored: {exc.strerror or exc}", retry)

    async def body_of(receive: Receive, declared: bytes | None, limit: int) -> bytes:
        """The request body (``declared``: its Content-Length), refused when too large (413), too
        slow to arrive (408) or broken (400)."""
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPProblem(413, f"the body is {declared.decode()} bytes; at most {limit} are taken")
        chunks: list[bytes] = []
        size = 0
        task = body_deadlines.start()
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise HTTPProblem(400, "the request body could not be read: the client went away")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise HTTPProblem(413, f"the body is over {limit} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except asyncio.CancelledError:
            if body_deadlines.expired(task):
                raise HTTPProblem(408, f"the body did not arrive within {config.body_timeout:g} s") from None
            raise
        finally:
            body_deadlines.stop(task)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def check_token(authorization: bytes | str) -> None:
        if config.rest_token is None:
            return
        given = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
        if not bearer_matches(given, config.rest_token):
            raise HTTPProblem(401, "a valid bearer token is required", {"WWW-Authenticate": 'Bearer realm="journalq"'})

    async def rest_auth(request: Request) -> None:  # async: no thread hop per request
        check_token(request.headers.get("authorization", ""))

    async def rest_checks(request: Request) -> None:
        """mq's endpoints: the token, then the query's parameters: one the endpoint does not take
        (a typo: ``?wiat=5`` did not wait, ``?visibility_timout=600`` hid the message for the
        queue's timeout) is refused, not ignored. (One dependency, not two: each costs.)"""
        check_token(request.headers.get("authorization", ""))
        if request.scope["query_string"]:
            route = request.scope["route"]
            taken = parameters_taken.get(id(route))
            if taken is None:
                taken = parameters_taken[id(route)] = frozenset(
                    parameter.alias for parameter in route.dependant.query_params
                )
            check_parameters(
                request.method, route.path, [name for name, _ in request.query_params.multi_items()], taken
            )

    parameters_taken: dict[int, frozenset[str]] = {}  # by id of route (the app's, kept): its query parameters

    def check_parameters(method: str, path: str, given: Iterable[str], taken: frozenset[str]) -> None:
        """``given``: the names of the query's parameters, each as often as it comes."""
        seen: set[str] = set()
        for name in given:
            if name not in taken:
                takes = f"takes only {', '.join(sorted(taken))}" if taken else "takes no query parameter"
                raise HTTPProblem(400, f"unknown query parameter {name!r}: {method} {path} {takes}")
            if name in seen:  # ``?wait=0&wait=5``: one of them would be taken, silently
                raise HTTPProblem(400, f"query parameter {name!r} is given more than once")
            seen.add(name)

    def queue_name(queue: str) -> str:
        if queue in RESERVED:
            raise HTTPProblem(400, f"{queue!r} is reserved for the server's own use")
        return queue

    if isinstance(config.data, Path):  # a ZooKeeper store has no directory to keep copies in
        app.include_router(
            hub_router(config.data / HUB_DIR, sync=config.sync, body_timeout=config.body_timeout),
            dependencies=[Depends(rest_auth)],
        )

    @app.exception_handler(HTTPProblem)
    async def problem(request: Request, exc: HTTPProblem) -> Response:
        return _problem_response(exc)

    @app.exception_handler(Error)
    async def journalq_error(request: Request, exc: Error) -> Response:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> Response:
        """No route for the path (404), or none for the method (405): named, in the REST API's
        shape. Starlette's 405 allows only the methods of the first route of the path it found
        (``POST /q``: ``Allow: GET``); this one lists every method the path takes."""
        where = f"{request.method} {request.url.path}"
        # ``/`` has no route of FastAPI's (SQS's POST is the hot path's): its 404 is a 405 too.
        if exc.status_code == 405 or (exc.status_code == 404 and request.scope["path"] == "/"):
            allowed = app.methods_at(request.scope)
            message = f"{where}: the method is not allowed here; use {', '.join(allowed)}"
            return JSONResponse({"error": message}, status_code=405, headers={"Allow": ", ".join(allowed)})
        if exc.status_code == 404:
            return JSONResponse({"error": f"{where}: no such endpoint"}, status_code=404)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, exc: RequestValidationError) -> Response:
        """A query parameter that is not a number where one is due: 400 on the REST API, as
        every other bad parameter is (FastAPI's 422 elsewhere: the hub's endpoints keep it)."""
        route = request.scope.get("route")
        if "{queue}" not in getattr(route, "path", ""):
            return await request_validation_exception_handler(request, exc)
        problems = [f"{error['loc'][-1]}: {error['msg']} (not {error.get('input')!r})"
                    for error in exc.errors()]
        return JSONResponse({"error": "; ".join(problems)}, status_code=400)

    # -- service endpoints ---------------------------------------------------------------------

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        """Liveness: answers 200 while the server process serves requests. It does not ask the
        store: a ZooKeeper ensemble or a disk that fails is no reason to restart the server
        (``/readyz`` tells that)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"], responses={503: {
        "description": "The store does not answer (a ZooKeeper ensemble out of reach, a failing disk): "
                       "requests that need it are answered 503 meanwhile.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        "headers": {
            "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before asking again."}
        },
    }})
    async def readyz() -> dict[str, Any]:
        """Readiness: 200 with the number of queues once the store lists them (the data
        directory, or the ZooKeeper ensemble), 503 with ``Retry-After`` while it cannot."""
        try:
            names = await blocking(broker().names)
        except OSError as exc:  # whatever keeps the queues from being listed (EACCES too): not ready
            log.error("the queues cannot be listed: %s", exc)
            raise HTTPProblem(503, f"the queues cannot be listed: {exc.strerror or exc}",
                              {"Retry-After": str(config.retry_after)}) from exc
        return {"status": "ok", "queues": len(names)}

    # The token guards the metrics too (they name every queue): Prometheus sends one
    # (``authorization`` in a scrape config). The probes above name nothing and stay open.
    @app.get("/metrics", tags=["service"], response_class=Response, dependencies=[Depends(rest_auth)])
    async def metrics_endpoint() -> Response:
        """Prometheus text format: messages in and out, depth, in flight, dead, latency, syncs
        (with ``--token``, for a request that carries it)."""
        counts.observe_noted()  # the latencies noted in this turn of the loop too
        body = await blocking(counts.render)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    # -- mq's six endpoints ------------------------------------------------------------------

    @app.get("/{queue}", tags=["mq"], dependencies=[Depends(rest_checks)])
    async def get_queue(queue: str) -> dict[str, Any]:
        """200 with the queue's counts when it exists (available, in_flight, delayed, dead,
        oldest_age; damage: where damage in its journal stops its receives, null when none),
        404 otherwise. A topic whose channels are its own (made through the library, none named
        ``default``): the counts of each channel, under ``channels`` (a read gives it no channel
        of its own)."""

        def counts_of(name: str) -> dict[str, Any]:
            found = queue_to_read(broker(), name)
            if found is not None:
                return found.stats().__dict__
            topic = broker().topic(name, create=False)
            return {"channels": {channel: topic.channel(channel).stats().__dict__ for channel in topic.channel_names()}}

        return {"name": queue, **await blocking(counts_of, queue_name(queue))}

    @app.put("/{queue}", tags=["mq"], dependencies=[Depends(rest_checks)], status_code=201)
    async def put_queue(queue: str, response: Response, shards: int | None = None) -> dict[str, Any]:
        """Create the queue (201), or find it there already (200). The body is ignored.
        ``?shards=N``: spread a new queue over N shards (a power of two up to 1024); an existing
        queue is found (200) when it has N shards, and answered 409 when it has another number
        (shards are fixed when a queue is made). A new queue named ``*.fifo`` is refused (400):
        SQS takes such names for FIFO queues only, and REST messages carry no group id."""
        name = queue_name(queue)
        settings = {} if shards is None else {"shards": shards}
        try:
            QueueSettings().replace(**settings)  # a bad shards is a bad parameter (400), whatever the queue
        except InvalidSettingError as exc:
            raise HTTPProblem(400, str(exc)) from None

        def create() -> bool:
            """Whether the queue existed (found as a topic: a library's, whose channels are its
            own, is given no channel ``default``, which would hold its gc back for ever)."""
            try:
                found = broker().topic(name, create=False)
            except QueueNotFoundError:
                if name.endswith(FIFO_SUFFIX):
                    raise HTTPProblem(400, f"{name!r} would be a FIFO queue (SQS gives names ending in "
                                      f"{FIFO_SUFFIX} to FIFO queues only), and mq's REST API makes standard "
                                      "queues: create it with SQS's CreateQueue and the attribute "
                                      "FifoQueue=true") from None
                try:
                    broker().queue(name, **settings)
                except InvalidSettingError:
                    if not broker().exists(name):
                        raise
                    return create()  # made meanwhile, with other shards: that queue is answered
                return False
            if shards is not None and found.settings.shards != shards:
                raise HTTPProblem(409, f"queue {name!r} exists with {found.settings.shards} shard(s), not "
                                  f"{shards}: shards are fixed when a queue is made")
            return True

        existed = await blocking(create)
        if existed:
            response.status_code = 200
        return {"name": name, "created": not existed}

    @app.delete("/{queue}", tags=["mq"], dependencies=[Depends(rest_checks)], status_code=204)
    async def delete_queue(queue: str) -> Response:
        """Delete the queue and all its messages."""
        await blocking(broker().delete, queue_name(queue))
        waitless.discard(queue)
        return Response(status_code=204)

    @app.get("/{queue}/messages", tags=["mq"], dependencies=[Depends(rest_checks)])
    async def fetch(
        queue: str, request: Request, wait: float | None = None, visibility_timeout: float | None = None
    ) -> Response:
        """The oldest available message as the body, with ``X-Message-Id`` (and ``X-Receipt``,
        ``X-Receive-Count``); 204 when there is none. The message is hidden for the visibility
        timeout and delivered again unless deleted. ``wait``: long polling, in seconds (the
        queue's ``receive_wait``, SQS's ReceiveMessageWaitTimeSeconds, when not given)."""
        name = queue_name(queue)
        if wait is not None:
            check_number("wait", wait, 0, MAX_WAIT)  # the queue's limit: it sees only the slices
        if visibility_timeout is not None:  # before the queue opens: a topic's would get a channel for nothing
            check_number("visibility_timeout", visibility_timeout, 0, MAX_VISIBILITY)

        def receive(seconds: float) -> tuple[list[ReceivedMessage], str]:
            """A receive waiting up to ``seconds``, and the id the server gives for what it got."""
            # A queue deleted under the poll (by this server or another process) raises
            # QueueNotFoundError, answered 404 as anywhere else (SQS's ReceiveMessage: QueueDoesNotExist).
            found = broker().queue(name, create=False)
            got = found.receive(1, wait=seconds, visibility_timeout=visibility_timeout)
            return got, given_of(found, got[0]) if got else ""

        # A long poll waits in slices: between two, it ends when the server is stopping (a
        # SIGTERM waits for requests under way, and a poll may have up to an hour left) or when
        # its client went away (who would never see the message it took). Without ``wait``, a
        # first look (with the other fetches of the queue under way: ``fetches``) tells the
        # queue's own; with one, the first slice is the first look (one call less to a store
        # that may hang: a frozen ZooKeeper).
        slices: Iterable[float] = ()
        if wait is None:
            message, given, whole = await fetches.call(name, visibility_timeout)
            got = [] if message is None else [message]
            if not got and whole and not stopping.is_set():
                slices = poll_slices(whole)
        else:
            got, whole, given, slices = [], wait, "", poll_slices(wait)
        with counts.waiting(name) if slices and whole else nullcontext():  # (metrics: a poll that waits)
            for seconds in slices:
                got, given = await blocking(receive, seconds, receiving=True)
                if got or stopping.is_set() or await request.is_disconnected():
                    break
        if got and whole and await request.is_disconnected():
            # Taken in the slice its client went away in: given back, not hidden for no one.
            await blocking(broker().queue(name, create=False).release, got[0].receipt)
            return Response(status_code=204)
        if not got:
            return Response(status_code=204)
        message = got[0]
        counts.counted(counts.messages_out, queue).inc()
        return Response(
            message.body,
            media_type="application/octet-stream",
            headers={
                "X-Message-Id": given,
                "X-Receipt": message.receipt,
                "X-Receive-Count": str(message.receive_count),
            },
        )

    @app.post("/{queue}/messages", tags=["mq"], dependencies=[Depends(rest_checks)], status_code=201)
    async def add(queue: str, request: Request) -> Response:
        """Store the body as a message; 201 with ``X-Message-Id`` once it is on stable storage,
        400 when the body cannot be read, 503 with ``Retry-After`` when it cannot be stored."""
        # Served by the hot path below (``hot_add``) before FastAPI sees it: this route documents
        # the endpoint in the OpenAPI document, and answers the same when reached.
        declared = request.headers.get("content-length")
        body = await body_of(request.receive, None if declared is None else declared.encode(), config.max_message_size)
        message_id = await add_message(queue, body)
        return Response(status_code=201, headers={"X-Message-Id": message_id})

    @app.delete("/{queue}/messages/{message_id}", tags=["mq"], dependencies=[Depends(rest_checks)], status_code=204)
    async def remove(queue: str, message_id: str) -> Response:
        """Delete a message by the id that adding or fetching it gave, whatever its state."""
        await deletes.call(queue_name(queue), message_id)
        return Response(status_code=204)

    # -- fetches and deletes, in batches (``Batcher``): one receive, or one delete and one sync,
    # for the requests to a queue under way together, each answered with its own outcome.

    def given_of(found: Any, message: ReceivedMessage) -> str:
        """The id the server gives for a message received from ``found`` (``journalq.server.ids``)."""
        return message.id if on_zookeeper else given_id(message.id, found.token)

    Fetched = tuple[ReceivedMessage | None, str, float]

    def fetch_now(queue: str, timeouts: Sequence[float | None]) -> list[Fetched]:
        """The first looks (no wait) of a batch of fetches, one receive a visibility timeout asked
        (None: the queue's), the oldest messages to the earliest requests: for each, the message
        or None, the id the server gives for it, and the queue's own wait (``receive_wait``),
        which is also noted for the direct path (``waitless``)."""
        found = broker().queue(queue, create=False)
        received = received_in_turn(found, [(timeout, 1) for timeout in timeouts])
        whole = found.settings.receive_wait
        (waitless.add if whole == 0 else waitless.discard)(queue)
        return [(m[0], given_of(found, m[0]), whole) if m else (None, "", whole) for m in received]

    def delete_now(queue: str, message_ids: Sequence[str]) -> list[Exception | None]:
        """``delete_ids`` of ids as the server gave them (``journalq.server.ids``: of this queue,
        not of one deleted before it; one spelling per message, as ``int()`` reads "007" as 7),
        with errors that name each id as sent (a sharded queue's named the shard's own id)."""
        inner: list[str | Exception]
        if on_zookeeper:
            found, inner = broker().queue(queue, create=False), list(message_ids)
        else:
            found = broker().queue_if_made(queue)
            if found is None:  # a topic whose channels are its own: giving it ``default`` would hold its gc
                channels = ", ".join(broker().topic(queue, create=False).channel_names()) or "none"
                return [TaskNotFoundError(
                    f"no message {message_id!r} in queue {queue!r}: it is a topic whose channels are its own "
                    f"({channels}), read through the library, and a DELETE deletes from the channel "
                    f"{DEFAULT_CHANNEL!r}, which it does not have"
                ) for message_id in message_ids]
            inner = []
            for message_id in message_ids:
                try:
                    inner.append(queue_id(found, message_id, queue))
                except (InvalidMessageError, TaskNotFoundError) as exc:
                    inner.append(exc)
        outcomes = iter(found.delete_ids([i for i in inner if isinstance(i, str)]))
        answered: list[Exception | None] = []
        for message_id, mine in zip(message_ids, inner):
            error = mine if isinstance(mine, Exception) else next(outcomes)
            if type(error) is TaskNotFoundError and isinstance(mine, str):
                error = TaskNotFoundError(f"no message {message_id!r} waiting in queue {queue!r}")
            elif type(error) is InvalidMessageError and isinstance(mine, str):
                error = InvalidMessageError(f"message id {message_id!r} is not one of this queue's ids")
            answered.append(error)
        return answered

    async def store_deletes(queue: str, message_ids: Sequence[str]) -> list[Exception | None]:
        outcomes = await appended(delete_now, queue, message_ids)
        counts.counted(counts.messages_deleted, queue).inc(outcomes.count(None))  # once a batch
        failed = next((error for error in outcomes if isinstance(error, StorageError)), None)
        if failed is not None:
            # A sharded queue's shard that failed, the others' deletes stored (``delete_ids``):
            # its ids get the 503, the others their own outcome.
            problem = storage_problem(failed)
            return [problem if isinstance(error, StorageError) else error for error in outcomes]
        return outcomes

    fetches: Batcher[float | None, Fetched] = Batcher(functools.partial(appended, fetch_now))
    deletes: Batcher[str, None] = Batcher(store_deletes)
    waitless: set[str] = set()
    """Queues whose own wait was 0 at the last look (``fetch_now``, ``sqs_fetch_now``): the direct
    path fetches from them (a fetch that may long-poll goes through FastAPI, or ``hot_sqs``).
    Emptied when this server changes or deletes a queue; a change by another process is seen by
    the next batch of fetches."""

    async def add_message(queue: str, body: bytes) -> str:
        return await sends.call(queue_name(queue), body)

    # -- the hot path: POST /{queue}/messages and the SQS protocol, as plain ASGI -----------------
    #
    # With durable writes, concurrent requests share their syncs, so what limits throughput is
    # the CPU each request costs. FastAPI's routing, request objects and dependency injection
    # cost several times what the work itself does: the busiest requests skip them, with the same
    # checks in the same order (token, size, name) and the same answers.

    async def hot_add(scope: Scope, receive: Receive, send: Send) -> int:
        headers = dict(scope["headers"])
        try:
            check_token(headers.get(b"authorization", b""))
            if scope["query_string"]:  # (the direct path takes no request with a query)
                check_parameters("POST", "/{queue}/messages", parse_qs(scope["query_string"].decode("latin-1"),
                                                                       keep_blank_values=True), frozenset())
            queue = scope["path"][1:-_MESSAGES_SUFFIX]
            if headers.get(b"expect", b"").lower() == b"100-continue":
                # The client waits to be asked for its body (reading it asks): a queue that does
                # not exist is answered 404 first, and the body is never sent.
                await blocking(lambda: broker().topic(queue_name(queue), create=False))  # (no channel made)
            body = await body_of(receive, headers.get(b"content-length"), config.max_message_size)
            message_id = await add_message(queue, body)
        except HTTPProblem as exc:
            return await _respond(_problem_response(exc), scope, receive, send)
        except Error as exc:
            return await _respond(_error_response(exc), scope, receive, send)
        return await _answer(send, 201, b"", [(b"x-message-id", message_id.encode())])

    def direct_add(scope: Scope, body: bytes, respond: Respond) -> bool:
        """``POST /{queue}/messages`` taken straight from the HTTP protocol (see
        ``journalq.server.protocol``) once its whole body is there, without an ASGI task: the body
        joins the next batch, and ``respond(status, headers, body)`` answers once it is stored (or
        with the same failure answers as ``hot_add``). Returns False, having done nothing, for a
        request that is to be refused (token, size, name): ``hot_add`` answers those."""
        queue = scope["path"][1:-_MESSAGES_SUFFIX]
        if len(body) > config.max_message_size or queue in RESERVED or scope["query_string"] or not token_given(scope):
            return False  # (a query: the POST takes no parameter, and hot_add refuses it)
        sends.submit(queue, body, answering(respond, "rest", _REST_ADD, rest_answer))
        return True

    def token_given(scope: Scope) -> bool:
        """Whether the request carries the REST API's token, when it has one."""
        if config.rest_token is not None:
            try:
                check_token(header(scope, b"authorization") or b"")
            except HTTPProblem:
                return False
        return True

    def direct_fetch(scope: Scope, body: bytes, respond: Respond) -> bool:
        """``GET /{queue}/messages`` with no query, taken straight from the HTTP protocol as
        ``direct_add``, from a queue whose own wait is 0 (``waitless``): its first look, which is
        all of it, joins the queue's next batch of fetches. Anything else (a wait, a visibility
        timeout, a refusal) goes through FastAPI's ``fetch``: False, having done nothing."""
        queue = scope["path"][1:-_MESSAGES_SUFFIX]
        if queue not in waitless or scope["query_string"] or not token_given(scope):
            return False
        fetches.submit(queue, None, answering(respond, "rest", _REST_FETCH, functools.partial(fetched_answer, queue)))
        return True

    def fetched_answer(queue: str, outcome: Fetched | BaseException) -> Answer:
        """What ``fetch`` answers to a first look that got ``outcome``, for the direct path."""
        if isinstance(outcome, BaseException):
            return _failure_answer(outcome)
        message, given, _ = outcome
        if message is None:
            return 204, [], b""
        counts.counted(counts.messages_out, queue).inc()
        answer = _whole(200, message.body, [
            (b"x-message-id", given.encode()),
            (b"x-receipt", message.receipt.encode()),
            (b"x-receive-count", str(message.receive_count).encode()),
        ])
        answer[1].append(_OCTET_STREAM)  # after the length, as Starlette's Response has them
        return answer

    def direct_remove(scope: Scope, body: bytes, respond: Respond) -> bool:
        """``DELETE /{queue}/messages/{id}`` with no query, taken straight from the HTTP protocol
        as ``direct_add``: the id joins the queue's next batch of deletes. A refused request
        goes through FastAPI's ``remove``: False, having done nothing."""
        _, queue, _, message_id = scope["path"].split("/")
        if queue in RESERVED or scope["query_string"] or not token_given(scope):
            return False
        deletes.submit(queue, message_id, answering(respond, "rest", _REST_DELETE, _deleted_answer))
        return True

    def rest_answer(outcome: str | BaseException) -> Answer:
        if isinstance(outcome, str):
            return 201, [(b"x-message-id", outcome.encode()), _NO_BODY], b""
        return _failure_answer(outcome)

    def answering(
        respond: Respond, api: str, operation: str, answer: Callable[[Any], Answer]
    ) -> Callable[[Any], None]:
        """The batcher's callback for a request of the direct path: answers it with
        ``answer(outcome)`` (a failure there as uvicorn answers an ASGI app's), and notes its
        latency from now."""
        started = time.perf_counter()

        def done(outcome: Any) -> None:
            try:
                status, headers, content = answer(outcome)
            except BaseException as exc:
                status, headers, content = _failure_answer(exc)
            try:
                respond(status, headers, content)
            finally:
                note_latency(api, operation, status, time.perf_counter() - started)

        return done

    sqs_box: list[SqsProtocol] = []

    def sqs_protocol() -> SqsProtocol:
        if not sqs_box:
            sqs_box.append(SqsProtocol(broker(), account_id=config.account_id, region=config.region,
                                       max_message_size=config.max_message_size, stopping=stopping.is_set,
                                       waiting=counts.waiting))
        return sqs_box[0]

    async def store_sqs(
        name: str, requests: Sequence[tuple[str, dict[str, Any]]], plain: Callable[[str, str], Any] = _plain_sent_answer
    ) -> list[dict[str, Any] | Exception]:
        """SendMessage and SendMessageBatch requests to queue ``name``, stored together; a plain
        SendMessage answered ``plain(message_id, md5)`` (see ``SqsProtocol.send_together``)."""

        def partly_stored(exc: PartialSendError) -> Exception:
            if not isinstance(exc, (StorageError, StoreUnavailableError)):
                return exc  # answered as any other unexpected error of the queue's
            problem = storage_problem(exc)
            problem.__cause__ = exc
            return problem

        protocol = sqs_protocol()
        with storage_failures:  # here, not in the thread that stores: see send_together's ``rules``
            rules = protocol.send_rules(name)
        answers: list[dict[str, Any] | Answer | Exception] = await appended(
            functools.partial(
                protocol.send_together, partly_stored=partly_stored, plain=plain, rules=rules
            ),
            name, requests)
        counts.count_sqs_sends(name, [action for action, _ in requests], answers)
        return answers

    sqs_sends = Batcher(store_sqs)  # SendMessage and SendMessageBatch: group commit, as REST's
    # The same for the Query protocol, whose plain sends are answered in XML (from their dicts).
    sqs_query_sends = Batcher(functools.partial(store_sqs, plain=plain_answer))

    async def store_sqs_deletes(name: str, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any] | Exception]:
        return await appended(sqs_protocol().delete_together, name, requests)

    sqs_deletes = Batcher(store_sqs_deletes)  # DeleteMessage: one step, and one sync, a batch

    def sqs_fetch_now(name: str, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any] | SqsError | None]:
        """``SqsProtocol.receive_together``, the queue's own wait noted for the direct path
        (``waitless``), as ``fetch_now`` notes it."""
        answers = sqs_protocol().receive_together(name, requests)
        found = broker().opened(name)  # (opened by the receive, unless every request was refused)
        (waitless.add if found is not None and found.settings.receive_wait == 0 else waitless.discard)(name)
        return answers

    async def receive_sqs(name: str, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any] | Exception | None]:
        return await appended(sqs_fetch_now, name, requests)

    sqs_fetches = Batcher(receive_sqs)  # ReceiveMessage's first look (``SqsProtocol.receive_together``)
    sqs_checks_headers = bool(config.aws_credentials) or config.rest_token is not None

    def sqs_action(target: str) -> str:
        """The action an SQS request names in its ``X-Amz-Target`` (checked before its body is
        read), or ``SqsRefusal``."""
        service, _, action = target.partition(".")
        if not target:  # neither JSON (X-Amz-Target) nor a Query protocol form (``is_query``)
            raise SqsRefusal(SqsError("InvalidAction", _NO_TARGET))
        if service != "AmazonSQS" or not action:
            raise SqsRefusal(SqsError("InvalidAction", f"X-Amz-Target {target!r} is not an Amazon SQS action"))
        return action

    def check_sqs_credentials(scope: Scope, headers: dict[str, str], body: bytes) -> None:
        """An SQS request's signature (or token), checked when the server has AWS keys (or a
        token); ``SqsRefusal`` when it fails."""
        if config.aws_credentials:
            try:
                # The signature covers the path the client posted to, as sent (still percent-
                # encoded: ``path`` is decoded); ``raw_path`` has no query (some servers' has).
                raw_path = scope.get("raw_path") or scope["path"].encode()
                verify(scope["method"], raw_path.partition(b"?")[0].decode("latin-1"),
                       scope["query_string"].decode("latin-1"), headers, body, config.aws_credentials)
            except AuthError as exc:
                raise SqsRefusal(SqsError(exc.code, exc.message, status=exc.status)) from None
        elif config.rest_token is not None:
            # A server guarded by a token is not left open through its other API: without AWS
            # keys configured, SQS requests need the same bearer token.
            try:
                check_token(headers.get("authorization", ""))
            except HTTPProblem as exc:
                raise SqsRefusal(SqsError("MissingAuthenticationToken", exc.message, status=exc.status),
                                 exc.headers) from None

    def sqs_request(
        scope: Scope, target: str, body: bytes, headers: dict[str, str] | None = None, *, query: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """The checks of an SQS request whose body is read: its action and payload, or
        ``SqsRefusal``. ``target``: its ``X-Amz-Target``; ``headers``: all of them as text
        (``_text_headers``), made here if None and a check reads them; ``query``: a request of
        the Query protocol (``is_query``), whose action is in its form. No side effects: the
        direct path may check a request the ASGI path then answers."""
        action = "" if query else sqs_action(target)  # (a Query request's is in its form, read after the credentials)
        if sqs_checks_headers:
            check_sqs_credentials(scope, headers if headers is not None else _text_headers(scope), body)
        if query:
            action, payload = _query_request(scope, body)
        else:
            try:
                payload = _json_of(body or b"{}")
                if not isinstance(payload, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the decoder goes
                raise SqsRefusal(SqsError("InvalidRequest", f"the body is not a JSON object: {exc}")) from None
        if on_zookeeper:
            raise SqsRefusal(SqsError(
                "UnsupportedOperation", "the SQS protocol needs a data directory: this server's queues are in "
                "ZooKeeper (use mq's REST API)", status=400))
        return action, payload

    def sqs_answer(
        action: str, payload: dict[str, Any], outcome: dict[str, Any] | Answer | BaseException, *, query: bool = False
    ) -> Answer:
        """The answer to an SQS request that reached its queue: its result, or the error that
        refused it (other exceptions propagate); in XML for a request of the Query protocol."""
        if action in metrics.Metrics.SQS_COUNTED and isinstance(outcome, dict):  # (sends: once a batch, by store_sqs)
            counts.count_sqs(action, sqs_protocol().queue_of(payload), outcome)  # the queue it reached
        return sqs_outcome_answer(outcome, action if query else None)

    def sqs_outcome_answer(outcome: dict[str, Any] | Answer | BaseException, query_action: str | None = None) -> Answer:
        """What an SQS request that reached its queue is answered, given its outcome: ``sqs_answer``
        without the counting, for the sends (counted once a batch), with no partial per request.
        ``query_action``: the action of a request of the Query protocol, answered in XML."""
        if type(outcome) is tuple:  # first: the common case, a plain SendMessage's (_plain_sent_answer)
            return outcome
        if not isinstance(outcome, BaseException):
            if query_action is not None:
                request_id = _request_id()
                return _whole(200, sqs_query.answer_xml(query_action, outcome, request_id.decode()),
                              _sqs_headers(request_id=request_id, content_type=_XML))
            return _whole(200, _json_text(outcome).encode(), _sqs_headers())
        query = query_action is not None
        if isinstance(outcome, SqsError):
            return _sqs_error_answer(outcome, query=query)
        if isinstance(outcome, HTTPProblem):
            return _sqs_error_answer(SqsError("ServiceUnavailable", outcome.message, status=outcome.status,
                                              sender=False), outcome.headers, query=query)
        if isinstance(outcome, Error):  # none that SQS has a code for: still answered in SQS's shape
            text = _journal_problem(outcome) if isinstance(outcome, JournalError) else str(outcome)
            return _sqs_error_answer(SqsError("InternalFailure", text, status=500, sender=False), query=query)
        raise outcome

    async def hot_sqs(scope: Scope, receive: Receive, send: Send) -> int:
        """The Amazon SQS protocols: JSON, any POST naming an SQS action in ``X-Amz-Target`` (SQS
        clients may post to the queue's URL instead of ``/``), and every other POST to ``/``;
        Query, a form-encoded POST to ``/`` or to a queue's URL, or a GET of one with an
        ``Action`` (``is_query``), answered in XML."""
        headers = _text_headers(scope)
        target = headers.get("x-amz-target", "")
        query = not target and is_query(scope)
        try:
            if not query:
                sqs_action(target)
            try:
                declared = headers.get("content-length")
                body = await body_of(receive, None if declared is None else declared.encode(), config.max_request_size)
            except HTTPProblem as exc:
                code = "RequestEntityTooLarge" if exc.status == 413 else "InvalidRequest"
                raise SqsRefusal(SqsError(code, exc.message, status=exc.status)) from None
            action, payload = sqs_request(scope, target, body, headers, query=query)
        except SqsRefusal as refusal:
            return await _send_answer(send, _sqs_error_answer(refusal.error, refusal.headers, query=query))
        if query:
            scope["journalq.sqs_action"] = action  # the latency label (``Metrics.note_request``)
        base_url = base_url_of(scope)
        outcome: dict[str, Any] | BaseException
        try:
            if action in SqsProtocol.SEND_ACTIONS:
                sends = sqs_query_sends if query else sqs_sends
                outcome = await sends.call(sqs_protocol().queue_of(payload), (action, payload))
            elif action == "DeleteMessage":
                outcome = await sqs_deletes.call(sqs_protocol().queue_of(payload), payload)
            elif action == "ReceiveMessage":
                first = await sqs_fetches.call(sqs_protocol().queue_of(payload), payload)
                outcome = first if first is not None else await sqs_receive(receive, payload, base_url)
            else:
                try:
                    outcome = await blocking(sqs_protocol().handle, action, payload, base_url)
                finally:
                    if action in _QUEUE_CHANGES:
                        waitless.clear()  # (its queue's wait may have changed: each is looked at again)
        except (SqsError, HTTPProblem, Error) as exc:
            outcome = exc
        return await _send_answer(send, sqs_answer(action, payload, outcome, query=query))

    def base_url_of(scope: Scope) -> str:
        """The server's URL as an SQS request reached it (its queues' URLs begin with it)."""
        host = header(scope, b"host")
        return f"{scope['scheme']}://{host.decode('latin-1') if host else f'{config.host}:{config.port}'}"

    async def receive_whole(payload: dict[str, Any], base_url: str, gone: Callable[[], bool]) -> dict[str, Any]:
        """A ReceiveMessage whose first look did not answer it, in a receive thread: its long
        poll ends once ``gone()`` says that its client went away, and what it took is given back
        instead of hidden for the visibility timeout for no one."""
        return await blocking(sqs_protocol().handle, "ReceiveMessage", payload, base_url, gone, receiving=True)

    async def sqs_receive(receive: Receive, payload: dict[str, Any], base_url: str) -> dict[str, Any]:
        """``receive_whole``, told when its client goes away by ``http.disconnect`` (which the
        server's ``receive`` gives once the body was read)."""
        gone = threading.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            return await receive_whole(payload, base_url, gone.is_set)
        finally:
            watcher.cancel()

    def direct_sqs(scope: Scope, body: bytes, respond: Respond) -> bool:
        """SendMessage, SendMessageBatch, DeleteMessage and a ReceiveMessage that cannot wait
        taken straight from the HTTP protocol, as ``direct_add``; every other request, and any
        refused one, goes to ``hot_sqs``."""
        if len(body) > config.max_request_size:
            return False
        try:
            target = (header(scope, b"x-amz-target") or b"").decode("latin-1")
            action, payload = sqs_request(scope, target, body)
            if action not in _SQS_DIRECT:
                return False
            queue = sqs_protocol().queue_of(payload)
        except (SqsRefusal, SqsError):
            return False
        if action == "DeleteMessage":
            sqs_deletes.submit(queue, payload, answering(respond, "sqs", action,
                                                         functools.partial(sqs_answer, action, payload)))
        elif action == "ReceiveMessage":
            # One that may long-poll goes through ``hot_sqs``: the first looks batched here do not
            # wait. WaitTimeSeconds 0, or none and a queue whose own wait was 0 when last looked
            # at (should another process have given it one since, ``direct_received`` waits).
            wait = payload.get("WaitTimeSeconds")
            if not (wait == 0 if wait is not None else queue in waitless):
                return False
            answer = answering(respond, "sqs", action, functools.partial(sqs_answer, action, payload))
            sqs_fetches.submit(queue, payload, functools.partial(direct_received, scope, payload, answer, respond.gone))
        else:
            sqs_sends.submit(queue, (action, payload), answering(respond, "sqs", action, sqs_outcome_answer))
        return True

    def direct_received(
        scope: Scope,
        payload: dict[str, Any],
        answer: Callable[[Any], None],
        gone: Callable[[], bool],
        first: dict[str, Any] | BaseException | None,
    ) -> None:
        """A direct ReceiveMessage's first look done: answered with it, or, when it is to be made
        whole (a FIFO queue's; one whose queue's wait changed since, by another process, which
        long-polls), by ``receive_whole`` as ``hot_sqs`` does, ``gone`` telling it that its
        client went away."""
        if first is not None:
            answer(first)
            return

        async def whole() -> None:
            try:
                outcome: Any = await receive_whole(payload, base_url_of(scope), gone)
            except Exception as exc:  # (``sqs_answer`` answers journalq's and SQS's; others as a failure)
                outcome = exc
            answer(outcome)

        task = asyncio.get_running_loop().create_task(whole())
        made_whole.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(made_whole.discard)

    made_whole: set[asyncio.Task[None]] = set()

    def is_query(scope: Scope) -> bool:
        """Whether a request with no ``X-Amz-Target`` is one of SQS's Query protocol: a POST of a
        form (``Action=...``) to ``/`` or to a queue's URL (``/ACCOUNT/QUEUE``, where the Java
        SDK posts), or a GET of one of those with an ``Action`` in its query string."""
        if not _is_query_path(scope["path"]):
            return False
        if scope["method"] == "GET":
            return _names_action(scope["query_string"])
        content_type = (header(scope, b"content-type") or b"").partition(b";")[0].strip().lower()
        return content_type == b"application/x-www-form-urlencoded"

    def hot_route(scope: Scope) -> Handler | None:
        method = scope["method"]
        if method == "GET":
            if scope["query_string"] and is_query(scope):
                scope["journalq.operation"] = "GET /"
                return hot_sqs
            return None
        if method != "POST":
            return None
        path: str = scope["path"]
        # (A queue's URL begins with its account's digits: REST's paths, seldom, pay for no more.)
        if path == "/" or header(scope, b"x-amz-target") is not None or path[1:2].isdigit() and is_query(scope):
            scope["journalq.operation"] = "POST /"  # the latency label when no action is named
            return hot_sqs
        if _is_messages(path):
            scope["journalq.operation"] = _REST_ADD  # the latency label
            return hot_add
        return None

    def direct_route(scope: Scope) -> DirectHandler | None:
        method = scope["method"]
        if method == "GET":
            return direct_fetch if _is_messages(scope["path"]) and not hot_route(scope) else None
        if method == "DELETE":
            return direct_remove if _is_message(scope["path"]) else None
        handler = hot_route(scope)
        return direct_add if handler is hot_add else direct_sqs if handler is hot_sqs else None

    app.stop_waiting = stopping.set
    app.hot_route = hot_route
    app.direct_route = direct_route
    app.head_timeout = config.body_timeout  # journalq's HTTP protocol answers a slow head 408 too
    return app


_MESSAGES = "/messages"
_MESSAGES_SUFFIX = len(_MESSAGES)
_REST_ADD = "POST /{queue}/messages"
_REST_FETCH = "GET /{queue}/messages"
_REST_DELETE = "DELETE /{queue}/messages/{message_id}"
_OCTET_STREAM = (b"content-type", b"application/octet-stream")
_SQS_DIRECT = SqsProtocol.SEND_ACTIONS | {"DeleteMessage", "ReceiveMessage"}
"""The SQS actions the direct path takes (``direct_sqs``); a ReceiveMessage only if it cannot wait."""
_QUEUE_CHANGES = frozenset({"CreateQueue", "SetQueueAttributes", "DeleteQueue"})
"""SQS actions that may change a queue's own wait (``waitless``)."""
_AMZ_JSON = (b"content-type", b"application/x-amz-json-1.0")
_NO_TARGET = (
    "the request names no action: SQS's JSON protocol names it in an X-Amz-Target header "
    "(AmazonSQS.<Action>, with a JSON body), its Query protocol in a form's Action parameter "
    "(Content-Type: application/x-www-form-urlencoded)"
)
_XML = (b"content-type", sqs_query.CONTENT_TYPE.encode())
_QUERY_FIELDS = 4000
"""The most parameters a Query request's form (or query string) may have: a SendMessageBatch of
ten messages with ten attributes each has about 500. (Reading each costs the event loop ~1 µs.)"""
_QUERY_PATH = re.compile(r"/(?:[0-9]{12}/[^/]+/?)?")
"""Where a Query request goes: ``/``, or a queue's URL (``/ACCOUNT/QUEUE``)."""
_request_id_prefix = b""
_request_id_blocks = itertools.count()
_LAST_DIGITS = [b"%03x" % number for number in range(4096)]
"""A request id's last three hex digits, one block of ids each."""
_request_ids: Iterator[bytes] = iter(())


def _new_request_id_prefix() -> None:
    """Each process its own: a forked worker would otherwise give its parent's ids again."""
    global _request_id_prefix, _request_ids
    digits = os.urandom(10).hex()
    _request_id_prefix = f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:]}-".encode()
    _request_ids = iter(())


_new_request_id_prefix()
os.register_at_fork(after_in_child=_new_request_id_prefix)


def _request_id() -> bytes:
    """A new request id: the process's random prefix and 12 hex digits, a block's number (9) and
    the id's place in the block (3), unique without ``uuid4``'s cost. The ids of a block come
    from one iterator, each its head and a table's last digits, where formatting each id whole
    (``b"%s%012x"`` of a count) cost ~2,500 instructions. Thread-safe (a batch stored whole in
    the store thread answers its plain SendMessages there): taking the next id is one C call
    under the GIL, and each block has a number of its own; two threads that both find the block
    used up each make one, and the ids left in the one replaced are never given."""
    global _request_ids
    request_id = next(_request_ids, None)
    if request_id is None:
        head = b"%s%09x" % (_request_id_prefix, next(_request_id_blocks) & 0xFFFFFFFFF)
        _request_ids = ids = map(head.__add__, _LAST_DIGITS)
        request_id = next(ids)
    return request_id


def _sqs_headers(
    *extra: tuple[bytes, bytes], request_id: bytes | None = None, content_type: tuple[bytes, bytes] = _AMZ_JSON
) -> list[tuple[bytes, bytes]]:
    """The headers of an SQS answer, ``extra`` among them: its content type (JSON's unless
    given), and its request id (``_request_id``, unless given: a Query answer's is in its body
    too), which SQS sends with every answer and the SDKs expose (boto3's ``ResponseMetadata``'s
    ``RequestId``, which code reading it expects). In a UUID's shape, as SQS's; a random prefix
    per process and a count."""
    if request_id is None:
        request_id = _request_id()
    if extra:
        return [(b"x-amzn-requestid", request_id), *extra, content_type]
    return [(b"x-amzn-requestid", request_id), content_type]


_NO_BODY = (b"content-length", b"0")
_INTERNAL_ERROR = (
    500,
    [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")],
    b"Internal Server Error",
)
"""What uvicorn answers when an ASGI app fails (and closes the connection): the direct path's
answer to a failure that is not the storage's nor the request's."""


_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_HEADER = {"schema": {"type": "string"}}
_FAILED = {
    "400": "A bad queue name (or one of the server's own), or a bad parameter (or one the endpoint does not take).",
    "401": "The server requires a bearer token (``--token``) and the request has none or another.",
    "404": "The queue does not exist.",
    "503": "The storage failed (a full disk, an I/O error): nothing was done; try again after "
           "``Retry-After`` seconds.",
}
_REST_ANSWERS: dict[tuple[str, str], dict[str, Any]] = {
    ("/{queue}", "get"): {
        "200": "The queue exists: its counts (a topic whose channels are its own, none named ``default``: "
               "each channel's, under ``channels``).", "400": ..., "401": ..., "404": ..., "503": ...,
    },
    ("/{queue}", "put"): {
        "200": "The queue was there already.", "201": "The queue was made.",
        "400": "A bad queue name (or one of the server's own), a bad ``shards``, or a new queue named "
               "``*.fifo`` (SQS's FIFO queues have such names: make them with SQS's CreateQueue).",
        "401": ...,
        "409": "The queue exists with another number of shards than ``shards`` (fixed when it was made).",
        "503": ...,
    },
    ("/{queue}", "delete"): {
        "204": "The queue and its messages are deleted.", "400": ..., "401": ..., "404": ..., "503": ...,
    },
    ("/{queue}/messages", "get"): {
        "200": {"description": "The oldest available message, hidden now for the visibility timeout.",
                "content": _BYTES,
                "headers": {"X-Message-Id": {**_HEADER, "description": "The message's id."},
                            "X-Receipt": {**_HEADER, "description": "This delivery's receipt (SQS's)."},
                            "X-Receive-Count": {"schema": {"type": "integer"},
                                                "description": "How many times the message was delivered."}}},
        "204": "No message is available (after ``wait`` seconds; at once when the server stops).",
        "400": ..., "401": ..., "404": ..., "503": ...,
    },
    ("/{queue}/messages", "post"): {
        "201": {"description": "The body is stored as a message, on stable storage.",
                "headers": {"X-Message-Id": {**_HEADER, "description": "The new message's id."}}},
        "400": "The body could not be read (a broken chunked coding, a client gone), a bad queue name, or a "
               "FIFO queue (made through SQS: its messages need a group id, which REST does not carry).",
        "401": ..., "404": ...,
        "408": "The body did not arrive in time (10 s).",
        "413": "The body is over ``--max-message-size`` bytes.",
        "503": ...,
    },
    ("/{queue}/messages/{message_id}", "delete"): {
        "204": "The message is deleted, whatever its state.",
        "400": "Not one of this queue's message ids, or a bad queue name.",
        "401": ..., "404": "The queue, or a message of that id, does not exist (or is deleted already).",
        "503": ...,
    },
}
"""What each of mq's six endpoints answers, for the OpenAPI document: a description (``...``:
the common one of ``_FAILED``) or a whole OpenAPI response object."""


def _document_rest(schema: dict[str, Any], *, token: bool) -> dict[str, Any]:
    """FastAPI's OpenAPI document with mq's endpoints as they answer: every status they give
    (FastAPI's 422 is answered 400 here), their headers (``X-Message-Id``, ``Retry-After``),
    the message body as bytes both ways, and the bearer token when one is required."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = {
        "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
    if token:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        metrics = schema["paths"]["/metrics"]["get"]
        metrics["responses"]["401"] = {"description": _FAILED["401"], "content": error}
        metrics["security"] = [{"bearer": []}]
    for (path, method), answers in _REST_ANSWERS.items():
        operation = schema["paths"][path][method]
        # The JSON schema FastAPI made of the success's body, if it has one.
        body = next((answer["content"] for code, answer in operation["responses"].items()
                     if int(code) < 300 and "content" in answer), None)
        responses = {}
        for status, answer in answers.items():
            if answer is ...:
                answer = _FAILED[status]
            if isinstance(answer, str):
                answer = {"description": answer}
                if int(status) >= 400:
                    answer["content"] = error
                elif body is not None and status != "204":
                    answer["content"] = body
            if status == "503":
                answer["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                                     "description": "Seconds to wait before trying again."}}
            if status != "401" or token:
                responses[status] = answer
        operation["responses"] = responses
        if token:
            operation["security"] = [{"bearer": []}]
        if (path, method) == ("/{queue}/messages", "post"):
            operation["requestBody"] = {
                "required": False, "description": "The message: any bytes (any content type).",
                "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
            }
    return schema


_METHOD_ORDER = {method: i for i, method in enumerate(("GET", "HEAD", "POST", "PUT", "DELETE"))}


def _is_messages(path: str) -> bool:
    """Whether ``path`` is a queue's messages, ``/{queue}/messages``, where GET takes a message."""
    return path.endswith(_MESSAGES) and path.count("/") == 2 and len(path) > len(_MESSAGES) + 1


def _is_message(path: str) -> bool:
    """Whether ``path`` is one message of a queue, ``/{queue}/messages/{message_id}``."""
    parts = path.split("/")
    return len(parts) == 4 and parts[2] == "messages" and bool(parts[1]) and bool(parts[3])


def _deleted_answer(outcome: BaseException | None) -> Answer:
    """The direct path's answer to a delete: what ``remove`` answers to the same."""
    return (204, [], b"") if outcome is None else _failure_answer(outcome)


def _problem_response(exc: HTTPProblem) -> Response:
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def _error_response(exc: Error) -> Response:
    if isinstance(exc, JournalError):
        return JSONResponse({"error": _journal_problem(exc)}, status_code=500)
    status = 404 if isinstance(exc, (QueueNotFoundError, TaskNotFoundError)) else 400
    return JSONResponse({"error": str(exc)}, status_code=status)


def _journal_problem(exc: JournalError) -> str:
    """What an answer says of a journal that fails (damaged, truncated: the server's problem, not
    the request's), once logged whole: the reason, not the file's path (the server's business)."""
    log.error("journal failure: %s", exc)
    return f"the queue's stored data cannot be read: {exc.reason}"


def _failure_answer(exc: BaseException) -> Answer:
    """The direct path's answer to a request that failed: what its route (``hot_add``, ``fetch``,
    ``remove``) answers to the same."""
    if isinstance(exc, HTTPProblem):
        response = _problem_response(exc)
    elif isinstance(exc, Error):
        response = _error_response(exc)
    else:
        log.error("a request failed", exc_info=exc)
        return _INTERNAL_ERROR
    return response.status_code, response.raw_headers, bytes(response.body)


def _text_headers(scope: Scope) -> dict[str, str]:
    """A request's headers by lowercase name, as text (what the SQS checks and SigV4 read)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _dumps_without_setup() -> Callable[[Any], str]:
    """``json.dumps`` with its defaults, for the SQS answers. json.dumps builds its C encoder at
    every call (~0.8 µs, more than encoding a SendMessage answer takes): this one is built once,
    with json.dumps' settings but for the check for cycles (its ``markers``, which a failed call
    could leave dirty), which answers made of fresh dicts and lists never need."""
    make_encoder = json.encoder.c_make_encoder
    if make_encoder is None:  # a Python without the json module's C part
        return json.dumps
    encode = make_encoder(
        None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


_json_text = _dumps_without_setup()


def _plain_sent_answer(message_id: str, md5: str) -> Answer:
    """The answer to a plain SendMessage (``SqsProtocol.send_together``'s ``plain``), made where
    its batch is stored (on the event loop, or in the store thread: see ``appended``): the JSON
    text of ``plain_answer(message_id, md5)``, formatted rather than encoded (~0.4 µs less;
    journalq's message ids, decimal digits or a shard's index, a dot and those, and a hex digest
    have nothing to escape). ``_whole`` of ``_sqs_headers()``'s, without their two calls (~0.1 µs:
    one a message): the body is under 1 KiB (an id of a few dozen characters)."""
    body = ('{"MessageId": "%s", "MD5OfMessageBody": "%s"}' % (message_id, md5)).encode()
    return 200, [(b"x-amzn-requestid", _request_id()), _AMZ_JSON, _CONTENT_LENGTHS[len(body)]], body


_decoder = json.JSONDecoder()  # what json.loads uses for text
_decode_json = _decoder.decode
_scan_json = _decoder.scan_once  # the C scanner that decode calls, through two regex matches and raw_decode


def _json_of(body: bytes) -> Any:
    """``json.loads(body)``: the same value or the same error. A body that begins with ``{`` not
    followed by NUL (any JSON object in UTF-8) is one ``json.loads`` takes as UTF-8 (its guess of
    the encoding reads the first bytes): decoded here as it would, without the guess (~0.6 µs),
    and scanned without ``decode``'s Python around the scanner when the object ends the body
    (~0.5 µs): ``decode`` skips whitespace (none before ``{``), scans, and checks that only
    whitespace follows; anything else (an error, more after the object) goes through ``decode``."""
    if body[:1] == b"{" and body[1:2] != b"\x00":
        text = body.decode("utf-8", "surrogatepass")
        try:
            value, end = _scan_json(text, 0)
        except (ValueError, StopIteration):
            pass  # decode raises its error
        else:
            if end == len(text):
                return value
        return _decode_json(text)
    return json.loads(body)


_CONTENT_LENGTHS = [(b"content-length", str(size).encode()) for size in range(1024)]
"""The content-length headers of the answers up to 1 KiB (a plain SendMessage's, most errors'):
made once, where ``str(size).encode()`` cost ~1,100 instructions an answer."""


def _whole(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
    """An answer with its content-length."""
    size = len(body)
    headers.append(_CONTENT_LENGTHS[size] if size < 1024 else (b"content-length", str(size).encode()))
    return status, headers, body


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    return await _send_answer(send, _whole(status, body, headers))


async def _send_answer(send: Send, answer: Answer) -> int:
    """A whole answer in two ASGI messages (what Starlette's ``Response`` sends, without it);
    returns its status."""
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


async def _respond(response: Response, scope: Scope, receive: Receive, send: Send) -> int:
    await response(scope, receive, send)
    return response.status_code


def _sqs_error_answer(exc: SqsError, headers: dict[str, str] | None = None, *, query: bool = False) -> Answer:
    """SQS's answer to a request it refused: JSON's shape, or with ``query`` the Query protocol's XML."""
    request_id = _request_id()
    if query:
        answer = _sqs_headers(request_id=request_id, content_type=_XML)
        body = sqs_query.error_xml(exc, request_id.decode())
    else:
        answer = _sqs_headers((b"x-amzn-query-error", exc.query_error.encode()), request_id=request_id)
        body = _json_text({"__type": exc.type, "message": exc.message}).encode()
    answer += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
    return _whole(exc.status, body, answer)


def _is_query_path(path: str) -> bool:
    """Whether a path is one a Query request goes to (``_QUERY_PATH``): ``/``, or one whose first
    character after it is a digit (REST's paths begin with a queue's name, seldom a digit) and that
    is a queue's URL."""
    return path == "/" or path[1:2].isdigit() and _QUERY_PATH.fullmatch(path) is not None


def _names_action(query_string: bytes) -> bool:
    """Whether a query string has an ``Action`` parameter (a GET of the Query protocol)."""
    return query_string.startswith(b"Action=") or b"&Action=" in query_string


def _query_request(scope: Scope, body: bytes) -> tuple[str, dict[str, Any]]:
    """The action and payload of a request of the Query protocol (``sqs_query.request_of``) from
    its form and its query string; its path as the ``QueueUrl`` when it was sent to a queue's
    URL and names none. ``SqsRefusal`` when they cannot be read."""
    try:
        parameters = [
            parameter
            for text in (body, scope["query_string"])
            for parameter in parse_qsl(
                text.decode("utf-8"), keep_blank_values=True, errors="strict", max_num_fields=_QUERY_FIELDS
            )
        ]
    except UnicodeDecodeError as exc:
        raise SqsRefusal(SqsError("InvalidRequest", f"the request's parameters are not UTF-8: {exc}")) from None
    except ValueError:  # parse_qsl's "Max number of fields exceeded"
        raise SqsRefusal(SqsError(
            "InvalidRequest", f"the request has more than {_QUERY_FIELDS} parameters (an SQS request has a few "
            "hundred at the most)")) from None
    path: str = scope["path"]
    try:
        return sqs_query.request_of(parameters, None if path == "/" else path)
    except SqsError as exc:
        raise SqsRefusal(exc) from None


Handler = Callable[[Scope, Receive, Send], Awaitable[int]]
"""A hot-path handler: answers a request whole and returns the status it answered with."""

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
"""A whole answer: status, headers (with content-length), body."""


class Respond(Protocol):
    """Writes a whole answer (status, headers with content-length, body) to a request of the
    direct path; ``gone()``: whether its client went away meanwhile (asked from any thread)."""

    def __call__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, /) -> None: ...

    def gone(self) -> bool: ...


DirectHandler = Callable[[Scope, bytes, Respond], bool]
"""Takes a request whose whole body is there, answering it later through ``respond``; or returns
False, having done nothing, and the request goes through ASGI."""


class App(FastAPI):
    """FastAPI with a hot path in front: requests that ``hot_route(scope)`` gives a handler for
    are answered by it (timed, as every request is), without FastAPI's and Starlette's layers
    (telemetry, body limits, middleware stack); the others go through FastAPI."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics = self.state.metrics = metrics.Metrics()
        """(Also as ``app.state.metrics``, where Starlette's ``State`` finds it in Python: ~0.3 µs a
        read, per request on the hot paths.)"""
        self.add_middleware(metrics.RequestTimer, metrics=self.metrics)
        self.hot_route: Callable[[Scope], Handler | None] = lambda scope: None
        self.direct_route: Callable[[Scope], DirectHandler | None] = lambda scope: None
        self.head_timeout: float | None = None
        self.stop_waiting: Callable[[], None] = lambda: None
        """Called when the server begins to stop (by journalq's HTTP protocol): long polls end."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.hot_route(scope)
            if handler is not None:
                started, status = time.perf_counter(), 500
                try:
                    status = await handler(scope, receive, send)
                finally:
                    self.metrics.note_request(scope, status, started)
                return
            if scope["method"] == "HEAD" and not _is_messages(scope["path"]):
                # HEAD is GET without the body (uvicorn leaves the body out, for the request it
                # has is still HEAD); but for a fetch, which would take a message: 405.
                scope = {**scope, "method": "GET"}
        await super().__call__(scope, receive, send)

    def methods_at(self, scope: Scope) -> list[str]:
        """The methods the request's path takes, for the ``Allow`` header of a 405."""
        probe = {**scope, "method": "GET"}
        reserved = scope["path"].split("/")[1] in RESERVED  # no queue there: only its own route
        methods: set[str] = set()
        for route in self.router.routes:
            if reserved and "{queue}" in getattr(route, "path", ""):
                continue
            match, _ = route.matches(probe)
            if match is not Match.NONE:
                methods |= getattr(route, "methods", None) or set()
        if "GET" in methods and not _is_messages(scope["path"]):
            methods.add("HEAD")
        if scope["path"] == "/":
            methods.add("POST")  # the SQS protocol, served by the hot path
        return sorted(methods, key=lambda method: (_METHOD_ORDER.get(method, len(_METHOD_ORDER)), method))


def app_from_environment() -> App:
    """The app of a uvicorn worker process: settings from ``JOURNALQ_SERVER``."""
    app = create_app(ServerConfig.from_environment())
    stop_with_supervisor()
    settle_heap()
    return app


def stop_with_supervisor() -> None:
    """Stop this worker process (a SIGTERM: answered requests, synced journals) once the process
    that started it is gone. A supervisor killed with SIGKILL stops none of its workers, and they
    went on serving, holding the port (a new server could not bind it) and the data directory.
    multiprocessing's parent sentinel reads the end of a pipe that only the parent holds open:
    it ends whenever and however the parent dies, even before this is called (no pid to reuse,
    no polling; on any POSIX system, unlike Linux's PR_SET_PDEATHSIG).

    SIGINT is left to the supervisor, which stops its workers with SIGTERM on it: a terminal's
    Ctrl-C reaches every process of the group, and pressed twice it was the worker's forced exit
    (uvicorn's, on a second SIGINT: requests under way cut off, journals neither synced nor
    closed; see ``journalq.server.stopping``). Called by the app's factory, within uvicorn's
    signal handling, which puts the default back when the worker's server is done."""
    import multiprocessing

    parent = multiprocessing.parent_process()  # None in a process that multiprocessing did not start
    if parent is None:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        parent.join()
        log.warning("the server's supervisor process %s is gone: this worker (%d) stops", parent.pid, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="journalq-supervisor-watch", daemon=True).start()


YOUNG_OBJECTS = 50_000
"""The collector's first threshold in a server process (Python's default is 700)."""


def settle_heap() -> None:
    """Ready the garbage collector of a server process, once its modules and app are loaded.

    Under load a full collection walked every object of the process (the modules of FastAPI,
    pydantic, uvicorn...) and stopped the server for 25-45 ms: up to three times a second when
    64 clients kept ~1,000 request objects alive at once, over the 700 that start a young
    collection (each tenth of those starts an older one, and so on). The objects loaded so far
    live as long as the process: they are frozen out of every collection (``gc.freeze``), and
    the young generation is allowed ``YOUNG_OBJECTS``. Requests' objects are freed by reference
    counting; the collector is still there for cycles.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])


__all__ = ["RESERVED", "App", "app_from_environment", "create_app", "settle_heap"]
