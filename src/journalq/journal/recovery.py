"""Recovery of a segment's tail: cut what is not a whole, valid message, and keep it.

A crash can leave the last segment ending in part of a message; damage can leave anything. The
writer trusts nothing past the last valid message: it moves the bytes after it into
``DIR/cut/<segment>@<position>`` (synced before the segment is shortened, so nothing is ever lost
unseen), truncates the segment there and reports what it did.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from journalq.errors import CorruptionError, JournalError, StorageError, format_timestamp
from journalq.journal.codec import decode
from journalq.journal.index import scan_tail
from journalq.journal.segment import Segment, SegmentScan, segment_at, segment_bases, segment_name
from journalq.journal.sync import fsync

log = logging.getLogger("journalq.journal")


@dataclass(frozen=True)
class Recovery:
    """What recovery cut from a segment."""

    file: Path
    position: int
    next_offset: int
    last_timestamp_ns: int | None
    cut_bytes: int
    saved_to: Path
    reason: str

    def __str__(self) -> str:
        # None: no message was read before the cut (the last one kept lies before the index
        # entry the scan started at, or there is none): no timestamp to tell.
        kept = (
            ""
            if self.last_timestamp_ns is None
            else f"; last message kept has timestamp {format_timestamp(self.last_timestamp_ns)}"
        )
        return (
            f"recovered {self.file}: cut {self.cut_bytes} bytes at byte {self.position} "
            f"(where offset {self.next_offset} was due{kept}), because: {self.reason}; "
            f"the bytes are kept in {self.saved_to}"
        )


def fsync_dir(path: Path) -> None:
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)


def write_temporary(file: Path, data: bytes, *, durable: bool) -> Path:
    """``data`` in a temporary file beside ``file`` (``NAME.PID.THREAD.tmp``: two threads'
    writes must not share one, and ``check`` tells an abandoned one by its pid), on stable
    storage when ``durable``. Nothing is left behind when writing fails (a full disk, say)."""
    tmp = file.with_name(f"{file.name}.{os.getpid()}.{threading.get_native_id()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_file(file: Path, data: bytes, *, durable: bool) -> None:
    """Replace ``file`` with ``data`` atomically (a temporary file renamed over it: a reader sees
    the old bytes or the new, whole); ``durable``: on stable storage, rename included, when this
    returns."""
    tmp = write_temporary(file, data, durable=durable)
    try:
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(file.parent)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Force a file that was written and closed (by another library, say) onto stable storage."""
    _fsync(path, os.O_RDONLY)


def _fsync(path: str | os.PathLike[str], flags: int) -> None:
    fd = os.open(path, flags)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path, durable: bool, inside: Path | None = None) -> list[Path]:
    """Create ``directory`` and its missing parents; when ``durable``, sync each new entry.
    Returns the directories it made, outermost first (empty when ``directory`` was there).
    ``inside``: a directory that someone else makes and deletes (a queue's), never made again
    here: its absence is a ``FileNotFoundError`` naming it, not a new empty one."""
    missing = []
    while not directory.is_dir():
        if inside is not None and (directory == inside or directory in inside.parents):
            raise FileNotFoundError(errno.ENOENT, "deleted (not made again here)", str(directory))
        missing.append(directory)
        directory = directory.parent
    missing.reverse()
    for new in missing:
        try:
            new.mkdir(exist_ok=True)
        except FileExistsError:  # a file (or a dangling link) where the directory goes
            raise JournalError("not a directory", file=new) from None
        if durable:
            fsync_dir(new.parent)
    return missing


def misnamed(segment: Segment, data: bytes) -> CorruptionError | None:
    """The error for a segment whose bytes ``data`` start with a whole message at another offset
    than its name says, right where the segment before it ends; else None. That is no torn tail
    (a crash never rewrites an offset, and damage would not make it continue the journal): the
    messages are the journal's, only the name is wrong, and they are not to be cut as damage."""
    try:
        messages, _ = decode(data, max_messages=1)
    except CorruptionError:
        return None  # not even one whole message: a torn or damaged tail
    if not messages or messages[0].offset == segment.base:
        return None
    root = segment.path.parent.parent
    earlier = [base for base in segment_bases(root) if base < segment.base]
    if not earlier or scan_tail(segment_at(root, earlier[-1])).next_offset != messages[0].offset:
        return None
    return CorruptionError(
        f"the segment's name says it starts at offset {segment.base}, but its first message is offset "
        f"{messages[0].offset}, which continues the segment before it: misnamed; nothing was cut "
        f"(rename it to {segment_name(messages[0].offset)})",
        file=segment.path,
        position=0,
        offset=segment.base,
    )


def _cut_failed(exc: OSError, segment: Segment, scan: SegmentScan, outcome: str) -> StorageError:
    return StorageError(
        f"could not cut the bytes after the last whole message: {exc.strerror or exc}; {outcome}",
        errno=exc.errno,
        file=segment.path,
        position=scan.end,
        offset=scan.next_offset,
    )


def _new_file(directory: Path, name: str) -> tuple[Path, BinaryIO]:
    """A new file ``name`` in ``directory``, or ``name.1``, ``name.2``... when it is taken (a
    second recovery at the same byte, after a crash loop): a cut never writes over another."""
    path, n = directory / name, 0
    while True:
        try:
            return path, open(path, "xb")
        except FileExistsError:
            n += 1
            path = directory / f"{name}.{n}"


def cut_tail(root: Path, segment: Segment, scan: SegmentScan) -> Recovery:
    """Save the bytes of ``segment`` after ``scan.end`` beside the journal, then truncate there.
    A misnamed segment (see ``misnamed``) is refused with its ``CorruptionError``, untouched.
    A failure of the storage (a full disk) is a ``StorageError``: the segment is left whole, and
    no partial copy is left under ``cut/``, unless the truncation itself failed (it may be done)."""
    with open(segment.path, "r+b") as f:
        f.seek(scan.end)
        bad = f.read()
        refused = misnamed(segment, bad) if scan.end == 0 else None
        if refused is not None:
            raise refused
        cut_dir = root / "cut"
        saved_to: Path | None = None
        try:
            make_dirs(cut_dir, durable=True)  # its entry too: kept before the segment shrinks
            saved_to, out = _new_file(cut_dir, f"{segment.path.name}@{scan.end}")
            with out:
                out.write(bad)
                out.flush()
                fsync(out.fileno())
            fsync_dir(cut_dir)
        except OSError as exc:
            if saved_to is not None:
                saved_to.unlink(missing_ok=True)  # a partial copy: it would pass for the bytes
            raise _cut_failed(exc, segment, scan, "nothing was cut") from exc
        try:
            f.truncate(scan.end)
            f.flush()
            fsync(f.fileno())
        except OSError as exc:
            raise _cut_failed(exc, segment, scan, f"the bytes are kept in {saved_to}") from exc
    problem = scan.problem or CorruptionError("bytes after the last message")
    recovery = Recovery(
        segment.path, scan.end, scan.next_offset, scan.last_timestamp_ns, len(bad), saved_to, problem.reason
    )
    log.warning("%s", recovery)
    return recovery
