"""A queue shared by several processes, against a model of what it must do: random sends,
receives, deletes (by receipt, and by id), releases, consumer loops, redrives of dead letters,
skips to an offset (on files), catch-ups, restarts and collections, each by one of
three ``Broker`` objects on one data directory (each opens its own files and takes its own locks,
as another process would), and after each step the answer the model gives.

The rules checked: FIFO (a receive gives the oldest messages available, a released one before
newer ones; in a sharded queue, per shard, and as many as there are up to the number asked for),
message groups (none of a group out while one is in flight; on files, a receive takes a group's
next ones in order too), deduplication (a second
send of an id is dropped and answered with the id of the latest send stored with it), dead letters (moved once, in
order, with their groups; redriven to the queue's end, in that order, and moved again after as
many receives), each message given to one consumer at a time, dense message ids, a
receipt works in any process until its message is delivered again or deleted (then it is stale,
and a consumer loop that carries it does nothing), deleted messages never come back, the receive
counts and the counts of ``stats``; none of it changed by a restart or by the collection of
finished tasks and consumed segments. The channels' state journals are made to compact every few
changes and the topic to roll its segments every few messages, so that the snapshots, the
catch-ups across them and the deletion of consumed segments are met in most runs. In most machines
nothing expires by the clock: messages are hidden for an hour, and released by
``change_visibility(0)``. In those with a clock of the model's (``CLOCK``), time moves only when
the model says, by whole steps, so that the visibility timeouts, the delays and the deduplication
window end at known times, and the rules that hang on them are checked too: a message whose
visibility ended comes back by itself, before newer ones, its receipt good until it is delivered
again; a delayed one holds its group back; a deduplication id is free again after its window
(and stands for its latest send); settings changed by one process hold in every process a second
later. In those of a topic with several channels (``CHANNELS``), each channel gets every message
and keeps its own deliveries, receipts, purges and dead letters (a dead letter is redriven to its
channel alone), a segment is deleted only once every channel is done with it, and a channel made
during the run gets every message still stored. On files (one queue, and four shards) and on the
ZooKeeper store."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from journalq.errors import ReceiptError, StaleReceiptError, TaskNotFoundError
from journalq.queue import DEFAULT_CHANNEL, Broker
from journalq.queue import channel as channel_module
from journalq.queue import sharded as sharded_module

PROCESSES = 3
HIDE = 3600.0  # no visibility ends during a run (but with the model's clock)
CLOCK_HIDE = 2.0  # with the model's clock: the queue's visibility timeout, in seconds
CLOCK_DEDUP_WINDOW = 20.0  # with the model's clock: the queue's deduplication window, in seconds
SEGMENT_SIZE = 4096  # the topic's: the smallest there is
PATCHED = {"SNAPSHOT_EVERY": 7, "SNAPSHOT_SMALL_EVERY": 3, "STATE_SEGMENT_SIZE": 4096}

LEVELS = ("low", "mid", "high")  # the ordered enum of the filter ``level``
Want = dict[str, tuple[str, str]] | None
WANTS: list[Want] = [
    None, *({"level": (level, method)} for method in ("absolute", "at_least") for level in LEVELS)
]
"""A consumer's filters: none (it takes every message), or one ``level`` it offers."""

AVAILABLE, IN_FLIGHT, DELETED, MOVED = "available", "in flight", "deleted", "moved to the dead-letter queue"
GONE = "collected before its channel was made"
TASK_STATES = {AVAILABLE: "inserted", IN_FLIGHT: "claimed", DELETED: "finished", MOVED: "dead"}


