"""The journal scanner: reads messages from any offset, and follows appends, sej's ``Scanner``.

Seeking costs the same in any journal: a binary search over segment names, then over the sparse
index of one segment, then at most one index interval of bytes. Reading decodes large chunks at a
time. Following waits on file-system notification (``watch``); an incomplete last message is
waited out, a segment that shrinks under the scanner or an offset out of order fails fast.
"""

from __future__ import annotations

import math
import os
import time
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import (
    CorruptionError,
    InvalidArgumentError,
    JournalError,
    OffsetOutOfRangeError,
    ScanTimeout,
    TruncatedError,
)
from journalq.journal import index
from journalq.journal.codec import Message, decode
from journalq.journal.segment import (
    READ_CHUNK,
    Segment,
    base_after,
    check_integer,
    confirms,
    gap_error,
    incomplete_end_error,
    journal_dir,
    open_segment,
    scan_segment,
    segment_at,
    segment_bases,
    segment_name,
    unopenable,
)
from journalq.journal.watch import DirectoryWatch

# The first read after opening a segment (or seeking in one) is small: a seek lands within one
# index interval of the message asked for, and decoding a whole READ_CHUNK (~8,000 messages of
# 100 bytes) to return one costs milliseconds. Later reads double up to READ_CHUNK.
FIRST_READ = 2 * index.DEFAULT_INTERVAL


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` when it is None or a finite number of seconds, 0 or more; else a clear
    ``Error`` (a string would fail later, in the middle of a wait; NaN would never time out).
    Waiting for ever is None's to say: inf is refused, as the command line's SECONDS refuses it."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < math.inf
    ):
        raise InvalidArgumentError(
            f"timeout must be a finite number of seconds, 0 or more (None waits for ever), not {timeout!r}"
        )
    return timeout


def check_batch_size(max_messages: int) -> None:
    """Refuse a batch size below 1: a batch of none would read as the end of the journal."""
    check_integer("max_messages", max_messages, 1)


class Scanner(Closing):
    """Iterates the messages of the journal at ``path`` from ``offset`` (by default, from the
    oldest message still stored).

    Without ``follow`` the iteration ends at the journal's current end. With ``follow=True`` (or a
    ``timeout``) it waits for new messages, across new segments, and ends only once ``timeout``
    seconds pass with no new message (never, when ``timeout`` is None). Iterating again after an
    end resumes where the scanner stopped. ``offset`` is always the offset of the next message.
    ``next_message`` waits for one message the same way, and raises ``ScanTimeout`` where the
    iteration would end.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int | None = None,
        timeout: float | None = None,
        *,
        follow: bool = False,
    ) -> None:
        self.path = Path(path)
        self._jnl = str(journal_dir(self.path))
        self.timeout = check_timeout(timeout)
        self.follow = follow or timeout is not None
        if not self.path.is_dir():
            raise JournalError("no journal directory here", file=self.path)
        if offset is not None:
            # A bad argument, not an offset out of range: callers catch that one to look again
            # where the journal starts now, and no journal ever holds a negative offset.
            offset = check_integer("offset", offset, 0)
        self._fd = -1
        self._closed = False
        self._segment: Segment = segment_at(self.path, 0)
        self._pos = 0  # where the bytes not yet decoded start in the segment
        self._pending = b""  # bytes read past _pos that do not make a whole message yet
        self._chunk = FIRST_READ  # bytes to read next: small after a seek, doubling to READ_CHUNK
        self._batch: list[Message] = []
        self._i = 0
        self._next = 0  # the offset of the first message not yet decoded
        # Where the segment after the open one starts, when one was listed after it (it is
        # finished, then): a scanner that ends it elsewhere found offsets missing or doubled.
        self._next_base: int | None = None
        self._watch: DirectoryWatch | None = None
        try:
            self._seek(offset, segment_bases(self.path))
        except BaseException:
            self.close()
            raise

    @property
    def offset(self) -> int:
        """The offset of the next message this scanner returns."""
        return self._next - (len(self._batch) - self._i)

    def __iter__(self) -> Iterator[Message]:
        while True:
            batch, i = self._batch, self._i
            n = len(batch)
            while i < n:
                message = batch[i]
                i += 1
                self._i = i
                yield message
                # ``read_batch`` may have taken what came next meanwhile: go on after it.
                if self._batch is not batch:
                    break  # the whole batch, and more
                i = self._i
            else:
                if not self._advance():
                    return

    def read_batch(self, max_messages: int = 65536) -> list[Message]:
        """The next messages available now, up to ``max_messages``; waits (as the iteration does)
        when there are none. An empty list means the end (or the timeout) was reached."""
        check_batch_size(max_messages)
        if self._i >= len(self._batch) and not self._advance():
            return []
        out = self._batch[self._i : self._i + max_messages]
        self._i += len(out)
        return out

    def next_message(self) -> Message:
        """The next message, waiting as the iteration does. Where the iteration would end, raises
        ``ScanTimeout``: ``timeout`` seconds passed with no new message, or (a scanner that does
        not follow: it waits no time) the end of the journal was reached. The scanner goes on
        from there when called again, as sej's does after its ``ErrTimeout``."""
        batch = self.read_batch(1)
        if not batch:
            if self.follow:
                assert self.timeout is not None  # else read_batch waits for ever
                reason = f"no new message within {self.timeout:g} s"
            else:
                reason = "no new message: the end of the journal (the scanner does not follow)"
            raise ScanTimeout(reason, file=self.path, offset=self.offset)
        return batch[0]

    def close(self) -> None:
        """Close the segment and the watch; ``offset`` still says where the scanner stopped.
        Closing twice is harmless; reading after it is a ``JournalError``."""
        # The batch decoded but not handed out is dropped (the offset kept), so that every read
        # reaches ``_fill``, which checks for the close where it would open a segment again: no
        # check per message or per batch.
        self._next = self.offset
        self._batch, self._i = [], 0
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._watch is not None:
            self._watch.close()
            self._watch = None


    # -- seeking ----------------------------------------------------------------------------

    def _seek(self, wanted: int | None, bases: list[int]) -> None:
        """Position at ``wanted`` (None: the oldest message stored), given the segments listed."""
        offset = wanted if wanted is not None else bases[0] if bases else 0
        if not bases:
            if offset != 0:
                raise OffsetOutOfRangeError(f"offset {offset} is past the end of an empty journal", file=self.path)
            self._segment = segment_at(self.path, 0)
            return
        if offset < bases[0]:
            raise OffsetOutOfRangeError(
                f"offset {offset} is no longer stored: the journal starts at {bases[0]}",
                file=self.path,
            )
        which = bisect_right(bases, offset) - 1
        segment = segment_at(self.path, bases[which])
        if not self._open(segment, bases[which + 1] if which + 1 < len(bases) else None):
            # Deleted (by gc) since it was listed: look again, where it is no longer stored.
            bases = segment_bases(self.path)
            if segment.base in bases:  # still listed, yet not there (a dangling link): no gc
                raise unopenable(segment)
            self._seek(wanted, bases)
            return
        start = self._index_entry(segment, offset, sealed=which < len(bases) - 1)
        try:
            self._decode_to(offset, start)
        except CorruptionError:
            if start == (segment.base, 0) or self._segment != segment:
                raise  # found reading from the segment's start, or in a later segment
            # The index entry led into a value that holds its offset (a lying index) or into
            # damage: the segment read from its start says which (and where the damage is).
            self._decode_to(offset, (segment.base, 0))

    def _decode_to(self, offset: int, start: tuple[int, int]) -> None:
        """Decode forward from ``start`` (offset, position in the open segment) until the batch
        holds ``offset``, or the journal ends."""
        self._next, self._pos = start
        self._pending, self._chunk, self._batch, self._i = b"", FIRST_READ, [], 0
        while self._fill():
            if self._batch[-1].offset >= offset:
                self._i = offset - self._batch[0].offset
                return
        self._batch, self._i = [], 0
        if self._next != offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the end of the journal (the next offset is {self._next})",
                file=self.path,
            )

    def _index_entry(self, segment: Segment, offset: int, sealed: bool) -> tuple[int, int]:
        """Where to start decoding for ``offset``: a confirmed index entry, or the segment's start."""
        if offset == segment.base:
            return offset, 0
        entry = index.lookup(segment, offset)
        if entry is not None and confirms(self._fd, *entry):
            return entry
        if sealed and index.writable(segment):
            # A missing or stale index of a sealed segment (one written by sej, say): rebuild it
            # once, for every later seek. A read-only journal just goes without: a scan of the
            # whole segment at every seek costs more than reading from its start to the offset.
            scan = scan_segment(segment, 0, segment.base, fd=self._fd)  # open: gc may delete it
            entries = scan.entries + index.entries_past_damage(segment, scan, self._fd)
            if index.write_index(segment, entries) and os.fstat(self._fd).st_nlink == 0:
                # Collected meanwhile: its gc deleted the index before this one was written,
                # which would be left for ever beside no segment. (A gc after this sees it.)
                segment.index_path.unlink(missing_ok=True)
            usable = [e for e in entries if e[0] <= offset]
            if usable:
                return usable[-1]
        return segment.base, 0

    # -- reading ----------------------------------------------------------------------------

    def _open(self, segment: Segment, next_base: int | None) -> bool:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment = segment
        self._next_base = next_base
        self._pos, self._pending, self._next = 0, b"", segment.base
        self._chunk = FIRST_READ
        try:
            self._fd = open_segment(segment)
        except FileNotFoundError:
            return False
        return True

    def _fill(self) -> bool:
        """Decode the next chunk into ``_batch``; False when nothing new is there now."""
        if self._fd < 0:
            if self._closed:  # else it would open the segment again, from its start
                raise JournalError("scanner is closed", file=self.path)
            if not self._open(self._segment, self._next_base):
                return False
        while True:
            stat = os.fstat(self._fd)
            size = stat.st_size
            if size < self._pos:
                raise TruncatedError(
                    f"segment shrank to {size} bytes after {self._pos} bytes were read",
                    file=self._segment.path,
                    offset=self._next,
                )
            pending = self._pending
            have = self._pos + len(pending)
            if pending and size != have:
                # The incomplete message read may be a torn tail that recovery has cut since,
                # and others appended over: read it again with what follows, never trust it.
                self._pending, have = b"", self._pos
            if size > have:
                # Twice the pending bytes at least, so that a huge message takes few reads.
                # (No more than the file holds: a large buffer for a few bytes costs more.)
                chunk = os.pread(self._fd, min(max(self._chunk, 2 * len(pending)), size - have), have)
                self._chunk = min(2 * self._chunk, READ_CHUNK)
                buf = chunk
                try:
                    messages, used = decode(buf, 0, len(buf), self._next)
                except CorruptionError as exc:
                    if not exc.position:
                        raise exc.located(self._segment.path, self._pos) from None
                    # Hand out the whole messages before the damage first: the next read
                    # starts at the damaged message and raises.
                    messages, used = decode(buf, 0, exc.position, self._next)
                    buf = buf[:used]
                self._pos += used
                self._pending = buf[used:]
                if messages:
                    self._batch, self._i = messages, 0
                    self._next = messages[-1].offset + 1
                    return True
                continue
            pending = self._pending
            if pending and os.pread(self._fd, len(pending), self._pos) != pending:
                self._pending = b""  # cut and written over with as many bytes: read them again
                continue
            if pending:
                self._check_incomplete(size)
            # At the end of the segment: go on to the next one once it exists (a string path:
            # this runs on every poll, and pathlib is slow).
            if self._next == self._segment.base or not os.path.exists(
                os.path.join(self._jnl, segment_name(self._next))
            ):
                if stat.st_nlink == 0:
                    later = [base for base in segment_bases(self.path) if base > self._segment.base]
                    if self._next in later:
                        continue  # the next segment came meanwhile: go on into it
                    if later:
                        # Collected (retention deletes the oldest, this one and the next among
                        # them): what the scanner wants next is no longer stored.
                        raise OffsetOutOfRangeError(
                            f"offset {self._next} is no longer stored: its segment was deleted "
                            f"before the scanner reached it; the journal starts at {later[0]}",
                            file=self._segment.path,
                            offset=self._next,
                        )
                    # The last segment is gone: a failed append was taken back (and with it
                    # messages this scanner may have returned), or the journal was deleted.
                    raise TruncatedError(
                        "the segment was removed under the scanner", file=self._segment.path, offset=self._next
                    )
                if self._next_base is not None:
                    # A finished segment that ends where no segment begins: not the journal's
                    # end, which a scanner would wait at for ever, but segments missing or
                    # misnamed (``journalq check`` lists them), or a finished segment cut short
                    # inside a message. Unless the segment after it was taken back with a failed
                    # append since it was listed: look again.
                    self._next_base = base_after(self.path, self._segment.base)
                    if os.fstat(self._fd).st_size != size:
                        continue
                    if self._pending:
                        if self._next_base is None:
                            return False  # the last segment again: a message being written
                        raise self._incomplete_end()  # no writer appends to a segment with one after it
                    if self._next_base == self._next:
                        following = segment_at(self.path, self._next)
                        if os.path.exists(following.path):
                            continue  # created since it was looked for
                        # Listed, yet not there to open (a dangling link): no gap.
                        raise unopenable(following)
                    if self._next_base is not None:
                        raise self._gap()
                return False
            following = segment_at(self.path, self._next)
            if os.fstat(self._fd).st_size != size:
                continue  # the writer finished this segment meanwhile
            if self._pending:
                raise self._incomplete_end()
            if not self._open(following, base_after(self.path, following.base)):
                raise OffsetOutOfRangeError(
                    f"offset {self._next} is no longer stored: its segment was deleted before the scanner reached it",
                    file=following.path,
                    offset=self._next,
                )

    def _check_incomplete(self, size: int) -> None:
        """At the segment's end (``size`` bytes), ``_pending`` the start of a message: raise the
        ``CorruptionError`` of ``index.damage_at_end`` when the index shows it is damage."""
        damage = index.damage_at_end(self._segment, self._pos, self._next, len(self._pending), size)
        if damage is not None:
            raise damage

    def _incomplete_end(self) -> CorruptionError:
        return incomplete_end_error(self._segment, self._pos, self._next, len(self._pending))

    def _gap(self) -> CorruptionError:
        assert self._next_base is not None
        return gap_error(self._segment, self._pos, self._next, self._next_base)

    def _advance(self) -> bool:
        """Refill the batch, waiting when following; False at the end or on timeout."""
        self._batch, self._i = [], 0
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            if self._fill():
                if self._watch is not None:
                    self._watch.changed()
                return True
            if not self.follow:
                return False
            if self._watch is None:
                directory = journal_dir(self.path)
                self._watch = DirectoryWatch(directory if directory.is_dir() else self.path)
                continue  # look once more: an append may have come before the watch began
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if not self._watch.wait(remaining) and deadline is not None and time.monotonic() >= deadline:
                return False
            if self._watch.directory != journal_dir(self.path) and journal_dir(self.path).is_dir():
                self._watch.close()
                self._watch = None
