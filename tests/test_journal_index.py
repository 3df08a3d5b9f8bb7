"""The sparse offset index: only ever a hint. Whatever happens to it, a seek returns the same."""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from bisect import bisect_right
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journalq.journal import Scanner, Writer, end_offset
from journalq.journal import index as index_mod
from journalq.journal.codec import OVERHEAD
from journalq.journal.index import ENTRY, HEADER, MAGIC, lookup, read_entries, scan_tail, write_index
from journalq.journal.segment import list_segments, scan_segment, segment_at

pytestmark = pytest.mark.usefixtures("vectors_untouched")

INTERVAL = 150


def build(path: Path, count: int = 400, seed: int = 7) -> list:
    rng = random.Random(seed)
    with Writer(path, segment_size=2500, index_interval=INTERVAL) as w:
        i = 0
        while i < count:
            n = rng.choice([1, 1, 1, 4])
            w.append_many([bytes([i % 256]) * rng.randrange(0, 90) for _ in range(n)])
            i += n
    with Scanner(path, 0) as s:
        return list(s)


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "journal"
    messages = build(path)
    return path, messages


@pytest.fixture
def fresh(journal, tmp_path):
    """A copy of the module's journal, to damage."""
    path, messages = journal
    copy = tmp_path / "journal"
    shutil.copytree(path, copy)
    return copy, messages


def check_seeks(path: Path, messages, targets) -> None:
    for k in targets:
        with Scanner(path, k) as s:
            got = next(iter(s), None)
        if k == len(messages):
            assert got is None
        else:
            assert got == messages[k], f"seek to {k}"


def all_targets(messages):
    return range(len(messages) + 1)


def index_files(path: Path) -> list[Path]:
    return sorted((path / "jnl").glob("*.idx"))


def test_the_writer_keeps_valid_sparse_indexes(journal):
    path, messages = journal
    segments = list_segments(path)
    assert len(segments) > 10
    with_entries = 0
    for seg in segments:
        entries = read_entries(seg)
        data = seg.path.read_bytes()
        assert entries == scan_segment(seg, 0, seg.base, interval=INTERVAL).entries
        with_entries += bool(entries)
        last = 0
        for offset, position in entries:
            assert struct.unpack_from(">Q", data, position)[0] == offset
            assert position - last >= INTERVAL
            last = position
    assert with_entries > 5


def test_deleting_indexes_changes_no_seek(fresh):
    path, messages = fresh
    for p in index_files(path):
        p.unlink()
    check_seeks(path, messages, all_targets(messages))


def test_an_index_of_another_segment_changes_no_seek(fresh):
    path, messages = fresh
    files = index_files(path)
    assert len(files) > 3
    contents = [p.read_bytes() for p in files]
    for i, p in enumerate(files):  # each one gets its neighbour's
        p.write_bytes(contents[(i + 1) % len(files)])
    check_seeks(path, messages, all_targets(messages))


DAMAGES = [
    "empty",
    "header only",
    "bad magic",
    "torn last entry",
    "garbage appended",
    "positions shifted",
    "positions past the end",
    "huge positions",
    "offsets shifted",
    "not rising",
    "last entries not rising",
    "an entry before the last ones not rising",
]


def damaged(data: bytes, damage: str) -> bytes:
    """An index's bytes ``data`` with the damage named (one of ``DAMAGES``)."""
    header, body = data[: HEADER.size], data[HEADER.size :]
    entries = list(ENTRY.iter_unpack(body))
    if damage == "empty":
        return b""
    if damage == "header only":
        return header
    if damage == "bad magic":
        return b"JQIDX999" + data[8:]
    if damage == "torn last entry":
        return data + ENTRY.pack(10**6, 10**6)[:9]
    if damage == "garbage appended":
        return data + os.urandom(48)
    if damage == "positions shifted":  # each entry names the position of another message
        return header + b"".join(ENTRY.pack(o, p + OVERHEAD) for o, p in entries)
    if damage == "positions past the end":
        return header + b"".join(ENTRY.pack(o, p + 10**6) for o, p in entries)
    if damage == "huge positions":  # past what a file offset (off_t) can hold
        return header + b"".join(ENTRY.pack(o, 2**64 - 1 - p) for o, p in entries)
    if damage == "offsets shifted":
        return header + b"".join(ENTRY.pack(o + 1, p) for o, p in entries)
    if damage == "not rising":
        return header + b"".join(ENTRY.pack(o, p) for o, p in reversed(entries))
    if damage == "last entries not rising":
        return header + b"".join(ENTRY.pack(o, p) for o, p in entries[:-2] + entries[-2:][::-1])
    if damage == "an entry before the last ones not rising":
        middle = len(entries) // 2
        return header + b"".join(ENTRY.pack(*e) for e in entries[:middle] + [(0, 0)] + entries[middle + 1 :])
    raise AssertionError(damage)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_indexes_change_no_seek(fresh, damage):
    path, messages = fresh
    for p in index_files(path):
        p.write_bytes(damaged(p.read_bytes(), damage))
    check_seeks(path, messages, all_targets(messages))
    with Writer(path, segment_size=2500, index_interval=INTERVAL) as w:  # and a writer opens
        assert w.recoveries == []
        assert w.append(b"after") == len(messages)


