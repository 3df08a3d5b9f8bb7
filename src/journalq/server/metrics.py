"""Prometheus metrics: messages in and out, queue depths, request latency, syncs.

Each app has a registry of its own (tests start many). With ``--workers N`` every worker process
counts its own requests; the queue gauges read the data directory, so every worker reports the
same depths.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from journalq.journal.sync import syncs_done
from journalq.queue import Broker

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20)
SQS_ACTIONS = frozenset(
    (
        "CreateQueue", "GetQueueUrl", "ListQueues", "GetQueueAttributes", "SetQueueAttributes",
        "PurgeQueue", "DeleteQueue", "SendMessage", "SendMessageBatch", "ReceiveMessage",
        "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch", "ListDeadLetterSourceQueues", "StartMessageMoveTask",
        "ListMessageMoveTasks", "CancelMessageMoveTask", "TagQueue", "UntagQueue", "ListQueueTags",
        "AddPermission", "RemovePermission",
    )
)
"""The operation labels of SQS requests. Any other ``X-Amz-Target`` is labelled ``other``: the
header comes from the client (before any authentication), and label values must not grow
without bound."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.broker: Broker | None = None
        self.messages_in = Counter("journalq_messages_in", "Messages stored.", ["queue"], registry=self.registry)
        self.messages_out = Counter("journalq_messages_out", "Messages delivered.", ["queue"], registry=self.registry)
        self.messages_deleted = Counter(
            "journalq_messages_deleted", "Messages deleted by their consumers.", ["queue"], registry=self.registry
        )
        self.request_seconds = Histogram(
            "journalq_request_seconds",
            "Time to answer a request.",
            ["api", "operation", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Gauges(self))
        self._children: dict[tuple[str, str, int], Any] = {}  # bounded: operations x statuses
        self._counted: dict[tuple[int, str], Any] = {}

    def note_request(self, scope: dict[str, Any], status: int, started: float) -> None:
        """Note the latency of a request answered with ``status``, begun at ``started``
        (``time.perf_counter()``)."""
        target = next((value for name, value in scope["headers"] if name == b"x-amz-target"), b"")
        if target:
            action = target.decode("latin-1").partition(".")[2]
            api, operation = "sqs", action if action in SQS_ACTIONS else "other"
        else:
            operation = scope.get("journalq.operation")  # set by the app's hot path
            if operation is None:
                path = getattr(scope.get("route"), "path", None) or "unrouted"
                operation = f"{scope['method']} {path}"
            api = "rest" if "{queue}" in operation else "service"
        self.note(api, operation, status, time.perf_counter() - started)

    def note(self, api: str, operation: str, status: int, seconds: float) -> None:
        """Note the latency of a request whose labels are known (the server's direct path)."""
        key = (api, operation, status)
        child = self._children.get(key)
        if child is None:  # labels() takes a lock and checks its values: once per key
            child = self._children[key] = self.request_seconds.labels(api, operation, str(status))
        child.observe(seconds)

    def watch(self, broker: Broker) -> None:
        self.broker = broker

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def count_sqs(self, action: str, request: dict[str, Any], answer: dict[str, Any]) -> None:
        """Count the messages an SQS action moved."""
        queue = str(request.get("QueueUrl", "")).rstrip("/").rsplit("/", 1)[-1] or "?"
        if action == "SendMessage":
            self.counted(self.messages_in, queue).inc()
        elif action == "SendMessageBatch":
            self.counted(self.messages_in, queue).inc(len(answer.get("Successful", ())))
        elif action == "ReceiveMessage":
            self.counted(self.messages_out, queue).inc(len(answer.get("Messages", ())))
        elif action == "DeleteMessage":
            self.counted(self.messages_deleted, queue).inc()
        elif action == "DeleteMessageBatch":
            self.counted(self.messages_deleted, queue).inc(len(answer.get("Successful", ())))

    def counted(self, counter: Counter, queue: str) -> Any:
        """``counter.labels(queue)``, looked up once per queue (``labels`` takes a lock and checks
        its values: about a µs). The names come from requests that reached a queue (or its
        checks), as the counters' labels do themselves."""
        key = (id(counter), queue)
        child = self._counted.get(key)
        if child is None:
            child = self._counted[key] = counter.labels(queue)
        return child


class _Gauges:
    """Read at each scrape: the queues' counts and the syncs done."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        syncs = CounterMetricFamily("journalq_syncs", "Data syncs to stable storage by this process.")
        syncs.add_metric([], syncs_done())
        yield syncs
        broker = self.metrics.broker
        if broker is None:
            return
        families = {
            name: GaugeMetricFamily(f"journalq_queue_{name}", help_, labels=["queue"])
            for name, help_ in (
                ("available", "Messages that can be received now."),
                ("in_flight", "Messages received and not yet deleted nor visible again."),
                ("delayed", "Messages waiting out a delay."),
                ("dead", "Messages moved to the dead-letter queue."),
                ("oldest_age_seconds", "Age of the oldest message not yet deleted."),
            )
        }
        for name in broker.names():
            try:
                stats = broker.queue(name, create=False).stats()
            except Exception:  # a queue deleted meanwhile, or unreadable: leave it out of this scrape
                continue
            for field, family in families.items():
                value = getattr(stats, field.removesuffix("_seconds"))
                if value is not None:
                    family.add_metric([name], float(value))
        yield from families.values()


class RequestTimer:
    """ASGI middleware: every request's latency, by API, operation and status."""

    def __init__(self, app: Callable[..., Any], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        else:
            await self.timed(self.app, scope, receive, send)

    async def timed(
        self, app: Callable[..., Any], scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        """Run the ASGI ``app`` on one HTTP request, noting its latency."""
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_and_note)
        finally:
            self.metrics.note_request(scope, status, started)
