"""The sej journal: codec, segments, writer, scanner, reader offsets, sparse index, recovery.

Byte-compatible with h12.io/sej: it reads what sej writes, and sej reads what it writes.
"""

from journalq.errors import (
    ZERO_TIMESTAMP,
    CorruptionError,
    InvalidMessageError,
    JournalError,
    LockedError,
    OffsetOutOfRangeError,
    ScanTimeout,
    TruncatedError,
)
from journalq.journal.codec import MAX_KEY_SIZE, Message
from journalq.journal.offsets import ReaderOffset, end_offset, first_offset, read_offset, set_offset
from journalq.journal.recovery import Recovery
from journalq.journal.scanner import Scanner
from journalq.journal.sync import SyncPolicy
from journalq.journal.writer import DEFAULT_SEGMENT_SIZE, Writer

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "MAX_KEY_SIZE",
    "ZERO_TIMESTAMP",
    "CorruptionError",
    "InvalidMessageError",
    "JournalError",
    "LockedError",
    "Message",
    "OffsetOutOfRangeError",
    "ReaderOffset",
    "Recovery",
    "ScanTimeout",
    "Scanner",
    "SyncPolicy",
    "TruncatedError",
    "Writer",
    "end_offset",
    "first_offset",
    "read_offset",
    "set_offset",
]