@pytest.mark.parametrize("damage", [None, *DAMAGES])
def test_a_segments_end_read_from_the_tail_of_its_index_is_its_end(fresh, damage, monkeypatch):
    """A journal's end (``end_offset``: a queue's counts, a scrape, a stream's next batch) reads
    the last few entries of the last segment's index (``scan_tail``), not the whole of it (a full
    segment's holds 16,000): whatever the index holds, each segment's end is the one a scan of
    the whole segment finds. (The tail made 3 entries: this journal's indexes hold about 16.)"""
    monkeypatch.setattr(index_mod, "_TAIL_ENTRIES", 3)
    path, messages = fresh
    if damage is None:  # the tail decides alone: the whole index is not read

        def whole_index_read(segment):
            raise AssertionError(f"the whole index of {segment} was read")

        monkeypatch.setattr(index_mod, "read_entries", whole_index_read)
    else:
        for p in index_files(path):
            p.write_bytes(damaged(p.read_bytes(), damage))
    for segment in list_segments(path):
        assert scan_tail(segment).next_offset == scan_segment(segment, 0, segment.base).next_offset, segment
    assert end_offset(path) == len(messages)


def test_a_segment_cut_back_below_its_last_entries_ends_where_it_was_cut(tmp_path, monkeypatch):
    """A segment cut back (an append taken back after its sync failed) below the last entries of
    its index: its end is that of what it holds, whether the tail still has an entry below the
    cut or none."""
    monkeypatch.setattr(index_mod, "_TAIL_ENTRIES", 3)
    with Writer(tmp_path, index_interval=INTERVAL) as w:
        w.append_many([b"%d" % i * 10 for i in range(400)])
    (last,) = list_segments(tmp_path)
    entries = read_entries(last)
    assert len(entries) > 6
    for entry in (entries[-2], entries[2]):  # (the tail's second last; one well before the tail)
        os.truncate(last.path, entry[1])
        assert scan_tail(last).next_offset == entry[0] == end_offset(tmp_path)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.data())
def test_random_damage_to_indexes_changes_no_seek(journal, data):
    source, messages = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal"
        shutil.copytree(source, path)
        files = index_files(path)
        for p in data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=4, unique=True), label="files"):
            raw = bytearray(p.read_bytes())
            for position, value in data.draw(
                st.lists(st.tuples(st.integers(0, max(0, len(raw) - 1)), st.integers(0, 255)), min_size=1, max_size=8),
                label="changes",
            ):
                if raw:
                    raw[position] = value
            cut = (
                data.draw(st.integers(0, len(raw)), label="cut") if data.draw(st.booleans(), label="truncate")
                else len(raw)
            )
            p.write_bytes(bytes(raw[:cut]))
        targets = data.draw(st.lists(st.integers(0, len(messages)), min_size=20, max_size=40), label="targets")
        check_seeks(path, messages, targets)


def test_the_index_of_a_sealed_segment_is_rebuilt_after_a_seek(tmp_path):
    path = tmp_path / "journal"
    with Writer(path, segment_size=20_000) as w:  # the default index interval: 4096 bytes
        for i in range(0, 800, 8):
            w.append_many([b"%d" % i * 20] * 8)
    with Scanner(path, 0) as s:
        messages = list(s)
    segments = list_segments(path)
    assert len(segments) > 3
    sealed = segments[1]
    good = read_entries(sealed)
    assert good, "the segment should have index entries"
    target = good[-1][0] + 1  # well inside the segment
    for damage in (lambda p: p.unlink(), lambda p: p.write_bytes(b"junk")):
        damage(sealed.index_path)
        check_seeks(path, messages, [target])
        assert sealed.index_path.exists()
        assert read_entries(sealed) == scan_segment(sealed, 0, sealed.base).entries
        assert read_entries(sealed)  # a real index, usable by the next seek
    # A seek into the segment where the index was rebuilt does not rebuild it again.
    mtime = sealed.index_path.stat().st_mtime_ns
    check_seeks(path, messages, [target, target + 1, sealed.base])
    assert sealed.index_path.stat().st_mtime_ns == mtime


