"""The ZooKeeper store's tree and records, free of I/O: URLs, paths, task ids, queue entries,
receipts and the garbage collector's decisions.

One queue is one zkmq directory under the broker's path::

    /path/<queue>                  the queue's settings (JSON), but the two below
        /queue/<task>              pending tasks: the entry (JSON) says when the task is visible,
                                   how often it was received, by whom, its group and filters, and
                                   the later tasks of its group claimed with it (``Entry.then``)
        /tasks/<task>
            /filters/<name>        the message's zkmq filters
            /state                 inserted, claimed, finished or dead
            /metadata              JSON: attributes, delay, group, source and the task metadata
            /data                  the body, as sent
            /claim                 ephemeral: the lock of the consumer that holds the task
        /consumers/<id>            a consumer: one session of a queue handle (a new id in each)
            /current               ephemeral while the consumer lives: the ids it last received
        /dedup/<key>               a deduplication id sent within the window (made with the first
                                   send's queue entry): JSON, the task it names and when it was sent;
                                   ``key`` is the id's SHA-256 (an id may hold any character)
        /conf                      data (JSON): when the last collection began and by whom, and
                                   how many tasks went to the dead-letter queue (counted so before
                                   ``dead_letters``)
            /task_gc_lifetime      seconds, as text
            /task_gc_interval      seconds, as text
            /lock                  ephemeral, held by whoever collects now
            /dead_letters          counts the tasks moved to the dead-letter queue (with ``conf``'s
                                   count of before): its child version, which the transaction that
                                   marks a task dead raises by two (a child made and deleted)
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from journalq.errors import InvalidMessageError, InvalidSettingError, ReceiptError
from journalq.queue.envelope import parse_message_id
from journalq.queue.settings import check_number

SCHEME = "zk://"
CLIENT_LOG = "journalq.queue.zookeeper.client"
"""The logger the store gives kazoo: its notes on each reconnection attempt, apart from the
store's own warnings (a dead-letter queue that cannot take its letters, say)."""
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?$")
_PATH = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")

INSERTED, CLAIMED, FINISHED, DEAD = "inserted", "claimed", "finished", "dead"
STATES = (INSERTED, CLAIMED, FINISHED, DEAD)


def is_zookeeper_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def parse_url(url: str) -> tuple[str, str]:
    """``zk://host:port[,host:port]/path`` as (kazoo's hosts string, the path)."""
    if not is_zookeeper_url(url):
        raise InvalidSettingError(f"a ZooKeeper store is given as zk://host:port[,host:port]/path, not {url!r}")
    rest = url[len(SCHEME):]
    hosts, slash, path = rest.partition("/")
    path = (slash + path).rstrip("/")
    for host in hosts.split(","):
        match = _HOST.fullmatch(host)
        if match is None or (match[2] is not None and not 0 < int(match[2][1:]) < 65536):
            raise InvalidSettingError(f"ZooKeeper URL {url!r}: {host!r} is not host or host:port")
    parts = path.split("/")
    if not _PATH.fullmatch(path) or "." in parts or ".." in parts or parts[1] == "zookeeper":
        raise InvalidSettingError(
            f"ZooKeeper URL {url!r} needs a path of one or more /names (letters, digits, '-', '_', '.'), "
            "not the root, '.', '..' or /zookeeper"
        )
    return hosts, path


MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT = 0.2, 600.0
"""The session timeouts (seconds) that the store takes."""


def check_session_timeout(seconds: object, name: str = "session_timeout") -> float:
    """``seconds`` as a session timeout the store takes, or ``InvalidSettingError`` naming it
    ``name``."""
    return check_number(name, seconds, MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT)


