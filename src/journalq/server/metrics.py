"""Prometheus metrics: messages in and out, queue depths, receives waiting, request latency, syncs.

One process (``journalq serve``, and the tests, which start many apps in one process): each app
has a registry of its own that holds the values in memory.

Worker processes (``journalq serve --workers N``): a scrape reaches one worker, which must answer
for all of them. prometheus_client's multiprocess mode does that: ``journalq serve`` names a fresh
directory in ``PROMETHEUS_MULTIPROC_DIR`` before the workers import prometheus_client, each
worker's counters and histograms write their values into files of that directory named by its
pid, and a scrape adds up every file (``MultiProcessCollector``). The files of a worker that died
stay and keep counting (what it counted happened); its live gauges are dropped by the supervisor
(``WorkerSupervisor``, ``mark_process_dead``). The queue gauges are read from the data directory at
scrape time by the worker scraped, so they appear once, not once per worker.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from uvicorn.supervisors import Multiprocess

from journalq.errors import Error
from journalq.journal.sync import syncs_done
from journalq.queue import Broker
from journalq.server.reading import queue_to_read
from journalq.server.scopes import header

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
HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"))
"""The methods that a REST or service operation's label names; any other is labelled ``OTHER``
(a method is any token the client chooses)."""


MULTIPROCESS_DIRECTORY = "PROMETHEUS_MULTIPROC_DIR"
"""The environment variable that puts prometheus_client in multiprocess mode when it is imported."""


def multiprocess_directory() -> str | None:
    """The directory of prometheus_client's multiprocess mode, or None when this process keeps
    its values in memory. The mode is chosen once, when prometheus_client is imported: a variable
    set (or removed) after that would leave every scrape empty or one worker's, so it is refused."""
    directory = os.environ.get(MULTIPROCESS_DIRECTORY) or None
    # ``_multiprocess`` tells prometheus_client's two value classes apart (a release without it
    # goes unchecked).
    multiprocess = getattr(values.ValueClass, "_multiprocess", None)
    if multiprocess is not None and multiprocess != (directory is not None):
        raise Error(f"{MULTIPROCESS_DIRECTORY} must be set (or not) before prometheus_client is imported")
    return directory


