"""Segment files: their names, where they live, and listing them.

A journal directory holds ``jnl/`` with one file per segment, named by the offset of its first
message in 16 hex digits (``%016x.jnl``), and beside each segment journalq keeps a sparse offset
index, ``%016x.idx``, which sej ignores (it only reads ``*.jnl``). While an append that starts
new segments is under way, the blocks of those segments wait in spare files,
``%016x.PID.spare`` (see ``spare_path``), which every reader ignores too.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from fcntl import F_SETFL, fcntl
from itertools import accumulate
from pathlib import Path

from journalq.errors import CorruptionError, InvalidArgumentError, JournalError
from journalq.journal.codec import HEADER, INT32, OVERHEAD, Message, decode

SEGMENT_SUFFIX = ".jnl"
INDEX_SUFFIX = ".idx"
_SEGMENT_NAME = re.compile(r"^([0-9a-f]{16})\.jnl$")  # as sej names them: %016x
_INDEX_NAME = re.compile(r"^[0-9a-f]{16}\.idx$")
SPARE = re.compile(r"^[0-9a-f]{16}\.(\d+)\.spare$")
"""A spare segment's name (its group: the process that made it)."""


def check_integer(name: str, value: object, minimum: int | None) -> int:
    """``value`` when it is an integer (a NumPy one too, not a bool) of ``minimum`` or more (any,
    with None); else a clear ``Error`` naming the argument (a string would fail later, deep in a
    comparison)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        least = "" if minimum is None else f", {minimum} or more"
        raise InvalidArgumentError(f"{name} must be an integer{least}, not {value!r}")
    if minimum is not None and value.__index__() < minimum:
        raise InvalidArgumentError(f"{name} must be an integer, {minimum} or more, not {value!r}")
    return value.__index__()


JOURNAL_DIR = "jnl"


def journal_dir(path: str | os.PathLike[str]) -> Path:
    """``DIR/jnl``: where the segments of the journal at ``DIR`` live."""
    return Path(path) / JOURNAL_DIR


def lock_path(path: str | os.PathLike[str]) -> Path:
    """``DIR/jnl.lck``: the writer's lock file, as sej names it."""
    return Path(path) / "jnl.lck"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:016x}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, order=True)
class Segment:
    """A segment file: ``base`` is the offset of its first message."""

    base: int
    path: Path

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)


def segment_at(path: str | os.PathLike[str], base_offset: int) -> Segment:
    """The segment of the journal at ``path`` that starts at ``base_offset`` (it may not exist)."""
    return Segment(base_offset, journal_dir(path) / segment_name(base_offset))


def spare_path(segment: Segment) -> Path:
    """Where this process keeps the blocks of ``segment`` before it starts it: a writer whose
    append will start new segments reserves their room first, in these files, and links each
    into place when it comes to it. So a disk that fills up meanwhile (another journal's
    appends) fails the append before it writes anything, rather than after readers may have
    read its first part (which the failure would take back). Only under the journal's lock:
    a spare left there (its writer killed) is of no one."""
    return segment.path.with_name(f"{segment.base:016x}.{os.getpid()}.spare")


def remove_spares(path: str | os.PathLike[str]) -> list[Path]:
    """Delete the spare segments in the journal at ``path`` (under its lock: see ``spare_path``).
    Returns the files it deleted."""
    directory = journal_dir(path)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if SPARE.match(name):
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                continue
            removed.append(directory / name)
    return removed


def segment_bases(path: str | os.PathLike[str]) -> list[int]:
    """The base offsets of the segments of the journal at ``path``, oldest first.

    Only integers: a seek needs one segment's path, and building a path per segment would make
    seeking cost more the more segments there are.
    """
    try:
        names = os.listdir(os.path.join(path, JOURNAL_DIR))  # (no ``Path``: a third of the cost)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        in_the_way = journal_dir(path) if os.path.isdir(path) else path
        raise JournalError("not a directory", file=in_the_way) from None
    bases = []
    for name in names:
        if name.endswith(SEGMENT_SUFFIX):
            match = _SEGMENT_NAME.match(name)
            if match:
                bases.append(int(match.group(1), 16))
    bases.sort()
    return bases