def test_a_writer_replaces_a_damaged_index_of_the_last_segment(fresh):
    path, messages = fresh
    last = list_segments(path)[-1]
    with Writer(path, segment_size=2500, index_interval=INTERVAL) as w:
        w.append_many([b"z" * 80] * 5)
    good = read_entries(last)
    assert good
    last.index_path.write_bytes(last.index_path.read_bytes()[:HEADER.size] + ENTRY.pack(good[0][0], good[0][1] + 1))
    with Writer(path, segment_size=2500, index_interval=INTERVAL) as w:
        w.append(b"after")
    entries = read_entries(last)
    data = last.path.read_bytes()
    assert entries and all(struct.unpack_from(">Q", data, p)[0] == o for o, p in entries)
    with Scanner(path, 0) as s:
        assert [m.offset for m in s] == list(range(len(messages) + 6))


# -- lookup: binary search over a large index ------------------------------------------------


class CountingOS:
    def __init__(self) -> None:
        self.preads = 0

    def __getattr__(self, name):
        return getattr(os, name)

    def pread(self, fd, n, position):
        self.preads += 1
        return os.pread(fd, n, position)


def linear(entries, base, offset):
    best = (base, 0)
    for entry in entries:
        if entry[0] <= offset:
            best = entry
        else:
            break
    return best


@pytest.mark.parametrize("count", [0, 1, 2, 3, 100_000])
def test_lookup_agrees_with_a_linear_search(tmp_path, monkeypatch, count):
    rng = random.Random(count)
    base = 1000
    segment = segment_at(tmp_path, base)
    segment.path.parent.mkdir(parents=True)
    entries, offset, position = [], base, 0
    for _ in range(count):
        offset += rng.randint(1, 20)
        position += rng.randint(OVERHEAD, 5000)
        entries.append((offset, position))
    assert write_index(segment, entries)
    last = entries[-1][0] if entries else base
    targets = {base, base + 1, last, last + 1, last + 1000}
    targets.update(o for o, _ in entries[:3])
    targets.update(o - 1 for o, _ in entries[:3])
    targets.update(rng.randint(base, last + 5) for _ in range(2000))
    counting = CountingOS()
    monkeypatch.setattr(index_mod, "os", counting)
    for target in sorted(targets):
        counting.preads = 0
        assert lookup(segment, target) == linear(entries, base, target), target
        # The header, then one entry per halving: never a scan.
        assert counting.preads <= 2 + max(1, len(entries)).bit_length()
    # A torn entry at the end is not read.
    with open(segment.index_path, "ab") as f:
        f.write(ENTRY.pack(last + 10, position + 100)[:11])
    assert lookup(segment, last + 50) == linear(entries, base, last + 50)
    # Binary search with bisect agrees too (another independent oracle).
    keys = [o for o, _ in entries]
    for target in list(targets)[:200]:
        i = bisect_right(keys, target)
        assert lookup(segment, target) == (entries[i - 1] if i else (base, 0))


def test_lookup_without_a_usable_index(tmp_path):
    segment = segment_at(tmp_path, 5)
    segment.path.parent.mkdir(parents=True)
    assert lookup(segment, 10) is None  # missing
    segment.index_path.write_bytes(MAGIC)  # header cut short
    assert lookup(segment, 10) is None
    write_index(segment_at(tmp_path, 6), [(7, 100)])
    shutil.copy(segment_at(tmp_path, 6).index_path, segment.index_path)  # another segment's
    assert lookup(segment, 10) is None
    assert read_entries(segment) == []


# Values that hold offset 7 as the 8 bytes of an offset field (a queue's events hold offsets),
# then what a header read there says: a negative key length, or a value too long for the file.
LURES = {
    "damaged": struct.pack(">Q", 7) + bytes(9) + b"\xff" + b"rest of the value",
    "unfinished": struct.pack(">Q", 7) + bytes(10) + b"\x7f\xff\xff\xff" + b"rest of the value",
}


