"""The sharded scanner: reads every shard of a root, and follows appends to all of them.

Each shard is read by a ``journalq.journal.Scanner`` of its own, from an offset per shard; the
sharded scanner hands out their batches **round robin**: it goes through the shards in name order,
and each turn takes the next batch (up to one decoded chunk, a few thousand messages) of the next
shard that has messages now, so a busy shard cannot starve the others. Within a shard messages
come in offset order; across shards there is no order to keep (offsets count per shard, and sej's
timestamps need not even rise within one), so none is made up, when following or not.

Following, one ``DirectoryWatch`` covers every shard's ``jnl/`` and the root itself, so that a
shard that appears later (a writer's first message for it) is found and read from its start.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from journalq.closing import Closing, make_room_for_shards
from journalq.errors import Error, InvalidArgumentError, OffsetOutOfRangeError
from journalq.journal.codec import Message
from journalq.journal.scanner import Scanner, check_batch_size, check_timeout
from journalq.journal.segment import journal_dir
from journalq.journal.watch import DirectoryWatch
from journalq.shard.layout import ShardLayout, ShardLayoutError, check_prefix, parse_shard_dir, read_layout

__all__ = ["ShardedScanner"]

DEFAULT_BATCH = 65536
# While messages keep coming (so the scanner never waits, and so never looks at the root then),
# the root is still listed this often for new shards.
_RESCAN_BUSY = 0.1


class ShardedScanner(Closing):
    """Iterates ``(shard_name, Message)`` over the shards of the root ``root``.

    ``offsets`` maps shard directory names to the offset of the next message to read in that
    shard; a shard it leaves out is read from its oldest stored message. Give the ``offsets``
    property of an earlier scanner to resume where it stopped. ``prefix`` picks the shards of one
    prefix; without it the root must hold shards of one prefix and shard bit only, or be a
    journal itself (shard bit 0, named ``""``); otherwise ``ShardLayoutError`` names what it holds.

    Without ``follow`` the iteration ends once every shard is read to its current end. With
    ``follow=True`` (or a ``timeout``) it waits for appends to any shard and for new shards, and
    ends once ``timeout`` seconds pass with no new message (never, when ``timeout`` is None).
    Iterating again after an end resumes where the scanner stopped, and reads the shards made
    since too.

    Order: round robin over the shards in name order, a batch at a time (see the module's doc).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        offsets: Mapping[str, int] | None = None,
        *,
        prefix: str | None = None,
        follow: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.root = Path(root)
        if prefix is not None:
            check_prefix(prefix)
        self.prefix = prefix
        self.timeout = check_timeout(timeout)
        self.follow = follow or timeout is not None
        if offsets is not None and not isinstance(offsets, Mapping):
            raise InvalidArgumentError(
                f"offsets must map shard names to offsets (a dict), not {type(offsets).__name__}"
            )
        self._layout: ShardLayout = read_layout(self.root, prefix)
        make_room_for_shards(len(self._layout.shards))
        wanted: dict[str, int] = {}
        for name, offset in (offsets or {}).items():
            parse_shard_dir(name, self._layout, prefix)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgumentError(f"the offset of shard {name!r} must be an integer >= 0, not {offset!r}")
            if offset and name not in self._layout.shards:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is given for shard {name!r}, which is not in the root", file=self.root
                )
            wanted[name] = offset
        self._wanted = wanted  # offsets of the shards not opened yet
        self._scanners: dict[str, Scanner] = {}
        self._order: list[str] = []  # names of the opened shards, sorted
        self._cursor = 0  # the shard whose turn is next
        self._batch: list[Message] = []  # a batch being iterated, from shard _batch_name
        self._batch_name = ""
        self._i = 0
        self._watch: DirectoryWatch | None = None
        self._watched: tuple[Path, ...] = ()
        self._has_jnl: set[str] = set()
        self._rescanned = time.monotonic()
        self._closed = False
        try:
            self._open_new(self._layout)
        except BaseException:
            self.close()
            raise

    # -- public interface -------------------------------------------------------------------

    @property
    def offsets(self) -> dict[str, int]:
        """The offset of the next message to read in each shard, by shard name in name order:
        what to give a later scanner to resume exactly here (for checkpoints)."""
        out = dict(self._wanted)
        for name, scanner in self._scanners.items():
            out[name] = scanner.offset
        left = len(self._batch) - self._i
        if left > 0:
            out[self._batch_name] -= left
        return dict(sorted(out.items()))

    @property
    def shards(self) -> list[str]:
        """The names of the shards being read, in name order (growing as new shards appear)."""
        return list(self._order)

    @property
    def layout(self) -> ShardLayout:
        """What the root held when it was last listed."""
        return self._layout

    def __iter__(self) -> Iterator[tuple[str, Message]]:
        while True:
            batch, i, name = self._batch, self._i, self._batch_name
            n = len(batch)
            while i < n:
                message = batch[i]
                i += 1
                self._i = i
                yield name, message
                # ``read_batch`` may have taken what came next meanwhile: go on after it.
                if self._batch is not batch:
                    break  # the whole batch, and more
                i = self._i
            got = self._next_batch(DEFAULT_BATCH)
            if got is None:
                self._batch, self._i = [], 0
                return
            self._batch_name, self._batch = got
            self._i = 0

    def read_batch(self, max_messages: int = DEFAULT_BATCH) -> tuple[str, list[Message]] | None:
        """The next batch of one shard: ``(shard_name, messages)``, up to ``max_messages``, waiting
        (as the iteration does) when no shard has any; None at the end (or the timeout)."""
        check_batch_size(max_messages)
        self._check_open()
        if self._i < len(self._batch):  # the rest of a batch that an iteration started
            out = self._batch[self._i : self._i + max_messages]
            self._i += len(out)
            return self._batch_name, out
        return self._next_batch(max_messages)

    def close(self) -> None:
        """Close the shards' scanners and the watch; ``offsets`` still says where it stopped.
        Closing twice is harmless; reading after it is an ``Error``."""
        self._closed = True
        for scanner in self._scanners.values():
            scanner.close()
        if self._watch is not None:
            self._watch.close()
            self._watch = None


    def __repr__(self) -> str:
        return f"ShardedScanner({str(self.root)!r}, shards={self._order}, follow={self.follow})"

    # -- reading ----------------------------------------------------------------------------

    def _poll(self, max_messages: int) -> tuple[str, list[Message]] | None:
        """The next batch of the next shard, in turn, that has messages now."""
        order, n = self._order, len(self._order)
        for k in range(n):
            j = (self._cursor + k) % n
            name = order[j]
            batch = self._scanners[name].read_batch(max_messages)
            if batch:
                self._cursor = (j + 1) % n
                return name, batch
        return None

    def _check_open(self) -> None:
        # Its own batch, read ahead of the caller, is here, not in a shard's (closed) scanner.
        if self._closed:
            raise Error(f"sharded scanner of {self.root} is closed")

    def _next_batch(self, max_messages: int) -> tuple[str, list[Message]] | None:
        self._check_open()
        self._batch, self._i = [], 0
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            if self.follow and time.monotonic() - self._rescanned >= _RESCAN_BUSY:
                self._rescan()
            got = self._poll(max_messages)
            if got is not None:
                if self._watch is not None:
                    self._watch.changed()
                return got
            if not self.follow:
                # The end, unless a shard was made since the root was last listed (iterating
                # again reads what came since, there too).
                if self._relist():
                    continue
                return None
            # Nothing anywhere: look for new shards (and new jnl/ directories to watch), then
            # wait. The watch is made before the last look, so nothing written after it is missed.
            if self._rescan() or self._watch is None:
                self._rewatch()
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            if not self._watch.wait(remaining) and deadline is not None and time.monotonic() >= deadline:
                return None

    # -- shards that appear -----------------------------------------------------------------

    def _open_new(self, layout: ShardLayout) -> bool:
        """Open a scanner for each shard of ``layout`` not opened yet; True if there was one."""
        new = [name for name in layout.shards if name not in self._scanners]
        for name in new:
            self._scanners[name] = Scanner(layout.shards[name], self._wanted.pop(name, None))
        if new:
            self._order = sorted(self._scanners)
        return bool(new)

    def _rescan(self) -> bool:
        """List the root again: open new shards; True when a shard or a jnl/ directory is new
        (the watch must then cover it)."""
        changed = self._relist()
        return self._watch_targets() != self._watched or changed

    def _relist(self) -> bool:
        """List the root again and open the shards that are new; True if there was one."""
        self._rescanned = time.monotonic()
        layout = read_layout(self.root, self.prefix)
        old = self._layout
        if old.bit is not None and (layout.prefix, layout.bit) != (old.prefix, old.bit) and layout.shards:
            raise ShardLayoutError(
                f"the root's shards changed from prefix {old.prefix!r}, shard bit {old.bit} "
                f"to prefix {layout.prefix!r}, shard bit {layout.bit}",
                file=self.root,
            )
        if layout.bit is not None:
            self._layout = layout
        return self._open_new(layout)

    def _watch_targets(self) -> tuple[Path, ...]:
        """What the watch must cover: the root, and each shard's jnl/ (or the shard directory,
        until its jnl/ exists)."""
        targets = [self.root]
        for name in self._order:
            path = self._scanners[name].path
            if name not in self._has_jnl and journal_dir(path).is_dir():
                self._has_jnl.add(name)
            target = journal_dir(path) if name in self._has_jnl else path
            if target not in targets:
                targets.append(target)
        return tuple(targets)

    def _rewatch(self) -> None:
        """Watch what ``_watch_targets`` gives, with a new watch (a watch cannot grow)."""
        old = self._watch
        targets = self._watch_targets()
        self._watch = DirectoryWatch(*targets)
        self._watched = targets
        if old is not None:
            # Closing an inotify instance waits for the kernel (about 5 to 15 ms here): let a
            # thread wait, rather than hold up the first messages of the shard just found.
            threading.Thread(target=old.close, name="journalq-unwatch", daemon=True).start()
