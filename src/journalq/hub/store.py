"""The hub's store: the copies of many clients' journals under one root.

Each copy is a sej journal in ``ROOT/[client-id].[journal-dir]/``, written with journalq's
``Writer``: a push is checked (``protocol.plan_push``), what the hub holds already is compared and
skipped, the rest is appended as the bytes it came as, and synced before the push is answered
(``sync="always"``), so that an acknowledged offset survives the hub's death. Writers are shared
(the journal's lock is taken per push), so several hub processes may serve one root.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import (
    CorruptionError,
    HubError,
    HubUnavailableError,
    InvalidJournalPathError,
    JournalError,
    StorageError,
)
from journalq.hub.protocol import (
    Held,
    Push,
    PushResult,
    check_overlap,
    copy_dir_name,
    parse_copy_dir_name,
    plan_push,
)
from journalq.hub.source import RawReader, RawRun
from journalq.journal.codec import Message
from journalq.journal.inspect import describe
from journalq.journal.lock import FileLock
from journalq.journal.offsets import end_offset, first_offset
from journalq.journal.recovery import fsync_dir
from journalq.journal.scanner import Scanner
from journalq.journal.segment import journal_dir, list_segments, lock_path, open_segment, remove_segment, segment_at
from journalq.journal.writer import Writer, take_shared_lock

__all__ = ["HubStore", "KeyedLocks", "damage_reason"]

# A copy starts a new segment only where its source did (the push says where): its own writer
# never rolls by size.
_NO_ROLL = 2**62


class KeyedLocks:
    """A ``threading.Lock`` per key, kept only while a thread holds or waits for it: a hub that
    serves many journals keeps no lock for each journal it ever saw.

    Each key's entry counts its users (the holder and the waiters). A thread counts itself in
    under the mutex before it waits, and out after it let go (or gave up), so an entry is dropped
    only when no thread holds its lock or is about to wait on it: a later thread makes a new lock,
    and it can never happen that two threads hold two different locks of one key at once.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._entries: dict[str, tuple[threading.Lock, list[int]]] = {}  # key -> (lock, [users])

    def acquire(self, key: str, blocking: bool = True) -> bool:
        """Take the lock of ``key`` (waiting unless ``blocking`` is false); whether it was taken."""
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = (threading.Lock(), [0])
            entry[1][0] += 1
        if entry[0].acquire(blocking):
            return True
        self._leave(key, entry)
        return False

    def release(self, key: str) -> None:
        entry = self._entries[key]  # held by this thread: its entry stays until _leave
        entry[0].release()
        self._leave(key, entry)

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        self.acquire(key)
        try:
            yield
        finally:
            self.release(key)

    def _leave(self, key: str, entry: tuple[threading.Lock, list[int]]) -> None:
        with self._mutex:
            entry[1][0] -= 1
            if not entry[1][0]:
                del self._entries[key]

    def __len__(self) -> int:
        """The keys whose lock is held or waited for now."""
        with self._mutex:
            return len(self._entries)


