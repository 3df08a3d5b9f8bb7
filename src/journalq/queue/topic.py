"""A topic: a journal that producers send to and channels read, sq's topic.

Sending appends through a shared writer, so producers in many processes can send at once.
Channels live in ``TOPIC/channels/NAME/`` and refer to messages by offset; they add nothing to a
send, so a topic with ten channels writes as fast as one with none. ``gc()`` deletes the oldest
segments once every channel is done with them, or once retention says they have lived long enough.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import heapq
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from journalq.errors import (
    InvalidMessageError,
    JournalError,
    OffsetOutOfRangeError,
    QueueNotFoundError,
    TruncatedError,
)
from journalq.journal import Message, Scanner, Writer
from journalq.journal.writer import held
from journalq.journal.codec import HEADER, INT32
from journalq.journal.lock import directory_locked
from journalq.journal.offsets import read_offset
from journalq.journal.recovery import fsync_dir, make_dirs
from journalq.journal.segment import Segment, list_segments, open_segment, raise_if_unopenable, remove_segment
from journalq.queue import envelope, filters
from journalq.queue.channel import Channel, channel_dir, log_failed_collection, retention_horizon
from journalq.queue.envelope import Attribute, Envelope, message_id
from journalq.queue.settings import QueueSettings, SettingsFile, check_name

if TYPE_CHECKING:
    from journalq.queue.broker import Broker
    from journalq.queue.sharded import ShardedChannel

OutgoingMessage = bytes | Mapping[str, Any]
"""What ``send_many`` takes: a body, or a mapping with ``body`` and any of the keyword arguments
of ``Topic.send``."""


_CACHED_MESSAGES = 8192  # a topic keeps this many recently read messages for redelivery

DEDUP_MARK = "dedup.mark"
"""An empty file in a topic's (or shard's) directory, made before its first message with a
deduplication id is appended. Those ids are known only from the messages themselves
(``DedupIndex``), so while the mark is there ``gc`` keeps a consumed segment until the ids in it
are past their window: deleted, a process opened later would take them for new."""


def message_list(items: object) -> list[OutgoingMessage]:
    """``send_many``'s messages as a list (every store's), or ``InvalidMessageError``: one message,
    bytes or a mapping, would be taken apart into "messages", and None is no batch."""
    if isinstance(items, (bytes, bytearray, memoryview, str, Mapping)) or not isinstance(items, Iterable):
        raise InvalidMessageError(f"send_many takes a list of messages, not {type(items).__name__}")
    return items if isinstance(items, list) else list(items)


def make_envelope(item: OutgoingMessage, settings: QueueSettings) -> Envelope:
    """The envelope of a message to send to a topic with ``settings``, the message checked
    (``InvalidMessageError``). With ``QueueSettings()`` it refuses only what every topic refuses
    (no enums, no default delay): ``journalq queue send`` checks a message so before it makes
    the queue it is for."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        item = {"body": bytes(item)}
    if not isinstance(item, Mapping):
        raise InvalidMessageError(f"a message to send is bytes or a mapping, not {type(item).__name__}")
    unknown = set(item) - {
        "body", "attributes", "delay", "filters", "dedup_id", "group_id", "metadata", "source", "channel"
    }
    if unknown:
        raise InvalidMessageError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    body = item.get("body")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(f"message body must be bytes, not {type(body).__name__}")
    body = bytes(body)
    # What the settings add to a message (a default delay, content-based dedup): ``Topic.send_many``
    # sends bare bodies through ``_send_plain`` only when they add nothing; keep both in step.
    delay = settings.delay if item.get("delay") is None else item["delay"]
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 900:
        raise InvalidMessageError(f"message delay must be 0 to 900 seconds, not {delay!r}")
    dedup_id = item.get("dedup_id")
    if dedup_id is None and settings.content_based_dedup:
        dedup_id = hashlib.sha256(body).hexdigest()
    for name in ("dedup_id", "group_id"):
        value = dedup_id if name == "dedup_id" else item.get(name)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 128):
            raise InvalidMessageError(f"{name} must be a string of 1 to 128 characters, not {value!r}")
    given = item.get("attributes") or {}
    if not isinstance(given, Mapping):
        raise InvalidMessageError(f"message attributes map names to values, not {type(given).__name__}")
    attributes = {}
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise InvalidMessageError(f"attribute names are non-empty strings, not {name!r}")
        attributes[name] = envelope.checked_attribute(name, value)
    channel = item.get("channel")
    if channel is not None:
        check_name(channel, "channel")
    metadata = item.get("metadata")
    if metadata is not None:
        # JSON, checked here with the rest: a batch spread over shards (or ZooKeeper chunks)
        # is written part by part, and only the part holding it would find out, too late.
        envelope.encode_task_metadata(metadata)
    return Envelope(
        body=body,
        attributes=attributes,
        delay=float(delay),
        filters=filters.check_message_filters(item.get("filters"), settings.enums),
        dedup_id=dedup_id,
        group_id=item.get("group_id"),
        metadata=metadata,
        source=envelope.check_source(item.get("source")),  # set on dead letters: where they came from
        channel=channel,  # set on dead letters redriven: the channel they came from
    )


