"""Queue settings, kept in ``TOPIC/queue.json`` beside the journal (sej ignores the file).

Names, defaults and ranges follow Amazon SQS where the meaning is the same.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from journalq.errors import (
    InvalidNameError,
    InvalidSettingError,
    JournalError,
    QueueNotFoundError,
    SettingsFileError,
    StorageError,
)
from journalq.journal.recovery import fsync_dir, replace_file, write_temporary
from journalq.journal.segment import open_journal_file

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,79}$")
MAX_NAME_LENGTH = 80
MAX_SHARDS = 1024  # 2**10: sej's largest shard bit


def check_name(name: str, what: str = "queue") -> str:
    """A queue, topic or channel name: letters, digits, ``-``, ``_`` and ``.`` (not first, no
    ``..``), at most 80 characters, so that it can never name a path outside the data directory."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"{what} name {name!r} must be 1 to 80 letters, digits, '-', '_' or '.', "
            "not starting with '.' and without '..'"
        )
    return name


def check_number(name: str, value: object, low: float, high: float | None = None) -> float:
    """``value`` as a finite number from ``low`` to ``high``, or ``InvalidSettingError`` naming it."""
    # (An int is finite: ``math.isfinite`` of one past a float's range raises OverflowError.)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not math.isfinite(value)
    ):
        raise InvalidSettingError(f"{name} must be a finite number, not {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        # (Not the digits of a huge int: past 4300 of them, ``repr`` itself raises.)
        huge = isinstance(value, int) and value.bit_length() > 64
        shown = f"a number of {value.bit_length()} bits" if huge else repr(value)
        raise InvalidSettingError(f"{name} is {shown}; it must be {bounds}")
    return value


@dataclass(frozen=True)
class QueueSettings:
    visibility_timeout: float = 30.0
    """Seconds a received message stays hidden unless deleted (SQS: 0 to 12 hours)."""
    delay: float = 0.0
    """Seconds every new message waits before it can be received (SQS: 0 to 15 minutes)."""
    receive_wait: float = 0.0
    """Default long-polling wait of ``receive`` in seconds (SQS: 0 to 20)."""
    max_receive_count: int | None = None
    """Deliveries after which a message goes to ``dead_letter_queue`` (None: never)."""
    dead_letter_queue: str | None = None
    retention_seconds: float | None = 4 * 24 * 3600.0
    """Messages older than this are deleted whether consumed or not (None: kept until consumed)."""
    retention_bytes: int | None = None
    """Oldest segments are deleted once the topic holds more than this (None: no limit)."""
    dedup_window: float = 300.0
    """Seconds within which a second send with the same deduplication id is dropped."""
    fifo: bool = False
    content_based_dedup: bool = False
    """Use the SHA-256 of the body as deduplication id when none is given."""
    enums: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Ordered values per filter name, lowest first, for the ``at_least`` filter method."""
    task_gc_lifetime: float = 3600.0
    """Seconds a finished task's state and metadata stay readable."""
    task_gc_interval: float = 60.0
    """Seconds between garbage collections of finished tasks and consumed segments."""
    segment_size: int = 64 * 1024 * 1024
    shards: int = 1
    """How many shards the topic is spread over, set at creation: 1 (not sharded) or a power of
    two up to 1024 (sej's shard bits 1 to 10). See ``journalq.queue.sharded``."""

    def __post_init__(self) -> None:
        def number(
            name: str, low: float, high: float | None = None, optional: bool = False, whole: bool = False
        ) -> None:
            value = getattr(self, name)
            if not (value is None and optional):
                check_number(f"setting {name}", value, low, high)
                if whole and not isinstance(value, int):  # a count of deliveries or bytes
                    raise InvalidSettingError(f"setting {name} must be a whole number, not {value!r}")

        number("visibility_timeout", 0, 12 * 3600)
        number("delay", 0, 15 * 60)
        number("receive_wait", 0, 20)
        number("max_receive_count", 1, 1000, optional=True, whole=True)
        number("retention_seconds", 1, None, optional=True)
        number("retention_bytes", 1, None, optional=True, whole=True)
        number("dedup_window", 0, 24 * 3600)
        number("task_gc_lifetime", 0)
        number("task_gc_interval", 0.001)
        number("segment_size", 4096, whole=True)
        for flag in ("fifo", "content_based_dedup"):
            if not isinstance(getattr(self, flag), bool):  # "false" would be true
                raise InvalidSettingError(f"setting {flag} must be True or False, not {getattr(self, flag)!r}")
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or not (
            1 <= self.shards <= MAX_SHARDS and self.shards & (self.shards - 1) == 0
        ):
            raise InvalidSettingError(
                f"setting shards is {self.shards!r}; it must be a power of two from 1 (not sharded) to {MAX_SHARDS}"
            )
        if self.dead_letter_queue is not None:
            check_name(self.dead_letter_queue, "dead-letter queue")
        if self.max_receive_count is not None and self.dead_letter_queue is None:
            raise InvalidSettingError("max_receive_count needs a dead_letter_queue to move messages to")
        if not isinstance(self.enums, dict):
            raise InvalidSettingError("setting enums must map filter names to lists of values")
        enums = {}
        for name, values in self.enums.items():
            if not isinstance(name, str) or not isinstance(values, (list, tuple)):  # a str: letters
                raise InvalidSettingError(f"enum {name!r} must be a list of distinct strings, lowest first")
            values = tuple(values)
            if not values or not all(isinstance(v, str) for v in values) or len(set(values)) != len(values):
                raise InvalidSettingError(f"enum {name!r} must be a list of distinct strings, lowest first")
            enums[name] = values
        object.__setattr__(self, "enums", enums)

    def replace(self, **changes: Any) -> QueueSettings:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise InvalidSettingError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["enums"] = {name: list(values) for name, values in self.enums.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueSettings:
        return cls().replace(**data)


def check_for_queue(name: str, settings: QueueSettings) -> QueueSettings:
    """``settings`` for the queue or topic ``name``, checked for what needs its name (by every
    store): a queue that were its own dead-letter queue would send each dead letter back to
    itself, and never let it go."""
    if settings.dead_letter_queue == name:
        raise InvalidSettingError(f"queue {name!r} cannot be its own dead-letter queue")
    return settings


def check_dead_letter_kind(
    name: str, settings: QueueSettings, target: str, target_settings: QueueSettings | None
) -> None:
    """SQS's rule for queue ``name`` (``settings``) and its dead-letter queue ``target``
    (``target_settings``, None when it does not exist yet): a FIFO queue's is FIFO, a standard
    queue's standard. A dead letter keeps its message group, which a standard queue ignores, and a
    standard queue's have none, which a FIFO queue's consumers would get as FIFO messages of no
    group. A FIFO queue cannot name one that does not exist: the first move makes it standard."""
    def kind(fifo: bool) -> str:
        return "FIFO" if fifo else "standard"

    if target_settings is None:
        if settings.fifo:
            raise InvalidSettingError(
                f"FIFO queue {name!r} cannot take {target!r} as its dead-letter queue: {target!r} does not exist, "
                "and the first move would make it a standard queue; make it first, as a FIFO queue"
            )
    elif target_settings.fifo != settings.fifo:
        raise InvalidSettingError(
            f"{kind(settings.fifo)} queue {name!r} cannot take the {kind(target_settings.fifo)} queue {target!r} "
            f"as its dead-letter queue: both must be FIFO queues or both standard ones"
        )


def check_dead_letter_kinds(
    name: str,
    before: QueueSettings | None,
    after: QueueSettings,
    settings_of: Callable[[str], QueueSettings | None],
    sources_of: Callable[[str], list[tuple[str, QueueSettings]]],
) -> None:
    """``check_dead_letter_kind`` of queue ``name`` becoming ``after`` (``before`` None: being
    made), as a store checks it: with its dead-letter queue (``settings_of(target)``, None when
    there is none) when it names another or changes kind; with the queues whose dead-letter queue
    it is (``sources_of(name)``: name and settings of each) when it is made FIFO or changes kind (a
    new standard queue needs no look: no FIFO queue may name one that is not there)."""
    kind_changed = before is not None and before.fifo != after.fifo
    target = after.dead_letter_queue
    if target is not None and (before is None or kind_changed or before.dead_letter_queue != target):
        check_dead_letter_kind(name, after, target, settings_of(target))
    if kind_changed or (before is None and after.fifo):
        for source, settings in sources_of(name):
            check_dead_letter_kind(source, settings, name, after)


def dead_letter_sources(
    name: str, names: list[str], settings_of: Callable[[str], QueueSettings | None]
) -> list[tuple[str, QueueSettings]]:
    """The queues among ``names`` (name and settings, read by ``settings_of``, a store's) whose
    dead-letter queue is ``name``, but ``name`` itself; one whose settings cannot be read as
    settings (damaged) is left out: its problem, not this listing's."""
    sources = []
    for other in names:
        if other == name:
            continue
        try:
            settings = settings_of(other)
        except InvalidSettingError:  # (a SettingsFileError, on files)
            continue
        if settings is not None and settings.dead_letter_queue == name:
            sources.append((other, settings))
    return sources


def open_dead_letter_queue(open_queue: Callable[..., T], name: str, settings: QueueSettings) -> T:
    """``open_queue(name)`` (a store's ``topic`` or ``queue``), the dead-letter queue ``name`` of
    a queue with ``settings``, made when missing (a move's way: named, then deleted since) of the
    source's kind, as ``check_dead_letter_kind`` requires: made with default settings, a FIFO
    queue's would be standard, whose consumers ignore the groups that its dead letters keep."""
    try:
        return open_queue(name, create=False)
    except QueueNotFoundError:
        return open_queue(name, **({"fifo": True} if settings.fifo else {}))


SETTINGS_FILE = "queue.json"


def load(topic_path: Path) -> QueueSettings | None:
    """The settings of the topic at ``topic_path``; None when it has none (a plain journal)."""
    file = topic_path / SETTINGS_FILE
    try:
        # (Refusing what is no file: a named pipe's plain open would wait for ever.)
        with os.fdopen(open_journal_file(file, os.O_RDONLY, "a settings file"), "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except JournalError as exc:
        raise SettingsFileError(f"cannot read queue settings: {exc.reason}", file=file) from None
    except OSError as exc:
        if exc.errno == errno.EIO:  # the storage failing, not the file
            raise StorageError(f"cannot read queue settings: {exc.strerror}", errno=exc.errno, file=file) from None
        raise SettingsFileError(f"cannot read queue settings: {exc.strerror or exc}", file=file) from None
    except ValueError as exc:
        raise SettingsFileError(f"queue settings are not JSON: {exc}", file=file) from None
    if not isinstance(data, dict):
        raise SettingsFileError("queue settings are not a JSON object", file=file)
    try:
        return QueueSettings.from_json(data)
    except InvalidSettingError as exc:  # written by hand, or by a version that checked less
        raise SettingsFileError(f"queue settings: {exc}", file=file) from None


class SettingsFile:
    """The settings file of one topic, looked at again at most every ``every`` seconds: so that a
    process takes up the settings another process changed (``configure``) while it runs, at the
    cost of a ``stat`` a second rather than one per call."""

    def __init__(self, topic_path: Path, every: float = 1.0) -> None:
        self.topic_path = topic_path
        self.every = every
        self._due = time.monotonic() + every
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime, size): ``save`` renames

    def changed(self) -> QueueSettings | None:
        """The settings when the file changed since the last look (or at the first); else None."""
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.every
        try:
            st = os.stat(self.topic_path / SETTINGS_FILE)
        except FileNotFoundError:
            return None  # being deleted: what the topic has stays
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return None
        self._seen = seen
        return load(self.topic_path)


def save(topic_path: Path, settings: QueueSettings, *, durable: bool = True) -> None:
    """Write the settings atomically (temporary file, then rename); ``durable``: on stable
    storage, rename included, when this returns."""
    replace_file(topic_path / SETTINGS_FILE, _encoded(settings), durable=durable)


def create(topic_path: Path, settings: QueueSettings, *, durable: bool = True) -> bool:
    """Write the settings of a new topic, unless another process wrote some first: False then
    (theirs stay, whole). Processes that create one topic at once thus agree on its settings.
    ``durable``: the file, and the topic's directory in its parent, are on stable storage when
    this returns True (a queue answered as made survives a power cut)."""
    file = topic_path / SETTINGS_FILE
    tmp = write_temporary(file, _encoded(settings), durable=durable)
    try:
        os.link(tmp, file)  # atomic, and refused when the file exists
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    if durable:
        fsync_dir(topic_path)
        fsync_dir(topic_path.parent)
    return True


def _encoded(settings: QueueSettings) -> bytes:
    """The settings file's bytes."""
    return (json.dumps(settings.to_json(), indent=2, sort_keys=True) + "\n").encode()
