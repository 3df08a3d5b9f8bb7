"""Sharded topics and queues: one topic spread over ``2**bit`` journals, to cut lock contention.

A topic created with ``shards=N`` (a power of two from 2 to 1024; the setting is fixed at
creation) keeps its settings in ``ROOT/NAME/queue.json`` as any topic does, and its messages in
``N`` shards beside it, ``ROOT/NAME.[bit].[index]/``, named as sej names shards (``NAME`` is the
shard prefix, so it may only hold letters, digits, ``_`` and ``-``). Each shard is an ordinary
``Topic`` underneath, a plain sej journal that ``journalq.shard.ShardedScanner`` reads, with its
own channels; a channel of the sharded topic is one channel per shard, so no code of the channel
is repeated here. What a sharded topic adds is routing:

* Sending: a message goes to the shard of its routing key, sej's ``crc32_ieee(key) & mask``. The
  key is the message's ``group_id`` when it has one (a FIFO group stays in one shard, so its order
  holds), else the ``key`` given to ``send`` (bytes or str; used for routing only, not stored),
  else its deduplication id, else none: keyless messages are spread round robin, each process
  starting at a shard picked from its pid. Deduplication is the queue's, as SQS's default scope:
  a duplicate sent with another group or key, so to another shard, is dropped all the same. The
  sends of one deduplication id take the hold of the shard of its hash (the shards they write to
  too, all in index order) and look for it in every shard's journal, where the messages
  themselves record it (nothing else to keep in step, across ``kill -9`` too). The readings of
  the shards that this looks through (one open segment each) are closed once the topic has not
  deduplicated for ``DEDUP_IDLE_SECONDS``.
* Receiving: each consumer (a ``ShardedChannel`` object) claims a home shard, from one picked by
  its pid on the first that no other live consumer of the channel holds (a lock file in
  ``ROOT/NAME/consumers/``), and takes what its home has; when home has fewer than asked for it
  tries the shard that had work last, then the others in turn (mq's peers: consumers mostly work
  different shards, so they seldom wait for one another's locks), first those that no other
  consumer holds as its home or as the shard it works away from home (it holds that one's lock
  while it stays there: ``_visit``), passing by those it can tell
  are run dry without their lock (``_surely_empty``), home too (a consumer of a queue run dry,
  or one that drains the other shards, does not lock an empty home at every receive; nor opens
  its channel until it has something). Order holds within a shard, not across
  shards. A receive returns nothing only once every shard had nothing. A shard that fails
  (damaged, its storage refusing) does not stop the others: what they gave is returned, and the
  failure is raised by a receive that gets nothing elsewhere.
* Ids and receipts name the shard: ``"INDEX.ID"`` and ``"INDEX.RECEIPT"`` (the shard's index in
  decimal, then the id or receipt that the shard's channel gave), so that ``delete``,
  ``change_visibility``, ``release``, ``task`` and ``set_metadata`` go to the right shard.

Receiving is ``Channel.receive`` itself (its checks and long polling) over a ``_receive_now``
that asks the shards' channels in turn; a long poll wakes on an append to any shard, and when a
hidden message of any shard comes back.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import os
import re
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from itertools import chain, count, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from journalq.closing import make_room_for_shards
from journalq.errors import (
    Error,
    InvalidMessageError,
    InvalidNameError,
    InvalidSettingError,
    JournalError,
    LockedError,
    PartialSendError,
    QueueNotFoundError,
    ReceiptError,
    StorageError,
)
from journalq.journal.lock import FileLock
from journalq.journal.offsets import clean_end_offset, read_offset
from journalq.journal.recovery import fsync_dir
from journalq.journal.segment import (
    JOURNAL_DIR,
    journal_dir,
    list_segments,
    raise_if_unopenable,
    segment_at,
    segment_bases,
    segment_name,
)
from journalq.journal.writer import held, refuse_to_wait
from journalq.journal.watch import DirectoryWatch
from journalq.queue import filters as filtering
from journalq.queue.channel import (
    Channel,
    ChannelStats,
    ReceivedMessage,
    ISSUED_MAX,
    Task,
    channel_dir,
    check_receipt_list,
    check_release_delay,
    check_visibility_changes,
    check_within,
    new_consumer_id,
)
from journalq.queue.envelope import message_id
from journalq.queue.removal import remove_directory
from journalq.queue.settings import QueueSettings, check_name
from journalq.queue.topic import (
    DedupIndex,
    OutgoingMessage,
    Topic,
    TopicDirectory,
    channel_once,
    message_list,
    size_cuts,
)
from journalq.queue.workqueue import Queue
from journalq.shard.naming import list_shards, parse_shard_name, shard_name

if TYPE_CHECKING:
    from journalq.queue.broker import Broker  # which imports this module

log = logging.getLogger("journalq.queue")

_PREFIX = re.compile(r"[A-Za-z0-9_-]+")
_instances = count()  # consumers made in this process: each starts at another shard
_receipt_of = operator.attrgetter("receipt")


# -- names ------------------------------------------------------------------------------------


def shard_bit(shards: int) -> int:
    """sej's shard bit of a shard count (a power of two, as the settings check)."""
    return shards.bit_length() - 1


def shard_dirs(name: str, shards: int) -> list[str]:
    """The directory names of the shards of topic ``name``, in index order."""
    bit = shard_bit(shards)
    return [shard_name(name, bit, index) for index in range(shards)]


def check_topic_name(name: str) -> str:
    """Refuse a topic name that names a shard (``orders.2.001``): such names are kept for the
    shards of sharded topics, so that a plain topic can never take a shard's directory."""
    parsed = parse_shard_name(name)
    if parsed is not None:
        raise InvalidNameError(
            f"{name!r} names shard {parsed.index} of {parsed.count} of a sharded topic {parsed.prefix!r}: "
            "names of the form [prefix].[bit].[index] are kept for shards"
        )
    return name


def check_dead_letter_queue(settings: QueueSettings) -> QueueSettings:
    """Refuse a dead-letter queue named as a shard (``check_topic_name``'s rule): no queue of this
    store can have such a name, so every move to it would fail."""
    dead_letter_queue = settings.dead_letter_queue
    if dead_letter_queue is not None and parse_shard_name(dead_letter_queue) is not None:
        raise InvalidSettingError(
            f"dead-letter queue {dead_letter_queue!r} names a shard of a sharded topic, not a queue"
        )
    return settings


