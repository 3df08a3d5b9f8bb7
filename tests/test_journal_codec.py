"""The message codec: unit tests against hand-made bytes, and property tests."""

from __future__ import annotations

import array
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journalq.errors import ZERO_TIMESTAMP, CorruptionError, InvalidMessageError
from journalq.journal import Scanner, Writer, codec
from journalq.journal.codec import (
    MAX_KEY_SIZE,
    OVERHEAD,
    Message,
    decode,
    encode,
    encode_batch,
    message_size,
)
from journalq.journal.inspect import check
from journalq.journal.segment import list_segments

pytestmark = pytest.mark.usefixtures("vectors_untouched")

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

timestamps = st.one_of(
    st.just(ZERO_TIMESTAMP), st.integers(min_value=ZERO_TIMESTAMP, max_value=2**63 - 1)
)
keys = st.binary(max_size=MAX_KEY_SIZE)
values = st.binary(max_size=600)
types = st.integers(min_value=0, max_value=255)


@st.composite
def message_lists(draw, max_size=12):
    first = draw(st.integers(min_value=0, max_value=2**64 - 1 - max_size))
    items = draw(st.lists(st.tuples(timestamps, types, keys, values), max_size=max_size))
    return [Message(first + i, ts, ty, k, v) for i, (ts, ty, k, v) in enumerate(items)]


def hand_encode(offset, ts, type_, key, value):
    """The format, field by field, independent of the codec module."""
    return (
        struct.pack(">Q", offset)
        + struct.pack(">q", ts)
        + struct.pack(">B", type_)
        + struct.pack(">b", len(key))
        + key
        + struct.pack(">i", len(value))
        + value
        + struct.pack(">i", 8 + 8 + 1 + 1 + len(key) + 4 + len(value) + 4)
    )


# -- unit tests ------------------------------------------------------------------------------


def test_encode_known_bytes():
    data = encode(0x0102030405060708, 1_700_000_000_123_456_789, 9, b"ab", b"xyz")
    assert data == bytes.fromhex(
        "0102030405060708"  # offset
        "17979cfe3d85cd15"  # timestamp 1_700_000_000_123_456_789 ns
        "09"  # type
        "02" "6162"  # key length, key "ab"
        "00000003" "78797a"  # value length, value "xyz"
        "0000001f"  # size: 26 + 2 + 3 = 31
    )
    assert message_size(2, 3) == 31 == OVERHEAD + 5


def test_encode_zero_time_empty_key_and_value_type_255():
    assert encode(5, ZERO_TIMESTAMP, 255, b"", b"") == bytes.fromhex(
        "0000000000000005" "8000000000000000" "ff" "00" "00000000" "0000001a"
    )


def test_decode_returns_bytes_and_the_end_position():
    data = hand_encode(7, -1, 3, b"k", b"v") + hand_encode(8, 0, 0, b"", b"")
    messages, end = decode(data, expected_offset=7)
    assert messages == [Message(7, -1, 3, b"k", b"v"), Message(8, 0, 0, b"", b"")]
    assert end == len(data)
    assert all(type(m.key) is bytes and type(m.value) is bytes for m in messages)
    # memoryview and bytearray buffers, start/end and max_messages
    assert decode(memoryview(data))[0] == messages
    assert decode(bytearray(data), start=28)[0] == messages[1:]
    assert decode(data, end=len(data) - 1) == (messages[:1], 28)
    assert decode(data, max_messages=1) == (messages[:1], 28)


def test_key_of_128_bytes_is_refused_clearly():
    with pytest.raises(InvalidMessageError, match=r"key is 128 bytes; the format allows at most 127"):
        encode(0, 0, 0, b"k" * 128, b"")
    assert len(encode(0, 0, 0, b"k" * 127, b"")) == OVERHEAD + 127
    with pytest.raises(InvalidMessageError, match="128 bytes"):
        encode_batch(0, 0, [Message(key=b"k" * 128, value=b"v")])


@pytest.mark.parametrize("bad", ["text", 5, None, [1, 2], 1.5])
def test_non_bytes_value_or_key_is_refused_clearly(bad):
    with pytest.raises(InvalidMessageError, match=f"value must be bytes, not {type(bad).__name__}"):
        encode(0, 0, 0, b"", bad)
    with pytest.raises(InvalidMessageError, match=f"key must be bytes, not {type(bad).__name__}"):
        encode(0, 0, 0, bad, b"")
    with pytest.raises(InvalidMessageError, match="item 1 of the batch"):
        encode_batch(0, 0, [b"ok", bad])
    with pytest.raises(InvalidMessageError, match=f"value must be bytes, not {type(bad).__name__}"):
        encode_batch(0, 0, [b"ok", Message(value=bad)])