def base_after(path: str | os.PathLike[str], base: int) -> int | None:
    """Where the first segment after the one at ``base`` starts, if one is there: a reader lists
    it once a segment (at a roll, not at every end reached), to tell the end of a finished
    segment from the journal's end."""
    bases = segment_bases(path)
    which = bisect_right(bases, base)
    return bases[which] if which < len(bases) else None


def list_segments(path: str | os.PathLike[str]) -> list[Segment]:
    """The segments of the journal at ``path``, oldest first; other files are ignored, as sej does."""
    directory = journal_dir(path)
    return [Segment(base, directory / segment_name(base)) for base in segment_bases(path)]


def remove_segment(segment: Segment) -> list[Path]:
    """Delete a segment and its index, where they exist: the index first, so that a process
    killed in between leaves a segment without its index (a hint, rebuilt), never an index of
    no segment (see ``orphan_indexes``); and once more after the segment, for one that a
    scanner rebuilt in between (a rebuild after the segment's deletion removes its own).
    Returns the files it deleted."""
    removed = []
    for leftover in (segment.index_path, segment.path, segment.index_path):
        try:
            leftover.unlink()
        except FileNotFoundError:
            continue
        removed.append(leftover)
    return removed


def orphan_indexes(path: str | os.PathLike[str]) -> list[Path]:
    """The indexes of the journal at ``path`` whose segment is not there: left by a process
    killed between deleting a segment and deleting its index."""
    directory = journal_dir(path)
    try:
        names = set(os.listdir(directory))
    except FileNotFoundError:
        return []
    orphans = []
    for name in sorted(names):
        segment = name[: -len(INDEX_SUFFIX)] + SEGMENT_SUFFIX
        # (Looked for again: a segment made since the listing, with its index.)
        if _INDEX_NAME.match(name) and segment not in names and not os.path.exists(directory / segment):
            orphans.append(directory / name)
    return orphans


def open_segment(segment: Segment, flags: int = os.O_RDONLY) -> int:
    """``os.open`` of a segment file, refusing what has its name but is no file (see
    ``open_journal_file``)."""
    return open_journal_file(segment.path, flags, "a segment")


