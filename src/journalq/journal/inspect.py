"""Looking at a journal from outside: what it holds (``describe``) and whether it is sound (``check``).

``describe`` is cheap: it reads the first message of every segment, the last message of a sealed
segment by going backward from its trailing size field (what the size field is for), and the tail
of the last segment from its last confirmed index entry, as a writer would. It trusts the structure
in between; ``check`` is the one that reads every byte.

``check`` reads every segment and every sparse index without changing anything, unless asked to
repair. Repair does only what is safe: it recovers the last segment exactly as opening a writer
does (cutting a torn or damaged tail and keeping the bytes under ``DIR/cut/``), rewrites stale or
missing indexes, which are mere hints rebuilt from the segments, and removes what killed processes
left that no one reads (an index whose segment is gone, the temporary file of an index or offset
being written). Damage anywhere else is reported,
never "repaired" by cutting data that readers may still need.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from journalq.errors import CorruptionError, Error, JournalError, LockedError, StorageError
from journalq.journal import index, offsets
from journalq.journal.codec import INT32, OVERHEAD, Message, decode
from journalq.journal.lock import FileLock, process_alive
from journalq.journal.recovery import Recovery, misnamed
from journalq.journal.scanner import Scanner
from journalq.journal.segment import (
    SPARE,
    Segment,
    SegmentScan,
    gap_reason,
    journal_dir,
    list_segments,
    lock_path,
    open_segment,
    orphan_indexes,
    raise_if_unopenable,
    scan_segment,
)
from journalq.journal.writer import Writer, held_for_life

__all__ = [
    "CheckReport",
    "JournalInfo",
    "Problem",
    "SegmentInfo",
    "check",
    "describe",
    "first_offset_since",
    "require_journal",
]

_ABANDONED_AFTER = 60.0
"""Seconds after which a temporary file of a process not running here is taken for abandoned
(written in a few milliseconds, it is not another pid namespace's write in progress)."""
_FIRST_READ = 64 * 1024  # enough for most messages; a larger one is read again whole
_LOCK_WAIT = 10.0
"""Seconds a repair waits for the journal's lock held by a writer that left no note: a shared
writer holds it for one append, but sej's own writer for its lifetime."""


# -- describe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentInfo:
    """One segment file. Timestamps are raw (the zero time is ``ZERO_TIMESTAMP``), None when the
    segment holds no whole message; ``end_offset`` is the offset after its last whole message."""

    base: int
    path: Path
    size_bytes: int
    first_offset: int
    end_offset: int
    first_timestamp_ns: int | None
    last_timestamp_ns: int | None
    messages: int


@dataclass(frozen=True)
class JournalInfo:
    """A journal directory: its segments, oldest first, and their totals."""

    path: Path
    segments: list[SegmentInfo]
    first_offset: int
    end_offset: int
    size_bytes: int
    messages: int

    @property
    def first_timestamp_ns(self) -> int | None:
        """The timestamp of the oldest stored message (None when the journal is empty)."""
        return next((s.first_timestamp_ns for s in self.segments if s.messages), None)

    @property
    def last_timestamp_ns(self) -> int | None:
        """The timestamp of the newest stored message (None when the journal is empty)."""
        return next((s.last_timestamp_ns for s in reversed(self.segments) if s.messages), None)


def require_journal(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, or a ``JournalError`` saying why it is not a journal directory.

    A journal always has ``jnl/`` (a writer creates it on open), so a directory without one is
    most likely a typo or a root of shards; refusing it keeps ``check --repair`` from creating a
    journal where none was meant to be.
    """
    path = Path(path)
    if not path.exists():
        raise JournalError("no such directory", file=path)
    if not path.is_dir():
        raise JournalError("not a directory", file=path)
    jnl = journal_dir(path)
    if not jnl.is_dir():
        if os.path.lexists(jnl):  # a file (or a dangling link) where the segments go: name it
            raise JournalError("not a directory", file=jnl)
        raise JournalError("not a journal directory: it has no jnl/ subdirectory", file=path)
    return path


def describe(path: str | os.PathLike[str]) -> JournalInfo:
    """Segments, offsets, timestamps and sizes of the journal at ``path``.

    Raises ``CorruptionError`` when the first or last message of a segment does not decode (run
    ``check`` to find every problem); a torn tail of the last segment is normal after a crash and
    is simply not counted, as a writer would not count it.
    """
    path = require_journal(path)
    segments = list_segments(path)
    infos = []
    for i, segment in enumerate(segments):
        try:
            infos.append(_describe_segment(segment, sealed=i < len(segments) - 1))
        except FileNotFoundError as exc:
            # Listed still, it cannot be opened (a dangling link): named, not taken for collected.
            raise_if_unopenable(exc, list_segments(path))
            continue  # collected (a queue's gc) since it was listed: no longer the journal's
    return JournalInfo(
        path=path,
        segments=infos,
        first_offset=infos[0].first_offset if infos else 0,
        end_offset=infos[-1].end_offset if infos else 0,
        size_bytes=sum(s.size_bytes for s in infos),
        messages=sum(s.messages for s in infos),
    )


def _describe_segment(segment: Segment, *, sealed: bool) -> SegmentInfo:
    fd = open_segment(segment)
    try:
        size = os.fstat(fd).st_size
        first = _message_at(segment, fd, 0, size, segment.base)
        last = _last_message(segment, fd, size) if sealed and first is not None else None
    finally:
        os.close(fd)
    if last is not None:
        end_offset, last_ts = last.offset + 1, last.timestamp_ns
    else:
        end_offset, last_ts = _scan_tail(segment, sealed=sealed)
    return SegmentInfo(
        base=segment.base,
        path=segment.path,
        size_bytes=size,
        first_offset=segment.base,
        end_offset=end_offset,
        first_timestamp_ns=first.timestamp_ns if first is not None else None,
        last_timestamp_ns=last_ts,
        messages=end_offset - segment.base,
    )


def _message_at(segment: Segment, fd: int, position: int, end: int, offset: int | None) -> Message | None:
    """The whole message at ``position`` (before ``end``), or None when it is incomplete.

    Raises ``CorruptionError``, located in the segment, when the bytes there are not a message
    (with ``offset`` given: not the message with that offset).
    """
    want = _FIRST_READ
    while True:
        buf = os.pread(fd, min(want, end - position), position)
        try:
            messages, _ = decode(buf, expected_offset=offset, max_messages=1)
        except CorruptionError as exc:
            raise exc.located(segment.path, position) from None
        if messages:
            return messages[0]
        if position + len(buf) >= end:
            return None
        want *= 4


def _last_message(segment: Segment, fd: int, size: int) -> Message | None:
    """The last message of a segment, found backward from its trailing size field; None when the
    bytes there do not make a whole message ending exactly at the end of the file."""
    if size < OVERHEAD:
        return None
    (length,) = INT32.unpack(os.pread(fd, INT32.size, size - INT32.size))
    if not OVERHEAD <= length <= size:
        return None
    try:
        messages, used = decode(os.pread(fd, length, size - length), max_messages=1)
    except CorruptionError:
        return None
    return messages[0] if messages and used == length else None


def _scan_tail(segment: Segment, *, sealed: bool) -> tuple[int, int | None]:
    """(end offset, last timestamp) by scanning from the last confirmed index entry, as a writer
    does on open. A sealed segment whose end does not decode is damage, and is raised."""
    scan = index.scan_tail(segment)
    if sealed and scan.problem is not None:
        raise scan.problem
    return scan.next_offset, scan.last_timestamp_ns


# -- check ------------------------------------------------------------------------------------

ProblemKind = Literal["segment", "tail", "index", "journal", "offset"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a journal.

    ``kind``: ``segment``, messages that do not decode or offsets that are not dense inside a
    segment (never repaired: the data after it may still be needed); ``tail``, the same at the end
    of the last segment, where a writer would cut it (repaired by cutting, bytes kept); ``index``,
    a sparse index that is missing, damaged or points at the wrong messages (repaired by
    rebuilding it), or a leftover: an index whose segment is gone, or the temporary file of a
    rebuild whose process was killed (repaired by removing it); ``journal``, segments that do not
    follow each other densely; ``offset``, a reader offset file that cannot be read (never
    repaired: ``set_offset`` mends it) or a killed commit's temporary file (removed). ``fixed`` says
    whether ``check(repair=True)`` repaired it. ``resume``: for damage that is left in place, the
    offset where whole messages start again after it (an index entry that the segment confirms,
    or the next segment's first), where a queue's channel can skip to (``Channel.skip_to``).
    """

    kind: ProblemKind
    file: Path
    position: int | None
    offset: int | None
    reason: str
    fixed: bool = False
    resume: int | None = None

    def __str__(self) -> str:
        where = [str(self.file)]
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        state = "repaired" if self.fixed else "not repaired"
        return f"{self.kind}: {', '.join(where)}: {self.reason} ({state})"


@dataclass
class CheckReport:
    """What ``check`` found: ``ok`` when no problem is left unrepaired."""

    path: Path
    segments: int = 0
    messages: int = 0
    problems: list[Problem] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.fixed for p in self.problems)

    @property
    def remaining(self) -> list[Problem]:
        """The problems that are still there."""
        return [p for p in self.problems if not p.fixed]


def check(path: str | os.PathLike[str], repair: bool = False) -> CheckReport:
    """Verify every message and every sparse index of the journal at ``path``.

    Checked: every message decodes, offsets run densely within each segment and from one segment
    to the next, each segment starts at the offset its name says, and every index entry points at
    the message with its offset. With ``repair``, the last segment is first recovered exactly as a
    writer recovers it on open (under the journal's lock, taken as shared writers take it, between
    their appends: ``LockedError`` while an exclusive writer, or sej's, runs), then stale or
    missing indexes are rebuilt, and indexes of no segment and the temporary files of killed
    processes removed. Reader offset files that cannot be read are reported too. Nothing else is
    ever changed.

    Run while a writer appends, the message being written may show as an incomplete ``tail``.
    """
    path = require_journal(path)
    report = CheckReport(path)
    # The last segment's index problem before the recovery, which rebuilds that index as it opens
    # the segment: reported as fixed by it (else the repair would change what it does not say).
    before: tuple[Path, str] | None = None
    if repair:
        listed = list_segments(path)
        recoverable = True
        if listed:
            last = listed[-1]
            try:
                fd = _open_listed(path, last)
            except JournalError:
                recoverable = False  # no file (a directory, a dangling link): no writer opens it; reported below
            else:
                try:
                    whole = scan_segment(last, 0, last.base, fd=fd)
                    reason = _index_problem(last, whole, index.entries_past_damage(last, whole, fd), fd)
                finally:
                    os.close(fd)
                before = None if reason is None else (last.index_path, reason)
        try:
            report.recoveries = _recover(path) if recoverable else []
        except (LockedError, StorageError):
            raise
        except JournalError:
            # A misnamed last segment, which recovery refuses to cut, or a directory where its
            # index goes, which a writer cannot open: reported below.
            pass
        report.problems.extend(_recovery_problem(r) for r in report.recoveries)
    segments = list_segments(path)
    report.segments = len(segments)
    due: int | None = None  # the offset the next segment must start at, when known
    for i, segment in enumerate(segments):
        if due is not None and segment.base != due:
            report.problems.append(_gap_problem(segment, due))
        try:
            fd = _open_listed(path, segment)  # once, for the scan and the index's checks
        except FileNotFoundError:
            due = None  # collected (a queue's gc) since it was listed: no longer the journal's
            report.segments -= 1
            continue
        except JournalError as exc:  # no file (a directory, a dangling link with a segment's name)
            report.problems.append(Problem("segment", segment.path, None, segment.base, exc.reason))
            due = None
            continue
        try:
            scan = scan_segment(segment, 0, segment.base, fd=fd)
            report.messages += scan.next_offset - segment.base
            sound_past = index.entries_past_damage(segment, scan, fd)
            if scan.problem is not None:
                following = segments[i + 1].base if i + 1 < len(segments) else None
                report.problems.append(_scan_problem(segment, scan, sound_past, following))
            index_problems = _check_index(segment, scan, sound_past, repair, fd)
        finally:
            os.close(fd)
        if not index_problems and before is not None and before[0] == segment.index_path:
            rebuilt = f"{before[1]}; rebuilt by the recovery"
            index_problems = [Problem("index", segment.index_path, None, None, rebuilt, True)]
        report.problems.extend(index_problems)
        # After damage the true end of a segment is unknown: a "gap" there would only echo it.
        due = scan.next_offset if scan.problem is None else None
    for file in orphan_indexes(path):
        report.problems.append(_leftover("index", file, "index of no segment: its segment was deleted", repair))
    report.problems.extend(_abandoned("index", journal_dir(path), index.TEMPORARY, repair))
    report.problems.extend(_abandoned("segment", journal_dir(path), SPARE, repair))
    report.problems.extend(_abandoned("offset", path / "ofs", offsets.TEMPORARY, repair))
    report.problems.extend(_offset_problems(path))
    return report


def _open_listed(path: Path, segment: Segment) -> int:
    """``open_segment`` of a segment listed in the journal at ``path``: ``FileNotFoundError`` when it
    was collected since (a queue's gc), a ``JournalError`` naming it when it is listed still but
    cannot be opened (a dangling link), or it would be taken for collected."""
    try:
        return open_segment(segment)
    except FileNotFoundError as exc:
        raise_if_unopenable(exc, list_segments(path))
        raise


def _leftover(kind: ProblemKind, file: Path, reason: str, repair: bool) -> Problem:
    """A file that holds nothing anyone reads, removed by ``repair``."""
    fixed = False
    if repair:
        try:
            file.unlink(missing_ok=True)
            fixed = True
        except OSError as exc:
            reason += f"; could not remove it: {exc.strerror or exc}"
    return Problem(kind, file, None, None, reason, fixed)


def _abandoned(kind: ProblemKind, directory: Path, temporary: re.Pattern[str], repair: bool) -> Iterator[Problem]:
    """The temporary files in ``directory`` (named as ``temporary`` matches, with the writing
    process's id) whose process is gone: killed before it renamed one over its index or offset
    file, or linked a spare segment into place. A live process's is a write in progress."""
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        match = temporary.match(name)
        if match and not process_alive(int(match.group(1))):
            try:
                age = time.time() - os.stat(directory / name).st_mtime
            except FileNotFoundError:
                continue  # renamed into place meanwhile
            if age < _ABANDONED_AFTER:
                continue  # maybe a process of another pid namespace (a container), writing it now
            reason = f"temporary file left by process {match.group(1)}, killed while it wrote it"
            yield _leftover(kind, directory / name, reason, repair)


def _offset_problems(path: Path) -> Iterator[Problem]:
    """Reader offset files that cannot be read (not 8 bytes): never repaired, since the value is
    lost; ``set_offset`` (``journalq offset --set``) mends one."""
    try:
        names = sorted(os.listdir(path / "ofs"))
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        stem, dot, suffix = name.rpartition(".")
        if not dot or suffix != "ofs":
            continue
        try:
            offsets.read_offset(path, stem)
        except JournalError as exc:
            yield Problem("offset", path / "ofs" / name, None, None, exc.reason)
        except Error:
            continue  # not a reader's name: no reader offset of this journal


def _recover(path: Path) -> list[Recovery]:
    """Recover the last segment the way the writer does, by opening and closing one: a shared
    one, which holds the lock for its opening only. (An exclusive one made the appends of a
    live queue's shared writers fail meanwhile, and was refused while one appended.)"""
    _wait_for_lock(path)
    writer = Writer(path, shared=True)
    writer.close()
    return writer.recoveries


def _wait_for_lock(path: Path) -> None:
    """Return once the journal's lock is free, or held by an exclusive writer (whose note the
    shared writer's opening then turns into its ``LockedError``); ``LockedError`` when a writer
    that left no note holds it ``_LOCK_WAIT`` seconds (sej's writer: a shared writer's opening
    would wait for it for ever)."""
    lock = FileLock(lock_path(path))
    try:
        deadline, delay = time.monotonic() + _LOCK_WAIT, 0.001
        while not lock.try_acquire(wait=False) and not held_for_life(lock.read_note()):
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"another writer has held the lock for {_LOCK_WAIT:g} s (sej's writer holds it "
                    "for its lifetime): stop it to repair",
                    file=lock.path,
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
    finally:
        lock.close()


def _recovery_problem(recovery: Recovery) -> Problem:
    return Problem(
        "tail",
        recovery.file,
        recovery.position,
        recovery.next_offset,
        f"{recovery.reason}; cut {recovery.cut_bytes} bytes, kept in {recovery.saved_to}",
        fixed=True,
    )


def _gap_problem(segment: Segment, due: int) -> Problem:
    return Problem(
        "journal",
        segment.path,
        0,
        segment.base,
        f"segment starts at offset {segment.base} but the previous one ends before offset {due}: "
        f"{gap_reason(due, segment.base)}",
    )


def _scan_problem(
    segment: Segment, scan: SegmentScan, sound_past: list[index.Entry], following: int | None
) -> Problem:
    """A segment's first bad message: a repairable tail only where a writer would cut it, which is
    in the last segment (``following`` None; else the next segment's base) at or after its last
    confirmed index entry (and not in a misnamed one). Where whole messages start again after
    damage that stays: the first entry of ``sound_past`` (``index.entries_past_damage``), else the
    next segment."""
    problem = scan.problem
    assert problem is not None
    kind: ProblemKind = "segment"
    if following is None and not (scan.end == 0 and misnamed(segment, segment.path.read_bytes())):
        _, confirmed, _ = index.last_confirmed(segment, scan.file_size)
        if scan.end >= confirmed:
            kind = "tail"
    reason, resume = problem.reason, None
    if sound_past:
        resume, position = sound_past[0]
        if scan.incomplete:  # not an append under way: a writer indexes only whole messages, in order
            reason = (
                f"incomplete message ({scan.file_size - scan.end} bytes to the segment's end), yet whole "
                "messages stand after it: its size field is damaged"
            )
        reason += f"; whole messages start again at offset {resume} (byte {position}, as the index confirms)"
    elif following is not None:
        resume = following
        reason += f"; whole messages start again at offset {resume} (the next segment)"
    return Problem(kind, segment.path, scan.end, scan.next_offset, reason, resume=resume)


def _check_index(
    segment: Segment, scan: SegmentScan, sound_past: list[index.Entry], repair: bool, fd: int
) -> list[Problem]:
    """The segment's index problem, if any, rebuilt from ``scan`` when ``repair``. ``fd``: the
    segment, open; ``sound_past``: ``index.entries_past_damage``."""
    reason = _index_problem(segment, scan, sound_past, fd)
    if reason is None:
        return []
    fixed = False
    if repair:
        # Past damage the scan gives no entries: the old ones that still check out stay, or a
        # seek past the damage (to an offset committed after it) would read into it and fail.
        fixed = index.write_index(segment, scan.entries + sound_past)
        if not fixed:
            reason += "; could not rewrite it (is the directory writable?)"
    return [Problem("index", segment.index_path, None, None, reason, fixed)]


def _index_problem(segment: Segment, scan: SegmentScan, sound_past: list[index.Entry], fd: int) -> str | None:
    """Why the segment's index cannot be trusted, or None when every entry checks out (past
    damage, those in ``sound_past``: see ``index.entries_past_damage``).

    An index need not list every entry a rebuild would (one that lags after a crash only makes
    seeks slower, and a writer may use another interval), but each entry it has must point at the
    start of the message with its offset, inside the valid part of the segment.
    """
    try:
        data = index.index_bytes(segment)
    except FileNotFoundError:
        # Only worth reporting where an index would hold entries: a small segment needs none.
        return "index is missing" if scan.entries else None
    except OSError as exc:
        return f"index cannot be read: {exc.strerror or exc}"
    except JournalError as exc:  # no file (a directory, a named pipe) has its name
        return exc.reason
    if data[: index.HEADER.size] != index.HEADER.pack(index.MAGIC, segment.base):
        return f"index is not an index of this segment (its header is {data[: index.HEADER.size].hex()})"
    entries = index.read_entries(segment)
    expected_size = index.HEADER.size + len(entries) * index.ENTRY.size
    if len(data) != expected_size:
        return f"index has {len(data) - expected_size} bytes after its last valid entry (torn or damaged)"
    bad = next(_bad_entries(segment, scan, entries, set(sound_past), fd), None)
    if bad is not None:
        (offset, position), why = bad
        return f"index entry (offset {offset}, byte {position}) is stale: {why}"
    return None


def _bad_entries(
    segment: Segment, scan: SegmentScan, entries: list[index.Entry], sound_past: set[index.Entry], fd: int
) -> Iterator[tuple[index.Entry, str]]:
    """Index entries that do not point at a whole, valid message with their offset (past
    damage: those not in ``sound_past``), in the open segment ``fd``."""
    for offset, position in entries:
        if position >= scan.end:
            if (offset, position) in sound_past:
                continue
            yield (offset, position), f"the valid messages end at byte {scan.end}"
            continue
        try:
            message = _message_at(segment, fd, position, scan.end, offset)
        except CorruptionError as exc:
            yield (offset, position), exc.reason
            continue
        if message is None:
            yield (offset, position), "no whole message starts there"


# -- finding by time --------------------------------------------------------------------------


def first_offset_since(path: str | os.PathLike[str], timestamp_ns: int, start: int | None = None) -> int:
    """The offset of the first message (from ``start``) whose timestamp is ``timestamp_ns`` or
    later; the journal's end offset when there is none. (Without ``start``: from the oldest
    message stored, which the scanner finds, past segments collected meanwhile.)

    sej does not require timestamps to rise, so this is a scan, not a search.
    """
    path = require_journal(path)
    with Scanner(path, start) as scanner:
        while batch := scanner.read_batch():
            for message in batch:
                if message.timestamp_ns >= timestamp_ns:
                    return message.offset
        return scanner.offset

