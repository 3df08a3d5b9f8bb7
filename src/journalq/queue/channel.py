"""A channel: a named consumer of a topic whose messages are shared out among competing consumers.

Every change (a delivery, a delete, a change of visibility, a dead letter) is an event appended to
the channel's own state journal, ``TOPIC/channels/NAME/``, under its lock. Each process keeps the
channel's state in memory (``state.ChannelState``): to act, it takes the lock, applies the events
the others appended since, decides, appends its own events and lets go. So many processes share a
channel with no daemon, a consumer killed with SIGKILL loses nothing (its messages come back when
their visibility ends, with no event at all), and a process killed while appending leaves a torn
tail that the next one cuts.

Under ``sync="always"`` every change is synced before its call returns except deliveries, which
reach the disk with the next synced change (one file written in order: a sync covers all before
it). A delivery lost in a power cut only means the message goes out again; its receipt carries the
delivery's stamp (``Delivery.stamp``) and so can never act on that later delivery.

The state journal is compacted: every ``SNAPSHOT_EVERY`` changes (``SNAPSHOT_SMALL_EVERY`` while
the state is small, more while it is large) a snapshot of the whole state is appended,
``ofs/snapshot.ofs`` is pointed at it, and the state segments before it are deleted.
The channel's cursor is committed as a plain sej reader offset, ``TOPIC/ofs/NAME.ofs``, which the
topic's garbage collection reads: at each collection, and whenever a receive finds the channel run
dry.
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import heapq
import logging
import operator
import os
import re
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import repeat
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from journalq.errors import (
    CorruptionError,
    Error,
    InvalidMessageError,
    InvalidSettingError,
    JournalError,
    OffsetOutOfRangeError,
    QueueNotFoundError,
    ReceiptError,
    StaleReceiptError,
    StorageError,
    TaskNotFoundError,
    TruncatedError,
    VisibilityLimitError,
)
from journalq.journal import Message, Scanner, Writer, end_offset
from journalq.journal.offsets import overwrite_offset, read_offset, write_offset
from journalq.journal.recovery import fsync_dir, write_temporary
from journalq.journal.segment import list_segments, remove_segment
from journalq.journal.watch import DirectoryWatch
from journalq.journal.writer import held
from journalq.queue import envelope
from journalq.queue import filters as filtering
from journalq.queue.envelope import (
    Attribute,
    Envelope,
    dead_letter_source,
    encode_task_metadata,
    message_id,
    parse_message_id,
    resend,
)
from journalq.queue.settings import QueueSettings, check_number, open_dead_letter_queue
from journalq.queue.state import (
    ChannelState,
    Event,
    EventKind,
    StaleReceipt,
    deliver_many_record,
    deliver_record,
    finish_records,
)

if TYPE_CHECKING:
    from journalq.queue.topic import Topic

_Key = TypeVar("_Key")  # what ``IdDeletes`` knows a message by: its offset, a ZooKeeper task
log = logging.getLogger("journalq.queue")

SNAPSHOT_EVERY = 20_000
"""Changes (a message delivered, finished, ...) after which the state journal is compacted."""
SNAPSHOT_SMALL_EVERY = 2_000
"""Changes after which it is compacted when its state is small (``_compaction_due``)."""
SNAPSHOT_SAVES = 8
"""... small: the changes since the last snapshot at least this many times its entries."""
SNAPSHOT_ENTRIES = 20_000
"""A state that lists more entries than this (deliveries in flight, say) is compacted after
proportionally more changes than ``SNAPSHOT_EVERY``: one a change, at the defaults."""
STATE_SEGMENT_SIZE = 4 * 1024 * 1024
MAX_RECEIVE = 10_000
MAX_VISIBILITY = 12 * 3600  # seconds, as SQS
MAX_WAIT = 3600  # seconds: the longest long poll of one receive
ISSUED_MAX = 16_384  # receipts remembered by ``Channel._issued`` (and ``ShardedChannel._issued``)
_LOOK_AHEAD = 1024  # new messages kept read ahead of the frontier (``_read_ahead``); see ``_scan_far``
_HELD_READ = 64  # new messages read at a time under the hold when the look-ahead falls short (``_take_new``)
_ENVELOPES_KEPT = 8192  # decoded envelopes a channel keeps, for messages received again
_ASLEEP_LEAST = 64  # messages in a row worth remembering as one ``_Asleep`` (or ``_Missed``) run
_ASLEEP_MOST = 4096  # ``_Asleep`` runs a channel remembers, and ``_Missed`` runs for one set of filters
_MISSED_FILTER_SETS = 16  # consumers' sets of filters whose ``_Missed`` runs a channel remembers
_NEVER = 2**63 - 1  # (ns) a ``_Missed`` run's ``wake`` when retention never reaches its messages
# Unseen messages (past the frontier) that stats() reads to tell delayed ones, and others'
# messages, from available ones; beyond, each counts as available. Reading one costs ~0.9 µs: at
# 100,000 a stats() took ~90 ms of CPU, and the server calls it for every queue at each scrape
# of /metrics, GET /{queue} and GetQueueAttributes.
_STATS_LOOK_AHEAD = 10_000


_DISK_FULL = frozenset((errno.ENOSPC, errno.EDQUOT))
REDRIVING: contextvars.ContextVar[bool] = contextvars.ContextVar("journalq_redriving", default=False)
"""True in a redrive's receives (``Queue.redrive``, this thread's): they move dead letters back,
which is no receive in SQS (StartMessageMoveTask), so the queue's own max_receive_count does not
move them on to its dead-letter queue."""


def moving_on_after(settings: QueueSettings) -> int | None:
    """The receive count at which a receive moves a message to the dead-letter queue: the queue's
    ``max_receive_count``, but none in a redrive's receives (``REDRIVING``). Both stores' rule."""
    return None if REDRIVING.get() else settings.max_receive_count


_new_tuple = tuple.__new__
_timestamp_of = operator.itemgetter(1)  # a ``Message``'s timestamp (ns)
_type_of = operator.itemgetter(2)  # a ``Message``'s type
_ENVELOPE_TYPE = envelope.ENVELOPE_TYPE


class _Asleep(NamedTuple):
    """Offsets ``start`` to ``end - 1`` of a topic, each a message that nothing may take before
    ``wake`` (ns): delayed, in no FIFO group (a group's member would hold its group back, and
    whether it still does depends on the state). A message's delay never changes, so a receive
    passes over such a run whole until ``wake`` (``Channel._awake``, ``Channel._scan_far``),
    rather than reading each of its messages again, under the hold, at every receive."""

    start: int
    end: int
    wake: int


class _Missed(NamedTuple):
    """Offsets ``start`` to ``end - 1`` of a topic, each a message that a consumer with one set of
    filters never takes (``Channel._missed``): its filters do not match those (a message's filters
    never change, so a miss stays one), it is in no FIFO group (a group's member holds its group
    back, which depends on the state), for this channel, and was within retention when found.
    A receive with those filters passes over such a run whole (``Channel._take_new``,
    ``_awake``, ``_scan_far``) until ``wake``: when its oldest message passes retention (as
    retention was then: the runs are forgotten when it changes), and a receive must look at it
    again to finish it unseen. Consumers with other filters, or none, are not concerned."""

    start: int
    end: int
    wake: int


_Run = _Asleep | _Missed


class _RunMaker:
    """Makes the runs of one kind (``_Asleep`` or ``_Missed``) as ``Channel._scan_far`` reads a
    topic in order: each offset read either extends the run under way or ends it."""

    def __init__(self, kind: type[_Asleep] | type[_Missed]) -> None:
        self.kind = kind
        self.made: list[_Run] = []
        self._start = -1  # of the run under way; -1: none
        self._wake = 0

    def extend(self, start: int, wake: int) -> None:
        """The run under way goes on to cover ``start`` (an offset read, or a known run of this
        kind, passed over whole, that reaches the offset read), which must wake by ``wake``."""
        if self._start < 0:
            self._start, self._wake = start, wake
        elif wake < self._wake:
            self._wake = wake

    def end(self, end: int) -> None:
        """The run under way ends before offset ``end``; kept when it is long enough."""
        if self._start >= 0 and end - self._start >= _ASLEEP_LEAST:
            self.made.append(self.kind(self._start, end, self._wake))
        self._start = -1


def _kept_runs(old: Iterable[_Run], made: Iterable[_Run], now: int, cursor: int) -> list[_Run]:
    """The runs worth keeping of ``old`` and ``made``: by start, still asleep at ``now``, not all
    below the channel's ``cursor`` (finished), none inside another (a run made by extending one
    known covers it), the first ``_ASLEEP_MOST``."""
    kept: list[_Run] = []
    for run in sorted(
        (run for runs in (old, made) for run in runs if run.wake > now and run.end > cursor),
        key=lambda run: (run.start, -run.end),
    ):
        if not kept or run.end > kept[-1].end:
            kept.append(run)
    return kept[:_ASLEEP_MOST]


def _outside(messages: list[Message], runs: Sequence[_Run]) -> Iterator[Message]:
    """``messages`` (offsets dense and rising) but for those in ``runs`` (by start)."""
    if not messages:
        return
    base, i, r = messages[0].offset, 0, 0
    while i < len(messages):
        offset = base + i
        while r < len(runs) and runs[r].end <= offset:
            r += 1
        if r < len(runs) and runs[r].start <= offset:
            i = runs[r].end - base
            continue
        yield messages[i]
        i += 1


_FiltersKey = tuple[tuple[str, tuple[str, filtering.Method]], ...]


def _filters_key(wanted: dict[str, tuple[str, filtering.Method]]) -> _FiltersKey:
    """A consumer's filters as a key of ``Channel._missed``: the same filters, the same key."""
    return tuple(sorted(wanted.items()))


# What a ``_decider``'s function says of a message: one of these, or (positive) the time (ns) at
# which its delay ends.
_TAKE = 0  # the consumer may take it now (dead letters aside: its receive count decides)
_GONE = -1  # past retention, or for another channel: a receive finishes it unseen
_HELD = -2  # its FIFO group is held back
_MISS = -3  # the consumer's filters do not match it


def _decider(
    now: int,
    kept_from: int,
    channel: str,
    blocked: set[str],
    wanted: dict[str, tuple[str, filtering.Method]] | None,
    enums: Mapping[str, tuple[str, ...]],
) -> Callable[[Message, Envelope], int]:
    """The rules of a receive at ``now`` (retention from ``kept_from`` on) in ``channel``, for a
    consumer with filters ``wanted``, the FIFO groups ``blocked`` held back: a function of a
    message and its envelope that gives ``_TAKE``, why not (``_GONE``, ``_HELD``, ``_MISS``), or
    when its delay ends. A message it refuses for its filters or delay holds its group back
    (added to ``blocked``): nothing after it in its group goes first. The one decision of the
    receive under the hold (``consider``, which decides plain messages itself: of these rules
    only retention concerns them) and of ``_scan_far``."""
    matches = filtering.matches

    def decide(message: Message, env: Envelope) -> int:
        if 0 < message.timestamp_ns < kept_from:
            return _GONE
        if env.channel is not None and env.channel != channel:
            return _GONE
        group = env.group_id
        if group is not None and group in blocked:
            return _HELD
        # Filters before the delay: a message never to go to this consumer wakes none of its polls.
        if wanted is not None and not matches(env.filters, wanted, enums):
            verdict = _MISS
        elif env.delay and (visible_at := message.timestamp_ns + int(env.delay * 1e9)) > now:
            verdict = visible_at
        else:
            return _TAKE
        if group is not None:
            blocked.add(group)
        return verdict

    return decide


