"""The ZooKeeper store: zkmq's tree (see ``layout``) through kazoo, with the file-system store's
interface (``Broker``, ``Topic``, ``Queue``).

How it keeps its promises:

- A send writes in zkmq's order, one ZooKeeper transaction per step for a whole batch: the data,
  then the metadata, filters and state, then the queue entry. Consumers only look at queue
  entries, so a sender that dies between steps leaves nothing visible; the collector deletes what
  it left (``layout.collectable``).
- A claim is one transaction: the queue entry is rewritten at the version that was read (so two
  consumers can never both win it), the ephemeral ``claim`` lock is created, the state becomes
  ``claimed``, and the claimer's ``current`` node is checked (so that the lock and the
  registration that names its owner belong to one session). Another consumer's lock is replaced
  only when the entry, at the version read, says the visibility timeout ran out: a lock found
  where the liveness read said there was none belongs to a live session, and is never taken.
- A claim belongs to a session. A queue handle is a new consumer (a new ``consumer_id``) in each
  ZooKeeper session: its ``/consumers/<id>/current`` and its locks are ephemeral, so when its
  session ends, the tasks that it held are available at once, whatever their visibility timeout
  said, even if the same process reconnects; and the receipts of those deliveries are refused
  from then on (the delete or change checks the delivery's lock in its transaction), as a
  fenced-off holder's must be: another consumer may be working on the task already. A live
  consumer's claim whose visibility ran out is taken over by the next receive.
- Delivery is at least once: a task leaves the queue only when a receipt of its latest delivery
  deletes it (or it goes to the dead-letter queue).
- A deduplication id's record is created in the transaction of its first message's queue entry:
  of senders racing with one id, one stores (``ZooKeeperTopic.send_many``).
- Every call first reads the queue's node (``ZooKeeperTopic.check_present``): a queue deleted
  since it was opened, or made anew under its name, is not worked on, and settings changed by
  another process hold from the next call.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import AsyncResult, KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.serialization import Create, Delete
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from journalq.closing import Closing
from journalq.errors import (
    Error,
    InvalidMessageError,
    InvalidSettingError,
    PartialSendError,
    QueueError,
    QueueNotFoundError,
    ReceiptError,
    StaleReceiptError,
    StoreUnavailableError,
    TaskNotFoundError,
)
from journalq.journal.sync import SyncPolicy
from journalq.queue import envelope
from journalq.queue import filters as filtering
from journalq.queue.channel import (
    ChannelStats,
    IdDeletes,
    ReceivedMessage,
    Task,
    check_receipt_list,
    check_release_delay,
    check_visibility_changes,
    check_within,
    group_taken_error,
    log_dead_letters_kept,
    moving_on_after,
    past_limit,
    receive_arguments,
)
from journalq.queue.envelope import Envelope, dead_letter_source, resend
from journalq.queue.settings import (
    QueueSettings,
    check_dead_letter_kinds,
    check_for_queue,
    check_name,
    dead_letter_sources,
    open_dead_letter_queue,
)
from journalq.queue.topic import OutgoingMessage, Topic, message_list
from journalq.queue.workqueue import DEFAULT_CHANNEL, Queue
from journalq.queue.zookeeper.layout import (
    CLAIMED,
    CLIENT_LOG,
    DEAD,
    DedupRecord,
    FINISHED,
    INSERTED,
    Entry,
    KnownTasks,
    Paths,
    SentFacts,
    TaskFacts,
    TaskIds,
    check_session_timeout,
    check_task_id,
    collectable,
    dedup_collectable,
    group_guard,
    parse_receipt,
    parse_url,
    receipt,
    sent_at_ns,
)

MAX_BODY = 1_000_000
"""Bytes of one message body: ZooKeeper refuses packets over ``jute.maxbuffer`` (1 MiB)."""
_BATCH_BYTES = 256 * 1024  # bytes of operations per transaction when several changes share one
_PACKET = 0xFFFFF - 4096
"""Bytes of one transaction at most: ZooKeeper's packet limit (``jute.maxbuffer``: 1 MiB less
one byte by default; a larger packet makes the server drop the connection), less room for the
request's header."""
_BATCH_TASKS = 200  # tasks per transaction
ORPHAN_GRACE = 60.0
"""Seconds after which a task with no queue entry (its sender died mid-send) is collected."""
_GC_SETTINGS = ("task_gc_lifetime", "task_gc_interval")
_POLL = 1.0  # a long poll looks again at least this often (releases, sessions that end)
_RELIST = 1.0  # seconds a receive may reuse the listing of pending tasks (new ones sort after it)
_IDLE_LOOKS = 3
"""Looks at a node that a queue delete finds not empty, in a row, that neither delete anything nor
find new children under it, after which the delete fails (``ZooKeeperBroker._delete_tree``)."""
_UNAVAILABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError, KazooTimeoutError)

T = TypeVar("T")

log = logging.getLogger("journalq.queue.zookeeper")
log.addHandler(logging.NullHandler())  # for the application's logging only


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _own_metadata_size(env: Envelope, meta: bytes) -> int:
    """Bytes of ``meta`` (``env``'s metadata node) that count against ``MAX_BODY``: all but its
    deduplication id and source, which a move (a dead letter, a redrive) adds or replaces, so
    that every message the store took can be moved (each transaction's packet is checked all
    the same)."""
    if env.dedup_id is None and env.source is None:
        return len(meta)
    return len(envelope.encode_meta(dataclasses.replace(env, dedup_id=None, source=None), filters=False))


_LOST = {  # the first that the error is an instance of says it
    ConnectionClosedError: "is no longer connected (the broker was closed)",  # (kazoo's kind of SessionExpiredError)
    ConnectionLoss: "lost the connection",
    SessionExpiredError: "ended the session",
    OperationTimeoutError: "timed out an operation",
}


class _Limits(threading.local):
    """How long this thread's waits for the ensemble may last: set for the length of a call
    (``ZooKeeperBroker.call``), unset elsewhere (kazoo's own threads wait as kazoo does)."""

    limit: float | None = None  # seconds one wait (for the connection, for one answer) may last
    until: float | None = None  # a long poll's end (monotonic): its waits end with it


_limits = _Limits()
_POLL_GRACE = 1.0
"""Seconds a long poll's last wait may outlast the poll: a healthy ensemble answers in that time."""


def _wait_limit() -> float | None:
    """Seconds the thread's next wait for the ensemble may last (None: no bound)."""
    limit, until = _limits.limit, _limits.until
    if limit is None or until is None:
        return limit
    return min(limit, max(until - time.monotonic(), min(limit, _POLL_GRACE)))


class _BoundedResult(AsyncResult):
    """kazoo's result of a request, whose wait with no timeout (the one of every synchronous
    call, ``commit()`` included) lasts at most ``_wait_limit()``: kazoo keeps the requests made
    while it reconnects, and its synchronous calls wait for their answers without a bound, so
    a call made during an outage would block until the ensemble came back."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and timeout is None:
            timeout = _wait_limit()
        return super().get(block, timeout)


class _Handler(SequentialThreadingHandler):
    """kazoo's threading handler, whose results are ``_BoundedResult``."""

    def async_result(self) -> AsyncResult:
        return _BoundedResult(self)


def _translation(error: BaseException, hosts: str, doing: str, queue: str | None = None) -> Exception | None:
    """journalq's error for a kazoo error met while ``doing``, or None when it is not kazoo's:
    connection errors and waits that ran out (the caller cannot know whether a write was done),
    within ``queue``'s operations a node missing where one was expected (the queue was deleted
    meanwhile), and any other refusal by the ensemble."""
    if isinstance(error, KazooTimeoutError):
        within = "" if _limits.limit is None else f" within {_limits.limit:g}s"
        if _limits.until is not None:
            within += " or by the end of the long poll"
        return StoreUnavailableError(f"ZooKeeper at {hosts} did not answer{within} while {doing}")
    if isinstance(error, _UNAVAILABLE):
        what = next((text for kind, text in _LOST.items() if isinstance(error, kind)), type(error).__name__)
        return StoreUnavailableError(f"ZooKeeper at {hosts} {what} while {doing} ({type(error).__name__})")
    if isinstance(error, NoNodeError) and queue is not None:
        return QueueNotFoundError(f"queue {queue!r} was deleted (ZooKeeper at {hosts}, while {doing})")
    if isinstance(error, KazooException):  # (an ACL that refuses this client, say): never kazoo's own
        detail = f": {error}" if str(error) else ""
        return QueueError(f"ZooKeeper at {hosts} refused a request while {doing} ({type(error).__name__}{detail})")
    return None


def _failure(results: list[Any]) -> tuple[int, Exception] | None:
    """The operation of a transaction that failed (index, error), or None when it was done."""
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            return i, result
    return None


def _outcome(result: Any) -> Exception | None:
    """The error of a transaction sent with ``commit_async`` (the connection's, or that of the
    operation that failed), or None when it was done."""
    try:
        failed = _failure(result.get())
    except Exception as exc:  # kazoo raises the connection's errors from ``get``
        return exc
    return None if failed is None else failed[1]


def _as_translated(error: Exception, hosts: str, doing: str, queue: str) -> Exception:
    """``error`` as ``ZooKeeperBroker.call`` raises it."""
    translated = _translation(error, hosts, doing, queue)
    if translated is None:
        return error
    translated.__cause__ = error
    return translated


def _weight(t: Any) -> int:
    """Bytes a transaction's operations take in its packet, about: each its path, its data and
    64 for its header, ACL and flags (nothing is sent: a transaction goes out when committed)."""
    return sum(64 + len(op.path) + len(getattr(op, "data", None) or b"") for op in t.operations)


