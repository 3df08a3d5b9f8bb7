"""The queue envelope: how attributes, filters, delays and ids travel inside a sej message.

A message sent with nothing but a body is a plain sej message: type 0, the body as the value. A
message with queue metadata has the type ``ENVELOPE_TYPE`` (0xE0) and a value of::

    b"JQ1"                   magic and version
    meta_len   uint32        big-endian
    meta       meta_len bytes of UTF-8 JSON, an object with any of the keys below
    body       the rest

    "a"  attributes: {name: [data_type, value]}; Binary values in base64 (as SQS carries them)
    "d"  delay in seconds (a number) from the message's timestamp
    "f"  filters: {name: value}, both strings
    "i"  deduplication id
    "g"  group id (FIFO: a group in flight with one receive at a time, in order)
    "m"  task metadata, any JSON object
    "s"  where a dead letter came from: {"queue": name, "channel": name, "id": message id,
         "count": receives, "sent_at_ns": when it was first sent, before any move} (the last
         is missing from dead letters of versions before 2026-11-23; "count" counts the
         receives in every queue it was moved from, since 2026-11-23)
    "c"  the one channel of the topic that the message is for (a dead letter redriven back to the
         channel it came from); every other channel finishes it unseen

A value with type 0xE0 but without the magic is read as a plain body, so no stored message can
make a reader fail. Everything here is pure: no I/O.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from journalq.errors import InvalidMessageError, InvalidNameError
from journalq.queue.settings import check_name

ENVELOPE_TYPE = 0xE0
_JSON = json.JSONDecoder()
_MAGIC = b"JQ1"
_META_LEN = struct.Struct(">I")
_PREFIX = len(_MAGIC) + _META_LEN.size

ATTRIBUTE_TYPES = ("String", "Number", "Binary")
_Frozen = TypeVar("_Frozen")

NOT_A_NUMBER = "is not a number"
NUMBER_OUT_OF_RANGE = "is out of range: numbers have up to 38 digits of precision, from -10^128 to 10^126"
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)  # ASCII: no other digits


def number_problem(text: str) -> str | None:
    """What is wrong with ``text`` as the value of a Number attribute (SQS's Number: a decimal
    of up to 38 significant digits, from -10^128 to 10^126): ``NOT_A_NUMBER``,
    ``NUMBER_OUT_OF_RANGE``, or None when it is one."""
    try:
        number = Decimal(text) if _NUMBER.fullmatch(text.strip()) else None
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite():
        return NOT_A_NUMBER
    digits = "".join(map(str, number.as_tuple().digits)).strip("0")
    if len(digits) > 38 or (number != 0 and not -128 <= number.adjusted() <= 126):
        return NUMBER_OUT_OF_RANGE
    return None


@dataclass(frozen=True)
class Attribute:
    """A message attribute as SQS has them: a data type (``String``, ``Number`` or ``Binary``,
    optionally with a custom suffix such as ``Number.float``) and a value."""

    data_type: str
    value: str | bytes

    def __post_init__(self) -> None:
        base = self.data_type.split(".", 1)[0]
        if base not in ATTRIBUTE_TYPES:
            raise InvalidMessageError(f"attribute data type {self.data_type!r} is not String, Number or Binary")
        if (base == "Binary") != isinstance(self.value, bytes):
            raise InvalidMessageError(
                f"a {self.data_type} attribute takes {'bytes' if base == 'Binary' else 'str'}, "
                f"not {type(self.value).__name__}"
            )

    @classmethod
    def of(cls, value: Attribute | str | bytes | int | float) -> Attribute:
        """An attribute from a plain Python value: str, bytes, int or float."""
        if isinstance(value, Attribute):
            return value
        if isinstance(value, bool):
            raise InvalidMessageError("attribute values are str, bytes, int or float, not bool")
        if isinstance(value, str):
            return cls("String", value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return cls("Binary", bytes(value))
        if isinstance(value, (int, float)):
            if isinstance(value, float) and not math.isfinite(value):  # SQS's Number holds finite decimals only
                raise InvalidMessageError(f"a Number attribute must be finite, not {value!r}")
            return cls("Number", repr(value))
        raise InvalidMessageError(f"attribute values are str, bytes, int or float, not {type(value).__name__}")


def checked_attribute(name: str, value: Attribute | str | bytes | int | float) -> Attribute:
    """Attribute ``name`` of a message to send (``Attribute.of(value)``), its Number value
    checked too: one that SQS clients could not read is refused before it is stored. (Stored
    attributes are read back as they are.)"""
    attribute = Attribute.of(value)
    if attribute.data_type.split(".", 1)[0] == "Number":
        problem = number_problem(attribute.value)  # type: ignore[arg-type] - a Number's value is text
        if problem is not None:
            raise InvalidMessageError(f"attribute {name!r}: {attribute.value!r} {problem}")
    return attribute


@dataclass(frozen=True)
class Envelope:
    """A queue message's body and metadata."""

    body: bytes
    attributes: dict[str, Attribute] = field(default_factory=dict)
    delay: float = 0.0
    filters: dict[str, str] = field(default_factory=dict)
    dedup_id: str | None = None
    group_id: str | None = None
    metadata: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    channel: str | None = None

    @property
    def plain(self) -> bool:
        """True when nothing but the body is set: stored as a plain sej message."""
        return not (
            self.attributes or self.delay or self.filters or self.dedup_id is not None
            or self.group_id is not None or self.metadata is not None or self.source is not None
            or self.channel is not None
        )