class SharedQueue(RuleBasedStateMachine):
    """The model: message ``n`` (the ``n``-th sent; its body starts with ``n``) has a first id, a
    shard, a group and a filter level; in each channel (``ChannelModel``) a status, its latest
    receipt and how many times it was received."""

    SHARDS = 1
    BODY = 180
    """Bytes a message: a topic segment (``SEGMENT_SIZE``) holds about 20."""
    CHANNELS: tuple[str, ...] = (DEFAULT_CHANNEL,)
    """The topic's channels (each gets every message): ``default`` is the queue's, which sends go
    through; the others are opened with ``Topic.channel``."""
    LATE_CHANNELS = 0
    """How many more channels may be made during a run (``open_channel``; on files)."""
    OFFSET_IDS = True
    """Whether message ids are offsets (a shard's: ``SHARD.OFFSET``), as on files."""
    GROUPS: tuple[str, ...] = ()
    """The message groups that sends draw from, beside none (but with ``GROUP_ALWAYS``)."""
    GROUP_ALWAYS = False
    DEDUP_IDS: tuple[str, ...] = ()
    """The deduplication ids that sends draw from, beside none."""
    MAX_RECEIVES: int | None = None
    """The queue's ``max_receive_count``: a message received that many times goes to the
    dead-letter queue ``dlq`` when a receive next comes to it."""
    FILTERED = False
    """Whether messages carry zkmq filters (a level of ``LEVELS``, or none) and consumers receive
    with filters of their own (``WANTS``)."""
    STALE_REFUSED = True
    """Whether a delete of a stale receipt is refused (``StaleReceiptError``); SQS answers it as
    a success that deletes nothing."""
    PURGES = True
    """Whether ``purge()`` is asked (SQS allows one a minute)."""
    TASKS = True
    """Whether ``task(id)`` is asked, and ``delete_ids`` (mq's delete by id; SQS has neither)."""
    CLOCK = False
    """Whether the queue's clocks (``time.time_ns``, ``time.time`` and ``time.monotonic``, in this
    process) are the model's, moved by ``tick`` alone (so that when a collection is due, say,
    does not hang on how fast the run goes); sends then draw delays, receives visibility timeouts, and
    ``change_visibility`` hides again for a while, with ``CLOCK_HIDE`` and ``CLOCK_DEDUP_WINDOW``
    the queue's settings."""
    RETENTION: float | None = None
    """With ``CLOCK``, the queue's ``retention_seconds``: a message sent longer ago than that is
    never delivered again (nor moved to the dead-letter queue), and its segment may be deleted.
    Which step finishes it is not the model's to say (a receive that comes to it, or the gc):
    its receipts are not used, its task not read, and while it is in flight it may count so or
    not. (Without groups: one still in flight would hold its group back until then.)"""

    def __init__(self) -> None:
        super().__init__()
        self.now = time.time_ns()  # the model's time; the queue's too with ``CLOCK``
        self.real_clock = time.time_ns, time.time, time.monotonic
        if self.CLOCK:
            time.time_ns = lambda: self.now
            time.time = time.monotonic = lambda: self.now / 1e9
        self.patched = {name: getattr(channel_module, name) for name in PATCHED}
        for name, value in PATCHED.items():
            setattr(channel_module, name, value)
        # Where a sharded queue's consumers begin counts the instances made in the process: from
        # 0 in every example, so that a run replays alike (as hypothesis needs to shrink one).
        self.instances = sharded_module._instances
        sharded_module._instances = itertools.count()
        self.root = Path(tempfile.mkdtemp(prefix="journalq-model-"))
        self.brokers = [self.new_broker() for _ in range(PROCESSES)]
        self.settings: dict[str, Any] = {"visibility_timeout": CLOCK_HIDE if self.CLOCK else HIDE, "delay": 0}
        """The queue's settings that the model follows (``configure`` changes them)."""
        if self.CLOCK:
            self.settings["dedup_window"] = CLOCK_DEDUP_WINDOW
        if self.MAX_RECEIVES is not None:
            self.brokers[0].queue("dlq")
            self.settings |= {"max_receive_count": self.MAX_RECEIVES, "dead_letter_queue": "dlq"}
        more: dict[str, Any] = {"enums": {"level": LEVELS}} if self.FILTERED else {}
        if self.RETENTION is not None:
            more |= {"retention_seconds": self.RETENTION}
        self.brokers[0].queue(
            "q", segment_size=SEGMENT_SIZE, task_gc_interval=0.001, shards=self.SHARDS, **self.settings, **more
        )
        self.channels = [ChannelModel(self, name) for name in self.CHANNELS]
        for ch in self.channels[1:]:  # (made before the first send: each gets every message)
            self.channel(0, ch)
        self.moved: list[tuple[ChannelModel, int]] = []  # the dead letters (channel, message), in the order moved
        self.first_id: list[str] = []  # the message's id when first sent (a duplicate's answer)
        self.first_position: list[int] = []  # and so its place in the queue (a redrive moves it in one channel)
        self.first_visible_at: list[int] = []  # when its delay ends
        self.first_sent_at: list[int] = []
        self.positions = itertools.count()
        self.shard: list[int] = []
        self.group: list[str | None] = []
        self.level: list[str | None] = []  # the message's filter ``level``
        self.next_offset = [0] * self.SHARDS
        self.dedup: dict[str, tuple[int, int]] = {}  # deduplication id -> (message sent with it, when)
        self.lapsed: set[str] = set()  # ids whose window ended once (``lapse``)

    def teardown(self) -> None:
        try:
            for broker in self.brokers:
                broker.close()
        finally:
            for name, value in self.patched.items():
                setattr(channel_module, name, value)
            time.time_ns, time.time, time.monotonic = self.real_clock
            sharded_module._instances = self.instances
            shutil.rmtree(self.root, ignore_errors=True)

    def new_broker(self) -> Broker:
        """Another process's broker."""
        return Broker(self.root, sync="none")

    def queue(self, process: int) -> Any:  # a Queue or a ShardedQueue
        return self.brokers[process].queue("q", create=False)

    def channel(self, process: int, ch: ChannelModel) -> Any:  # a Channel or a ShardedChannel (a Queue for the first)
        """Process ``process``'s object of the channel ``ch`` models."""
        if ch is self.channels[0]:
            return self.queue(process)
        return self.brokers[process].topic("q", create=False).channel(ch.name)

    def draw_channel(self, data: st.DataObject, which: Callable[[ChannelModel], bool] = bool) -> ChannelModel:
        """A channel, of those ``which`` says."""
        return data.draw(st.sampled_from([ch for ch in self.channels if which(ch)]))

    def with_receipts(self) -> bool:
        return any(ch.with_receipt() for ch in self.channels)

    def segments_sent(self) -> int:
        """About how many topic segments the messages sent fill."""
        return len(self.group) * self.BODY // SEGMENT_SIZE

    def body(self, n: int) -> bytes:
        """Message ``n``'s body: its number first, ``BODY`` bytes in all (text: SQS bodies are)."""
        return b"%06d" % n + b"-" * (self.BODY - 6)

    def hide(self, seconds: float | None = None) -> float:
        """The visibility timeout of a receive asked for ``seconds`` (None: the queue's)."""
        return self.settings["visibility_timeout"] if seconds is None else seconds

    def duplicate_of(self, dedup: str | None) -> int | None:
        """The message a send with deduplication id ``dedup`` is a duplicate of, if any: the
        latest one stored with it, within the window (whatever its status since)."""
        sent = self.dedup.get(dedup) if dedup is not None else None
        if sent is None or self.CLOCK and self.now - sent[1] > int(self.settings["dedup_window"] * 1e9):
            return None
        return sent[0]

    def lapse(self) -> None:
        """Note the deduplication ids whose window ended now (time moved, or the window changed).
        One whose window ended, then was made longer to cover it again, is a duplicate or not as
        the gc went meanwhile (its segment may have been deleted): the model does not send it
        until its window ends again (``send``)."""
        if not self.CLOCK:
            return  # (no window ends)
        window = int(self.settings["dedup_window"] * 1e9)
        self.lapsed |= {dedup for dedup, (_, sent) in self.dedup.items() if self.now - sent > window}

    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def send(self, process: int, data: st.DataObject) -> None:
        """A batch; a message whose deduplication id was sent before (or earlier in the batch)
        within the window is dropped, and answered with the id of the latest message stored with
        it (the id it was sent with: not where a redrive put it since)."""
        drawn = data.draw(st.lists(
            st.tuples(
                st.sampled_from(self.GROUPS if self.GROUP_ALWAYS else (None, *self.GROUPS)),
                st.sampled_from((None, *self.DEDUP_IDS)),
                st.sampled_from((None, *LEVELS) if self.FILTERED else (None,)),
                # A delay, in seconds; None: the queue's.
                st.sampled_from((None, None, None, 0, 1, 4) if self.CLOCK else (None,)),
            ),
            min_size=1, max_size=12,
        ))
        items: list[bytes | dict[str, Any]] = []
        stores: list[int | None] = []  # for each item: the message it stores (None: a duplicate)
        answered: list[int] = []  # for each item: the message whose id answers it (a duplicate's original)
        visible_at: list[int] = []  # for each message stored: when its delay ends
        first = n = len(self.group)
        for group, dedup, level, delay in drawn:
            original = self.duplicate_of(dedup)
            if dedup in self.lapsed and original is not None:
                dedup = original = None  # (see ``lapse``)
            if original is None:
                if dedup is not None:
                    self.dedup[dedup] = (n, self.now)
                    self.lapsed.discard(dedup)
                self.group.append(group)
                self.level.append(level)
                visible_at.append(self.now + int((self.settings["delay"] if delay is None else delay) * 1e9))
                stores.append(n)
                answered.append(n)
                n += 1
            else:
                stores.append(None)
                answered.append(original)
            body = b"duplicate" if original is not None else self.body(n - 1)
            item: dict[str, Any] = {"body": body, "group_id": group, "dedup_id": dedup}
            if level is not None:
                item["filters"] = {"level": level}
            if delay is not None:
                item["delay"] = delay
            items.append(body if group is None and dedup is None and level is None and delay is None else item)
        ids = self.queue(process).send_many(items)
        for message_id, stored, k in zip(ids, stores, answered):
            if stored is None:
                assert message_id == self.first_id[k], f"a duplicate of message {k} was answered {message_id}"
                continue
            index = 0
            if self.OFFSET_IDS:  # dense: each shard's offsets go up by one
                shard, _, offset = message_id.rpartition(".")
                index = int(shard or 0)
                assert int(offset) == self.next_offset[index], (message_id, self.next_offset)
                self.next_offset[index] += 1
            self.shard.append(index)
            self.first_id.append(message_id)
            self.first_position.append(next(self.positions))
            self.first_visible_at.append(visible_at[stored - first])
            self.first_sent_at.append(self.now)
            for ch in self.channels:
                ch.add(stored)

    @rule(
        process=st.integers(0, PROCESSES - 1), wanted=st.integers(1, 5), choice=st.integers(0, len(WANTS) - 1),
        hide=st.sampled_from((None, 1, 3, 30)), data=st.data(),
    )
    def receive(self, process: int, wanted: int, choice: int, hide: float | None, data: st.DataObject) -> None:
        ch = self.draw_channel(data)
        wants = WANTS[choice] if self.FILTERED else None
        hide = hide if self.CLOCK else None
        got = self.channel(process, ch).receive(wanted, filters=wants, **_visibility(hide))
        ch.received(got, wanted, wants, hide)

    @precondition(lambda self: self.with_receipts())
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def delete(self, process: int, data: st.DataObject) -> None:
        ch = self.draw_channel(data, ChannelModel.with_receipt)
        chosen = data.draw(st.lists(st.sampled_from(ch.with_receipt()), min_size=1, max_size=4, unique=True))
        channel = self.channel(process, ch)
        assert channel.delete_many([ch.receipt[n] for n in chosen]) == [None] * len(chosen)
        for n in chosen:
            ch.finished(n)

    @precondition(lambda self: self.with_receipts())
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data(), seconds=st.sampled_from((0, 0, 2, 20)))
    def change_visibility(self, process: int, data: st.DataObject, seconds: float) -> None:
        """Released (0 seconds), or hidden again from now, back in flight, one message or a few
        in one call: its receipt holds until it is delivered again, but hides it again only
        while no other receive holds its FIFO group."""
        ch = self.draw_channel(data, ChannelModel.with_receipt)
        chosen = data.draw(st.lists(st.sampled_from(ch.with_receipt()), min_size=1, max_size=3, unique=True))
        self.hide_again(process, ch, chosen, seconds if self.CLOCK else 0)

    @precondition(lambda self: any(ch.left_behind()[0] for ch in self.channels))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data(), seconds=st.sampled_from((0, 2, 20)))
    def take_a_group_from_a_late_consumer(self, process: int, data: st.DataObject, seconds: float) -> None:
        """A receive takes a FIFO group from its first message that waits, while later ones are
        back with their receipts still current (given back, or their visibility over); then
        their consumer, late, hides them again: refused, the group is the other receive's now
        (as the case needs this order of steps, the other rules seldom come to it)."""
        ch = self.draw_channel(data, lambda ch: bool(ch.left_behind()[0]))
        wanted, behind = ch.left_behind()
        ch.received(self.channel(process, ch).receive(wanted), wanted)
        behind = [n for n in behind if ch.receipt[n] is not None]  # (not moved to the dead letters meanwhile)
        if not behind:
            return
        chosen = data.draw(st.lists(st.sampled_from(behind), min_size=1, max_size=3, unique=True))
        self.hide_again(data.draw(st.integers(0, PROCESSES - 1)), ch, chosen, seconds if self.CLOCK else 0)

    def hide_again(self, process: int, ch: ChannelModel, chosen: list[int], seconds: float) -> None:
        """Change the visibility of the messages ``chosen`` (one: ``change_visibility``; more:
        ``change_visibility_many``), each refused when another receive took its group since,
        after the changes before it in the call."""
        found = {n: ch.group_taken_since(n) for n in chosen}
        chosen = [n for n in chosen if found[n] is not None]  # (else either answer is right: not asked)
        channel = self.channel(process, ch)
        outcomes: list[object] = [None]
        if len(chosen) == 1 and not found[chosen[0]]:
            channel.change_visibility(ch.receipt[chosen[0]], seconds)  # (what it raises is the test's error)
        elif len(chosen) == 1:
            with pytest.raises(Exception) as raised:
                channel.change_visibility(ch.receipt[chosen[0]], seconds)
            outcomes = [raised.value]
        elif chosen:
            outcomes = channel.change_visibility_many([(ch.receipt[n], seconds) for n in chosen])
        for n, outcome in zip(chosen, outcomes):  # in order: a change counts for the ones after it
            taken = ch.group_taken_since(n)
            if taken or outcome is not None and taken is None:
                self.check_refused(outcome)
                continue
            assert outcome is None, outcome
            ch.status[n] = IN_FLIGHT if seconds else AVAILABLE
            ch.visible_at[n] = self.now + int(seconds * 1e9)

    def check_refused(self, refused: object) -> None:
        """That ``refused`` (an outcome, or what was raised) is the refusal of a change of
        visibility when another receive holds the message's FIFO group since its visibility ended."""
        assert isinstance(refused, StaleReceiptError), refused
        assert "another receive took its FIFO group" in str(refused), refused

    @precondition(lambda self: any(ch.in_flight_receives() for ch in self.channels))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def give_back(self, process: int, data: st.DataObject) -> None:
        """A consumer gives back at once what one receive gave it and it still holds (a batch it
        will not work on): its receipts hold until the messages are delivered again."""
        ch = self.draw_channel(data, ChannelModel.in_flight_receives)
        receive = data.draw(st.sampled_from(ch.in_flight_receives()))
        given = [n for n in ch.with_status(IN_FLIGHT) if ch.receive_of[n] == receive and not ch.retired(n)]
        outcomes = self.channel(process, ch).change_visibility_many([(ch.receipt[n], 0) for n in given])
        assert outcomes == [None] * len(given), outcomes
        for n in given:
            ch.status[n], ch.visible_at[n] = AVAILABLE, self.now

    @precondition(lambda self: self.CLOCK)
    @rule(seconds=st.sampled_from((0.5, 1, 2, 5, 10, 25)))
    def tick(self, seconds: float) -> None:
        """Time passes: the messages whose visibility ended are back (their receipts hold until
        they are delivered again)."""
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)
        for ch in self.channels:
            for n in ch.with_status(IN_FLIGHT):
                if ch.visible_at[n] <= self.now:
                    ch.status[n] = AVAILABLE
        self.lapse()

    @precondition(lambda self: self.CLOCK)
    @rule(
        process=st.integers(0, PROCESSES - 1),
        hide=st.sampled_from((1.0, 2.0, 5.0)),
        delay=st.sampled_from((0, 0, 2)),
        window=st.sampled_from((5.0, 20.0, 40.0)),
        receives=st.sampled_from((1, 2, 3)),
    )
    def configure(self, process: int, hide: float, delay: float, window: float, receives: int) -> None:
        """Another visibility timeout, delay, deduplication window and (with dead letters)
        ``max_receive_count``, by one process; a second later (when each process looks at the
        settings again, at its next send or receive) every process's. A message keeps the
        delay it was sent with."""
        changes: dict[str, Any] = {"visibility_timeout": hide, "delay": delay, "dedup_window": window}
        if self.MAX_RECEIVES is not None:
            changes["max_receive_count"] = receives
        self.queue(process).configure(**changes)
        self.settings |= changes
        self.lapse()
        self.advance(1.0)

    @rule(
        process=st.integers(0, PROCESSES - 1), wanted=st.integers(1, 5), choice=st.integers(0, len(WANTS) - 1),
        hide=st.sampled_from((None, 1, 3, 30)), data=st.data(),
    )
    def consumer_loop(self, process: int, wanted: int, choice: int, hide: float | None, data: st.DataObject) -> None:
        """``receive(delete=...)``: the deletes first, then the receive, in one step."""
        ch = self.draw_channel(data)
        wants = WANTS[choice] if self.FILTERED else None
        hide = hide if self.CLOCK else None
        live = ch.with_receipt()
        chosen = data.draw(st.lists(st.sampled_from(live), max_size=4, unique=True)) if live else []
        receipts = [ch.receipt[n] for n in chosen]
        got = self.channel(process, ch).receive(wanted, delete=receipts, filters=wants, **_visibility(hide))
        for n in chosen:
            ch.finished(n)
        ch.received(got, wanted, wants, hide)

    @rule(process=st.integers(0, PROCESSES - 1), everything=st.booleans(), data=st.data())
    def drain(self, process: int, everything: bool, data: st.DataObject) -> None:
        """A consumer that catches up: receives and deletes all that is available (with
        ``everything``, what is in flight too, released first), so that the cursor passes whole
        segments, which the collections then delete (once every channel's has)."""
        ch = self.draw_channel(data)
        channel = self.channel(process, ch)
        if everything:
            for n in ch.with_status(IN_FLIGHT):
                if ch.retired(n):
                    continue
                channel.change_visibility(ch.receipt[n], 0)
                ch.status[n], ch.visible_at[n] = AVAILABLE, self.now
        while True:
            got = channel.receive(10)
            ch.received(got, 10)
            if not got:
                break
            assert channel.delete_many([m.receipt for m in got]) == [None] * len(got)
            for m in got:
                ch.finished(int(m.body[:6]))
        assert ch.expected(10) == ([], [])

    @precondition(lambda self: any(ch.stale for ch in self.channels))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def stale_receipt(self, process: int, data: st.DataObject) -> None:
        """A receipt of an earlier delivery changes nothing: refused in a delete (SQS: answered as
        a success, as SQS does), and a consumer loop that carries it receives nothing (its other
        deletes are not made either)."""
        ch = self.draw_channel(data, lambda ch: bool(ch.stale))
        n, receipt = data.draw(st.sampled_from(ch.stale))
        channel = self.channel(process, ch)
        (outcome,) = channel.delete_many([receipt])
        if not self.STALE_REFUSED:
            assert outcome is None, outcome
            return  # (the counts, checked next, show that nothing changed)
        assert isinstance(outcome, StaleReceiptError), outcome
        try:
            channel.receive(1, delete=[receipt])
        except ReceiptError as exc:
            assert "nothing received" in str(exc)
        else:
            raise AssertionError(f"a consumer loop with the stale receipt of message {n} went on")

    @precondition(lambda self: self.TASKS and bool(self.group))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def task(self, process: int, data: st.DataObject) -> None:
        """zkmq's view of a message: its state, and while it is not finished, how many times it
        was received (a finished one's count is not kept)."""
        ch = self.draw_channel(data)
        n = data.draw(st.integers(0, len(self.group) - 1))
        if ch.retired(n) or ch.id[n] is None or ch.status[n] == GONE:
            return  # finished or not, collected or not, as the steps since came; or its id unknown
        task = self.channel(process, ch).task(ch.id[n])
        assert task.state == TASK_STATES[ch.status[n]], (n, ch.status[n], task)
        if ch.status[n] in (AVAILABLE, IN_FLIGHT):
            assert task.receive_count == ch.count[n], (n, task)

    @precondition(lambda self: self.TASKS and bool(self.group))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def delete_ids(self, process: int, data: st.DataObject) -> None:
        """mq's delete by id: a message waiting, delayed or in flight is finished (its receipts
        stale), one finished already (or moved) is not found, and so is an id given twice."""
        ch = self.draw_channel(data)
        chosen = data.draw(st.lists(st.integers(0, len(self.group) - 1), min_size=1, max_size=3))
        chosen = [n for n in chosen if not ch.retired(n) and ch.id[n] is not None]
        outcomes = self.channel(process, ch).delete_ids([ch.id[n] for n in chosen])
        for n, outcome in zip(chosen, outcomes):
            if ch.status[n] in (AVAILABLE, IN_FLIGHT):
                assert outcome is None, (n, ch.status[n], outcome)
                ch.finished(n)
            else:
                assert isinstance(outcome, TaskNotFoundError), (n, ch.status[n], outcome)

    @precondition(lambda self: self.PURGES)
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def purge(self, process: int, data: st.DataObject) -> None:
        """Every message sent so far is finished in the channel, those in flight too (their
        receipts stale)."""
        ch = self.draw_channel(data)
        self.channel(process, ch).purge()
        for n in ch.with_status(AVAILABLE) + ch.with_status(IN_FLIGHT):
            ch.finished(n)

    @precondition(lambda self: self.OFFSET_IDS and bool(self.group))
    @rule(process=st.integers(0, PROCESSES - 1), data=st.data())
    def skip(self, process: int, data: st.DataObject) -> None:
        """A skip to the offset of a message (``skip_to``, the way past damage) finishes every
        message of the channel below it in its shard, in flight too (their receipts stale), and
        nothing else: that message and what comes after it stay as they were."""
        ch = self.draw_channel(data)
        n = data.draw(st.sampled_from([n for n, i in enumerate(ch.id) if i is not None]))
        shard, offset = _placed(ch.id[n])
        channel = self.channel(process, ch)
        if self.SHARDS == 1:
            skipped = channel.skip_to(offset)
        else:
            skipped = channel.skip_to(offset, shard=channel.topic.shard_names[shard])
        below = [
            m for m, i in enumerate(ch.id)
            if i is not None and _placed(i)[0] == shard and _placed(i)[1] < offset
            and ch.status[m] in (AVAILABLE, IN_FLIGHT)
        ]
        # At least those: offsets of messages for other channels (redriven), or past retention,
        # that this channel has not come to yet, are finished by the skip too.
        assert skipped >= sum(not ch.retired(m) for m in below), (skipped, below)
        for m in below:
            ch.finished(m)

    @precondition(lambda self: len(self.channels) < len(self.CHANNELS) + self.LATE_CHANNELS)
    @precondition(lambda self: self.segments_sent() > 2)  # (so that one may have been collected)
    @rule(process=st.integers(0, PROCESSES - 1))
    def open_channel(self, process: int) -> None:
        """A channel made now gets every message still stored: from the topic's first segment on
        (those before were collected once every channel then was done with them), but for the
        dead letters redriven to another channel."""
        name = f"late{len(self.channels)}"
        topic = self.brokers[process].topic("q", create=False)
        first = [shard.first_offset() for shard in getattr(topic, "shards", [topic])]  # (each shard's)
        topic.channel(name)
        ch = ChannelModel(self, name)
        for n in range(len(self.group)):
            ch.add(n)
            if int(self.first_id[n].rpartition(".")[2]) < first[self.shard[n]]:
                ch.status[n] = GONE
        self.channels.append(ch)

    @rule(process=st.integers(0, PROCESSES - 1))
    def restart(self, process: int) -> None:
        self.brokers[process].close()
        self.brokers[process] = self.new_broker()

    @rule(process=st.integers(0, PROCESSES - 1))
    def collect(self, process: int) -> None:
        self.brokers[process].gc()

    @rule(process=st.integers(0, PROCESSES - 1))
    def drain_dead_letters(self, process: int) -> None:
        """The dead-letter queue holds the messages moved, in the order moved, once each (for
        each channel that moved it), with their groups. (Received one at a time.)"""
        if self.MAX_RECEIVES is None:
            return
        letters = self.brokers[process].queue("dlq", create=False)
        found = []
        while got := letters.receive(1):
            (m,) = got
            n = int(m.body[:6])
            assert m.body == self.body(n) and m.group_id == self.group[n]
            found.append(n)
            letters.delete(m.receipt)
        moved = [n for _, n in self.moved]
        assert found == moved, f"the dead-letter queue holds {found}, not {moved}, the messages moved"
        self.moved.clear()

    @precondition(lambda self: self.MAX_RECEIVES is not None and self.SHARDS == 1 and bool(self.moved))
    @rule(process=st.integers(0, PROCESSES - 1))
    def redrive(self, process: int) -> None:
        """The dead letters back to the channel each came from (the topic's other channels had
        them), in the order moved, as new messages at its end: received again (their receive
        counts start again), delayed as the queue delays new ones, moved again after
        ``max_receive_count`` more receives; a duplicate of one is still answered with the id it
        was first sent with."""
        assert self.brokers[process].queue("dlq", create=False).redrive() == len(self.moved)
        for ch, n in list(self.moved):  # (the dead-letter queue's receives give them in the order moved)
            message_id = None  # (on files, its offset: the next one)
            if self.OFFSET_IDS:
                message_id = str(self.next_offset[0])
                self.next_offset[0] += 1
            ch.redriven(n, message_id)
        self.moved.clear()

    @invariant()
    def counts(self) -> None:
        for ch in self.channels:
            stats = self.channel(0, ch).stats()
            every = range(len(ch.status))
            available = sum(map(ch.waiting, every))
            in_flight = ch.with_status(IN_FLIGHT)
            retired = sum(map(ch.retired, in_flight))  # counted while their segment is there
            assert stats.available == available, (ch.name, stats, available)
            assert len(in_flight) - retired <= stats.in_flight <= len(in_flight), (ch.name, stats, retired)
            if self.CLOCK:
                assert stats.delayed == sum(map(ch.delayed, every)), (ch.name, stats)
            if self.MAX_RECEIVES is not None:
                assert stats.dead == ch.dead, (ch.name, stats, ch.dead)
        if self.MAX_RECEIVES is not None:
            assert self.brokers[0].queue("dlq", create=False).stats().available == len(self.moved)


