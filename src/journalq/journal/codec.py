"""The sej message format, as pure functions: no files, no clocks, no I/O.

A segment file is a sequence of messages; each message is, big-endian::

    offset     uint64   its position in the journal; dense, rising by one
    timestamp  int64    nanoseconds since the Unix epoch (Go's zero time: the minimum int64)
    type       uint8
    key_len    int8     so a key holds at most 127 bytes
    key        key_len bytes
    value_len  int32
    value      value_len bytes
    size       int32    the size of the whole message, itself included (lets a reader go backward)

Everything here works on ``bytes``-like buffers so that it can be tested and fuzzed alone; the
writer and the scanner wrap it with file I/O.
"""

from __future__ import annotations

import functools
import itertools
import operator
import struct
from collections.abc import Iterable, Sequence
from itertools import count
from typing import NamedTuple

from journalq.errors import ZERO_TIMESTAMP, CorruptionError, InvalidMessageError

HEADER = struct.Struct(">QqBb")  # offset, timestamp, type, key length
INT32 = struct.Struct(">i")
_HEADER_NO_KEY = struct.Struct(">QqBbi")  # the header and value length of a message without key
OVERHEAD = HEADER.size + 2 * INT32.size  # 26 bytes around key and value
MAX_KEY_SIZE = 127
MAX_MESSAGE_SIZE = 2**31 - 1  # the size field is an int32
MAX_VALUE_SIZE = MAX_MESSAGE_SIZE - OVERHEAD - MAX_KEY_SIZE

__all__ = [
    "HEADER",
    "MAX_KEY_SIZE",
    "MAX_VALUE_SIZE",
    "OVERHEAD",
    "ZERO_TIMESTAMP",
    "Message",
    "decode",
    "encode",
    "encode_batch",
    "frame_sizes",
    "message_size",
]


class Message(NamedTuple):
    """One message of a journal.

    Read from a journal, every field is set. Given to a writer, ``offset`` is ignored (the writer
    assigns the next one) and a ``timestamp_ns`` of ``None`` means "now".
    """

    offset: int = 0
    timestamp_ns: int | None = None
    type: int = 0
    key: bytes = b""
    value: bytes = b""


def message_size(key_len: int, value_len: int) -> int:
    """Bytes that a message with a key and value of these lengths takes in a segment."""
    return OVERHEAD + key_len + value_len


def _nbytes(field: bytes | bytearray | memoryview) -> int:
    """Length in bytes (a memoryview's len() counts items, which may be wider than a byte)."""
    return field.nbytes if isinstance(field, memoryview) else len(field)


def _check(key: bytes, value: bytes, type_: int, timestamp_ns: int) -> None:
    """Raise a clear ``InvalidMessageError`` for whatever makes this message unstorable."""
    for name, field in (("key", key), ("value", value)):
        if not isinstance(field, (bytes, bytearray, memoryview)):
            raise InvalidMessageError(f"message {name} must be bytes, not {type(field).__name__}")
    key_len, value_len = _nbytes(key), _nbytes(value)
    if key_len > MAX_KEY_SIZE:
        raise InvalidMessageError(f"message key is {key_len} bytes; the format allows at most 127")
    if value_len > MAX_VALUE_SIZE:
        raise InvalidMessageError(f"message value is {value_len} bytes; at most {MAX_VALUE_SIZE}")
    if not isinstance(type_, int) or not 0 <= type_ <= 255:
        raise InvalidMessageError(f"message type must be an integer from 0 to 255, not {type_!r}")
    if not isinstance(timestamp_ns, int) or not ZERO_TIMESTAMP <= timestamp_ns < 2**63:
        raise InvalidMessageError(f"message timestamp must be a 64-bit integer, not {timestamp_ns!r}")


def encode(offset: int, timestamp_ns: int, type: int, key: bytes, value: bytes) -> bytes:
    """The bytes of one message."""
    try:
        # The common case unchecked, in one pack (~9 k instructions less than the checks and five
        # pieces joined): struct refuses every field out of its range, and a key or value that is
        # not bytes or bytearray (a memoryview's len() may count items, not bytes).
        key_len, value_len = len(key), len(value)
        if value_len <= MAX_VALUE_SIZE:
            pack, size = _run_struct(key_len, value_len).pack, OVERHEAD + key_len + value_len
            return pack(offset, timestamp_ns, type, key_len, key, value_len, value, size)
    except (TypeError, ValueError, OverflowError, struct.error):
        pass
    return _encode_checked(offset, timestamp_ns, type, key, value)