def test_invalid_message_error_is_a_value_error():
    with pytest.raises(ValueError):
        encode(0, 0, 0, b"", "text")


@pytest.mark.parametrize("type_", [-1, 256, "1", None])
def test_bad_type_is_refused(type_):
    with pytest.raises(InvalidMessageError, match="type must be an integer from 0 to 255"):
        encode(0, 0, type_, b"", b"")


@pytest.mark.parametrize("ts", [ZERO_TIMESTAMP - 1, 2**63, 1.5, None])
def test_bad_timestamp_is_refused(ts):
    with pytest.raises(InvalidMessageError, match="timestamp"):
        encode(0, ts, 0, b"", b"")


@pytest.mark.parametrize("offset", [-1, 2**64])
def test_bad_offset_is_refused(offset):
    with pytest.raises(InvalidMessageError, match="offset"):
        encode(offset, 0, 0, b"", b"")


def test_memoryview_lengths_are_counted_in_bytes():
    # A memoryview of 64 two-byte items is 128 bytes: too long for a key.
    wide_key = memoryview(array.array("h", [0] * 64))
    assert wide_key.nbytes == 128
    with pytest.raises(InvalidMessageError, match="128 bytes"):
        encode(0, 0, 0, wide_key, b"")
    # As a value it is stored whole, and the batch reports its size in bytes.
    wide = memoryview(array.array("i", [1, 2, 3]))
    raw = wide.tobytes()
    for items in ([wide], [Message(value=wide)], [b"a", wide], [Message(key=b"k", value=wide)]):
        data, lengths, count = encode_batch(0, 0, items)
        assert count == len(items)
        assert len(data) == count * OVERHEAD + sum(lengths)
        messages, end = decode(data, expected_offset=0)
        assert end == len(data)
        assert messages[-1].value == raw


def test_encode_batch_values_and_messages():
    items = [b"a", Message(timestamp_ns=None, type=4, key=b"kk", value=b"bb"), bytearray(b"c"),
             Message(offset=999, timestamp_ns=-5, value=b"")]
    data, lengths, count = encode_batch(10, 123, items)
    assert count == 4
    assert lengths == [1, 4, 1, 0]
    assert data == (
        hand_encode(10, 123, 0, b"", b"a")
        + hand_encode(11, 123, 4, b"kk", b"bb")  # a None timestamp takes the batch's
        + hand_encode(12, 123, 0, b"", b"c")
        + hand_encode(13, -5, 0, b"", b"")  # the Message's own offset is ignored
    )
    assert encode_batch(0, 0, []) == (b"", [], 0)
    assert encode_batch(0, 0, iter([b"x"]))[2] == 1


def test_decode_reports_corruption_with_position():
    good = hand_encode(0, 1, 0, b"", b"v")
    # negative key length
    bad_key = bytearray(hand_encode(1, 1, 0, b"", b"v"))
    bad_key[17] = 0xFF
    with pytest.raises(CorruptionError, match="negative key length") as info:
        decode(good + bytes(bad_key), expected_offset=0)
    assert info.value.position == len(good) and info.value.offset == 1
    # negative value length
    bad_value = bytearray(hand_encode(1, 1, 0, b"", b"v"))
    bad_value[18:22] = struct.pack(">i", -2)
    with pytest.raises(CorruptionError, match="negative value length"):
        decode(good + bytes(bad_value))
    # wrong size field
    bad_size = bytearray(hand_encode(1, 1, 0, b"", b"v"))
    bad_size[-4:] = struct.pack(">i", 99)
    with pytest.raises(CorruptionError, match="size field says 99 bytes, the message has 27") as info:
        decode(good + bytes(bad_size))
    assert info.value.position == len(good)
    # offsets out of order
    with pytest.raises(CorruptionError, match="offset 2 where 1 was due") as info:
        decode(good + hand_encode(2, 1, 0, b"", b""), expected_offset=0)
    assert info.value.position == len(good)
    assert "byte 27" in str(info.value) and "offset 2" in str(info.value)
    assert info.value.offset == 1 and info.value.timestamp_ns == 1  # where it was due; a whole message's time
    # a damaged header: located at the offset due, not at what its bytes spell
    with pytest.raises(CorruptionError, match="negative key length") as info:
        decode(b"\xff" * 40, expected_offset=0)
    assert info.value.offset == 0 and info.value.timestamp_ns is None
    assert "18446744073709551615" not in str(info.value) and "1969" not in str(info.value)


# -- property tests --------------------------------------------------------------------------