def check_new(root: Path, name: str, settings: QueueSettings) -> None:
    """Before creating topic ``name`` with ``settings``: a sharded topic's name must be a shard
    prefix, and shards of that prefix left with another shard count are refused."""
    if settings.shards == 1:
        return
    if not _PREFIX.fullmatch(name):
        raise InvalidNameError(
            f"sharded topic name {name!r} must be letters, digits, '_' or '-' only: it is the prefix of "
            f"its shard directories ({name}.{shard_bit(settings.shards):x}.000, ...)"
        )
    if journal_dir(root / name).is_dir():
        raise InvalidSettingError(
            f"cannot create topic {name!r} with {settings.shards} shards: {root / name} is a journal already"
        )
    wanted = set(shard_dirs(name, settings.shards))
    others = sorted(str(n) for n, _ in list_shards(root) if n.prefix == name and str(n) not in wanted)
    if others:
        raise InvalidSettingError(
            f"cannot create topic {name!r} with {settings.shards} shards: {root} holds shard directories "
            f"of another shard count ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})"
        )


def check_change(name: str, current: QueueSettings, updated: QueueSettings) -> None:
    if updated.shards != current.shards:
        raise InvalidSettingError(
            f"topic {name!r} has {current.shards} shard(s): the shards setting is fixed when a topic is created"
        )


def open_topic(broker: Broker, name: str, settings: QueueSettings) -> Topic | ShardedTopic:
    """The topic object for ``settings``: a plain ``Topic``, or a ``ShardedTopic``."""
    if settings.shards == 1:
        return Topic(broker, name, settings)
    return ShardedTopic(broker, name, settings)


def delete_shards(root: Path, name: str, shards: int | None) -> None:
    """Remove the ``shards`` shards of topic ``name`` (before its settings, so that a delete cut
    short leaves the topic listed, to be deleted again). ``shards`` None: unknown, its settings
    being damaged; every directory named as a shard of ``name`` goes (such names are kept for
    its shards: ``check_topic_name``)."""
    if shards is None:
        directories = [str(shard) for shard, _ in list_shards(root) if shard.prefix == name]
    else:
        directories = shard_dirs(name, shards) if shards > 1 else []
    for directory in directories:
        remove_directory(root, directory)  # one missing (a delete cut short) is skipped


def _make_dir(directory: Path, durable: bool) -> bool:
    """Make ``directory`` (synced into its parent when ``durable``) unless it is there; False
    when its parent is missing, which is not made (a shard being deleted must not come back)."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return True
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(directory.parent)
    return True


def _route_key(value: bytes | str, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidMessageError(f"{what} must be bytes or a string, not {type(value).__name__}")


def _shard_of(route: bytes, mask: int) -> int:
    """The shard of routing key ``route``: sej's hash."""
    return zlib.crc32(route) & mask


def _split(text: object, shards: int, what: str, error: type[Exception]) -> tuple[int, str]:
    """``"INDEX.REST"`` -> (index, rest), or ``error`` naming what ``text`` should have been.
    INDEX has one spelling per shard: at most four ASCII digits, no sign, no leading zero.
    (Checked by hand, not by a regular expression: every receipt a sharded consumer deletes comes
    through here.)"""
    if isinstance(text, str):
        head, dot, rest = text.partition(".")
        if rest and len(head) <= 4 and head.isdecimal() and head.isascii() and (head[0] != "0" or head == "0"):
            index = int(head)
            if index < shards:
                return index, rest
    raise error(
        f"{what} {text!r} is not one of this sharded queue's: they are 'SHARD.{what.split()[-1].upper()}' "
        f"with SHARD from 0 to {shards - 1}"
    )


# -- deduplication's readings of the shards -----------------------------------------------------

DEDUP_IDLE_SECONDS = 10.0
"""How long a sharded topic that no longer deduplicates keeps its shards' deduplication readings
(``ShardedTopic._sent_before``'s, a segment held open each) open: once idle that long, the next
deduplicated send of any sharded topic of the process closes them (they read on from where they
stopped, at the topic's next deduplicated send: a seek per shard, paid once per idle spell)."""


class _RecentDeduplication:
    """The sharded topics of this process whose deduplication holds its shards' readings open,
    by when they last deduplicated (monotonic), the least recently first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_used: OrderedDict[ShardedTopic, float] = OrderedDict()

    def use(self, topic: ShardedTopic) -> None:
        """Note a deduplicated send of ``topic``, and close the readings of the topics idle for
        ``DEDUP_IDLE_SECONDS``. (Not under ``topic``'s holds: closing takes other topics'
        deduplication locks.)"""
        now = time.monotonic()
        idle: list[ShardedTopic] = []
        with self._lock:
            self._last_used[topic] = now
            self._last_used.move_to_end(topic)
            for other, last_used in self._last_used.items():
                if other is topic or now - last_used < DEDUP_IDLE_SECONDS:
                    break  # and so are the ones after it (``topic`` is the last)
                idle.append(other)
            for other in idle:
                del self._last_used[other]
        for other in idle:
            other._rest_dedup()

    def forget(self, topic: ShardedTopic) -> None:
        """``topic`` closed: its readings are."""
        with self._lock:
            self._last_used.pop(topic, None)


_recent_deduplication = _RecentDeduplication()


# -- the topic ----------------------------------------------------------------------------------


class _ShardTopic(Topic):
    """One shard of a sharded topic: a ``Topic`` in ``ROOT/NAME.[bit].[index]`` whose messages and
    errors name the sharded topic (dead letters record it as their source queue, so a redrive sends
    them back to the sharded queue)."""

    deduplicates = False  # ``ShardedTopic.send_many`` does, over every shard, before it sends to one

    def __init__(self, sharded: ShardedTopic, directory: str, settings: QueueSettings) -> None:
        super().__init__(sharded.broker, directory, settings)
        self.name = sharded.name
        self.sharded = sharded
        self.making = False
        """True while the sharded topic makes this shard's journal (at creation, or to replace
        one that a delete cut short removed)."""

    def check_present(self) -> None:
        """``Topic.check_present`` of the sharded topic's own directory first: a shard opened
        only after the topic was deleted and made again is there, but not of the topic opened.
        A shard is held open only once its writer or a channel opens, so until then its
        directory missing is the sign: a delete removes the shards before the topic's own
        directory, and a writer or channel opened meanwhile would make the shard again."""
        self.sharded.check_present()
        Topic.check_present(self)
        if self._dir_fd < 0 and not self.making and not os.path.isdir(self.path):
            raise QueueNotFoundError(
                f"queue or topic {self.name!r} was deleted after it was opened here "
                f"(its shard {self.path.name} is gone)"
            )

    def _made_elsewhere(self) -> Path | None:
        """The shard's directory, but while the sharded topic makes it (its writer makes it)."""
        return None if self.making else self.path

    def refresh_settings(self) -> None:
        """The sharded topic's: it takes up changed settings for all its shards (its own
        directory holds them)."""
        self.sharded.refresh_settings()

    def gc(self, now: float | None = None, *, size_kept_from: int | None = None) -> list[Path]:
        """``Topic.gc``, with ``retention_bytes`` counted over every shard (the sharded topic's
        ``size_cuts``): over this shard alone, a topic of N shards would keep N times it."""
        if size_kept_from is None and self.settings.retention_bytes is not None:
            size_kept_from = self.sharded.size_cuts()[self.sharded.shards.index(self)]
        return Topic.gc(self, now, size_kept_from=size_kept_from)

    @property
    def collected_by(self) -> ShardedTopic:
        """The sharded topic: its gc collects every shard, counting ``retention_bytes`` over them
        all once (each shard's own would count it again, for each shard's channel)."""
        return self.sharded

    def gc_when_due(self) -> None:
        """The sharded topic's, for a send to this shard (see ``collected_by``)."""
        self.sharded.gc_when_due()


