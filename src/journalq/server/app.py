"""The HTTP application: mq's REST API, the Amazon SQS JSON protocol at ``POST /``, metrics.

Every queue operation is blocking file I/O, so it runs in a worker thread; the threads of
concurrent requests share their syncs (the journal writer's group commit), so a durable answer
costs little throughput. Nothing is answered as stored before it is on stable storage (with the
default ``sync="always"``); when the storage refuses (a full disk, an I/O error) the answer is 503
with ``Retry-After``, the write leaves nothing half-done, and reads go on being served.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from journalq import __version__
from journalq.errors import Error, QueueNotFoundError, StorageError, TaskNotFoundError
from journalq.queue import Broker
from journalq.server import metrics
from journalq.server.batching import SendBatcher
from journalq.server.config import ServerConfig
from journalq.server.hub import HUB_DIR, hub_router
from journalq.server.sigv4 import AuthError, verify
from journalq.server.sqs import SqsError, SqsProtocol

log = logging.getLogger("journalq.server")
T = TypeVar("T")

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}
"""Errors of the storage (a full disk, a quota, an I/O error) answered 503 wherever they arise."""

RESERVED = {"metrics", "healthz", "docs", "redoc", "openapi.json"}
"""Paths of the server's own that no queue can be reached at through the REST API."""


