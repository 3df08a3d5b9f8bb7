"""Recovery of a damaged tail when a writer opens: property tests and the cases around them.

The damage is made in the tail of the last segment: the part a writer checks when it opens, from
its last index entry that the segment confirms to the end (the whole segment when it has no index
entry). Damage before that point is outside recovery; see the last test.

The sej format has no checksum: an overwrite that only changes bytes inside a key or a value still
decodes as a message. So what the tests require of the messages at or after the damage is that the
journal, after recovery, holds exactly the messages a scanner yields, at dense offsets, and that
every byte cut is saved.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journalq.errors import CorruptionError
from journalq.journal import Message, Scanner, Writer, end_offset
from journalq.journal.codec import encode
from journalq.journal.index import last_confirmed
from journalq.journal import recovery as recovery_mod
from journalq.journal.inspect import check
from journalq.journal.segment import list_segments

pytestmark = pytest.mark.usefixtures("vectors_untouched")

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

message_specs = st.lists(
    st.tuples(st.binary(max_size=12), st.binary(max_size=160), st.integers(0, 255)),
    min_size=0,
    max_size=40,
)


def write_journal(path: Path, specs, segment_size: int, index_interval: int) -> list[Message]:
    written = []
    with Writer(path, segment_size=segment_size, index_interval=index_interval) as w:
        i = 0
        while i < len(specs):
            if i % 3 == 2:  # a batch now and then
                batch = [
                    Message(timestamp_ns=1000 + j, type=t, key=k, value=v)
                    for j, (k, v, t) in enumerate(specs[i : i + 4], i)
                ]
                w.append_many(batch)
                i += len(batch)
            else:
                k, v, t = specs[i]
                w.append(v, key=k, type=t, timestamp_ns=1000 + i)
                i += 1
    for offset, (k, v, t) in enumerate(specs):
        written.append(Message(offset, 1000 + offset, t, k, v))
    return written


def message_ends(messages: list[Message], base: int) -> list[tuple[int, int]]:
    """(start, end) in the last segment of each message from ``base`` on."""
    out, pos = [], 0
    for m in messages[base:]:
        size = len(encode(*m))
        out.append((pos, pos + size))
        pos += size
    return out


def scan_all(path: Path) -> list[Message]:
    with Scanner(path) as s:
        return list(s)


def check_recovered(path: Path, written: list[Message], intact: int, damaged: bytes, segment_path: Path, exact: bool):
    """Open a writer on the damaged journal and check everything the properties require."""
    with Writer(path) as w:  # must not raise
        recoveries = list(w.recoveries)
        next_offset = w.next_offset
    got = scan_all(path)
    offsets = [m.offset for m in got]
    assert offsets == list(range(len(got))), "offsets are not dense"
    assert len(got) >= intact, f"lost intact messages: {len(got)} < {intact}"
    assert got[:intact] == written[:intact]
    if exact:
        assert len(got) == intact
    assert next_offset == len(got) == end_offset(path)
    # The journal now holds exactly the messages scanned, nothing else.
    assert b"".join(encode(*m) for m in got) == b"".join(p.read_bytes() for p in sorted((path / "jnl").glob("*.jnl")))
    # Nothing was lost unseen: what the segment kept plus what was cut is what was there.
    kept = segment_path.read_bytes()
    assert damaged.startswith(kept)
    cut_files = sorted((path / "cut").iterdir()) if (path / "cut").exists() else []
    if len(kept) < len(damaged):
        assert len(recoveries) == 1
        r = recoveries[0]
        assert r.file == segment_path and r.position == len(kept) and r.next_offset == len(got)
        assert r.cut_bytes == len(damaged) - len(kept)
        assert cut_files == [path / "cut" / f"{segment_path.name}@{len(kept)}"]
        assert cut_files[0].read_bytes() == damaged[len(kept) :]
    else:
        assert recoveries == [] and cut_files == []
    # Appending goes on at the next dense offset; a second opening finds nothing to recover.
    with Writer(path) as w:
        assert w.recoveries == []
        assert w.append(b"after recovery") == len(got)
    assert [m.offset for m in scan_all(path)] == list(range(len(got) + 1))


def last_segment_tail(path: Path):
    segment = list_segments(path)[-1]
    data = segment.path.read_bytes()
    _, checked_from, _ = last_confirmed(segment, len(data))
    return segment, data, checked_from


@st.composite
def journals(draw):
    specs = draw(message_specs)
    segment_size = draw(st.sampled_from([400, 1500, 1 << 20]))
    index_interval = draw(st.sampled_from([64, 4096, 1 << 30]))
    return specs, segment_size, index_interval


@SETTINGS
@given(journals(), st.data())
def test_truncated_tail(journal, data):
    specs, segment_size, index_interval = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        written = write_journal(path, specs, segment_size, index_interval)
        segment, original, checked_from = last_segment_tail(path)
        cut = data.draw(st.integers(min_value=checked_from, max_value=len(original)), label="cut")
        damaged = original[:cut]
        segment.path.write_bytes(damaged)
        ends = message_ends(written, segment.base)
        intact = segment.base + sum(1 for _, end in ends if end <= cut)
        check_recovered(path, written, intact, damaged, segment.path, exact=True)


@SETTINGS
@given(journals(), st.data())
def test_overwritten_tail(journal, data):
    specs, segment_size, index_interval = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        written = write_journal(path, specs, segment_size, index_interval)
        segment, original, checked_from = last_segment_tail(path)
        damaged = bytearray(original)
        if len(original) > checked_from:
            changes = data.draw(
                st.lists(
                    st.tuples(st.integers(checked_from, len(original) - 1), st.integers(0, 255)),
                    min_size=1,
                    max_size=6,
                ),
                label="changes",
            )
            for position, value in changes:
                damaged[position] = value
        damaged = bytes(damaged)
        segment.path.write_bytes(damaged)
        first_bad = next((i for i, (a, b) in enumerate(zip(original, damaged)) if a != b), len(original))
        ends = message_ends(written, segment.base)
        intact = segment.base + sum(1 for _, end in ends if end <= first_bad)
        check_recovered(path, written, intact, damaged, segment.path, exact=first_bad == len(original))


@SETTINGS
@given(journals(), st.binary(min_size=1, max_size=300))
def test_garbage_after_the_tail(journal, garbage):
    specs, segment_size, index_interval = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        written = write_journal(path, specs, segment_size, index_interval)
        segment, original, _ = last_segment_tail(path)
        damaged = original + garbage
        segment.path.write_bytes(damaged)
        check_recovered(path, written, len(written), damaged, segment.path, exact=False)


@SETTINGS
@given(journals(), st.data())
def test_torn_last_write(journal, data):
    """A crash in the middle of a write: the start of one more message (or batch) is there."""
    specs, segment_size, index_interval = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        written = write_journal(path, specs, segment_size, index_interval)
        segment, original, _ = last_segment_tail(path)
        extra = b"".join(encode(len(written) + i, 5, 0, b"key", b"value %d" % i) for i in range(3))
        torn = extra[: data.draw(st.integers(1, len(extra) - 1), label="torn at")]
        damaged = original + torn
        segment.path.write_bytes(damaged)
        whole = sum(
            1 for i in range(3)
            if len(b"".join(encode(len(written) + j, 5, 0, b"key", b"value %d" % j) for j in range(i + 1))) <= len(torn)
        )
        expect = written + [Message(len(written) + i, 5, 0, b"key", b"value %d" % i) for i in range(whole)]
        check_recovered(path, expect, len(expect), damaged, segment.path, exact=True)


def test_cut_files_of_two_recoveries_are_both_kept(tmp_path):
    with Writer(tmp_path) as w:
        w.append_many([b"a" * 10] * 5)
    seg = tmp_path / "jnl" / "0000000000000000.jnl"
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x00" * 7)
    with Writer(tmp_path) as w:
        assert w.recoveries[0].cut_bytes == 7
        w.append(b"b")
    with open(seg, "ab") as f:
        f.write(b"\x01" * 9)
    with Writer(tmp_path) as w:
        assert w.recoveries[0].cut_bytes == 9
    cut = sorted(p.name for p in (tmp_path / "cut").iterdir())
    assert cut == [f"{seg.name}@{size}", f"{seg.name}@{size + 27}"]
    assert (tmp_path / "cut" / cut[0]).read_bytes() == b"\x00" * 7
    assert (tmp_path / "cut" / cut[1]).read_bytes() == b"\x01" * 9


def test_recovery_of_an_empty_journal_directory(tmp_path):
    (tmp_path / "jnl").mkdir()
    (tmp_path / "jnl" / "0000000000000000.jnl").write_bytes(b"\xff" * 10)
    with Writer(tmp_path) as w:
        assert w.next_offset == 0
        assert w.recoveries[0].cut_bytes == 10
        assert w.append(b"x") == 0
    assert [m.value for m in scan_all(tmp_path)] == [b"x"]


def test_scanner_on_an_unrecovered_torn_tail_stops_before_it(tmp_path):
    with Writer(tmp_path) as w:
        w.append_many([b"m%d" % i for i in range(5)])
    with open(tmp_path / "jnl" / "0000000000000000.jnl", "ab") as f:
        f.write(encode(5, 0, 0, b"", b"torn")[:20])
    assert [m.offset for m in scan_all(tmp_path)] == list(range(5))
    assert end_offset(tmp_path) == 5


def test_damage_before_the_last_index_entry_is_reported_not_yielded(tmp_path):
    """Outside what recovery checks: a writer does not cut it, and a scanner stops there with an
    error naming the file and the byte, never yielding the damaged message."""
    with Writer(tmp_path, index_interval=200) as w:
        for i in range(40):
            w.append(b"v" * 50, timestamp_ns=i)  # 76-byte messages
    seg = tmp_path / "jnl" / "0000000000000000.jnl"
    data = bytearray(seg.read_bytes())
    data[76 * 20 + 3] ^= 0xFF  # the offset field of message 20
    seg.write_bytes(bytes(data))
    with Scanner(tmp_path) as s:
        got = []
        with pytest.raises(CorruptionError) as info:
            for m in s:
                got.append(m)
    assert [m.offset for m in got] == list(range(20))
    assert info.value.file == seg and info.value.position == 76 * 20
    assert str(seg) in str(info.value) and "byte 1520" in str(info.value)


def test_a_misnamed_last_segment_is_refused_not_cut(tmp_path):
    """A last segment whose first message is whole and continues the segment before it, but is not
    at the offset the segment's name says, is no torn tail (a crash never rewrites an offset):
    opening a writer refuses it with an error naming the file and both offsets, and cuts nothing
    (it cut the whole segment); check reports it as damage that repair leaves alone."""
    with Writer(tmp_path, segment_size=300) as w:
        for i in range(20):
            w.append(b"v%d" % i)
    last = list_segments(tmp_path)[-1]
    misnamed = last.path.with_name(f"{last.base + 3:016x}.jnl")
    last.path.rename(misnamed)
    data = misnamed.read_bytes()
    with pytest.raises(CorruptionError) as info:
        Writer(tmp_path)
    assert info.value.file == misnamed and info.value.position == 0
    assert f"offset {last.base}" in str(info.value) and f"offset {last.base + 3}" in str(info.value)
    assert misnamed.read_bytes() == data and not (tmp_path / "cut").exists()
    report = check(tmp_path, repair=True)
    assert misnamed.read_bytes() == data and not (tmp_path / "cut").exists()
    assert not report.ok and report.recoveries == []
    # The gap its name makes after the segment before it, and its first message, neither
    # repaired; and its index, left under the old name, an index of no segment: removed.
    assert sorted((p.kind, p.fixed) for p in report.problems) == [
        ("index", True),
        ("journal", False),
        ("segment", False),
    ]
    assert [p.file for p in report.problems if p.kind == "index"] == [last.index_path]


def test_two_recoveries_at_the_same_position_keep_both_cuts(tmp_path):
    """A crash loop: the writer dies again in its first append after a recovery, so the next
    recovery cuts at the same byte. The first cut's bytes must not be written over."""
    with Writer(tmp_path) as w:
        w.append(b"kept")
    seg = tmp_path / "jnl" / "0000000000000000.jnl"
    size = seg.stat().st_size
    for torn in (encode(1, 5, 0, b"", b"first try")[:20], encode(1, 5, 0, b"", b"second try")[:21]):
        with open(seg, "ab") as f:
            f.write(torn)
        with Writer(tmp_path) as w:
            assert w.recoveries[0].position == size and w.recoveries[0].saved_to.read_bytes() == torn
    kept = sorted((tmp_path / "cut").iterdir())
    assert sorted(p.read_bytes() for p in kept) == sorted(
        [encode(1, 5, 0, b"", b"first try")[:20], encode(1, 5, 0, b"", b"second try")[:21]]
    )
    assert kept[0].name == f"{seg.name}@{size}"