class ShardedTopic(TopicDirectory):
    """The sharded topic ``name`` of a broker; ``Broker.topic`` and ``Broker.queue`` give one for a
    topic created with ``shards`` > 1. It offers what ``Topic`` offers."""

    def __init__(self, broker: Broker, name: str, settings: QueueSettings) -> None:
        super().__init__(broker.root / name)  # holds queue.json; the shards are beside it
        self.broker = broker
        self.name = name
        self.shard_names = shard_dirs(name, settings.shards)
        make_room_for_shards(settings.shards)
        self._hold_directory()  # (see ``check_present``)
        self.shards = [_ShardTopic(self, directory, settings) for directory in self.shard_names]
        self.settings = settings
        self._channels: dict[str, ShardedChannel] = {}
        self._making_channel = threading.Lock()
        # Each shard's deduplication ids, read by ``_sent_before`` (a lock each: threads share
        # them); their readings are closed once the topic has not deduplicated for a while
        # (``DEDUP_IDLE_SECONDS``).
        self._dedup: list[DedupIndex | None] = [None] * len(self.shards)
        self._dedup_locks = [threading.Lock() for _ in self.shards]
        # The round robin of keyless messages, from a shard of this process's: next() of a count
        # is one step, so threads sending at once take a turn each (a read then an increment of
        # an int let two take the same shard, and skip one, once a thread switch fell between).
        self._turn = count(os.getpid())

    def use_settings(self, settings: QueueSettings) -> None:
        """New settings, for every shard too."""
        self.settings = settings
        for shard in self.shards:
            shard.use_settings(settings)

    @property
    def shard_paths(self) -> list[Path]:
        return [shard.path for shard in self.shards]

    # -- sending ----------------------------------------------------------------------------

    def send(self, body: bytes, *, key: bytes | str | None = None, **options: Any) -> str:
        """Append one message to the shard of its routing key (see the module's docstring);
        returns its id, ``"SHARD.OFFSET"``. The options are ``Topic.send``'s."""
        return self.send_many([{"body": body, "key": key, **options}])[0]

    def send_many(self, items: Iterable[OutgoingMessage]) -> list[str]:
        """Append a batch: each shard's part in one write, in the order given. Every message is
        checked before anything is written; returns the ids in the order given. A message whose
        deduplication id was sent within the window to any shard, or comes earlier in the batch,
        is dropped: its id is the first one's.

        Not all or nothing across shards: when the write of one shard's part fails after another
        shard's part was written, ``PartialSendError`` (of the cause's kind: ``StorageError`` for a
        full disk) says which messages are stored (``ids``, None for the others) and which to
        send again (``unsent``). Each shard's part is all or nothing, and a failure before any
        part was written raises its own error, with nothing stored."""
        items = message_list(items)
        routed: list[tuple[int, Mapping[str, Any]]] = []
        dedup_ids: list[str | None] = []
        self.refresh_settings()
        first = self.shards[0]
        mask = len(self.shards) - 1
        for item in items:
            key = None
            if isinstance(item, Mapping) and "key" in item:
                item = dict(item)
                key = item.pop("key")
            envelope = first._envelope(item)  # checks the message (and computes a content-based id)
            if envelope.group_id is not None:
                route = envelope.group_id.encode("utf-8")
            elif key is not None:
                route = _route_key(key, "message key")
            elif envelope.dedup_id is not None:
                route = envelope.dedup_id.encode("utf-8")
            else:
                route = None
            index = next(self._turn) & mask if route is None else _shard_of(route, mask)
            routed.append((index, item))
            dedup_ids.append(envelope.dedup_id)
        ids: list[str | None] = [None] * len(routed)
        if not any(dedup_id is not None for dedup_id in dedup_ids):
            self._send_parts(routed, range(len(routed)), ids)
            return ids  # type: ignore[return-value]  # every one is set by now
        # A group or key may route a dedup id to any shard, so the shards' own deduplication
        # would miss a duplicate sent with another group: the sends of one dedup id go one at a
        # time, under the hold of the shard of its hash, and look for it in every shard.
        self.gc_when_due()  # not under the holds
        _recent_deduplication.use(self)  # closes idle topics' readings: not under the holds either
        copies: dict[int, int] = {}  # position -> the position of the first of its dedup id
        failed: Exception | None = None
        hashed = {_shard_of(dedup_id.encode("utf-8"), mask) for dedup_id in dedup_ids if dedup_id is not None}
        with ExitStack() as holds:
            for index in sorted(hashed | {index for index, _ in routed}):  # in one order: no deadlock
                shard = self.shards[index]
                holds.enter_context(held(shard._get_writer(), shard._reopen_writer, shard.check_present))
            sent_before = self._sent_before({dedup_id for dedup_id in dedup_ids if dedup_id is not None})
            first_of: dict[str, int] = {}
            fresh: list[int] = []
            for position, dedup_id in enumerate(dedup_ids):
                if dedup_id is None:
                    fresh.append(position)
                elif dedup_id in sent_before:
                    ids[position] = sent_before[dedup_id]
                elif dedup_id in first_of:
                    copies[position] = first_of[dedup_id]
                else:
                    first_of[dedup_id] = position
                    fresh.append(position)
            for index in {routed[position][0] for position in fresh if dedup_ids[position] is not None}:
                self.shards[index].mark_deduplication()
            try:
                self._send_parts(routed, fresh, ids)
            except Exception as exc:
                # Raised once the holds end without error: they then sync what was written
                # (``sync="always"``), which the error says is stored.
                failed = exc
        for position, earlier in copies.items():
            ids[position] = ids[earlier]
        if failed is not None:
            partial = PartialSendError.after(ids, failed)
            if partial is None:
                raise failed
            raise partial from failed
        return ids  # type: ignore[return-value]  # every one is set by now

    def _send_parts(
        self, routed: list[tuple[int, Mapping[str, Any]]], positions: Iterable[int], ids: list[str | None]
    ) -> None:
        """Write the messages of ``routed`` at ``positions``, one ``send_many`` per shard, and
        set their ids in ``ids``. A failure after a part was written is a ``PartialSendError``."""
        groups: dict[int, list[int]] = {}
        for position in positions:
            groups.setdefault(routed[position][0], []).append(position)
        for index, part in groups.items():
            try:
                sent = self.shards[index].send_many([routed[p][1] for p in part])
            except Exception as exc:
                partial = PartialSendError.after(ids, exc)
                if partial is None:
                    raise
                raise partial from exc
            for position, inner in zip(part, sent):
                ids[position] = f"{index}.{inner}"

    def _sent_before(self, dedup_ids: set[str]) -> dict[str, str]:
        """The ids of ``dedup_ids`` sent within the window to any shard: the latest when there
        are several (each was accepted, after the window of the one before as it was then: a
        window made longer since covers both; ``DedupIndex.remember``). Each shard's ids are caught up
        from its journal here, by this object's own reading of it (a shard's own is used under
        its hold alone). A shard that cannot be read (damaged) is left out, with a warning: a
        receive from it raises its damage, and the sends to the others go on."""
        window_ns = int(self.settings.dedup_window * 1e9)
        found: dict[str, tuple[int, str]] = {}  # dedup id -> (time sent, id)
        for index, shard in enumerate(self.shards):
            with self._dedup_locks[index]:
                dedup = self._dedup[index]
                if dedup is None or dedup.window_ns != window_ns:
                    self._forget_dedup(index)
                    dedup = self._dedup[index] = DedupIndex(shard.path, self.settings.dedup_window)
                try:
                    dedup.catch_up()
                except (JournalError, OSError) as exc:
                    log.warning("%s: deduplication cannot read this shard, left out: %s", shard.path, exc)
                    continue
                for dedup_id in dedup_ids:
                    sent = dedup.sent(dedup_id)
                    if sent is not None and (dedup_id not in found or sent.timestamp_ns > found[dedup_id][0]):
                        found[dedup_id] = (sent.timestamp_ns, f"{index}.{message_id(sent.offset)}")
        return {dedup_id: id for dedup_id, (_, id) in found.items()}

    def _rest_dedup(self) -> None:
        """Close every shard's deduplication reading, keeping the ids read (``DedupIndex.rest``):
        ``_recent_deduplication`` closes those of a topic that has not deduplicated lately."""
        for index, lock in enumerate(self._dedup_locks):
            with lock:
                dedup = self._dedup[index]
                if dedup is not None:
                    dedup.rest()

    def _forget_dedup(self, index: int) -> None:
        """Drop shard ``index``'s deduplication ids read by ``_sent_before``, closing its reading
        (a segment held open per shard). Under the shard's deduplication lock."""
        dedup, self._dedup[index] = self._dedup[index], None
        if dedup is not None:
            dedup.close()

    def _get_writer(self) -> None:
        """Make every shard's journal that is missing (at creation), so that readers of the
        sharded root see all of its shards; writers open as messages come."""
        for shard in self.shards:
            if not journal_dir(shard.path).is_dir():
                shard.making = True
                try:
                    shard._get_writer()
                finally:
                    shard.making = False
                shard.close()  # made: its writer opens again with its first message (1024 shards, 1024 writers)

    # -- channels and garbage collection ------------------------------------------------------

    def channel(self, name: str) -> ShardedChannel:
        """The channel ``name`` of every shard, as one (created when missing)."""
        return channel_once(self._channels, self._making_channel, name, lambda: ShardedChannel(self, name))

    def channel_names(self) -> list[str]:
        return sorted({name for shard in self.shards for name in shard.channel_names()})

    def _enter_channel(self, name: str) -> None:
        """Make the directory of channel ``name`` in every shard that lacks it. A shard's gc keeps
        what each channel listed there has not read (a channel never committed has read nothing),
        and a sharded channel opens its shards' channels only as it uses them: without this, a
        shard it has not used yet would delete, once the other channels are done, what it never
        got. (A directory per shard, not a channel: 1024 shards make 1024 directories, not 1024
        open writers.)"""
        durable = self.broker.durable
        for shard in self.shards:
            state = channel_dir(shard.path, name)
            if not _make_dir(state, durable):
                if not _make_dir(state.parent, durable):
                    shard.check_present()  # the shard is gone: the topic is being deleted (QueueNotFoundError)
                    continue
                _make_dir(state, durable)
            # Its state journal's directory too (its writer makes it, else): a long poll watches
            # it without opening the channel (``ShardedChannel._watch``). Not synced: lost, it is
            # made again here or by the writer.
            _make_dir(journal_dir(state), False)

    def gc(self, now: float | None = None) -> list[Path]:
        """Each shard's ``Topic.gc`` (retention by size counted over them all); returns the files
        deleted. A shard whose gc fails (damaged) does not keep the others from being collected:
        its failure is raised once every shard was tried."""
        self.refresh_settings()  # (as ``Topic.gc``)
        self._last_gc = time.monotonic()
        deleted: list[Path] = []
        failed: Exception | None = None
        cuts: list[int | None] = [None] * len(self.shards)
        if self.settings.retention_bytes is not None:
            try:
                cuts = list(self.size_cuts())
            except (JournalError, OSError) as exc:
                failed, cuts = exc, [0] * len(cuts)  # no retention by size, the rest all the same
        for shard, cut in zip(self.shards, cuts):
            try:
                deleted += shard.gc(now, size_kept_from=cut)
            except (JournalError, OSError) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return deleted

    def size_cuts(self) -> list[int]:
        """``retention_bytes`` over the whole topic: per shard, the offset before which its
        segments go for size (0: none). The oldest segments across the shards go first (by their
        newest message), and never a shard's last one, until the shards hold no more than the
        limit together."""
        limit = self.settings.retention_bytes
        listed = [list_segments(shard.path) for shard in self.shards]
        while True:
            try:
                return size_cuts(listed, limit or 0)
            except FileNotFoundError as exc:
                # A segment listed was deleted meanwhile (another process's gc): list again. One
                # listed again that is not there (a dangling link) would have this look for ever.
                listed = [list_segments(shard.path) for shard in self.shards]
                raise_if_unopenable(exc, (segment for segments in listed for segment in segments))

    def first_offset(self) -> dict[str, int]:
        return {name: shard.first_offset() for name, shard in zip(self.shard_names, self.shards)}

    @property
    def failed(self) -> bool:
        return any(shard.failed for shard in self.shards)

    def close(self) -> None:
        for channel in self._channels.values():
            channel._shut()  # the shards close the channels of each shard
        self._channels.clear()
        for shard in self.shards:
            shard.close()
        _recent_deduplication.forget(self)
        for index, lock in enumerate(self._dedup_locks):
            with lock:  # another thread may be closing it for being idle (``_rest_dedup``)
                self._forget_dedup(index)
        self._let_go_of_directory()


