"""The sej format, column-wise: decode a chunk of segment bytes straight into numpy arrays.

``journalq.journal.codec.decode`` makes one ``Message`` per message; Spark wants columns (Arrow
record batches). Here a chunk is split into *runs*:

* a run of messages that all have the same key and value lengths (the common case: fixed-size
  records) is viewed as a 2-D ``uint8`` array, checked and sliced with a handful of vectorized
  operations, whatever its length;
* anything else goes through a small Python loop that only finds where each message starts
  (and checks its lengths and size field); the columns are then gathered with numpy.

Every check of ``codec.decode`` is made: negative lengths, the size field, dense offsets. Like it,
an incomplete message at the end is left for the caller to complete with more bytes. Pure: no I/O.

One call's keys, and its values, stay within ``MAX_BINARY`` bytes (Arrow's binary arrays count
their bytes in int32): past it decoding stops at a message's start, as at the end of ``buf``, and
a next call decodes on from there.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from journalq.errors import CorruptionError, Error
from journalq.journal.codec import OVERHEAD

__all__ = ["Columns", "decode_columns", "empty_columns"]

_INT32 = struct.Struct(">i")
_BE_U64 = np.dtype(">u8")
_BE_I64 = np.dtype(">i8")
_BE_I32 = np.dtype(">i4")
_UNIFORM_MIN = 8  # a run of equal sizes shorter than this is not worth the vectorized path
_GENERAL_MAX = 1024  # messages the Python loop takes before looking for a uniform run again
MAX_BINARY = 2**31 - 1
"""Bytes of keys, and of values, that one call decodes at most (one message more only when it is
the first: a message's value, an int32 long, always fits)."""


@dataclass
class Columns:
    """Decoded messages as arrays (``n`` of them). ``key_offsets``/``value_offsets`` have ``n + 1``
    int32 entries into ``key_data``/``value_data`` (uint8), Arrow's layout for binary arrays.
    Keys or values left out (``keys=False``/``values=False``) are None."""

    offset: np.ndarray  # int64
    timestamp_ns: np.ndarray  # int64
    type: np.ndarray  # uint8
    key_offsets: np.ndarray | None
    key_data: np.ndarray | None
    value_offsets: np.ndarray | None
    value_data: np.ndarray | None

    def __len__(self) -> int:
        return len(self.offset)

    def value(self, i: int) -> bytes:
        assert self.value_offsets is not None and self.value_data is not None
        return self.value_data[self.value_offsets[i] : self.value_offsets[i + 1]].tobytes()

    def key(self, i: int) -> bytes:
        assert self.key_offsets is not None and self.key_data is not None
        return self.key_data[self.key_offsets[i] : self.key_offsets[i + 1]].tobytes()

    def select(self, index: np.ndarray | slice) -> Columns:
        """The rows at ``index`` (a slice, a boolean mask or positions), as new columns."""
        if isinstance(index, slice):
            start, stop, _ = index.indices(len(self))
            return Columns(
                self.offset[start:stop],
                self.timestamp_ns[start:stop],
                self.type[start:stop],
                *_slice_binary(self.key_offsets, self.key_data, start, stop),
                *_slice_binary(self.value_offsets, self.value_data, start, stop),
            )
        rows = np.flatnonzero(index) if index.dtype == np.bool_ else index
        return Columns(
            self.offset[rows],
            self.timestamp_ns[rows],
            self.type[rows],
            *_take_binary(self.key_offsets, self.key_data, rows),
            *_take_binary(self.value_offsets, self.value_data, rows),
        )


def empty_columns(keys: bool = True, values: bool = True) -> Columns:
    zero = np.zeros(1, np.int32)
    none = np.zeros(0, np.uint8)
    return Columns(
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0, np.uint8),
        zero if keys else None,
        none if keys else None,
        zero if values else None,
        none if values else None,
    )


def _slice_binary(offsets: np.ndarray | None, data: np.ndarray | None, start: int, stop: int):
    if offsets is None or data is None:
        return None, None
    first = int(offsets[start])
    return offsets[start : stop + 1] - first, data[first : int(offsets[stop])]


def _take_binary(offsets: np.ndarray | None, data: np.ndarray | None, rows: np.ndarray):
    if offsets is None or data is None:
        return None, None
    starts = offsets[:-1][rows].astype(np.int64)
    lengths = (offsets[1:][rows] - offsets[:-1][rows]).astype(np.int64)
    return _gather(data, starts, lengths)