class ChannelModel:
    """One channel's view of the topic's messages: every channel gets every message sent (``n``,
    the topic's ``n``-th), each with its own status, latest receipt, receive count and time to
    come back; its own id and place in the queue too, once a redrive sent it back from the
    dead-letter queue (to that channel alone)."""

    def __init__(self, model: SharedQueue, name: str) -> None:
        self.model = model
        self.name = name
        self.id: list[str | None] = []  # the message's id (None: redriven, learned when received)
        self.position: list[int] = []  # where the message is in the queue: its order
        self.status: list[str] = []
        self.receipt: list[str | None] = []
        self.receive_of: list[int] = []  # which receive of this channel made the latest delivery
        self.receives = 0  # receives of this channel so far
        self.count: list[int] = []
        self.visible_at: list[int] = []
        """When the message may go out (its delay ended), or while in flight, comes back (ns)."""
        self.sent_at: list[int] = []  # when it was sent (or redriven): retention counts from then
        self.dead = 0  # moves to the dead-letter queue so far (a message redriven may move again)
        self.stale: list[tuple[int, str]] = []  # (message, a receipt of an earlier delivery)

    def __repr__(self) -> str:  # (how a failing run's steps show the channel drawn)
        return f"<channel {self.name!r}>"

    def add(self, n: int) -> None:
        """Message ``n``, as it was sent."""
        model = self.model
        self.id.append(model.first_id[n])
        self.position.append(model.first_position[n])
        self.status.append(AVAILABLE)
        self.receipt.append(None)
        self.receive_of.append(-1)
        self.count.append(0)
        self.visible_at.append(model.first_visible_at[n])
        self.sent_at.append(model.first_sent_at[n])

    def with_status(self, status: str) -> list[int]:
        return [n for n, s in enumerate(self.status) if s == status]

    def with_receipt(self) -> list[int]:
        """The messages whose latest receipt still works: in flight, or back (by a change of
        visibility or its end) and not delivered again since."""
        return [n for n, r in enumerate(self.receipt) if r is not None and not self.retired(n)]

    def group_taken_since(self, n: int) -> bool | None:
        """Whether message ``n``, back (its visibility ended, or released), is of a FIFO group that
        another receive holds now: its receipt may not hide it again (two holders of a group).
        None when only messages past retention hold it (the queue forgets them when their
        segment goes: either answer is right)."""
        group = self.model.group[n]
        if group is None or self.status[n] != AVAILABLE:
            return False
        holders = [
            m for m in range(len(self.status))
            if self.status[m] == IN_FLIGHT and self.model.group[m] == group and self.receive_of[m] != self.receive_of[n]
        ]
        if not holders:
            return False
        return True if not all(map(self.retired, holders)) else None

    def left_behind(self) -> tuple[int, list[int]]:
        """A receive of how many (without filters; at most 10, as SQS's) takes a FIFO group from
        the first message of it that waits, and the messages of that group which it leaves
        back with their receipts still current (given back, or their visibility over): the
        first such group, if any (else 0 and none)."""
        taken, _ = self.expected(10)
        for j, first in enumerate(taken):
            group = self.model.group[first]
            behind = [
                n for n in self.with_receipt()
                if self.status[n] == AVAILABLE and self.model.group[n] == group and n not in taken[: j + 1]
            ]
            if group is not None and behind:
                return j + 1, behind
        return 0, []

    def in_flight_receives(self) -> list[int]:
        """The receives (``receive_of``) whose deliveries are in flight still, some of them."""
        return sorted({self.receive_of[n] for n in self.with_status(IN_FLIGHT) if not self.retired(n)})

    def retired(self, n: int) -> bool:
        """Whether message ``n`` is past retention."""
        model = self.model
        return model.RETENTION is not None and self.sent_at[n] < model.now - int(model.RETENTION * 1e9)

    def delayed(self, n: int) -> bool:
        return self.status[n] == AVAILABLE and self.visible_at[n] > self.model.now

    def waiting(self, n: int) -> bool:
        """Whether message ``n`` may be received now (by a consumer its filters match, its group
        free): available, neither delayed nor past retention."""
        return self.status[n] == AVAILABLE and not self.delayed(n) and not self.retired(n)

    def expected(self, wanted: int, wants: Want = None) -> tuple[list[int], list[int]]:
        """What a receive of ``wanted`` with the consumer filters ``wants`` may give, oldest
        first: the available messages its filters match whose delay is over, but for one whose
        group has a message in flight, or one not matched or delayed before it; and what
        it moves to the dead-letter queue: each one received ``max_receive_count`` times already
        that it comes to before it has ``wanted``."""
        model = self.model
        blocked = {model.group[n] for n in self.with_status(IN_FLIGHT)}
        taken: list[int] = []
        moved: list[int] = []
        for n in sorted(self.with_status(AVAILABLE), key=self.position.__getitem__):
            if len(taken) == wanted:
                break
            if self.retired(n):
                continue  # finished unseen
            group = model.group[n]
            if not _matches(model.level[n], wants) or self.visible_at[n] > model.now:
                blocked.add(group)  # nothing after it in its group goes to this consumer first
                continue
            if group is None or group not in blocked:
                if model.MAX_RECEIVES is not None and self.count[n] >= model.settings["max_receive_count"]:
                    moved.append(n)
                    continue
                taken.append(n)  # (its group's next ones may follow it)
        return taken, moved

    def received(self, got: list, wanted: int, wants: Want = None, hide: float | None = None) -> None:
        """Check a receive's messages against the model, then note them as delivered (for
        ``hide`` seconds, None: the queue's visibility timeout). One queue:
        exactly ``expected``. Sharded (no groups, no filters): as many as are available up to
        ``wanted``, each shard's the oldest available of that shard, in order."""
        model = self.model
        numbers = [int(m.body[:6]) for m in got]
        assert [m.id for m in got] == [m.id if self.id[n] is None else self.id[n] for m, n in zip(got, numbers)]
        taken, moved = self.expected(wanted, wants)
        if model.SHARDS == 1:
            assert numbers == taken, "not the oldest available, in order"
        else:
            assert len(numbers) == len(taken), "fewer than asked for, with more available"
            for shard in set(model.shard[n] for n in numbers):
                taken = [n for n in numbers if model.shard[n] == shard]
                available = [n for n in range(len(self.status)) if model.shard[n] == shard and self.waiting(n)]
                assert taken == available[: len(taken)], f"shard {shard}: not its oldest available, in order"
        for m, n in zip(got, numbers):
            assert m.body == model.body(n) and m.group_id == model.group[n]
            assert m.filters == ({} if model.level[n] is None else {"level": model.level[n]})
            self.count[n] += 1
            assert m.receive_count == self.count[n]
            if self.receipt[n] is not None:
                self.stale.append((n, self.receipt[n]))
            self.status[n], self.receipt[n], self.id[n] = IN_FLIGHT, m.receipt, m.id
            self.receive_of[n] = self.receives
            self.visible_at[n] = model.now + int(model.hide(hide) * 1e9)
        self.receives += 1
        for n in moved:
            self.finished(n, MOVED)
        model.moved += [(self, n) for n in moved]
        self.dead += len(moved)

    def finished(self, n: int, how: str = DELETED) -> None:
        if self.receipt[n] is not None:
            self.stale.append((n, self.receipt[n]))
        self.status[n], self.receipt[n] = how, None

    def redriven(self, n: int, message_id: str | None) -> None:
        """Message ``n`` sent back to this channel's end by a redrive, as ``message_id`` (None:
        learned when received)."""
        model = self.model
        self.position[n] = next(model.positions)
        self.id[n] = message_id
        self.status[n], self.count[n] = AVAILABLE, 0
        self.visible_at[n] = model.now + int(model.settings["delay"] * 1e9)
        self.sent_at[n] = model.now