class HubStore(Closing):
    """The copies under ``root`` (created when missing). ``sync``: the writers' sync policy;
    ``"always"`` (the default) makes every acknowledged push survive power loss. ``max_open``:
    writers kept open (three files each); the least recently pushed are closed beyond it."""

    def __init__(self, root: str | os.PathLike[str], *, sync: str = "always", max_open: int = 128) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._real_root = self.root.resolve()
        self.sync = sync
        self.max_open = max_open
        self._mutex = threading.Lock()
        self._writers: OrderedDict[str, Writer] = OrderedDict()
        self._copy_locks = KeyedLocks()  # one push at a time per copy, in this process
        self._closed = False

    # -- where the copies are -------------------------------------------------------------------

    def copy_path(self, client_id: str, journal: str) -> Path:
        """``ROOT/[client-id].[journal-dir]``, refused when a symbolic link would lead it (or its
        segments) out of the root."""
        name = copy_dir_name(client_id, journal)
        path = self.root / name
        for part in (path, journal_dir(path)):
            if part.is_symlink():
                raise InvalidJournalPathError(
                    f"journal path {journal!r} of client {client_id!r} is a symbolic link in the hub's root "
                    f"({part.name} -> {os.readlink(part)}); the hub writes only inside its root"
                )
        if path.exists() and path.resolve().parent != self._real_root:
            raise InvalidJournalPathError(f"journal path {journal!r} of client {client_id!r} leaves the hub's root")
        if path.exists() and not path.is_dir():
            raise InvalidJournalPathError(f"{path.name} in the hub's root is not a directory; it cannot hold a copy")
        return path

    def held(self, client_id: str, journal: str) -> Held:
        """What the hub holds of the journal (nothing, at offset 0, for one it never saw)."""
        path = self.copy_path(client_id, journal)
        with _reading(path):
            return _held(path)

    def status(self) -> dict[str, dict[str, Held]]:
        """Every copy: client id -> journal -> what the hub holds, in name order. A copy the hub
        cannot read (a damaged segment, say) is there with the reason (``Held.unreadable``):
        one bad copy does not hide the others. Each segment's first and last messages are checked
        (``journal.inspect.describe``): a damaged first message would otherwise read as a copy
        that holds nothing (its tail scan stops at once), not as damage."""
        out: dict[str, dict[str, Held]] = {}
        for name in sorted(os.listdir(self.root)):
            parsed = parse_copy_dir_name(name)
            path = self.root / name
            if parsed is None or path.is_symlink() or journal_dir(path).is_symlink() or not journal_dir(path).is_dir():
                continue  # not a copy (a link is never one: the hub writes only inside its root)
            try:
                with _reading(path):
                    held = _held(path)  # (which names a last segment listed but not there)
                    describe(path)  # for the damage it raises
            except JournalError as exc:
                held = Held(unreadable=_unreadable(exc, path))
            out.setdefault(parsed[0], {})[parsed[1]] = held
        return out

    # -- pushing --------------------------------------------------------------------------------

    def push(self, push: Push) -> PushResult:
        """Store what the hub does not hold yet of ``push``, synced; answer with what it holds.

        Refusals (``HubError``: a damaged message, a gap, messages that differ from the ones
        held) change nothing.
        """
        path = self.copy_path(push.client_id, push.journal)
        key = path.name
        with self._mutex:
            if self._closed:
                raise _closed_error()
        with self._copy_locks.hold(key):
            try:
                try:
                    result = self._push(push, path, key)
                except _WriterPastTheFiles:
                    # Let go by ``_push``: the copy opened anew is recovered (the damage cut,
                    # kept under ``cut/``), and the push is planned against what it holds then.
                    result = self._push(push, path, key)
                if result is None:
                    # The copy is empty at another offset than the push starts (its first segment
                    # was created by a push whose append then failed): start it again where asked.
                    self._close_writer(key)
                    _start_copy(path, push.first)
                    result = self._push(push, path, key)
            except OSError as exc:  # starting the copy, opening its writer, appending
                raise _storage_error(exc, path) from exc
            assert result is not None
            return result

    def _push(self, push: Push, path: Path, key: str) -> PushResult | None:
        with self._mutex:
            writer = self._writers.get(key)
            if writer is not None:
                self._writers.move_to_end(key)
        kept = writer is not None
        if writer is None:
            held = _held(path)
            if not push.data:
                return PushResult(held)
            plan = plan_push(push, held)  # refusals before anything is created
            if held.empty:
                _start_copy(path, held.next if plan.start_at is None else plan.start_at)
            writer = self._open_writer(key, path)
        try:
            with writer.hold():
                held = Held(first_offset(path), writer.next_offset, writer.segment.base)
                if kept and end_offset(path) < held.next:
                    # Damage came under the writer kept open (in the copy's last segment, which
                    # ``held()`` reads up to it): going on past it, the push would answer one end
                    # and ``held()`` another, and a pusher would go back and forth for ever.
                    raise _WriterPastTheFiles()
                plan = plan_push(push, held)
                if plan.start_at is not None:
                    return None
                if plan.overlap:
                    check_overlap(push, plan, _read_exactly(path, plan.overlap_first, len(plan.overlap)))
                writer.append_encoded(plan.append, new_segment=plan.new_segment)
                if plan.skipped and not plan.count:
                    # The answer says the hub holds the skipped messages, which a hub process
                    # killed before its sync may have left unsynced (an append syncs them too).
                    writer.sync()
                held = Held(held.first, writer.next_offset, writer.segment.base)
        except BaseException as exc:
            if writer.failed or not isinstance(exc, HubError):
                self._close_writer(key)  # the next push reopens (and recovers) the copy
            if self._closed and not isinstance(exc, HubError):
                raise _closed_error() from exc  # ``close`` closed the writer under this push
            raise
        return PushResult(held, appended=plan.count, skipped=plan.skipped)

    # -- reading back ---------------------------------------------------------------------------

    def get(self, client_id: str, journal: str, offset: int, max_messages: int = 1) -> list[Message]:
        """Up to ``max_messages`` messages of the copy from ``offset`` (sej's ``Get``); empty at
        the end. ``OffsetOutOfRangeError`` for an offset not held."""
        path = self._existing(client_id, journal)
        with _reading(path), Scanner(path, offset) as scanner:
            return scanner.read_batch(max_messages) if max_messages > 0 else []

    def read_raw(self, client_id: str, journal: str, offset: int, max_bytes: int) -> RawRun:
        """The copy's own bytes from ``offset``: whole messages, within ``max_bytes`` (at least
        one), from one segment."""
        path = self._existing(client_id, journal)
        with _reading(path), RawReader(path) as reader:
            return reader.read(offset, max_bytes)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            writers, self._writers = list(self._writers.values()), OrderedDict()
        for writer in writers:
            writer.close()

    # -- helpers --------------------------------------------------------------------------------

    def _existing(self, client_id: str, journal: str) -> Path:
        path = self.copy_path(client_id, journal)
        if not journal_dir(path).is_dir():
            raise HubError(f"the hub holds no journal {journal!r} of client {client_id!r}")
        return path

    def _open_writer(self, key: str, path: Path) -> Writer:
        writer = Writer(path, shared=True, sync=self.sync, segment_size=_NO_ROLL)
        with self._mutex:
            closed = self._closed
            if not closed:
                self._writers[key] = writer
                idle = [k for k in self._writers if k != key][: max(0, len(self._writers) - self.max_open)]
        if closed:  # by ``close`` after this push began: it would not close this writer
            writer.close()
            raise _closed_error()
        for old in idle:
            if self._copy_locks.acquire(old, blocking=False):  # a writer in use is left for a later push to close
                try:
                    self._close_writer(old)
                finally:
                    self._copy_locks.release(old)
        return writer

    def _close_writer(self, key: str) -> None:
        with self._mutex:
            writer = self._writers.pop(key, None)
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass  # a failed writer's sync fails again; a new writer recovers


