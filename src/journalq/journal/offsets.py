"""Reader offsets: where a journal begins and ends, and named offsets that readers persist.

A named offset lives in ``DIR/ofs/NAME.ofs`` as 8 bytes, big-endian, exactly as sej's ``Offset``
keeps it (the offset of the next message to read), guarded by ``DIR/ofs/NAME.lck``. A commit
replaces the file atomically (write a temporary file, rename it over), so a crash leaves the old
value or the new one, never a mix.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import Error, InvalidArgumentError, JournalError, LockedError
from journalq.journal.index import scan_tail
from journalq.journal.lock import FileLock
from journalq.journal.recovery import make_dirs, replace_file
from journalq.journal.segment import Segment, SegmentScan, list_segments, open_journal_file, unopenable

_UINT64 = struct.Struct(">Q")
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
TEMPORARY = re.compile(r"^.+\.ofs\.(\d+)\.\d+\.tmp$")
"""The name of the file ``write_offset`` renames over an offset file; group 1: the writing process."""


def first_offset(path: str | os.PathLike[str]) -> int:
    """The offset of the oldest message still stored (equal to ``end_offset`` when empty)."""
    segments = list_segments(path)
    return segments[0].base if segments else 0


def end_offset(path: str | os.PathLike[str]) -> int:
    """The offset after the last whole message: the next one a writer assigns (sej's LastOffset).

    An incomplete message at the end (one being written, or a torn write) is not counted.
    """
    scan = _scan_last(path)
    return 0 if scan is None else scan.next_offset


def clean_end_offset(path: str | os.PathLike[str], segments: list[Segment] | None = None) -> int | None:
    """``end_offset`` when the journal ends with a whole message; None when bytes follow its last
    one that are not a whole message (one being written, a torn write, or damage). ``segments``:
    the journal's, as the caller just listed them (not listed again; the last one is enough)."""
    scan = _scan_last(path, segments)
    if scan is None:
        return 0
    return scan.next_offset if scan.clean else None


def _scan_last(path: str | os.PathLike[str], segments: list[Segment] | None = None) -> SegmentScan | None:
    """``scan_tail`` of the journal's last segment; None when it has none. ``segments``: as
    listed by the caller (listed here when None, and again when the last is gone)."""
    while True:
        if segments is None:
            segments = list_segments(path)
        if not segments:
            return None
        try:
            return scan_tail(segments[-1])
        except FileNotFoundError:
            # Removed since it was listed: a segment that a failed append had started, taken
            # back (the newest is never collected). The one before it is the last again. Still
            # listed, it is a dangling link, which looking again would never get past.
            again = list_segments(path)
            if again[-1:] == segments[-1:] and not segments[-1].path.exists():
                raise unopenable(segments[-1]) from None
            segments = again


def offset_path(path: str | os.PathLike[str], name: str) -> Path:
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # match's $ lets a "\n" end it
        raise InvalidArgumentError(
            f"reader name {name!r} must be letters, digits, '.', '_' or '-', not starting with '.'"
        )
    return Path(path) / "ofs" / f"{name}.ofs"


def read_offset(path: str | os.PathLike[str], name: str) -> int:
    """The committed value of the named offset, 0 when it was never committed (as sej reads it)."""
    file = offset_path(path, name)
    try:
        # (Refusing by name what is no file: a named pipe's plain open would wait for ever.)
        with os.fdopen(open_journal_file(file, os.O_RDONLY, "an offset file"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    except OSError as exc:  # ``ofs`` not a directory, no permission, an I/O error
        raise JournalError(f"cannot read the offset file: {exc.strerror or exc}", file=file) from exc
    if not data:
        return 0
    if len(data) != _UINT64.size:
        raise JournalError(f"offset file holds {len(data)} bytes, not 8", file=file)
    return _UINT64.unpack(data)[0]


def _check_offset(offset: object) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**64:
        raise InvalidArgumentError(f"offset must be an unsigned 64-bit integer, not {offset!r}")


def overwrite_offset(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
    """Write ``offset`` over the offset file ``file`` in place (``write_offset`` makes it when it
    is missing); durable when ``sync``. Many times cheaper than ``write_offset``'s new file and
    rename, but only for a file that no one reads while it is written: one whose readers and
    writers all hold one lock (a channel's ``snapshot.ofs``). Eight bytes at the start of the
    file's first sector: a crash leaves the old value or the new one, as PostgreSQL trusts for
    its ``pg_control``."""
    _check_offset(offset)
    try:
        fd = open_journal_file(file, os.O_WRONLY, "an offset file")
    except FileNotFoundError:
        write_offset(file, offset, sync=sync, inside=inside)
        return
    try:
        os.pwrite(fd, _UINT64.pack(offset), 0)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def write_offset(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
    """Replace the offset file ``file`` atomically with ``offset``; durable when ``sync``.
    ``inside``: as ``Writer``'s, a directory not to make again when it is gone.

    Takes no lock: the caller is the one process entitled to the name (``ReaderOffset`` holds its
    ``.lck``; a queue channel commits under its own lock).
    """
    _check_offset(offset)
    make_dirs(file.parent, durable=sync, inside=inside)  # a new ofs/ is synced into its parent too
    replace_file(file, _UINT64.pack(offset), durable=sync)


def set_offset(path: str | os.PathLike[str], name: str, offset: int, *, sync: bool = True) -> None:
    """Commit ``offset`` as the named offset of the journal at ``path``, whatever its file holds
    now: a damaged file too (``ReaderOffset`` refuses to open one; this is how it is mended).
    Refused with ``LockedError`` while a reader holds the name."""
    file = offset_path(path, name)
    make_dirs(file.parent, durable=sync)
    lock = _take_name(file, name)
    try:
        write_offset(file, offset, sync=sync)
    finally:
        lock.close()


def _take_name(file: Path, name: str) -> FileLock:
    """The lock of the reader offset ``name`` (in ``file``'s ``.lck``), taken without waiting;
    ``LockedError`` while another reader holds it (``FileLock``'s own words are of a writer)."""
    lock = FileLock(file.with_suffix(".lck"))
    if not lock.try_acquire(wait=False):
        lock.close()
        raise LockedError(f"reader offset {name!r} is in use by another reader", file=lock.path)
    return lock


class ReaderOffset(Closing):
    """A named, persistent reader offset; one process holds a name at a time.

    ``sync`` (default True, as sej) makes each commit durable before it returns.
    """

    def __init__(self, path: str | os.PathLike[str], name: str, *, sync: bool = True) -> None:
        self.file = offset_path(path, name)
        self.name = name
        self.sync = sync
        make_dirs(self.file.parent, durable=sync)  # the commits' write_offset finds it made
        self._lock: FileLock | None = _take_name(self.file, name)
        try:
            self._value = read_offset(path, name)
        except BaseException:
            self.close()
            raise

    @property
    def value(self) -> int:
        return self._value

    def commit(self, offset: int) -> None:
        if self._lock is None:  # the name may be another process's now
            raise Error(f"reader offset {self.name!r} is closed")
        if offset == self._value and self.file.exists():
            return
        write_offset(self.file, offset, sync=self.sync)
        self._value = offset

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