class HTTPProblem(Exception):
    """An answer other than success, with its status, message and headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def create_app(config: ServerConfig) -> FastAPI:
    broker_box: list[Broker] = []
    limiter = anyio.CapacityLimiter(256)  # blocking operations but receives
    # Receives may long-poll (up to 20 s for SQS, ``wait`` for REST): with one pool for all, a few
    # hundred waiting consumers would hold up every write, and the messages they wait for.
    receive_limiter = anyio.CapacityLimiter(1024)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        broker = Broker(config.data, sync=config.sync)
        broker_box.append(broker)
        app.state.metrics.watch(broker)
        log.info("journalq %s serving %s on http://%s:%d (sync=%s)", __version__, config.data, config.host, config.port, config.sync)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(broker.close)  # syncs and closes every journal

    app = FastAPI(
        title="journalq",
        version=__version__,
        description="mq's REST API over journalq queues. The Amazon SQS JSON protocol is served at "
        "`POST /` (see the SQS API reference); Prometheus metrics at `/metrics`.",
        lifespan=lifespan,
    )
    app.state.metrics = metrics.Metrics()
    app.add_middleware(metrics.RequestTimer, metrics=app.state.metrics)
    app.add_middleware(_SqsPaths)

    def broker() -> Broker:
        return broker_box[0]

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        return await blocking(lambda: broker().queue(queue, create=False).send_many(bodies))

    sends = SendBatcher(store)

    async def blocking(fn: Callable[..., T], *args: Any, receiving: bool = False) -> T:
        """Run a queue operation in a worker thread, mapping storage failures to 503."""
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=receive_limiter if receiving else limiter)
        except StorageError as exc:
            # A failed sync leaves a writer unusable by design: close it, and the next request
            # reopens (and recovers) the journal. A failed write was taken back already.
            reopened = broker().reopen_failed()
            log.error("storage failure: %s%s", exc, f" (reopening {', '.join(reopened)})" if reopened else "")
            raise HTTPProblem(503, f"not stored: {exc.reason}", {"Retry-After": str(config.retry_after)}) from exc
        except OSError as exc:
            # The same failures met outside a journal (a queue's settings file, its channel's
            # token, an offset file): still the storage's, not a bug of the server's.
            if exc.errno not in _STORAGE_ERRNOS:
                raise
            log.error("storage failure: %s", exc)
            retry = {"Retry-After": str(config.retry_after)}
            raise HTTPProblem(503, f"not stored: {exc.strerror or exc}", retry) from exc

    async def body_of(request: Request, limit: int) -> bytes:
        """The request body, refused when too large (413) or too slow to arrive (408)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPProblem(413, f"the body is {declared} bytes; at most {limit} are taken")
        chunks: list[bytes] = []
        size = 0

        async def read() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPProblem(413, f"the body is over {limit} bytes")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), config.body_timeout)
        except TimeoutError:
            raise HTTPProblem(408, f"the body did not arrive within {config.body_timeout:g} s") from None
        except HTTPProblem:
            raise
        except Exception as exc:  # the client went away or sent a broken body
            raise HTTPProblem(400, f"the request body could not be read: {exc}") from None
        return b"".join(chunks)

    async def rest_auth(request: Request) -> None:  # async: no thread hop per request
        if config.rest_token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {config.rest_token}".encode()):
            raise HTTPProblem(401, "a valid bearer token is required", {"WWW-Authenticate": 'Bearer realm="journalq"'})

    def queue_name(queue: str) -> str:
        if queue in RESERVED:
            raise HTTPProblem(400, f"{queue!r} is reserved for the server's own use")
        return queue

    app.include_router(hub_router(config.data / HUB_DIR, sync=config.sync), dependencies=[Depends(rest_auth)])

    @app.exception_handler(HTTPProblem)
    async def problem(request: Request, exc: HTTPProblem) -> Response:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Error)
    async def journalq_error(request: Request, exc: Error) -> Response:
        status = 404 if isinstance(exc, (QueueNotFoundError, TaskNotFoundError)) else 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    # -- service endpoints ---------------------------------------------------------------------

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        """Answers while the server runs and its data directory can be listed."""
        names = await blocking(broker().names)
        return {"status": "ok", "queues": len(names)}

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def metrics_endpoint() -> Response:
        """Prometheus text format: messages in and out, depth, in flight, dead, latency, syncs."""
        body = await blocking(app.state.metrics.render)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    # -- mq's six endpoints ------------------------------------------------------------------

    @app.get("/{queue}", tags=["mq"], dependencies=[Depends(rest_auth)])
    async def get_queue(queue: str) -> dict[str, Any]:
        """200 with the queue's counts when it exists, 404 otherwise."""
        stats = await blocking(lambda: broker().queue(queue_name(queue), create=False).stats())
        return {"name": queue, **stats.__dict__}

    @app.put("/{queue}", tags=["mq"], dependencies=[Depends(rest_auth)], status_code=201)
    async def put_queue(queue: str, response: Response) -> dict[str, Any]:
        """Create the queue (201), or find it there already (200). The body is ignored."""
        name = queue_name(queue)
        def create() -> bool:
            existed = broker().exists(name)
            broker().queue(name)
            return existed

        existed = await blocking(create)
        if existed:
            response.status_code = 200
        return {"name": name, "created": not existed}

    @app.delete("/{queue}", tags=["mq"], dependencies=[Depends(rest_auth)], status_code=204)
    async def delete_queue(queue: str) -> Response:
        """Delete the queue and all its messages."""
        await blocking(broker().delete, queue_name(queue))
        return Response(status_code=204)

    @app.get("/{queue}/messages", tags=["mq"], dependencies=[Depends(rest_auth)])
    async def fetch(queue: str, wait: float = 0.0, visibility_timeout: float | None = None) -> Response:
        """The oldest available message as the body, with ``X-Message-Id`` (and ``X-Receipt``,
        ``X-Receive-Count``); 204 when there is none. The message is hidden for the visibility
        timeout and delivered again unless deleted. ``wait``: long polling, in seconds."""
        got = await blocking(
            lambda: broker().queue(queue_name(queue), create=False).receive(
                1, wait=wait, visibility_timeout=visibility_timeout
            ),
            receiving=True,
        )
        if not got:
            return Response(status_code=204)
        message = got[0]
        app.state.metrics.messages_out.labels(queue).inc()
        return Response(
            message.body,
            media_type="application/octet-stream",
            headers={
                "X-Message-Id": message.id,
                "X-Receipt": message.receipt,
                "X-Receive-Count": str(message.receive_count),
            },
        )

    @app.post("/{queue}/messages", tags=["mq"], dependencies=[Depends(rest_auth)], status_code=201)
    async def add(queue: str, request: Request) -> Response:
        """Store the body as a message; 201 with ``X-Message-Id`` once it is on stable storage,
        400 when the body cannot be read, 503 with ``Retry-After`` when it cannot be stored."""
        body = await body_of(request, config.max_message_size)
        message_id = await sends.send(queue_name(queue), body)
        app.state.metrics.messages_in.labels(queue).inc()
        return Response(status_code=201, headers={"X-Message-Id": message_id})

    @app.delete("/{queue}/messages/{message_id}", tags=["mq"], dependencies=[Depends(rest_auth)], status_code=204)
    async def remove(queue: str, message_id: str) -> Response:
        """Delete a message by the id that adding or fetching it gave, whatever its state."""
        await blocking(lambda: broker().queue(queue_name(queue), create=False).delete_id(message_id))
        app.state.metrics.messages_deleted.labels(queue).inc()
        return Response(status_code=204)

    # -- the Amazon SQS JSON protocol -----------------------------------------------------------

    sqs_box: list[SqsProtocol] = []

    @app.post("/", tags=["sqs"], include_in_schema=False)
    async def sqs(request: Request) -> Response:
        target = request.headers.get("x-amz-target", "")
        service, _, action = target.partition(".")
        if service != "AmazonSQS" or not action:
            return _sqs_error(SqsError("InvalidAction", f"X-Amz-Target {target!r} is not an Amazon SQS action"))
        try:
            body = await body_of(request, config.max_request_size)
        except HTTPProblem as exc:
            return _sqs_error(SqsError("RequestEntityTooLarge" if exc.status == 413 else "InvalidRequest", exc.message, status=exc.status))
        if config.aws_credentials:
            try:
                verify(
                    request.method,
                    request.scope.get("journalq.signed_path", request.url.path),
                    request.url.query,
                    dict(request.headers),
                    body,
                    config.aws_credentials,
                )
            except AuthError as exc:
                return _sqs_error(SqsError(exc.code, exc.message, status=exc.status))
        elif config.rest_token is not None:
            # A server guarded by a token is not left open through its other API: without AWS
            # keys configured, SQS requests need the same bearer token.
            try:
                await rest_auth(request)
            except HTTPProblem as exc:
                return _sqs_error(SqsError("MissingAuthenticationToken", exc.message, status=exc.status), exc.headers)
        try:
            payload = json.loads(body or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            return _sqs_error(SqsError("InvalidRequest", f"the body is not a JSON object: {exc}"))
        if not sqs_box:
            sqs_box.append(SqsProtocol(broker(), account_id=config.account_id, region=config.region))
        base_url = f"{request.url.scheme}://{request.headers.get('host', f'{config.host}:{config.port}')}"
        try:
            answer = await blocking(sqs_box[0].handle, action, payload, base_url, receiving=action == "ReceiveMessage")
        except SqsError as exc:
            return _sqs_error(exc)
        except HTTPProblem as exc:
            return _sqs_error(SqsError("ServiceUnavailable", exc.message, status=exc.status, sender=False), exc.headers)
        except Error as exc:  # none that SQS has a code for: still answered in SQS's shape
            return _sqs_error(SqsError("InternalFailure", str(exc), status=500, sender=False))
        app.state.metrics.count_sqs(action, payload, answer)
        return Response(json.dumps(answer).encode(), media_type="application/x-amz-json-1.0")

    return app


def _sqs_error(exc: SqsError, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"__type": exc.type, "message": exc.message}).encode(),
        status_code=exc.status,
        media_type="application/x-amz-json-1.0",
        headers={"x-amzn-query-error": exc.query_error, **(headers or {})},
    )


class _SqsPaths:
    """SQS clients may post to the queue's URL instead of ``/``: any POST naming an SQS action
    in ``X-Amz-Target`` goes to the SQS endpoint. (ASGI middleware.)"""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] != "/":
            if any(name == b"x-amz-target" for name, _ in scope["headers"]):
                # The signature covers the path the client posted to: keep it for verify().
                scope = {**scope, "path": "/", "raw_path": b"/", "journalq.signed_path": scope["path"]}
        await self.app(scope, receive, send)


def app_from_environment() -> FastAPI:
    """The app of a uvicorn worker process: settings from ``JOURNALQ_SERVER``."""
    return create_app(ServerConfig.from_environment())


__all__ = ["RESERVED", "app_from_environment", "create_app"]