def _participant() -> str:
    """A name for a broker or a consumer that no other process takes: host, process, random."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _after_lost_races(lost: int) -> None:
    """Pause before trying again a change that lost ``lost`` races in a row to other writers of
    its nodes (each a version check that failed: the other made progress, so trying again is
    always right): not at first, then up to 2**lost ms at random, at most 0.1 s, so that writers
    in lockstep (a consumer's heartbeat and a purge, say) fall out of it."""
    if lost >= 2:
        time.sleep(random.uniform(0, min(0.1, 0.001 * 2**lost)))


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class _Live:
    """The consumers whose session is alive (their ``current`` exists): asked at once, known at
    the first question, so that the asking overlaps other reads. A consumer missing from the
    list given is asked about when it is named: it may have registered after the list was read,
    and claimed a task whose entry was read since (a consumer counted dead for that would lose
    its claim to the reader while it lives). ``me``: the asking consumer when it is registered
    in the client's current session (alive: it asks), else None."""

    def __init__(self, zk: KazooClient, paths: Paths, consumers: list[str], me: str | None) -> None:
        self._zk, self._paths = zk, paths
        self._checks = [(c, zk.exists_async(paths.consumer(c, "current"))) for c in consumers]
        self._me = me
        self._known: set[str] | None = None
        self._asked = {*consumers, *([me] if me is not None else [])}

    def __contains__(self, consumer: object) -> bool:
        if self._known is None:
            self._known = {c for c, check in self._checks if check.get() is not None}
            if self._me is not None:
                self._known.add(self._me)
        if isinstance(consumer, str) and consumer not in self._asked:
            # asked after the read of the entry that names it: ZooKeeper answers in order
            self._asked.add(consumer)
            if self._zk.exists(self._paths.consumer(consumer, "current")) is not None:
                self._known.add(consumer)
        return consumer in self._known


class _Planned(NamedTuple):
    """A claim that ``ZooKeeperQueue._claim`` plans: the task, its entry to write over the one
    read at ``version``, whether that one's visibility ran out, whether the claim replaces its
    holder's lock, and the reads of the task's data and metadata under way."""

    task: str
    new: Entry
    version: int
    expired: bool
    replace: bool
    data: AsyncResult
    meta: AsyncResult


@dataclass
class _Outgoing:
    task: str
    sent_ns: int
    envelope: Envelope
    metadata: bytes  # the ``metadata`` node's data
    dedup: tuple[str, int | None] | None = None
    """Its deduplication id's node, and the version of an expired record there to replace (None:
    there is none to replace); None without a deduplication id."""
    duplicate_of: str | None = None
    """The task of an earlier send with its deduplication id, found as its entry was written."""


def _dedup_record(read: Any, now_ms: int, window_ms: int) -> tuple[str | None, int | None]:
    """A deduplication id's record as ``read`` (a ``get_async`` of its node) found it: (the task
    of an earlier send that the id still holds, None), or (None, the version of a record whose
    window is over, or None when there is no record): what a send with the id then writes."""
    try:
        raw, stat = read.get()
    except NoNodeError:
        return None, None
    record = DedupRecord.decode(raw)
    if record is not None and record.holds(now_ms, window_ms):
        return record.task, None
    return None, stat.version


class ZooKeeperBroker(Closing):
    """Queues in a ZooKeeper ensemble: ``Broker("zk://host:port[,host:port]/path")``.

    ``session_timeout`` (seconds) is how soon the tasks of a consumer that died come back, and
    how long a call waits for the ensemble: for the connection when it is lost (kazoo reconnects
    meanwhile), and for each answer (a long poll's waits also end with the poll); when a wait runs
    out, the call raises ``StoreUnavailableError``. ``sync`` is accepted for the file store's
    signature; ZooKeeper acknowledges a write once a quorum has it on disk.

    ``producer_gc``: whether this broker's sends try the garbage collection of their queue every
    ``task_gc_interval``, as zkmq's producers do unless configured not to (True by default).
    False leaves it to the consumers (their receives try it in turn) and to ``gc()``: senders
    that should not spend a collection's round trips, or a producer's short-lived process.
    """

    def __init__(self, root: str, *, sync: str = "always", session_timeout: float = 10.0,
                 connect_timeout: float = 15.0, producer_gc: bool = True) -> None:
        self.root = root
        self.sync = str(SyncPolicy.parse(sync))
        self.hosts, self.path = parse_url(root)
        check_session_timeout(session_timeout)
        if not isinstance(producer_gc, bool):
            raise InvalidSettingError(f"producer_gc is True or False, not {producer_gc!r}")
        self.producer_gc = producer_gc
        self.limit = session_timeout
        self._connected = threading.Event()
        self._closed = False
        # kazoo's own retry of the connection backs off up to an hour: an ensemble back after a
        # long outage would wait that long for this broker. At most a second (a quarter of the
        # session, when shorter), so that the call after the ensemble's return finds it connected.
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=min(1.0, session_timeout / 4))
        self.client = KazooClient(hosts=self.hosts, timeout=session_timeout, logger=logging.getLogger(CLIENT_LOG),
                                  handler=_Handler(), connection_retry=retry)
        self.client.add_listener(self._on_state)
        self.participant = _participant()
        self.ids = TaskIds()
        self.known_tasks = KnownTasks()  # what the receives read of tasks that never changes
        self._topics: dict[str, ZooKeeperTopic] = {}
        self._queues: dict[str, ZooKeeperQueue] = {}
        self._lock = threading.RLock()
        self._collecting: dict[str, threading.Lock] = {}  # a queue's path -> ``ZooKeeperTopic._collecting``
        try:
            self.client.start(timeout=connect_timeout)
        except KazooTimeoutError:
            self.client.close()
            raise StoreUnavailableError(
                f"no ZooKeeper answered at {self.hosts} within {connect_timeout:g}s"
            ) from None
        try:
            with self.call(f"making the path {self.path}"):
                self.client.ensure_path(self.path)
        except BaseException:
            self.client.stop()  # not left with a session and kazoo's threads running
            self.client.close()
            raise

    def _on_state(self, state: str) -> None:
        """kazoo's listener (in its connection thread): whether calls may go out now."""
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()

    def wait_connected(self, doing: str) -> None:
        """Return once the client is connected; raise ``StoreUnavailableError`` when it is not
        within the thread's wait limit (requests made meanwhile would wait in kazoo's queue, to
        be sent, long after their caller gave up, once it reconnects)."""
        if self._closed or self._connected.is_set():
            return  # (closed: kazoo refuses at once)
        limit = _wait_limit()
        if not self._connected.wait(limit):
            raise StoreUnavailableError(
                f"ZooKeeper at {self.hosts} could not be reached within {limit or 0:.3g}s while {doing} "
                "(the broker goes on reconnecting)"
            )

    @contextmanager
    def call(self, doing: str, queue: str | None = None, *, until: float | None = None) -> Iterator[None]:
        """One call's dealings with the ensemble (``doing`` says what it does): once connected
        (``wait_connected``), each wait for an answer lasts at most ``limit`` seconds (and ends
        with a long poll's ``until``, a monotonic time), and kazoo's errors are raised as
        journalq's (``_translation``). A call within a call keeps the outer one's limits."""
        outer = _limits.limit is not None
        if not outer:
            _limits.limit, _limits.until = self.limit, until
        try:
            self.wait_connected(doing)
            yield
        except Exception as exc:
            translated = _translation(exc, self.hosts, doing, queue)
            if translated is None:
                raise
            raise translated from exc
        finally:
            if not outer:
                _limits.limit = _limits.until = None

    def paths(self, name: str) -> Paths:
        return Paths(self.path, check_name(name))

    # -- settings ---------------------------------------------------------------------------

    def _load(self, name: str) -> QueueSettings | None:
        """The settings of queue ``name`` (None when there is none), within a ``call``."""
        loaded = self._load_with_stat(name)
        return None if loaded is None else loaded[0]

    def _load_with_stat(self, name: str) -> tuple[QueueSettings, Any] | None:
        """The settings of queue ``name`` and the stat of its node as they were read (which
        queue of that name it is: ``czxid``; which change of its settings: ``version``), or
        None when there is no such queue; within a ``call``."""
        paths = self.paths(name)
        zk = self.client
        results = [zk.get_async(p) for p in (paths.dir, *(f"{paths.conf}/{s}" for s in _GC_SETTINGS))]
        try:
            (raw, stat), *gc = [r.get() for r in results]
        except NoNodeError:
            return None
        if not raw:
            return None  # being deleted
        try:
            data = json.loads(raw)
            for setting, (value, _) in zip(_GC_SETTINGS, gc):
                data[setting] = float(value)
            return QueueSettings.from_json(data), stat
        except (ValueError, TypeError) as exc:
            raise InvalidSettingError(f"cannot read the settings of {paths.dir} on {self.hosts}: {exc}") from None

    @staticmethod
    def _check(name: str, settings: QueueSettings) -> QueueSettings:
        """Settings this store can keep for queue ``name`` (the file store's check of what needs
        the name, and README's limits of the ZooKeeper store)."""
        check_for_queue(name, settings)
        if settings.retention_bytes is not None:
            raise InvalidSettingError("the ZooKeeper store has no retention by size: retention_bytes cannot be set")
        if settings.shards != 1:  # (it was kept, and meant nothing)
            raise InvalidSettingError("the ZooKeeper store has no shards: shards cannot be set")
        size = len(ZooKeeperBroker._settings_data(settings))  # (a larger packet: the connection dropped)
        if size > MAX_BODY:
            raise InvalidSettingError(
                f"settings of {size} bytes as JSON (enums, say) are over the ZooKeeper store's {MAX_BODY}"
            )
        return settings

    @staticmethod
    def _settings_data(settings: QueueSettings) -> bytes:
        data = {k: v for k, v in settings.to_json().items() if k not in _GC_SETTINGS}
        return json.dumps(data, sort_keys=True).encode()

    def _create(self, name: str, settings: QueueSettings) -> None:
        paths = self.paths(name)
        for _ in range(2):
            t = self.client.transaction()
            t.create(paths.dir, self._settings_data(settings))
            for node in (paths.queue, paths.tasks, paths.consumers, paths.conf):
                t.create(node, b"")
            for setting in _GC_SETTINGS:
                t.create(f"{paths.conf}/{setting}", repr(float(getattr(settings, setting))).encode())
            failed = _failure(t.commit())
            if failed is None or failed[0] != 0 or not isinstance(failed[1], NoNodeError):
                break
            self.client.ensure_path(self.path)  # the store's path was deleted under this broker
        if failed is not None and not isinstance(failed[1], NodeExistsError):
            raise failed[1]

    def _change(
        self, name: str, loaded: tuple[QueueSettings, Any], changes: dict[str, Any]
    ) -> tuple[QueueSettings, Any]:
        """Apply ``changes`` to the settings ``loaded`` (with their node's stat), at the version
        read: when another process changed them meanwhile (other settings, say), read them again
        and apply the changes to those, as often as that happens, so that neither change is lost.
        Returns them as stored."""
        lost = 0
        while True:
            _after_lost_races(lost)
            lost += 1
            updated = self._check(name, loaded[0].replace(**changes))
            if updated == loaded[0]:
                return loaded
            self._check_dead_letter_kinds(name, loaded[0], updated)
            try:
                self._save(name, updated, loaded[1].version)
            except BadVersionError:
                pass  # changed by another meanwhile
            again = self._load_with_stat(name)
            if again is None:
                raise QueueNotFoundError(f"no queue {name!r} in {self.root}")
            loaded = again

    def _check_dead_letter_kinds(self, name: str, before: QueueSettings | None, after: QueueSettings) -> None:
        check_dead_letter_kinds(name, before, after, self._load, self.dead_letter_sources)

    def dead_letter_sources(self, name: str) -> list[tuple[str, QueueSettings]]:
        """The queues (name and settings) whose dead-letter queue is ``name``, but ``name`` itself
        (as the file store's ``Broker.dead_letter_sources``)."""
        return dead_letter_sources(name, self.names(), self._load)

    def _save(self, name: str, settings: QueueSettings, version: int) -> None:
        """Write the settings if their node is still at ``version`` (else ``BadVersionError``)."""
        paths = self.paths(name)
        t = self.client.transaction()
        t.set_data(paths.dir, self._settings_data(settings), version)
        for setting in _GC_SETTINGS:
            t.set_data(f"{paths.conf}/{setting}", repr(float(getattr(settings, setting))).encode())
        failed = _failure(t.commit())
        if failed is not None:
            if isinstance(failed[1], NoNodeError):
                raise QueueNotFoundError(f"no queue {name!r} in {self.root}")
            raise failed[1]

    # -- the Broker interface -----------------------------------------------------------------

    def topic(self, name: str, *, create: bool = True, **settings: Any) -> ZooKeeperTopic:
        """The queue ``name`` seen as a topic (this store has one channel per topic: ``default``)."""
        check_name(name)
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None and topic.gone:  # deleted since it was opened: open what is there now
                self._topics.pop(name, None)
                self._queues.pop(name, None)
                topic = None
        if topic is not None and not settings:
            return topic  # known: no round trip, and no wait for the ensemble during an outage
        # A change of settings reads and writes them under the lock (one change at a time in this
        # process); a mere opening does not hold it while it waits for the ensemble, so that
        # openings during an outage fail side by side, each within its wait, not one after another.
        with self._lock if settings else nullcontext(), self.call(f"opening queue {name!r}"):
            loaded = self._load_with_stat(name)
            if loaded is None:
                if not create:
                    raise QueueNotFoundError(f"no queue or topic {name!r} in {self.root}")
                wanted = self._check(name, QueueSettings().replace(**settings))
                self._check_dead_letter_kinds(name, None, wanted)
                self._create(name, wanted)
                loaded = self._load_with_stat(name)
                if loaded is None:  # made by another meanwhile, but not whole: being deleted
                    raise QueueError(
                        f"queue {name!r} in {self.root} is being deleted, or a delete of it was cut short: "
                        "delete it (again) to use the name"
                    )
            if settings:  # (a queue made by another meanwhile: its settings stand, ours are a change)
                loaded = self._change(name, loaded, settings)
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None and (topic.gone or topic.created != loaded[1].czxid):
                self._topics.pop(name, None)  # (another thread found it deleted meanwhile)
                self._queues.pop(name, None)
                topic = None
            if topic is None:
                topic = self._topics[name] = ZooKeeperTopic(self, name, *loaded)
            else:
                topic.use_settings(*loaded)
            return topic

    def queue(self, name: str, *, create: bool = True, **settings: Any) -> ZooKeeperQueue:
        topic = self.topic(name, create=create, **settings)
        with self._lock:
            return topic.channel(DEFAULT_CHANNEL)

    def channel_names(self, name: str) -> list[str]:
        """The channels of queue ``name`` (``default``), as the file store's ``Broker.channel_names``."""
        return self.topic(name, create=False).channel_names()

    def queue_if_made(self, name: str) -> ZooKeeperQueue:
        """The file store's ``Broker.queue_if_made``: here every queue is one with the channel
        ``default`` (the store has no other), so ``queue(name, create=False)``."""
        return self.queue(name, create=False)

    def configure(self, name: str, **changes: Any) -> QueueSettings:
        return self.topic(name, create=False, **changes).settings

    def names(self) -> list[str]:
        zk = self.client
        with self.call("listing the queues"):
            try:
                children = sorted(zk.get_children(self.path))
            except NoNodeError:
                return []  # the store's path was deleted under this broker: made with a queue
            results = [(name, zk.get_async(f"{self.path}/{name}")) for name in children]
            names = []
            for name, result in results:
                try:
                    if result.get()[0]:
                        names.append(name)
                except NoNodeError:
                    continue
        return names

    def exists(self, name: str) -> bool:
        paths = self.paths(name)
        with self.call(f"looking for queue {name!r}"):
            try:
                return bool(self.client.get(paths.dir)[0])
            except NoNodeError:
                return False

    def delete(self, name: str) -> None:
        """Delete a queue and all its tasks; also finishes a delete that was cut short after its
        first step (its connection lost, its process killed): the queue's node emptied, which
        is no longer a queue (``exists``) but holds its name until it is gone."""
        paths = self.paths(name)
        with self.call(f"looking for queue {name!r}"):
            if self.client.exists(paths.dir) is None:
                raise QueueNotFoundError(f"no queue or topic {name!r} in {self.root}")
        with self.call(f"deleting queue {name!r}"):
            try:
                self.client.set(paths.dir, b"")  # no longer a queue, at once
            except NoNodeError:
                pass  # deleted meanwhile: what was opened of it goes all the same
            # Only now, the queue no longer being one: a delete that the ensemble refused or an
            # outage stopped before this change leaves the queue whole, and its handles working.
            opened = self._topics.get(name)
            self.forget(name)
            self.known_tasks.drop(paths.dir)
            if opened is not None:
                opened.gone = True  # what was got of it refuses to work (as it would find anyway)
            self._delete_tree(paths.dir, name)

    def _delete_tree(self, path: str, queue: str) -> int:
        """Delete ``path`` and everything under it, node by node (not atomic: a delete cut short
        is finished by the next); returns how many nodes it deleted. A node that gains children
        while its own are deleted (a send or a registration of queue ``queue`` in flight as the
        delete began: new calls find the queue emptied and stop) is looked at again, as long as
        the looks make progress: they delete something, or find children other than the last
        look's. After ``_IDLE_LOOKS`` looks in a row that make none, ``QueueError``."""
        zk, deleted, idle, last = self.client, 0, 0, None
        while True:
            try:
                children = zk.get_children(path)
            except NoNodeError:
                return deleted
            went = sum(self._delete_tree(f"{path}/{child}", queue) for child in children)
            deleted += went
            try:
                zk.delete(path)
                return deleted + 1
            except NoNodeError:
                return deleted  # (another delete of the queue took it)
            except NotEmptyError:
                idle = 0 if went or set(children) != last else idle + 1
                last = set(children)
                if idle >= _IDLE_LOOKS:
                    raise QueueError(
                        f"queue {queue!r} in {self.root} could not be deleted: {path} stayed not empty though "
                        f"{_IDLE_LOOKS} looks in a row found nothing new under it to delete (delete it again)"
                    ) from None

    def forget(self, name: str) -> None:
        with self._lock:
            topic = self._topics.pop(name, None)
            self._queues.pop(name, None)
        if topic is not None:
            topic.close()

    def reopen_failed(self) -> list[str]:
        """Nothing to reopen: kazoo reconnects by itself (the file store's writers may fail)."""
        return []

    def gc(self) -> dict[str, int]:
        """Collect every queue's finished tasks now; returns how many were deleted per queue."""
        counts = {}
        for name in self.names():
            try:
                counts[name] = len(self.topic(name, create=False).gc())
            except QueueNotFoundError:
                continue  # deleted since it was listed: not made again
        return counts

    def close(self) -> None:
        with self._lock:
            self._closed = True  # calls no longer wait for a connection: kazoo refuses them
            topics = list(self._topics.values())
            self._topics.clear()
            self._queues.clear()
        try:
            for topic in topics:
                topic.close()
        finally:
            self.client.stop()
            self.client.close()