def _encode_checked(offset: int, timestamp_ns: int, type: int, key: bytes, value: bytes) -> bytes:
    """``encode`` field by field: ``InvalidMessageError`` saying what makes the message
    unstorable, or its bytes."""
    _check(key, value, type, timestamp_ns)
    key, value = bytes(key), bytes(value)  # a memoryview's len() counts items, not bytes
    if offset < 0 or offset >= 2**64:
        raise InvalidMessageError(f"offset {offset} does not fit in an unsigned 64-bit integer")
    key_len, value_len = len(key), len(value)
    return b"".join(
        (
            HEADER.pack(offset, timestamp_ns, type, key_len),
            key,
            INT32.pack(value_len),
            value,
            INT32.pack(OVERHEAD + key_len + value_len),
        )
    )


def _encode_values(first_offset: int, timestamp_ns: int, values: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """The fast path of ``encode_batch``: plain values, no key, type 0, one timestamp."""
    lengths = list(map(len, values))
    n = lengths[0]
    if lengths.count(n) == len(lengths):  # all of one size, as a queue's often are: a pack each
        pack, size = _run_struct(0, n).pack, OVERHEAD + n
        data = b"".join(
            [pack(offset, timestamp_ns, 0, 0, b"", n, v, size) for offset, v in zip(count(first_offset), values)]
        )
        return data, lengths
    pack_head, pack_size = _HEADER_NO_KEY.pack, INT32.pack
    data = b"".join(
        [
            pack_head(offset, timestamp_ns, 0, 0, n) + v + pack_size(OVERHEAD + n)
            for offset, v, n in zip(count(first_offset), values, lengths)
        ]
    )
    return data, lengths


def _encode_messages(first_offset: int, timestamp_ns: int, messages: Sequence[Message]) -> tuple[bytes, list[int]]:
    """The fast path of ``encode_batch`` for ``Message`` items: struct checks every field's range
    (a key over 127 bytes, a type over 255 raise ``struct.error``)."""
    pack_head, pack_int = HEADER.pack, INT32.pack
    parts, lengths = [], []
    for offset, message in zip(count(first_offset), messages):
        _, ts, type_, key, value = message
        key_len, value_len = len(key), len(value)
        parts.append(
            pack_head(offset, timestamp_ns if ts is None else ts, type_, key_len)
            + key
            + pack_int(value_len)
            + value
            + pack_int(OVERHEAD + key_len + value_len)
        )
        lengths.append(key_len + value_len)
    return b"".join(parts), lengths


def encode_batch(
    first_offset: int, timestamp_ns: int, items: Iterable[bytes | Message]
) -> tuple[bytes, list[int], int]:
    """Encode many messages at consecutive offsets from ``first_offset``.

    ``items`` are values (bytes-like) or ``Message``s; a ``Message`` keeps its own timestamp unless
    it is ``None``, and all others get ``timestamp_ns``. Returns the bytes, the size of each
    message's key plus value (the rest is ``OVERHEAD``), and the number of messages.
    """
    items = items if isinstance(items, (list, tuple)) else list(items)
    if len(items) == 1 and type(items[0]) is Message:
        # One message (a queue's event, each append of a channel): no lists or loop to build.
        _, ts, type_, key, value = items[0]
        data = encode(first_offset, timestamp_ns if ts is None else ts, type_, key, value)
        return data, [len(data) - OVERHEAD], 1
    if not items:
        return b"", [], 0
    fast = _encode_messages if isinstance(items[0], Message) else _encode_values
    try:
        data, lengths = fast(first_offset, timestamp_ns, items)
        # Lengths of memoryviews count items, not bytes: the general path gets those right.
        if len(data) == len(lengths) * OVERHEAD + sum(lengths):
            return data, lengths, len(items)
    except (TypeError, ValueError, struct.error):
        pass  # mixed items, or one out of range: the general path says which and why
    parts: list[bytes] = []
    lengths = []
    for offset, item in zip(count(first_offset), items):
        if isinstance(item, Message):
            ts = timestamp_ns if item.timestamp_ns is None else item.timestamp_ns
            parts.append(encode(offset, ts, item.type, item.key, item.value))
        elif isinstance(item, (bytes, bytearray, memoryview)):
            parts.append(encode(offset, timestamp_ns, 0, b"", item))
        else:
            raise InvalidMessageError(
                f"item {offset - first_offset} of the batch is a {type(item).__name__}; "
                "append bytes values or journalq.journal.Message objects"
            )
        lengths.append(len(parts[-1]) - OVERHEAD)  # key plus value, in bytes as encoded
    return b"".join(parts), lengths, len(items)


_RUN_MIN = 8  # messages of one size in a row before ``decode`` reads on as a uniform run
_RUN_MAX = 1024  # rows unpacked per uniform attempt (what a wrong guess can waste)
_first = operator.itemgetter(0)
_new_tuple = tuple.__new__


def _first_false(flags: Iterable[bool], default: int) -> int:
    """The index of the first false flag, or ``default`` when all are true (in C: no Python
    loop over the flags)."""
    return next(itertools.compress(itertools.count(), map(operator.not_, flags)), default)


@functools.lru_cache(maxsize=256)  # a queue's events are of a few sizes each (see ``encode``)
def _run_struct(key_len: int, value_len: int) -> struct.Struct:
    """The layout of one message with a key and value of these lengths."""
    return struct.Struct(f">QqBb{key_len}si{value_len}si")


@functools.lru_cache(maxsize=64)
def _run_layout(key_len: int, value_len: int) -> tuple[struct.Struct, tuple[tuple[int, int], ...]]:
    """What ``_uniform_run`` reads of a message with a key and value of these lengths: a layout
    that unpacks a ``Message``'s fields (offset, timestamp, type, key, value) and passes over
    the rest, and that rest, byte by byte, as it must be: (position in the message, byte) for
    the key length, the value length and the size field."""
    frame = ((17, key_len),)
    frame += tuple((18 + key_len + i, byte) for i, byte in enumerate(INT32.pack(value_len)))
    size = OVERHEAD + key_len + value_len
    frame += tuple((size - 4 + i, byte) for i, byte in enumerate(INT32.pack(size)))
    return struct.Struct(f">QqBx{key_len}s4x{value_len}s4x"), frame


def _uniform_run(
    buf: bytes, pos: int, end: int, most: int, next_offset: int | None
) -> tuple[list[Message], int] | None:
    """Decode the messages from ``pos`` that have the same key and value lengths as the one
    there, all at once with ``Struct.iter_unpack`` (a queue's or a log's messages are often of
    one size): the messages and the position past them, or None when fewer than ``_RUN_MIN``
    whole messages of that size could follow. Each message unpacked is checked as ``decode``
    checks it (its lengths, its size field, its offset); the run ends before the first that
    fails, which ``decode``'s general loop then takes (and reports, when it is damaged)."""
    key_len = buf[pos + 17]
    if key_len > MAX_KEY_SIZE or pos + 18 + key_len + 4 > end:
        return None
    (value_len,) = INT32.unpack_from(buf, pos + 18 + key_len)
    if value_len < 0:  # damage, for the general loop to report (and a size of 0 to divide by)
        return None
    size = OVERHEAD + key_len + value_len
    count = min((end - pos) // size, most, _RUN_MAX)
    if count < _RUN_MIN:
        return None
    # Cheaply first: the next message has the same lengths (else this is no run).
    if buf[pos + size + 17] != key_len or INT32.unpack_from(buf, pos + size + 18 + key_len)[0] != value_len:
        return None
    layout, frame = _run_layout(key_len, value_len)
    # The framing bytes of every message, each a strided slice of ``buf`` (one byte per
    # message) that must repeat one byte: the run ends before the first message where one
    # does not (in C: no Python loop over the messages, and they are not unpacked).
    end_of_run = pos + count * size
    good = count
    for at, byte in frame:
        column = buf[pos + at : end_of_run : size]
        if column.count(byte) != count:
            good = min(good, count - len(column.lstrip(bytes((byte,)))))
    rows = list(layout.iter_unpack(memoryview(buf)[pos : pos + good * size]))
    if next_offset is not None:
        offsets = list(map(_first, rows))
        if offsets != list(range(next_offset, next_offset + good)):
            good = _first_false(map(operator.eq, offsets, itertools.count(next_offset)), good)
            del rows[good:]
    return list(map(_new_tuple, itertools.repeat(Message), rows)), pos + good * size


def decode(
    buf: bytes | bytearray | memoryview,
    start: int = 0,
    end: int | None = None,
    expected_offset: int | None = None,
    max_messages: int | None = None,
) -> tuple[list[Message], int]:
    """Decode the whole messages in ``buf[start:end]``.

    Returns the messages and the position just past the last one; an incomplete message at the end
    is left for the caller to complete with more bytes. When ``expected_offset`` is given, offsets
    must run densely from it. Raises ``CorruptionError`` (with ``position`` relative to ``buf``) at
    the first message whose structure or offset is wrong.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)  # slices of bytes are bytes: one copy here instead of two per message
    if end is None:
        end = len(buf)
    unpack_head, unpack_int = HEADER.unpack_from, INT32.unpack_from
    new = tuple.__new__  # skips the NamedTuple's Python-level __new__: a fifth faster
    out: list[Message] = []
    append = out.append
    pos = start
    limit = end - OVERHEAD
    remaining = -1 if max_messages is None else max_messages
    next_offset = expected_offset
    # A uniform run is looked for at the start, and after _RUN_MIN messages in a row with the
    # same lengths (cheaper than guessing: sizes that vary cost one comparison per message).
    # Each look unpacks up to ``reach`` messages: few at first (a short run wastes little of
    # what is unpacked past its end), four times more after a look that found only good ones.
    same, last_lengths, reach = _RUN_MIN, None, _RUN_MIN * 2
    while pos <= limit and remaining != 0:
        if same >= _RUN_MIN:
            same = 0
            run = _uniform_run(buf, pos, end, reach if remaining < 0 else min(reach, remaining), next_offset)
            if run is not None and run[0]:
                messages, after = run
                out += messages
                remaining -= len(messages)
                if next_offset is not None:
                    next_offset += len(messages)
                if len(messages) == reach:
                    reach = min(reach * 4, _RUN_MAX)
                    same = _RUN_MIN  # the run may go on past what one look unpacks
                else:
                    reach = _RUN_MIN * 2
                pos = after
                continue
        offset, timestamp_ns, type_, key_len = unpack_head(buf, pos)
        key_start = pos + 18
        key_end = key_start + key_len
        if key_len < 0:
            raise _damaged(f"negative key length {key_len}", pos, next_offset)
        if key_end + 8 > end:
            break
        (value_len,) = unpack_int(buf, key_end)
        value_end = key_end + 4 + value_len
        if value_len < 0:
            raise _damaged(f"negative value length {value_len}", pos, next_offset)
        if value_end + 4 > end:
            break
        (size,) = unpack_int(buf, value_end)
        if size != value_end + 4 - pos:
            raise _damaged(
                f"size field says {size} bytes, the message has {value_end + 4 - pos}",
                pos,
                next_offset,
            )
        if next_offset is not None:
            if offset != next_offset:
                raise _corrupt(f"offset {offset} where {next_offset} was due", pos, next_offset, timestamp_ns)
            next_offset += 1
        append(new(Message, (offset, timestamp_ns, type_, buf[key_start:key_end], buf[key_end + 4 : value_end])))
        pos = value_end + 4
        remaining -= 1
        if size == last_lengths:
            same += 1
        else:
            same, last_lengths = 0, size
    return out, pos


def frame_sizes(buf: bytes, expected_offset: int) -> tuple[list[int], int]:
    """The size of each whole message in ``buf`` and the position past the last one, checked as
    ``decode`` checks them (lengths, size fields, offsets dense from ``expected_offset``) but
    without building the messages: for code that moves a journal's bytes as they are."""
    unpack_head, unpack_int = HEADER.unpack_from, INT32.unpack_from
    sizes: list[int] = []
    append = sizes.append
    pos, end, next_offset = 0, len(buf), expected_offset
    while pos + OVERHEAD <= end:
        offset, timestamp_ns, _, key_len = unpack_head(buf, pos)
        if key_len < 0:
            raise _damaged(f"negative key length {key_len}", pos, next_offset)
        key_end = pos + 18 + key_len
        if key_end + 8 > end:
            break
        (value_len,) = unpack_int(buf, key_end)
        if value_len < 0:
            raise _damaged(f"negative value length {value_len}", pos, next_offset)
        message_end = key_end + 8 + value_len
        if message_end > end:
            break
        (size,) = unpack_int(buf, message_end - 4)
        if size != message_end - pos:
            raise _damaged(f"size field says {size} bytes, the message has {message_end - pos}", pos, next_offset)
        if offset != next_offset:
            raise _corrupt(f"offset {offset} where {next_offset} was due", pos, next_offset, timestamp_ns)
        next_offset += 1
        append(size)
        pos = message_end
    return sizes, pos


def _corrupt(reason: str, position: int, offset: int, timestamp_ns: int) -> CorruptionError:
    """A whole message out of place: located at the offset that was due, with its timestamp."""
    return CorruptionError(reason, position=position, offset=offset, timestamp_ns=timestamp_ns)


def _damaged(reason: str, position: int, due: int | None) -> CorruptionError:
    """Bytes that are no message: located at the offset that was due (when known), never at the
    offset and timestamp the damaged header spells (18446744073709551615, 1969-12-31...)."""
    return CorruptionError(reason, position=position, offset=due)
