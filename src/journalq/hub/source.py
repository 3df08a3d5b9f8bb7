"""Reading a journal's own bytes: runs of whole messages, as its segment files hold them.

The hub protocol carries a journal's bytes, never re-encoded, so a copy is byte-identical to its
source. ``RawReader`` finds where an offset lies (a segment, then its sparse index, then at most
one index interval of decoding), and then reads on from there without seeking again; each run
checks its messages with the codec and stays within one segment. It only reads: a journal being
written by another process, or a read-only one, is fine.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import CorruptionError, JournalError, OffsetOutOfRangeError
from journalq.journal import index
from journalq.journal.codec import frame_sizes
from journalq.journal.segment import (
    READ_CHUNK,
    Segment,
    base_after,
    confirms,
    gap_error,
    incomplete_end_error,
    open_segment,
    segment_at,
    segment_bases,
    segment_name,
)

__all__ = ["RawReader", "RawRun"]


@dataclass(frozen=True)
class RawRun:
    """``count`` whole messages from offset ``first``, as ``data``, all from the segment that
    starts at offset ``segment``."""

    first: int
    segment: int
    data: bytes
    count: int

    @property
    def next(self) -> int:
        return self.first + self.count


class RawReader(Closing):
    """Reads runs of whole messages from the journal at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._jnl = self.path / "jnl"
        self._fd = -1
        self._segment: Segment = segment_at(self.path, 0)
        self._pos = 0  # where message ``_next`` starts in ``_segment``
        self._next = -1  # -1: not positioned
        # Where the segment after ``_segment`` starts, when one was listed after it (it is
        # finished, then): a segment that ends elsewhere is damage, not the journal's end.
        self._next_base: int | None = None

    def read(self, offset: int, max_bytes: int = READ_CHUNK) -> RawRun:
        """The whole messages from ``offset`` within ``max_bytes`` (at least one message when
        there is one, however large), from one segment; an empty run at the journal's end.

        ``OffsetOutOfRangeError`` for an offset older than the oldest stored or past the end;
        ``CorruptionError`` (naming the file and byte) for damage in the journal.
        """
        if offset != self._next or self._fd < 0:
            # Not positioned, or positioned in a journal that had no segment yet: look again (a
            # writer makes jnl/ before its first segment, which need not start at 0).
            self._seek(offset)
        while True:
            size = os.fstat(self._fd).st_size if self._fd >= 0 else 0
            if size > self._pos:
                run = self._read_run(max_bytes, size)
                if run is not None:
                    return run
            # At the end of a segment: the writer starts the next one named by the offset due.
            following = self._jnl / segment_name(self._next)
            if self._next == self._segment.base or not following.exists():
                if self._fd < 0 or os.fstat(self._fd).st_nlink:
                    self._refuse_damaged_end(size)
                    return RawRun(self._next, self._segment.base, b"", 0)
                # Deleted, and (looked at again, for a roll just before gc) none after it: gc
                # never deletes the newest segment, so the journal itself was deleted or replaced.
                if self._next == self._segment.base or not following.exists():
                    deleted = self._segment.path
                    self.close()
                    raise JournalError(
                        "the journal was deleted or replaced while it was read: its newest segment "
                        "is gone, with none after it; read it anew (a copy of it compared again)",
                        file=deleted,
                    )
            if self._fd >= 0 and os.fstat(self._fd).st_size != size:
                continue  # the writer finished this segment meanwhile
            if size != self._pos:
                raise incomplete_end_error(self._segment, self._pos, self._next, size - self._pos)
            self._open(segment_at(self.path, self._next), base_after(self.path, self._next))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._next = -1

    # -- reading ------------------------------------------------------------------------------

    def _read_run(self, max_bytes: int, size: int) -> RawRun | None:
        """The whole messages from ``_pos`` within ``max_bytes``; None when none is whole yet."""
        want = max(1, max_bytes)
        while True:
            buf = os.pread(self._fd, want, self._pos)
            try:
                sizes, used = frame_sizes(buf, self._next)
            except CorruptionError as exc:
                if not exc.position:
                    raise exc.located(self._segment.path, self._pos) from None
                sizes, used = frame_sizes(buf[: exc.position], self._next)
            if sizes:
                if want > max_bytes:  # read more to find the end of one large message: it goes alone
                    sizes, used = sizes[:1], sizes[0]
                run = RawRun(self._next, self._segment.base, buf[:used] if used < len(buf) else buf, len(sizes))
                self._pos += used
                self._next += len(sizes)
                return run
            if len(buf) < want or self._pos + want >= size:
                return None  # the message is still being written (or torn, for recovery to cut)
            want *= 2  # one message larger than max_bytes: read it whole

    def _refuse_damaged_end(self, size: int) -> None:
        """At the end of a segment that no segment follows at the offset due: the journal's end,
        unless a segment is listed after it, which a copy would never reach (a push stopped
        there for good, "caught-up", exit status 0): the segment was cut inside a message, or
        segments are missing. (Listed again: a failed append may have taken that one back.) In
        the last segment, an incomplete message with indexed whole messages after it is damage
        too (``index.damage_at_end``), not an append under way."""
        if self._next_base is None:
            if size > self._pos and self._fd >= 0:
                damage = index.damage_at_end(self._segment, self._pos, self._next, size - self._pos, size)
                if damage is not None:
                    raise damage
            return
        self._next_base = base_after(self.path, self._segment.base)
        if self._next_base is None or os.fstat(self._fd).st_size != size:
            return
        if size != self._pos:
            raise incomplete_end_error(self._segment, self._pos, self._next, size - self._pos)
        raise gap_error(self._segment, self._pos, self._next, self._next_base)

    # -- seeking ------------------------------------------------------------------------------

    def _open(self, segment: Segment, next_base: int | None = None) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment, self._pos, self._next = segment, 0, segment.base
        self._next_base = next_base
        try:
            self._fd = open_segment(segment)
        except FileNotFoundError:
            self._fd = -1  # an empty journal: its first segment is not there yet

    def _seek(self, offset: int) -> None:
        if not self.path.is_dir():
            raise JournalError("no journal directory here", file=self.path)
        bases = segment_bases(self.path)
        first = bases[0] if bases else 0
        if offset < first:
            raise OffsetOutOfRangeError(
                f"offset {offset} is no longer stored: the journal starts at {first}", file=self.path
            )
        which = bisect_right(bases, offset) - 1  # -1: no segment yet
        after = bases[which + 1] if 0 <= which < len(bases) - 1 else None
        self._open(segment_at(self.path, bases[which] if bases else 0), after)
        if offset == self._segment.base:
            return
        if self._fd >= 0:
            entry = index.lookup(self._segment, offset)
            # confirms: the segment's word, not the index's.
            if entry is not None and entry[0] >= self._next and confirms(self._fd, *entry):
                self._next, self._pos = entry
            # Skip the messages from there to the one asked for. One larger than a read makes
            # the next read larger (a journal without journalq's index, as sej writes it, is
            # read from its segment's start: a large message may lie anywhere before).
            want = READ_CHUNK
            while self._next < offset:
                buf = os.pread(self._fd, want, self._pos)
                try:
                    sizes, _ = frame_sizes(buf, self._next)
                except CorruptionError as exc:
                    if not exc.position:
                        raise exc.located(self._segment.path, self._pos) from None
                    sizes, _ = frame_sizes(buf[: exc.position], self._next)  # up to the damage
                if not sizes:
                    if len(buf) < want:
                        break  # the segment ends (maybe in a message still being written)
                    want *= 2
                    continue
                sizes = sizes[: offset - self._next]
                self._pos += sum(sizes)
                self._next += len(sizes)
        if self._next != offset:
            at_end = self._next
            self.close()
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the end of the journal (the next offset is {at_end})", file=self.path
            )