def channel_names_in(path: Path) -> list[str]:
    """The channels of the topic (or shard) directory ``path``: its ``channels`` directories."""
    try:
        return sorted(p.name for p in (path / "channels").iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


class TopicDirectory:
    """What ``Topic`` and ``ShardedTopic`` share: the topic's directory held open (to tell when
    the topic is deleted, or deleted and made again, under an object that has it open) and its
    settings file (to take up settings that other processes change). Subclasses set ``name`` and
    ``use_settings``."""

    name: str
    settings: QueueSettings

    def __init__(self, path: Path) -> None:
        self.path = path
        self._settings_file = SettingsFile(path)
        # The directory as opened: deleted, it has no links left, even when another process has
        # made the topic again under the same name (whose messages and channel states are not
        # this object's to act on). Opened with the writer or the first channel.
        self._dir_fd = -1
        self.gone = False
        """True once the topic is known deleted (``check_present`` found its directory gone, or
        its broker deleted it): it refuses to work, and its broker opens the name anew."""
        self._last_gc = 0.0  # (monotonic) when this process's last ``gc`` began

    @property
    def collected_by(self) -> TopicDirectory:
        """The topic whose ``gc`` collects this one (a channel's maintenance runs it): itself; a
        shard's is its sharded topic, whose gc counts ``retention_bytes`` over every shard once."""
        return self

    def _hold_directory(self) -> None:
        if self._dir_fd < 0:
            try:
                self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise self._deleted() from exc

    def _let_go_of_directory(self) -> None:
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def check_present(self) -> None:
        """Raise ``QueueNotFoundError`` when the topic was deleted since it was opened (by another
        process, say): a writer or channel of a deleted directory would otherwise go on in files
        no one reads, or take a new topic of the same name for its own. An ``fstat`` and a
        ``stat``: called when a writer or channel is opened, and by their holds when they find
        their segment deleted (``held``'s check)."""
        if self.gone or (self._dir_fd >= 0 and not self._still_at_path()):
            raise self._deleted()

    def _deleted(self) -> QueueNotFoundError:
        """The error for the topic found deleted since it was opened (and from then on: ``gone``)."""
        self.gone = True
        return QueueNotFoundError(f"queue or topic {self.name!r} was deleted after it was opened here")

    def _still_at_path(self) -> bool:
        """Whether the directory held open is still the topic's: a delete renames it away before
        it removes it (``journalq.queue.removal``), and until then it keeps its links, while its
        files go one by one under a channel or writer that has it open."""
        held = os.fstat(self._dir_fd)
        if held.st_nlink == 0:
            return False
        try:
            there = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)

    def refresh_settings(self) -> None:
        """Take up the settings that another process changed since (checked once a second)."""
        changed = self._settings_file.changed()
        if changed is not None:
            self.use_settings(changed)

    def use_settings(self, settings: QueueSettings) -> None:
        raise NotImplementedError

    def gc(self, now: float | None = None) -> list[Path]:
        """Delete what no channel needs or retention lets go (``Topic.gc``, ``ShardedTopic.gc``)."""
        raise NotImplementedError

    def gc_due(self) -> bool:
        """Whether ``task_gc_interval`` passed since this process's last ``gc`` began."""
        return time.monotonic() - self._last_gc >= self.settings.task_gc_interval

    def upkeep_due(self) -> bool:
        """Whether a send now would collect too (``gc_when_due``): a caller that must not wait
        long (the server's event loop, which appends itself) sends in a thread then."""
        return self.collected_by.gc_due()

    def gc_when_due(self) -> None:
        """``gc`` when due, for a send: so that retention holds on a topic that no one receives
        from (zkmq's producers collect too). A clock check until then; a failure is logged and
        tried again an interval later (the send does not depend on it; a receive raises it).
        Takes no channel's hold: a dead letter is sent under one."""
        if self.gc_due():
            try:
                self.gc()
            except (JournalError, OSError) as exc:
                log_failed_collection(self.path, self.settings.task_gc_interval, exc)