class _Far(NamedTuple):
    """What a receive that found nothing in its look-ahead hands ``Channel._scan_far``: the
    frontier then, the first offset past the look-ahead, and the FIFO groups held back so far."""

    frontier: int
    start: int
    blocked: set[str]


class _ReceivedFields(NamedTuple):
    id: str
    receipt: str
    body: bytes
    attributes: dict[str, Attribute]
    receive_count: int
    sent_at_ns: int
    offset: int
    group_id: str | None
    dedup_id: str | None
    filters: dict[str, str]
    metadata: Any
    source: dict[str, Any] | None


class ReceivedMessage(_ReceivedFields):
    """A delivered message. ``receipt`` names this delivery: use it to delete, release or change
    visibility; once the message is delivered again, the old receipt no longer works.

    Immutable, and a named tuple: a receive makes one per message, and a tuple is made in one step
    (a frozen dataclass's fields were a dict of twelve, which made receive + delete 8 % dearer)."""

    __slots__ = ()

    def __new__(
        cls,
        id: str,
        receipt: str,
        body: bytes,
        attributes: dict[str, Attribute],
        receive_count: int,
        sent_at_ns: int,
        offset: int,
        group_id: str | None = None,
        dedup_id: str | None = None,
        filters: dict[str, str] | None = None,
        metadata: Any = None,
        source: dict[str, Any] | None = None,
    ) -> ReceivedMessage:
        filters = {} if filters is None else filters
        fields = (id, receipt, body, attributes, receive_count, sent_at_ns, offset, group_id, dedup_id, filters)
        return _new_tuple(cls, (*fields, metadata, source))

    @property
    def sent_at(self) -> datetime:
        return datetime.fromtimestamp(self.sent_at_ns / 1e9, timezone.utc)


@dataclass(frozen=True)
class Task:
    """zkmq's view of a message: its state (inserted, claimed, finished, dead) and metadata."""

    id: str
    state: str
    metadata: Any
    receive_count: int
    consumer: str | None
    filters: dict[str, str]


@dataclass(frozen=True)
class ChannelStats:
    available: int
    in_flight: int
    delayed: int
    """Messages not to be delivered yet: sent with a delay not over, and dead letters kept back
    after the dead-letter queue refused them (moved, not delivered, when the move is tried
    again; counted so by the process that saw the refusal)."""
    dead: int
    oldest_age: float | None
    """Seconds since the oldest message counted above was sent (None when there is none): not
    one past retention or for another channel, which a receive finishes unseen."""
    damage: str | None = None
    """Damage in the topic ahead of the channel (sej's messages carry no checksum): where it is
    (file, byte, offset), None when none was met. Receives give every message before it, then
    raise it; ``journalq check`` names where whole messages start again and ``skip_to`` moves
    the channel there. The messages past it count above as available. Seen as far as ``stats``
    reads past what receives took (``_STATS_LOOK_AHEAD``) or this process's receives read."""


# What ``_receipt`` makes: offset, delivery number, channel token, delivery stamp (hex). Receipts
# made before deliveries had stamps lack the last part: they are refused (their messages come back
# when their visibility ends), since without a stamp a receipt could match a later delivery.
_PLAIN = Envelope(b"")  # what ``consider`` checks of a plain message: no group, delay or filters
_RECEIPT = re.compile(r"([0-9]+)\.([1-9][0-9]*)\.([0-9a-f]{8})\.([0-9a-f]{1,16})")
Record = tuple[int, bytes, bytes]  # (type, key, value) of a state-journal message


def receive_arguments(
    settings: QueueSettings,
    max_messages: object,
    visibility_timeout: float | None,
    wait: float | None,
    filters: filtering.ConsumerFilters | None,
    delete: object,
) -> tuple[float, float, dict[str, tuple[str, filtering.Method]] | None]:
    """``receive``'s arguments checked, by every store before it does anything: the visibility
    timeout and the wait in seconds (the queue's unless given), and the consumer's filters."""
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidSettingError(f"max_messages must be 1 to {MAX_RECEIVE}, not {max_messages!r}")
    check_receipt_list("delete", delete)
    # The queue's own settings were checked when they were made (``QueueSettings``).
    if visibility_timeout is None:
        hide = settings.visibility_timeout
    else:
        hide = check_number("visibility_timeout", visibility_timeout, 0, MAX_VISIBILITY)
    wait = settings.receive_wait if wait is None else check_number("wait", wait, 0, MAX_WAIT)
    return hide, wait, None if filters is None else filtering.normalize(filters, settings.enums)


def retention_horizon(settings: QueueSettings, now: int) -> int:
    """The time (ns) before which a message is past the topic's ``retention_seconds``: a receive
    finishes it unseen, as the ZooKeeper store expires its tasks (whole segments of them are
    deleted by the topic's gc; this bounds the rest, in the segments still written to). A
    message with no time (0 or less, as sej writes none) is never past it."""
    retention = settings.retention_seconds
    return 0 if retention is None else now - int(retention * 1e9)


def log_failed_collection(path: Path, interval: float, exc: Exception) -> None:
    """Log a garbage collection that failed in a call other than a receive (which raises it)."""
    log.warning("%s: the garbage collection due failed, tried again in %g s: %s", path, interval, exc)


def log_dead_letters_kept(channel: str, letters: int, target: str, interval: float, exc: Exception) -> None:
    """Log dead letters that ``channel`` (QUEUE/CHANNEL) keeps, the dead-letter queue ``target``
    refusing them, until the move is tried again ``interval`` seconds later (both stores)."""
    log.warning(
        "%s: %d dead letter(s) cannot move to dead-letter queue %r; kept here, undelivered, and tried "
        "again in %g s: %s",
        channel, letters, target, interval, exc,
    )


def check_receipt_list(name: str, receipts: object) -> None:
    """Refuse anything but a list of receipts: one receipt (a string would be taken letter by
    letter), None, ..."""
    if type(receipts) is list or type(receipts) is tuple:
        # The common cases first (a list, receive's default ``()``): this runs for every delete and
        # receive, and ``isinstance`` against ``Sequence`` is three Python-level calls of ``abc``.
        return
    if isinstance(receipts, str):
        raise InvalidSettingError(f"{name} must be a list of receipts, not one receipt")
    if isinstance(receipts, ReceivedMessage):  # a tuple, which would be taken field by field
        raise InvalidSettingError(f"{name} must be a list of receipts, not a message (its receipt is .receipt)")
    if isinstance(receipts, (bytes, bytearray)) or not isinstance(receipts, Sequence):
        raise InvalidSettingError(f"{name} must be a list of receipts, not {type(receipts).__name__}")


def check_release_delay(delay: object) -> None:
    """Refuse a release's ``delay`` out of range, by its name (every store's ``release``, which is
    a change of visibility: that one's error would speak of a visibility timeout)."""
    check_number("delay", delay, 0, MAX_VISIBILITY)


def check_visibility_changes(changes: object) -> None:
    """Refuse anything but a list of (receipt, seconds) pairs, with seconds in range (every
    store's ``change_visibility_many``, before it changes anything)."""
    if isinstance(changes, (str, bytes, bytearray)) or not isinstance(changes, Sequence):
        raise InvalidSettingError(f"changes must be a list of (receipt, seconds) pairs, not {type(changes).__name__}")
    for change in changes:
        if isinstance(change, str) or not isinstance(change, Sequence) or len(change) != 2:
            raise InvalidSettingError(f"changes must be a list of (receipt, seconds) pairs, not one of {change!r}")
        check_number("visibility timeout", change[1], 0, MAX_VISIBILITY)


def check_within(within: object) -> None:
    """Refuse a ``within`` (``change_visibility_many``'s limit) that is neither None nor a number
    of seconds up to ``MAX_VISIBILITY``."""
    if within is not None:
        check_number("within", within, 0, MAX_VISIBILITY)


def past_limit(
    shown: str, seconds: float, received_ns: int, now_ns: int, within: float | None
) -> ReceiptError | None:
    """The error (of receipt ``shown``, quoted) of a change of visibility to ``seconds`` from
    ``now_ns`` that would end more than ``within`` seconds after the delivery (received at
    ``received_ns``; 0: not known, as for deliveries recorded before their time was), or None
    (every store's ``change_visibility_many``)."""
    if within is None or not received_ns or now_ns + seconds * 1e9 <= received_ns + within * 1e9:
        return None
    return VisibilityLimitError(
        f"receipt {shown}: hiding its message for {seconds:g} s would end more than {within:g} s after "
        "its delivery"
    )


def group_taken_error(shown: str, message_id: str) -> StaleReceiptError:
    """The error of receipt ``shown`` (quoted) whose message came back when its visibility ran
    out and whose FIFO group another receive took since: hiding it again would give the group
    two holders, out of order (every store's ``change_visibility_many``)."""
    return StaleReceiptError(
        f"receipt {shown}: message {message_id} came back when its visibility ran out, and another receive "
        "took its FIFO group since"
    )


_TOKEN = re.compile(rb"[0-9a-f]{8}")


def _channel_token(path: Path, durable: bool) -> str:
    """The random token made when the channel was created (``channel.id``): receipts carry it, so
    that one can never act on another channel, nor on a channel made again under the same name.

    Called under the channel's hold. A file that holds no token (one never synced, emptied or
    zero-filled by a power cut, or damaged) is replaced by a new token, once, for every process:
    with it, each process would give out receipts that no other takes. Receipts of the lost
    token are refused; their messages come back when their visibility ends. ``durable``: a new
    token is synced, file and entry, so that the receipts given out with it outlive a power cut."""
    file = path / "channel.id"
    try:
        found: bytes | None = file.read_bytes().strip()
    except FileNotFoundError:
        found = None
    if found is not None and _TOKEN.fullmatch(found):
        return found.decode()
    token = secrets.token_hex(4)
    tmp = write_temporary(file, f"{token}\n".encode(), durable=durable)
    try:
        if found is None:
            # Creates it whole, or fails when another process was first (one of an earlier
            # version, which made it out of the hold): its token is read below.
            os.link(tmp, file)
        else:
            log.warning("%s held no channel token (%r): a new one replaces it", file, found[:16])
            os.replace(tmp, file)
    except FileExistsError:
        token = ""
    finally:
        tmp.unlink(missing_ok=True)
    if not token:
        return _channel_token(path, durable)
    if durable:
        fsync_dir(path)
    return token


def channel_dir(topic_path: Path, name: str) -> Path:
    """``TOPIC/channels/NAME``: where channel ``name`` of the topic (or shard) at ``topic_path``
    keeps its state journal."""
    return topic_path / "channels" / name