class _WriterPastTheFiles(Exception):
    """A writer kept open holds more than the copy's files do, up to damage that came under it:
    let go (as after any error not the hub's), for the push to open the copy anew."""


def _held(path: Path) -> Held:
    segments = list_segments(path)
    if not segments:
        return Held()
    return Held(segments[0].base, end_offset(path), segments[-1].base)


def _start_copy(path: Path, offset: int) -> None:
    """Make the empty copy at ``path`` start at ``offset``: its only segment, empty, is named by
    it (a writer then appends from there). Under the journal's lock, against other hub processes."""
    journal_dir(path).mkdir(parents=True, exist_ok=True)
    # Synced even when the directories were there: a start that made them may have failed (or
    # died) before it synced their entries. Once a copy start, so cheap.
    fsync_dir(path.parent)
    fsync_dir(path)
    lock = FileLock(lock_path(path))
    try:
        take_shared_lock(lock)  # not behind an exclusive writer (``journalq write``, say): for ever
        segments = list_segments(path)
        if any(s.path.stat().st_size for s in segments):
            return  # another process started it meanwhile: the push is planned again
        wanted = segment_at(path, offset)
        for segment in segments:
            if segment != wanted:
                remove_segment(segment)
        os.close(open_segment(wanted, os.O_WRONLY | os.O_CREAT))  # (refusing a named pipe: it would block)
        fsync_dir(journal_dir(path))
    finally:
        lock.close()


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Reading the copy at ``path``: a file that cannot be read (a segment that is a directory,
    say) is a ``JournalError`` naming it, which the hub answers 500 and logs, as other damage
    of its own copies, not an error unknown to it."""
    try:
        yield
    except OSError as exc:
        raise JournalError(f"cannot read the copy's files: {exc.strerror or exc}", file=exc.filename or path) from exc


def _unreadable(exc: JournalError, path: Path) -> str:
    """Why the copy at ``path`` cannot be read, naming its file within the copy, not the hub's
    root (as the hub's answers never say where it keeps its copies)."""
    if isinstance(exc, CorruptionError):
        return damage_reason(exc, path)
    where = _inside(exc.file, path)
    return f"{exc.reason} ({where})" if where is not None else exc.reason


def damage_reason(exc: CorruptionError, inside: Path) -> str:
    """``damaged: REASON (FILE, byte N, offset M)``: damage of a copy, its file named within
    ``inside`` (a copy, or the hub's root), never where that is."""
    where = [str(file)] if (file := _inside(exc.file, inside)) is not None else []
    where += [f"byte {exc.position}"] if exc.position is not None else []
    where += [f"offset {exc.offset}"] if exc.offset is not None else []
    return f"damaged: {exc.reason}" + (f" ({', '.join(where)})" if where else "")


def _inside(file: Path | None, directory: Path) -> Path | None:
    """``file`` relative to ``directory``; None when it is not in it (or is it)."""
    try:
        where = file.relative_to(directory) if file is not None else None
    except ValueError:
        return None
    return where if where != Path(".") else None


def _closed_error() -> HubUnavailableError:
    return HubUnavailableError("the hub's store is closed: the hub is shutting down")


def _storage_error(exc: OSError, path: Path) -> StorageError:
    """A push's failure to reach the copy's files, as the error answered 503 (push again)."""
    if isinstance(exc, FileNotFoundError):
        reason = f"the copy's files went away under the hub's writer (deleted?): {exc.strerror}"
    else:
        reason = f"the copy could not be stored: {exc.strerror or exc}"
    return StorageError(f"{reason}; push again from what the hub holds", errno=exc.errno, file=exc.filename or path)


def _read_exactly(path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes of the journal at ``path`` from ``offset`` (across segments), or fewer when
    it ends first."""
    parts: list[bytes] = []
    got = 0
    with RawReader(path) as reader:
        while got < size:
            run = reader.read(offset, size - got)
            if not run.count:
                break
            parts.append(run.data)
            got += len(run.data)
            offset = run.next
    return b"".join(parts)