class Topic(TopicDirectory):
    """The topic ``name`` of a broker; use ``Broker.topic`` or ``Broker.queue`` to get one."""

    deduplicates = True
    """Whether ``send_many`` drops the duplicates of deduplication ids sent before (a shard of a
    sharded topic leaves it to its sharded topic, which looks in every shard first)."""

    def __init__(self, broker: Broker, name: str, settings: QueueSettings) -> None:
        super().__init__(broker.root / name)
        self.broker = broker
        self.name = check_name(name, "topic")
        self._writer: Writer | None = None
        self._writer_lock = threading.Lock()  # threads of the first send (or a reopen) make one writer
        self._channels: dict[str, Channel] = {}
        self._making_channel = threading.Lock()  # (see ``channel_once``)
        self._newest: dict[int, int] = {}  # segment base -> newest timestamp (``_newest_timestamp``)
        self._newest_dedup: dict[int, int] = {}  # segment base -> ``_newest_dedup_timestamp``
        self._dedup_marked = False  # ``DEDUP_MARK`` known to be there
        self._dedup: DedupIndex | None = None
        self.settings = settings
        # Runs of messages read lately, by first offset, oldest first: kept whole as read (one
        # entry per read of ~500, not one per message), up to ``_CACHED_MESSAGES`` in all.
        self._runs: dict[int, list[Message]] = {}
        self._cached = 0
        self._last_run: list[Message] = []  # where the last lookup found its message
        self._cache_lock = threading.Lock()  # channels of a topic read it from several threads
        self.first_kept = 0
        """The first offset left after this process's last ``gc``: a channel whose cursor is below
        it skips what retention deleted before it receives again (see ``Channel._skip_deleted``)."""

    def use_settings(self, settings: QueueSettings) -> None:
        """New settings, for what this object has open too (its writer, its deduplication).
        (``settings`` stays a plain attribute: channels read it on every call.)"""
        self.settings = settings
        if self._writer is not None:
            self._writer.segment_size = settings.segment_size
        if self._dedup is not None and int(settings.dedup_window * 1e9) != self._dedup.window_ns:
            self._dedup.close()
            self._dedup = None  # read again with the new window at the next deduplicated send

    # -- sending ----------------------------------------------------------------------------

    def send(
        self,
        body: bytes,
        *,
        attributes: Mapping[str, Attribute | str | bytes | int | float] | None = None,
        delay: float | None = None,
        filters: Mapping[str, str] | None = None,
        dedup_id: str | None = None,
        group_id: str | None = None,
        metadata: Any = None,
    ) -> str:
        """Append one message; returns its id. A duplicate (same ``dedup_id`` within the
        deduplication window) is accepted and dropped: the id returned is the first one's."""
        return self.send_many(
            [
                {
                    "body": body,
                    "attributes": attributes,
                    "delay": delay,
                    "filters": filters,
                    "dedup_id": dedup_id,
                    "group_id": group_id,
                    "metadata": metadata,
                }
            ]
        )[0]

    def send_many(self, items: Iterable[OutgoingMessage]) -> list[str]:
        """Append a batch in one write; returns the ids in the order given."""
        items = message_list(items)
        self.refresh_settings()
        self.gc_when_due()
        settings = self.settings
        if not settings.delay and not settings.content_based_dedup and all(type(i) is bytes for i in items):
            return self._send_plain(items)
        envelopes = [self._envelope(item) for item in items]
        if not envelopes:
            return []
        earlier: dict[int, int] = {}  # batch index -> offset already holding its dedup id
        first_in_batch: dict[int, int] = {}  # batch index -> index of the same id earlier in it
        fresh: list[int] = []
        deduplicating = self.deduplicates and any(e.dedup_id is not None for e in envelopes)
        with held(self._get_writer(), self._reopen_writer, self.check_present) as writer:
            if deduplicating:
                self.mark_deduplication()
                dedup = self._dedup_index()
                dedup.catch_up()
                batch_seen: dict[str, int] = {}
                for i, env in enumerate(envelopes):
                    known = None if env.dedup_id is None else dedup.sent(env.dedup_id)
                    if known is not None:
                        earlier[i] = known.offset
                    elif env.dedup_id is not None and env.dedup_id in batch_seen:
                        first_in_batch[i] = batch_seen[env.dedup_id]
                    else:
                        if env.dedup_id is not None:
                            batch_seen[env.dedup_id] = i
                        fresh.append(i)
            else:
                fresh = list(range(len(envelopes)))
            now = time.time_ns()
            messages = []
            for i in fresh:
                type_, value = envelope.encode(envelopes[i])
                messages.append(Message(timestamp_ns=now, type=type_, value=value))
            first = writer.next_offset
            if messages:
                writer.append_many(messages)
        offsets = dict(earlier)
        for n, i in enumerate(fresh):
            offsets[i] = first + n
            if deduplicating and envelopes[i].dedup_id is not None:
                self._dedup_index().remember(envelopes[i].dedup_id, first + n, now)
        for i, j in first_in_batch.items():
            offsets[i] = offsets[j]
        return [message_id(offsets[i]) for i in range(len(envelopes))]

    def _send_plain(self, bodies: list[bytes]) -> list[str]:
        """``send_many`` of bodies alone to a topic whose settings add nothing to them (no default
        delay, no content-based dedup): plain sej messages, what ``_envelope`` and
        ``envelope.encode`` would make of them, without building an envelope for each (the
        server's busiest path: the CPU per message bounds its durable throughput)."""
        if not bodies:
            return []
        with held(self._get_writer(), self._reopen_writer, self.check_present) as writer:
            first = writer.next_offset
            writer.append_many(bodies)  # values: type 0, no key, stamped by the writer
        return [message_id(offset) for offset in range(first, first + len(bodies))]

    def _envelope(self, item: OutgoingMessage) -> Envelope:
        return make_envelope(item, self.settings)

    def _get_writer(self) -> Writer:
        writer = self._writer
        if writer is None or self.gone:
            return self._reopen_writer()
        return writer

    def _reopen_writer(self) -> Writer:
        """The writer, made when there is none or it was closed (``held``'s reopen: its segment
        was collected) and no other thread made one meanwhile: one writer, whose mutex keeps the
        threads' sends apart (and none left open, unused)."""
        with self._writer_lock:
            writer = self._writer
            if writer is None or writer.closed or self.gone:
                self.check_present()  # a writer of a deleted topic would make its directory again
                try:
                    writer = self._writer = Writer(
                        self.path, shared=True, sync=self.broker.sync, segment_size=self.settings.segment_size,
                        inside=self._made_elsewhere(),  # (nor after the check: deleted meanwhile)
                    )
                except FileNotFoundError:
                    self.check_present()
                    raise
                self._hold_directory()
            return writer

    def _made_elsewhere(self) -> Path | None:
        """The directory that the topic's writer must not make again (``Writer``'s ``inside``):
        its own, made with its settings by the broker."""
        return self.path

    def mark_deduplication(self) -> None:
        """Before a message with a deduplication id is appended here (under the writer's hold):
        make ``DEDUP_MARK``, once (synced with its directory unless ``sync="none"``)."""
        if self._dedup_marked:
            return
        mark = self.path / DEDUP_MARK
        if not mark.exists():
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            if self.broker.durable:
                fsync_dir(self.path)
        self._dedup_marked = True

    def _dedup_index(self) -> DedupIndex:
        if self._dedup is None:
            self._dedup = DedupIndex(self.path, self.settings.dedup_window)
        return self._dedup

    # -- reading ----------------------------------------------------------------------------

    def message(self, offset: int) -> Message | None:
        """The stored message at ``offset`` (None once deleted), through a small cache."""
        with self._cache_lock:
            run = self._last_run
            i = offset - run[0].offset if run else -1
            if not 0 <= i < len(run):
                # Newest first; a receive looking at several offsets mostly finds them in one run.
                for run in reversed(self._runs.values()):
                    i = offset - run[0].offset
                    if 0 <= i < len(run):
                        self._last_run = run
                        break
                else:
                    run = []
            if run:
                return run[i]
        try:
            with Scanner(self.path, offset) as scanner:
                batch = scanner.read_batch(64)
        except OffsetOutOfRangeError:
            return None
        self.remember(batch)
        return batch[0] if batch else None

    def remember(self, messages: list[Message]) -> None:
        """Keep recently read messages for redelivery without a seek: ``messages``, a run at dense
        offsets as a scanner gives them (kept as it is: the caller must not change it)."""
        if not messages:
            return
        runs = self._runs
        with self._cache_lock:
            first = messages[0].offset
            replaced = runs.pop(first, None)
            if replaced is not None:
                self._cached -= len(replaced)
            runs[first] = messages
            self._cached += len(messages)
            while self._cached > _CACHED_MESSAGES and len(runs) > 1:
                self._cached -= len(runs.pop(next(iter(runs))))

    def first_offset(self) -> int:
        segments = list_segments(self.path)
        return segments[0].base if segments else 0

    # -- channels and garbage collection ------------------------------------------------------

    def channel(self, name: str) -> Channel:
        """The channel ``name`` (created when missing): it gets every message of the topic."""
        check_name(name, "channel")

        def make() -> Channel:
            self.check_present()
            self._hold_directory()  # first: the channel's opening tells a delete under it by this
            if channel_dir(self.path, name).is_dir():
                return Channel(self, name)
            # A new channel: made under the lock that a gc holds from its listing of the channels
            # to its last delete (see ``gc``).
            try:
                make_dirs(self.path / "channels", durable=True, inside=self.path)  # (once a topic)
            except FileNotFoundError:
                self.check_present()  # QueueNotFoundError, when that is what happened
                raise
            with directory_locked(self.path / "channels", shared=True):
                return Channel(self, name)

        return channel_once(self._channels, self._making_channel, name, make)

    def channel_names(self) -> list[str]:
        return channel_names_in(self.path)

    def gc(self, now: float | None = None, *, size_kept_from: int | None = None) -> list[Path]:
        """Delete the oldest segments that no channel needs or that retention lets go.

        A segment is needed while some channel's committed cursor is inside or before it (a topic
        without channels keeps everything until retention). Never deletes the segment being
        written. ``size_kept_from``: retention by size decided by the caller (the segments
        before the one holding this offset go), instead of ``retention_bytes`` over this journal
        alone (a sharded topic's, which counts every shard). Returns the files deleted. ``now``:
        seconds since the epoch (the clock's by default).
        """
        # In nanoseconds, as the messages' times are (a float of seconds since the epoch is off
        # by up to a few hundred of them): a deduplication window's or retention's edge is exact.
        now_ns = time.time_ns() if now is None else int(now * 1e9)
        # Settings another process changed: what it deletes by them cannot be undone (a longer
        # deduplication window than this process last read keeps the segments of more ids).
        self.refresh_settings()
        self.check_present()
        self._last_gc = time.monotonic()  # first: one that fails is tried again an interval later
        # The cursors of this process's channels as it knows them when the disk is too full to
        # publish them: what a commit would have published (the gc is what frees space).
        # (A copy of the channels: another thread may open one meanwhile.)
        unpublished = {name: c.state.cursor for name, c in list(self._channels.items()) if not c.commit_cursor()}
        deleted: list[Path] = []
        kept_from = 0
        with contextlib.ExitStack() as stack:
            # The channels listed stay all there are until the last delete: a channel is made under
            # this lock (shared: see ``channel``). One made after the listing would begin to read
            # segments that the channels listed were done with, and lose what it was given to
            # the deletes. (No ``channels`` directory, no channel: retention alone deletes then,
            # and a channel gets only what retention keeps.)
            with contextlib.suppress(FileNotFoundError):
                stack.enter_context(directory_locked(self.path / "channels"))
            names = self.channel_names()
            cursors = [unpublished[name] if name in unpublished else read_offset(self.path, name) for name in names]
            needed_from = min(cursors) if cursors else None
            while True:
                try:
                    kept_from = max(kept_from, self._delete_segments(now_ns, needed_from, deleted, size_kept_from))
                    break
                except FileNotFoundError as exc:
                    # A segment listed was deleted meanwhile (another process's gc of a topic with
                    # no channel): list again (unless it is listed still, and cannot be opened:
                    # looking again would never end).
                    raise_if_unopenable(exc, list_segments(self.path))
        if deleted:
            self.first_kept = max(self.first_kept, kept_from)
            with self._cache_lock:  # deleted: not to be delivered from the cache
                for first in [first for first, run in self._runs.items() if run[-1].offset < kept_from]:
                    self._cached -= len(self._runs.pop(first))
                self._last_run = []
        return deleted

    def _delete_segments(
        self, now_ns: int, needed_from: int | None, deleted: list[Path], size_kept_from: int | None
    ) -> int:
        """``gc``'s deletes, oldest first, noted in ``deleted``; returns the first offset of the
        segments kept (0 when none was deleted). ``FileNotFoundError``: a segment listed is gone."""
        segments = list_segments(self.path)
        settings = self.settings
        if size_kept_from is None and settings.retention_bytes is not None:
            size_kept_from = size_cuts([segments], settings.retention_bytes)[0]
        kept_from = 0
        horizon = retention_horizon(settings, now_ns)
        # (A stat at each gc: the mark may have been made by another process since.)
        dedup_horizon = now_ns - int(settings.dedup_window * 1e9) if (self.path / DEDUP_MARK).exists() else None
        for segment, following in zip(segments, segments[1:]):
            consumed = needed_from is not None and following.base <= needed_from
            # Past retention as a receive has it: a message with no time (0 or less) never is.
            # Every message of the segment: the last is read first (cheap), and only a segment it
            # says is past retention is read whole (writers' clocks may be out of step: a later
            # message can be older, so the last one alone would let fresh ones go).
            too_old = (
                settings.retention_seconds is not None
                and 0 < last_timestamp(segment) < horizon
                and 0 < self._newest_timestamp(segment, following.base) < horizon
            )
            too_big = size_kept_from is not None and following.base <= size_kept_from
            if not (consumed or too_old or too_big):
                break
            if (
                dedup_horizon is not None
                and not (too_old or too_big)  # (what retention lets go, deduplication does not keep)
                and self._newest_dedup_timestamp(segment, following.base) >= dedup_horizon
            ):
                break  # consumed, but a deduplication id in it is still within its window
            deleted += remove_segment(segment)
            kept_from = following.base
        return kept_from

    def _newest_timestamp(self, segment: Segment, end: int) -> int:
        """The newest timestamp of the messages of ``segment`` (offsets up to ``end``, the next
        segment's base: it is no longer written), or 0 when one has no time (it is never past
        retention). Remembered per segment: a segment kept for a fresh message is not read again
        at every gc."""
        newest = self._newest.get(segment.base)
        if newest is None:
            newest = 0
            for batch in self._segment_batches(segment, end):
                stamps = [m.timestamp_ns for m in batch]
                if min(stamps) <= 0:
                    newest = 0
                    break
                newest = max(newest, *stamps)
            _remember(self._newest, segment.base, newest)
        return newest

    def _newest_dedup_timestamp(self, segment: Segment, end: int) -> int:
        """The newest timestamp of the messages of ``segment`` (offsets up to ``end``) that carry a
        deduplication id, or 0 when none does (``DedupIndex`` counts an id sent at no time as past
        its window); remembered per segment, as ``_newest_timestamp``."""
        newest = self._newest_dedup.get(segment.base)
        if newest is None:
            newest = 0
            for batch in self._segment_batches(segment, end):
                newest = max((m.timestamp_ns for m, _ in _with_dedup_ids(batch)), default=newest)
            _remember(self._newest_dedup, segment.base, newest)
        return newest

    def _segment_batches(self, segment: Segment, end: int) -> Iterator[list[Message]]:
        """The messages of ``segment`` (offsets up to ``end``, the next segment's base: it is no
        longer written), a batch at a time. ``FileNotFoundError`` when it was collected meanwhile
        (another process's gc), as ``last_timestamp`` says it."""
        try:
            with Scanner(self.path, segment.base) as scanner:
                while scanner.offset < end and (batch := scanner.read_batch(end - scanner.offset)):
                    yield [m for m in batch if m.offset < end]
        except OffsetOutOfRangeError:
            raise FileNotFoundError(errno.ENOENT, "segment collected meanwhile", str(segment.path)) from None

    @property
    def failed(self) -> bool:
        """True when one of its journal writers failed (a sync did): reopen the topic."""
        writers = [self._writer, *(channel._writer for channel in self._channels.values())]
        return any(writer is not None and writer.failed for writer in writers)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._dedup is not None:
            self._dedup.close()
            self._dedup = None
        self._let_go_of_directory()