@FAST
@given(message_lists())
def test_round_trip(messages):
    data = b"".join(encode(*m) for m in messages)
    assert data == b"".join(hand_encode(*m) for m in messages)
    first = messages[0].offset if messages else None
    assert decode(data, expected_offset=first) == (messages, len(data))


@FAST
@given(message_lists(), st.integers(min_value=ZERO_TIMESTAMP, max_value=2**63 - 1))
def test_batch_round_trip(messages, batch_ts):
    first = messages[0].offset if messages else 0
    items = [m if i % 2 else m.value for i, m in enumerate(messages)]
    data, lengths, count = encode_batch(first, batch_ts, items)
    assert count == len(messages)
    decoded, end = decode(data, expected_offset=first)
    assert end == len(data) == count * OVERHEAD + sum(lengths)
    for i, (got, m) in enumerate(zip(decoded, messages)):
        want = m if i % 2 else Message(m.offset, batch_ts, 0, b"", m.value)
        assert got == want


@FAST
@given(
    st.integers(min_value=0, max_value=2**64 - 100),
    st.integers(min_value=ZERO_TIMESTAMP, max_value=2**63 - 1),
    st.lists(st.binary(max_size=40), min_size=1, max_size=30),
    st.booleans(),
)
def test_batches_of_values_of_one_size_and_of_many(first, batch_ts, values, one_size):
    """Plain values: those of one size take a path of their own (a pack each); both give the
    format's bytes."""
    if one_size:
        values = [v.ljust(len(values[0]), b"-")[: len(values[0])] for v in values]
    for items in (values, [bytearray(v) for v in values]):
        data, lengths, count = encode_batch(first, batch_ts, items)
        assert data == b"".join(hand_encode(first + i, batch_ts, 0, b"", v) for i, v in enumerate(values))
        assert (lengths, count) == ([len(v) for v in values], len(values))


def _outcome(encoder, *fields):
    """What an encoder makes of these fields: its bytes, or its error's type and words."""
    try:
        return encoder(*fields)
    except Exception as exc:  # noqa: BLE001 (which error, if any, is the point)
        return type(exc), str(exc)


def _as_buffer(data_and_kind):
    """The same bytes as each kind of buffer a key or value may be (and a memoryview of wide
    items, whose len() counts items)."""
    data, kind = data_and_kind
    if kind == "wide":
        return memoryview(array.array("h", data[: len(data) // 2 * 2]))
    return {"bytes": bytes, "bytearray": bytearray, "memoryview": memoryview}[kind](data)


def _buffers(max_size: int):
    return st.tuples(
        st.binary(max_size=max_size), st.sampled_from(["bytes", "bytearray", "memoryview", "wide"])
    ).map(_as_buffer)


_fields_near_and_out_of_range = st.tuples(
    st.one_of(st.integers(min_value=-2, max_value=2**64 + 1), st.integers(min_value=0, max_value=50)),
    st.one_of(timestamps, st.sampled_from([ZERO_TIMESTAMP - 1, 2**63, 1.5, None])),
    st.one_of(types, st.sampled_from([-1, 256, "1", None, True])),
    st.one_of(_buffers(130), st.sampled_from(["text", 5, None])),
    st.one_of(_buffers(300), st.sampled_from(["text", 5, None, [1, 2]])),
)


@FAST
@given(_fields_near_and_out_of_range)
def test_encode_is_its_checked_path_for_any_fields(fields):
    """``encode`` tries one unchecked pack first: for any fields, valid or not, it gives the
    bytes or the error that checking each field first gives."""
    assert _outcome(encode, *fields) == _outcome(codec._encode_checked, *fields)


@FAST
@given(_fields_near_and_out_of_range, st.booleans(), st.integers(min_value=ZERO_TIMESTAMP, max_value=2**63 - 1))
def test_a_batch_of_one_message_is_encoded_as_in_a_longer_batch(fields, own_time, batch_ts):
    """A batch of one ``Message`` (each append of a queue's channel) skips the loop over the
    items: the same bytes, lengths or error as the message in a batch of two."""
    offset, ts, type_, key, value = fields
    message = Message(0, ts if own_time else None, type_, key, value)
    offset = min(max(offset, 0), 2**64 - 2)
    one = _outcome(encode_batch, offset, batch_ts, [message])
    two = _outcome(encode_batch, offset, batch_ts, [message, Message(value=b"v")])
    if isinstance(two[0], bytes):
        data, lengths, count = two
        assert one == (data[: -OVERHEAD - 1], lengths[:1], 1)
        ts = batch_ts if ts is None or not own_time else ts
        assert one[0] == hand_encode(offset, ts, type_, bytes(key), bytes(value))
    else:
        assert one == two


@FAST
@given(message_lists(max_size=8), st.data())
def test_truncation_yields_only_whole_messages(messages, data):
    encoded = [encode(*m) for m in messages]
    buf = b"".join(encoded)
    cut = data.draw(st.integers(min_value=0, max_value=len(buf)))
    got, end = decode(buf[:cut], expected_offset=messages[0].offset if messages else None)
    # The messages that end at or before the cut, and nothing else.
    ends = [sum(map(len, encoded[: i + 1])) for i in range(len(encoded))]
    whole = sum(1 for e in ends if e <= cut)
    assert got == messages[:whole]
    assert end == (ends[whole - 1] if whole else 0)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        # near-valid input: a valid message with some bytes changed
        st.tuples(
            message_lists(max_size=3), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4)
        ).map(
            lambda t: _damage(b"".join(encode(*m) for m in t[0]), t[1])
        ),
    ),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)),
)
def test_decode_of_arbitrary_bytes_raises_only_corruption(buf, expected):
    try:
        messages, end = decode(buf, expected_offset=expected)
    except CorruptionError as exc:
        assert exc.position is not None and 0 <= exc.position <= len(buf)
        return
    # What it returns is exactly what the bytes up to ``end`` hold.
    assert 0 <= end <= len(buf)
    assert b"".join(encode(*m) for m in messages) == buf[:end]
    if expected is not None and messages:
        assert [m.offset for m in messages] == list(range(expected, expected + len(messages)))