@dataclass(frozen=True)
class Paths:
    """The nodes of the queue ``name`` under the broker's ``root`` path."""

    root: str
    name: str

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.name}"

    @property
    def queue(self) -> str:
        return f"{self.dir}/queue"

    @property
    def tasks(self) -> str:
        return f"{self.dir}/tasks"

    @property
    def consumers(self) -> str:
        return f"{self.dir}/consumers"

    @property
    def conf(self) -> str:
        return f"{self.dir}/conf"

    @property
    def dead_letters(self) -> str:
        return f"{self.dir}/conf/dead_letters"

    @property
    def dedup(self) -> str:
        return f"{self.dir}/dedup"

    def dedup_record(self, dedup_id: str) -> str:
        """The node of a deduplication id: named by its SHA-256, as an id may hold any character
        (a '/', say) and a node name may not."""
        return f"{self.dir}/dedup/{hashlib.sha256(dedup_id.encode()).hexdigest()}"

    def entry(self, task: str) -> str:
        return f"{self.dir}/queue/{task}"

    def task(self, task: str, part: str | None = None) -> str:
        return f"{self.dir}/tasks/{task}" + (f"/{part}" if part else "")

    def consumer(self, consumer: str, part: str | None = None) -> str:
        return f"{self.dir}/consumers/{consumer}" + (f"/{part}" if part else "")


class TaskIds:
    """Task ids that sort in the order of sending: the sender's clock in nanoseconds (19 digits,
    rising strictly within a process) and 5 random digits, so two senders never make the same."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def make(self, count: int) -> list[tuple[str, int]]:
        """``count`` new ids, each with its time in nanoseconds."""
        with self._lock:
            start = max(time.time_ns(), self._last + 1)
            self._last = start + count - 1
        return [(f"{start + i:019d}{secrets.randbelow(100_000):05d}", start + i) for i in range(count)]


def check_task_id(task: object) -> str:
    """A task id as given: digits only, as the file store's ids (anything else cannot name a
    task, nor a node), and at most 40 of them."""
    parse_message_id(task)  # type: ignore[arg-type]
    assert isinstance(task, str)
    if len(task) > 40:
        raise InvalidMessageError(f"message id {task!r} is not one of this queue's ids")
    return task


def sent_at_ns(task: str) -> int:
    """When the task was sent, by its sender's clock (the id's first 19 digits)."""
    return int(task[:19]) if len(task) >= 19 else 0


@dataclass(frozen=True)
class Entry:
    """A pending task's queue entry: visible from ``at`` (ms since the epoch); received ``count``
    times; held by consumer ``by`` (None when nobody claimed it since it was sent or released).
    ``kept``: its consumer left cleanly (closed), so the visibility timeout still holds; a
    consumer that died (its session ended) gives its tasks back at once instead. ``moving``: the
    claim is a dead-letter mover's (the receive count ran out), which no receipt of an earlier
    delivery may delete or change: the task would be both deleted and dead-lettered."""

    at: int
    count: int = 0
    by: str | None = None
    group: str | None = None
    filters: dict[str, str] = field(default_factory=dict)
    kept: bool = False
    moving: bool = False
    received: int = 0
    """When the claim was made (ms; 0: not claimed, or by a version that did not write it), for
    ``change_visibility_many``'s ``within``."""
    then: tuple[str, ...] = ()
    """The later tasks of its FIFO group that the same receive claimed (SQS FIFO's batches). A
    look that finds this task available reads them too, and while one of them is held nothing
    of the group goes out: a consumer that gives back the first of its batch keeps the rest."""

    def encode(self) -> bytes:
        data: dict[str, Any] = {"at": self.at, "n": self.count}
        if self.by is not None:
            data["by"] = self.by
        if self.group is not None:
            data["g"] = self.group
        if self.filters:
            data["f"] = self.filters
        if self.kept:
            data["k"] = 1
        if self.moving:
            data["mv"] = 1
        if self.received:
            data["r"] = self.received
        if self.then:
            data["t"] = self.then
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        try:
            data = json.loads(raw)
            then = data.get("t", ())
            if not isinstance(then, list | tuple) or not all(isinstance(task, str) for task in then):
                then = ()  # (damaged: the group's order is kept as far as the other entries tell)
            return cls(int(data["at"]), int(data.get("n", 0)), data.get("by"), data.get("g"), dict(data.get("f", {})),
                       bool(data.get("k")), bool(data.get("mv")), int(data.get("r", 0)), tuple(then))
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls(0)  # a damaged entry is delivered rather than stuck: at least once

    def held(self, now_ms: int, live: Container[str]) -> bool:
        """Hidden by a consumer's claim: a live consumer's, or one that left cleanly."""
        return self.by is not None and self.at > now_ms and (self.kept or self.by in live)

    def holds_group(self, now_ms: int, live: Container[str]) -> bool:
        """Hidden as a delivery, which holds its FIFO group: held by a claim, or given back and
        hidden again by its receipt (a release with a delay, a change of visibility after it:
        the entry names no holder then, but whoever has the receipt works on it, as on files)."""
        return self.held(now_ms, live) or (self.by is None and self.count > 0 and self.at > now_ms)

    def available(self, now_ms: int, live: Container[str]) -> bool:
        """Receivable now: its time came, or the consumer that held it died (session over)."""
        return self.at <= now_ms or (self.by is not None and not self.kept and self.by not in live)

    def hidden(self, hide_ms: int, now_ms: int) -> Entry:
        """This delivery's entry once its receipt hides it for ``hide_ms`` from ``now_ms`` (0:
        gives it back): still its holder's while hidden; its count, claim time and later tasks
        (``then``) kept."""
        return Entry(now_ms + hide_ms, self.count, self.by if hide_ms else None, self.group, self.filters,
                     self.kept and bool(hide_ms), received=self.received, then=self.then)