def _with_dedup_ids(messages: Iterable[Message]) -> Iterator[tuple[Message, str]]:
    """The messages that carry a deduplication id (in their envelope), each with it."""
    for message in messages:
        if message.type == envelope.ENVELOPE_TYPE:
            dedup_id = envelope.decode(message.type, message.value).dedup_id
            if dedup_id is not None:
                yield message, dedup_id


def _remember(per_segment: dict[int, int], base: int, value: int) -> None:
    """Note what was read of the segment at ``base`` (``_newest_timestamp`` and its kin)."""
    if len(per_segment) >= 1024:
        per_segment.clear()  # (bases of segments deleted since, mostly)
    per_segment[base] = value


def size_cuts(listed: list[list[Segment]], limit: int) -> list[int]:
    """Retention by size over the segments ``listed`` per journal (a topic's one, or a sharded
    topic's shards): per journal, the offset before which its segments go (0: none). The oldest
    go first, never a journal's last one, until what is left holds no more than ``limit`` bytes
    together. Across journals, the oldest is the segment whose newest message is oldest; within
    one, the journal's own order says it (no timestamp read)."""
    sizes = [[segment.path.stat().st_size for segment in segments] for segments in listed]
    total = sum(map(sum, sizes))
    age: Callable[[Segment], int] = last_timestamp if len(listed) > 1 else (lambda segment: 0)
    cuts = [0] * len(listed)
    first = [0] * len(listed)  # per journal, the oldest segment not let go yet
    # Each journal's oldest segment that may go (not its last), by its age.
    candidates = [(age(segments[0]), i) for i, segments in enumerate(listed) if len(segments) > 1]
    heapq.heapify(candidates)
    while total > limit and candidates:
        _, i = heapq.heappop(candidates)
        total -= sizes[i][first[i]]
        first[i] += 1
        cuts[i] = listed[i][first[i]].base
        if first[i] < len(listed[i]) - 1:
            heapq.heappush(candidates, (age(listed[i][first[i]]), i))
    return cuts


