"""Sync policies: how often a writer forces appended data onto stable storage.

``none``    leave it to the operating system (an append survives the death of the process, not
            of the machine); fastest.
``group``   sync at most every ``interval_ms`` milliseconds or every ``max_messages`` messages,
            whichever comes first: a bounded window of loss for most of the speed of ``none``.
``always``  every append returns only once its data, and on a new segment the directory entry,
            are on stable storage.

As strings: ``"none"``, ``"always"``, ``"group"`` (10 ms), ``"group:5ms"``, ``"group:1000"``
(messages) or ``"group:5ms,1000"``.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from journalq.errors import InvalidArgumentError

DEFAULT_GROUP_INTERVAL_MS = 10.0
_GROUP_PART = re.compile(r"^(?:(?P<ms>\d+(?:\.\d+)?)ms|(?P<n>\d+))$")


def _full_fsync(fd: int) -> None:
    """macOS: ``fsync`` leaves the data in the drive's cache, which a power cut loses;
    ``F_FULLFSYNC`` flushes it. Where the file system refuses it, ``fsync`` (as SQLite does)."""
    try:
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined]
    except OSError:
        os.fsync(fd)


def _full_sync_here() -> bool:
    return sys.platform == "darwin" and hasattr(fcntl, "F_FULLFSYNC")


def _data_sync() -> Callable[[int], None]:
    """This platform's sync of a file's data (picked once, at import)."""
    return _full_fsync if _full_sync_here() else getattr(os, "fdatasync", os.fsync)


_os_fdatasync = _data_sync()
_full_sync = _full_sync_here()
_syncs = 0


def fdatasync(fd: int) -> None:
    """Force a file's data onto stable storage, counting it for ``syncs_done``."""
    global _syncs
    _os_fdatasync(fd)
    _syncs += 1  # under the GIL, a lost increment at worst: it only feeds a metric


def fsync(fd: int) -> None:
    """Force a file (or a directory's entries) onto stable storage: ``os.fsync``, but on macOS
    through the drive's cache too. (Not counted: the writer's data syncs are the metric.)"""
    if _full_sync:
        _full_fsync(fd)
    else:
        os.fsync(fd)


def syncs_done() -> int:
    """How many data syncs this process's writers have done (for metrics)."""
    return _syncs


POLICY_FORMS = "none, always, or group[:Nms,N] (either part may be left out: group:10ms, group:1000)"
"""The sync policies' written forms, for errors and help texts."""


@dataclass(frozen=True)
class SyncPolicy:
    mode: Literal["none", "group", "always"] = "none"
    interval_ms: float | None = None
    max_messages: int | None = None

    def __post_init__(self) -> None:
        """Refuse a policy made directly with fields that ``parse`` would not give (a writer
        took "alway" for "none"); a group one with neither part syncs every 10 ms, as "group"."""
        if self.mode not in ("none", "group", "always"):
            raise InvalidArgumentError(f"unknown sync policy mode {self.mode!r}: use none, group or always")
        interval, most = self.interval_ms, self.max_messages
        if self.mode != "group":
            if interval is not None or most is not None:
                raise InvalidArgumentError(f"only a group policy has interval_ms or max_messages, not {self.mode!r}")
            return
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < math.inf
        ):
            raise InvalidArgumentError(f"sync policy's interval_ms must be a number above 0 (finite), not {interval!r}")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most <= 0):
            raise InvalidArgumentError(f"sync policy's max_messages must be an integer above 0, not {most!r}")
        if interval is None and most is None:
            object.__setattr__(self, "interval_ms", DEFAULT_GROUP_INTERVAL_MS)  # frozen

    @classmethod
    def parse(cls, spec: str | SyncPolicy) -> SyncPolicy:
        if isinstance(spec, SyncPolicy):
            return spec
        if not isinstance(spec, str):
            raise InvalidArgumentError(f"sync policy must be a string or SyncPolicy, not {type(spec).__name__}")
        text = spec.strip().lower()
        if text in ("none", "always"):
            return cls(text)  # type: ignore[arg-type]
        name, _, rest = text.partition(":")
        if name != "group":
            raise InvalidArgumentError(f"unknown sync policy {spec!r}: use {POLICY_FORMS}")
        interval_ms: float | None = None
        max_messages: int | None = None
        for part in filter(None, (p.strip() for p in rest.split(","))):
            match = _GROUP_PART.match(part)
            if not match:
                raise InvalidArgumentError(f"bad part {part!r} in sync policy {spec!r}: use e.g. group:10ms,1000")
            if match.group("ms") is not None:
                interval_ms = float(match.group("ms"))
            else:
                max_messages = int(match.group("n"))
        if interval_ms is None and max_messages is None:
            interval_ms = DEFAULT_GROUP_INTERVAL_MS
        if (interval_ms is not None and interval_ms <= 0) or (max_messages is not None and max_messages <= 0):
            raise InvalidArgumentError(f"sync policy {spec!r}: interval and message count must be positive")
        return cls("group", interval_ms, max_messages)

    def __str__(self) -> str:
        if self.mode != "group":
            return self.mode
        parts = []
        if self.interval_ms is not None:
            # Written out, never with an exponent (``:g`` gave 3.6e+06), which ``parse`` refuses.
            ms = format(Decimal(repr(self.interval_ms)), "f")
            parts.append((ms.rstrip("0").rstrip(".") if "." in ms else ms) + "ms")
        if self.max_messages is not None:
            parts.append(str(self.max_messages))
        return "group:" + ",".join(parts)