def encode(envelope: Envelope) -> tuple[int, bytes]:
    """The sej (type, value) that carries ``envelope``."""
    if envelope.plain:
        return 0, envelope.body
    raw = encode_meta(envelope)
    return ENVELOPE_TYPE, b"".join((_MAGIC, _META_LEN.pack(len(raw)), raw, envelope.body))


def encode_meta(envelope: Envelope, *, filters: bool = True) -> bytes:
    """The envelope's metadata alone, as the UTF-8 JSON object described above (without the
    filters when ``filters`` is false: a store that keeps them elsewhere)."""
    meta: dict[str, Any] = {}
    if envelope.attributes:
        meta["a"] = {
            name: [a.data_type, base64.b64encode(a.value).decode() if isinstance(a.value, bytes) else a.value]
            for name, a in envelope.attributes.items()
        }
    if envelope.delay:
        meta["d"] = envelope.delay
    if envelope.filters and filters:
        meta["f"] = envelope.filters
    if envelope.dedup_id is not None:
        meta["i"] = envelope.dedup_id
    if envelope.group_id is not None:
        meta["g"] = envelope.group_id
    if envelope.metadata is not None:
        meta["m"] = envelope.metadata
    if envelope.source is not None:
        meta["s"] = envelope.source
    if envelope.channel is not None:
        meta["c"] = envelope.channel
    try:
        return json.dumps(meta, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"message metadata cannot be stored as JSON: {exc}") from None


def encode_task_metadata(metadata: Any) -> bytes:
    """Task metadata (``set_metadata``) as compact JSON, or ``InvalidMessageError`` when it is
    not JSON (no NaN or infinities either: other readers could not parse them)."""
    try:
        return json.dumps(metadata, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"task metadata must be JSON: {exc}") from None


def decode(type_: int, value: bytes) -> Envelope:
    """The envelope of a stored message; plain (or unreadable) ones are all body."""
    if type_ != ENVELOPE_TYPE or not value.startswith(_MAGIC) or len(value) < _PREFIX:
        return Envelope(value)
    (meta_len,) = _META_LEN.unpack_from(value, len(_MAGIC))
    end = _PREFIX + meta_len
    decoded = decode_meta(value[end:], value[_PREFIX:end])
    return Envelope(value) if decoded is None else decoded  # damaged: the bytes as they are


def decode_meta(body: bytes, raw: bytes) -> Envelope | None:
    """The envelope of ``body`` with the JSON metadata ``raw`` (``encode_meta``'s); None when
    the metadata is damaged."""
    try:
        # ``raw_decode`` of the text: ``json.loads`` of bytes first guesses their encoding, and
        # that wrapper took two thirds of the decoding (~3 µs a message received).
        text = raw.decode().strip(" \t\n\r")  # (the whitespace JSON allows around it)
        meta, end = _JSON.raw_decode(text)
    except ValueError:
        return None
    # What a receive computes with must be of its kind (no sender stores anything else; sej
    # messages carry no checksum, and other tools write journals): a group id hashed and stored
    # in events, a delay turned into nanoseconds, filters compared as strings. JSON gives exact
    # types (no subclasses; ``type(...) is``, which also tells a bool from a number), and an
    # envelope is read for every message received: the checks are inline, each key's only
    # when it is there.
    if end != len(text) or type(meta) is not dict:
        return None
    get = meta.get
    attributes = {}
    stored = get("a")
    if stored is not None:
        if type(stored) is not dict:
            return None
        for name, pair in stored.items():
            if type(pair) is not list or len(pair) != 2:
                return None
            kind, data = pair
            if type(kind) is not str or type(data) is not str:
                return None
            base = kind.partition(".")[0]
            if base == "Binary":
                try:
                    data = base64.b64decode(data)
                except ValueError:
                    return None
            elif base != "String" and base != "Number":
                return None
            attributes[name] = _stored(Attribute, data_type=kind, value=data)
    delay = get("d", 0.0)
    if type(delay) is not float:
        if type(delay) is not int:
            return None
        try:
            delay = float(delay)
        except OverflowError:  # beyond any float: not finite
            return None
    elif not math.isfinite(delay):
        return None
    filters = get("f")
    if filters is None:
        filters = {}
    elif type(filters) is not dict or not all(type(k) is str and type(v) is str for k, v in filters.items()):
        return None
    dedup_id, group_id, channel = get("i"), get("g"), get("c")
    if not (dedup_id is None or type(dedup_id) is str) or not (group_id is None or type(group_id) is str):
        return None
    return _stored(
        Envelope,
        body=body,
        attributes=attributes,
        delay=delay,
        filters=filters,
        dedup_id=dedup_id,
        group_id=group_id,
        metadata=get("m"),
        source=get("s"),
        # A "c" that names no channel is ignored (the message is every channel's), not taken
        # for another channel's, which would finish it unseen.
        channel=channel if type(channel) is str else None,
    )