# -- channels and queues --------------------------------------------------------------------------

_T = TypeVar("_T")


class ShardedChannel:
    """The channel ``name`` of a sharded topic: one ``Channel`` per shard, opened as used, and a
    consumer that spreads over them (see the module's docstring). It offers what ``Channel``
    offers; ids and receipts carry the shard."""

    def __init__(self, topic: ShardedTopic, name: str) -> None:
        self.topic = topic
        self.name = name
        self._shard_channels: list[Channel | None] = [None] * len(topic.shards)
        self._closed = False
        self._opening = threading.Lock()
        self._claim: FileLock | None = None
        self._visiting: tuple[int, FileLock] | None = None  # away from home: see ``_visit``
        self._home: int | None = None  # claimed at the first receive: a producer claims nothing
        # The receipts given out here lately and their shard, so that their deletes do not split
        # them again (see ``_known_shards``); cleared when it grows.
        self._issued: dict[str, int] = {}
        # Shards whose channel is not open here, found run dry: their last segment and its size
        # then (``_surely_empty``: while they stay so, the shard is, without reading more).
        self._dry: dict[int, tuple[str, int]] = {}
        self._current = (os.getpid() + next(_instances)) % len(topic.shards)
        # No shard's channel is opened yet (opening one replays its state): the first receive
        # that finds something in its home opens its home's, which need not be the shard picked
        # above (see ``_claim_home``).
        check_name(name, "channel")
        topic.check_present()
        topic._enter_channel(name)
        # One consumer id over every shard, so that ``consumers()`` shows each consumer once.
        self.consumer_id = new_consumer_id()

    @property
    def home(self) -> int:
        """This consumer's home shard (claimed when first asked for: see ``_claim_home``)."""
        if self._home is None:
            with self._opening:
                if self._home is None:
                    self._refuse_when_closed()
                    self._home = self._current = self._claim_home()
        return self._home

    def _refuse_when_closed(self) -> None:
        """Under ``_opening``: a closed channel opens no shard's channel and claims no home again
        (``close`` would not close nor let go of them). Its receive then gets nothing, as a
        closed ``Channel``'s does (``Channel.receive``: an error of a closed channel); the topic
        deleted is said first (``QueueNotFoundError``), as a channel opened would."""
        if self._closed:
            self.topic.check_present()
            raise Error(f"channel {self.name!r} of sharded topic {self.topic.name!r} is closed")

    def _claim_home(self) -> int:
        """From the shard picked by the pid on, the first that no other consumer of the channel
        holds as its home (a lock in ``ROOT/NAME/consumers/``, let go when the consumer closes or
        dies), one that no consumer visits first (``_visit``); the pid's own when every shard has
        its consumer already. (A visit is for a while: the shard is still a home to take.)"""
        shards = len(self.topic.shards)
        start = self._current
        directory = self.topic.path / "consumers"
        try:
            directory.mkdir(exist_ok=True)
        except OSError:
            return start  # the topic is being deleted: its receives will say so
        for visited_too in (False, True):
            for step in range(shards):
                index = (start + step) % shards
                if not visited_too and not _free(self._claim_of(index, visit=True)):
                    continue
                claim = self._claim_of(index)
                try:
                    claim.acquire(wait=False)
                except LockedError:
                    claim.close()
                    continue
                except OSError:
                    claim.close()
                    return start
                self._claim = claim
                return index
        return start

    @property
    def settings(self) -> QueueSettings:
        return self.topic.settings

    @property
    def token(self) -> str:
        """Its first shard's ``Channel.token``: a channel deleted and made again has new ones."""
        return self._channel(0).token

    @property
    def shard(self) -> int:
        """The shard that this consumer last received from (its home shard at first)."""
        return self._current

    def _channel(self, index: int) -> Channel:
        channel = self._shard_channels[index]
        if channel is None:
            self._refuse_opening_on_loop(index)
            with self._opening:  # threads of a server share one queue object
                channel = self._shard_channels[index]
                if channel is None:
                    self._refuse_when_closed()
                    channel = self._shard_channel(index)
                    channel.consumer_id = self.consumer_id
                    self._shard_channels[index] = channel
        return channel

    def _refuse_opening_on_loop(self, index: int) -> None:
        """``BusyError`` in a ``DeferredSyncs(wait=False)`` block that did nothing yet (an event
        loop's call): opening shard ``index``'s channel replays its state journal, for up to
        hundreds of ms at a deep backlog, which the loop must not wait for. (The server runs
        the call again in a thread, as it does the first use of a queue.)"""
        refuse_to_wait(f"opening shard {index}'s channel", channel_dir(self.topic.shards[index].path, self.name))

    def _shard_channel(self, index: int) -> Channel:
        channel = self.topic.shards[index].channel(self.name)
        channel.receipt_prefix = f"{index}."  # what it gives out and its errors name the shard
        return channel

    def upkeep_due(self) -> bool:
        """Whether a call now would maintain, compact or collect too (``Channel.upkeep_due``)."""
        now = time.time_ns()
        return self.topic.upkeep_due() or any(c is not None and c._own_upkeep_due(now) for c in self._shard_channels)

    def _all(self) -> list[Channel]:
        return [self._channel(index) for index in range(len(self._shard_channels))]

    def maintain_when_due(self) -> None:
        """``Channel.maintain_when_due`` of the shards' channels opened here (a producer opens
        one: opening every shard's, 1,024 writers, for a send would cost more than it saves)."""
        for channel in self._shard_channels:
            if channel is not None:
                channel.maintain_when_due()

    # -- receiving --------------------------------------------------------------------------

    # ``Channel.receive``'s checks and long polling, over the two methods below.
    receive = Channel.receive
    _closed_under_receive = Channel._closed_under_receive

    def _receive_now(
        self,
        max_messages: int,
        hide: float,
        wanted: dict[str, tuple[str, filtering.Method]] | None,
        delete: Sequence[str] = (),
        one_per_group: bool = False,
    ) -> tuple[list[ReceivedMessage], int | None]:
        """Take from the shards in ``_order`` until ``max_messages`` are taken or all were tried;
        also returns when something hidden in any shard looked at comes back.

        ``delete`` (``receive(delete=...)``): a malformed receipt changes nothing. The receipts
        are deleted before anything is received, so that a stale one refuses the receive before
        it took (hid and counted) messages it would not return: those of every shard but the
        last are deleted first (a stale one stops there, with the earlier shards' deletes done),
        and the last shard's with its receive (one step; all or nothing in that shard)."""
        deletes = self._deletes_by_shard(delete)
        *first, last = deletes or [None]
        for index in first:
            errors = self._channel(index).delete_many(deletes[index])
            refused = next((error for error in errors if error is not None), None)
            if refused is not None:
                raise ReceiptError(f"nothing received: {refused}")
        received: list[ReceivedMessage] = []
        wake_at: int | None = None
        failed: Exception | None = None
        failed_shard = 0
        home = self.home  # claims it at the first receive
        held: list[int] = []  # shards that another consumer holds: tried after the others
        for index in chain(self._order(last, home, self._current), held):
            mine = deletes.get(index, ()) if index == last else ()
            if len(received) >= max_messages:
                break
            if not mine and self._surely_empty(index):
                # Passed by, but collected when due and its cursor published all the same, as a
                # receive there would: an idle consumer's polls keep finished tasks and consumed
                # segments collected.
                channel = self._shard_channels[index]
                if channel is not None:
                    channel.pass_by()
                continue
            if not mine and index != home and index != self._current and index not in held and not self._visit(index):
                held.append(index)  # another consumer's, home or visit: consumers stay spread
                continue
            if self._shard_channels[index] is None:
                # Out of the try below: refused on a loop, the whole receive goes to a thread
                # (a shard passed by for it now would wait behind the others' messages).
                self._refuse_opening_on_loop(index)
            try:
                got, wake = self._channel(index)._receive_now(
                    max_messages - len(received), hide, wanted, mine, one_per_group
                )
            except Exception as exc:
                if mine or isinstance(exc, ReceiptError):
                    raise  # the deletes are not stored: nothing may be returned as if they were
                # A shard that fails (damaged, its storage refusing) must not cost the messages
                # that the other shards hid for this receive: they are returned, and the failure
                # is raised when no other shard has anything to give.
                if failed is None:
                    failed, failed_shard = exc, index
                continue
            if wake is not None:
                wake_at = wake if wake_at is None else min(wake_at, wake)
            if got:
                self._current = index  # stay where there is work
                visiting = self._visiting
                if visiting is not None and visiting[0] != index:
                    self._leave_visit()  # home again, or elsewhere: the shard left is free for others
                issued = self._issued
                if len(issued) > ISSUED_MAX:
                    issued.clear()  # receipts given out long ago are split again, that is all
                # (The shard's channel named the shard in the receipts: its ``receipt_prefix``.)
                issued.update(zip(map(_receipt_of, got), repeat(index)))
                received += got
        if failed is not None and not received:
            # A delete (of another process) removes the shards before the topic's directory: a
            # shard that fails for being gone is the topic deleted (QueueNotFoundError), not
            # whatever its missing files raised.
            self.topic.shards[failed_shard].check_present()
            raise failed
        return received, wake_at

    def _claim_of(self, index: int, visit: bool = False) -> FileLock:
        """The lock that a consumer of the channel holds on shard ``index`` as its home
        (``ROOT/NAME/consumers/CHANNEL.INDEX.lck``) or, ``visit``, while it works it away from
        home (``CHANNEL.INDEX.visit.lck``), not taken. Two locks: a consumer that starts while a
        shard is visited still takes it as its home when no other is free (with one lock, the
        fourth of four consumers found none, and the visitor held two shards)."""
        return FileLock(self.topic.path / "consumers" / f"{self.name}.{index}{'.visit' if visit else ''}.lck")

    def _visit(self, index: int) -> bool:
        """Whether this consumer may work shard ``index`` away from home before the others: no
        other consumer holds it as home or visits it. Holds its visit lock when so, letting go
        of the one it visited before, until it moves on or goes home: a consumer whose home runs
        dry goes to a shard no one works, not to another's home (where both would wait for each
        other's hold while shards no one works wait)."""
        visiting = self._visiting
        if visiting is not None and visiting[0] == index:
            return True
        if not _free(self._claim_of(index)):
            return False
        claim = self._claim_of(index, visit=True)
        try:
            free = claim.try_acquire(wait=False)
        except OSError:  # cannot be tried (the topic is being deleted, say): free, held by no one
            claim.close()
            return True
        if not free:
            claim.close()
            return False
        with self._opening:  # threads of a server share one consumer
            if self._closed:
                left: tuple[int, FileLock] | None = (index, claim)  # (closed: holds nothing)
            else:
                left, self._visiting = self._visiting, (index, claim)
        if left is not None:
            left[1].close()
        return True

    def _leave_visit(self) -> None:
        """Let go of the shard visited (``_visit``), if any."""
        with self._opening:
            left, self._visiting = self._visiting, None
        if left is not None:
            left[1].close()

    def _surely_empty(self, index: int) -> bool:
        """Whether shard ``index`` has nothing for this channel, as far as can be told without
        its lock: ``Channel.surely_empty`` once its channel is open here; before, without
        opening it (which replays the channel's state journal), whether the cursor that the
        shard's consumers publish when they run it dry (``Channel.commit_cursor``) is at the
        shard's end. Finished stays finished, so a cursor read after the end, and at or past it,
        proves that nothing was there at that read (what is appended since is as if it came
        after this receive, which does not see the shards at one instant anyway); an old
        cursor only sends the receive to look."""
        channel = self._shard_channels[index]
        shard = self.topic.shards[index]
        try:
            if channel is not None:
                return channel.surely_empty()
            # Offsets and a plain path, no ``Segment``s (a ``Path`` costs more than the rest):
            # most shards looked at are found as dry as before, from their last segment alone.
            bases = segment_bases(shard.path)
            last = None
            if bases:
                name = os.path.join(shard.path, JOURNAL_DIR, segment_name(bases[-1]))
                last = (name, os.stat(name).st_size)
                if self._dry.get(index) == last:
                    return True  # found dry, and nothing appended since (nor a segment begun)
            elif not os.path.isdir(os.path.join(shard.path, JOURNAL_DIR)):
                return False  # no journal: the topic is being deleted (the receive looks, and says so)
            end = clean_end_offset(shard.path, [segment_at(shard.path, bases[-1])] if bases else [])
            # None: a message being written, or damage: the receive looks, and says which.
            empty = end is not None and read_offset(shard.path, self.name) >= end
        except (JournalError, OSError):
            return False  # the receive looks, and says what is wrong
        if empty and last is not None:
            self._dry[index] = last  # (as it was before the end was read: what came since is seen)
        return empty

    def _deletes_by_shard(self, receipts: Sequence[str]) -> dict[int, list[str]]:
        """``receipts`` by shard; ``ReceiptError`` for one that names none. (A consumer loop
        deletes what one shard gave it: that case costs no Python step per receipt.)"""
        known = self._known_shards(receipts, finishing=True)
        one = _one_shard(known)
        if one is not None:
            return {one: list(receipts)}
        by_shard: dict[int, list[str]] = {}
        for receipt, index in zip(receipts, known):
            by_shard.setdefault(self._shard_named(receipt) if index is None else index, []).append(receipt)
        return by_shard

    def _known_shards(self, receipts: Sequence[str], *, finishing: bool) -> list[int | None]:
        """The shard of each receipt as remembered when it was given out here (forgotten when
        ``finishing``: they are deleted), or None (given out before, or by another consumer)."""
        issued = self._issued
        try:
            return list(map(issued.pop if finishing else issued.get, receipts, repeat(None)))
        except TypeError:  # an unhashable one: each is read (``_shard_named``), and that one refused
            return [None] * len(receipts)

    def _shard_named(self, receipt: object) -> int:
        """The shard that ``receipt`` names (``ReceiptError`` when it names none of this queue's)."""
        return _split(receipt, len(self._shard_channels), "receipt", ReceiptError)[0]

    def _watch(self) -> DirectoryWatch:
        """A long poll wakes on an append to any shard or to any shard's channel state. Watched
        by path: a shard's channel is not opened for it (that replays its state; 1,024 shards,
        1,024 replays and writers), and ``_enter_channel`` made their journals' directories."""
        return DirectoryWatch(
            *(
                journal_dir(path)
                for shard in self.topic.shards
                for path in (shard.path, channel_dir(shard.path, self.name))
            )
        )

    def _order(self, first: int | None, home: int, current: int) -> Iterator[int]:
        """Each shard once: ``first`` (the shard of the receive's deletes, if any), home (so that
        consumers stay spread), then ``current``, the shard that had work last, and the ones after
        it. (Made as taken: a receive that its first shard fills looks at no other.)"""
        if first is not None:
            yield first
        if home != first:
            yield home
        shards = len(self._shard_channels)
        for step in range(shards):
            index = (current + step) % shards
            if index != home and index != first:
                yield index

    # -- acting on receipts -----------------------------------------------------------------

    def delete(self, receipt: str) -> None:
        """Finish the message of this delivery: it will not be delivered again."""
        _raise(self.delete_many([receipt])[0])

    def delete_many(self, receipts: list[str]) -> list[ReceiptError | StorageError | None]:
        """Delete several; for each receipt, None or the error that kept it from being deleted
        (a shard's ``StorageError`` too: see ``_per_shard``)."""
        check_receipt_list("receipts", receipts)
        return self._receipts_per_shard(
            receipts, lambda channel, theirs, positions: channel.delete_many(theirs), finishing=True
        )

    def change_visibility(self, receipt: str, seconds: float) -> None:
        """Hide the message of this delivery for ``seconds`` from now (0: available at once)."""
        _raise(self.change_visibility_many([(receipt, seconds)])[0])

    def change_visibility_many(
        self, changes: list[tuple[str, float]], *, within: float | None = None
    ) -> list[ReceiptError | StorageError | None]:
        """As ``Channel.change_visibility_many``, each shard's receipts by their shard (a shard's
        ``StorageError`` as their outcome: see ``_per_shard``)."""
        check_visibility_changes(changes)  # all first
        check_within(within)
        seconds = [s for _, s in changes]
        return self._receipts_per_shard(
            [receipt for receipt, _ in changes],
            lambda channel, theirs, positions: channel.change_visibility_many(
                [(receipt, seconds[p]) for receipt, p in zip(theirs, positions)], within=within
            ),
        )

    def release(self, receipt: str, delay: float = 0.0) -> None:
        """Give the message back: available again after ``delay`` seconds (mq's redelivery)."""
        check_release_delay(delay)
        self.change_visibility(receipt, delay)

    def _receipts_per_shard(
        self,
        receipts: list[str],
        step: Callable[[Channel, list[str], Sequence[int]], Sequence[Error | None]],
        *,
        finishing: bool = False,
    ) -> list[Any]:
        """``_per_shard`` of receipts, each to the shard it was given out from here (remembered;
        forgotten when ``finishing``: they are deleted), else to the one it names. The receipts of
        one consumer's receive, all of one shard, go without a Python step each."""
        known = self._known_shards(receipts, finishing=finishing)
        one = _one_shard(known)
        if one is not None:
            return self._per_shard(receipts, step, one_shard=one)
        remembered = iter(known)

        def locate(receipt: str) -> tuple[int, str]:  # (called once a receipt, in order)
            index = next(remembered)
            return (self._shard_named(receipt) if index is None else index), receipt

        return self._per_shard(receipts, step, locate)

    def _per_shard(
        self,
        items: Sequence[str],
        step: Callable[[Channel, list[str], Sequence[int]], Sequence[Error | None]],
        locate: Callable[[str], tuple[int, str]] | None = None,
        *,
        one_shard: int | None = None,
    ) -> list[Any]:
        """The outcome of each of ``items`` (receipts, ids), in order: ``locate(item)`` gives its
        shard and what that shard's channel takes for it (or raises the error that is its
        outcome: it names no shard), then ``step`` runs once a shard, on its channel, with that
        shard's items and their positions in ``items``, and gives their outcomes. ``one_shard``
        instead of ``locate``: every item goes to that shard as it is.

        A shard whose step fails for the storage (``StorageError``: a full disk, an I/O error)
        changed none of its items, and that error is each one's outcome; the other shards' steps
        go on, so that every item tells whether it was done (a caller told "failed" of a delete
        that was stored would delete it again, and be told it is no longer there). The error
        raises only when no shard's step was stored, as an unsharded queue's does."""
        if one_shard is not None:
            return list(step(self._channel(one_shard), list(items), range(len(items))))
        assert locate is not None
        outcomes: list[Any] = [None] * len(items)
        by_shard: dict[int, list[tuple[int, str]]] = {}
        for position, item in enumerate(items):
            try:
                index, inner = locate(item)
            except (ReceiptError, InvalidMessageError) as exc:
                outcomes[position] = exc
                continue
            by_shard.setdefault(index, []).append((position, inner))
        failure: StorageError | None = None
        stored = False
        for index, located in by_shard.items():
            positions = [position for position, _ in located]
            errors: Iterable[Error | None]
            try:
                errors = step(self._channel(index), [inner for _, inner in located], positions)
                stored = True
            except StorageError as exc:
                failure = failure or exc
                errors = repeat(exc)
            for position, error in zip(positions, errors):
                outcomes[position] = error
        if failure is not None and not stored:
            raise failure
        return outcomes

    # -- tasks, consumers, stats ----------------------------------------------------------------

    def _by_id(self, id: str, call: Callable[[Channel, str], _T]) -> _T:
        index, inner = _split(id, len(self._shard_channels), "message id", InvalidMessageError)
        return call(self._channel(index), inner)

    def task(self, id: str) -> Task:
        """The task state and metadata of message ``id``."""
        return dataclasses.replace(self._by_id(id, Channel.task), id=id)

    def delete_id(self, id: str) -> None:
        """Finish message ``id`` whatever its state (mq deletes by id)."""
        self._by_id(id, Channel.delete_id)

    def delete_ids(self, ids: Sequence[str]) -> list[Error | None]:
        """``Channel.delete_ids``, each shard's ids by their shard (one step a shard; a shard's
        ``StorageError`` as their outcome: see ``_per_shard``)."""
        shards = len(self._shard_channels)
        return self._per_shard(
            ids,
            lambda channel, inner, positions: channel.delete_ids(inner),
            lambda id: _split(id, shards, "message id", InvalidMessageError),
        )

    def set_metadata(self, id: str, metadata: Any) -> None:
        """Replace the JSON metadata of task ``id``."""
        self._by_id(id, lambda channel, inner: channel.set_metadata(inner, metadata))

    def consumers(self) -> dict[str, list[str]]:
        """Active consumers and the ids of the messages each holds hidden now, over every shard."""
        held: dict[str, list[str]] = {}
        for index, channel in enumerate(self._all()):
            for consumer, ids in channel.consumers().items():
                held.setdefault(consumer, []).extend(f"{index}.{i}" for i in ids)
        return held

    def stats(self) -> ChannelStats:
        """The sums of every shard's counts; the oldest age over all shards; the damage of each
        shard that met some, in shard order (each names its shard's file)."""
        every = [channel.stats() for channel in self._all()]
        ages = [s.oldest_age for s in every if s.oldest_age is not None]
        damages = [s.damage for s in every if s.damage is not None]
        return ChannelStats(
            available=sum(s.available for s in every),
            in_flight=sum(s.in_flight for s in every),
            delayed=sum(s.delayed for s in every),
            dead=sum(s.dead for s in every),
            oldest_age=max(ages) if ages else None,
            damage="; ".join(damages) if damages else None,
        )

    def shard_stats(self) -> dict[str, ChannelStats]:
        """Each shard's counts, by shard directory name."""
        return {name: channel.stats() for name, channel in zip(self.topic.shard_names, self._all())}

    def purge(self) -> None:
        """Finish every message sent so far to every shard."""
        for channel in self._all():
            channel.purge()

    def skip_to(self, offset: int, *, shard: str) -> int:
        """``Channel.skip_to`` in one shard, named by its directory (as ``journalq check`` and
        ``shard_stats`` name it): offsets are a shard's own."""
        names = self.topic.shard_names
        if shard not in names:
            raise InvalidSettingError(
                f"{shard!r} is not a shard of {self.topic.name!r}: its shards are {names[0]} to {names[-1]}"
            )
        return self._channel(names.index(shard)).skip_to(offset)

    def commit_cursor(self) -> None:
        for channel in self._shard_channels:
            if channel is not None:
                channel.commit_cursor()

    def close(self) -> None:
        for channel in self._shut():
            channel.close()

    def _shut(self) -> list[Channel]:
        """Mark it closed (under ``_opening``: no shard's channel opens, and no home is claimed,
        after it) and let go of its home; returns the shards' channels it opened, to close."""
        with self._opening:
            self._closed = True
            opened = [channel for channel in self._shard_channels if channel is not None]
        if self._claim is not None:
            self._claim.close()
            self._claim = None
        self._leave_visit()
        return opened


def _free(lock: FileLock) -> bool:
    """Whether no one holds ``lock`` (taken and let go at once; one that cannot be tried, the
    topic being deleted say, counts as free: held by no one)."""
    try:
        return lock.try_acquire(wait=False)
    except OSError:
        return True
    finally:
        lock.close()


def _one_shard(known: list[int | None]) -> int | None:
    """The shard of every receipt when ``_known_shards`` remembered them all in the same one (a
    consumer's batch, from one receive), else None."""
    first = known[0] if known else None
    return first if first is not None and known.count(first) == len(known) else None


def _raise(error: ReceiptError | None) -> None:
    if error is not None:
        raise error


class ShardedQueue(ShardedChannel):
    """A sharded topic with one channel (``Broker.queue`` of a topic made with ``shards`` > 1):
    ``Queue``'s interface, through ``Queue``'s own methods. ``send`` also takes ``key``, which
    picks the shard."""

    send = Queue.send
    send_many = Queue.send_many
    configure = Queue.configure
    redrive = Queue.redrive