class ZooKeeperTopic:
    """One zkmq directory: what producers send to. Its one channel is its ``ZooKeeperQueue``."""

    def __init__(self, broker: ZooKeeperBroker, name: str, settings: QueueSettings, stat: Any) -> None:
        self.broker = broker
        self.name = name
        self.settings = settings
        self.created = stat.czxid
        """Which queue of the name this is: its node's creation (a queue deleted and made again
        by another process is another queue)."""
        self._settings_version = stat.version
        self.gone = False
        """True once the queue is known deleted since it was opened here (``check_present``): it
        refuses to work, and its broker opens the name anew."""
        self.paths = broker.paths(name)
        self.failed = False
        self._queue: ZooKeeperQueue | None = None
        self._last_gc_try = time.monotonic()
        self._made: set[str] = set()  # nodes made as needed (``ensure_node``), known to exist
        with broker._lock:  # held by the thread of this broker (session) that collects the queue
            self._collecting = broker._collecting.setdefault(self.paths.dir, threading.Lock())

    @property
    def _zk(self) -> KazooClient:
        return self.broker.client

    def ensure_node(self, path: str) -> None:
        """Make the node ``path`` of the queue (``dedup``, ``conf/dead_letters``) unless it is
        known to exist: made with its first use, as queues made by earlier versions have none."""
        if path not in self._made:
            try:
                self._zk.create(path, b"")
            except NodeExistsError:
                pass
            self._made.add(path)

    def use_settings(self, settings: QueueSettings, stat: Any) -> None:
        """The settings as read with their node's ``stat`` (unless newer ones were taken up)."""
        if stat.czxid == self.created and stat.version >= self._settings_version:
            self.settings, self._settings_version = settings, stat.version

    def check_present(self) -> None:
        """Raise ``QueueNotFoundError`` when the queue was deleted since it was opened here (by
        any process; and maybe made again: another queue, whose tasks and consumers are not this
        object's to act on), and take up its settings when another process changed them: one
        read of the queue's node, at the start of every call (within its ``call``)."""
        if not self.gone:
            try:
                raw, stat = self._zk.get(self.paths.dir)
            except NoNodeError:
                raw, stat = b"", None
            if raw and stat is not None and stat.czxid == self.created:
                if stat.version != self._settings_version:
                    loaded = self.broker._load_with_stat(self.name)
                    if loaded is not None:
                        self.use_settings(*loaded)
                return
            self.gone = True
        raise QueueNotFoundError(f"queue {self.name!r} in {self.broker.root} was deleted after it was opened here")

    # -- sending ----------------------------------------------------------------------------

    def send(self, body: bytes, **options: Any) -> str:
        return self.send_many([{"body": body, **options}])[0]

    def send_many(self, items: Iterable[OutgoingMessage]) -> list[str]:
        """Write the batch in zkmq's order (data; metadata, filters and state; queue entries),
        one transaction per step and chunk; returns the task ids in the order given.

        A message is stored once its chunk's queue entries are: each chunk is all or nothing, a
        batch of several chunks is not. When some chunks are stored and others not,
        ``PartialSendError`` (a ``StoreUnavailableError`` too when the connection broke) says
        which messages are stored (``ids``, None for the others) and which to send again
        (``unsent``); a failure that stored nothing raises its own error."""
        items = message_list(items)
        envelopes, metas = self._prepare(items)  # bad input is refused before any call
        if not envelopes:
            return []
        doing = f"sending {len(envelopes)} message{'s' * (len(envelopes) != 1)} to {self.name!r}"
        with self.broker.call(doing, self.name):
            settings = self.settings
            self.check_present()  # (never written into a queue made anew under the name)
            if self.settings is not settings:  # changed by another process: its defaults hold
                envelopes, metas = self._prepare(items)
            # Collect first: a collection that fails then fails the send before anything is
            # stored (after the writes, it would make a stored send look failed: sent twice).
            if self.broker.producer_gc:
                self.maybe_collect()
            earlier, same_as, records = self._deduplicate(envelopes)
            fresh = [i for i in range(len(envelopes)) if i not in earlier and i not in same_as]
            ids = dict(zip(fresh, self.broker.ids.make(len(fresh))))
            outgoing = {i: _Outgoing(ids[i][0], ids[i][1], envelopes[i], metas[i], records.get(i)) for i in fresh}
            unstored, failure = self._write(self._chunked(list(outgoing.values())))
        sent: list[str | None] = []
        for i in range(len(envelopes)):
            item = outgoing.get(same_as.get(i, i))
            if item is None:
                sent.append(earlier[i])
            else:
                sent.append(None if item.task in unstored else item.duplicate_of or item.task)
        if failure is not None and None in sent:
            # Some chunks may be stored: their messages must not be sent again (nor are the
            # duplicates of earlier sends), only the others (``unsent``).
            cause = _as_translated(failure, self.broker.hosts, doing, self.name)
            partial = PartialSendError.after(sent, cause)
            if partial is None:
                raise cause
            raise partial from cause
        return [task for task in sent if task is not None]

    def _prepare(self, items: list[OutgoingMessage]) -> tuple[list[Envelope], list[bytes]]:
        """The envelopes of ``items`` and their metadata nodes' data, checked: the file store's
        checks and defaults (a bound method needs only ``self.settings``), and this store's."""
        envelopes = [Topic._envelope(self, item) for item in items]  # type: ignore[arg-type]
        for env in envelopes:
            if len(env.body) > MAX_BODY:
                raise InvalidMessageError(
                    f"a message body of {len(env.body)} bytes is over the ZooKeeper store's {MAX_BODY}"
                )
            for name in env.filters:
                check_name(name, "filter")  # it names a node: checked before anything is written
        # Metadata has a node of its own, under the same limit (a larger packet makes ZooKeeper
        # drop the connection: a refusal that would look like an outage, and be retried forever).
        metas = [envelope.encode_meta(env, filters=False) for env in envelopes]
        for env, meta in zip(envelopes, metas):
            size = _own_metadata_size(env, meta)
            if size > MAX_BODY:
                raise InvalidMessageError(
                    f"a message's metadata of {size} bytes is over the ZooKeeper store's {MAX_BODY}"
                )
            # The metadata step writes the metadata and a node per filter in one transaction, and
            # the queue entry holds the filters and group: each is one packet (measured with an
            # id of the length of those to come).
            _, *steps = self._weights(_Outgoing("0" * 24, 0, env, meta))
            for what, size in zip(("metadata and filters", "queue entry (filters and group)"), steps):
                if size > _PACKET:
                    raise InvalidMessageError(
                        f"a message's {what} take {size} bytes in one transaction, over the ZooKeeper store's {_PACKET}"
                    )
        return envelopes, metas

    def _chunked(self, outgoing: list[_Outgoing]) -> list[list[_Outgoing]]:
        """The send's transactions: up to ``_BATCH_TASKS`` tasks or ``_BATCH_BYTES`` bytes each
        (the nodes' paths count: many small filters weigh)."""
        chunks: list[list[_Outgoing]] = []
        size = 0
        for item in outgoing:
            weight = sum(self._weights(item))
            if not chunks or size + weight > _BATCH_BYTES or len(chunks[-1]) >= _BATCH_TASKS:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += weight
        return chunks

    def _deduplicate(
        self, envelopes: list[Envelope]
    ) -> tuple[dict[int, str], dict[int, int], dict[int, tuple[str, int | None]]]:
        """The duplicates of a batch, as the file store finds them: (index -> task of an earlier
        send with its deduplication id within the window), (index -> index of the first in the
        batch with its id), and for each first of an id, its record's node and the version of an
        expired record there (None: none). Read from the queue's ``dedup`` records, together."""
        wanted: dict[str, int] = {}  # id -> index of the first in the batch with it
        same_as: dict[int, int] = {}
        for i, env in enumerate(envelopes):
            if env.dedup_id is not None:
                if env.dedup_id in wanted:
                    same_as[i] = wanted[env.dedup_id]
                else:
                    wanted[env.dedup_id] = i
        if not wanted:
            return {}, same_as, {}
        zk, paths = self._zk, self.paths
        self.ensure_node(paths.dedup)
        nodes = {i: paths.dedup_record(dedup_id) for dedup_id, i in wanted.items()}
        reads = {i: zk.get_async(path) for i, path in nodes.items()}
        earlier: dict[int, str] = {}
        records: dict[int, tuple[str, int | None]] = {}
        now, window = _now_ms(), int(self.settings.dedup_window * 1000)
        for i, read in reads.items():
            holder, expired = _dedup_record(read, now, window)
            if holder is not None:
                earlier[i] = holder
            else:
                records[i] = (nodes[i], expired)  # none, or over: the send makes it anew
        for i, first in same_as.items():
            if first in earlier:
                earlier[i] = earlier[first]
        same_as = {i: first for i, first in same_as.items() if first not in earlier}
        return earlier, same_as, records

    def _write(self, chunks: list[list[_Outgoing]]) -> tuple[set[str], Exception | None]:
        """Write the chunks in zkmq's order; returns the tasks not stored and the first error
        met (None when every chunk is stored).

        The steps go out one after another without waiting: ZooKeeper applies a session's
        requests in order, and each step fails unless the one before it was applied (metadata
        needs the task's node; the entry checks the state node)."""
        pending = [step(chunk).commit_async() for step in (self._write_data, self._write_metadata) for chunk in chunks]
        entries = []
        for chunk in chunks:  # (each sent as soon as it is made, as the steps before)
            t = self._write_entries(chunk)
            entries.append((chunk, t, t.commit_async()))
        failures = [_outcome(result) for result in pending]  # every answer, even after a failure
        # A chunk's entries transaction succeeds only if its earlier steps did (it checks the
        # state node that the metadata step makes): its success is the chunk's.
        outcomes = [self._entries_outcome(chunk, t, result) for chunk, t, result in entries]
        unstored = {item.task for chunk, outcome in zip(chunks, outcomes) if outcome is not None for item in chunk}
        return unstored, next((error for error in [*failures, *outcomes] if error is not None), None)

    def _entries_outcome(self, chunk: list[_Outgoing], t: Any, result: Any) -> Exception | None:
        """The error of a chunk's entries transaction, or None once the chunk is stored: when
        it failed on a deduplication record that another sender made (or replaced) meanwhile,
        the records are read again and the entries of those that are no duplicates written, as
        often as that happens (each such failure is another writer's progress: ``_after_lost_races``)."""
        lost = 0
        while True:
            _after_lost_races(lost)
            lost += 1
            try:
                failed = _failure(result.get())
            except Exception as exc:  # kazoo raises the connection's errors from ``get``
                return exc
            if failed is None:
                return None
            index, error = failed
            operation = t.operations[index]
            # Lost to another writer of the record: it made one (the create), or replaced or
            # deleted the one read (the delete). A create's NoNodeError is no race: the records'
            # node is gone (the queue being deleted), and trying again would never end.
            raced = (isinstance(operation, Create) and isinstance(error, NodeExistsError)
                     or isinstance(operation, Delete) and isinstance(error, (NoNodeError, BadVersionError)))
            if not (raced and operation.path.startswith(self.paths.dedup + "/")):
                return error
            try:
                rest = self._settle_duplicates(chunk)
            except KazooException as exc:  # (the connection's): this chunk's, the others' stand
                return exc
            if not rest:
                return None
            t = self._write_entries(rest)
            result = t.commit_async()

    def _settle_duplicates(self, chunk: list[_Outgoing]) -> list[_Outgoing]:
        """Read the chunk's deduplication records again (another sender raced it with the same
        ids): mark as duplicates those whose id another send holds now, delete what they wrote
        (nobody can see it: it has no entry), and return the others, to write their entries."""
        zk, now, window = self._zk, _now_ms(), int(self.settings.dedup_window * 1000)
        reads = [(item, zk.get_async(item.dedup[0])) for item in chunk if item.dedup is not None]
        for item, read in reads:
            assert item.dedup is not None
            holder, expired = _dedup_record(read, now, window)
            if holder is not None:
                item.duplicate_of = holder
            else:
                item.dedup = (item.dedup[0], expired)
        duplicates = [item.task for item in chunk if item.duplicate_of is not None]
        if duplicates:
            try:
                self._delete_tasks(duplicates)
            except KazooException:
                pass  # what is left, the collector deletes (a task with no entry: ``collectable``)
        return [item for item in chunk if item.duplicate_of is None]

    def _write_data(self, chunk: list[_Outgoing]) -> Any:
        return self._step(self._add_data, chunk)

    def _write_metadata(self, chunk: list[_Outgoing]) -> Any:
        return self._step(self._add_metadata, chunk)

    def _write_entries(self, chunk: list[_Outgoing]) -> Any:
        return self._step(self._add_entries, chunk)

    def _step(self, add: Callable[[Any, list[_Outgoing]], None], chunk: list[_Outgoing]) -> Any:
        """A transaction of one step of a send (not sent yet: ``commit``)."""
        t = self._zk.transaction()
        add(t, chunk)
        return t

    def _weights(self, item: _Outgoing) -> list[int]:
        """What each step of a send (data; metadata and filters; queue entry) of ``item`` weighs."""
        return [_weight(self._step(add, [item])) for add in (self._add_data, self._add_metadata, self._add_entries)]

    def _add_data(self, t: Any, chunk: list[_Outgoing]) -> None:
        for item in chunk:
            t.create(self.paths.task(item.task), b"")
            t.create(self.paths.task(item.task, "data"), item.envelope.body)

    def _add_metadata(self, t: Any, chunk: list[_Outgoing]) -> None:
        for item in chunk:
            t.create(self.paths.task(item.task, "metadata"), item.metadata)
            t.create(self.paths.task(item.task, "filters"), b"")
            for name, value in item.envelope.filters.items():
                t.create(self.paths.task(item.task, f"filters/{name}"), value.encode())
            t.create(self.paths.task(item.task, "state"), INSERTED.encode())

    def _add_entries(self, t: Any, chunk: list[_Outgoing]) -> None:
        for item in chunk:
            env = item.envelope
            at = (item.sent_ns + int(env.delay * 1e9)) // 1_000_000
            t.check(self.paths.task(item.task, "state"), 0)  # the metadata step was applied
            t.create(self.paths.entry(item.task), Entry(at, 0, None, env.group_id, env.filters).encode())
            if item.dedup is not None:
                # The id's record goes with the entry: of two senders racing with one id, one
                # stores its message (the other's transaction fails on the record: a duplicate).
                record, expired = item.dedup
                if expired is not None:
                    t.delete(record, expired)
                t.create(record, DedupRecord(item.task, item.sent_ns // 1_000_000).encode())

    # -- channels ---------------------------------------------------------------------------

    def channel(self, name: str) -> ZooKeeperQueue:
        check_name(name, "channel")
        if name != DEFAULT_CHANNEL:
            raise QueueError(
                f"the ZooKeeper store has one channel per queue ({DEFAULT_CHANNEL!r}), not {name!r}"
            )
        if self._queue is None or self._queue.closed:  # (a closed one's long polls end at once)
            self._queue = ZooKeeperQueue(self)
            self.broker._queues[self.name] = self._queue
        return self._queue

    def channel_names(self) -> list[str]:
        return [DEFAULT_CHANNEL]

    # -- garbage collection -----------------------------------------------------------------

    def maybe_collect(self) -> None:
        """Every ``task_gc_interval``, try to collect (consumers call this, and producers unless
        their broker's ``producer_gc`` is off)."""
        now = time.monotonic()
        if now - self._last_gc_try >= self.settings.task_gc_interval:
            self._last_gc_try = now
            self.collect()

    def gc(self) -> list[str]:
        """Collect now, whenever the last collection was; returns the tasks deleted."""
        with self.broker.call(f"collecting the finished tasks of {self.name!r}", self.name):
            self.check_present()
            return self.collect(force=True) or []

    def collect(self, *, force: bool = False, orphan_grace: float = ORPHAN_GRACE) -> list[str] | None:
        """One collection under ``conf/lock``, if nobody else holds it and (unless ``force``) the
        last one, by anybody, is ``task_gc_interval`` ago; returns the tasks deleted, or None
        when it did not run. Times are the server's: the lock's taking is now."""
        lock = f"{self.paths.conf}/lock"
        if not self._collecting.acquire(blocking=False):
            return None  # another thread of this process collects now (in this session)
        try:
            lock_stat = self._take_gc_lock(lock)
            if lock_stat is None:
                return None
            return self._collect_under(lock, lock_stat.mtime, force, orphan_grace)
        finally:
            self._collecting.release()

    def _take_gc_lock(self, lock: str) -> Any:
        """Create the ephemeral ``lock`` and return its stat, or None when somebody else holds it
        (or the queue was deleted). A lock of this client's session is taken again: a create
        whose answer the connection lost, or a delete of it that failed, left it, and it would
        live as long as the session (no other thread holds it: ``_collecting``). Its ``mtime``
        is now by the server's clock."""
        zk, data = self._zk, self.broker.participant.encode()
        try:
            return zk.create(lock, data, ephemeral=True, include_data=True)[1]
        except NodeExistsError:
            pass
        except NoNodeError:
            return None  # the queue was deleted
        stat = zk.exists(lock)
        if stat is None or zk.client_id is None or stat.ephemeralOwner != zk.client_id[0]:
            return None  # somebody collects now (or just finished: the next interval's turn)
        try:
            return zk.set(lock, data, stat.version)
        except (NoNodeError, BadVersionError):
            return None

    def _collect_under(self, lock: str, now: int, force: bool, orphan_grace: float) -> list[str] | None:
        """``collect``'s work, under the lock taken at ``now`` (ms, the server's clock)."""
        zk, settings = self._zk, self.settings
        try:
            last = self.conf().get("collected_at")
            if not force and isinstance(last, int) and last > now - settings.task_gc_interval * 1000:
                return None
            self._update_conf(collected_at=now, collected_by=self.broker.participant)
            deleted = self._collect_tasks(now, int(settings.task_gc_lifetime * 1000), int(orphan_grace * 1000))
            self._expire_retention(now)
            self._collect_consumers()
            self._collect_dedup(now)
            return deleted
        finally:
            try:
                zk.delete(lock)
            except NoNodeError:
                pass

    def conf(self) -> dict[str, Any]:
        """``conf``'s record: when the last collection began (``collected_at``, ms by the
        server's clock) and by whom, and how many tasks went to the dead-letter queue (``dead``)
        before ``conf/dead_letters`` counted them."""
        try:
            data = json.loads(self._zk.get(self.paths.conf)[0] or b"{}")
        except ValueError:
            return {}  # damaged: the next collection writes it anew
        return data if isinstance(data, dict) else {}

    def _update_conf(self, **fields: Any) -> None:
        """Change ``conf``'s record at the version read (again when another changed it)."""
        zk = self._zk
        while True:
            raw, stat = zk.get(self.paths.conf)
            try:
                data = json.loads(raw or b"{}")
            except ValueError:
                data = {}
            if not isinstance(data, dict):
                data = {}
            data.update(fields)
            try:
                zk.set(self.paths.conf, json.dumps(data, sort_keys=True).encode(), stat.version)
                return
            except BadVersionError:
                continue

    def _collect_tasks(self, now: int, lifetime: int, grace: int) -> list[str]:
        """Delete the tasks that ``layout.collectable`` lets go, a thousand at a time."""
        zk, paths = self._zk, self.paths
        deleted = []
        for chunk in _chunks(zk.get_children(paths.tasks), 1000):
            reads = [
                (task, zk.exists_async(paths.task(task)), zk.get_async(paths.task(task, "state")),
                 zk.exists_async(paths.entry(task)))
                for task in chunk
            ]
            doomed, unqueued = [], set()
            for task, node, state, entry in reads:
                task_stat = node.get()
                if task_stat is None:
                    continue
                try:
                    raw, state_stat = state.get()
                    value, changed = raw.decode(errors="replace"), state_stat.mtime
                except NoNodeError:
                    value, changed = None, task_stat.ctime
                facts = TaskFacts(task_stat.ctime, value, changed, entry.get() is not None)
                if collectable(facts, now, lifetime, grace):
                    doomed.append(task)
                    if value not in (FINISHED, DEAD):
                        unqueued.add(task)
            deleted += self._delete_tasks(doomed, unqueued=unqueued)
        return deleted

    def _delete_tasks(self, tasks: list[str], *, unqueued: Container[str] = ()) -> list[str]:
        """Delete tasks with everything under them, each in one transaction (so that a task is
        either whole or gone); returns those deleted. The transaction of a task in ``unqueued``
        (a send's leftovers: no queue entry when read) fails should its entry exist now: a late
        last step of its send (its requests held up by an outage) may have made it since."""
        zk, paths = self._zk, self.paths
        children = [(task, zk.get_children_async(paths.task(task))) for task in tasks]
        listed = []
        for task, result in children:
            try:
                names = result.get()
            except NoNodeError:
                continue
            filters = zk.get_children_async(paths.task(task, "filters")) if "filters" in names else None
            listed.append((task, names, filters))
        commits = []
        for task, names, filters in listed:
            t = zk.transaction()
            try:
                for name in filters.get() if filters is not None else []:
                    t.delete(paths.task(task, f"filters/{name}"))
            except NoNodeError:
                pass
            for name in names:
                t.delete(paths.task(task, name))
            t.delete(paths.task(task))
            if task in unqueued:  # (a transaction cannot check that a node is missing: it makes it)
                t.create(paths.entry(task), b"")
                t.delete(paths.entry(task))
            commits.append((task, t.commit_async()))
        return [task for task, result in commits if _failure(result.get()) is None]

    def _expire_retention(self, now: int) -> None:
        """Finish pending tasks older than ``retention_seconds`` (then collected as finished)."""
        retention = self.settings.retention_seconds
        if retention is None:
            return
        horizon_ns = (now - int(retention * 1000)) * 1_000_000
        old = [task for task in self._zk.get_children(self.paths.queue) if sent_at_ns(task) < horizon_ns]
        if old:
            self.channel(DEFAULT_CHANNEL).finish_ids(old, FINISHED)

    def _collect_consumers(self) -> None:
        """Delete the nodes of consumers whose session is over (no ``current``)."""
        zk, paths = self._zk, self.paths
        checks = [(c, zk.exists_async(paths.consumer(c, "current"))) for c in zk.get_children(paths.consumers)]
        for consumer, check in checks:
            if check.get() is None:
                try:
                    zk.delete(paths.consumer(consumer))
                except (NoNodeError, NotEmptyError):
                    pass  # gone already, or it came back meanwhile

    def _collect_dedup(self, now: int) -> None:
        """Delete the deduplication records whose window is over (``layout.dedup_collectable``),
        each at the version read: one replaced meanwhile by a new send stays."""
        zk, paths = self._zk, self.paths
        try:
            names = zk.get_children(paths.dedup)
        except NoNodeError:
            return  # no deduplicated send yet
        window = int(self.settings.dedup_window * 1000)
        for chunk in _chunks(names, 1000):
            checks = [(f"{paths.dedup}/{name}", zk.exists_async(f"{paths.dedup}/{name}")) for name in chunk]
            doomed = [zk.delete_async(path, stat.version) for path, stat in ((p, c.get()) for p, c in checks)
                      if stat is not None and dedup_collectable(stat.ctime, now, window)]
            for result in doomed:
                try:
                    result.get()
                except (NoNodeError, BadVersionError):
                    pass  # deleted or made anew meanwhile

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()
            self._queue = None


class ZooKeeperQueue:
    """A zkmq queue with the file store's ``Queue`` interface (receive, delete, visibility,
    release, task states, consumers, stats, purge, dead letters, redrive)."""

    def __init__(self, topic: ZooKeeperTopic) -> None:
        self.topic = topic
        self.name = DEFAULT_CHANNEL
        self.paths = topic.paths
        # The consumer of this handle's current session (a new one in each session: see _register).
        self.consumer_id = _participant()
        self._session: int | None = None  # the session consumer_id registered in
        self._registrations = 0
        self._naming = threading.Lock()  # held while ``_register`` names the consumer of a session
        self._name_for: tuple[int | None, str] | None = None  # (session, the consumer's name in it)
        self._known: dict[str, tuple[Entry, int]] = {}  # task -> (entry, version) this handle wrote
        self._listing: list[str] = []  # the pending tasks, sorted, as last listed
        self._listed_at: float | None = None
        self._gone: set[str] = set()  # tasks of the listing known to be no longer pending
        self._retry_dead_letters_at = 0.0  # (monotonic) after the dead-letter queue refused its letters
        self._changed = threading.Event()
        self._closed = False

    @property
    def settings(self) -> QueueSettings:
        return self.topic.settings

    @property
    def closed(self) -> bool:
        """Closed (``close``): its broker gives a new handle of the queue from then on."""
        return self._closed

    @property
    def _zk(self) -> KazooClient:
        return self.topic.broker.client

    @contextmanager
    def _call(self, doing: str, *, check: bool = True) -> Iterator[None]:
        """``ZooKeeperBroker.call`` for this queue (``doing`` is followed by its name), which
        first checks that the queue is still the one opened (``check_present``) unless not
        ``check``."""
        with self.topic.broker.call(f"{doing} {self.topic.name!r}", self.topic.name):
            if check:
                self.topic.check_present()
            yield

    # -- what the file store's Queue has -----------------------------------------------------

    def send(self, body: bytes, **options: Any) -> str:
        return self.topic.send(body, **options)

    def send_many(self, items: Any) -> list[str]:
        return self.topic.send_many(items)

    configure = Queue.configure
    redrive = Queue.redrive

    # -- consumers --------------------------------------------------------------------------

    def _client_session(self) -> int | None:
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    def _registered(self) -> bool:
        """Whether ``consumer_id`` is registered in the client's current session."""
        return self._session is not None and self._session == self._client_session()

    def _register(self) -> bool:
        """Make ``/consumers/<id>/current`` (ephemeral) for this session, once per session. In a
        session after the first, under a new ``consumer_id``: the claims of the one before
        ended with its session (others may hold those tasks now), and would look held again if
        their owner's name came back to life.

        False, and no consumer left registered, once the handle is closed: a closed handle
        never registers (a receive in another thread may get here as it closes)."""
        if self._closed:
            return False
        session = self._client_session()
        if session is not None and session == self._session:
            return True
        # The threads that register in one session take one name (no I/O under the lock: a wait
        # for the ensemble there would add to each other thread's); made anew for a new session.
        with self._naming:
            if self._name_for is None or self._name_for[0] != session:
                self._name_for = (session, _participant() if self._registrations else self.consumer_id)
            consumer = self._name_for[1]
        zk, paths = self._zk, self.paths
        node, current = paths.consumer(consumer), paths.consumer(consumer, "current")
        for _ in range(3):
            t = zk.transaction()
            t.create(node, b"")
            t.create(current, b"[]", ephemeral=True)
            failed = _failure(t.commit())
            if failed is None:
                break
            if failed[0] != 0 or not isinstance(failed[1], NodeExistsError):
                raise failed[1]
            try:  # the node is there already (a registration whose answer was lost, say)
                zk.create(current, b"[]", ephemeral=True)
                break
            except NodeExistsError:
                break
            except NoNodeError:
                continue  # the collector deleted that node just now (it had no "current"): again
        else:
            raise QueueError(f"consumer {consumer} of {self.topic.name!r} could not register: its node kept going")
        self.consumer_id, self._session = consumer, session
        self._registrations += 1
        if self._closed:  # closed meanwhile: its close may have found nothing registered to undo
            self._unregister()
            return False
        return True

    def _unregister(self) -> None:
        """Delete the registration of ``consumer_id`` (its ``current``, then its node), if it is
        still there (the handle is then registered in no session)."""
        t = self._zk.transaction()
        t.delete(self.paths.consumer(self.consumer_id, "current"))
        t.delete(self.paths.consumer(self.consumer_id))
        t.commit()  # (failed, and changed nothing, when a close or the collector deleted them)
        self._session = None

    def _live(self, consumers: list[str] | None = None) -> _Live:
        """The consumers whose session is alive (this one among them once it registered in the
        client's current session)."""
        if consumers is None:
            consumers = self._zk.get_children(self.paths.consumers)
        return _Live(self._zk, self.paths, consumers, self.consumer_id if self._registered() else None)

    def consumers(self) -> dict[str, list[str]]:
        """Live consumers and the ids of the tasks each holds hidden now."""
        with self._call("listing the consumers of"):
            now, live = _now_ms(), self._live()
            held: dict[str, list[str]] = {}
            for task, entry, _ in self._entries(sorted(self._zk.get_children(self.paths.queue))):
                if entry.held(now, live):
                    assert entry.by is not None
                    held.setdefault(entry.by, []).append(task)
            return held

    def _pending(self, relist: bool, watch: bool) -> tuple[list[str], bool]:
        """The pending tasks, oldest first, and whether they were listed just now. Listing a
        queue of thousands costs more than the rest of a receive, so a listing serves for
        ``_RELIST`` seconds (new tasks sort after it) unless ``relist``; ``watch`` also sets a
        watch that wakes a long poll when tasks come or go."""
        now = time.monotonic()
        if relist or watch or self._listed_at is None or now - self._listed_at > _RELIST:
            self._gone.clear()
            self._listing = sorted(self._zk.get_children(self.paths.queue, watch=self._on_change if watch else None))
            self._listed_at = now
            self.topic.broker.known_tasks.retain(self._incarnation, self._listing)
            return self._listing, True
        if self._gone:
            gone, self._gone = self._gone, set()
            self._listing = [task for task in self._listing if task not in gone]
        return self._listing, False

    @property
    def _incarnation(self) -> tuple[str, int]:
        """Which queue this is, for the broker's ``known_tasks``: a queue made again under the
        name is another."""
        return self.paths.dir, self.topic.created

    def _went(self, task: str) -> None:
        """``task`` is no longer pending (ended, or found gone): out of the listing and of what
        the broker knows of the queue's tasks."""
        self._gone.add(task)
        self.topic.broker.known_tasks.forget(self._incarnation, task)

    def _entries(self, tasks: list[str], first: int = 512) -> Iterator[tuple[str, Entry, int]]:
        """(task, entry, version) of each task still pending, read together: ``first`` at first,
        then twice as many each time (a receive of a few reads a few)."""
        for task, _, read in self._look(tasks, first, lambda task: None):
            assert read is not None
            yield task, *read

    def _look(
        self, tasks: list[str], first: int, settled: Callable[[str], SentFacts | None]
    ) -> Iterator[tuple[str, SentFacts, tuple[Entry, int] | None]]:
        """(task, its facts, (entry, version) as read) of each task still pending, read together
        as ``_entries`` says, but for those whose facts ``settled`` gives (asked as the reads of
        their chunk go out): their entry is not read (None), as they settle what the caller
        does with the task. The facts of each entry read are kept in the broker's
        ``known_tasks``, for ``settled`` to find in later calls."""
        zk, size, start = self._zk, first, 0
        known, queue, now = self.topic.broker.known_tasks, self._incarnation, _now_ms()
        while start < len(tasks):
            chunk = tasks[start : start + size]
            start += size
            size = min(size * 2, 1024)
            looks = [(task, settled(task)) for task in chunk]
            reads = [(task, facts, zk.get_async(self.paths.entry(task)) if facts is None else None)
                     for task, facts in looks]
            for task, facts, result in reads:
                if result is None:
                    assert facts is not None
                    yield task, facts, None
                    continue
                try:
                    raw, stat = result.get()
                except NoNodeError:
                    self._went(task)
                    continue
                entry = Entry.decode(raw)
                facts = SentFacts.of(entry, stat.version, now)
                known.add(queue, task, facts)
                yield task, facts, (entry, stat.version)

    def _on_change(self, event: Any) -> None:
        self._changed.set()

    # -- receiving --------------------------------------------------------------------------

    def receive(
        self,
        max_messages: int = 1,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        filters: filtering.ConsumerFilters | None = None,
        delete: Sequence[str] = (),
        one_per_group: bool = False,
    ) -> list[ReceivedMessage]:
        """As ``Channel.receive``: oldest first (by the senders' clocks), each hidden for
        ``visibility_timeout`` seconds; ``wait`` is long polling (woken by new tasks). Of a FIFO
        group none of whose tasks is held, its tasks in order up to the first that cannot go
        (``one_per_group``: its first alone), claimed in one transaction: all of them or none.
        ``delete``: receipts deleted first, as ``delete_many`` does; if one of them is refused,
        ``ReceiptError`` and nothing is received, but unlike on files the others stay deleted
        (each is its own change in ZooKeeper)."""
        arguments = (max_messages, visibility_timeout, wait, filters, delete)
        hide, wait, wanted = receive_arguments(self.settings, *arguments)
        if delete:
            refused = next((error for error in self.delete_many(list(delete)) if error is not None), None)
            if refused is not None:
                raise ReceiptError(f"nothing received: {refused}")
        start = time.monotonic()
        deadline = start + wait
        broker, doing = self.topic.broker, f"receiving from {self.topic.name!r}"
        # a long poll's waits for the ensemble end with it: an outage ends it with the error
        with broker.call(doing, self.topic.name, until=deadline if wait > 0 else None):
            first = True
            while True:
                broker.wait_connected(doing)  # (the connection may have gone while the poll slept)
                settings = self.settings
                self.topic.check_present()  # (deleted, or its settings changed elsewhere)
                if first and self.settings is not settings:  # the defaults of the settings of now
                    hide, wait, wanted = receive_arguments(self.settings, *arguments)
                    deadline = start + wait
                first = False
                self._changed.clear()
                got, wake_at = self._receive_now(max_messages, int(hide * 1000), wanted, watch=wait > 0,
                                                 one_per_group=one_per_group)
                remaining = deadline - time.monotonic()
                if got or remaining <= 0 or self._closed:
                    return got
                if wake_at is not None:
                    remaining = min(remaining, max(0.0, (wake_at - _now_ms()) / 1000))
                self._changed.wait(min(remaining, _POLL))

    def _receive_now(
        self, max_messages: int, hide_ms: int, wanted: dict[str, tuple[str, filtering.Method]] | None, *, watch: bool,
        one_per_group: bool = False,
    ) -> tuple[list[ReceivedMessage], int | None]:
        self.topic.maybe_collect()
        received: list[ReceivedMessage] = []
        relist = False
        for _ in range(5):
            got, wake_at, raced, fresh = self._claim_some(
                max_messages - len(received), hide_ms, wanted, watch, relist, {m.id for m in received}, one_per_group
            )
            received += got
            if len(received) == max_messages or (fresh and (got or not raced)):
                break
            relist = True  # too few in an older listing (nothing claimed), or others won every race: look again
        return received, wake_at

    def _claim_some(
        self, max_messages: int, hide_ms: int, wanted: dict[str, tuple[str, filtering.Method]] | None,
        watch: bool, relist: bool, taken: set[str], one_per_group: bool = False,
    ) -> tuple[list[ReceivedMessage], int | None, bool, bool]:
        """One look (past the tasks this receive has ``taken``): returns what was received, when
        something hidden comes back, whether other consumers won every claim tried, and whether
        the listing was fresh."""
        zk, paths, settings = self._zk, self.paths, self.settings
        max_count = moving_on_after(settings)
        if not self._register():  # (again after a claim found this consumer's session over)
            return [], None, False, True  # closed: receives nothing
        consumers = zk.get_children_async(paths.consumers)
        names, fresh = self._pending(relist, watch)
        now = _now_ms()
        live = self._live(consumers.get())
        known = self.topic.broker.known_tasks.facts(self._incarnation)
        # Groups whose next task cannot go (held, delayed, not for this consumer, or taken by
        # this receive already): nothing more of them in a look.
        blocked: set[str] = set()

        def settled(task: str) -> SentFacts | None:
            """The facts of a task whose entry this look need not read: in a blocked group, or of
            no group and not for this consumer or delayed still (its entry is as sent). One of a
            group is read: it holds its group back only while it is there (an older listing may
            name one finished since)."""
            facts = known.get(task)
            if facts is None:
                return None
            if facts.group is None:
                skipped = facts.delayed(now) or not filtering.matches(facts.filters, wanted, settings.enums)
                return facts if skipped else None
            return facts if facts.group in blocked else None

        # Groups held by a later task that an earlier look's picks named (``_group_holds``), and
        # when the first of those comes back.
        held: set[str | None] = set()
        held_wake: int | None = None
        while True:
            picks: list[tuple[str, Entry, int]] = []
            dead: list[tuple[str, Entry, int]] = []
            blocked = {group for group in held if group is not None}
            wake_at: int | None = held_wake
            for task, facts, read in self._look(names, max(8, 2 * max_messages), settled):
                group = facts.group
                if group is not None and group in blocked:
                    continue
                if task in taken:
                    pass  # received by this call already (a visibility of 0 makes it available again)
                elif not filtering.matches(facts.filters, wanted, settings.enums):
                    pass  # (whatever its state: its filters never change)
                else:
                    entry, version = read if read is not None else (facts.unclaimed_entry(), 0)  # (delayed)
                    if not entry.available(now, live):
                        wake_at = entry.at if wake_at is None else min(wake_at, entry.at)
                        if group is not None and entry.holds_group(now, live):
                            # Held while earlier tasks of its group are not: its batch's first ones
                            # given back. Those picked here wait with it (``Entry.then``). (One
                            # delayed still only stops its group here.)
                            picks = [pick for pick in picks if pick[1].group != group]
                    elif max_count is not None and entry.count >= max_count:
                        if time.monotonic() >= self._retry_dead_letters_at:
                            dead.append((task, entry, version))
                            continue
                        # (else the dead-letter queue failed lately: it stays first in its group, undelivered)
                    else:
                        picks.append((task, entry, version))
                        if len(picks) >= max_messages:
                            break
                        if not one_per_group:
                            continue  # the group's next tasks may follow it in this receive
                if group is not None:
                    blocked.add(group)
                if len(picks) >= max_messages:
                    break
            if not fresh and len(picks) < max_messages and not one_per_group and any(p[1].group for p in picks):
                # Too few in an older listing, of a group: the caller lists again and looks anew
                # before this receive claims anything (a group claimed in one look, its next tasks in
                # another, would be two claims: the first's entry would not name the others,
                # ``Entry.then``).
                return [], wake_at, False, False
            found, checks, later_wake = self._group_holds([*dead, *picks], now, live)
            if later_wake is not None:
                held_wake = later_wake if held_wake is None else min(held_wake, later_wake)
                wake_at = later_wake if wake_at is None else min(wake_at, later_wake)
            cut_short = len(picks) >= max_messages
            if found:  # (a first task past its receives waits with its group too: not moved yet)
                dead = [one for one in dead if one[1].group not in found]
                picks = [pick for pick in picks if pick[1].group not in found]
            if cut_short and len(picks) < max_messages and not found <= held:
                # The look stopped at picks that wait for their groups (a batch's first tasks
                # given back, a later one held): look again past those groups, for what comes
                # after them, as a receive on files takes it.
                held |= found
                continue
            break
        if dead:  # moved first (as on files): a move that fails then holds back none of the picks
            moving = self._claim([(t, e, v, e.count, 30_000) for t, e, v in dead], now, live, record=False, moving=True,
                                 checks=checks)
            if not self._send_dead(moving):
                # Kept here: what their groups have after them waits for them, as above.
                kept = {entry.group for _, entry, _, _, _ in moving if entry.group is not None}
                picks = [pick for pick in picks if pick[1].group not in kept]
        won = self._claim([(t, e, v, e.count + 1, hide_ms) for t, e, v in picks], now, live, checks=checks)
        received = []
        for task, entry, count, body, meta in won:
            env = envelope.decode_meta(body, meta) or Envelope(body)
            received.append(ReceivedMessage(
                id=task, receipt=receipt(task, count), body=body, attributes=env.attributes,
                receive_count=count, sent_at_ns=sent_at_ns(task), offset=-1, group_id=entry.group,
                dedup_id=env.dedup_id, filters=entry.filters, metadata=env.metadata, source=env.source,
            ))
        return received, wake_at, bool(picks) and not received, fresh

    def _group_holds(
        self, picks: list[tuple[str, Entry, int]], now: int, live: _Live
    ) -> tuple[set[str | None], dict[str, list[tuple[str, int]]], int | None]:
        """The FIFO groups of a look's picks that may not go: those whose picks name later
        tasks claimed with them (``Entry.then``) that are held still. Also, by group, the
        (entry path, version) of those later tasks read, for the claim to check unchanged (a
        holder that extends one meanwhile fails the claim), and when the first held comes
        back."""
        picked = {task for task, _, _ in picks}
        later = {task: pick[1].group for pick in picks for task in pick[1].then if task not in picked}
        if not later:
            return set(), {}, None
        reads = {task: self._zk.get_async(self.paths.entry(task)) for task in later}
        held: set[str | None] = set()
        checks: dict[str, list[tuple[str, int]]] = {}
        wake_at: int | None = None
        for task, read in reads.items():
            group = later[task]
            try:
                raw, stat = read.get()
            except NoNodeError:
                continue  # finished since: holds nothing
            entry = Entry.decode(raw)
            if entry.holds_group(now, live):
                held.add(group)
                wake_at = entry.at if wake_at is None else min(wake_at, entry.at)
            elif group is not None:
                checks.setdefault(group, []).append((self.paths.entry(task), stat.version))
        return held, checks, wake_at

    def _batches(self, changes: list[Callable[[Any], Any]]) -> Iterator[list[Callable[[Any], Any]]]:
        """The changes in groups of up to a hundred and ``_BATCH_BYTES`` (a queue entry holds its
        filters: a hundred large ones in one transaction would be over ZooKeeper's packet limit,
        which drops the connection)."""
        batch: list[Callable[[Any], Any]] = []
        size = 0
        for add in changes:
            probe = self._zk.transaction()  # (nothing is sent: it only measures the operations)
            add(probe)
            weight = _weight(probe)
            if batch and (len(batch) >= 100 or size + weight > _BATCH_BYTES):
                yield batch
                batch, size = [], 0
            batch.append(add)
            size += weight
        if batch:
            yield batch

    def _commit_each(self, changes: list[Callable[[Any], Any]]) -> list[list[Any]]:
        """Commit changes (each adds its operations to a transaction): together, in one
        transaction per hundred (one write for the server: the common case) or per
        ``_BATCH_BYTES``, and when one of them fails, each in its own; returns the results of
        each change's operations."""
        zk = self._zk
        out: list[list[Any]] = []
        for chunk in self._batches(changes):
            if len(chunk) > 1:
                t = zk.transaction()
                spans = []
                for add in chunk:
                    start = len(t.operations)
                    add(t)
                    spans.append((start, len(t.operations)))
                results = t.commit()
                if _failure(results) is None:
                    out += [results[a:b] for a, b in spans]
                    continue
            pending = []
            for add in chunk:
                t = zk.transaction()
                add(t)
                pending.append(t.commit_async())
            out += [result.get() for result in pending]
        return out

    def _claim(
        self, wanted: list[tuple[str, Entry, int, int, int]], now: int, live: _Live, *, record: bool = True,
        moving: bool = False, checks: Mapping[str, list[tuple[str, int]]] | None = None,
    ) -> list[tuple[str, Entry, int, bytes, bytes]]:
        """Claim (task, entry, version, count, hide_ms) each, with the task's data and metadata
        read meanwhile; returns (task, new entry, count, data, metadata) of those won.
        ``record``: write the tasks won in this consumer's ``current``. ``moving``: claims of a
        dead-letter mover (``Entry.moving``). ``checks``: by FIFO group, entries (path, version)
        that its claims must find unchanged (``_group_holds``).

        The tasks of one FIFO group are claimed in one transaction, all of them or none (a group
        is with one consumer); when that fails, its first alone, as any other task is claimed.

        The lock of the entry's holder is replaced (deleted in the claim's transaction) only when
        the entry says that its visibility ran out (``at`` <= ``now``): an entry that the claim's
        version check proves unchanged, so the holder cannot have been given more time meanwhile.
        That is planned when the holder looked alive (its lock should be there), and done after
        a claim found a lock where none was expected. A lock found under an entry still hidden
        is never taken: locks end with their session, so its holder lives (it was taken for dead
        wrongly) and keeps the task."""
        zk, paths = self._zk, self.paths
        me = self.consumer_id  # (one name throughout, should another thread register anew)
        current = paths.consumer(me, "current")
        checks = checks or {}

        def operations(replace: bool) -> int:
            """How many operations ``claim`` adds: its entry's write first, this consumer's session
            check last (the retry and the session's end below read their places)."""
            return 5 if replace else 4

        def claim(task: str, new: Entry, version: int, replace: bool) -> Callable[[Any], None]:
            def add(t: Any) -> None:
                t.set_data(paths.entry(task), new.encode(), version)  # (first: its result holds the version)
                if replace:
                    t.delete(paths.task(task, "claim"))
                t.create(paths.task(task, "claim"), me.encode(), ephemeral=True)
                t.set_data(paths.task(task, "state"), CLAIMED.encode())
                # the lock's session is the one this consumer registered in (a lock made in a
                # later session of the client would name a consumer that others take for dead)
                t.check(current, -1)
            return add

        def together(group: str | None, adds: list[Callable[[Any], None]]) -> Callable[[Any], None]:
            """The claims of one group's tasks in one change, then its ``checks`` (after them: the
            first claim's operations keep their places, which the retry below reads)."""
            def add(t: Any) -> None:
                for each in adds:
                    each(t)
                for path, version in checks.get(group, ()) if group is not None else ():
                    t.check(path, version)
            return add

        planned: list[_Planned] = []
        for task, entry, version, count, hide_ms in wanted:
            new = Entry(now + hide_ms, count, me, entry.group, entry.filters, moving=moving, received=now)
            expired = entry.at <= now
            replace = expired and entry.by is not None and not entry.kept and entry.by in live
            planned.append(_Planned(task, new, version, expired, replace,
                                    zk.get_async(paths.task(task, "data")), zk.get_async(paths.task(task, "metadata"))))
        # One unit a change: a task, or a FIFO group's tasks in order, each naming those after it.
        units: list[list[_Planned]] = []
        of_group: dict[str, list[_Planned]] = {}
        for plan in planned:
            if plan.new.group is None:
                units.append([plan])
            elif plan.new.group in of_group:
                of_group[plan.new.group].append(plan)
            else:
                units.append(of_group.setdefault(plan.new.group, [plan]))
        for unit in units:
            unit[:-1] = [plan._replace(new=dataclasses.replace(plan.new, then=tuple(p.task for p in unit[k + 1 :])))
                         for k, plan in enumerate(unit[:-1])]
        changes = [together(unit[0].new.group, [claim(p.task, p.new, p.version, p.replace) for p in unit])
                   for unit in units]
        if record and planned:
            # this consumer's current tasks, in the claims' transaction (one write, not two)
            changes.append(lambda t: t.set_data(current, json.dumps([p.task for p in planned]).encode()))
        outcomes = self._commit_each(changes)
        all_won = all(_failure(results) is None for results in outcomes)
        won: list[tuple[str, Entry, int, bytes, bytes]] = []
        for unit, results in zip(units, outcomes):
            failed = _failure(results)
            if failed is None:
                # Each claim's first operation is its entry's write: its result has the version.
                starts = itertools.accumulate((operations(p.replace) for p in unit[:-1]), initial=0)
                won += [w for p, start in zip(unit, starts) if (w := self._won(p, results[start].version))]
                continue
            plan = unit[0]._replace(new=dataclasses.replace(unit[0].new, then=()))
            task, new, version, expired, replace = plan[:5]
            if len(unit) > 1:  # the group's first task alone, as any other
                (results,) = self._commit_each([together(new.group, [claim(task, new, version, replace)])])
                failed = _failure(results)
            if failed is not None and failed[0] == 1:  # the lock was not as planned
                if replace and isinstance(failed[1], NoNodeError):
                    retry = True  # its holder's session ended since: a claim that only creates one
                elif not replace and expired and isinstance(failed[1], NodeExistsError):
                    retry = True  # its holder's visibility ran out (checked again, by the version)
                else:
                    retry = False
                if retry:
                    replace = not replace
                    (results,) = self._commit_each([together(new.group, [claim(task, new, version, replace)])])
                    failed = _failure(results)
            if failed is not None:
                if failed[0] == operations(replace) - 1 and isinstance(failed[1], NoNodeError):
                    self._session = None  # this consumer's session ended: register anew, then claim
                continue  # another consumer won it, or it was deleted, or its holder lives
            if w := self._won(plan, results[0].version):
                won.append(w)
        if record and planned and not all_won:
            zk.set_async(current, json.dumps([w[0] for w in won]).encode())
        order = {plan.task: i for i, plan in enumerate(planned)}
        return sorted(won, key=lambda w: order[w[0]])  # in the look's order, not by group

    def _won(self, plan: _Planned, version: int) -> tuple[str, Entry, int, bytes, bytes] | None:
        """A claim won, its entry written at ``version``: (task, new entry, count, data, metadata),
        or None when the task's data went meanwhile (finished by id)."""
        self._remember(plan.task, plan.new, version)
        try:
            return plan.task, plan.new, plan.new.count, plan.data.get()[0], plan.meta.get()[0]
        except NoNodeError:
            return None

    def _send_dead(self, claimed: list[tuple[str, Entry, int, bytes, bytes]]) -> bool:
        """Move claimed tasks to the dead-letter queue, then finish them as ``dead``. A crash
        between the two leaves a task to move again: its dead letter has a deduplication id of
        its own (the task's), so the dead-letter queue drops the second copy within its
        ``dedup_window``, as on files (later, it is sent twice, never lost).

        False when the dead-letter queue cannot take them (its settings damaged, the ensemble
        refusing its writes, ...), as on files (``Channel._send_dead``): this queue goes on
        delivering its other tasks, and the claimed ones are given back, undelivered (they had
        their receives) and not lost, first in their FIFO groups; the failure is logged, naming
        its cause, and the move tried again ``task_gc_interval`` later, not at every receive. An
        outage (``StoreUnavailableError``, the ensemble of this queue too) is raised: the receive
        fails, and the mover's claims end with their 30 s."""
        if not claimed:
            return True
        broker, target = self.topic.broker, self.settings.dead_letter_queue or ""
        letters = []
        for task, entry, count, body, meta in claimed:
            env = envelope.decode_meta(body, meta) or Envelope(body)
            source = dead_letter_source(self.topic.name, self.name, task, count, env, sent_at_ns(task))
            letters.append(resend(env, filters=entry.filters or None, group_id=entry.group, source=source,
                                  dedup_id=f"dead-letter:{self.topic.name}/{task}"))
        receipts = [receipt(task, count) for task, _, count, _, _ in claimed]
        try:
            try:
                open_dead_letter_queue(broker.queue, target, self.settings).send_many(letters)
            except QueueNotFoundError:
                # Deleted by another process since this broker opened it (its topic now knows): made
                # again, as a missing one is, rather than failing this receive (as on files).
                open_dead_letter_queue(broker.queue, target, self.settings).send_many(letters)
        except StoreUnavailableError:
            raise
        except Error as exc:
            interval = self.settings.task_gc_interval
            self._retry_dead_letters_at = time.monotonic() + interval
            log_dead_letters_kept(f"{self.topic.name}/{self.name}", len(letters), target, interval, exc)
            self._act(receipts, lambda i, entry: (None, 0), moving=True)  # released: available, count kept
            return False
        self.topic.ensure_node(self.paths.dead_letters)  # (counted as each is marked dead: ``_apply``)
        self._act(receipts, lambda i, entry: (DEAD, None), moving=True)
        return True

    # -- acting on receipts -----------------------------------------------------------------

    def delete(self, receipt: str) -> None:
        """Finish the task of this delivery: it will not be delivered again."""
        _raise(self.delete_many([receipt])[0])

    def delete_many(self, receipts: list[str]) -> list[ReceiptError | None]:
        """Delete several; for each receipt, None or the error that kept it from being deleted."""
        check_receipt_list("receipts", receipts)
        with self._call(f"deleting {len(receipts)} receipt(s) in"):
            return self._act(receipts, lambda i, entry: (FINISHED, None))

    def change_visibility(self, receipt: str, seconds: float) -> None:
        """Hide the task of this delivery for ``seconds`` from now (0: give it back at once)."""
        _raise(self.change_visibility_many([(receipt, seconds)])[0])

    def change_visibility_many(
        self, changes: list[tuple[str, float]], *, within: float | None = None
    ) -> list[ReceiptError | None]:
        """As ``Channel.change_visibility_many`` (``within`` from the claim's time in the entry)."""
        check_visibility_changes(changes)
        check_within(within)

        def change(i: int, entry: Entry) -> tuple[str | None, int | None]:
            receipt, seconds = changes[i]
            error = past_limit(repr(receipt), seconds, entry.received * 1_000_000, time.time_ns(), within)
            if error is not None:
                raise error
            return None, int(seconds * 1000)

        with self._call(f"changing the visibility of {len(changes)} delivery(ies) in"):
            return self._act([r for r, _ in changes], change)

    def release(self, receipt: str, delay: float = 0.0) -> None:
        """Give the task back: available again after ``delay`` seconds (mq's redelivery)."""
        check_release_delay(delay)
        self.change_visibility(receipt, delay)

    def _act(
        self, receipts: list[str], change: Callable[[int, Entry], tuple[str | None, int | None]], *,
        moving: bool = False,
    ) -> list[ReceiptError | None]:
        """Apply ``change`` to the delivery of each receipt that is its task's latest. ``change``
        gives (``finished`` or ``dead``, None) to end the task, or (None, ms) to hide it for that
        long (0: release it). Unless ``moving`` (the dead-letter mover's own receipts), a task
        that a mover claimed is refused."""
        zk, paths = self._zk, self.paths
        outcomes: list[ReceiptError | None] = [None] * len(receipts)
        todo: dict[int, tuple[str, int]] = {}
        seen: set[str] = set()
        for i, value in enumerate(receipts):
            try:
                task, count = parse_receipt(value)
                if task in seen:
                    raise StaleReceiptError(f"receipt {value!r} was given twice in one call")
            except ReceiptError as exc:
                outcomes[i] = exc
                continue
            seen.add(task)
            todo[i] = (task, count)
        attempt = 0
        while todo:  # again for those whose entry changed between read and write, until each is settled
            _after_lost_races(attempt)
            reads = {}
            for i, (task, count) in todo.items():
                known = self._known.get(task) if attempt == 0 else None
                # what this handle wrote last is most likely still there: write on it unread
                reads[i] = known if known is not None and known[0].count == count else zk.get_async(paths.entry(task))
            commits: dict[int, tuple[str, Entry, int, str | None, int | None]] = {}
            guards: dict[int, list[tuple[str, int, bytes | None]]] = {}
            for i, read in reads.items():
                task, count = todo[i]
                if isinstance(read, tuple):
                    entry, version = read
                else:
                    try:
                        raw, stat = read.get()
                    except NoNodeError:
                        self._known.pop(task, None)
                        outcomes[i] = StaleReceiptError(
                            f"receipt {receipts[i]!r}: task {task} is no longer in flight (finished or gone)"
                        )
                        continue
                    entry, version = Entry.decode(raw), stat.version
                if entry.count != count:
                    outcomes[i] = StaleReceiptError(
                        f"receipt {receipts[i]!r}: task {task} was delivered again (delivery {entry.count}) after the "
                        f"delivery {count} that this receipt belongs to"
                    )
                    continue
                if entry.moving and not moving:
                    outcomes[i] = StaleReceiptError(
                        f"receipt {receipts[i]!r}: task {task} is being moved to the dead-letter queue (its "
                        f"visibility timeout ran out after its last receive of {count})"
                    )
                    continue
                try:
                    end, hide = change(i, entry)
                except ReceiptError as exc:  # refused by the change (``within``)
                    outcomes[i] = exc
                    continue
                if end is None and entry.group is not None and not moving and entry.at <= _now_ms():
                    # Hidden again after its claim ran out: not if another receive took its group since.
                    taken, guards[i] = self._group_taken_since(task, entry)
                    if taken:
                        outcomes[i] = group_taken_error(repr(receipts[i]), task)
                        continue
                commits[i] = (task, entry, version, end, hide)
            if guards and len(todo) > 1:
                # A hide after a claim ran out, of a group, beside other changes: the changes are
                # made one at a time, in order, each reading the queue after the ones before it
                # (as a batch acts on files). Read together, a change could be refused for a
                # holder that an earlier change of the batch gives back. (Rare, so its reads
                # again cost little.)
                for i in sorted(todo):
                    outcomes[i] = self._act([receipts[i]], lambda _, entry, i=i: change(i, entry), moving=moving)[0]
                return outcomes
            retry = {}
            applied = self._apply(list(commits.values()), fenced=True, guards=[guards.get(i, ()) for i in commits])
            for i, (failed, new) in zip(commits, applied):
                task = commits[i][0]
                if isinstance(failed, StaleReceiptError):
                    self._known.pop(task, None)
                    outcomes[i] = StaleReceiptError(f"receipt {receipts[i]!r}: {failed}")
                elif failed is None:
                    if new is None:
                        self._known.pop(task, None)
                        self._went(task)
                    else:
                        self._remember(task, new[0], new[1])
                elif isinstance(failed, (BadVersionError, NoNodeError)):
                    retry[i] = todo[i]
                else:
                    raise failed
            todo = retry
            attempt += 1
        return outcomes

    def _group_taken_since(self, task: str, entry: Entry) -> tuple[bool, list[tuple[str, int, bytes | None]]]:
        """For a change that hides ``task`` again after its claim ran out (``entry``, of a FIFO
        group): ``group_guard``, from the group's other entries read now, as ``_apply`` takes
        it ((entry path, version, data or None)). Lists the queue and reads the group: changes
        of visibility after a claim ran out are rare. (In a batch, ``_act`` makes such a change
        after the changes before it, and reads for it then.)"""
        group = self._group_entries(entry.group, task)
        taken, guard = group_guard(task, entry, group, _now_ms(), self._live())
        return taken, [(self.paths.entry(other), v, None if e is None else e.encode()) for other, v, e in guard]

    def _group_entries(self, group: str | None, but: str) -> dict[str, tuple[Entry, int]]:
        """The entries of FIFO ``group``'s pending tasks but ``but``, (entry, version) by task,
        oldest first, listed and read now."""
        listing, _ = self._pending(relist=True, watch=False)
        facts = self.topic.broker.known_tasks.facts(self._incarnation)

        def elsewhere(other: str) -> SentFacts | None:
            """Known to be of another group: its entry need not be read."""
            found = facts.get(other)
            return found if found is not None and found.group != group else None

        return {
            other: read
            for other, _, read in self._look([t for t in listing if t != but], 512, elsewhere)
            if read is not None and read[0].group == group
        }

    def _apply(
        self, changes: list[tuple[str, Entry, int, str | None, int | None]], *, fenced: bool,
        guards: Sequence[Sequence[tuple[str, int, bytes | None]]] = (),
    ) -> list[tuple[Exception | None, tuple[Entry, int] | None]]:
        """Apply (task, entry read, its version, end, hide) each: end the task (``end``:
        finished or dead) or hide it for ``hide`` ms (0: release it). Returns for each the error
        of its entry (the entry changed or went: read it again) or None, and the entry written
        with its version (None when ended).

        ``fenced`` (a change by receipt): a delivery whose consumer's session ended (its lock is
        gone) is not changed, and its error is a ``StaleReceiptError``: its claim ended with the
        session, and another consumer may have the task now (or soon: it is available). Without
        it (a change by id), the change is made whoever held the task.

        ``guards``, for each change: (entry path, version, data) of entries that must be
        unchanged, or be written ``data`` (last in its transaction, after a check or a write at
        that version); when one changed or went, its error is that of an entry that changed:
        the caller reads again."""
        paths = self.paths

        def change(
            task: str, entry: Entry, version: int, end: str | None, hide: int | None, claim: bool,
            guard: Sequence[tuple[str, int, bytes | None]] = (),
        ) -> Any:
            # the lock of a live claim (a claim whose consumer closed cleanly has none left)
            locked = claim and entry.by is not None and not entry.kept
            written = entry.hidden(hide or 0, _now_ms())

            def add(t: Any) -> None:
                if end is not None:
                    t.delete(paths.entry(task), version)
                else:
                    t.set_data(paths.entry(task), written.encode(), version)
                if locked and not hide:
                    t.delete(paths.task(task, "claim"))  # the lock goes with the claim
                elif locked and fenced:
                    t.check(paths.task(task, "claim"), -1)  # the claim's session still lives
                if end is not None or not hide:
                    t.set_data(paths.task(task, "state"), (end or INSERTED).encode())
                if end == DEAD:
                    # Counted in the transaction that marks it dead (a mover killed after it
                    # could not count it): this raises the counter's child version by two.
                    t.create(f"{paths.dead_letters}/{task}", b"")
                    t.delete(f"{paths.dead_letters}/{task}")
                for path, checked, data in guard:
                    if data is None:
                        t.check(path, checked)
                    else:
                        t.set_data(path, data, checked)
            return add, (None if end is not None else written)

        def guard_failed(results: list[Any], guard: Sequence[tuple[str, int, bytes | None]]) -> Exception | None:
            """The error of a guard that failed in ``results`` (the guards come last)."""
            failed = _failure(results)
            return failed[1] if failed is not None and failed[0] >= len(results) - len(guard) else None

        guards = guards or [()] * len(changes)
        planned = [change(*c, claim=True, guard=g) for c, g in zip(changes, guards)]
        outcomes: list[tuple[Exception | None, tuple[Entry, int] | None]] = []
        for c, g, (add, written), results in zip(changes, guards, planned, self._commit_each([a for a, _ in planned])):
            if (changed := guard_failed(results, g)) is not None:
                outcomes.append((changed, None))  # a guarded entry changed or went: read again
                continue
            failed = _failure(results)
            lock_gone = failed is not None and failed[0] == 1 and isinstance(failed[1], NoNodeError)
            if lock_gone and fenced:
                task, entry = c[0], c[1]
                outcomes.append((StaleReceiptError(
                    f"task {task} was given back when the session of consumer {entry.by}, which received this "
                    "delivery, ended (it may be delivered to another consumer already)"
                ), None))
                continue
            if failed is not None and failed[0] > 0 and isinstance(failed[1], NoNodeError):
                add, written = change(*c, claim=False, guard=g)  # a claim whose session ended has no lock
                (results,) = self._commit_each([add])
                if (changed := guard_failed(results, g)) is not None:
                    outcomes.append((changed, None))
                    continue
                failed = _failure(results)
            if failed is not None and failed[0] > 0:
                raise failed[1]
            outcomes.append((
                failed[1] if failed is not None else None,
                (written, results[0].version) if failed is None and written is not None else None,
            ))
        return outcomes

    def _remember(self, task: str, entry: Entry, version: int) -> None:
        """Keep the entry this handle wrote, and its version, for the receipt's next use."""
        if len(self._known) >= 100_000:
            self._known.clear()  # receipts never used again: forget them all, reads work as well
        self._known[task] = (entry, version)

    # -- by id ------------------------------------------------------------------------------

    def finish_ids(self, tasks: list[str], end: str) -> list[str]:
        """End pending tasks whatever their state; returns those that were pending. An entry
        that changed between its read and its write (a consumer claimed, released or extended
        the task meanwhile) is read again, as often as that happens: by id, a task ends whoever
        holds it, and only its end by another (its entry gone) ends the tries."""
        done: list[str] = []
        lost = 0
        while tasks:
            _after_lost_races(lost)
            lost += 1
            entries = list(self._entries(tasks))
            changes = [(task, entry, version, end, None) for task, entry, version in entries]
            tasks = []
            for (task, _, _), (failed, _) in zip(entries, self._apply(changes, fenced=False)):
                if failed is None:
                    self._known.pop(task, None)
                    self._went(task)
                    done.append(task)
                elif isinstance(failed, BadVersionError):
                    tasks.append(task)
        return done

    def delete_id(self, id: str) -> None:
        """Finish task ``id`` whatever its state: delivered or not (mq deletes by id)."""
        _raise(self.delete_ids([id])[0])

    def delete_ids(self, ids: Sequence[str]) -> list[Error | None]:
        """``delete_id`` of each, their entries read and ended together; for each id, None or
        the error that kept it from being deleted (as the file store's ``Channel.delete_ids``)."""
        deletes = IdDeletes(ids, check_task_id)
        if deletes.todo:
            with self._call(f"deleting message {ids[0]} of" if len(ids) == 1 else f"deleting {len(ids)} messages of"):
                done = set(self.finish_ids(list(deletes.todo), FINISHED))
            deletes.refused += [position for task, position in deletes.todo.items() if task not in done]
        return deletes.outcomes_in(self.topic.name)

    def purge(self) -> None:
        """Finish every task sent so far (SQS's PurgeQueue)."""
        with self._call("purging"):
            self.finish_ids(sorted(self._zk.get_children(self.paths.queue)), FINISHED)

    def task(self, id: str) -> Task:
        """zkmq's state of task ``id`` (inserted, claimed, finished, dead) and its metadata."""
        task = check_task_id(id)
        zk, paths = self._zk, self.paths
        with self._call(f"reading task {id} of"):
            state, meta = zk.get_async(paths.task(task, "state")), zk.get_async(paths.task(task, "metadata"))
            pending = zk.get_async(paths.entry(task))
            names = zk.get_children_async(paths.task(task, "filters"))
            try:
                value = state.get()[0].decode(errors="replace")
                raw_meta = meta.get()[0]
                filter_names = names.get()
            except NoNodeError:
                raise TaskNotFoundError(f"no task {id!r} in {self.topic.name} (never sent, or collected)") from None
            values = [(name, zk.get_async(paths.task(task, f"filters/{name}"))) for name in filter_names]
            try:
                current: Entry | None = Entry.decode(pending.get()[0])
            except NoNodeError:
                current = None
            if current is None and value in (INSERTED, CLAIMED):
                # a send that died before its queue entry: nobody can see it
                raise TaskNotFoundError(f"no task {id!r} in {self.topic.name} (its send did not finish)")
            holder = None
            if value == CLAIMED:
                assert current is not None
                if current.held(_now_ms(), self._live()):
                    holder = current.by
                else:
                    value = INSERTED
            filters = {}
            for name, result in values:
                try:
                    filters[name] = result.get()[0].decode()
                except NoNodeError:
                    pass
            env = envelope.decode_meta(b"", raw_meta) or Envelope(b"")
            return Task(task, value, env.metadata, current.count if current else 0, holder, filters)

    def set_metadata(self, id: str, metadata: Any) -> None:
        """Replace the JSON metadata of task ``id``."""
        task = check_task_id(id)
        envelope.encode_task_metadata(metadata)  # the file store's check: JSON, or InvalidMessageError
        zk, path = self._zk, self.paths.task(task, "metadata")
        with self._call(f"setting the metadata of task {id} in"):
            while True:
                try:
                    raw, stat = zk.get(path)
                except NoNodeError:
                    raise TaskNotFoundError(f"no task {id!r} in {self.topic.name}") from None
                try:
                    meta = json.loads(raw)
                    if not isinstance(meta, dict):
                        meta = {}
                except ValueError:
                    meta = {}
                meta["m"] = metadata
                data = json.dumps(meta, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
                size = _own_metadata_size(envelope.decode_meta(b"", data) or Envelope(b""), data)
                if size > MAX_BODY:
                    raise InvalidMessageError(
                        f"task metadata of {size} bytes is over the ZooKeeper store's {MAX_BODY}"
                    )
                try:
                    zk.set(path, data, stat.version)
                    return
                except BadVersionError:
                    continue  # changed meanwhile: read it again

    # -- stats ------------------------------------------------------------------------------

    def stats(self) -> ChannelStats:
        """Counts as SQS gives them (``dead``: every task moved to the dead-letter queue)."""
        zk, paths = self._zk, self.paths
        with self._call("counting the messages of"):
            names = sorted(zk.get_children(paths.queue))
            now, live = _now_ms(), self._live()
            # Dead letters that the dead-letter queue refused lately (as this handle knows): kept,
            # undelivered, until the move is tried again (``_send_dead``); not available.
            max_count = moving_on_after(self.settings) if time.monotonic() < self._retry_dead_letters_at else None
            available = in_flight = delayed = 0
            for _, entry, _ in self._entries(names):
                if entry.available(now, live):
                    if max_count is None or entry.count < max_count:
                        available += 1
                    else:
                        delayed += 1
                elif entry.by is None:
                    delayed += 1
                else:
                    in_flight += 1
            counter = zk.exists(paths.dead_letters)
            dead = int(self.topic.conf().get("dead", 0)) + (counter.cversion // 2 if counter is not None else 0)
            oldest = max(0.0, (time.time_ns() - sent_at_ns(names[0])) / 1e9) if names else None
            return ChannelStats(available, in_flight, delayed, dead, oldest)

    def commit_cursor(self) -> None:
        """Nothing to commit: the store has no cursor (the file store's channels do)."""

    def close(self) -> None:
        """Leave cleanly: the tasks this handle holds stay hidden for the rest of their
        visibility timeout (marked ``kept``: its locks end with its session, and the receipts of
        those deliveries stay good, as they would on files), and its consumer node goes. (A
        consumer that dies gives its tasks back as soon as its session ends.) A closed handle
        receives nothing and registers no consumer (``_register``); its broker gives a new one."""
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        zk, paths = self._zk, self.paths
        if not self._registered() or not zk.connected:
            return  # (the claims of a session that ended are free: none are kept)
        try:
            with self._call("closing the consumer of", check=False):
                # (those whose visibility ran out too: kept, their receipts stay good until another
                # consumer receives them)
                mine = [(task, entry, version) for task, (entry, version) in dict(self._known).items()
                        if entry.by == self.consumer_id]
                current = paths.consumer(self.consumer_id, "current")
                writes = [zk.transaction() for _ in mine]
                for t, (task, entry, version) in zip(writes, mine):
                    kept = dataclasses.replace(entry, kept=True)
                    t.set_data(paths.entry(task), kept.encode(), version)
                    t.check(current, -1)  # kept only while the session that claimed it lives
                for result in [t.commit_async() for t in writes]:
                    result.get()  # one that changed meanwhile (deleted, taken over) is left as it is
                self._unregister()
        except (KazooException, QueueError):
            pass  # its session ends with the client anyway: its tasks come back then


def _raise(error: Error | None) -> None:
    if error is not None:
        raise error