def lured_journal(path: Path, lure: str, sealed: bool) -> list[bytes]:
    """Ten messages, the fourth's value a lure, and an index of segment 0 whose one entry says
    that offset 7 begins where that value does: a lie that the offset field there confirms."""
    values = [b"v%d" % i if i != 3 else LURES[lure] for i in range(10)]
    with Writer(path, index_interval=1 << 30) as w:
        w.append_many(values)
    if sealed:
        with Writer(path, segment_size=1) as w:
            values.append(b"next segment")
            w.append(values[-1])  # rolls after it: segment 0 is sealed now
            values.append(b"and another")
            w.append(values[-1])
    position = sum(OVERHEAD + len(v) for v in values[:3]) + 18 + 4  # where message 3's value begins
    write_index(list_segments(path)[0], [(7, position)])
    return values


@pytest.mark.parametrize("lure", sorted(LURES))
@pytest.mark.parametrize("sealed", [False, True])
def test_an_entry_pointing_into_a_value_that_holds_its_offset_changes_no_seek(tmp_path, lure, sealed):
    """A lying entry that the offset field at its position confirms: the seek must neither fail
    on a sound segment nor land there. The segment is the authority, never the index."""
    values = lured_journal(tmp_path, lure, sealed)
    for offset in range(len(values)):
        with Scanner(tmp_path, offset) as s:
            message = next(iter(s))
        assert (message.offset, message.value) == (offset, values[offset])


@pytest.mark.parametrize("lure", sorted(LURES))
def test_an_entry_pointing_into_a_value_that_holds_its_offset_cuts_nothing(tmp_path, lure):
    """The writer's recovery starts at the last index entry that the segment confirms: started
    at a lying one, it cut sound messages (from inside one) and went on at the lie's offset."""
    values = lured_journal(tmp_path, lure, sealed=False)
    with Writer(tmp_path) as w:
        assert w.recoveries == []
        assert w.next_offset == len(values)
    with Scanner(tmp_path) as s:
        assert [m.value for m in s] == values


@pytest.mark.parametrize("sizes", [[10, 20, 30, 40], [9000, 10, 9000, 10], [10, 9000, 20000, 5]])
def test_entries_are_confirmed_whatever_the_size_of_their_messages(tmp_path, sizes):
    """``confirms`` reads the bytes around an entry in one go and the rest on their own: every
    true entry is confirmed, small or large messages around it, and one moved is not."""
    from journalq.journal.segment import confirms

    with Writer(tmp_path) as w:
        w.append_many([bytes([65 + i]) * n for i, n in enumerate(sizes)])
    (segment,) = list_segments(tmp_path)
    scan = scan_segment(segment, 0, 0)
    positions = [0]
    for n in sizes[:-1]:
        positions.append(positions[-1] + 26 + n)  # OVERHEAD: 26 bytes around a message with no key
    fd = os.open(segment.path, os.O_RDONLY)
    try:
        for offset, position in enumerate(positions):
            assert confirms(fd, offset, position)
            assert not confirms(fd, offset + 1, position)
            if position:
                assert not confirms(fd, offset, position + 8)
                assert not confirms(fd, offset, position - 4)
    finally:
        os.close(fd)
    assert scan.next_offset == len(sizes)


def test_a_seek_that_rebuilds_an_index_keeps_its_sound_entries_past_damage(tmp_path):
    """A seek whose index entry is stale rebuilds a sealed segment's index from its messages:
    those before the damage only. The entries past it, which the segment confirms, were dropped
    with the stale one, and from then on no seek could get past the damage (every one read into
    it and failed), where before the rebuild they all could (as ``check --repair`` keeps them)."""
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])  # 32-byte messages
    first = list_segments(tmp_path)[0]
    entries = read_entries(first)
    data = bytearray(first.path.read_bytes())
    data[32 * 100 + 7] ^= 0x01  # the offset field of message 100
    first.path.write_bytes(bytes(data))
    past = [e for e in entries if e[1] > 32 * 100]
    assert len(past) > 3
    # One entry past the damage points two bytes off its message: a seek by it rebuilds.
    stale = past[2]
    write_index(first, [e if e != stale else (e[0], e[1] + 2) for e in entries])
    with Scanner(tmp_path, stale[0]) as s:
        assert next(iter(s)).offset == stale[0]
    assert read_entries(first) == [e for e in entries if e != stale]
    with Scanner(tmp_path, past[-1][0] + 1) as s:  # by an entry the rebuild kept
        assert next(iter(s)).offset == past[-1][0] + 1