def test_the_cut_directory_is_synced_into_the_journal_before_the_segment_is_cut(tmp_path, monkeypatch):
    """What is cut is kept on stable storage before the segment shrinks: the new cut/ directory's
    own entry too, or a power cut could keep the shorter segment and lose cut/ with the bytes."""
    with Writer(tmp_path) as w:
        w.append(b"kept")
    with open(tmp_path / "jnl" / "0000000000000000.jnl", "ab") as f:
        f.write(b"\x01" * 9)
    synced = []
    monkeypatch.setattr(recovery_mod, "fsync_dir", synced.append)
    with Writer(tmp_path) as w:
        assert len(w.recoveries) == 1
    assert synced == [tmp_path, tmp_path / "cut"]


def test_a_recovery_says_the_last_kept_timestamp_only_when_it_read_one(tmp_path):
    """A cut with no message read before it has no timestamp to tell (it used to say the zero
    time, as if the last message kept had one)."""
    from journalq.journal.recovery import Recovery

    base = dict(
        file=tmp_path / "s.jnl", position=40, next_offset=7, cut_bytes=3, saved_to=tmp_path / "cut", reason="torn"
    )
    assert "timestamp" not in str(Recovery(last_timestamp_ns=None, **base))
    stamped = str(Recovery(last_timestamp_ns=1_700_000_000_000_000_000, **base))
    assert "(where offset 7 was due; last message kept has timestamp 2023-11-14T22:13:20.000000000Z)" in stamped


def test_check_repair_lists_the_index_that_the_recovery_rebuilt(tmp_path):
    """``check --repair`` recovers the last segment as a writer does, and the writer rebuilds
    that segment's missing or stale index as it opens it: the repair lists it as fixed, as it
    lists every change it makes (it used to say nothing of it)."""
    with Writer(tmp_path) as w:
        w.append_many([b"v" * 40] * 1000)  # 66 KB: an index of several entries
    segment = list_segments(tmp_path)[-1]
    segment.index_path.unlink()
    with open(segment.path, "ab") as f:
        f.write(encode(1000, 0, 0, b"", b"torn")[:9])
    report = check(tmp_path, repair=True)
    kinds = {(p.kind, p.file, p.fixed) for p in report.problems}
    assert ("tail", segment.path, True) in kinds
    assert ("index", segment.index_path, True) in kinds
    assert any("index is missing; rebuilt by the recovery" in p.reason for p in report.problems)
    assert segment.index_path.exists()
    assert check(tmp_path).problems == []  # and nothing is left