def _damage(buf: bytes, changes) -> bytes:
    if not buf:
        return buf
    out = bytearray(buf)
    for position, value in changes:
        out[position % len(out)] = value
    return bytes(out)


def _one_by_one(buf: bytes, expected: int | None):
    """Decode one message per call (``max_messages=1`` never takes the uniform-run path): what
    ``decode`` must return, or the error it must raise."""
    out, pos = [], 0
    while True:
        got, pos_after = decode(buf, pos, None, expected, max_messages=1)
        if not got:
            return out, pos
        out += got
        pos = pos_after
        expected = None if expected is None else expected + 1


@FAST
@given(
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=4),
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=8, max_value=60),
    st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), max_size=3),
    st.one_of(st.none(), st.integers(0, 60)),
    st.booleans(),
)
def test_uniform_runs_decode_and_fail_as_one_by_one(
    first, key_len, value_len, count, changes, odd_at, check_offsets
):
    """Messages of one size are decoded as a run: the same messages, the same end, the same
    error at the same place as decoding them one by one, whatever is damaged or differs."""
    messages = [
        Message(first + i, 10 + i, i % 3, bytes([i % 251]) * key_len, bytes([i % 7]) * value_len)
        for i in range(count)
    ]
    if odd_at is not None and odd_at < count:  # one message of another size in the run
        messages[odd_at] = messages[odd_at]._replace(value=messages[odd_at].value + b"x")
    buf = _damage(b"".join(encode(*m) for m in messages), changes)
    expected = first if check_offsets else None
    try:
        want = _one_by_one(buf, expected)
    except CorruptionError as exc:
        with pytest.raises(CorruptionError) as info:
            decode(buf, expected_offset=expected)
        assert (str(info.value), info.value.position) == (str(exc), exc.position)
        return
    assert decode(buf, expected_offset=expected) == want
    if not changes:
        assert want == (messages, len(buf))
    for most in (1, 9, count - 1):
        got, end = decode(buf, expected_offset=expected, max_messages=most)
        assert got == want[0][:most]


@pytest.mark.parametrize("key_len", [0, 5])
def test_a_value_length_that_makes_the_size_zero_is_damage(tmp_path, key_len):
    # A value length of -(26 + key length) made the message's size 0, and decode's look for a
    # run of messages of one size divided by it: ZeroDivisionError in every reader, in check and
    # in the recovery of a writer opening the journal, which then could not open it at all.
    head = codec.HEADER.pack(0, 1, 0, key_len) + b"k" * key_len
    damaged = head + codec.INT32.pack(-(codec.OVERHEAD + key_len)) + bytes(100)
    with pytest.raises(CorruptionError, match="negative value length"):
        codec.decode(damaged, 0, None, 0)
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b"])
    segment = list_segments(tmp_path)[0]
    sound = segment.path.read_bytes()
    segment.path.write_bytes(sound + codec.HEADER.pack(2, 1, 0, key_len) + damaged[18:])
    assert [p.kind for p in check(tmp_path).problems] == ["tail"]
    with Writer(tmp_path) as writer:  # recovers: cuts the damaged tail, keeps its bytes
        assert writer.append(b"c") == 2
    with Scanner(tmp_path) as scanner:
        assert [m.value for m in scanner.read_batch()] == [b"a", b"b", b"c"]