def _matches(level: str | None, wants: Want) -> bool:
    """Whether a consumer with filters ``wants`` takes a message of filter ``level`` (zkmq's rules:
    ``journalq.queue.filters``)."""
    if wants is None or level is None:
        return True
    offered, method = wants["level"]
    return offered == level if method == "absolute" else LEVELS.index(offered) >= LEVELS.index(level)


def _placed(message_id: str) -> tuple[int, int]:
    """The shard (0 in a queue of one) and the offset of a message id on files: ``OFFSET`` or
    ``SHARD.OFFSET``."""
    shard, _, offset = message_id.rpartition(".")
    return int(shard or 0), int(offset)


def _visibility(hide: float | None) -> dict[str, float]:
    """A receive's keyword for a visibility timeout of ``hide`` seconds (None: the queue's)."""
    return {} if hide is None else {"visibility_timeout": hide}




SETTINGS = settings(
    max_examples=30, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
SharedQueue.TestCase.settings = SETTINGS
TestSharedQueue = SharedQueue.TestCase


class SharedQueueWithGroups(SharedQueue):
    """The same, its messages in two groups or none, some with deduplication ids."""

    GROUPS = ("a", "b")
    DEDUP_IDS = ("x", "y", "z")


SharedQueueWithGroups.TestCase.settings = SETTINGS
TestSharedQueueWithGroups = SharedQueueWithGroups.TestCase


class SharedShardedQueue(SharedQueue):
    """The same on a queue in four shards (each process's sends and receives begin at a shard of
    its own: its home), some of its messages with deduplication ids (looked for in every shard)."""

    SHARDS = 4
    DEDUP_IDS = ("x", "y", "z")


SharedShardedQueue.TestCase.settings = SETTINGS
TestSharedShardedQueue = SharedShardedQueue.TestCase


class SharedShardedQueueWithClock(SharedShardedQueue):
    """The same on four shards, with the model's clock and messages kept 30 seconds."""

    CLOCK = True
    RETENTION = 30.0
    PURGES = False


SharedShardedQueueWithClock.TestCase.settings = SETTINGS
TestSharedShardedQueueWithClock = SharedShardedQueueWithClock.TestCase


class SharedQueueWithDeadLetters(SharedQueue):
    """The same, its messages in two groups or none, with filters, moved to a dead-letter queue
    when released and received again."""

    GROUPS = ("a", "b")
    MAX_RECEIVES = 1
    FILTERED = True


SharedQueueWithDeadLetters.TestCase.settings = SETTINGS
TestSharedQueueWithDeadLetters = SharedQueueWithDeadLetters.TestCase


class SharedQueueWithClock(SharedQueue):
    """The same with the model's clock: delays, visibility timeouts that end, receipts of
    deliveries that ended, deduplication windows that end; messages in two groups or none, with
    filters, moved to a dead-letter queue when received twice already."""

    CLOCK = True
    GROUPS = ("a", "b")
    DEDUP_IDS = ("x", "y", "z")
    MAX_RECEIVES = 2
    FILTERED = True
    PURGES = False  # (which end everything: the other machines ask them)


SharedQueueWithClock.TestCase.settings = SETTINGS
TestSharedQueueWithClock = SharedQueueWithClock.TestCase


class SharedQueueWithRetention(SharedQueueWithClock):
    """The same, its messages kept 30 seconds (and in no group)."""

    RETENTION = 30.0
    GROUPS = ()


SharedQueueWithRetention.TestCase.settings = SETTINGS
TestSharedQueueWithRetention = SharedQueueWithRetention.TestCase


class SharedTopicWithChannels(SharedQueueWithClock):
    """The same on a topic with three channels, each getting every message (its segments deleted
    once every channel is done with them), each with its own dead letters, redriven to it alone."""

    CHANNELS = (DEFAULT_CHANNEL, "audit", "replay")
    LATE_CHANNELS = 1
    BODY = 900  # (a segment of 4 or 5: one all three channels finished with is met more often)
    DEDUP_IDS = ()  # (which keep their segments for the window: the other machines have them)


SharedTopicWithChannels.TestCase.settings = SETTINGS
TestSharedTopicWithChannels = SharedTopicWithChannels.TestCase


class SharedTopicWithChannelsAndPurges(SharedQueueWithGroups):
    """Two channels, with purges (of one channel: the other keeps its messages), no clock, and no
    deduplication ids (which would keep their segments for the window, five minutes here)."""

    CHANNELS = (DEFAULT_CHANNEL, "audit")
    LATE_CHANNELS = 2
    DEDUP_IDS = ()
    BODY = 900


SharedTopicWithChannelsAndPurges.TestCase.settings = SETTINGS
TestSharedTopicWithChannelsAndPurges = SharedTopicWithChannelsAndPurges.TestCase


class SharedShardedTopicWithChannels(SharedShardedQueueWithClock):
    """Two channels on four shards (and one made during the run), with the model's clock and
    retention."""

    CHANNELS = (DEFAULT_CHANNEL, "audit")
    LATE_CHANNELS = 1
    BODY = 900


SharedShardedTopicWithChannels.TestCase.settings = SETTINGS
TestSharedShardedTopicWithChannels = SharedShardedTopicWithChannels.TestCase


_zookeeper: list[Any] = []  # the session's server, for the ZooKeeper store's machine (below)
_zookeeper_paths = itertools.count()


@pytest.fixture
def zookeeper_for_the_model(zookeeper_server: Any) -> Iterator[None]:
    _zookeeper.append(zookeeper_server)
    yield
    _zookeeper.clear()


class SharedQueueOnZooKeeper(SharedQueueWithDeadLetters):
    """The same on the ZooKeeper store (its task ids are no offsets; the constants made small
    above are the file store's, and change nothing here). A broker closed and opened again is a
    clean restart: its deliveries keep their visibility and their receipts."""

    OFFSET_IDS = False
    DEDUP_IDS = ("x", "y")

    def new_broker(self) -> Broker:
        if not hasattr(self, "url"):
            self.url = _zookeeper[0].url(f"/model{os.getpid()}x{next(_zookeeper_paths)}")
        return Broker(self.url, sync="none")


SharedQueueOnZooKeeper.TestCase.settings = settings(SETTINGS, max_examples=20)
TestSharedQueueOnZooKeeper = pytest.mark.usefixtures("zookeeper_for_the_model")(SharedQueueOnZooKeeper.TestCase)


class SharedFifoQueueOnZooKeeper(SharedQueueOnZooKeeper):
    """The ZooKeeper store's FIFO queue: every message in one of two groups, none dead-lettered
    (which would move a group's messages given back, the ones its late consumer hides again),
    and neither purges nor ends by id (the other machine asks them): its steps go to receipts."""

    GROUP_ALWAYS = True
    MAX_RECEIVES = None
    PURGES = False
    TASKS = False


SharedFifoQueueOnZooKeeper.TestCase.settings = settings(SETTINGS, max_examples=15, stateful_step_count=50)
TestSharedFifoQueueOnZooKeeper = pytest.mark.usefixtures("zookeeper_for_the_model")(SharedFifoQueueOnZooKeeper.TestCase)
