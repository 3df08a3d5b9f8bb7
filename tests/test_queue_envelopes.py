"""Envelopes as the journal stores them, read back: one that no sender makes (written by another
tool or an older version: fields of the wrong kinds) is read as damaged, its value all body, never
failing a receive; a stored channel that is not a name leaves the message to every channel."""

from __future__ import annotations

import time

import pytest
from test_queue_dead_letter_moves import broker  # noqa: F401 (fixture)

from journalq.queue import Broker
from journalq.queue.envelope import ENVELOPE_TYPE, Envelope, decode_meta


@pytest.mark.parametrize(
    "meta",
    [
        b'{"g":5}',
        b'{"g":["a"]}',
        b'{"i":7}',
        b'{"d":"inf"}',
        b'{"d":"nan"}',
        b'{"d":1e400}',
        b'{"a":{"x":[1,"v"]}}',
        b'{"f":{"k":1}}',
        b'{"f":["k"]}',
        b'{"d":true}',
        b'{"d":1' + b"0" * 400 + b"}",  # an integer beyond any float
        b'{"a":[1]}',
        b'{"a":{"x":"ab"}}',  # a string of two is no [type, value] pair
        b'{"a":{"x":["String","v","w"]}}',
        b'{"a":{"x":["Text","v"]}}',
        b'{"a":{"x":["BinaryData","YQ=="]}}',
        b'{"a":{"x":["Binary","YQ"]}}',  # base64 cut short
        b"[1]",
        b'{"g":"a"} {}',
    ],
)
def test_a_stored_envelope_that_no_sender_makes_never_fails_a_receive(broker: Broker, meta: bytes) -> None:
    """sej messages carry no checksum, and other tools write the journal: an envelope whose
    fields have the wrong kinds is read as damaged (the value as it is, all body), as the
    format promises, instead of failing every receive of the queue (or storing a bad event)."""
    import struct

    from journalq.journal import Message

    q = broker.queue("jobs")
    value = b"JQ1" + struct.pack(">I", len(meta)) + meta + b"body"
    q.topic._get_writer().append_many([Message(timestamp_ns=time.time_ns(), type=ENVELOPE_TYPE, value=value)])
    q.send(b"next", group_id="g")
    got = q.receive(10)
    assert [m.body for m in got] == [value, b"next"]
    assert q.delete_many([m.receipt for m in got]) == [None, None]
    assert q.stats().available == 0


def test_every_field_is_read_back_as_it_was_sent() -> None:
    from journalq.queue.envelope import Attribute, encode

    sent = Envelope(
        b"body",
        {"s": Attribute("String", "v"), "n": Attribute("Number.int", "7"), "b": Attribute("Binary.raw", b"\x00\xff")},
        1.5,
        {"class": "standard"},
        "d1",
        "g1",
        {"step": 2},
        {"queue": "q", "id": "3"},
        "billing",
    )
    type_, value = encode(sent)
    meta_len = int.from_bytes(value[3:7], "big")
    read = decode_meta(value[7 + meta_len :], value[7 : 7 + meta_len])
    assert read == sent
    assert type(read.delay) is float and read.attributes["b"].value == b"\x00\xff"
    assert decode_meta(b"", b' {"d":3} ') == Envelope(b"", delay=3.0)  # whitespace around, an int delay


def test_a_stored_channel_that_is_not_a_name_leaves_the_message_to_every_channel() -> None:
    assert decode_meta(b"body", b'{"c":5}') == Envelope(b"body")  # not another channel's, finished unseen
    assert decode_meta(b"body", b'{"c":"billing"}') == Envelope(b"body", channel="billing")