def group_guard(
    task: str, entry: Entry, group: Mapping[str, tuple[Entry, int]], now_ms: int, live: Container[str]
) -> tuple[bool, list[tuple[str, int, Entry | None]]]:
    """For a change that hides ``task`` again after its claim ran out (``entry``, of a FIFO
    group whose pending tasks' entries are ``group``, (entry, version) by task, oldest first):
    whether another receive took the group since (a task of it holds the group for another
    claim: its time, ``Entry.received``, differs; a receive claims a group's tasks at one time).
    If not, what the change's transaction must also do, as (task, version, None) to check an
    entry of the group unchanged (a claim of one meanwhile fails the change), or (task, version,
    entry) to write that entry: the group's first task, if it comes before ``task`` and is free,
    names ``task`` among its later ones (``Entry.then``), so that no look claims it while
    ``task`` is hidden."""
    guard: list[tuple[str, int, Entry | None]] = []
    for other, (found, version) in group.items():
        if other == task:
            continue
        holds = found.holds_group(now_ms, live)
        if holds and found.received != entry.received:
            return True, []
        if not guard and other < task and not holds and task not in found.then:
            guard.append((other, version, replace(found, then=(*found.then, task))))
        else:
            guard.append((other, version, None))
    return False, guard


@dataclass(frozen=True)
class SentFacts:
    """What a pending task's queue entry says that never changes: its FIFO group and filters
    (every rewrite of the entry keeps them: a claim, a release, a close), and ``due``, when it
    becomes visible (ms) as its sender wrote it, known only while that is to come (else None).
    Until then its entry stays as written (version 0) or goes (ended by id): nobody can claim
    it before ``due``, and nothing but a claim rewrites an entry. (A consumer whose clock is
    ahead of its sender's may claim it early; the others see that at ``due``.)"""

    group: str | None
    filters: dict[str, str]
    due: int | None = None

    @classmethod
    def of(cls, entry: Entry, version: int, now_ms: int) -> SentFacts:
        """The facts of ``entry``, read at ``version`` (0: as its sender made it) at ``now_ms``."""
        return cls(entry.group, entry.filters, entry.at if version == 0 and entry.at > now_ms else None)

    def delayed(self, now_ms: int) -> bool:
        """Not visible yet, as sent: its entry is still the sender's (``unclaimed_entry``)."""
        return self.due is not None and self.due > now_ms

    def unclaimed_entry(self) -> Entry:
        """The entry (version 0) as its sender wrote it, for a task ``delayed`` still."""
        assert self.due is not None
        return Entry(self.due, 0, None, self.group, self.filters)


