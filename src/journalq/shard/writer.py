"""The sharded writer: each message goes to the journal of its key's shard, sej's ``shard.Writer``.

``ShardedWriter(root, "events", 2)`` writes to up to four journals, ``ROOT/events.2.000`` to
``ROOT/events.2.003``, each an ordinary journal with its own offsets (written by a
``journalq.journal.Writer``). A shard's writer, and with it its directory, is made when the first
message for that shard comes, as sej does: a root only has the shards that got messages (a message
refused makes none).

The shard of a message is ``hash(key, bit)``; the default, ``shard_of``, is sej's: the low ``bit``
bits of the key's CRC-32 (IEEE), so that what this writes, sej's ``shard.Writer`` writes too,
byte for byte. Shard bit 0 means no sharding: one journal, ``ROOT/prefix`` (the root itself when
the prefix is empty).
"""

from __future__ import annotations

import builtins
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from itertools import count, repeat
from pathlib import Path

from journalq.closing import Closing, make_room_for_shards
from journalq.errors import Error, InvalidArgumentError, InvalidMessageError, JournalError
from journalq.journal.codec import MAX_KEY_SIZE, Message, encode_batch
from journalq.journal.segment import check_integer
from journalq.journal.sync import SyncPolicy
from journalq.journal.writer import DEFAULT_SEGMENT_SIZE, Writer
from journalq.shard.layout import ShardLayoutError, check_bit, check_prefix, read_layout, shard_dir_name
from journalq.shard.naming import ShardNameError, shard_of

__all__ = ["HashFunc", "ShardedWriter"]

HashFunc = Callable[[bytes, int], int]
"""``hash(key, bit)``: the index of the shard (``0 <= index < 2**bit``) that a key goes to."""