def _gather(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``source[starts[i] : starts[i] + lengths[i]]`` for every i: (offsets, data)."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return offsets.astype(np.int32), np.zeros(0, np.uint8)
    positions = np.repeat(starts - offsets[:-1], lengths)
    positions += np.arange(total, dtype=np.int64)
    return _int32(offsets), source[positions]


def _int32(offsets: np.ndarray) -> np.ndarray:
    """Arrow's int32 offsets; ``decode_columns`` keeps every chunk within them (``MAX_BINARY``),
    so this says which invariant broke rather than wrapping round silently."""
    if len(offsets) and int(offsets[-1]) > 2**31 - 1:
        raise Error(f"{int(offsets[-1])} bytes of keys or values in one batch of columns: over Arrow's 2 GiB")
    return offsets.astype(np.int32)


def _corrupt(reason: str, position: int, due: int | None, timestamp_ns: int | None = None) -> CorruptionError:
    """Located at the offset that was due (when known), as the codec locates its errors: with the
    timestamp only of a whole message out of place, never what a damaged header spells."""
    return CorruptionError(reason, position=position, offset=due, timestamp_ns=timestamp_ns)


def _header(buf: bytes, pos: int) -> tuple[int, int]:
    return int.from_bytes(buf[pos : pos + 8], "big"), int.from_bytes(buf[pos + 8 : pos + 16], "big", signed=True)


class _Pieces:
    """Column pieces of consecutive runs, concatenated at the end."""

    def __init__(self, keys: bool, values: bool) -> None:
        self.keys, self.values = keys, values
        self.offset: list[np.ndarray] = []
        self.timestamp: list[np.ndarray] = []
        self.type: list[np.ndarray] = []
        self.key_lengths: list[np.ndarray] = []
        self.key_data: list[np.ndarray] = []
        self.value_lengths: list[np.ndarray] = []
        self.value_data: list[np.ndarray] = []

    def uniform(self, block: np.ndarray, key_len: int, value_len: int) -> None:
        m = block.shape[0]
        self.offset.append(np.ascontiguousarray(block[:, 0:8]).view(_BE_U64).ravel())
        self.timestamp.append(np.ascontiguousarray(block[:, 8:16]).view(_BE_I64).ravel())
        self.type.append(block[:, 16].copy())
        if self.keys:
            self.key_lengths.append(np.full(m, key_len, np.int64))
            self.key_data.append(np.ascontiguousarray(block[:, 18 : 18 + key_len]).ravel())
        if self.values:
            self.value_lengths.append(np.full(m, value_len, np.int64))
            v0 = 22 + key_len
            self.value_data.append(np.ascontiguousarray(block[:, v0 : v0 + value_len]).ravel())

    def general(self, a: np.ndarray, starts: list[int], key_lens: list[int], value_lens: list[int]) -> None:
        s = np.array(starts, np.int64)
        self.offset.append(a[s[:, None] + np.arange(8)].view(_BE_U64).ravel())
        self.timestamp.append(a[s[:, None] + np.arange(8, 16)].view(_BE_I64).ravel())
        self.type.append(a[s + 16])
        k = np.array(key_lens, np.int64)
        if self.keys:
            self.key_lengths.append(k)
            self.key_data.append(_gather(a, s + 18, k)[1])
        if self.values:
            v = np.array(value_lens, np.int64)
            self.value_lengths.append(v)
            self.value_data.append(_gather(a, s + 22 + k, v)[1])

    def columns(self) -> Columns:
        if not self.offset:
            return empty_columns(self.keys, self.values)

        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        def binary(lengths: list[np.ndarray], data: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            lens = cat(lengths)
            offsets = np.zeros(len(lens) + 1, np.int64)
            np.cumsum(lens, out=offsets[1:])
            return _int32(offsets), cat(data)

        key_offsets = key_data = value_offsets = value_data = None
        if self.keys:
            key_offsets, key_data = binary(self.key_lengths, self.key_data)
        if self.values:
            value_offsets, value_data = binary(self.value_lengths, self.value_data)
        offset = cat(self.offset)
        if len(offset) and int(offset.max()) >= 2**63:
            raise CorruptionError("an offset does not fit in a signed 64-bit integer")
        return Columns(
            offset.astype(np.int64),
            cat(self.timestamp).astype(np.int64),
            cat(self.type),
            key_offsets,
            key_data,
            value_offsets,
            value_data,
        )


def decode_columns(
    buf: bytes,
    start: int = 0,
    end: int | None = None,
    expected_offset: int | None = None,
    max_messages: int | None = None,
    *,
    keys: bool = True,
    values: bool = True,
) -> tuple[Columns, int]:
    """Decode the whole messages in ``buf[start:end]`` into columns.

    Returns the columns and the position just past the last message decoded; an incomplete
    message at the end is left for the caller. When ``expected_offset`` is given, offsets must run
    densely from it (otherwise from the first message's). At most ``max_messages`` are decoded.
    Raises ``CorruptionError`` (``position`` relative to ``buf``) for a message whose lengths,
    size field or offset are wrong. ``keys``/``values`` False leave those columns out (cheaper).
    Keys, and values, past ``MAX_BINARY`` bytes are left for a next call, as an incomplete message.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    if end is None:
        end = len(buf)
    a = np.frombuffer(buf, dtype=np.uint8)
    remaining = -1 if max_messages is None else max_messages
    pieces = _Pieces(keys, values)
    pos = start
    due = expected_offset
    unpack_int = _INT32.unpack_from
    # Bytes of keys and of values still to take (None: a column left out takes none).
    key_room = MAX_BINARY if keys else None
    value_room = MAX_BINARY if values else None
    full = False
    while remaining != 0 and pos + OVERHEAD <= end and not full:
        key_len = buf[pos + 17]
        if key_len > 127:
            raise _corrupt(f"negative key length {key_len - 256}", pos, due)
        key_end = pos + 18 + key_len
        if key_end + 8 > end:
            break
        (value_len,) = unpack_int(buf, key_end)
        if value_len < 0:
            raise _corrupt(f"negative value length {value_len}", pos, due)
        size = OVERHEAD + key_len + value_len
        if pos + size > end:
            break
        if due is None:
            due = int.from_bytes(buf[pos : pos + 8], "big")
        # A uniform run when the next message has the same lengths (checked cheaply first).
        fit = (end - pos) // size
        if remaining > 0:
            fit = min(fit, remaining)
        nxt = pos + size
        if (
            fit >= _UNIFORM_MIN
            and buf[nxt + 17] == key_len
            and unpack_int(buf, nxt + 18 + key_len)[0] == value_len
        ):
            block = a[pos : pos + fit * size].reshape(fit, size)
            v0 = 18 + key_len
            good = block[:, 17] == key_len
            good &= np.ascontiguousarray(block[:, v0 : v0 + 4]).view(_BE_I32).ravel() == value_len
            good &= np.ascontiguousarray(block[:, size - 4 :]).view(_BE_I32).ravel() == size
            bad = np.flatnonzero(~good)
            run = int(bad[0]) if len(bad) else fit
            fits = _fitting(run, key_len, key_room, value_len, value_room, not pieces.offset)
            full = fits < run
            run = fits
            if key_room is not None:
                key_room -= run * key_len
            if value_room is not None:
                value_room -= run * value_len
            if run:
                block = block[:run]
                pieces.uniform(block, key_len, value_len)
                _check_dense(buf, pieces.offset[-1], due, lambda i: pos + i * size)
                pos += run * size
                due += run
                remaining -= run
                continue
            if full:
                break
        # The general path: find the starts of up to _GENERAL_MAX messages.
        starts: list[int] = []
        key_lens: list[int] = []
        value_lens: list[int] = []
        limit = _GENERAL_MAX if remaining < 0 else min(_GENERAL_MAX, remaining)
        previous = -1
        streak = 0
        while len(starts) < limit and pos + OVERHEAD <= end:
            key_len = buf[pos + 17]
            if key_len > 127:
                if starts:
                    break  # hand out what came before; the next call raises
                raise _corrupt(f"negative key length {key_len - 256}", pos, due)
            key_end = pos + 18 + key_len
            if key_end + 8 > end:
                break
            (value_len,) = unpack_int(buf, key_end)
            if value_len < 0:
                if starts:
                    break
                raise _corrupt(f"negative value length {value_len}", pos, due)
            nxt = key_end + 8 + value_len
            if nxt > end:
                break
            (size,) = unpack_int(buf, nxt - 4)
            if size != nxt - pos:
                if starts:
                    break
                raise _corrupt(f"size field says {size} bytes, the message has {nxt - pos}", pos, due)
            if not _fitting(1, key_len, key_room, value_len, value_room, not (starts or pieces.offset)):
                full = True
                break
            if key_room is not None:
                key_room -= key_len
            if value_room is not None:
                value_room -= value_len
            starts.append(pos)
            key_lens.append(key_len)
            value_lens.append(value_len)
            pos = nxt
            if size == previous:
                streak += 1
                if streak >= 2 * _UNIFORM_MIN:
                    break  # looks uniform from here: let the vectorized path take over
            else:
                previous, streak = size, 0
        if not starts:
            break
        pieces.general(a, starts, key_lens, value_lens)
        _check_dense(buf, pieces.offset[-1], due, starts.__getitem__)
        due += len(starts)
        remaining -= len(starts)
    return pieces.columns(), pos


def _fitting(
    count: int, key_len: int, key_room: int | None, value_len: int, value_room: int | None, first: bool
) -> int:
    """How many of ``count`` messages alike fit in the bytes of keys and values left (a room of
    None: that column is not kept); the ``first`` message of a call always does."""
    fits = count
    for length, room in ((key_len, key_room), (value_len, value_room)):
        if room is not None and length:
            fits = min(fits, max(room, 0) // length)
    return max(fits, 1) if first and count else fits


def _check_dense(buf: bytes, offsets: np.ndarray, due: int, position_of: Callable[[int], int]) -> None:
    """``CorruptionError`` at the first of ``offsets`` (a run just decoded) that is not ``due`` + its
    index; ``position_of(i)``: where message ``i`` of the run starts in ``buf``."""
    want = np.arange(due, due + len(offsets), dtype=np.uint64)
    if not np.array_equal(offsets, want):
        i = int(np.flatnonzero(offsets != want)[0])
        position = position_of(i)
        offset, ts = _header(buf, position)
        raise _corrupt(f"offset {offset} where {due + i} was due", position, due + i, ts)
