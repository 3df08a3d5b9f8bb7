"""The sparse offset index kept beside each segment (``%016x.idx``), after Kafka's.

It maps some offsets of a segment to the byte positions of their messages, one entry every
``interval`` bytes or so, so that a seek reads one index lookup and at most ``interval`` bytes of
segment, however long the journal. The index is only a hint: every entry is checked against the
segment when it is used, and an index that is missing, damaged or stale is rebuilt from the segment.

File format, big-endian: a 16-byte header (``JQIDX001`` and the segment's base offset), then
16-byte entries (offset uint64, position uint64) with both rising. A torn last entry is ignored.
"""

from __future__ import annotations

import os
import re
import struct
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from journalq.errors import CorruptionError, JournalError
from journalq.journal.segment import Segment, SegmentScan, confirms, open_journal_file, open_segment, scan_segment

MAGIC = b"JQIDX001"
HEADER = struct.Struct(">8sQ")
ENTRY = struct.Struct(">QQ")
DEFAULT_INTERVAL = 4096
TEMPORARY = re.compile(r"^[0-9a-f]{16}\.idx\.(\d+)\.tmp$")
"""The name of the file ``write_index`` renames over an index; group 1: the writing process."""

Entry = tuple[int, int]  # (offset, byte position in the segment)


def choose_entries(
    first_offset: int, starts: Sequence[int], last_indexed: int, interval: int
) -> tuple[list[Entry], int]:
    """Index entries for a run of messages appended to a segment (pure).

    ``starts[i]`` is the segment position of message ``first_offset + i``, and ``starts[-1]`` is
    where the run ends. An entry is due once a message starts ``interval`` bytes or more past the
    last entry (``last_indexed``). Returns the entries and the new ``last_indexed``.
    """
    entries: list[Entry] = []
    count = len(starts) - 1
    i = 0
    while True:
        i = bisect_left(starts, last_indexed + interval, i, count)
        if i >= count:
            return entries, last_indexed
        last_indexed = starts[i]
        entries.append((first_offset + i, last_indexed))


def encode_entries(entries: Sequence[Entry]) -> bytes:
    pack = ENTRY.pack
    return b"".join([pack(offset, position) for offset, position in entries])


def _valid_header(header: bytes, segment: Segment) -> bool:
    if len(header) != HEADER.size:
        return False
    magic, base = HEADER.unpack(header)
    return magic == MAGIC and base == segment.base


def open_index(segment: Segment, flags: int = os.O_RDONLY) -> int:
    """``os.open`` of the segment's index, refusing with a ``JournalError`` naming it what has its
    name but is no file (a directory; a named pipe, whose plain open would wait for ever)."""
    return open_journal_file(segment.index_path, flags, "an index")


def index_bytes(segment: Segment) -> bytes:
    """The whole of the segment's index file (raising as ``open_index``)."""
    with os.fdopen(open_index(segment), "rb") as f:
        return f.read()


def read_entries(segment: Segment) -> list[Entry]:
    """All entries of the segment's index; none when it is missing, cannot be read, is no file
    or is not an index of it (a hint: the segment has what it would say)."""
    try:
        data = index_bytes(segment)
    except (OSError, JournalError):
        return []
    if not _valid_header(data[: HEADER.size], segment):
        return []
    usable = HEADER.size + (len(data) - HEADER.size) // ENTRY.size * ENTRY.size
    return _rising(ENTRY.iter_unpack(data[HEADER.size : usable]), (segment.base, 0))


def _rising(entries: Iterable[Entry], after: Entry) -> list[Entry]:
    """The leading ``entries`` that rise, offset and position both, from ``after``: from the
    first that does not, what follows is damage, not index."""
    kept: list[Entry] = []
    last = after
    for entry in entries:
        if entry[0] <= last[0] or entry[1] <= last[1]:
            break
        kept.append(entry)
        last = entry
    return kept