def test_an_entry_past_damage_with_an_offset_due_before_it_is_not_kept(tmp_path):
    """Past damage, an entry is kept only for an offset the damage left unread: one with an
    offset due before it (where messages were copied over others, say) would lead a seek for
    that offset to the copy, which the segment confirms, instead of to the damage."""
    from journalq.journal.inspect import check

    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])  # 32-byte messages
    first = list_segments(tmp_path)[0]
    data = bytearray(first.path.read_bytes())
    copy = bytearray(data[32 * 100 : 32 * 110])  # messages 100-109 ...
    for i in range(10):
        copy[32 * i + 22] = ord("x")  # ... their values told apart ...
    data[32 * 600 : 32 * 610] = copy  # ... over messages 600-609
    data[32 * 180 + 7] ^= 0x01  # and the offset field of message 180 damaged
    first.path.write_bytes(bytes(data))
    write_index(first, [(105, 32 * 605)])
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.fixed) for p in report.problems] == [("segment", False), ("index", True)]
    assert "(offset 105, byte 19360) is stale" in report.problems[1].reason
    assert read_entries(first) == [(128, 32 * 128)]  # rebuilt: up to the damage
    with Scanner(tmp_path, 105) as s:
        assert next(iter(s)).value == b"v00105"  # not the copy, b"x00105"


# -- scans and seeks that need not read the whole segment ---------------------------------------


def test_a_scan_over_a_huge_message_reads_it_in_few_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scan_segment`` (a writer's opening, ``check``, an index's rebuild) read a message larger
    than its chunk one chunk at a time, joining each to all read before: quadratic, 28 s for a
    message of 200 MiB (the scanner took 0.5 s). It now reads twice as much each time."""
    import journalq.journal.segment as segment_mod
    from journalq.journal.segment import scan_segment

    with Writer(tmp_path) as writer:
        writer.append(b"a")
        writer.append(b"x" * (1 << 20))
        writer.append(b"b")
    monkeypatch.setattr(segment_mod, "READ_CHUNK", 1024)
    reads = 0
    real_pread = os.pread

    def counted(fd: int, n: int, position: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_pread(fd, n, position)

    monkeypatch.setattr(segment_mod.os, "pread", counted)
    scan = scan_segment(segment_at(tmp_path, 0), 0, 0, keep=True)
    monkeypatch.undo()
    assert scan.clean and scan.next_offset == 3
    assert [len(m.value) for m in scan.messages or []] == [1, 1 << 20, 1]
    assert reads <= 16  # log2(1 MiB / 1 KiB) = 10 doublings, and a few more; it was 1,025


def test_a_seek_in_a_read_only_journal_does_not_scan_the_whole_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seek into a sealed segment without index scanned all of it to rebuild the index, even
    where it could not write one: every seek (a reader without write permission, an archive, the
    sej vectors) read the whole segment, 0.38 s for offset 1,000 of a 32 MiB segment against 2 ms.
    It now reads from the segment's start to the offset, as with no index."""
    import journalq.journal.scanner as scanner_mod

    with Writer(tmp_path, segment_size=4096, index_interval=64) as writer:
        writer.append_many([b"x" * 100] * 80)  # segments of 32 messages of 126 bytes
    for index_file in (tmp_path / "jnl").glob("*.idx"):
        index_file.unlink()
    scans: list[int] = []
    real = scanner_mod.scan_segment

    def recorded(segment: object, *args: object, **kwargs: object) -> object:
        scans.append(1)
        return real(segment, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scanner_mod, "scan_segment", recorded)
    (tmp_path / "jnl").chmod(0o555)
    try:
        for offset in (1, 20, 40):
            with Scanner(tmp_path, offset) as scanner:
                assert next(iter(scanner)).offset == offset
        assert scans == []
        assert not list((tmp_path / "jnl").glob("*.idx"))
    finally:
        (tmp_path / "jnl").chmod(0o755)
    with Scanner(tmp_path, 20) as scanner:  # writable again: the index is rebuilt once
        assert next(iter(scanner)).offset == 20
    assert scans == [1] and (tmp_path / "jnl" / f"{0:016x}.idx").exists()
