"""One exception hierarchy for the whole package: everything journalq raises is a ``journalq.Error``.

Errors about stored data carry where the problem is: the file, the byte position in it, and, when
known, the offset and timestamp of the message involved, so that an operator can go and look.
"""

from __future__ import annotations

import datetime as _dt
import errno as _errno
from collections.abc import Iterable
from pathlib import Path

STORAGE_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT, _errno.EIO})
"""Errors of the storage (a full disk, a quota, an I/O error): they may pass (the server answers 503)."""

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


class InvalidArgumentError(Error, ValueError):
    """An argument out of its range or of the wrong type (an offset below 0, a timeout of NaN, an
    unknown sync policy, ...): refused before anything is done."""


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


def raise_storage_failure(outcomes: Iterable[object]) -> None:
    """Raise the first ``StorageError`` among a batch's outcomes, for a caller that answers for
    the batch as one. (A sharded queue gives that error as the outcome of each item of a shard
    whose step failed, the other shards' steps being stored.)"""
    for outcome in outcomes:
        if isinstance(outcome, StorageError):
            raise outcome


class TruncatedError(JournalError):
    """A segment became shorter than what was already read from it."""


class LockedError(JournalError):
    """Another writer holds the journal's lock."""


class BusyError(LockedError):
    """Another thread or process holds the journal now, and the call was made not to wait for it
    (in a ``DeferredSyncs(wait=False)`` block): nothing was done. Make the call again where
    waiting is harmless (an event loop hands it to a thread)."""


class OffsetOutOfRangeError(JournalError, LookupError):
    """An offset before the first message still stored, or past the end of the journal."""


class ScanTimeout(JournalError, TimeoutError):
    """``Scanner.next_message`` found no next message: a following scanner waited longer than
    its timeout, or one that does not follow reached the journal's end. (Iterating a scanner
    ends there quietly instead.)"""


class QueueError(Error):
    """A problem with a queue, a topic or a channel."""


class QueueNotFoundError(QueueError, LookupError):
    """A queue or topic that does not exist."""


class InvalidNameError(QueueError, ValueError):
    """A queue, topic or channel name that cannot be used (it could leave the data directory)."""


class InvalidSettingError(QueueError, ValueError):
    """A queue setting, or an argument such as a visibility timeout, out of its range or of the
    wrong kind."""


class SettingsFileError(CorruptionError, InvalidSettingError):
    """A queue's settings file that cannot be read as settings (damaged, or written by hand): a
    problem of the stored data, which the server answers 500 without naming the file's place
    (a ``CorruptionError``), and a bad setting (an ``InvalidSettingError``, as before)."""


class ReceiptError(QueueError):
    """A receipt that is malformed, or whose delivery is over (finished, or delivered again)."""


class StaleReceiptError(ReceiptError):
    """A receipt of the queue whose delivery is over: the message was finished, or delivered again
    since (the receipt was well formed and the queue's; SQS, for one, deletes nothing and answers
    success)."""


class VisibilityLimitError(ReceiptError):
    """A change of visibility refused because it would hide the message past the limit asked
    for (``within``) after the delivery of its receipt (SQS's 12 hours); nothing was changed."""


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


class DamagedCopyError(HubUnavailableError):
    """The hub answered that its own copy of the journal is damaged (a 500 saying where): a retry
    does not mend it, a repair of the copy on the hub does. A following pusher waits it out as
    any failure of the hub's; one that is not (``hub push --once``) stops that journal at once."""


class PartialSendError(QueueError):
    """A batch send that stored some of its messages and not the others. A sharded queue writes
    each shard's part of a batch on its own, and the ZooKeeper store writes a large batch in chunks
    (200 messages or 256 KiB), so a failure part-way leaves the parts written before it stored.
    (The file store's unsharded ``send_many`` is all or nothing; so is a send whose failure stored
    nothing: it raises the error that stopped it, never this one.)

    ``ids``: for each message of the batch, in the order given, its id when it is stored, None when
    it is not; ``unsent``: the positions of those not stored, the ones to send again. ``cause``:
    the error that stopped the send (also ``__cause__``). The error is also of the cause's kind
    when that is a ``StorageError`` (``PartialStorageError``) or a ``StoreUnavailableError``
    (``PartialStoreUnavailableError``), so that handlers of those go on working. After a
    ``StoreUnavailableError`` a message counted unsent may have been stored all the same (the
    connection broke while its write was in flight), as after any ``StoreUnavailableError``.
    """

    def __init__(self, ids: list[str | None], cause: Exception) -> None:
        self.ids = list(ids)
        self.cause = cause
        stored = len(self.ids) - len(self.unsent)
        super().__init__(
            f"{stored} of the {len(self.ids)} messages of the batch stored, not those at positions "
            f"{_ranges(self.unsent)}: {cause}"
        )

    @property
    def unsent(self) -> list[int]:
        return [position for position, id in enumerate(self.ids) if id is None]

    @staticmethod
    def after(ids: list[str | None], cause: Exception) -> PartialSendError | None:
        """The error for a send stopped by ``cause`` with ``ids`` stored so far (None where not):
        of the cause's kind (see the class), or None when nothing is stored (raise ``cause``)."""
        if all(id is None for id in ids):
            return None
        if isinstance(cause, StorageError):
            return PartialStorageError(ids, cause)
        if isinstance(cause, StoreUnavailableError):
            return PartialStoreUnavailableError(ids, cause)
        return PartialSendError(ids, cause)


class PartialStorageError(PartialSendError, StorageError):
    """A ``PartialSendError`` whose cause is a ``StorageError`` (a full disk, an I/O error)."""

    def __init__(self, ids: list[str | None], cause: StorageError) -> None:
        super().__init__(ids, cause)  # StorageError's reason: this error's whole message
        self.errno = cause.errno


class PartialStoreUnavailableError(PartialSendError, StoreUnavailableError):
    """A ``PartialSendError`` whose cause is a ``StoreUnavailableError`` (ZooKeeper out of reach)."""


def _ranges(positions: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and runs[-1][1] == position - 1:
            runs[-1][1] = position
        else:
            runs.append([position, position])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