def _stored(cls: type[_Frozen], **fields: Any) -> _Frozen:
    """A frozen dataclass ``cls`` (``Envelope``, ``Attribute``) made of fields read and checked
    by ``decode_meta``, every one of them given: what its ``__init__`` makes, without a
    checked setattr per field (~1 µs an envelope, once for every message received)."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


def resend(message: Any, **changes: Any) -> dict[str, Any]:
    """What sending ``message`` again takes (an ``Envelope`` or a ``ReceivedMessage``: both have
    these fields): its body, attributes, filters, group and metadata, with ``changes``."""
    return {
        "body": message.body,
        "attributes": message.attributes,
        "filters": message.filters or None,
        "group_id": message.group_id,
        "metadata": message.metadata,
        **changes,
    }


def whole_number(value: Any) -> bool:
    """Whether ``value`` is an integer, 0 or more (not a bool): a count or a time that a dead
    letter's ``source`` may hold (whatever a sender gave it)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def receives_before(source: Any) -> int:
    """How many times the message that a dead letter stands for was received before it came
    here (every queue it went through: SQS's ApproximateReceiveCount goes on across moves); 0
    for a message that is no dead letter, or whose ``source`` holds no count."""
    count = source.get("count") if isinstance(source, dict) else None
    return count if whole_number(count) else 0


def first_sent_ns(source: Any, sent_at_ns: int) -> int:
    """When the message that a dead letter stands for was first sent: for a message that was a dead
    letter already (moved on by its own queue's redrive policy), the time its ``source`` keeps;
    else its own ``sent_at_ns``. (``source`` is whatever a sender gave: only an integer counts.)"""
    first = source.get("sent_at_ns") if isinstance(source, dict) else None
    return first if whole_number(first) else sent_at_ns


def dead_letter_source(queue: str, channel: str, id: str, count: int, env: Envelope, sent_at_ns: int) -> dict[str, Any]:
    """The ``source`` of the dead letter of message ``id`` (sent at ``sent_at_ns``, enveloped in
    ``env``) received ``count`` times in ``queue``'s ``channel``: as SQS keeps them through
    every move, the first send's time and the receives in every queue it went through (a letter
    moved on by its dead-letter queue's own policy counts those there too; that queue's own
    max_receive_count counts only its own: SQS's does, and a lower one would move it on unseen)."""
    return {
        "queue": queue,
        "channel": channel,
        "id": id,
        "count": count + receives_before(env.source),
        "sent_at_ns": first_sent_ns(env.source, sent_at_ns),
    }


_SOURCE_FIELDS = {"queue": "a queue name", "channel": "a channel name", "id": "a message id",
                  "count": "a whole number", "sent_at_ns": "an integer"}


def check_source(source: Any) -> dict[str, Any] | None:
    """A dead letter's ``source`` to send (None, or the mapping described above, any field
    left out), or ``InvalidMessageError`` naming what is wrong: a redrive reads it to send the
    message back, and SQS's attributes read its count and time."""
    if source is None:
        return None
    if not isinstance(source, Mapping):
        raise InvalidMessageError(f"message source must be a mapping of {sorted(_SOURCE_FIELDS)}, not {source!r}")
    for name, value in source.items():
        kind = _SOURCE_FIELDS.get(name)  # (a key of any other kind is an unknown field)
        if kind is None:
            raise InvalidMessageError(f"message source has an unknown field {name!r}: it has {sorted(_SOURCE_FIELDS)}")
        if kind == "a whole number":
            good = whole_number(value)
        elif kind == "an integer":  # a sej message may have no time (0, or Go's zero: negative)
            good = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "a message id":
            good = isinstance(value, str) and 0 < len(value) <= 128
        else:
            try:
                good = bool(check_name(value))
            except InvalidNameError:
                good = False
        if not good:
            raise InvalidMessageError(f"message source field {name!r} must be {kind}, not {value!r}")
    return dict(source)


def source_queue(source: Any) -> tuple[str, str | None] | None:
    """(queue, channel or None) that a stored dead letter's ``source`` names, for a redrive;
    None when it names no queue, or is malformed (stored by a version that did not check it:
    ``check_source``), so that nothing is sent where it does not name."""
    try:
        checked = check_source(source)
    except InvalidMessageError:
        return None
    if checked is None or "queue" not in checked:
        return None
    return checked["queue"], checked.get("channel")


def message_id(offset: int) -> str:
    """A message's id: its offset in the topic, as a string."""
    return str(offset)


def parse_message_id(message_id: str) -> int:
    """The offset of a message id that ``message_id`` made: decimal digits only, with no leading
    zero (``int()`` alone would take True, " 7", "1_0" and "007" too, ids that no message has:
    "007" would name message 7)."""
    if (
        not isinstance(message_id, str)
        or not message_id.isascii()
        or not message_id.isdigit()
        or (message_id[0] == "0" and len(message_id) > 1)
    ):
        raise InvalidMessageError(f"message id {message_id!r} is not one of this queue's ids")
    return int(message_id)