def new_consumer_id() -> str:
    """A consumer's id, as ``consumers()`` lists it: host, process, and a few random bytes for
    each channel object of the process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Channel:
    """The channel ``name`` of ``topic``; get one with ``Topic.channel`` or ``Broker.queue``."""

    def __init__(self, topic: Topic, name: str) -> None:
        self.topic = topic
        self.name = name
        self.path = channel_dir(topic.path, name)
        self._closed = False
        self.consumer_id = new_consumer_id()
        self.receipt_prefix = ""
        """What the caller's receipts and message ids have before this channel's own (a sharded
        queue's shard channels: the shard's index and a dot): a receive gives them so, the calls
        that take receipts take them so, and dead letters name their message so."""
        self._writer = self._new_writer()
        self._reopen_lock = threading.Lock()  # threads reopening the writer make one, not one each
        self._token = ""  # ``_channel_token``'s, read under the hold below
        self.state = ChannelState()
        self._events: Scanner | None = None
        self._applied = -1  # the offset of the next event to apply (``_load`` sets it)
        self._tail: Scanner | None = None  # reads new topic messages from the frontier
        self._ahead: list[Message] = []  # read from the frontier on, not yet taken
        self._ahead_lock = threading.Lock()  # ``_ahead`` and ``_tail``: read outside the hold too
        self._tail_lost = False  # the tail's next message was deleted (retention): see ``_read_ahead``
        # Where the tail met damage, the scanner's error: see ``_read_ahead`` (a receive raises it
        # with how to go on: ``_check_damage``; ``stats`` says it).
        self._damage: CorruptionError | None = None
        # Runs of delayed messages found past the frontier, by start (``_Asleep``): replaced whole
        # (under ``_asleep_lock``), never changed in place, so the hold reads it without a lock.
        self._asleep: list[_Asleep] = []
        self._asleep_lock = threading.Lock()
        # Runs of filter misses (``_Missed``), by start, for each set of consumer filters (its
        # items, sorted), as retention and the filters' enums were when they were found
        # (``_missed_rules``); replaced whole, as ``_asleep``, under its lock.
        self._missed: dict[_FiltersKey, list[_Missed]] = {}
        self._missed_rules: tuple[float | None, dict[str, tuple[str, ...]]] = (None, {})
        self._unwritten: list[Message] = []  # events applied, to append with the next ``_record``
        # Decoded envelopes by offset, oldest first. An OrderedDict: a dict whose first key is
        # popped again and again walks past the holes the pops leave (~10 µs an eviction).
        self._envelopes: OrderedDict[int, Envelope] = OrderedDict()
        self._committed_cursor = -1
        self._commit_lock = threading.Lock()
        # What ``_parse_receipt`` gives for the receipts this object made lately (so a consumer's
        # own receipts are not parsed again); forgotten when finished, all of it when it grows.
        self._issued: dict[str, tuple[int, int, int]] = {}
        self._retry_maintenance_at = 0  # (ns) after a maintenance that failed outside a receive
        self._retry_dead_letters_at = 0  # (ns) after the dead-letter queue refused its letters
        self._oldest_segment = -1  # the state journal's first segment as ``_compact`` last saw it
        try:
            with self._hold():
                self._token = _channel_token(self.path, topic.broker.durable)
                self._load()
        except BaseException:
            self._closed = True
            self._close_files()
            # A topic deleted while the channel opened took its files one by one: what failed to
            # be read (a scanner of a directory gone, events missing) says so as QueueNotFoundError.
            topic.check_present()
            raise

    @property
    def consumer_id(self) -> str:
        """Who receives through this object: host, pid and a random part (a sharded queue gives
        its shards' channels its own)."""
        return self._consumer_id

    @consumer_id.setter
    def consumer_id(self, consumer_id: str) -> None:
        self._consumer_id = consumer_id
        self._consumer_key = consumer_id.encode()[:127]  # the key of its DELIVER events

    @property
    def token(self) -> str:
        """Random, made with the channel and kept in its directory: it tells this channel from one
        deleted and made again under its name, whose message ids (offsets) start again at 0. Its
        receipts carry it; ``journalq serve`` adds it to the message ids it gives."""
        return self._token

    @property
    def settings(self):  # noqa: ANN201 - the topic's QueueSettings
        return self.topic.settings

    def _receipt(self, offset: int, seq: int, stamp: int) -> str:
        return f"{offset}.{seq}.{self._token}.{stamp:x}"

    def _parse_receipt(self, receipt: str) -> tuple[int, int, int]:
        """(offset, delivery number, delivery stamp) of one of this channel's receipts (as it gives
        them out: after its ``receipt_prefix``)."""
        match = None
        if isinstance(receipt, str) and receipt.startswith(self.receipt_prefix):
            match = _RECEIPT.fullmatch(receipt, len(self.receipt_prefix))
        if match is None:
            raise ReceiptError(f"receipt {self._shown(receipt)} is not a receipt of this queue")
        if match[3] != self._token:
            raise ReceiptError(
                f"receipt {self._shown(receipt)} belongs to another queue or channel (or to an earlier one of "
                "this name)"
            )
        return int(match[1]), int(match[2]), int(match[4], 16)

    def _shown(self, receipt: object) -> str:
        """A receipt in an error, quoted."""
        return repr(receipt)

    def _hold(self) -> AbstractContextManager[Writer]:
        """Hold the state journal: no other process changes the channel until the block ends."""
        # The topic's presence is checked only when the catch-up found the segment deleted: an
        # fstat of its directory on every call would cost a few per cent of a receive.
        topic = self.topic
        if topic.gone:  # deleted by its own broker, which closed the writers
            topic.check_present()
        return held(self._writer, self._reopen_writer, topic.check_present)

    @contextmanager
    def _held_current(self) -> Iterator[int]:
        """The hold, with the other processes' events applied and maintenance run when due (the
        calls other than receive: see ``maintain_when_due``); gives the time (ns) it began."""
        with self._hold():
            self._apply_new()
            now = time.time_ns()
            self.maintain_when_due(now)
            yield now

    def _reopen_writer(self) -> Writer:
        """``held``'s reopen: a new writer, for one whose segment another process's compaction
        deleted (not one of a topic deleted and made again: that is not this channel's to act
        on), unless another thread made it already: one writer, whose mutex keeps the threads'
        changes of the state apart. A closed channel's stays closed."""
        with self._reopen_lock:
            if self._writer.closed and not self._closed:
                self.topic.check_present()
                self._writer = self._new_writer()
            return self._writer

    def _new_writer(self) -> Writer:
        try:
            # The topic's directory is not made again (a delete in another process took it since
            # it was checked): its state would be found by a queue made again with its name.
            writer = Writer(
                self.path, shared=True, sync=self.topic.broker.sync, segment_size=STATE_SEGMENT_SIZE,
                inside=self.topic.path, rolls_only=True,  # (its writers are all channels': none starts one early)
            )
        except FileNotFoundError:
            self.topic.check_present()  # QueueNotFoundError, when that is what happened
            raise
        writer.backlog_taker = self._take_backlog
        return writer

    # -- catching up with the state journal ---------------------------------------------------

    def _load(self) -> None:
        """Rebuild the state from the latest snapshot and the events after it."""
        self.state = ChannelState()
        segments = list_segments(self.path)
        first = segments[0].base if segments else 0
        self._applied = start = max(read_offset(self.path, "snapshot"), first)
        if start == first:
            self._seek_events(start)
        elif not self._apply_snapshot(start):
            # Under sync="none", a power cut can keep the pointer and lose the snapshot it names
            # (and events before it), and events appended since can take its place: what is
            # left is replayed, rather than a state begun mid-journal or the channel refused for
            # good. Deleted messages may come again (at least once), none is lost.
            log.warning(
                "%s points at offset %d, where the state journal (next offset %d) holds no snapshot: "
                "it was lost (a power cut under sync='none'?); the channel's state is rebuilt from offset %d",
                self.path / "ofs" / "snapshot.ofs", start, end_offset(self.path), first,
            )
            self._applied = first
            self._seek_events(first)
        self._apply_new(reload=False)

    def _apply_snapshot(self, offset: int) -> bool:
        """Where ``snapshot.ofs`` points: apply the SNAPSHOT event at ``offset`` and what was read
        with it, leaving the events scanner after them; False, with nothing applied, when no
        snapshot is there.

        A snapshot is the whole state: one found a little after ``offset`` serves as well, which
        is where pointers of versions before 2026-11-29 name it (after deletes written with it)."""
        try:
            self._seek_events(offset)
            assert self._events is not None
            batch = self._events.read_batch()
        except (OffsetOutOfRangeError, TruncatedError):
            return False  # past the end
        for i, message in enumerate(batch):
            if message.type == EventKind.SNAPSHOT:
                self._applied = message.offset
                self._apply_events(batch[i:] if i else batch)
                return True
        return False

    def _seek_events(self, offset: int) -> None:
        if self._events is not None:
            self._events.close()
        self._events = Scanner(self.path, offset)

    def _take_backlog(self, messages: list[Message]) -> None:
        """The writer's ``backlog_taker``: apply the others' events out of the lock, when this
        process comes to it after they did many changes (the hold applies what came after)."""
        if messages[0].offset <= self._applied:
            self._apply_events(messages)
        # Else this state does not reach them yet (a reopened writer): the hold reads them again.

    def _apply_events(self, messages: list[Message]) -> None:
        """Apply the events of ``messages`` (which begin at ``_applied`` or before it) not applied
        yet."""
        apply, applied = self.state.apply_record, self._applied
        offset = applied
        try:
            for offset, timestamp_ns, type_, key, value in messages:
                if offset >= applied:
                    apply(type_, key, value, timestamp_ns)
        except (ValueError, LookupError, TypeError, struct.error) as exc:
            # sej's messages carry no checksum: damage inside an event is framed as well as
            # before, and shows only here. Refused: skipping it could deliver again, or lose,
            # what it recorded.
            raise CorruptionError(
                f"a state event that cannot be applied ({type(exc).__name__}: {exc})", file=self.path, offset=offset
            ) from exc
        self._applied = max(applied, messages[-1].offset + 1)

    def _apply_new(self, reload: bool = True) -> None:
        """Under the hold: apply the events other processes appended since we last looked."""
        writer = self._writer
        if writer.backlog_lost:  # events applied out of the lock were taken back since
            writer.backlog_lost = False
            self._load()
            return
        end = writer.next_offset
        if end == self._applied:
            return  # nothing new (the hold has caught the writer up)
        caught = writer.caught_up
        if caught and caught[0].offset <= self._applied and caught[-1].offset + 1 == end:
            # What the others appended, as the writer's catch-up read it: not read again.
            self._apply_events(caught)
            return
        assert self._events is not None
        try:
            if self._events.offset != self._applied:
                # Skip what was applied already (our own events, and the others' taken from
                # the writer's catch-up) rather than read it back: the scanner may even be in
                # a segment that compaction deleted since.
                self._seek_events(self._applied)
            while batch := self._events.read_batch():
                self._apply_events(batch)
        except (OffsetOutOfRangeError, TruncatedError):
            pass
        if self._applied < self._writer.next_offset:
            # Compacted away under us (the events scanner's segments were deleted, or it could
            # not seek): start again from the newest snapshot.
            if not reload:
                raise JournalError("events missing from the state journal", file=self.path, offset=self._applied)
            self._load()

    def _record(self, records: list[Record], *, durable: bool = True, apply: bool = True) -> int:
        """Append events (under the hold, after its ``_apply_new``: no one else appends until it
        ends) and apply them, exactly as every other process will.

        Events applied already by ``_apply_unwritten`` go first, in the same write. ``durable=
        False`` for deliveries alone: under ``sync="always"`` they are not synced before the call
        returns, but with the next durable change (see ``receive``). ``apply=False``: the caller
        applies them its own way (``_compact``). Returns the events' time: deliveries' stamps."""
        now = time.time_ns()
        # ``Message(0, now, *record)`` without the NamedTuple's Python-level ``__new__``.
        messages = [_new_tuple(Message, (0, now, *record)) for record in records]
        unwritten = self._unwritten
        if unwritten:
            messages[:0] = unwritten
            durable = True  # deletes
        try:
            self._writer.append_many(messages, durable=durable)
        except BaseException:
            self._forget_unwritten()
            raise
        self._unwritten = []
        if apply:
            apply_record = self.state.apply_record
            for type_, key, value in records:
                apply_record(type_, key, value, now)
        self._applied += len(messages)
        return now

    def _apply_unwritten(self, records: list[Record], now: int) -> None:
        """Under the hold: apply durable events now and append them with the next ``_record``
        (which must come before the hold ends; ``_forget_unwritten`` if it cannot)."""
        apply = self.state.apply_record
        for type_, key, value in records:
            self._unwritten.append(_new_tuple(Message, (0, now, type_, key, value)))  # first: a failed apply reloads
            apply(type_, key, value, now)

    def _forget_unwritten(self) -> None:
        """Events applied but never appended (the step failed): the state is rebuilt from the
        journal, which does not have them."""
        if self._unwritten:
            self._unwritten = []
            self._load()

    def _maintain(self, now: int) -> None:
        """Under the hold, every ``task_gc_interval``: catch up with retention, collect finished
        tasks, publish the cursor, collect consumed segments; and compact when due."""
        state = self.state
        if _collection_due(state, self.settings, now):
            older = now - int(self.settings.task_gc_lifetime * 1e9)
            collector = self.topic.collected_by  # a shard's: its sharded topic, once for all shards
            try:
                self._record([Event(EventKind.COLLECT, 0, visible_at=older).encode()])
            except StorageError as exc:
                if exc.errno in _DISK_FULL and collector.gc_due():
                    # The gc frees the space that this event, and every change, waits for: run it
                    # anyway. (``_record`` rebuilt the state as the journal has it, without the
                    # deletes that failed with the event: their messages' segments stay.)
                    collector.gc()
                raise
            self.commit_cursor()
            if collector.gc_due():
                collector.gc()
            self._skip_deleted()  # after the gc: what it deleted, and what others' gc did
        if _compaction_due(state):
            self._compact()

    def maintain_when_due(self, now: int | None = None) -> None:
        """``_maintain`` when due, for the calls other than receive (which runs it itself): a
        queue's send, stats, task reads, ... so that finished tasks and consumed segments are
        collected when no one receives (zkmq's producers collect too), and a compaction this
        process saw due is made (or found made by another: ``upkeep_due`` then clears, which
        the server reads before each batch, its sends too). A clock check until then.
        ``now``: called under the hold, after ``_apply_new``; None: it takes the hold.

        What the call does does not depend on it: a failure is logged and tried again an
        interval later (a receive, which runs it too, raises it)."""
        if now is None and not self._own_upkeep_due(time.time_ns()):
            return  # (the common case first: a queue's send checks this, ~0.3 µs)
        try:
            if now is None:
                # Settings another process changed first: what a collection deletes by them
                # cannot be undone (a receive took them up already).
                self.topic.refresh_settings()
                with self._hold():
                    self._apply_new()
                    self._maintain(time.time_ns())  # (due as this process knew: checked again)
            elif self._own_upkeep_due(now):
                self._maintain(now)
        except (JournalError, OSError) as exc:
            interval = self.settings.task_gc_interval
            self._retry_maintenance_at = time.time_ns() + int(interval * 1e9)
            log_failed_collection(self.path, interval, exc)

    def upkeep_due(self) -> bool:
        """Whether a call now would maintain, compact or collect too (``TopicDirectory.upkeep_due``):
        a send, a receive, a delete. (As far as this process knows, read without the hold.)"""
        return self._own_upkeep_due(time.time_ns()) or self.topic.upkeep_due()

    def _own_upkeep_due(self, now: int) -> bool:
        """``upkeep_due`` of the channel's own state: a collection or a compaction (a snapshot
        of 200,000 deliveries in flight holds the lock 0.2-0.3 s); after a failed one, not until
        an interval has passed (``maintain_when_due``)."""
        return self._maintenance_due(now) or (now >= self._retry_maintenance_at and _compaction_due(self.state))

    def _maintenance_due(self, now: int) -> bool:
        """Whether a collection is due, as far as this process knows."""
        return _collection_due(self.state, self.settings, now) and now >= self._retry_maintenance_at

    def _skip_deleted(self) -> None:
        """Forget messages that retention deleted from the topic before this channel took them."""
        first = self.topic.first_offset()
        if self.state.cursor < first:
            self._record([Event(EventKind.SKIP_TO, first).encode()])

    def _skip_deleted_taken(
        self, picks: list[tuple[Message, Envelope, int]], dead: list[tuple[Message, Envelope, int]]
    ) -> None:
        """``_skip_deleted``, under a receive that took messages (``picks``, ``dead``) before it
        found that retention deleted some: what it took of those (read ahead, or cached by the
        topic) is dropped, since the skip finished them: their deliveries would not be recorded,
        nor their receipts work."""
        self._skip_deleted()
        cursor = self.state.cursor
        picks[:] = [pick for pick in picks if pick[0].offset >= cursor]
        dead[:] = [letter for letter in dead if letter[0].offset >= cursor]

    def _compact(self) -> None:
        durable = self.topic.broker.durable
        state = self.state
        self._record([Event(EventKind.SNAPSHOT, 0, payload=state.snapshot()).encode()], apply=False)
        state.snapshot_appended()
        # The last event appended (after any deletes ``_record`` wrote first): the pointer names
        # the snapshot itself, which ``_load`` checks.
        snapshot_at = self._writer.next_offset - 1
        if durable:
            # On stable storage before the pointer to it and the deletes below: a hold syncs
            # at its end (and a group policy later), and a power cut in between would keep them
            # and lose it, and with it the state.
            self._writer.sync()
        try:
            # In place: its readers hold the hold too (``_load``), and a new file and a rename
            # cost more than all the rest of a small compaction.
            overwrite_offset(self.path / "ofs" / "snapshot.ofs", snapshot_at, sync=durable, inside=self.topic.path)
        except OSError as exc:
            if exc.errno in _DISK_FULL:
                return  # the pointer names an older snapshot, whose segments all stay: no error
            raise
        if self._writer.segment.base == self._oldest_segment:
            return  # the journal is one segment (a new one comes only after it): none to delete
        segments = list_segments(self.path)
        for segment, following in zip(segments, segments[1:]):
            if following.base > snapshot_at:
                self._oldest_segment = segment.base
                break
            remove_segment(segment)
        else:
            self._oldest_segment = segments[-1].base if segments else -1

    def commit_cursor(self) -> bool:
        """Publish the cursor as the sej reader offset ``TOPIC/ofs/NAME.ofs`` (for the topic's gc).

        False when the disk is full (the commit writes a new file): the cursor published before
        stays, which only makes other processes' gc keep more, and the commit is tried again
        next time. Not an error: the gc, which frees the space, must go on (``Topic.gc``)."""
        if self.state.cursor == self._committed_cursor:
            return True  # published already (read without the lock, which costs more than this)
        # One commit at a time: a topic's gc publishes its channels' cursors from whichever
        # thread runs it, and of two commits at once the older cursor could be renamed in last.
        with self._commit_lock:
            cursor = self.state.cursor
            if cursor != self._committed_cursor:
                try:
                    write_offset(
                        self.topic.path / "ofs" / f"{self.name}.ofs", cursor, sync=False, inside=self.topic.path
                    )
                except OSError as exc:
                    if exc.errno in _DISK_FULL:
                        return False
                    raise
                self._committed_cursor = cursor
        return True

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
        """Receive up to ``max_messages``, oldest available first, each hidden from every other
        consumer for ``visibility_timeout`` seconds (the queue's by default) unless deleted.
        Of a FIFO group none of whose messages is in flight, its messages in order, up to its
        first that cannot go now (delayed, or not for these filters): the group is then with
        this consumer alone, as SQS FIFO's receives give it. ``one_per_group``: at most one
        message of a group (for a caller that shares what it received out among consumers,
        each of whom must hold a group alone).

        ``wait`` (the queue's ``receive_wait`` by default) is long polling: with nothing
        available, wait up to that many seconds and return as soon as something arrives.
        ``filters``: this consumer's zkmq filters, ``{name: value}`` or ``{name: (value,
        method)}`` with method ``absolute`` or ``at_least``; None takes every message.

        ``delete``: receipts to delete first, in the same step (a consumer loop's "done with
        these, give me more": one lock, one append and, under ``sync="always"``, one sync for
        both). All or nothing: if one of them no longer names its delivery (or is not a receipt
        of this channel), ``ReceiptError`` is raised, nothing is deleted and nothing received;
        ``delete_many`` then tells which. The deletes are durable when the call returns, as with
        ``delete``.

        Under ``sync="always"``, deliveries alone are not synced: losing one in a crash only
        means the message is delivered again, which at-least-once delivery allows, and its
        receipt can never act on that later delivery (see ``Delivery.stamp``). They reach
        stable storage with the next synced change of the channel (any delete, change of
        visibility, ...), which syncs everything appended before it.
        """
        self.topic.refresh_settings()
        hide, wait, wanted = receive_arguments(self.settings, max_messages, visibility_timeout, wait, filters, delete)
        deadline = time.monotonic() + wait
        watch: DirectoryWatch | None = None
        try:
            while True:
                try:
                    got, wake_at = self._receive_now(max_messages, hide, wanted, delete, one_per_group)
                except ReceiptError:
                    raise
                except Exception:
                    if self._closed:  # closed under this receive (a long poll, most likely)
                        return self._closed_under_receive()
                    # Deleted under this receive by a delete that did not close this object (another
                    # process's, or one that began before this handle was opened): its files went
                    # one by one, and what failed to be read says so as QueueNotFoundError.
                    self.topic.check_present()
                    raise
                delete = ()  # done in the first attempt
                if got or not wait:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return got
                if watch is None:
                    watch = self._watch()
                    continue  # look again: something may have come before the watch began
                if wake_at is not None:
                    remaining = min(remaining, max(0.0, (wake_at - time.time_ns()) / 1e9))
                watch.wait(remaining)
                if self._closed:
                    return self._closed_under_receive()
        finally:
            if watch is not None:
                watch.close()

    def surely_empty(self) -> bool:
        """Whether the channel has nothing to give, as far as this process can tell without its
        lock: every message it has seen is finished (its cursor is at its frontier) and the topic
        has none after them. Its state may lag the other processes' changes, which only finish
        more: a lagging one says False more often, never True wrongly. Nor once another process
        deleted the queue: the topic's segment read to its end is found unlinked then (as
        ``_tail_lost``), and the hold says that the queue was deleted."""
        state = self.state
        frontier = state.frontier
        if state.cursor < frontier:
            return False
        # Read ahead and never taken (what is below the frontier was taken): not empty. A slice,
        # since another thread may empty the list meanwhile; the look-ahead's lock decides.
        last = self._ahead[-1:]
        if last and last[0].offset >= frontier or not self._ahead_lock.acquire(blocking=False):
            return False
        try:
            self._read_ahead(frontier)  # drops what was taken, reads what came since
            return not self._ahead and not self._tail_lost and self._damage is None
        finally:
            self._ahead_lock.release()

    def pass_by(self) -> None:
        """What a receive that finds nothing does besides, for one that passed the channel by
        (``surely_empty``) without its lock: collect when due, and publish the cursor (for the
        topic's gc, and a sharded queue's consumers that look without opening the channel)."""
        self.maintain_when_due()
        self.commit_cursor()

    def _watch(self) -> DirectoryWatch:
        """What a long poll sleeps on: the topic's segments and the channel's state journal."""
        return DirectoryWatch(self.topic.path / "jnl", self.path / "jnl")

    def _closed_under_receive(self) -> list[ReceivedMessage]:
        """A receive whose channel was closed while it waited: the queue was deleted, or the broker
        let it go to open it anew (after a storage failure). Nothing was received."""
        if self.topic.gone or not self.topic.path.is_dir():
            raise QueueNotFoundError(f"queue or topic {self.topic.name!r} was deleted")
        return []

    def _receive_now(
        self,
        max_messages: int,
        hide: float,
        wanted: dict[str, tuple[str, filtering.Method]] | None,
        delete: Sequence[str] = (),
        one_per_group: bool = False,
    ) -> tuple[list[ReceivedMessage], int | None]:
        """One attempt; also returns when something hidden comes back."""
        if not delete and self.surely_empty():
            # Nothing to give and nothing to delete: no hold. An idle poller's receives take no
            # lock that the consumers at work wait for, and cost a few system calls. The queue
            # deleted meanwhile, by any process, is said as the hold would (from the rename of
            # its directory on, which the hold sees only once the lock's file is removed).
            self.topic.check_present()
            self.pass_by()
            return [], None
        # Read new topic messages before taking the lock (the topic's messages never change):
        # other processes wait for this channel's lock, not for this read.
        # Topped up by half a look-ahead at a time, not by each receive's few messages: one read
        # per ~500 messages (what came meanwhile is read under the hold only when needed).
        if len(self._ahead) < _LOOK_AHEAD // 2 and self._ahead_lock.acquire(blocking=False):
            try:
                self._read_ahead(self.state.frontier)
            finally:
                self._ahead_lock.release()
        with self._hold():
            try:
                picks, wake_at, stamp, far = self._receive_held(max_messages, hide, wanted, delete, one_per_group)
            except BaseException:
                self._forget_unwritten()
                raise
        if far is not None:
            # Nothing to take in the look-ahead, and more beyond it: read on out of the hold, then
            # take what was found in a second one (see ``_scan_far``).
            found, blocked, far_wake = self._scan_far(far, wanted, max_messages, one_per_group)
            if far_wake is not None:
                wake_at = far_wake if wake_at is None else min(wake_at, far_wake)
            if found:
                with self._hold():
                    try:
                        picks, _, stamp, _ = self._receive_held(
                            max_messages, hide, wanted, (), one_per_group, far=(found, blocked)
                        )
                    except BaseException:
                        self._forget_unwritten()
                        raise
        if not picks:
            if not delete:  # (deletes given were done: the next receive says it)
                self._check_damage()
            return [], wake_at
        metadata = self.state.metadata
        # Every receipt of this receive ends alike: the part after offset and delivery number,
        # made once (``_receipt`` makes the same strings).
        tail = self._receipt(0, 0, stamp)[3:]
        issued = self._issued
        if len(issued) > ISSUED_MAX:
            issued.clear()  # receipts given out long ago are parsed again, that is all
        received = []
        prefix = self.receipt_prefix  # a shard's channel: ids and receipts name its shard
        for m, e, count in picks:
            offset = m.offset
            id_ = str(offset)  # message_id(offset), and the receipt's first part (one conversion)
            receipt = f"{prefix}{id_}.{count}{tail}"
            issued[receipt] = (offset, count, stamp)
            if e is _PLAIN:
                body, attributes, filters = m.value, {}, {}
            else:
                body, attributes, filters = e.body, e.attributes, e.filters
            # ``ReceivedMessage(...)`` without its Python-level ``__new__`` (one per message).
            received.append(
                _new_tuple(
                    ReceivedMessage,
                    (
                        prefix + id_,
                        receipt,
                        body,
                        attributes,
                        count,
                        m.timestamp_ns,
                        offset,
                        e.group_id,
                        e.dedup_id,
                        filters,
                        metadata.get(offset, e.metadata),
                        e.source,
                    ),
                )
            )
        return received, wake_at

    def _check_damage(self) -> None:
        """For a receive that found nothing to give: the ``CorruptionError`` (file, byte, offset)
        of damage the topic's reading met, once every message before it was taken. (Messages
        before it that wait, delayed or held back by their group, go out first.)"""
        damage = self._damage
        if damage is not None and (damage.offset is None or damage.offset <= self.state.frontier):
            raise CorruptionError(
                f"{damage.reason}; to go on past it, `journalq check` names where whole messages start "
                "again, and `skip_to` (`journalq queue skip`) moves the channel there",
                file=damage.file, position=damage.position, offset=damage.offset, timestamp_ns=damage.timestamp_ns,
            )

    def _receive_held(
        self,
        max_messages: int,
        hide: float,
        wanted: dict[str, tuple[str, filtering.Method]] | None,
        delete: Sequence[str],
        one_per_group: bool,
        far: tuple[list[Message], set[str]] | None = None,
    ) -> tuple[list[tuple[Message, Envelope, int]], int | None, int, _Far | None]:
        """``_receive_now``'s work under the hold: (message, envelope, delivery number) of each
        message delivered, when to look again, the deliveries' stamp, and, when nothing was
        taken and the look-ahead was not all there is, where ``_scan_far`` reads on.

        ``far``: the second hold of such a receive: the messages that ``_scan_far`` found past
        the look-ahead and the FIFO groups held back before them;
        the messages already waiting are not looked at again (the first hold did)."""
        settings = self.settings
        enums = settings.enums
        max_count = moving_on_after(settings)
        self._apply_new()
        now = time.time_ns()
        state = self.state
        if delete:
            outcomes, current = self._current(delete, finishing=True)
            if len(current) < len(outcomes):
                error = next(error for error in outcomes if error is not None)
                raise ReceiptError(f"nothing deleted, nothing received: {error}")
            # Applied now, so that nothing they finish goes out again; appended with what this
            # receive records next (one write; the hold's end syncs once for everything).
            self._apply_unwritten(_finishing(current), now)
        if _collection_due(state, settings, now) or _compaction_due(state):
            self._maintain(now)
        if state.cursor < self.topic.first_kept:  # a gc of this process deleted messages unfinished
            self._skip_deleted()
        state.expire(now)
        blocked = set(state.group_holds)
        picks: list[tuple[Message, Envelope, int]] = []
        dead: list[tuple[Message, Envelope, int]] = []
        # Offsets finished unseen: messages for another channel, and those past retention.
        passed: list[int] = []
        kept_from = retention_horizon(settings, now)
        wake_at = state.next_expiry()  # (which also prunes the deliveries finished since)
        # Made at the first envelope met: a receive of plain messages makes none (``consider``).
        decide: Callable[[Message, Envelope], int] | None = None
        # This consumer's filter misses still known (none without filters): passed over.
        missed = [] if wanted is None else [run for run in self._missed_runs(wanted) if run.wake > now]

        def consider(message: Message, count: int) -> bool:
            """Take ``message`` if it may go to this consumer now; True when full."""
            nonlocal wake_at, decide
            if message.type != _ENVELOPE_TYPE:
                # Plain: no channel, group, delay or filters; of ``decide``'s rules, retention only.
                if 0 < message.timestamp_ns < kept_from:
                    passed.append(message.offset)
                    return False
                env = _PLAIN
            else:
                env = self._envelope(message)
                if decide is None:
                    decide = _decider(now, kept_from, self.name, blocked, wanted, enums)
                verdict = decide(message, env)
                if verdict:
                    if verdict == _GONE:
                        passed.append(message.offset)
                    elif verdict > 0:
                        wake_at = verdict if wake_at is None else min(wake_at, verdict)
                    return False
            group = env.group_id
            if max_count is not None and count >= max_count:
                if now < self._retry_dead_letters_at:  # the dead-letter queue failed lately
                    if group is not None:
                        blocked.add(group)  # it stays first in its group, undelivered
                    return False
                dead.append((message, self._envelope(message) if env is _PLAIN else env, count))
                return False
            # A group's next messages may follow it in this receive (SQS FIFO's batches: the
            # group is then in flight with one consumer, in order); ``blocked`` holds the group
            # back once one of its messages is refused.
            picks.append((message, env, count + 1))
            if one_per_group and group is not None:
                blocked.add(group)
            return len(picks) >= max_messages

        full = False
        reach: _Far | None = None
        if far is not None:
            # Those still never seen: another process may have taken some since (the frontier
            # is then past them); the groups held back before them stay held back.
            blocked |= far[1]
            for message in far[0]:
                if message.offset >= state.frontier and consider(message, 0):
                    break
        else:
            if state.ready or state.skipped:
                offsets: Iterable[int]
                runs: list[_Run] = list(heapq.merge(self._asleep, missed)) if missed else self._asleep
                if runs:

                    def sleeping(run: _Run) -> None:
                        """``_awake`` passed over ``run``: when it is asleep, look again when it
                        wakes (a filter miss never goes to this consumer)."""
                        nonlocal wake_at
                        if type(run) is _Asleep:
                            wake_at = run.wake if wake_at is None else min(wake_at, run.wake)

                    offsets = self._awake(state, runs, now, sleeping)
                else:
                    offsets = list(state.candidates())
                for offset in offsets:
                    message = self.topic.message(offset)
                    if message is None:
                        self._skip_deleted_taken(picks, dead)  # retention deleted it
                        continue
                    if consider(message, state.receive_count(offset)):
                        full = True
                        break
            if not full:
                plain_up_to = max_messages if wanted is None else 0
                with self._ahead_lock:
                    self._take_new(state.frontier, consider, picks, plain_up_to, kept_from, missed)
                    if self._tail_lost:
                        # Retention (another process's gc) deleted what the frontier was to read:
                        # skipped now, and the rest taken, rather than nothing until this
                        # process's own collection comes due.
                        self._tail_lost = False
                        frontier = state.frontier
                        self._skip_deleted_taken(picks, dead)
                        if state.frontier != frontier and len(picks) < max_messages:
                            self._take_new(state.frontier, consider, picks, plain_up_to, kept_from, missed)
                    ahead = self._ahead
                    if not picks and len(ahead) >= _LOOK_AHEAD:
                        reach = _Far(state.frontier, ahead[-1].offset + 1, set(blocked))
        moved = bool(dead) and self._send_dead(dead)
        if dead and not moved:
            # Kept here: what their groups have after them waits for them, as above.
            kept = {e.group_id for _, e, _ in dead if e.group_id is not None}
            if kept:
                picks[:] = [pick for pick in picks if pick[1].group_id not in kept]
        visible_at = now + int(hide * 1e9)
        consumer = self._consumer_key
        plain = [m.offset for m, e, _ in picks if e.group_id is None]
        if len(plain) > 1:
            counts = [count for _, e, count in picks if e.group_id is None]
            records = [deliver_many_record(plain, counts, visible_at, consumer)]
            if len(plain) < len(picks):
                records += [
                    deliver_record(m.offset, count, visible_at, consumer, e.group_id)
                    for m, e, count in picks
                    if e.group_id is not None
                ]
        else:
            records = [deliver_record(m.offset, count, visible_at, consumer, e.group_id) for m, e, count in picks]
        if moved:
            records += [Event(EventKind.DEAD, m.offset, count).encode() for m, _, count in dead]
        if passed:
            records += finish_records(passed, [0] * len(passed))
        stamp = 0
        if records or self._unwritten:
            # Deliveries alone need no sync (see ``receive``); deletes and dead letters do.
            stamp = self._record(records, durable=moved)
        if not picks and state.cursor == state.frontier:
            # Everything seen is finished: published now, not at the next collection, so that
            # whoever looks without the lock (a sharded queue's other consumers, another
            # process's gc) knows it at once. A write only when the cursor moved.
            self.commit_cursor()
        return picks, wake_at, stamp, reach

    def _take_new(
        self,
        frontier: int,
        consider: Callable[[Message, int], bool],
        picks: list[tuple[Message, Envelope, int]],
        plain_up_to: int,
        kept_from: int,
        missed: Sequence[_Missed] = (),
    ) -> None:
        """Under the hold: offer ``consider`` the messages from the frontier on, oldest first,
        until it is full, up to a look-ahead's worth; what was read ahead (out of the hold) first,
        then what came since. (Past the look-ahead, a receive that took nothing reads on with
        ``_scan_far``, out of the hold.) Those in ``missed`` (runs still known of the consumer's
        filter misses) are passed over: ``consider`` would refuse each.

        ``plain_up_to`` (``max_messages`` for a consumer without filters, else 0): plain
        messages never seen go out as they are (no delay, group, filters, and a first delivery
        cannot be a dead letter), so a run of them is taken whole, without ``consider``, until
        ``picks`` holds that many, when every one of them is within retention (from ``kept_from``
        on). Every one: timestamps are the writers' clocks, so a message stored after another
        can be older (a writer whose clock is behind, or stepped back)."""
        ahead = self._read_ahead(frontier, 0)
        start = 0
        if plain_up_to:
            want = plain_up_to - len(picks)
            run = ahead[:want]
            if run and _ENVELOPE_TYPE not in map(_type_of, run) and min(map(_timestamp_of, run)) >= kept_from:
                picks += zip(run, repeat(_PLAIN), repeat(1))
                if len(run) == want:
                    return
                start = len(run)
        offered = ahead[start:] if start else ahead
        for message in _outside(offered, missed) if missed else offered:
            if consider(message, 0):
                return
        # What the look-ahead lacks is read here, under the hold, only as far as ``consider``
        # takes (``_HELD_READ`` at a time); the rest of a look-ahead is read out of the hold,
        # by the next receive. (A consumer that others overran, its look-ahead all taken by
        # them, read a whole one here while they waited for the lock.)
        while more := self._read_ahead(frontier, min(len(ahead) + _HELD_READ, _LOOK_AHEAD)):
            for message in _outside(more, missed) if missed else more:
                if consider(message, 0):
                    return

    def _read_ahead(self, frontier: int, most: int = _LOOK_AHEAD) -> list[Message]:
        """Drop from ``_ahead`` what is below ``frontier``, then read on until it holds ``most``
        messages (or the topic ends). Returns the messages it read, or with ``most=0`` all of
        ``_ahead``. (Under ``_ahead_lock``.)

        What was read but not taken stays in ``_ahead`` for the next receive, so a consumer
        reads the topic once, in order; it seeks only when other processes moved the frontier
        past what it had read.
        """
        ahead = self._ahead
        if ahead and ahead[0].offset < frontier:
            # Drop what was taken since: in place, so a receive of one costs no copy of the rest.
            del ahead[: frontier - ahead[0].offset]
        if most == 0:
            return ahead
        start = len(ahead)
        if start < most:
            tail = self._tail
            position = ahead[-1].offset + 1 if ahead else frontier
            self._damage = None  # (read again: gone once retention or a repair took it away)
            try:
                if tail is None or tail.offset != position:
                    self._drop_tail()
                    tail = self._tail = Scanner(self.topic.path, position)
                # read_batch gives one decoded chunk at a time: read on up to the look-ahead
                while len(ahead) < most and (more := tail.read_batch(most - len(ahead))):
                    self.topic.remember(more)
                    ahead.extend(more)
            except CorruptionError as exc:
                # Damage in the topic (sej's messages carry no checksum; framing broken, say):
                # the whole messages before it were read and still go out. The error is the
                # receive's that finds nothing else to give (``_check_damage``); until then,
                # each read tries again from the damaged message, with a new scanner.
                self._damage = exc
                self._drop_tail()
            except (OffsetOutOfRangeError, TruncatedError):
                # Retention deleted messages this channel had not read: ``_skip_deleted`` skips
                # them (the receive, under the hold, told by ``_tail_lost``).
                self._tail_lost = True
                self._drop_tail()
        return ahead[start:]

    def _drop_tail(self) -> None:
        """Close the scanner that reads the topic ahead, if any: the next read opens one where it
        is to read. (Under ``_ahead_lock``.)"""
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    @staticmethod
    def _awake(
        state: ChannelState, runs: list[_Run], now: int, sleeping: Callable[[_Run], None]
    ) -> Iterator[int]:
        """``state.candidates()``, oldest first, but for the skipped offsets in a run (by start:
        ``_Asleep``, or the consumer's ``_Missed``) still asleep at ``now``: the run is passed
        over whole, and ``sleeping`` told of it when the walk comes to it (lazily, in order, as
        ``consider`` sees the offsets: a generator).

        Skipped offsets are looked up one at a time in the set, which may change under the walk
        (``_skip_deleted``); ready ones are all given (a delivered message was not asleep; one
        the filters miss went to another consumer, and ``consider`` refuses it)."""
        ready, skipped = list(state.ready), state.skipped
        r = i = position = 0
        while True:
            at = skipped.bisect_left(position)
            offset = skipped[at] if at < len(skipped) else None
            while i < len(ready) and (offset is None or ready[i] < offset):
                yield ready[i]
                i += 1
            if offset is None:
                return
            while r < len(runs) and runs[r].end <= offset:
                r += 1
            if r < len(runs) and runs[r].start <= offset and runs[r].wake > now:
                sleeping(runs[r])
                position = runs[r].end
                r += 1
                continue
            yield offset
            position = offset + 1

    def _scan_far(
        self, far: _Far, wanted: dict[str, tuple[str, filtering.Method]] | None, max_messages: int,
        one_per_group: bool,
    ) -> tuple[list[Message], set[str], int | None]:
        """Out of the hold: read the topic past the look-ahead, from ``far.start``, to its end or
        until ``max_messages`` are found that this consumer may take now (never seen, so no
        state but the FIFO groups held back decides); returns them, the groups held back before
        them, and when a delayed message looked at becomes visible.

        Why out of the hold: the look-ahead (``_LOOK_AHEAD`` messages, kept in memory) serves
        every receive that finds something in it; a consumer behind more than that of messages
        it cannot take (filtered out, delayed, of a FIFO group in flight) is served by this scan,
        which may read the whole topic. Topic messages never change, so the reading needs no
        hold; only the decision does, and the second hold of ``_receive_now`` makes it again for
        the messages found (``_receive_held``'s ``far``), skipping any another process took
        meanwhile. Nothing read is kept but what was found, runs of delayed messages
        (``_Asleep``), and runs of messages that this consumer's filters do not match
        (``_Missed``, kept for those filters): later scans, the look-ahead's offer (of misses)
        and the walk of the offsets that a far delivery leaves skipped pass over those whole
        until they wake, instead of reading each again."""
        now = time.time_ns()
        settings = self.settings
        rules = (settings.retention_seconds, settings.enums)
        kept_from = retention_horizon(settings, now)
        retention = None if settings.retention_seconds is None else int(settings.retention_seconds * 1e9)
        blocked = set(far.blocked)
        decide = _decider(now, kept_from, self.name, blocked, wanted, settings.enums)
        asleep = [run for run in self._asleep if run.wake > now]
        missed = [] if wanted is None else [run for run in self._missed_runs(wanted) if run.wake > now]
        known: list[_Run] = list(heapq.merge(asleep, missed)) if missed else asleep
        asleep_made, missed_made = _RunMaker(_Asleep), _RunMaker(_Missed)
        found: list[Message] = []
        taking: set[str] = set()  # the groups of those found
        wake_at: int | None = None
        k = 0

        def step(message: Message) -> int:
            """0 to read on, -1 when enough were found, or the offset to go on from (past a run
            known to be asleep, or missed)."""
            nonlocal k, wake_at
            offset = message.offset
            while k < len(known) and known[k].end <= offset:
                k += 1
            if k < len(known) and known[k].start <= offset:
                run = known[k]
                if type(run) is _Missed:
                    asleep_made.end(offset)
                    missed_made.extend(run.start, run.wake)  # (a run made goes on through it)
                else:
                    missed_made.end(offset)
                    asleep_made.extend(run.start, run.wake)
                    wake_at = run.wake if wake_at is None else min(wake_at, run.wake)
                return run.end
            env = _PLAIN if message.type != _ENVELOPE_TYPE else envelope.decode(message.type, message.value)
            verdict = decide(message, env)
            group = env.group_id
            if verdict == _MISS and group is None:
                sent = message.timestamp_ns
                # Until it passes retention: then a receive must finish it unseen.
                missed_made.extend(offset, sent + retention if sent > 0 and retention is not None else _NEVER)
            else:
                missed_made.end(offset)
            if verdict > 0:
                if group is None:
                    asleep_made.extend(offset, verdict)
                else:
                    asleep_made.end(offset)
                wake_at = verdict if wake_at is None else min(wake_at, verdict)
                return 0
            asleep_made.end(offset)
            if verdict != _TAKE:
                return 0  # (those past retention or for another channel: finished by a receive's walk)
            if offset < far.start:
                # The look-ahead's own were offered under the hold, and not taken: held back.
                if group is not None:
                    blocked.add(group)
                return 0
            found.append(message)  # (and its group's next ones after it, as ``consider``)
            if group is not None:
                taking.add(group)  # not held back: it goes out
                if one_per_group:
                    blocked.add(group)
            return -1 if len(found) >= max_messages else 0

        with self._ahead_lock:  # the look-ahead's messages, for its runs (read ahead already)
            ahead = self._ahead
            first = ahead[0].offset if ahead else far.start
            window = ahead[max(0, far.frontier - first) : max(0, far.start - first)]
        position = far.frontier
        for message in window:
            if message.offset >= position and (position := step(message) or message.offset + 1) < 0:
                break
        else:
            # On from the look-ahead's last message read (or all of it from the frontier, when
            # another thread's receive has dropped it meanwhile).
            scanner: Scanner | None = None
            try:
                while position >= 0:
                    if scanner is None or scanner.offset != position:
                        if scanner is not None:
                            scanner.close()
                        scanner = Scanner(self.topic.path, position)
                    batch = scanner.read_batch()
                    if not batch:
                        asleep_made.end(position)
                        missed_made.end(position)
                        break
                    for message in batch:
                        position = step(message) or message.offset + 1
                        if position < 0 or position != message.offset + 1:
                            break
            except (OffsetOutOfRangeError, TruncatedError):
                pass  # retention deleted what was to be read: a receive under the hold skips it
            finally:
                if scanner is not None:
                    scanner.close()
        if asleep_made.made or len(asleep) != len(self._asleep) or missed_made.made:
            with self._asleep_lock:
                cursor = self.state.cursor
                if asleep_made.made or len(asleep) != len(self._asleep):
                    self._asleep = _kept_runs(self._asleep, asleep_made.made, now, cursor)  # type: ignore[assignment]
                if wanted is not None and missed_made.made:
                    kept = _kept_runs(self._missed_runs(wanted), missed_made.made, now, cursor)
                    self._remember_missed(wanted, rules, kept)  # type: ignore[arg-type]
        return found, blocked - taking, wake_at

    def _missed_runs(self, wanted: dict[str, tuple[str, filtering.Method]]) -> list[_Missed]:
        """The ``_Missed`` runs known of a consumer with filters ``wanted``, by start (none once
        retention or the filters' enums changed since they were found)."""
        settings = self.settings
        if not self._missed or self._missed_rules != (settings.retention_seconds, settings.enums):
            return []
        return self._missed.get(_filters_key(wanted), [])

    def _remember_missed(
        self,
        wanted: dict[str, tuple[str, filtering.Method]],
        rules: tuple[float | None, dict[str, tuple[str, ...]]],
        runs: list[_Missed],
    ) -> None:
        """Under ``_asleep_lock``: keep ``runs`` as the ``_Missed`` runs of filters ``wanted``,
        found under ``rules`` (retention, enums), forgetting those of other rules, and beyond
        ``_MISSED_FILTER_SETS`` sets of filters, those whose runs were stored longest ago."""
        remembered = dict(self._missed) if rules == self._missed_rules else {}
        key = _filters_key(wanted)
        remembered.pop(key, None)  # (put back last: the latest used)
        remembered[key] = runs
        while len(remembered) > _MISSED_FILTER_SETS:
            del remembered[next(iter(remembered))]
        self._missed, self._missed_rules = remembered, rules

    def _envelope(self, message: Message) -> Envelope:
        if message.type != envelope.ENVELOPE_TYPE:
            return Envelope(message.value)
        env = self._envelopes.get(message.offset)
        if env is None:
            env = self._envelopes[message.offset] = envelope.decode(message.type, message.value)
            if len(self._envelopes) > _ENVELOPES_KEPT:
                self._envelopes.popitem(last=False)
        return env

    def _send_dead(self, dead: list[tuple[Message, Envelope, int]]) -> bool:
        """Send dead letters to the dead-letter queue, made when missing. Through its topic, not
        ``broker.queue``: that would give a topic with channels of its own a channel ``default``,
        which takes every message of it and holds its gc for ever.

        False when the dead-letter queue cannot take them (its settings file damaged, its
        storage failing, ...): as a queue whose dead-letter queue is broken should, this one
        goes on delivering its other messages, and keeps the dead letters, undelivered (they
        had their receives) and not lost, first in their FIFO groups. The failure is logged,
        naming its cause (and the file), and the move tried again ``task_gc_interval`` later,
        not at every receive. (A move cut short, a sharded dead-letter queue's, say, is sent
        again whole: its deduplication ids drop what arrived.)"""
        queue_name = self.settings.dead_letter_queue
        assert queue_name is not None
        letters = [
            resend(
                env,
                metadata=self.state.metadata.get(m.offset, env.metadata),
                source=dead_letter_source(
                    self.topic.name,
                    self.name,
                    self.receipt_prefix + message_id(m.offset),  # the id as the caller knows it
                    count,
                    env,
                    m.timestamp_ns,
                ),
                dedup_id=self._dead_letter_id(m.offset),
            )
            for m, env, count in dead
        ]
        broker = self.topic.broker
        try:
            try:
                open_dead_letter_queue(broker.topic, queue_name, self.settings).send_many(letters)
            except QueueNotFoundError:
                # Deleted by another process since this one opened it (the topic now knows): made
                # again, as a missing one is, rather than failing this receive once.
                open_dead_letter_queue(broker.topic, queue_name, self.settings).send_many(letters)
        except (Error, OSError) as exc:
            interval = self.settings.task_gc_interval
            self._retry_dead_letters_at = time.time_ns() + int(interval * 1e9)
            log_dead_letters_kept(f"{self.topic.name}/{self.name}", len(letters), queue_name, interval, exc)
            return False
        return True

    def _dead_letter_id(self, offset: int) -> str:
        """The deduplication id of the dead letter of message ``offset``: a process killed after
        it moved the message but before it recorded the move (the DEAD event, appended next)
        leaves it to move again; the dead-letter queue drops that copy (within its dedup_window).
        Named by the topic's directory: each shard of a sharded queue has its own offsets (by
        the queue's name, only their channels' random tokens told two shards' apart)."""
        identity = f"{self.topic.path.name}/{self.name}/{self._token}/{offset}"
        return "dead-letter:" + hashlib.sha256(identity.encode()).hexdigest()[:32]

    # -- acting on receipts -----------------------------------------------------------------

    def delete(self, receipt: str) -> None:
        """Finish the message of this delivery: it will not be delivered again."""
        _raise(self.delete_many([receipt])[0])

    def delete_many(self, receipts: list[str]) -> list[ReceiptError | None]:
        """Delete several; for each receipt, None or the error that kept it from being deleted."""
        check_receipt_list("receipts", receipts)
        return self._act(
            receipts,
            lambda current, now: _finishing(current),
            finishing=True,
        )

    def change_visibility(self, receipt: str, seconds: float) -> None:
        """Hide the message of this delivery for ``seconds`` from now (0: available at once).
        ``StaleReceiptError`` once the message was delivered again, or when it came back (its
        visibility ran out) and another receive has taken its FIFO group since."""
        _raise(self.change_visibility_many([(receipt, seconds)])[0])

    def change_visibility_many(
        self, changes: list[tuple[str, float]], *, within: float | None = None
    ) -> list[ReceiptError | None]:
        """Change several, as one after another in their order (in one step: one lock, one
        append); for each receipt, None or the error that kept it from being changed.
        ``within``: refuse (``VisibilityLimitError``) a change that would hide its message more
        than that many seconds after its delivery (SQS's 12-hour limit)."""
        check_visibility_changes(changes)
        check_within(within)

        changed: dict[int, bool] = {}  # by the changes before: hidden again (True) or given back

        def refused(i: int, offset: int, now: int) -> ReceiptError | None:
            receipt, seconds = changes[i]
            state = self.state  # (under the hold: the one ``_act`` brought up to date)
            delivery = state.inflight[offset]
            if state.group_taken_since(delivery, changed):
                return group_taken_error(self._shown(receipt), f"{self.receipt_prefix}{offset}")
            error = past_limit(self._shown(receipt), seconds, delivery.stamp, now, within)
            if error is None and delivery.group is not None:
                changed[offset] = bool(seconds)
            return error

        return self._act(
            [receipt for receipt, _ in changes],
            lambda current, now: [
                Event(EventKind.VISIBILITY, offset, seq, now + int(changes[i][1] * 1e9)).encode()
                for i, offset, seq in current
            ],
            refuse=refused,
        )

    def release(self, receipt: str, delay: float = 0.0) -> None:
        """Give the message back: available again after ``delay`` seconds (mq's redelivery)."""
        check_release_delay(delay)
        self.change_visibility(receipt, delay)

    def _act(
        self,
        receipts: list[str],
        make: Callable[[list[tuple[int, int, int]], int], list[Record]],
        *,
        finishing: bool = False,
        refuse: Callable[[int, int, int], ReceiptError | None] | None = None,
    ) -> list[ReceiptError | None]:
        """Under the lock, turn the receipts that name current deliveries, as (index, offset,
        delivery number), into ``make``'s events (``finishing``: see ``_current``). ``refuse``
        (index, offset, now): an error for a current delivery that is not to be acted on."""
        with self._hold():
            self._apply_new()
            now = time.time_ns()
            self.state.expire(now)
            outcomes, current = self._current(receipts, finishing=finishing)
            if refuse is not None:
                kept = []
                for item in current:
                    outcomes[item[0]] = error = refuse(item[0], item[1], now)
                    if error is None:
                        kept.append(item)
                current = kept
            if current:
                self._record(make(current, now))
        return outcomes

    def _current(
        self, receipts: Sequence[str], *, finishing: bool = False
    ) -> tuple[list[ReceiptError | None], list[tuple[int, int, int]]]:
        """Under the hold: for each receipt, None or why it names no current delivery; and
        (index, offset, delivery number) of those that do. ``finishing``: the receipts are for
        deletes, so ``_issued`` can forget them (a receipt whose delete then fails is merely
        parsed again if it comes back)."""
        outcomes: list[ReceiptError | None] = [None] * len(receipts)
        current: list[tuple[int, int, int]] = []
        acted: set[int] = set()
        inflight = self.state.inflight
        check = self.state.check_receipt
        issued = self._issued
        recall = issued.pop if finishing else issued.get
        for i, receipt in enumerate(receipts):
            # A receipt this object made is well formed and has this channel's token: when its
            # delivery is current (the same tuple: not changed since), nothing more to check.
            known = recall(receipt, None) if type(receipt) is str else None
            if known is not None:
                offset = known[0]
                delivery = inflight.get(offset)
                if (
                    delivery is not None
                    and delivery.seq == known[1]
                    and delivery.stamp == known[2]
                    and offset not in acted
                ):
                    acted.add(offset)
                    current.append((i, offset, known[1]))
                    continue
            try:
                offset, seq, stamp = self._parse_receipt(receipt) if known is None else known
                check(offset, seq, stamp)
                if offset in acted:
                    raise StaleReceiptError(f"receipt {self._shown(receipt)} was given twice in one call")
                acted.add(offset)
            except StaleReceipt as exc:
                outcomes[i] = StaleReceiptError(
                    f"receipt {self._shown(receipt)}: message {self.receipt_prefix}{exc.offset} {exc.why}"
                )
                continue
            except ReceiptError as exc:
                outcomes[i] = exc
                continue
            current.append((i, offset, seq))
        return outcomes, current

    # -- tasks, consumers, stats ----------------------------------------------------------------

    def task(self, id: str) -> Task:
        """The task state and metadata of message ``id``."""
        offset = parse_message_id(id)
        with self._held_current() as now:
            state = self.state
            state.expire(now)
            status = state.task_state(offset, now)
            message = self.topic.message(offset) if status is not None else None
            if status is None or (message is None and status in ("inserted", "claimed")):
                raise TaskNotFoundError(f"no task {id!r} in {self.topic.name}/{self.name} (never sent, or collected)")
            env = self._envelope(message) if message is not None else Envelope(b"")
            delivery = state.inflight.get(offset)
            return Task(
                id=id,
                state=status,
                metadata=state.metadata.get(offset, env.metadata),
                receive_count=delivery.seq if delivery is not None else 0,
                consumer=delivery.consumer if status == "claimed" and delivery is not None else None,
                filters=env.filters,
            )

    def delete_id(self, id: str) -> None:
        """Finish message ``id`` whatever its state: delivered or not (mq deletes by id)."""
        _raise(self.delete_ids([id])[0])

    def delete_ids(self, ids: Sequence[str]) -> list[Error | None]:
        """``delete_id`` of each, in one step (one lock, one append and, under ``sync="always"``,
        one sync); for each id, None or the error that kept it from being deleted: not an id of
        this queue's (``InvalidMessageError``), or no message of that id waiting, never sent,
        finished, dead or collected (``TaskNotFoundError``; an id given twice, the second time)."""
        deletes = IdDeletes(ids, parse_message_id)
        offsets = deletes.todo
        if offsets:
            with self._held_current() as now:
                state = self.state
                end = self._stored_end(max(offsets))
                for offset, position in list(offsets.items()):
                    if offset >= end or state.task_state(offset, now) in (None, "finished", "dead"):
                        del offsets[offset]
                        deletes.refused.append(position)
                if offsets:
                    self._record(finish_records(list(offsets), [state.receive_count(o) for o in offsets]))
        return deletes.outcomes_in(f"{self.topic.name}/{self.name}")

    def set_metadata(self, id: str, metadata: Any) -> None:
        """Replace the JSON metadata of task ``id``."""
        offset = parse_message_id(id)
        payload = encode_task_metadata(metadata)
        with self._held_current() as now:
            if self.state.task_state(offset, now) is None or offset >= self._stored_end(offset):
                raise TaskNotFoundError(f"no task {id!r} in {self.topic.name}/{self.name}")
            self._record([Event(EventKind.METADATA, offset, payload=payload).encode()])

    def consumers(self) -> dict[str, list[str]]:
        """Active consumers and the ids of the messages each holds hidden now."""
        with self._held_current() as now:
            state = self.state
            state.expire(now)
            held: dict[str, list[str]] = {}
            for offset, delivery in sorted(state.inflight.items()):
                if offset not in state.ready and delivery.visible_at > now:
                    held.setdefault(delivery.consumer, []).append(message_id(offset))
            return held

    def stats(self) -> ChannelStats:
        """Counts as SQS gives them, approximate as SQS's are: of the messages that no receive
        has looked at yet, only the first ``_STATS_LOOK_AHEAD`` are read to tell the delayed ones
        apart; those beyond count as available."""
        with self._held_current() as now:  # copy what is needed; read the topic after letting go
            state = self.state
            if state.cursor < self.topic.first_kept:  # as ``receive`` would
                self._skip_deleted()
            state.expire(now)
            hidden = [o for o in state.inflight if o not in state.ready]
            candidates = list(state.candidates())
            frontier, dead = state.frontier, state.dead
            # Dead letters that the dead-letter queue refused lately (as this process knows):
            # kept, undelivered, until the move is tried again (``_send_dead``); not available.
            max_count = moving_on_after(self.settings)
            kept_back = (
                {o for o in state.ready if state.receive_count(o) >= max_count}
                if max_count is not None and now < self._retry_dead_letters_at
                else set()
            )

        kept_from = retention_horizon(self.settings, now)

        def waiting(message: Message) -> str | None:
            """"available" or "delayed"; None for a message of another channel or past retention
            (which a receive finishes unseen)."""
            if 0 < message.timestamp_ns < kept_from:
                return None
            if message.type != envelope.ENVELOPE_TYPE:
                return "available"
            env = envelope.decode(message.type, message.value)
            if env.channel is not None and env.channel != self.name:
                return None
            return "delayed" if message.timestamp_ns + int(env.delay * 1e9) > now else "available"

        # When the oldest message counted was sent: the oldest of those in flight, waiting below
        # the frontier, and never seen (each in order of offset: its first).
        sent: list[int] = []
        if hidden and (message := self.topic.message(min(hidden))) is not None:
            sent.append(message.timestamp_ns)
        available = delayed = 0
        asleep, k = [run for run in self._asleep if run.wake > now], 0
        for offset in candidates:
            while k < len(asleep) and asleep[k].end <= offset:
                k += 1
            if k < len(asleep) and asleep[k].start <= offset and (available or delayed):
                delayed += 1  # in a run of delayed messages (``_Asleep``): not read again
                continue
            message = self.topic.message(offset)
            if message is not None:
                how = waiting(message)
                if how is not None and not (available or delayed):
                    sent.append(message.timestamp_ns)
                if how == "delayed" or (how is not None and offset in kept_back):
                    delayed += 1
                elif how is not None:
                    available += 1
        end = self._end_offset()
        start = max(frontier, self.topic.first_offset())  # retention may have deleted some
        unseen = max(0, end - start)
        damage: CorruptionError | None = None
        looked = 0
        if unseen:
            counted: list[Message] = []
            try:
                with Scanner(self.topic.path, start) as scanner:
                    while looked < _STATS_LOOK_AHEAD and (batch := scanner.read_batch(_STATS_LOOK_AHEAD - looked)):
                        looked += len(batch)
                        hows = [waiting(message) for message in batch]
                        late = hows.count("delayed")
                        delayed += late
                        unseen -= late + hows.count(None)
                        if not counted:
                            counted = [m for m, how in zip(batch, hows) if how is not None][:1]
            except CorruptionError as exc:
                # Damage in the topic: said, and what lies past it counts as available, as what
                # lies past the look-ahead does (a receive raises there: ``_check_damage``).
                damage = exc
            if not counted and unseen and damage is None:  # only beyond the look-ahead: approximately, the next
                counted = [m for m in (self.topic.message(start + looked),) if m is not None]
            sent += [m.timestamp_ns for m in counted]
        known = self._damage  # what this process's receives met, maybe past what was read here
        if damage is None and known is not None and (known.offset is None or known.offset >= start + looked):
            damage = known
        available += unseen
        oldest = max(0.0, (now - min(sent)) / 1e9) if sent else None
        return ChannelStats(available, len(hidden), delayed, dead, oldest, None if damage is None else str(damage))

    def _end_offset(self) -> int:
        return end_offset(self.topic.path)

    def _stored_end(self, highest: int) -> int:
        """Under the hold: an offset below which the topic has stored every message, past
        ``highest`` if the topic has stored that. The frontier when ``highest`` is below it (the
        state's events name only stored offsets), without a look at the topic's end (a listing of
        its segments, the tail of the last one's index, a scan of up to 4 KiB from there: some
        0.3 ms), which mq's delete of each message it fetched, by id, would pay."""
        frontier = self.state.frontier
        return frontier if highest < frontier else max(frontier, self._end_offset())

    def purge(self) -> None:
        """Finish every message sent so far (SQS's PurgeQueue)."""
        with self._held_current():
            self._record([Event(EventKind.SKIP_TO, self._end_offset()).encode()])

    def skip_to(self, offset: int) -> int:
        """Finish every message of the topic below ``offset`` that this channel has not finished,
        in flight or not: none of them is delivered (again), and their receipts stop working.
        Returns how many it finished; 0 when the channel is past ``offset`` already (a skip never
        goes back).

        The way past damage in the topic: a receive raises its ``CorruptionError`` once every
        message before it went out, and ``journalq check`` names the offset where whole messages
        start again (``Problem.resume``), which a skip to it gets this channel to. What lies
        between is lost to this channel, as it is to a reader that cannot decode it. (Kafka's
        answer is the same: a consumer group's offset reset past the bad records.)

        ``OffsetOutOfRangeError`` for an offset past the topic's end: messages not yet sent
        cannot be finished."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidSettingError(f"offset must be a whole number from 0, not {offset!r}")
        with self._held_current():
            end = self._end_offset()
            if offset > end:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is past the end of topic {self.topic.name!r}: its next message "
                    f"will be offset {end}",
                    file=self.topic.path,
                )
            state = self.state
            if offset <= state.cursor:
                return 0
            skipped = offset - state.cursor - sum(1 for o in state.finished if o < offset)
            self._record([Event(EventKind.SKIP_TO, offset).encode()])
            return skipped

    def close(self) -> None:
        self._closed = True
        try:
            self.topic.check_present()  # a cursor written to a deleted topic would make it again
            self.commit_cursor()
        except (OSError, QueueNotFoundError):
            pass
        self._close_files()

    def _close_files(self) -> None:
        for scanner in (self._events, self._tail):
            if scanner is not None:
                scanner.close()
        with self._reopen_lock:  # after a reopen under way: the writer it made is closed, not left open
            self._writer.close()


def _finishing(current: list[tuple[int, int, int]]) -> list[Record]:
    """The events that finish the deliveries ``Channel._current`` found current: (index, offset,
    delivery number) each. (Taken apart by one ``zip``: two comprehensions were two calls.)"""
    if not current:
        return []
    _, offsets, seqs = zip(*current)
    return finish_records(offsets, seqs)


def _collection_due(state: ChannelState, settings: QueueSettings, now: int) -> bool:
    """Whether ``task_gc_interval`` passed at ``now`` (ns) since the channel's last collection, by
    any process (its COLLECT event)."""
    return now - state.last_collect >= int(settings.task_gc_interval * 1e9)


def _compaction_due(state: ChannelState) -> bool:
    """Whether ``SNAPSHOT_EVERY`` changes came after the journal's last snapshot, or
    ``SNAPSHOT_SMALL_EVERY`` while the state is small next to them: a process that opens the
    channel (a sharded queue's consumer taking over another's shard, say) replays the changes
    since the last snapshot, ~1 µs each, and a small snapshot costs little more than an append.
    A state of more than ``SNAPSHOT_ENTRIES`` entries waits for proportionally more: a snapshot
    is written under the channel's lock, 1-2.5 µs an entry (200,000 deliveries in flight held it
    0.2-0.5 s), and every 20,000 changes such a state cost each change ten entries' writing, with
    the lock held; as many changes as entries cost each one entry's, and an opening process
    replays no more changes than the snapshot it reads has entries. (Counted from the last one
    any process appended: with several processes, one of them compacts, not each in turn, each
    applying all the others' snapshots too.)"""
    since = state.events_applied - state.applied_at_snapshot
    if since < SNAPSHOT_EVERY and since < SNAPSHOT_SMALL_EVERY:
        return False  # (the common case, at every receive: without counting the entries)
    entries = state.entries()
    return since >= SNAPSHOT_EVERY * max(1.0, entries / SNAPSHOT_ENTRIES) or (
        since >= SNAPSHOT_SMALL_EVERY and entries * SNAPSHOT_SAVES <= since
    )


class IdDeletes(Generic[_Key]):
    """A ``delete_ids`` call's bookkeeping (the file store's and the ZooKeeper store's): each id
    parsed by ``parse`` (its ``InvalidMessageError`` is its outcome), ``todo``: each message to
    delete by its key, with the position of its id in ``ids``; ``refused``: the positions of ids
    given again, and of those the caller finds not waiting. Pure: no I/O."""

    def __init__(self, ids: Sequence[str], parse: Callable[[str], _Key]) -> None:
        self.ids = ids
        self.outcomes: list[Error | None] = [None] * len(ids)
        self.todo: dict[_Key, int] = {}
        self.refused: list[int] = []
        for position, id in enumerate(ids):
            try:
                key = parse(id)
            except InvalidMessageError as exc:
                self.outcomes[position] = exc
                continue
            if key in self.todo:
                self.refused.append(position)
            else:
                self.todo[key] = position

    def outcomes_in(self, where: str) -> list[Error | None]:
        """For each id, None or why it was not deleted (``where``: the queue, as errors name it)."""
        for position in self.refused:
            self.outcomes[position] = TaskNotFoundError(f"no message {self.ids[position]!r} waiting in {where}")
        return self.outcomes


def _raise(error: Error | None) -> None:
    if error is not None:
        raise error