_Opened = TypeVar("_Opened", bound="Channel | ShardedChannel")


def channel_once(channels: dict[str, _Opened], lock: threading.Lock, name: str, make: Callable[[], _Opened]) -> _Opened:
    """The open channel ``name`` of a topic's ``channels``, made by ``make`` when missing or closed
    (a closed one's receives would return nothing): under ``lock``, so that threads asking at
    once make one, the one the topic keeps and closes (two made each held a writer of the
    channel's state, a sharded one a home shard, and one of them was never closed)."""
    channel = channels.get(name)
    if channel is None or channel._closed:
        with lock:
            channel = channels.get(name)
            if channel is None or channel._closed:
                channel = channels[name] = make()
    return channel


def last_timestamp(segment: Segment) -> int:
    """The timestamp of a segment's last message, read backward through its size field."""
    try:
        fd = open_segment(segment)
        try:
            end = os.fstat(fd).st_size
            if end < 4:
                return 2**63 - 1
            (size,) = INT32.unpack(os.pread(fd, 4, end - 4))
            header = os.pread(fd, HEADER.size, end - size)
            return HEADER.unpack(header)[1] if len(header) == HEADER.size else 2**63 - 1
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise  # deleted meanwhile (another process's gc): ``Topic.gc`` lists the segments again
    except (OSError, ValueError) as exc:
        raise JournalError(f"cannot read the last message of a segment: {exc}", file=segment.path) from None