class Metrics:
    def __init__(self) -> None:
        self.multiprocess_directory = multiprocess_directory()
        self.registry = CollectorRegistry()
        # In multiprocess mode the values live in the directory's files and the registry scraped
        # reads those: registered as well, this process's own values would count twice.
        own = None if self.multiprocess_directory else self.registry
        self.broker: Broker | None = None
        self.messages_in = Counter("journalq_messages_in", "Messages stored.", ["queue"], registry=own)
        self.messages_out = Counter("journalq_messages_out", "Messages delivered.", ["queue"], registry=own)
        self.messages_deleted = Counter(
            "journalq_messages_deleted", "Messages deleted by their consumers.", ["queue"], registry=own
        )
        self.request_seconds = LatencyHistogram(
            "journalq_request_seconds",
            "Time to answer a request.",
            ["api", "operation", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=own,
        )
        # livesum: a dead worker's 1 leaves the sum once the supervisor marks it dead.
        workers = Gauge("journalq_workers", "Server processes running.", registry=own, multiprocess_mode="livesum")
        workers.set(1)
        # livesum: the polls of a worker that died leave the sum with it.
        self.receives_waiting = Gauge(
            "journalq_receives_waiting", "Receives waiting for a message now (long polls).", ["queue"],
            registry=own, multiprocess_mode="livesum",
        )
        self._children: dict[tuple[str, str, int], Any] = {}  # bounded: operations x statuses
        # Latencies noted and not yet in the histogram, by labels: see ``note``.
        self._noted: dict[tuple[str, str, int], list[float]] = {}
        self._counted: dict[tuple[int, str], Any] = {}
        if self.multiprocess_directory is None:
            self.registry.register(_ScrapeTime(self, syncs=True))
            return
        MultiProcessCollector(self.registry, self.multiprocess_directory)
        self._in_use = hold(self.multiprocess_directory)  # as long as this process lives
        self.registry.register(_ScrapeTime(self, syncs=False))
        # The journal counts its syncs in a plain integer (``syncs_done``): what this process did
        # since its last publication is added to a counter of the directory's when a request is
        # noted (a sync comes about once per 30 requests: one comparison per request otherwise),
        # before a scrape, and every second (syncs after the last request: group commit's flusher
        # thread, a queue's collection). The instance's ``note`` shadows the method: one process
        # pays nothing.
        self.syncs = Counter("journalq_syncs", "Data syncs to stable storage by the server's processes.", registry=None)
        self._syncs_published = 0
        self._publishing = threading.Lock()  # notes and the timer run on the event loop, scrapes in a thread
        self.note = self._note_and_publish_syncs  # type: ignore[method-assign]

    def note_request(self, scope: dict[str, Any], status: int, started: float) -> None:
        """Note the latency of a request answered with ``status``, begun at ``started``
        (``time.perf_counter()``)."""
        target = header(scope, b"x-amz-target")  # the one the app acts on: the last
        # (A request of SQS's Query protocol names its action in its form: the app notes it.)
        action = target.decode("latin-1").partition(".")[2] if target else scope.get("journalq.sqs_action")
        if action is not None:
            api, operation = "sqs", action if action in SQS_ACTIONS else "other"
        else:
            operation = scope.get("journalq.operation")  # set by the app's hot path
            if operation is None:
                path = getattr(scope.get("route"), "path", None) or "unrouted"
                method = scope["method"]
                operation = f"{method if method in HTTP_METHODS else 'OTHER'} {path}"
            api = "rest" if "{queue}" in operation else "service"
        self.note(api, operation, status, time.perf_counter() - started)

    def note(self, api: str, operation: str, status: int, seconds: float) -> None:
        """Note the latency of a request whose labels are known (the server's direct path).

        The histogram takes what was noted once per turn of the event loop (``observe_noted``,
        scheduled by the first note of a turn) and before a scrape: an ``observe`` per request
        cost ~0.6 µs, 5 % of the direct path's CPU per request, and the requests of a batch are
        answered in the same turn."""
        key = (api, operation, status)
        noted = self._noted.get(key)
        if noted is None:
            if not self._noted:
                try:
                    asyncio.get_running_loop().call_soon(self.observe_noted)
                except RuntimeError:  # no event loop: observe now
                    self._observe(key, [seconds])
                    return
            noted = self._noted[key] = []
        noted.append(seconds)

    def observe_noted(self) -> None:
        """Put the latencies noted so far into the histogram (on the event loop's thread, as
        ``note``)."""
        noted, self._noted = self._noted, {}
        for key, latencies in noted.items():
            self._observe(key, latencies)

    def _observe(self, key: tuple[str, str, int], latencies: list[float]) -> None:
        child = self._children.get(key)
        if child is None:  # labels() takes a lock and checks its values: once per key
            child = self._children[key] = self.request_seconds.labels(key[0], key[1], str(key[2]))
        child.observe_all(latencies)

    def _note_and_publish_syncs(self, api: str, operation: str, status: int, seconds: float) -> None:
        """``note`` in multiprocess mode."""
        Metrics.note(self, api, operation, status, seconds)
        if syncs_done() != self._syncs_published:
            self.publish_syncs()

    def publish_syncs(self) -> None:
        """Add the syncs this process did since the last call to the workers' counter (in
        multiprocess mode; one process reads ``syncs_done`` at the scrape)."""
        if self.multiprocess_directory is None:
            return
        with self._publishing:
            done = syncs_done()
            self.syncs.inc(done - self._syncs_published)
            self._syncs_published = done

    def watch(self, broker: Broker) -> None:
        self.broker = broker

    async def keep_publishing_syncs(self, interval: float = 1.0) -> None:
        """``publish_syncs`` every ``interval`` seconds, until cancelled (nothing to do for one
        process)."""
        while self.multiprocess_directory is not None:
            await asyncio.sleep(interval)
            self.publish_syncs()

    def render(self) -> bytes:
        """The scrape's text. (Call ``observe_noted`` first, on the event loop's thread.)"""
        self.publish_syncs()
        return generate_latest(self.registry)

    SQS_COUNTED = frozenset(("ReceiveMessage", "DeleteMessage", "DeleteMessageBatch"))
    """The SQS actions besides the sends whose messages ``count_sqs`` counts."""

    def count_sqs(self, action: str, queue: str, answer: dict[str, Any]) -> None:
        """Count the messages an SQS action (one of ``SQS_COUNTED``) moved in ``queue``, given its
        answer (sends: ``count_sqs_sends``)."""
        if action == "ReceiveMessage":
            self.counted(self.messages_out, queue).inc(len(answer.get("Messages", ())))
        elif action == "DeleteMessage":
            self.counted(self.messages_deleted, queue).inc()
        elif action == "DeleteMessageBatch":
            self.counted(self.messages_deleted, queue).inc(len(answer.get("Successful", ())))

    def count_sqs_sends(self, queue: str, actions: Sequence[str], answers: Sequence[object]) -> None:
        """Count the messages that SendMessage and SendMessageBatch requests (``actions``) to
        ``queue`` stored, given their answers (an exception for one refused): once a batch, where
        an increment per request took the counter's lock each time (~1 µs)."""
        sent, answered = 0, False
        for action, answer in zip(actions, answers):
            if isinstance(answer, BaseException):
                continue
            answered = True  # a batch whose entries all failed still shows the queue, at 0
            if isinstance(answer, dict) and action == "SendMessageBatch":
                sent += len(answer.get("Successful", ()))
            else:  # a SendMessage's dict, or a plain one's whole answer
                sent += 1
        if answered:
            self.counted(self.messages_in, queue).inc(sent)

    @contextlib.contextmanager
    def waiting(self, queue: str) -> Iterator[None]:
        """Count a receive of ``queue`` in ``journalq_receives_waiting`` while it waits for a message."""
        gauge = self.counted(self.receives_waiting, queue)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def counted(self, counter: Counter | Gauge, queue: str) -> Any:
        """``counter.labels(queue)``, looked up once per queue (``labels`` takes a lock and checks
        its values: about a µs). The names come from requests that reached a queue (or its
        checks), as the counters' labels do themselves."""
        key = (id(counter), queue)
        child = self._counted.get(key)
        if child is None:
            child = self._counted[key] = counter.labels(queue)
        return child


class LatencyHistogram(Histogram):
    """A Histogram that also takes many observations at once (``observe_all``): one increment
    per bucket they fall in and one of the sum, where ``observe`` takes two per observation, each
    under the value's lock. It adds to the values that ``Histogram`` made and reads (its
    ``_upper_bounds``, ``_buckets`` and ``_sum``, in memory or in the multiprocess directory's
    files); a test checks that it exposes what as many ``observe`` calls would."""

    def observe_all(self, amounts: list[float]) -> None:
        self._raise_if_not_observable()
        bounds = self._upper_bounds
        counts = [0] * len(bounds)
        for amount in amounts:
            counts[bisect.bisect_left(bounds, amount)] += 1  # the first bucket with amount <= bound
        for bucket, count in zip(self._buckets, counts):
            if count:
                bucket.inc(count)
        self._sum.inc(sum(amounts))


class _ScrapeTime:
    """Read at each scrape: the queues' counts, and (one process) the syncs done."""

    def __init__(self, metrics: Metrics, syncs: bool) -> None:
        self.metrics = metrics
        self.syncs = syncs

    def collect(self) -> Iterator[Any]:
        if self.syncs:
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
                ("damaged", "1 when damage in the queue's journal stops its receives (journalq check says where)."),
            )
        }
        try:
            names = broker.names()
        except Exception:  # the queues cannot be listed (readyz says why): the rest of the scrape still counts
            names = []
        for name in names:
            try:
                found = queue_to_read(broker, name)
                if found is None:  # a topic of channels of its own: its depths are theirs, not a queue's
                    continue
                stats = found.stats()
            except Exception:  # a queue deleted meanwhile, or unreadable: leave it out of this scrape
                continue
            for field, family in families.items():
                if field == "damaged":
                    value: Any = stats.damage is not None
                else:
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


