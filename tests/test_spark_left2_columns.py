"""A read chunk never holds more keys or values than Arrow's int32 offsets count (2 GiB): past
it decoding stops at a message and goes on in the next batch of columns, instead of reporting
the journal corrupt. The limit is made small here (``columnar.MAX_BINARY``), not the data huge."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Writer  # noqa: E402
from journalq.journal.codec import encode  # noqa: E402
from journalq.spark import columnar, reading  # noqa: E402
from journalq.spark.columnar import decode_columns  # noqa: E402

LIMIT = 1000


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(columnar, "MAX_BINARY", LIMIT, raising=False)


def values_of(cols) -> list[bytes]:
    return [cols.value(i) for i in range(len(cols))]


def test_a_uniform_run_stops_at_the_limit_and_the_next_call_goes_on(small_limit):
    values = [b"%099d" % i for i in range(50)]  # 100 bytes each: 10 a call
    buf = b"".join(encode(i, 1, 0, b"k", v) for i, v in enumerate(values))
    got, pos, calls = [], 0, 0
    while pos < len(buf):
        cols, pos = decode_columns(buf, pos, len(buf), len(got))
        assert len(cols) == 10 and int(cols.value_offsets[-1]) <= LIMIT
        got += values_of(cols)
        calls += 1
    assert got == values and calls == 5


def test_messages_of_many_sizes_stop_at_the_limit_keys_too(small_limit):
    values = [b"v" * (1 + i * 37 % 300) for i in range(60)]
    keys = [b"k" * (i % 100) for i in range(60)]
    buf = b"".join(encode(i, 1, 0, k, v) for i, (k, v) in enumerate(zip(keys, values)))
    for wanted in ({"keys": True, "values": True}, {"keys": True, "values": False}):
        got_keys, pos = [], 0
        while pos < len(buf):
            cols, pos = decode_columns(buf, pos, len(buf), len(got_keys), **wanted)
            assert int(cols.key_offsets[-1]) <= LIMIT
            if wanted["values"]:
                assert int(cols.value_offsets[-1]) <= LIMIT
                assert values_of(cols) == values[len(got_keys) : len(got_keys) + len(cols)]
            got_keys += [cols.key(i) for i in range(len(cols))]
        assert got_keys == keys


def test_a_message_larger_than_the_limit_is_decoded_alone(small_limit):
    values = [b"a" * 10, b"b" * 3000, b"c" * 10]
    buf = b"".join(encode(i, 1, 0, b"", v) for i, v in enumerate(values))
    first, pos = decode_columns(buf, 0, len(buf), 0)
    second, pos = decode_columns(buf, pos, len(buf), 1)
    third, pos = decode_columns(buf, pos, len(buf), 2)
    assert [values_of(c) for c in (first, second, third)] == [[values[0]], [values[1]], [values[2]]]
    assert pos == len(buf)


def test_a_journal_with_more_values_than_a_chunk_holds_is_read_whole_not_called_corrupt(tmp_path, small_limit):
    values = [b"%0*d" % (50 + i % 200, i) for i in range(3000)]  # 450 KB, in one 4 MiB read
    with Writer(tmp_path / "j") as writer:
        writer.append_many(values)
    batches = list(reading.iter_columns(str(tmp_path / "j"), 0, len(values)))
    assert all(int(c.value_offsets[-1]) <= LIMIT for c in batches)
    assert [v for c in batches for v in values_of(c)] == values
    # From inside a segment's chunk: the messages before are passed over across several stops.
    inside = list(reading.iter_columns(str(tmp_path / "j"), 1234, 2900))
    assert [int(o) for c in inside for o in c.offset] == list(range(1234, 2900))
    assert [v for c in inside for v in values_of(c)] == values[1234:2900]