class DedupSend(NamedTuple):
    """Where and when a deduplication id was sent (``DedupIndex.sent``)."""

    offset: int
    timestamp_ns: int


class DedupIndex:
    """Deduplication ids sent within the window, caught up from the topic itself.

    The ids travel in the messages' envelopes, so every producer process learns the others' by
    reading what they appended; nothing else needs to be stored.
    """

    def __init__(self, path: Path, window: float) -> None:
        self.path = path
        self.window_ns = int(window * 1e9)
        self._seen: OrderedDict[str, DedupSend] = OrderedDict()  # in time order, oldest first
        self._scanner: Scanner | None = None
        self._resume_at: int | None = None  # where ``rest`` stopped reading (None: read the window)

    def _start(self) -> Scanner:
        """Start reading at the newest segment that begins before the window (strictly: a message
        sent at its very start is within it, and so may be the ones before, sent at that time)."""
        horizon = time.time_ns() - self.window_ns
        segments = list_segments(self.path)
        start = segments[0].base if segments else 0
        for segment in reversed(segments):
            try:
                fd = open_segment(segment)
                try:
                    header = os.pread(fd, HEADER.size, 0)
                finally:
                    os.close(fd)
            except FileNotFoundError:
                # Deleted since it was listed (another process's gc, which goes oldest first):
                # so are those before it; the window starts in the next one at the latest.
                break
            start = segment.base
            if len(header) == HEADER.size and HEADER.unpack(header)[1] < horizon:
                break
        return Scanner(self.path, start)

    def close(self) -> None:
        """Close its reading of the topic (a segment held open); a later ``catch_up`` reads the
        window again."""
        if self._scanner is not None:
            self._scanner.close()
            self._scanner = None
        self._resume_at = None
        self._seen.clear()

    def rest(self) -> None:
        """Close its reading of the topic (a segment held open), keeping the ids read: the next
        ``catch_up`` opens it again where it stopped (costlier than reading on: a seek)."""
        if self._scanner is not None:
            self._resume_at = self._scanner.offset
            self._scanner.close()
            self._scanner = None

    def _resume(self) -> Scanner:
        """A reading from where ``rest`` stopped, or of the whole window."""
        if self._resume_at is not None:
            try:
                return Scanner(self.path, self._resume_at)
            except OffsetOutOfRangeError:
                pass  # collected since (or taken back): read the window again
        return self._start()

    def catch_up(self) -> None:
        if self._scanner is None:
            self._scanner = self._resume()
        try:
            self._read_new()
        except (OffsetOutOfRangeError, TruncatedError):
            # gc deleted segments this scanner had not read yet: read the window again
            self._scanner.close()
            self._scanner = self._start()
            self._read_new()

    def _read_new(self) -> None:
        assert self._scanner is not None
        while batch := self._scanner.read_batch():
            for message, dedup_id in _with_dedup_ids(batch):
                self.remember(dedup_id, message.offset, message.timestamp_ns)

    def remember(self, dedup_id: str, offset: int, timestamp_ns: int) -> None:
        """Note a send of ``dedup_id`` at ``offset``, stored after those noted: the id's latest.
        Every send stored was accepted, so a later one came after the window of the one before
        (the id's window starts again there), as that window was then: one made longer since
        may cover both, and the id still stands for the latest (a process that reads the
        window again must find what the sender was answered). One that says it is older (a
        writer whose clock is behind) does not replace a newer."""
        seen = self._seen
        noted = seen.get(dedup_id)
        if noted is None or noted.timestamp_ns <= timestamp_ns:
            seen.pop(dedup_id, None)
            seen[dedup_id] = DedupSend(offset, timestamp_ns)  # at the end: ``_seen`` stays in time order

    def sent(self, dedup_id: str) -> DedupSend | None:
        """Where and when ``dedup_id`` was sent within the window (as far as ``catch_up`` and
        ``remember`` told), or None; forgets the sends whose window is over."""
        horizon = time.time_ns() - self.window_ns
        seen = self._seen
        while seen:
            oldest = next(iter(seen.values()))
            if oldest.timestamp_ns >= horizon:
                break
            seen.popitem(last=False)
        found = seen.get(dedup_id)
        return found if found is not None and found.timestamp_ns >= horizon else None