class KnownTasks:
    """A broker's ``SentFacts`` of the pending tasks its receives read, so that later receives
    read again only the entries that can say something new (50,000 delayed tasks were 50,000
    reads per receive). Per queue incarnation: ``queue`` is (its node's path, the node's czxid),
    as a queue deleted and made again under its name is another queue, whose task names may be
    those of the first's (its tasks and consumers nodes are made anew). Within one, a task name
    is never made twice (``TaskIds``: the sender's clock in ns, strictly rising, and 5 random
    digits; and a send of an existing name fails on its task node). A task is forgotten when it
    is known to be gone and when a fresh listing of the queue lacks it (``retain``).

    At most ``limit`` tasks in all: once full, no more are added until some are forgotten (a
    receive scans its queue in one order each time: evicting the oldest would evict each task
    before its next use). Readers use ``facts``'s mapping without a lock (one ``get`` each);
    the changes hold the lock."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._queues: dict[str, tuple[int, dict[str, SentFacts]]] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def _of(self, queue: tuple[str, int]) -> dict[str, SentFacts]:
        """(Under the lock.) The incarnation's facts; an older incarnation's are dropped."""
        path, created = queue
        known = self._queues.get(path)
        if known is None or known[0] != created:
            if known is not None:
                self._size -= len(known[1])
            known = self._queues[path] = (created, {})
        return known[1]

    def facts(self, queue: tuple[str, int]) -> Mapping[str, SentFacts]:
        with self._lock:
            return self._of(queue)

    def add(self, queue: tuple[str, int], task: str, facts: SentFacts) -> None:
        with self._lock:
            known = self._of(queue)
            if task not in known and self._size < self.limit:
                known[task] = facts
                self._size += 1

    def forget(self, queue: tuple[str, int], task: str) -> None:
        with self._lock:
            if self._of(queue).pop(task, None) is not None:
                self._size -= 1

    def retain(self, queue: tuple[str, int], pending: Iterable[str]) -> None:
        """Forget the tasks of ``queue`` that are not ``pending`` (a fresh listing)."""
        with self._lock:
            known = self._of(queue)
            if not known:
                return  # (nothing to compare the listing with: spared a set of it)
            for task in known.keys() - set(pending):
                del known[task]
                self._size -= 1

    def drop(self, path: str) -> None:
        """Forget the queue at ``path`` (deleted)."""
        with self._lock:
            known = self._queues.pop(path, None)
            if known is not None:
                self._size -= len(known[1])


_RECEIPT = re.compile(r"([0-9]{1,40})\.([1-9][0-9]{0,9})")


def receipt(task: str, count: int) -> str:
    return f"{task}.{count}"


def parse_receipt(value: object) -> tuple[str, int]:
    match = _RECEIPT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ReceiptError(f"receipt {value!r} is not a receipt of this queue")
    return match[1], int(match[2])


@dataclass(frozen=True)
class DedupRecord:
    """What a deduplication id's node holds: the task that the first send with it made, and when
    that was sent (ms since the epoch, by the sender's clock, as the queue entry's times)."""

    task: str
    at: int

    def encode(self) -> bytes:
        return json.dumps({"id": self.task, "at": self.at}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> DedupRecord | None:
        """The record, or None when it is damaged (then it deduplicates nothing: replaced)."""
        try:
            data = json.loads(raw)
            return cls(check_task_id(data["id"]), int(data["at"]))
        except (ValueError, TypeError, KeyError, InvalidMessageError):
            return None

    def holds(self, now_ms: int, window_ms: int) -> bool:
        """Whether a send now with the same id is a duplicate: within the window (as on files)."""
        return self.at >= now_ms - window_ms


def dedup_collectable(created_ms: int, now_ms: int, window_ms: int) -> bool:
    """Whether the collector deletes a deduplication record made at ``created_ms`` (both times
    the server's): once the window is over, it deduplicates nothing."""
    return created_ms < now_ms - window_ms


@dataclass(frozen=True)
class TaskFacts:
    """What the garbage collector reads of one task (times in ms by the server's clock)."""

    created: int
    state: str | None
    state_changed: int
    pending: bool
    """Has a queue entry."""


def collectable(facts: TaskFacts, now_ms: int, lifetime_ms: int, orphan_grace_ms: int) -> bool:
    """Whether the collector deletes this task now.

    A finished or dead task goes ``lifetime`` after it finished. A task with no queue entry that
    is neither is what a sender left when it died between the steps of a send (data, metadata and
    filters, entry): nobody can see it; it goes once it is older than any send in progress could
    be (``orphan_grace``). A pending task is never collected.
    """
    if facts.state in (FINISHED, DEAD):
        return facts.state_changed <= now_ms - lifetime_ms
    if facts.pending:
        return False
    return facts.created <= now_ms - orphan_grace_ms