WORKER_DIRECTORY_PREFIX = "journalq-metrics-"
IN_USE = "in-use.lck"
"""A file of a workers' metrics directory that the server and its workers hold a shared lock on
while they run: a directory nobody holds it for was left by a server killed (SIGKILL) before it
could remove it. A lock, not a pid: right across PID namespaces that share the temporary
directory, and whatever pids are reused."""


@contextlib.contextmanager
def worker_metrics_directory() -> Iterator[Path]:
    """A fresh directory for the multiprocess mode of the worker processes about to be started,
    named in this process's environment (which they inherit); removed at exit, with the variable,
    and by the next server if this one is killed. A temporary directory: never one of an earlier
    run (its files would be counted again), and never in the data directory (a queue's name
    there)."""
    remove_abandoned_directories(Path(tempfile.gettempdir()))
    # Made under another name and named once it is held: another server removing abandoned
    # directories meanwhile cannot take it for one.
    making = Path(tempfile.mkdtemp(prefix="." + WORKER_DIRECTORY_PREFIX))
    in_use = hold(making)
    directory = making.with_name(making.name[1:])
    try:
        making.rename(directory)
        os.environ[MULTIPROCESS_DIRECTORY] = str(directory)
        yield directory
    finally:
        os.environ.pop(MULTIPROCESS_DIRECTORY, None)
        shutil.rmtree(directory if directory.exists() else making, ignore_errors=True)
        os.close(in_use)


def hold(directory: Path | str) -> int:
    """The descriptor of a shared lock on the directory's ``IN_USE`` file, held until closed
    (or until the process ends)."""
    fd = os.open(os.path.join(directory, IN_USE), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def remove_abandoned_directories(parent: Path) -> None:
    """Remove the workers' metrics directories in ``parent`` whose ``IN_USE`` lock nobody holds."""
    for directory in parent.glob(WORKER_DIRECTORY_PREFIX + "*"):
        try:
            fd = os.open(directory / IN_USE, os.O_RDWR)
        except OSError:
            continue  # not one of ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # in use
        else:
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            os.close(fd)


class WorkerSupervisor(Multiprocess):
    """Uvicorn's supervisor of ``--workers N``, which also tells prometheus_client of each worker
    gone (died and replaced, or retired by SIGHUP or SIGTTOU): its live gauges leave the sums; its
    counters and histograms stay. A replacement that got the dead worker's pid is not marked: it
    took over the files of that pid (prometheus_client reads the values they hold and goes on from
    them, so nothing counts twice)."""

    def __init__(self, config: Any, sockets: list[Any], metrics_directory: Path) -> None:
        super().__init__(config, sockets)
        self.metrics_directory = metrics_directory
        self.pids: set[int] = set()

    def keep_subprocess_alive(self) -> None:
        # Called on every round of the supervisor's loop, after the signals' handlers.
        super().keep_subprocess_alive()
        pids = {process.pid for process in self.processes if process.pid is not None}
        for pid in self.pids - pids:
            mark_process_dead(pid, str(self.metrics_directory))
        self.pids = pids
