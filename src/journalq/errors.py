"""One exception hierarchy for the whole package: everything journalq raises is a ``journalq.Error``.

Errors about stored data carry where the problem is: the file, the byte position in it, and, when
known, the offset and timestamp of the message involved, so that an operator can go and look.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

ZERO_TIMESTAMP = -(2**63)
"""How the format stores Go's zero ``time.Time``: the minimum int64."""


def format_timestamp(timestamp_ns: int | None) -> str:
    """A timestamp in nanoseconds as RFC 3339 in UTC; the zero time as ``zero-time``."""
    if timestamp_ns is None or timestamp_ns == ZERO_TIMESTAMP:
        return "zero-time"
    seconds, nanos = divmod(timestamp_ns, 1_000_000_000)
    try:
        moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ns}ns"
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


class Error(Exception):
    """Base class of every error journalq raises."""


class InvalidMessageError(Error, ValueError):
    """A message that cannot be stored: a key over 127 bytes, a value that is not bytes, ..."""


class JournalError(Error):
    """A problem with a journal directory or its files."""

    def __init__(
        self,
        reason: str,
        *,
        file: str | Path | None = None,
        position: int | None = None,
        offset: int | None = None,
        timestamp_ns: int | None = None,
    ) -> None:
        self.reason = reason
        self.file = Path(file) if file is not None else None
        self.position = position
        self.offset = offset
        self.timestamp_ns = timestamp_ns
        super().__init__(self._describe())

    def _describe(self) -> str:
        where = []
        if self.file is not None:
            where.append(str(self.file))
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.timestamp_ns is not None:
            where.append(f"timestamp {format_timestamp(self.timestamp_ns)}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def located(self, file: str | Path, base_position: int = 0) -> JournalError:
        """The same error, placed in ``file`` with positions counted from ``base_position``."""
        position = None if self.position is None else base_position + self.position
        return type(self)(
            self.reason, file=file, position=position, offset=self.offset, timestamp_ns=self.timestamp_ns
        )


class CorruptionError(JournalError):
    """Stored bytes that do not decode as messages, or offsets that are not dense."""


class StorageError(JournalError):
    """The storage refused a write or a sync (a full disk, an I/O error): what the call was
    storing is not stored. ``errno`` is the operating system's error number."""

    def __init__(self, reason: str, *, errno: int | None = None, **where: object) -> None:
        self.errno = errno
        super().__init__(reason, **where)  # type: ignore[arg-type]

    def located(self, file: str | Path, base_position: int = 0) -> JournalError:
        located = super().located(file, base_position)
        located.errno = self.errno  # type: ignore[attr-defined]
        return located


class TruncatedError(JournalError):
    """A segment became shorter than what was already read from it."""


class LockedError(JournalError):
    """Another writer holds the journal's lock."""


class OffsetOutOfRangeError(JournalError, LookupError):
    """An offset before the first message still stored, or past the end of the journal."""


class ScanTimeout(JournalError, TimeoutError):
    """A following scanner waited longer than its timeout for the next message."""


class QueueError(Error):
    """A problem with a queue, a topic or a channel."""


class QueueNotFoundError(QueueError, LookupError):
    """A queue or topic that does not exist."""


class InvalidNameError(QueueError, ValueError):
    """A queue, topic or channel name that cannot be used (it could leave the data directory)."""


class InvalidSettingError(QueueError, ValueError):
    """A queue setting, or an argument such as a visibility timeout, out of its range or of the
    wrong kind."""


class ReceiptError(QueueError):
    """A receipt that is malformed, or whose delivery is over (finished, or delivered again)."""


class TaskNotFoundError(QueueError, LookupError):
    """A message id that names no task: never sent, or garbage-collected after it finished."""


class StoreUnavailableError(QueueError, ConnectionError):
    """The queue's store (a ZooKeeper ensemble) could not be reached, or the connection broke
    while a call was in flight: what that call was changing may or may not have been done."""


class HubError(Error):
    """A problem with copying journals to a hub (``journalq.hub``): a push the hub refuses, or a
    hub that cannot be reached. ``kind`` names the problem in the hub's answers."""

    kind = "hub"


class InvalidClientIdError(HubError, ValueError):
    """A client id that is not ``[a-zA-Z0-9_-]+``."""

    kind = "client-id"


class InvalidJournalPathError(HubError, ValueError):
    """A journal name that could leave the hub's root: absolute, ``..``, more than one directory,
    or a symbolic link out of the root."""

    kind = "journal-path"


class DamagedPushError(HubError, ValueError):
    """Pushed bytes that are not a run of whole, well-formed messages at dense offsets from the
    first offset the push names. ``position`` is the byte of the push where the problem is."""

    kind = "damaged"

    def __init__(self, reason: str, *, position: int | None = None, offset: int | None = None) -> None:
        self.position, self.offset = position, offset
        where = [f"byte {position} of the push"] if position is not None else []
        where += [f"offset {offset}"] if offset is not None else []
        super().__init__(f"{reason} ({', '.join(where)})" if where else reason)


class HubGapError(HubError):
    """A push that starts past what the hub holds: the messages between would be missing.
    ``held`` is the offset the hub's copy holds up to (the next one it takes)."""

    kind = "gap"

    def __init__(self, reason: str, *, held: int) -> None:
        self.held = held
        super().__init__(reason)


class HubConflictError(HubError):
    """Pushed messages that differ from the ones the hub holds at the same offsets: the client's
    journal is not the one the hub copied (recreated, or a different journal of the same name)."""

    kind = "conflict"


class HubUnavailableError(HubError):
    """The hub could not be reached, or answered with something that is not the hub protocol."""

    kind = "unavailable"