def open_journal_file(path: Path, flags: int, name: str) -> int:
    """``os.open`` of a file of a journal (``FileNotFoundError`` when it is gone), refusing with a
    ``JournalError`` naming it what has the name of ``name`` ("a segment", "an index") but is no
    file: a directory would fail later with a bare ``IsADirectoryError``, or be read as an empty
    file, and the open of a named pipe would wait for ever for the other end (it is opened
    ``O_NONBLOCK``, then looked at)."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except IsADirectoryError:
        raise not_a_file(path, "a directory", name) from None
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        raise not_a_file(path, "a special file", name) from None  # a pipe opened to write, no reader
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            # F_SETFL keeps the access mode and creation flags: this clears O_NONBLOCK only
            # (which a regular file ignores on Linux, not everywhere).
            fcntl(fd, F_SETFL, flags)
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise not_a_file(path, "a directory" if stat.S_ISDIR(mode) else "a special file", name)


def not_a_file(path: Path, what: str, name: str) -> JournalError:
    """The error for ``what`` (a directory) at ``path``, which has the name of ``name`` (a
    segment) but is not a file."""
    return JournalError(f"not {name}: {what} has {name}'s name", file=path)


def unopenable(segment: Segment) -> JournalError:
    """The error for a segment that is listed but cannot be opened (a dangling link, say):
    readers that took it for one deleted meanwhile would look again for ever."""
    return JournalError("segment is listed but cannot be opened", file=segment.path)


def raise_if_unopenable(exc: FileNotFoundError, listed: Iterable[Segment]) -> None:
    """After ``exc`` from a segment of a journal's listing: a ``JournalError`` when the segment
    it names is still ``listed`` (listed again) and still cannot be opened (a dangling link, say),
    where a caller that took it for one deleted meanwhile (another process's gc) would list the
    segments again for ever; else nothing (it was deleted: list again)."""
    for segment in listed:
        if str(segment.path) == exc.filename and not os.path.exists(segment.path):
            raise unopenable(segment) from None


class _Near:
    """Reads of an open segment around one position, served from one ``pread`` of the bytes
    around it where they fall inside (two small messages do); others are read on their own."""

    __slots__ = ("_fd", "_start", "_data")

    SPAN = 4096

    def __init__(self, fd: int, position: int) -> None:
        self._fd = fd
        self._start = max(0, position - self.SPAN // 2)
        self._data = os.pread(fd, self.SPAN, self._start) if position < 2**63 else b""

    def read(self, size: int, position: int) -> bytes:
        """``os.pread(fd, size, position)``."""
        i = position - self._start
        if 0 <= i and i + size <= len(self._data):
            return self._data[i : i + size]
        return os.pread(self._fd, size, position)


def _framed_at(near: _Near, position: int) -> tuple[int, int] | None:
    """(offset, size) of the message at ``position`` of an open segment when its own framing
    holds there (lengths not negative, its size field where they put it, the whole of it in the
    file); else None."""
    if position >= 2**63:
        return None
    head = near.read(HEADER.size, position)
    if len(head) < HEADER.size:
        return None
    offset, _, _, key_len = HEADER.unpack(head)
    if key_len < 0:
        return None
    raw = near.read(INT32.size, position + HEADER.size + key_len)
    if len(raw) < INT32.size or INT32.unpack(raw)[0] < 0:
        return None
    size = OVERHEAD + key_len + INT32.unpack(raw)[0]
    raw = near.read(INT32.size, position + size - INT32.size)
    return (offset, size) if len(raw) == INT32.size and INT32.unpack(raw)[0] == size else None


def framed_at(fd: int, position: int) -> tuple[int, int] | None:
    """(offset, size) of the whole message at ``position`` of an open segment, when its own
    framing holds there; else None (damage, or the end of its whole messages)."""
    return _framed_at(_Near(fd, position), position)


def confirms(fd: int, offset: int, position: int) -> bool:
    """Whether the open segment confirms the index entry (``offset``, ``position``): the whole
    message with that offset is framed there, and (past the segment's start) the message before
    it, found by the size field that ends there, has the offset before. The offset field alone is
    not enough: a value may hold those 8 bytes (a queue's events hold offsets), and a recovery or a
    seek started inside a value would take sound messages for damage. (The bytes around the
    position come in one read: a seek paid ~6 µs for seven small ones.)"""
    near = _Near(fd, position)
    here = _framed_at(near, position)
    if here is None or here[0] != offset:
        return False
    if position == 0:
        return True
    raw = near.read(INT32.size, position - INT32.size) if position >= INT32.size else b""
    if len(raw) < INT32.size:
        return False
    (before,) = INT32.unpack(raw)
    return OVERHEAD <= before <= position and _framed_at(near, position - before) == (offset - 1, before)


def gap_reason(due: int, base: int) -> str:
    """What a segment starting at ``base`` where offset ``due`` was due leaves out (or holds
    again): for the scanner's error and ``check``'s problem alike."""
    what = "missing" if base > due else "stored twice"
    return f"offsets {min(due, base)}-{max(due, base) - 1} are {what}"


def gap_error(segment: Segment, position: int, due: int, base: int) -> CorruptionError:
    """A finished segment that ends (at ``position``) before offset ``due``, with the next one
    starting at ``base``: the readers' error (the scanner's, the hub's)."""
    return CorruptionError(
        f"the segment ends before offset {due} but the next one starts at offset {base}: {gap_reason(due, base)}",
        file=segment.path,
        position=position,
        offset=due,
    )


def incomplete_end_error(segment: Segment, position: int, due: int, pending: int) -> CorruptionError:
    """A finished segment (one with a segment after it) that ends with ``pending`` bytes of an
    incomplete message at ``position``: damage, not a message being written."""
    return CorruptionError(
        f"incomplete message ({pending} bytes) at the end of a finished segment",
        file=segment.path,
        position=position,
        offset=due,
    )


READ_CHUNK = 1 << 20


@dataclass
class SegmentScan:
    """What a pass over (part of) a segment found.

    ``end`` is the position just past the last whole, valid message and ``next_offset`` the offset
    due there. When the bytes after ``end`` are not a whole valid message, ``problem`` says why:
    they may be a message still being written, a torn write, or damage.
    """

    end: int
    next_offset: int
    last_timestamp_ns: int | None
    file_size: int
    entries: list[tuple[int, int]]
    problem: CorruptionError | None = None
    messages: list[Message] | None = None
    """The messages read, with ``keep=True``."""
    data: bytes = b""
    """Their bytes as the segment held them (from ``start`` to ``end``), with ``keep=True``."""
    incomplete: bool = False
    """Whether the ``problem`` is a message that the segment's end cuts short (an append under
    way, a torn write, or a size field that reaches past the end), not bytes that cannot decode."""

    @property
    def clean(self) -> bool:
        return self.end == self.file_size


def scan_segment(
    segment: Segment,
    start: int,
    start_offset: int,
    *,
    last_indexed: int = 0,
    interval: int = 4096,
    fd: int | None = None,
    keep: bool = False,
) -> SegmentScan:
    """Read ``segment`` from byte ``start`` (where message ``start_offset`` begins) to its end,
    checking every message and collecting the index entries due after ``last_indexed``.
    ``fd``: the segment already open for reading (a shared writer catching up: no open).
    ``keep``: return the messages read too, and their bytes (few: what other writers appended
    lately)."""
    from journalq.journal.index import choose_entries  # index imports this module

    entries: list[tuple[int, int]] = []
    last_ts: int | None = None
    pos, next_offset = start, start_offset
    kept: list[Message] | None = [] if keep else None
    kept_bytes: list[bytes] = []
    own = fd is None
    if own:
        fd = open_segment(segment)
    try:
        size = os.fstat(fd).st_size
        pending = b""
        problem = None
        while pos < size:
            # No more than the file holds: a 1 MiB buffer for a few bytes costs more than reading them.
            # As much as is pending at least: a message larger than a chunk, read a chunk at a
            # time and joined to all read before, cost time quadratic in its size.
            want = max(READ_CHUNK, len(pending))
            chunk = os.pread(fd, min(want, size - pos - len(pending)), pos + len(pending))
            if not chunk:
                break
            buf = pending + chunk
            try:
                messages, used = decode(buf, 0, len(buf), next_offset)
            except CorruptionError as exc:
                problem = exc.located(segment.path, pos)
                messages, used = decode(buf, 0, exc.position, next_offset)
            if messages:
                starts = list(accumulate((OVERHEAD + len(m.key) + len(m.value) for m in messages), initial=pos))
                found, last_indexed = choose_entries(next_offset, starts, last_indexed, interval)
                entries.extend(found)
                next_offset = messages[-1].offset + 1
                last_ts = messages[-1].timestamp_ns
                if kept is not None:
                    kept += messages
                    kept_bytes.append(buf[:used])
            pos += used
            pending = buf[used:]
            if problem is not None or (not messages and pos + len(pending) >= size):
                break
    finally:
        if own:
            os.close(fd)
    incomplete = problem is None and pos < size
    if incomplete:
        problem = CorruptionError(
            f"incomplete message: {size - pos} bytes at the end", file=segment.path, position=pos, offset=next_offset
        )
    return SegmentScan(pos, next_offset, last_ts, size, entries, problem, kept, b"".join(kept_bytes), incomplete)