def lookup(segment: Segment, offset: int) -> Entry | None:
    """The last entry at or before ``offset``, by binary search; ``None`` without a usable index.

    Reads O(log n) entries, so a lookup costs the same in a small segment and in a huge one. With an
    index but no entry at or before ``offset``, the answer is the segment's start.
    """
    try:
        fd = open_index(segment)
    except (OSError, JournalError):  # missing, or no file: no index
        return None
    try:
        if not _valid_header(os.pread(fd, HEADER.size, 0), segment):
            return None
        lo, hi = 0, (os.fstat(fd).st_size - HEADER.size) // ENTRY.size
        best: Entry = (segment.base, 0)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = ENTRY.unpack(os.pread(fd, ENTRY.size, HEADER.size + mid * ENTRY.size))
            if entry[0] <= offset:
                best = entry
                lo = mid + 1
            else:
                hi = mid
        return best
    except OSError:
        return None  # it opens, but does not read: no index
    finally:
        os.close(fd)


def last_position(segment: Segment) -> int:
    """The position of the index's last entry (0 without one), reading only that entry."""
    try:
        with os.fdopen(open_index(segment), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            whole = (size - HEADER.size) // ENTRY.size
            if whole <= 0 or not _valid_header(f.read(HEADER.size), segment):
                return 0
            return ENTRY.unpack(os.pread(f.fileno(), ENTRY.size, HEADER.size + (whole - 1) * ENTRY.size))[1]
    except (OSError, JournalError):
        return 0


def _writable(directory: os.PathLike[str]) -> bool:
    """Whether an index may be written here. The permission bits are asked as well as access():
    root may write anywhere, but a journal made read-only (a published test vector, an archive)
    must stay untouched by its readers."""
    try:
        return bool(os.stat(directory).st_mode & 0o222) and os.access(directory, os.W_OK)
    except OSError:
        return False


def writable(segment: Segment) -> bool:
    """Whether the segment's index may be written (see ``_writable``)."""
    return _writable(segment.index_path.parent)


def write_index(segment: Segment, entries: Sequence[Entry]) -> bool:
    """Replace the segment's index atomically; False when it cannot (the directory read-only, a
    named pipe with the name of its temporary file, which a plain open would wait on for ever)."""
    if not writable(segment):
        return False
    tmp = segment.index_path.with_name(f"{segment.index_path.name}.{os.getpid()}.tmp")
    try:
        fd = open_journal_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "an index")
    except (OSError, JournalError):
        return False  # (nothing of its own to remove: what has the name is left as it is)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(HEADER.pack(MAGIC, segment.base) + encode_entries(entries))
        os.replace(tmp, segment.index_path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


class IndexAppender:
    """Appends entries to the index of the segment a writer is appending to.

    The index is never synced: it is rebuilt from the segment whenever it disagrees with it.
    """

    def __init__(self, segment: Segment, entries: Sequence[Entry]) -> None:
        """Open the index, rewriting it to hold exactly ``entries`` (known good) when it differs."""
        self.segment = segment
        self.last_position = entries[-1][1] if entries else 0
        expected = HEADER.size + len(entries) * ENTRY.size
        path = segment.index_path
        try:
            current = path.stat().st_size
        except FileNotFoundError:
            current = -1
        if current != expected or read_entries(segment) != list(entries):
            # (Over a damaged index, or a named pipe with its name; a directory stays, refused.)
            write_index(segment, entries)
        self._fd = open_index(segment, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def add(self, entries: Sequence[Entry]) -> None:
        """Append entries. A write that fails (a full disk) stops the index where it was, and
        does not fail the append whose entries they were: its messages are already in the
        segment for readers to see. The index is a hint; the next writer rebuilds it."""
        if entries:
            if self._fd >= 0:
                data = encode_entries(entries)
                try:
                    written = os.write(self._fd, data)
                except OSError:
                    written = -1
                if written != len(data):
                    self.close()  # a torn entry may end it: nothing may follow it
            self.last_position = entries[-1][1]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def last_confirmed(segment: Segment, size: int) -> tuple[int, int, list[Entry]]:
    """The last index entry that the segment confirms, as (offset, position, entries up to it).

    Without one, the segment's start: (base, 0, []).
    """
    entries = read_entries(segment)
    if entries:
        fd = open_segment(segment)
        try:
            for i in range(len(entries) - 1, -1, -1):
                offset, position = entries[i]
                if position < size and confirms(fd, offset, position):
                    return offset, position, entries[: i + 1]
        finally:
            os.close(fd)
    return segment.base, 0, []


def entries_past_damage(segment: Segment, scan: SegmentScan, fd: int) -> list[Entry]:
    """The entries of the segment's index past the damage that ended ``scan`` (a scan from the
    segment's start) which the open segment ``fd`` confirms, as a seek confirms an entry before
    it uses it. An index rebuilt from ``scan`` keeps them after its own entries: they are what
    lets a seek get past the damage (to an offset committed after it). None without damage.
    (An entry with an offset below the one due at the damage would lead a seek for that offset
    to another message: dropped.)"""
    if scan.problem is None:
        return []
    past = [e for e in read_entries(segment) if e[1] >= scan.end and e[0] >= scan.next_offset]
    return [e for e in past if confirms(fd, *e)]


_TAIL_ENTRIES = 64
"""Entries that ``last_confirmed_entry`` reads from the end of an index (1 KiB)."""


def last_confirmed_entry(segment: Segment, size: int) -> Entry:
    """``last_confirmed``'s (offset, position), read from the end of the index: its last
    ``_TAIL_ENTRIES`` entries, rising, the last the segment confirms. A full segment's index is
    256 KiB, 16,000 entries, some 4 ms to read and check whole, at every look at a journal's end
    (a queue's counts, a scrape, a stream's next batch). Where no entry of the tail is confirmed
    (a segment cut back below them) or the tail does not rise (damage), ``last_confirmed``
    decides. (An index damaged before its tail can make this entry a later one than
    ``last_confirmed``'s: the segment confirms both, as it does what ``entries_past_damage``
    keeps.)"""
    try:
        fd = open_index(segment)
    except (OSError, JournalError):
        return segment.base, 0  # (as ``read_entries``: no index is no hint)
    try:
        header = os.pread(fd, HEADER.size, 0)
        entry_bytes = (os.fstat(fd).st_size - HEADER.size) // ENTRY.size * ENTRY.size  # (not a torn last one)
        start = HEADER.size + max(0, entry_bytes - _TAIL_ENTRIES * ENTRY.size)
        data = os.pread(fd, HEADER.size + entry_bytes - start, start) if entry_bytes > 0 else b""
    except OSError:
        return last_confirmed(segment, size)[:2]
    finally:
        os.close(fd)
    if not _valid_header(header, segment) or entry_bytes <= 0:
        return segment.base, 0  # (no entry: the segment's start)
    tail = list(ENTRY.iter_unpack(data[: len(data) // ENTRY.size * ENTRY.size]))
    if tail and len(_rising(tail, (segment.base, 0))) == len(tail):
        fd = open_segment(segment)
        try:
            for offset, position in reversed(tail):
                if position < size and confirms(fd, offset, position):
                    return offset, position
        finally:
            os.close(fd)
    return last_confirmed(segment, size)[:2]


def damage_at_end(segment: Segment, position: int, due: int, pending: int, size: int) -> CorruptionError | None:
    """For a segment of ``size`` bytes that ends with ``pending`` bytes of an incomplete message
    (message ``due``, at byte ``position``): a ``CorruptionError`` when the index names a whole
    message after it that the segment confirms, else None (an append may be under way). A writer
    adds index entries once their messages are written, in order, so an append under way has none
    past its start: such an entry means a size field that reaches past the end, which a reader
    would otherwise wait at for ever."""
    offset, entry = last_confirmed_entry(segment, size)
    if entry <= position or offset <= due:
        return None
    return CorruptionError(
        f"incomplete message ({pending} bytes to the segment's end), yet the whole message {offset} "
        f"stands after it at byte {entry}",
        file=segment.path,
        position=position,
        offset=due,
    )


def scan_tail(segment: Segment) -> SegmentScan:
    """A scan of the segment from its last confirmed index entry to its end, as a writer opening
    it reads it: its ``next_offset`` is the offset after its last whole message."""
    offset, position = last_confirmed_entry(segment, os.stat(segment.path).st_size)
    return scan_segment(segment, position, offset)
