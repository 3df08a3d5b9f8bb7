"""The journal writer: appends messages at dense offsets to segment files, sej's ``Writer``.

Opening a writer recovers the journal: the last segment is checked from its last good index entry
to its end, and a torn or damaged tail is cut off and kept (see ``recovery``). Every append hands
its bytes to the operating system before it returns (unless ``buffer_size`` asks otherwise), so an
acknowledged append survives the death of the process; the sync policy decides when they reach
stable storage. Each write first reserves its blocks (``space``), so that a full disk fails an
append before any of it is written.

An exclusive writer holds ``jnl.lck`` for its lifetime, as sej's does. A shared writer
(``shared=True``) lets several processes append to one journal with no daemon: each append takes
the lock, catches up with what the others appended (recovering their torn writes if one died),
appends and lets go.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from contextlib import suppress
from itertools import accumulate
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import (
    STORAGE_ERRNOS,
    BusyError,
    CorruptionError,
    Error,
    InvalidArgumentError,
    InvalidMessageError,
    JournalError,
    LockedError,
    StorageError,
    TruncatedError,
)
from journalq.journal.codec import OVERHEAD, Message, encode, encode_batch, frame_sizes
from journalq.journal.index import (
    DEFAULT_INTERVAL,
    IndexAppender,
    choose_entries,
    last_confirmed,
    last_position,
)
from journalq.journal.lock import FileLock, process_alive
from journalq.journal.recovery import Recovery, cut_tail, fsync_dir, make_dirs
from journalq.journal.space import release, reserve
from journalq.journal.segment import (
    Segment,
    SegmentScan,
    check_integer,
    journal_dir,
    list_segments,
    lock_path,
    open_segment,
    remove_segment,
    remove_spares,
    scan_segment,
    segment_at,
    segment_name,
    spare_path,
)
from journalq.journal.sync import SyncPolicy, fdatasync

DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024
RESERVE_AHEAD = (64 * 1024, 1024 * 1024)
"""A write past the segment's reserved blocks reserves this much more beyond it (see ``space``):
as much as the segment holds already, at least the first figure and at most the second. So a
small journal (a queue's state) holds little unwritten space, and a big one reserves seldom."""
BACKLOG_BYTES = 2048
"""A shared writer with a ``backlog_taker`` hands it what the others appended, out of the lock,
when a hold finds more than this many bytes of it (a dozen queue events)."""
_EXCLUSIVE_NOTE = "exclusive writer"


class Writer(Closing):
    """Appends to the journal at ``path`` (created when missing).

    ``segment_size``: a segment is closed once it reaches this many bytes (like sej, after the
    message that reaches it). ``sync``: a ``SyncPolicy`` or its string (``"none"``, ``"always"``,
    ``"group:10ms,1000"``). ``buffer_size``: gather appends in memory up to this many bytes before
    writing (``0``, the default, writes every append at once; buffered appends are lost if the
    process dies before ``flush``). ``shared``: take the lock per append instead of for the
    writer's lifetime, so that other processes can append too. ``inside``: a directory the journal
    is in that the writer must not make again when it is gone (a queue's, deleted by another
    process as this one opens it: ``FileNotFoundError``), only the journal's own directories.
    ``rolls_only`` (shared): the caller's promise that no writer of the journal starts a segment
    but by filling the one before (none calls ``append_encoded(new_segment=True)``, as a hub's
    copies do): a hold that finds the segment as this writer last left it then does not look
    for a new one (a lookup of a new name in the directory at every hold otherwise).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        sync: str | SyncPolicy = "none",
        shared: bool = False,
        buffer_size: int = 0,
        index_interval: int = DEFAULT_INTERVAL,
        inside: str | os.PathLike[str] | None = None,
        rolls_only: bool = False,
    ) -> None:
        segment_size = check_integer("segment_size", segment_size, 1)
        buffer_size = check_integer("buffer_size", buffer_size, 0)
        index_interval = check_integer("index_interval", index_interval, 1)
        self.path = Path(path)
        self._jnl_prefix = os.path.join(journal_dir(self.path), "")  # the directory, with a separator
        self.segment_size = segment_size
        self.sync_policy = SyncPolicy.parse(sync)
        if buffer_size and (shared or self.sync_policy.mode == "always"):
            raise InvalidArgumentError("buffer_size cannot be used with shared=True or sync='always'")
        self.shared = shared
        self.buffer_size = buffer_size
        self.index_interval = index_interval
        self.recoveries: list[Recovery] = []
        """Every tail that this writer cut while opening or catching up, oldest first."""
        self.caught_up: list[Message] = []
        """A shared writer: the messages other writers appended that the last catch-up (the
        last ``hold()`` or append) read, in order. A caller keeping up with the journal can take
        them instead of reading them again, when they run up to ``next_offset`` (a catch-up
        that went on to a new segment gives only what it read of the old one; one after a
        backlog handed to ``backlog_taker``, only what came after it)."""
        self.backlog_taker: Callable[[list[Message]], object] | None = None
        """A shared writer: who takes in what the other writers appended (a queue's state,
        which applies their events), when a hold finds more of it than ``BACKLOG_BYTES`` (this
        process waited while the others went on): the writer lets the lock go, reads the whole
        messages there and gives them to it, then takes the lock again and catches up with what
        came meanwhile only. So the others do not wait for the lock while this one takes in
        their backlog. Called with the writer's mutex held: no other thread of this process
        holds the writer meanwhile."""
        self.backlog_lost = False
        """Set by a catch-up that found messages handed to ``backlog_taker`` no longer there (a
        writer whose append failed, a full disk, takes back what it wrote; after this one read
        it, when it read out of the lock), or by a taker that raised (the hold raises it, and
        the writer reads those messages again): the taker must rebuild what it made of them,
        and set this back to False."""
        self.segment_unlinked = False
        """Whether the last catch-up (of a shared writer) found its segment deleted: by another
        process's gc or compaction (the writer then goes on in the next segment), or with the
        whole journal (see ``held``'s ``check``)."""

        self._mutex = threading.RLock()  # reentrant: appends inside ``hold()``
        self._held = 0
        self._wake = threading.Condition(self._mutex)
        self._closed = False
        self._failed: BaseException | None = None
        self._fd = -1
        self._index: IndexAppender | None = None
        self._segment: Segment = segment_at(self.path, 0)
        self._seg_len = 0
        self._next_offset = 0
        self._rolls_only = rolls_only
        # (``rolls_only``) The length of the segment at which this writer last knew that no other
        # segment begins at its next offset: after its own append, or after it looked.
        self._looked_at = -1
        # Blocks of the segment allocated below this position (``space.reserve``): a write
        # that ends past it reserves first, unless the file system cannot (``_reserving``).
        self._reserved = 0
        self._reserving = True
        self._pending: list[bytes] = []
        self._pending_lengths: list[int] = []
        self._pending_bytes = 0
        self._unsynced = 0
        self._unsynced_since = 0.0
        # Directories whose new entries (a segment, the journal's own directories) were left
        # unsynced under ``none`` and ``group``: the next sync syncs them too, or a power cut
        # could take away a whole segment whose data that sync promised to be stored.
        self._unsynced_dirs: set[Path] = set()
        self._durable_offset = 0  # under sync="always", every offset below is on stable storage
        self._must_sync = 0  # under sync="always", the outermost operation syncs up to here
        self._syncing = False
        self._sync_lock = threading.Lock()
        self._sync_done = threading.Condition(self._sync_lock)
        self._sync_waiters = 0  # threads in ``_sync_done.wait()``: none, no ``notify_all`` to call
        # The descriptor a sync out of the mutex is using: closing the segment (a roll) leaves
        # it open for that sync to close (``_sync_fd_closed``), so its number is not reused.
        self._sync_fd = -1
        self._sync_fd_closed = False
        self._flusher: threading.Thread | None = None
        # The backlog read out of the lock, for the catch-up to check under it: where it began
        # (position, offset; -1: none), its bytes, whether an index entry fell due in it.
        self._backlog_at = self._backlog_offset = -1
        self._backlog_data = b""
        self._backlog_index_due = False

        durable = self.sync_policy.mode == "always"
        made = make_dirs(journal_dir(self.path), durable=durable, inside=None if inside is None else Path(inside))
        if not made and durable:
            # Its entry, which a writer killed after making the directory (before syncing it)
            # left unsynced: synced appends would go with it in a power cut. Once a writer.
            fsync_dir(self.path)
        elif not durable:
            self._unsynced_dirs.update(new.parent for new in made)
        # A shared writer looks for a segment another writer started at every catch-up: in this
        # directory, without resolving its path each time (see ``_catch_up``).
        self._dir_fd = (
            os.open(journal_dir(self.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if shared else -1
        )
        self._lock = FileLock(lock_path(self.path))
        try:
            if shared:
                self._take_shared_lock()  # (a note an exclusive writer that died left: cleared by taking it)
            else:
                self._lock.acquire(wait=False)
                self._lock.write_note(f"{_EXCLUSIVE_NOTE}, pid {os.getpid()}")
            try:
                remove_spares(self.path)  # a killed writer's, holding blocks
                segments = list_segments(self.path)
                segment = segments[-1] if segments else segment_at(self.path, 0)
                try:
                    self._open_segment(segment)
                except OSError as exc:
                    if exc.errno not in STORAGE_ERRNOS:
                        raise
                    # Reading the tail to recover it, syncing its directory: the storage's
                    # failure, as an append's or a catch-up's is (others, EMFILE say, stay).
                    file = Path(exc.filename) if isinstance(exc.filename, str) else segment.path
                    raise _open_failed(exc, file) from exc
            finally:
                if shared:
                    self._lock.release()
        except BaseException:
            self._close_files()
            self._close_dir()
            if not shared and self._lock.held:
                self._lock.write_note("")  # as close does: or shared writers take us for alive
            self._lock.close()
            raise
        if self.sync_policy.mode == "group" and self.sync_policy.interval_ms is not None:
            self._flusher = threading.Thread(target=self._flush_loop, name="journalq-sync", daemon=True)
            self._flusher.start()

    # -- public interface -------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next append will get (sej's ``Writer.Offset``)."""
        with self._mutex:
            return self._next_offset + len(self._pending_lengths)

    @property
    def failed(self) -> bool:
        """True once a sync failed: the writer refuses appends, and a new one must recover."""
        return self._failed is not None

    @property
    def closed(self) -> bool:
        """True once closed (``held`` then asks for the writer that took its place)."""
        return self._closed

    @property
    def segment(self) -> Segment:
        """The segment being appended to."""
        return self._segment

    def append(self, value: bytes, key: bytes = b"", type: int = 0, timestamp_ns: int | None = None) -> int:
        """Append one message; returns its offset."""
        ts = time.time_ns() if timestamp_ns is None else timestamp_ns
        if not self._mutex.acquire(False):
            self._wait_for_mutex()
        try:
            self._begin()
            try:
                offset = self._next_offset + len(self._pending_lengths)
                data = encode(offset, ts, type, key, value)
                self._add(data, [len(data) - OVERHEAD])
                self._must_sync = self._next_offset
            finally:
                durable_to = self._end()
        finally:
            self._mutex.release()
        if durable_to is not None:
            self._make_durable(durable_to)
        return offset

    def append_many(self, items: Iterable[bytes | Message], *, durable: bool = True) -> int | None:
        """Append a batch (values, or ``Message``s) in one write; returns the last offset, or
        ``None`` for an empty batch. A batch that fails is not stored at all.

        ``durable=False`` (for records whose loss in a crash is harmless, such as a queue's
        deliveries): under ``sync="always"`` the call returns without syncing, and the batch
        reaches stable storage with the next durable append's sync (one file, written in order,
        so a sync covers everything before it), a segment roll or ``close``. It is still handed
        to the operating system before the call returns: it survives the death of the process."""
        if type(items) is not list:  # (a list, the common case, is none of these: not checked)
            if isinstance(items, (bytes, bytearray, memoryview, str, Message)):
                # Iterable too, as its bytes (or fields): "item 0 is a int" would not say what was wrong.
                raise InvalidMessageError(
                    f"a batch must be an iterable of values or Messages, not one {type(items).__name__}: "
                    "append() stores one message"
                )
            if not isinstance(items, (list, tuple)):
                if not isinstance(items, Iterable):
                    raise InvalidMessageError(
                        f"a batch must be an iterable of values or Messages, not {type(items).__name__}"
                    )
                items = list(items)
        ts = time.time_ns()
        if not self._mutex.acquire(False):
            self._wait_for_mutex()
        try:
            self._begin()
            try:
                first = self._next_offset + len(self._pending_lengths)
                data, lengths, count = encode_batch(first, ts, items)
                if count:
                    self._add(data, lengths)
                    if durable:
                        self._must_sync = self._next_offset
            finally:
                durable_to = self._end()
        finally:
            self._mutex.release()
        if durable_to is not None:
            self._make_durable(durable_to)
        return first + count - 1 if count else None

    def append_encoded(self, data: bytes, *, new_segment: bool = False) -> int | None:
        """Append messages already encoded, as another journal holds them: ``data`` must be whole
        messages at dense offsets from ``next_offset`` (``CorruptionError`` otherwise, and
        nothing is stored). The bytes are written as they are, so a copy is byte-identical to its
        source. ``new_segment``: start a new segment with them (where the source journal started
        one), unless the current segment is still empty. Returns the last offset, or ``None``
        for no bytes."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidMessageError(f"encoded messages must be bytes, not {type(data).__name__}")
        if not self._mutex.acquire(False):
            self._wait_for_mutex()
        try:
            self._begin()
            try:
                first = self._next_offset + len(self._pending_lengths)
                sizes, used = frame_sizes(data, first)
                if used != len(data):
                    raise CorruptionError(
                        f"incomplete message: {len(data) - used} bytes after the last whole one",
                        position=used,
                        offset=first + len(sizes),
                    )
                if sizes:
                    self._write_pending()
                    if new_segment and self._seg_len:
                        try:
                            self._roll()
                        except OSError as exc:
                            # A roll that failed leaves no segment open: reopen the one there was.
                            self._take_back(self._segment, self._seg_len, first, [])
                            raise _append_failed(exc, len(sizes), self._segment.path, first) from exc
                    self._add(data, [size - OVERHEAD for size in sizes])
                    self._must_sync = self._next_offset
            finally:
                durable_to = self._end()
        finally:
            self._mutex.release()
        if durable_to is not None:
            self._make_durable(durable_to)
        return first + len(sizes) - 1 if sizes else None

    def hold(self) -> _Hold:
        """Keep the journal to this writer for several appends (and whatever the caller reads in
        between): a shared writer takes the lock and catches up once, and no other process
        appends until the block ends. Other threads of this process wait too."""
        return _Hold(self)

    def flush(self) -> None:
        """Hand buffered appends to the operating system (only ``buffer_size`` buffers)."""
        with self._mutex:
            self._check_usable()
            self._write_pending()

    def sync(self) -> None:
        """Flush, then force everything appended so far onto stable storage (with the entries
        of the segments and directories made since the last sync)."""
        with self._mutex:
            self._check_usable()
            self._write_pending()
            self._sync_or_raise()

    def close(self) -> None:
        """Flush, sync and close the files; release the lock. Closing twice is harmless."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
            try:
                if self._failed is None and self._fd >= 0:
                    self._write_pending()
                    self._release_reserved()
                    # An OSError, which the queue and the hub expect of a close. (Under ``none``,
                    # the data as sej does, but not the new entries: they cost a sync each, for
                    # a policy that promises nothing across a power cut.)
                    self._sync_now(entries=self.sync_policy.mode != "none")
            finally:
                self._close_files()
                self._close_dir()
                if not self.shared:
                    # Or shared writers waiting for each other would take this writer for alive.
                    self._lock.write_note("")
                self._lock.close()
        if self._flusher is not None:
            self._flusher.join()


    def __repr__(self) -> str:
        return f"Writer({str(self.path)!r}, next_offset={self._next_offset}, sync={str(self.sync_policy)!r})"

    # -- opening and recovery ---------------------------------------------------------------

    def _open_segment(self, segment: Segment, spare: tuple[Path, int] | None = None) -> None:
        """Make ``segment`` the one appended to, after checking and recovering its tail. The
        segment appended to so far is closed once this one is open: a failure (too many open
        files, say) leaves the writer on it, usable. ``spare``: (path, bytes reserved) of the
        spare file that becomes the segment, when it is not there yet (``spare_path``)."""
        created = not segment.path.exists()
        reserved = 0
        if spare is not None and created:
            try:
                # A link, not a rename: never over a segment that another writer made meanwhile.
                os.link(spare[0], segment.path)
                reserved = spare[1]
            except OSError:
                pass  # (no hard links here, say): made empty below, unreserved
            else:
                # At once: a spare's name left by a kill would keep the segment's blocks after a
                # gc deletes it (until the next writer to open the journal removes the name).
                with suppress(OSError):
                    spare[0].unlink()
        # Read too: a shared writer reads what the others appended through it (``_catch_up``).
        fd = open_segment(segment, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            if self.sync_policy.mode == "always":
                # Made here, or by a writer that may have been killed before it synced the entry
                # (appends synced to a segment that a power cut takes away would be lost).
                fsync_dir(segment.path.parent)
            elif created:
                self._unsynced_dirs.add(segment.path.parent)
            start_offset, start, kept = last_confirmed(segment, os.fstat(fd).st_size)
            scan = scan_segment(
                segment, start, start_offset, last_indexed=start, interval=self.index_interval
            )
            if not scan.clean:
                self.recoveries.append(cut_tail(self.path, segment, scan))
            index = IndexAppender(segment, kept + scan.entries)
            if not reserved:
                release(fd)  # what a writer that died had reserved (opened under the lock: see ``release``)
        except BaseException:
            os.close(fd)
            if created:
                # Left empty, it would stand for offsets that the next roll may store elsewhere.
                remove_segment(segment)
            raise
        if self._fd >= 0:
            # Leaving a segment for the next (a roll, or one another writer started early, as a
            # hub's copy does): no one appends to it again, and no later opening looks at it, so
            # what anyone reserved past its end is given back now or never. (Under the lock.)
            release(self._fd)
        self._close_files()
        self._index = index
        self._fd = fd
        self._segment = segment
        self._seg_len = scan.end
        self._next_offset = scan.next_offset
        self._reserved = reserved
        self._looked_at = -1

    def _take_shared_lock(self) -> None:
        take_shared_lock(self._lock)

    def _catch_up(self, take: Callable[[list[Message]], object] | None = None) -> bool:
        """Under the shared lock: take in what other writers appended since we last held it.
        With ``take`` (the ``backlog_taker``), more than ``BACKLOG_BYTES`` of it are handed to
        ``take`` out of the lock instead, and False returned: take the lock again and catch up
        (without ``take``) with what came meanwhile."""
        stat = os.fstat(self._fd)
        size = stat.st_size
        unlinked = stat.st_nlink == 0
        # Another writer may have given back the blocks this one reserved (closing, opening).
        # (``space.allocated``, inline: this runs on every shared append.)
        blocks = stat.st_blocks * 512
        if blocks < self._reserved:
            self._reserved = blocks
        if size - self._seg_len > BACKLOG_BYTES and take is not None and not unlinked and self._backlog_at < 0:
            # (One left unchecked, when the lock could not be taken again after it, is checked
            # below first: another read from its end would put its own check in its place.)
            self._read_backlog(take)
            return False
        self.caught_up = []
        self.segment_unlinked = unlinked
        backlog_at, index_due = self._backlog_at, self._backlog_index_due
        if backlog_at >= 0:
            self._backlog_at, self._backlog_index_due = -1, False
            data, self._backlog_data = self._backlog_data, b""
        if backlog_at >= 0 and (size < self._seg_len or os.pread(self._fd, len(data), backlog_at) != data):
            # The backlog handed out is not there byte for byte any more: read on from before it.
            # (Checked first: a segment deleted since can still be read through the descriptor,
            # and a backlog taken back before the deletion must still be reported lost.)
            self._seg_len, self._next_offset = backlog_at, self._backlog_offset
            self.backlog_lost = True
        if unlinked and (size != self._seg_len or backlog_at >= 0):
            # Others appended to a segment that gc (or compaction) has deleted since: what it
            # holds says nothing of the journal's end (as when this was read by path: ``held``
            # opens a writer at the end instead, and hands it ``backlog_lost``).
            raise FileNotFoundError(
                errno.ENOENT, "segment deleted under a shared writer", str(self._segment.path)
            )
        if size < self._seg_len:
            raise TruncatedError(
                f"segment shrank from {self._seg_len} to {size} bytes under a shared writer",
                file=self._segment.path,
            )
        if size > self._seg_len:
            scan = self._scan_appended()
            self.caught_up = scan.messages or []
            if not scan.clean:
                self.recoveries.append(cut_tail(self.path, self._segment, scan))
                self._reserved = min(self._reserved, scan.end)  # the cut gave back what was past it
            self._seg_len = scan.end
            self._next_offset = scan.next_offset
            index_due = index_due or bool(scan.entries)
        if index_due:
            # The others added index entries, where this writer would have (read them: they
            # may index otherwise). With none due, they added none that matter: an entry of
            # ours a little early only makes the index a little denser.
            assert self._index is not None
            self._index.last_position = max(self._index.last_position, last_position(self._segment))
        # Another writer may have started a new segment, even with this one unchanged (a hub's
        # copy starts one where its source did): it is named by the offset now due.
        # This runs on every shared append: ``access`` relative to the directory's descriptor
        # (pathlib, ``stat`` raising FileNotFoundError, or even resolving the whole path cost
        # several times as much). Only a segment found there is looked for at the path too,
        # which is where it is opened: if the directory was moved away (a queue deleted) or
        # another put in its place, a segment of that other directory is never taken for ours.
        # With ``rolls_only``, only a writer that appended to this segment can have started the
        # next: one found as this writer left it (its own append, or its last look) has none.
        segment = self._segment
        if not (self._rolls_only and size == self._looked_at == self._seg_len and backlog_at < 0):
            while self._next_offset != self._segment.base:
                name = segment_name(self._next_offset)
                if not (
                    os.access(name, os.F_OK, dir_fd=self._dir_fd)
                    and os.access(self._jnl_prefix + name, os.F_OK)
                ):
                    break
                self._open_segment(segment_at(self.path, self._next_offset))
            self._looked_at = self._seg_len
        if unlinked and self._segment is segment:
            # Deleted, and no segment begins where it ends: the one that did was collected too
            # (the newest never is), or the whole journal was deleted. Appended to, it would
            # lose what it was given: ``held`` opens a writer at the end instead (or its check
            # says the journal is gone).
            raise FileNotFoundError(
                errno.ENOENT, "segment and the next deleted under a shared writer", str(segment.path)
            )
        return True

    # -- appending --------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise Error(f"writer of {self.path} is closed")
        if self._failed is not None:
            raise JournalError(
                f"writer of {self.path} failed earlier ({self._failed}); open a new writer to recover"
            )

    def _wait_for_mutex(self) -> None:
        """The writer's mutex, which another thread holds: wait for it, or in a
        ``DeferredSyncs(wait=False)`` block that took no hold yet, raise ``BusyError``."""
        if _deferring.refusing:
            raise BusyError("another thread of this process holds the journal", file=self.path)
        self._mutex.acquire()

    def _begin(self) -> None:
        """Begin an operation (an append, a hold), the writer's mutex held: a shared writer
        takes the lock and catches up. In a ``DeferredSyncs(wait=False)`` block, the lock that
        another process holds is ``BusyError`` (see ``take_shared_lock``) until the block's first
        hold is taken: its later ones may be part of a change begun, and wait."""
        if self._closed or self._failed is not None:  # (inline: every append and hold begins here)
            self._check_usable()
        if not self._held:
            if self.shared:
                self._take_shared_lock()
                try:
                    if not self._catch_up(self.backlog_taker):
                        _deferring.refusing = False  # (the backlog is taken in: no refusal now)
                        self._take_shared_lock()  # after a backlog taken in out of it: once
                        self._catch_up(None)
                except BaseException as exc:
                    self._lock.release()
                    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
                        # Reading the others' appends, opening a segment one of them started: the
                        # storage's failure, as an append's is (others, EMFILE say, stay as they are).
                        file = Path(exc.filename) if isinstance(exc.filename, str) else self._segment.path
                        raise _catch_up_failed(exc, file, self._next_offset) from exc
                    raise
            if _deferring.refusing:
                _deferring.refusing = False

    def _read_backlog(self, take: Callable[[list[Message]], object]) -> None:
        """Let the lock go, read the whole messages the others appended and give them to
        ``take``. (A message still being written, or torn, is not read: the catch-up cuts it,
        if its writer died.)"""
        self._lock.release()
        scan = self._scan_appended()
        if scan.messages:
            self._backlog_at, self._backlog_offset, self._backlog_data = self._seg_len, self._next_offset, scan.data
            self._backlog_index_due = bool(scan.entries)
            self._seg_len, self._next_offset = scan.end, scan.next_offset
            try:
                take(scan.messages)
            except BaseException:
                # The taker may have taken in some of them, not all (a damaged event, a
                # MemoryError): it rebuilds what it made of them, and the writer reads them
                # again, as if never handed out (the next hold checks nothing it did not read).
                self._seg_len, self._next_offset = self._backlog_at, self._backlog_offset
                self._backlog_at, self._backlog_data, self._backlog_index_due = -1, b"", False
                self.backlog_lost = True
                raise

    def _scan_appended(self) -> SegmentScan:
        """What the others appended to the segment after this writer's end, read through its
        descriptor, messages and bytes kept."""
        assert self._index is not None
        return scan_segment(
            self._segment,
            self._seg_len,
            self._next_offset,
            last_indexed=self._index.last_position,
            interval=self.index_interval,
            fd=self._fd,
            keep=True,
        )

    def _end(self) -> int | None:
        """Finish an operation. Returns the offset that must be durable before the outermost
        operation returns (under ``sync="always"``), or None."""
        if self._held:
            return None
        if self.shared:
            self._lock.release()
        if self.sync_policy.mode == "always" and self._must_sync > self._durable_offset:
            deferred = _deferring.syncs
            if deferred is not None:
                deferred.due[self] = self._next_offset
                return None
            return self._next_offset
        return None

    def _add(self, data: bytes, lengths: list[int]) -> None:
        if not self.buffer_size:
            self._write(data, lengths)
            return
        self._pending.append(data)
        self._pending_lengths.extend(lengths)
        self._pending_bytes += len(data)
        if self._pending_bytes >= self.buffer_size:
            self._write_pending()

    def _write_pending(self) -> None:
        if self._pending:
            data, lengths = b"".join(self._pending), self._pending_lengths
            self._pending, self._pending_lengths, self._pending_bytes = [], [], 0
            self._write(data, lengths)

    def _write(self, data: bytes, lengths: list[int]) -> None:
        """Write encoded messages at ``self._next_offset``, rolling segments where sej would.

        All or nothing: on an I/O error (a full disk, say) every byte of the batch is taken back
        before the error is raised.
        """
        first_offset = self._next_offset
        start_segment, start_len = self._segment, self._seg_len
        created: list[Segment] = []
        count = len(lengths)
        end_len = start_len + len(data)
        assert self._index is not None
        if end_len < self.segment_size and end_len <= self._index.last_position + self.index_interval:
            # The common case, small appends (a queue's events): no roll, and no message starts
            # where an index entry is due (see ``choose_entries``), so one write is all.
            try:
                if end_len > self._reserved:
                    self._reserve(end_len)
                _write_all(self._fd, data)
                self._seg_len = self._looked_at = end_len
                self._next_offset = first_offset + count
                self._synced_after(count)
                return
            except OSError as exc:
                self._take_back(start_segment, start_len, first_offset, created)
                raise _append_failed(exc, count, self._segment.path, first_offset) from exc
        # starts[i] is where message i begins, counted from the current segment's start.
        starts = list(accumulate(map(OVERHEAD.__add__, lengths), initial=self._seg_len))
        pieces = split_at_rolls(starts, self.segment_size)
        view = memoryview(data)
        spares: dict[int, tuple[Path, int]] = {}
        try:
            spares = self._spares_for(pieces, starts, first_offset)
            for done, end, shift in pieces:
                piece = view[starts[done] - starts[0] : starts[end] - starts[0]]
                if starts[end] - shift > self._reserved:
                    self._reserve(starts[end] - shift)
                _write_all(self._fd, piece)
                assert self._index is not None
                entries, _ = choose_entries(
                    first_offset + done,
                    starts[done : end + 1],
                    self._index.last_position + shift,
                    self.index_interval,
                )
                self._index.add([(offset, position - shift) for offset, position in entries])
                self._seg_len = starts[end] - shift
                self._next_offset = first_offset + end
                if self._seg_len >= self.segment_size:
                    self._roll(spares.get(self._next_offset))
                    created.append(self._segment)
            self._looked_at = self._seg_len
            self._synced_after(count)
        except (OSError, JournalError) as exc:
            # A JournalError: the next segment cannot be opened (a directory has its name).
            self._take_back(start_segment, start_len, first_offset, created)
            if isinstance(exc, JournalError):
                raise
            raise _append_failed(exc, count, self._segment.path, first_offset) from exc
        finally:
            _discard(spares)  # those not linked into place (the append failed)

    def _spares_for(
        self, pieces: list[tuple[int, int, int]], starts: list[int], first_offset: int
    ) -> dict[int, tuple[Path, int]]:
        """Before a batch that rolls writes anything: reserve the room of the segments it will
        start, in spare files (``spare_path``), so that a full disk fails it now. By base
        offset, (path, bytes reserved). Where nothing can be reserved, only a check that the
        file system has the room (``_room_for_rolls``)."""
        spares: dict[int, tuple[Path, int]] = {}
        try:
            for done, end, shift in pieces[1:]:
                if not self._reserving:
                    break
                size = starts[end] - shift
                path = spare_path(segment_at(self.path, first_offset + done))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                spares[first_offset + done] = (path, size)
                try:
                    self._reserving = reserve(fd, 0, size)
                finally:
                    os.close(fd)
            if self._reserving:
                return spares
        except BaseException:
            _discard(spares)
            raise
        _discard(spares)
        self._room_for_rolls(starts)
        return {}

    def _room_for_rolls(self, starts: list[int]) -> None:
        """Where nothing can be reserved, before a batch that rolls writes anything: raise
        ``ENOSPC`` if the file system has no room for what goes past the current segment. (A
        check, not a reservation: another writer may take the room in between, and then a full
        disk takes back the first part, which readers may have read.)"""
        first_roll = bisect_left(starts, self.segment_size, 1)
        beyond = starts[-1] - starts[min(first_roll, len(starts) - 1)]
        if beyond <= 0:
            return
        stat = os.statvfs(self._segment.path.parent)
        # Root's writes may take the room the file system keeps for it (as its reservations do).
        free = stat.f_bfree if os.geteuid() == 0 else stat.f_bavail
        if free * stat.f_frsize < beyond:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _reserve(self, end: int) -> None:
        """Allocate the segment's blocks up to position ``end``, and some beyond it, before a
        write there: a full disk then fails the append before any of it is written, and no
        reader can read messages that the failure would take back. The room ahead is not asked
        of a disk too full for it, only what the write needs."""
        if not self._reserving:
            return
        start = max(self._reserved, self._seg_len)
        lowest, highest = RESERVE_AHEAD
        target = max(end, min(end + min(max(end, lowest), highest), self.segment_size))
        try:
            reserved = reserve(self._fd, start, target - start)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or target == end:
                raise
            target = end
            reserved = reserve(self._fd, start, target - start)
        if reserved:
            self._reserved = target
        else:
            self._reserving = False

    def _release_reserved(self) -> None:
        """Give back the blocks reserved past the segment's end, when leaving it open no more.
        A shared writer does it only if it can take the lock at once: another process appending
        still uses them (and gives them back when it closes)."""
        if self._reserved <= self._seg_len:
            return
        if not self.shared or self._held:
            release(self._fd)
            return
        try:
            if os.fstat(self._fd).st_nlink == 0 or not self._lock.try_acquire(wait=False):
                return  # deleted (its blocks go with it), or in use
        except OSError:
            return  # the journal's directory is gone, deleted with its queue: so are its blocks
        try:
            release(self._fd)
        finally:
            self._lock.release()

    def _roll(self, spare: tuple[Path, int] | None = None) -> None:
        """Close the full segment (synced, as sej does) and start the next one (from ``spare``,
        as ``_open_segment`` takes it)."""
        self._sync_segment()
        self._unsynced = 0
        self._mark_durable(self._next_offset)
        self._open_segment(segment_at(self.path, self._next_offset), spare)

    def _take_back(self, segment: Segment, length: int, next_offset: int, created: list[Segment]) -> None:
        """Undo a failed batch: remove segments it started and cut the first back to ``length``."""
        try:
            self._close_files()
            for extra in created:
                remove_segment(extra)
            os.truncate(segment.path, length)
            self._open_segment(segment)
        except OSError as exc:
            # The journal cannot be put back from here; a new writer's recovery will cut the rest.
            self._failed = exc
        if self._failed is None and self._next_offset != next_offset:
            self._failed = JournalError("journal changed while taking back a failed append", file=segment.path)

    # -- syncing ----------------------------------------------------------------------------

    def _synced_after(self, count: int) -> None:
        """Count an append against the sync policy. (``always`` syncs after the operation, out of
        the lock: see ``_make_durable``.)"""
        policy = self.sync_policy
        if policy.mode == "group":
            if not self._unsynced:
                self._unsynced_since = time.monotonic()
                self._wake.notify()
            self._unsynced += count
            if policy.max_messages is not None and self._unsynced >= policy.max_messages:
                self._sync_now()

    def _sync_segment(self) -> None:
        """Sync the segment appended to. A failure fails the writer for good, as in
        ``_make_durable``: the kernel may have dropped the data, and a later sync not say so."""
        try:
            fdatasync(self._fd)
        except OSError as exc:
            self._failed = exc
            raise

    def _sync_or_raise(self) -> None:
        """``_sync_now`` for the caller of ``sync``: its failure as a StorageError."""
        try:
            self._sync_now()
        except OSError as exc:
            raise _sync_failed(exc, self._segment.path) from exc

    def _sync_now(self, entries: bool = True) -> None:
        if self._fd >= 0:
            self._sync_segment()
        while entries and self._unsynced_dirs:
            directory = next(iter(self._unsynced_dirs))
            try:
                fsync_dir(directory)  # kept in the set if it fails: the next sync tries again
            except FileNotFoundError:
                pass  # deleted (with its journal, by another process): no entry left to keep
            self._unsynced_dirs.discard(directory)
        self._unsynced = 0
        self._mark_durable(self._next_offset)

    def _mark_durable(self, offset: int) -> None:
        with self._sync_done:
            if offset > self._durable_offset:
                self._durable_offset = offset
                self._sync_done.notify_all()

    def _make_durable(self, target: int) -> None:
        """Return once every offset below ``target`` is on stable storage: group commit.

        Called outside the writer's mutex, so that while one thread syncs, others append; the
        first thread to find no sync under way syncs everything written so far, and the others
        wait for it instead of syncing themselves. A failed sync fails the writer for good: after
        a failed fsync, the kernel may have dropped the data and a second fsync may not say so.

        (Runs once per durable operation under ``sync="always"``: the condition's lock is taken
        directly and ``notify_all`` called only for waiters, and the segment's descriptor is
        synced as it is, kept open by ``_close_files`` while the sync uses it, not duplicated.)
        """
        with self._sync_lock:
            while self._durable_offset < target:
                if self._failed is not None:
                    raise StorageError(f"sync failed earlier: {self._failed}", file=self._segment.path)
                if not self._syncing:
                    self._syncing = True
                    break
                self._sync_waiters += 1
                try:
                    self._sync_done.wait()
                finally:
                    self._sync_waiters -= 1
            else:
                return
        error: OSError | None = None
        upto = 0
        try:
            with self._mutex:
                upto = self._next_offset
                fd = self._sync_fd = self._fd
            try:
                fdatasync(fd)
            finally:
                with self._mutex:
                    self._sync_fd = -1
                    if self._sync_fd_closed:  # the segment was closed (a roll) while this synced it
                        self._sync_fd_closed = False
                        os.close(fd)
        except OSError as exc:
            error = exc
        with self._sync_lock:
            self._syncing = False
            if error is None:
                if upto > self._durable_offset:
                    self._durable_offset = upto
            else:
                self._failed = error
            if self._sync_waiters:
                self._sync_done.notify_all()
        if error is not None:
            raise _sync_failed(error, self._segment.path) from error

    def _flush_loop(self) -> None:
        """Group sync's timer: sync data left unsynced for the policy's interval."""
        interval = (self.sync_policy.interval_ms or 0) / 1000
        with self._mutex:
            while not self._closed:
                if not self._unsynced:
                    self._wake.wait()
                    continue
                due = self._unsynced_since + interval - time.monotonic()
                if due > 0:
                    self._wake.wait(due)
                    continue
                try:
                    self._sync_now()
                except OSError as exc:
                    self._failed = exc
                    return

    def _close_dir(self) -> None:
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def _close_files(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._fd >= 0:
            if self._fd == self._sync_fd:
                self._sync_fd_closed = True  # ``_make_durable`` is syncing it: it closes it after
            else:
                os.close(self._fd)
            self._fd = -1


class _Deferring(threading.local):
    syncs: DeferredSyncs | None = None
    refusing = False  # in a ``DeferredSyncs(wait=False)`` block that took no hold yet


_deferring = _Deferring()  # the ``DeferredSyncs`` block this thread is in, if any


def refuse_to_wait(what: str, file: Path) -> None:
    """In a ``DeferredSyncs(wait=False)`` block that took no hold yet, ``BusyError``: the caller
    is about to do ``what`` (open a journal, replay a state), which may take long, and an event
    loop must not stop for it (it runs the call again in a thread). Elsewhere, nothing."""
    if _deferring.refusing:
        raise BusyError(f"{what} could take long: not done on an event loop", file=file)


class DeferredSyncs:
    """``with DeferredSyncs() as syncs:`` the durable appends of any writer under ``sync="always"``
    made in the block, by this thread, return once written, not synced; ``syncs.sync()`` (in any
    thread, after the block) returns once they are all on stable storage, or raises. For an event
    loop that appends itself (a write is tens of µs) and then syncs, itself or in a thread when
    the disk is slow: each system call of a thread's append lets the GIL go to the loop and waits
    to get it back.

    The caller must not count such an append as stored before ``sync()`` returns. (The writer's
    own group commit still applies: a sync under way covers what it finds written.)

    ``wait=False``: the block's first hold of a writer (an append, a ``hold()``; or the opening
    of a shared writer) that another thread or process holds raises ``BusyError`` at once,
    before anything was done, instead of waiting (as does a step that would take long before
    it, such as the replay of a channel's state: ``refuse_to_wait``): an event loop must not
    stop for another process's compaction (hundreds of ms at a deep backlog) or a thread's
    collection; it runs the call again in a thread. Later holds in the block wait as usual:
    the call may have changed something by then."""

    __slots__ = ("due", "wait")

    def __init__(self, *, wait: bool = True) -> None:
        self.due: dict[Writer, int] = {}  # writer -> the offset below which it must be durable
        self.wait = wait

    def __enter__(self) -> DeferredSyncs:
        if _deferring.syncs is not None:
            raise InvalidArgumentError("DeferredSyncs blocks do not nest: the outer one's sync would miss the inner's")
        _deferring.syncs = self
        _deferring.refusing = not self.wait
        return self

    def __exit__(self, *exc_info: object) -> None:
        _deferring.syncs = None
        _deferring.refusing = False

    def __bool__(self) -> bool:
        return bool(self.due)

    def sync(self) -> None:
        """Make what the block appended durable (``StorageError`` if a sync fails)."""
        while self.due:
            writer, target = self.due.popitem()
            writer._make_durable(target)


class _Hold:
    """``Writer.hold()``'s context manager (a class: a queue takes it for every operation, and a
    generator-based one costs several times as much)."""

    __slots__ = ("_writer",)

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def __enter__(self) -> None:
        writer = self._writer
        if not writer._mutex.acquire(False):
            writer._wait_for_mutex()
        try:
            writer._begin()
        except BaseException:
            writer._mutex.release()
            raise
        writer._held += 1

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        writer = self._writer
        try:
            writer._held -= 1
            durable_to = writer._end()
        finally:
            writer._mutex.release()
        if durable_to is not None and exc_type is None:  # a failed block: the error, not a sync
            writer._make_durable(durable_to)


class held(_Hold):
    """``with held(writer, reopen, check) as w``: ``writer.hold()``, giving the writer held. A
    shared writer cannot catch up once another process's gc (or compaction) deleted the segment it
    was on: then the writer is closed and ``reopen()`` gives one at the journal's end to hold
    instead. When the catch-up found the writer's segment deleted, ``check()`` (if given) is
    called with the writer held, to refuse the hold by raising: the whole journal may have been
    deleted, and appends to its files would be lost. (``_Hold`` itself: a channel takes it for
    every operation, and the check costs nothing while the segment is there.)

    Several threads may share the writer: one's hold may find it closed by another's reopen, and
    several may ask ``reopen()`` in place of the same writer. So ``reopen()`` gives the owner's
    current writer when it is open (another thread made it), makes one (under a lock) only
    otherwise: one writer per journal per process, or their mutexes would not keep those threads
    apart. It gives the closed writer back when none takes its place (its owner was closed): the
    hold then raises the writer's "closed" error."""

    __slots__ = ("_reopen", "_check")

    def __init__(self, writer: Writer, reopen: Callable[[], Writer], check: Callable[[], None] | None = None) -> None:
        self._writer = writer
        self._reopen = reopen
        self._check = check

    def __enter__(self) -> Writer:  # type: ignore[override]
        # Until a hold succeeds: the writer ``reopen()`` gives takes the lock again only here,
        # and another process may have collected its segment too in between.
        while True:
            try:
                _Hold.__enter__(self)
                break
            except FileNotFoundError:
                if self._check is not None:
                    self._check()  # its error, when the whole journal is gone, says why
                writer = self._writer
                segments = list_segments(writer.path)
                if not segments or writer.segment in segments:
                    raise  # not a collected segment: the journal itself is gone, or something else
                writer.close()
                self._writer = self._reopen()
                if writer.backlog_lost:  # the taker must still rebuild: the new writer tells it
                    self._writer.backlog_lost = True
            except Error:
                writer = self._writer
                if not writer.closed:
                    raise
                # Closed after this hold was made with it: by another thread's reopen, most likely.
                reopened = self._reopen()
                if reopened is writer:
                    raise  # closed by its owner: none takes its place
                self._writer = reopened
        writer = self._writer
        if writer.segment_unlinked and self._check is not None:
            try:
                self._check()
            except BaseException as exc:
                _Hold.__exit__(self, type(exc), exc, exc.__traceback__)  # let go, writing nothing
                raise
        return writer


def take_shared_lock(lock: FileLock) -> None:
    """Take a journal's lock as a shared writer does: wait while other shared writers hold it
    (each for one append), but refuse with ``LockedError``, at once, while an exclusive writer
    that still runs holds it (for its lifetime: the wait could last for ever). In a
    ``DeferredSyncs(wait=False)`` block that took no hold yet: ``BusyError`` rather than wait."""
    if lock.try_acquire(wait=False):
        return
    note = lock.read_note()
    exclusive = held_for_life(note)
    stale = exclusive and not _note_alive(note)
    if exclusive and not stale:
        raise LockedError(
            f"an exclusive writer holds the journal; shared writers cannot join it ({note})", file=lock.path
        )
    if _deferring.refusing:
        raise BusyError("another process holds the journal's lock", file=lock.path)
    lock.acquire(wait=True)  # (a stale note, an exclusive writer's that was killed: cleared by taking it)


def held_for_life(note: str) -> bool:
    """Whether a lock's note is an exclusive writer's, which holds the lock for its lifetime."""
    return note.startswith(_EXCLUSIVE_NOTE)


def _note_alive(note: str) -> bool:
    """Whether the process that an exclusive writer's note names ("..., pid N") still runs on
    this machine (when the note names none, or another user's process: taken for alive)."""
    pid = note.rpartition("pid ")[2]
    return not pid.isdigit() or process_alive(int(pid))


def _sync_failed(exc: OSError, file: Path) -> StorageError:
    return StorageError(
        f"could not sync: {exc.strerror or exc}; the last appends may not be stored", errno=exc.errno, file=file
    )


def _open_failed(exc: OSError, file: Path) -> StorageError:
    return StorageError(
        f"could not open the journal for appending (checking its last segment): {exc.strerror or exc}",
        errno=exc.errno,
        file=file,
    )


def _catch_up_failed(exc: OSError, file: Path, offset: int) -> StorageError:
    return StorageError(
        f"could not read what the other writers appended: {exc.strerror or exc}; nothing was appended",
        errno=exc.errno,
        file=file,
        offset=offset,
    )


def _append_failed(exc: OSError, count: int, file: Path, offset: int) -> StorageError:
    return StorageError(
        f"could not append {count} message(s): {exc.strerror or exc}; nothing of them was stored",
        errno=exc.errno,
        file=file,
        offset=offset,
    )


def _discard(spares: dict[int, tuple[Path, int]]) -> None:
    for path, _ in spares.values():
        with suppress(FileNotFoundError):
            path.unlink()


def split_at_rolls(starts: list[int], segment_size: int) -> list[tuple[int, int, int]]:
    """How a batch is written when message ``i`` begins at ``starts[i]`` (counted from the
    current segment's start; the last item is where the batch ends): (first message, end, shift)
    of each piece written to one segment, ``shift`` being where that segment begins in the same
    count. The first message that ends at or past ``segment_size`` closes its segment, as sej
    rolls, and the next piece (if any) starts a new one."""
    count = len(starts) - 1
    pieces = []
    done = shift = 0
    while done < count:
        end = min(bisect_left(starts, segment_size + shift, done + 1, count + 1), count)
        pieces.append((done, end, shift))
        if starts[end] - shift >= segment_size:
            shift = starts[end]
        done = end
    return pieces


def _write_all(fd: int, data: bytes | memoryview) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return  # (nearly always: a view, and a loop, only for the rest of a short write)
    view = memoryview(data)[written:]
    while view:
        view = view[os.write(fd, view) :]