class ShardedWriter(Closing):
    """Appends messages to the shards of the root ``root``, each to the shard of its key.

    ``prefix`` and ``bit`` name the shards (``[prefix].[bit].[index]``; 0 to 10 bits, 0 for one
    unsharded journal); ``hash(key, bit)`` picks a key's shard (default: sej's, ``shard_of``).
    ``segment_size``, ``sync`` and ``shared`` are given to each shard's ``Writer`` (see there):
    with ``shared=True`` several processes may append to the same shards.

    Appends return ``(shard_name, offset)``: offsets count per shard. The writer is thread-safe
    (each shard's writer is). A root that already holds shards of the same prefix with another
    shard bit is refused (``ShardLayoutError``): they could not be read back as one journal.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        prefix: str = "",
        bit: int = 2,
        *,
        hash: HashFunc = shard_of,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        sync: str | SyncPolicy = "none",
        shared: bool = False,
    ) -> None:
        check_prefix(prefix)
        check_bit(bit)
        if not callable(hash):
            raise InvalidArgumentError(f"hash must be a callable (key, bit) -> shard index, not {hash!r}")
        segment_size = check_integer("segment_size", segment_size, 1)
        self.root = Path(root)
        self.prefix = prefix
        self.bit = bit
        self.hash = hash
        self.count = 1 << bit
        make_room_for_shards(self.count)
        self._options = {"segment_size": segment_size, "sync": SyncPolicy.parse(sync), "shared": shared}
        self._mask = self.count - 1
        self._default_hash = hash is shard_of
        self._names = [shard_dir_name(prefix, bit, i) for i in range(self.count)]
        self._writers: list[Writer | None] = [None] * self.count
        self._opening = threading.Lock()
        self._closed = False
        if self.root.exists() and not self.root.is_dir():
            raise JournalError("not a directory: cannot hold shards", file=self.root)
        if self.root.is_dir():
            layout = read_layout(self.root, prefix)
            if layout.bit is not None and layout.bit != bit:
                found = "an unsharded journal" if layout.bit == 0 else f"shards with shard bit {layout.bit}"
                raise ShardLayoutError(
                    f"cannot write shards with prefix {prefix!r} and shard bit {bit}: the root already holds {found} "
                    f"with that prefix ({', '.join(repr(n) for n in list(layout.shards)[:3])}"
                    f"{', ...' if len(layout.shards) > 3 else ''})",
                    file=self.root,
                )

    # -- routing ----------------------------------------------------------------------------

    @property
    def shard_names(self) -> list[str]:
        """The names of all ``2**bit`` shards, in index order (whether they exist yet or not)."""
        return list(self._names)

    def shard_for(self, key: bytes) -> str:
        """The name of the shard that a message with ``key`` goes to."""
        return self._names[self._index(key)]

    def _index(self, key: bytes) -> int:
        if not self.bit:
            return 0
        if self._default_hash:
            try:
                return zlib.crc32(key) & self._mask
            except TypeError:
                raise InvalidMessageError(f"message key must be bytes, not {type(key).__name__}") from None
        index = self.hash(key, self.bit)
        if type(index) is not int or not 0 <= index < self.count:
            raise ShardNameError(
                f"shard index must be an integer from 0 to {self.count - 1} for shard bit {self.bit}, not "
                f"{index!r} (given by {getattr(self.hash, '__qualname__', self.hash)!r} for key {key!r})"
            )
        return index

    def _writer(self, index: int, items: Sequence[bytes | Message]) -> Writer:
        """The writer of shard ``index``, for ``items``; opened (and the shard made) only once
        the format takes them, so that a refused message makes no shard."""
        writer = self._writers[index]
        if writer is not None:
            return writer
        encode_batch(0, 0, items)  # refuses what the shard's writer would (a new shard's first batch only)
        with self._opening:
            if self._closed:
                raise Error(f"sharded writer of {self.root} is closed")
            writer = self._writers[index]
            if writer is None:
                name = self._names[index]
                writer = Writer(self.root / name if name else self.root, **self._options)
                self._writers[index] = writer
            return writer

    # -- appending --------------------------------------------------------------------------

    def append(
        self, value: bytes, key: bytes = b"", type: int = 0, timestamp_ns: int | None = None
    ) -> tuple[str, int]:
        """Append one message to the shard of ``key``; returns the shard's name and the offset."""
        self._check_open()
        # The key is checked before a new shard's directory is made for a message it cannot take.
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise InvalidMessageError(f"message key must be bytes, not {builtins.type(key).__name__}")
        if len(key) > MAX_KEY_SIZE:
            raise InvalidMessageError(f"message key is {len(key)} bytes; the format allows at most {MAX_KEY_SIZE}")
        index = self._index(key)
        writer = self._writers[index]
        if writer is None:
            writer = self._writer(index, [Message(timestamp_ns=timestamp_ns, type=type, key=key, value=value)])
        return self._names[index], writer.append(value, key, type, timestamp_ns)

    def append_many(self, items: Iterable[bytes | Message]) -> list[tuple[str, int]]:
        """Append a batch: values (keyless, so all to the shard of ``b""``) or ``Message``s (their
        ``offset`` ignored, a ``timestamp_ns`` of None meaning now). Returns ``(shard_name,
        offset)`` for each item, in the items' order.

        The items are grouped by shard and each shard's group is appended with one
        ``Writer.append_many``, in the order in which the shards first appear in the batch; the
        messages of one shard keep their order. Each shard's group is stored all or nothing, but
        the batch as a whole is not: if a message is refused (``InvalidMessageError``: keys are
        checked before anything is written, values, types and timestamps as each shard's group
        is encoded), the groups of the shards written before it stay stored. Messages without a
        timestamp get the time at which their shard's group is appended.
        """
        self._check_open()
        items = items if isinstance(items, (list, tuple)) else list(items)
        if not items:
            return []
        if not self.bit:
            return self._append_group(0, items)
        keys = _keys(items)
        shards = self._indexes(keys)
        order = dict.fromkeys(shards)  # the shards, in the order they first appear
        if len(order) == 1:
            return self._append_group(shards[0], items)
        groups: dict[int, list[bytes | Message]] = {index: [] for index in order}
        add = {index: group.append for index, group in groups.items()}
        for item, index in zip(items, shards):
            add[index](item)
        names = self._names
        placed = {}
        for index, group in groups.items():
            last = self._writer(index, group).append_many(group)
            assert last is not None
            placed[index] = zip(repeat(names[index]), count(last - len(group) + 1))
        return list(map(next, map(placed.__getitem__, shards)))

    def _indexes(self, keys: list[bytes]) -> list[int]:
        """The shard of each key, after checking every key (so that a bad one stops the batch
        before anything is written)."""
        if self._default_hash:
            mask, crc = self._mask, zlib.crc32
            try:
                shards = [crc(key) & mask for key in keys]
            except TypeError:
                shards = []
        else:
            shards = []
        if not shards:
            for i, key in enumerate(keys):
                if not isinstance(key, (bytes, bytearray, memoryview)):
                    raise InvalidMessageError(
                        f"item {i} of the batch has a key that is not bytes ({type(key).__name__})"
                    )
        if max(map(len, keys)) > MAX_KEY_SIZE:
            i, key = next((i, key) for i, key in enumerate(keys) if len(key) > MAX_KEY_SIZE)
            raise InvalidMessageError(
                f"item {i} of the batch has a key of {len(key)} bytes; the format allows at most {MAX_KEY_SIZE}"
            )
        return shards or list(map(self._index, keys))

    def _append_group(self, index: int, items: Sequence[bytes | Message]) -> list[tuple[str, int]]:
        last = self._writer(index, items).append_many(items)
        assert last is not None
        return list(zip(repeat(self._names[index]), range(last - len(items) + 1, last + 1)))

    # -- the shards' writers ----------------------------------------------------------------

    @property
    def writers(self) -> dict[str, Writer]:
        """The shards opened so far (those that got a message), by name, in index order."""
        return {self._names[i]: w for i, w in enumerate(self._writers) if w is not None}

    @property
    def next_offsets(self) -> dict[str, int]:
        """The offset that the next message of each opened shard will get."""
        return {name: w.next_offset for name, w in self.writers.items()}

    def flush(self) -> None:
        """Hand buffered appends of every shard to the operating system."""
        for writer in self.writers.values():
            writer.flush()

    def sync(self) -> None:
        """Force everything appended to every shard so far onto stable storage."""
        for writer in self.writers.values():
            writer.sync()

    def close(self) -> None:
        """Close every shard's writer (each syncs), even when one fails; the first error is then
        raised. Closing twice is harmless."""
        with self._opening:
            self._closed = True
            writers = [w for w in self._writers if w is not None]
        error: BaseException | None = None
        for writer in writers:
            try:
                writer.close()
            except BaseException as exc:  # close the others before raising
                error = error or exc
        if error is not None:
            raise error

    def _check_open(self) -> None:
        if self._closed:
            raise Error(f"sharded writer of {self.root} is closed")


    def __repr__(self) -> str:
        return (
            f"ShardedWriter({str(self.root)!r}, prefix={self.prefix!r}, bit={self.bit}, "
            f"open shards={list(self.writers)})"
        )


def _keys(items: Sequence[bytes | Message]) -> list[bytes]:
    """The key of each item: a ``Message``'s, ``b""`` for a value; ``InvalidMessageError`` for an
    item that is neither."""
    try:
        return [item.key for item in items]  # type: ignore[union-attr]
    except AttributeError:
        pass
    keys = []
    for i, item in enumerate(items):
        if isinstance(item, Message):
            keys.append(item.key)
        elif isinstance(item, (bytes, bytearray, memoryview)):
            keys.append(b"")
        else:
            raise InvalidMessageError(
                f"item {i} of the batch is a {type(item).__name__}; "
                "append bytes values or journalq.journal.Message objects"
            )
    return keys
