"""Disk space reserved before appends (``journal.space``): a full disk fails an append before any
of it is written, so no reader ever reads a message that the failure takes back.

The full disk is real where it can be (the ``tmpfs`` fixture: a 2 MiB tmpfs, which needs root);
the in-process tests make the reservation fail instead, and run everywhere.
"""

from __future__ import annotations

import errno
import os
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import journalq.journal.index as index_mod
import journalq.journal.writer as writer_mod
from journalq.errors import StorageError
from journalq.journal.codec import OVERHEAD, encode
from journalq.journal.index import read_entries
from journalq.journal.scanner import Scanner
from journalq.journal.inspect import check
from journalq.journal.segment import SPARE, list_segments, scan_segment, segment_at, spare_path
from journalq.journal.space import allocated, release, reserve
from journalq.journal.writer import Writer, split_at_rolls


def can_reserve(directory: Path) -> bool:
    probe = directory / "probe"
    with open(probe, "wb") as f:
        able = reserve(f.fileno(), 0, 4096)
    probe.unlink()
    return able


def segment_stat(w: Writer) -> os.stat_result:
    return os.stat(w.segment.path)


def values(path: Path) -> list[bytes]:
    with Scanner(path, 0) as s:
        return [m.value for m in s]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the writer's segment writes, as they are asked."""
    asked: list[int] = []
    real = writer_mod._write_all

    def write_all(fd: int, data: memoryview) -> None:
        asked.append(len(data))
        real(fd, data)

    monkeypatch.setattr(writer_mod, "_write_all", write_all)
    return asked


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def fill_to(directory: Path, left: int) -> Path:
    """Fill the file system of ``directory`` until about ``left`` bytes are free."""
    filler = directory / "filler"
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, free_bytes(directory) - left))
    return filler


def test_reserve_allocates_without_growing_the_file_and_release_gives_it_back(tmp_path: Path) -> None:
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * 100)
        f.flush()
        assert reserve(f.fileno(), 100, 1024 * 1024)
        stat = os.fstat(f.fileno())
        assert stat.st_size == 100
        assert allocated(stat) >= 1024 * 1024
        release(f.fileno())
        stat = os.fstat(f.fileno())
        assert stat.st_size == 100
        assert allocated(stat) < 64 * 1024
    assert path.read_bytes() == b"x" * 100


def test_a_failed_reservation_writes_nothing_and_the_next_append_gets_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: list[int]
) -> None:
    w = Writer(tmp_path)
    w.append_many([b"kept %d" % i for i in range(3)])
    follower = Scanner(tmp_path, 0, timeout=0.2)
    assert [m.value for m in follower] == [b"kept 0", b"kept 1", b"kept 2"]

    def full(fd: int, offset: int, length: int) -> bool:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_mod, "reserve", full)
    w._reserved = 0  # as if the segment's reservation were used up
    writes.clear()
    with pytest.raises(StorageError, match="No space left on device") as info:
        w.append_many([b"lost %d" % i for i in range(50)])
    assert info.value.errno == errno.ENOSPC and info.value.offset == 3
    assert writes == []  # the disk was found full before a byte was written
    assert list(follower) == []
    monkeypatch.undo()
    assert w.append(b"after") == 3
    w.close()
    assert [m.value for m in follower] == [b"after"]
    follower.close()
    assert values(tmp_path) == [b"kept 0", b"kept 1", b"kept 2", b"after"]


def test_where_nothing_can_be_reserved_appends_go_unreserved_asking_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def cannot(fd: int, offset: int, length: int) -> bool:
        asked.append(length)
        return False

    monkeypatch.setattr(writer_mod, "reserve", cannot)
    with Writer(tmp_path, segment_size=300) as w:
        for i in range(40):
            w.append(b"message %d" % i)
    assert len(asked) == 1
    assert values(tmp_path) == [b"message %d" % i for i in range(40)]


def test_a_batch_bigger_than_the_free_space_is_refused_before_it_is_written(
    tmpfs: Path, writes: list[int]
) -> None:
    w = Writer(tmpfs / "j", sync="always")
    w.append_many([b"kept %d" % i for i in range(10)])
    follower = Scanner(tmpfs / "j", 0, timeout=0.2)
    assert len(list(follower)) == 10
    filler = fill_to(tmpfs, 256 * 1024)
    writes.clear()
    with pytest.raises(StorageError, match="No space left on device"):
        w.append_many([bytes([i]) * 16384 for i in range(40)])  # 640 KiB
    # Nothing was written, so no reader could see any of it (before, a short write put part of
    # the batch in the segment, for a follower to read, before the writer took it back).
    assert writes == []
    assert list(follower) == []
    filler.unlink()
    assert w.append_many([b"a" * 16384] * 40) == 49
    w.close()
    assert len(list(follower)) == 40
    follower.close()
    assert len(values(tmpfs / "j")) == 50


def test_a_nearly_full_disk_still_takes_what_fits(tmpfs: Path) -> None:
    with Writer(tmpfs / "j") as w:
        w.append(b"first")
        fill_to(tmpfs, 24 * 1024)
        # The room ahead (64 KiB and more) is not there; the message's own 8 KiB is.
        assert w.append(b"b" * 8192) == 1
    assert values(tmpfs / "j") == [b"first", b"b" * 8192]


def test_closing_gives_back_what_was_reserved(tmp_path: Path) -> None:
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    w = Writer(tmp_path)
    w.append(b"small")
    assert allocated(segment_stat(w)) >= 64 * 1024  # reserved ahead
    w.close()
    stat = os.stat(w.segment.path)
    assert allocated(stat) < 64 * 1024 and stat.st_size == len(b"small") + OVERHEAD


def test_opening_gives_back_what_a_killed_writer_had_reserved(tmp_path: Path) -> None:
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    w = Writer(tmp_path)
    w.append(b"x")
    w._reserved = 0
    w._reserve(w._seg_len + 1)  # 64 KiB and more, as a writer would before it was killed
    segment = w.segment.path
    os.close(w._fd)  # no close(): nothing given back
    w._fd = -1
    w._lock.close()
    assert allocated(os.stat(segment)) >= 64 * 1024
    with Writer(tmp_path) as again:
        assert allocated(segment_stat(again)) < 64 * 1024
        assert again.append(b"y") == 1


def test_a_shared_writer_reserves_again_what_another_gave_back(tmp_path: Path) -> None:
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    first = Writer(tmp_path, shared=True)
    first.append(b"one")
    assert allocated(segment_stat(first)) >= 64 * 1024
    second = Writer(tmp_path, shared=True)  # opening gives back what the first reserved
    assert allocated(segment_stat(first)) < 64 * 1024
    # The first sees its reservation gone when it next holds the lock, and makes it again:
    # had it trusted its own count, this append (past the blocks left) would go unreserved.
    first.append(b"two" * 4096)
    assert allocated(segment_stat(first)) >= 64 * 1024
    second.append(b"three")
    first.close()
    second.close()
    assert values(tmp_path) == [b"one", b"two" * 4096, b"three"]


def test_a_full_disk_on_the_index_does_not_fail_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Writer(tmp_path, index_interval=64)
    w.append_many([b"v" * 40] * 4)
    entries_before = read_entries(w.segment)
    assert entries_before

    class FullIndexDisk:
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def write(self, fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(index_mod, "os", FullIndexDisk())
    # Its messages are in the segment, for readers to see: taking them back would be too late.
    assert w.append_many([b"w" * 40] * 8) == 11
    assert w.append_many([b"z" * 40] * 8) == 19
    monkeypatch.undo()
    assert read_entries(w.segment) == entries_before  # the index stopped where it was
    w.close()
    with Writer(tmp_path, index_interval=64) as again:  # rebuilt by the next writer
        rebuilt = scan_segment(again.segment, 0, again.segment.base, last_indexed=0, interval=64).entries
        assert read_entries(again.segment) == rebuilt
        assert len(read_entries(again.segment)) > len(entries_before)
    with Scanner(tmp_path, 15) as s:
        assert next(iter(s)).value == b"z" * 40
    assert len(values(tmp_path)) == 20


def test_a_shared_writer_closes_quietly_after_its_journal_was_deleted(tmp_path: Path) -> None:
    """A queue deleted by another process takes the journal's directory with it: closing the
    writer has nothing to give back, and no lock file to take (it used to raise trying to)."""
    import shutil

    w = Writer(tmp_path / "j", shared=True)
    w.append(b"x")
    shutil.rmtree(tmp_path / "j")
    w.close()
    assert not (tmp_path / "j").exists()


def test_a_batch_that_rolls_onto_a_full_disk_writes_nothing(tmpfs: Path, writes: list[int]) -> None:
    """What goes past the current segment cannot be reserved before the segment is made, after
    the batch's first part is written; a disk without room for it is found before that part is
    written (it was written, read by followers, then taken back)."""
    w = Writer(tmpfs / "j", segment_size=64 * 1024)
    w.append(b"a" * (56 * 1024))  # the segment's blocks are reserved to its size
    follower = Scanner(tmpfs / "j", 0, timeout=0.2)
    assert len(list(follower)) == 1
    filler = fill_to(tmpfs, 24 * 1024)
    writes.clear()
    batch = [b"b" * 4096, b"c" * 4096, *[b"d" * 8192] * 5]  # 8 KiB here, 40 KiB in the next segment
    with pytest.raises(StorageError, match="No space left on device"):
        w.append_many(batch)
    assert writes == []
    assert list(follower) == []
    filler.unlink()
    assert w.append_many(batch) == 7
    w.close()
    assert len(list(follower)) == 7
    follower.close()


def test_a_segment_started_early_gives_back_what_was_reserved_past_its_end(tmp_path: Path) -> None:
    """A hub's copy starts a segment where its source did, before the current one is full: the
    blocks reserved ahead in the one it leaves were kept for ever (only a close or the next
    writer's opening gave them back, and neither looks at a segment that is not the last)."""
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    w = Writer(tmp_path)
    w.append(b"small")
    left = w.segment.path
    assert allocated(os.stat(left)) >= 64 * 1024  # reserved ahead
    assert w.append_encoded(encode(1, 1, 0, b"", b"next"), new_segment=True) == 1
    assert w.segment.path != left
    stat = os.stat(left)
    assert allocated(stat) < 64 * 1024 and stat.st_size == len(b"small") + OVERHEAD
    w.close()
    assert values(tmp_path) == [b"small", b"next"]


def test_a_shared_writer_that_starts_a_segment_gives_back_what_others_reserved_in_the_old(
    tmp_path: Path,
) -> None:
    """The blocks another shared writer reserved past the old segment's end are given back by
    the writer that starts the next one (under the lock, so no one appends to the old meanwhile):
    the other follows onto the new segment, and never appends to the old one again."""
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    first = Writer(tmp_path, shared=True)
    second = Writer(tmp_path, shared=True)
    second.append(b"one")
    first.append(b"two")  # reserves ahead after the second's message
    left = first.segment.path
    assert allocated(os.stat(left)) >= 64 * 1024
    assert second.append_encoded(encode(2, 1, 0, b"", b"three"), new_segment=True) == 2
    stat = os.stat(left)
    assert allocated(stat) < 64 * 1024 and stat.st_size == 2 * OVERHEAD + len(b"onetwo")
    assert first.append(b"four") == 3
    assert first.segment == second.segment != left
    first.close()
    second.close()
    assert values(tmp_path) == [b"one", b"two", b"three", b"four"]


def test_the_fallocate_called_takes_64_bit_offsets() -> None:
    """``fallocate`` takes ``off_t``, which is 32 bits on 32-bit Linux (i386, armv7) unless
    built for large files; called with 64-bit arguments there, it read the offset's high word
    as the length (0: EINVAL), and every append that reserved failed. ``fallocate64`` takes
    64-bit offsets everywhere (on 64-bit systems it is the same function)."""
    import ctypes
    import sys

    import journalq.journal.space as space_mod

    if not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "fallocate64"):
        pytest.skip("no fallocate64 here")
    assert space_mod._fallocate is not None and space_mod._fallocate.__name__ == "fallocate64"


def test_a_batch_that_rolls_may_use_the_room_kept_for_root_when_run_by_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system keeps some room for root (ext4: 5%), which root's writes take: the check
    before a batch that rolls counted only the room others may use, and refused root a batch
    that fitted (while its single appends, which only reserve, went on)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    real = os.statvfs

    class OnlyRootsRoomLeft:
        def __init__(self, path: object) -> None:
            self._stat = real(path)  # type: ignore[arg-type]

        def __getattr__(self, name: str) -> int:
            return 0 if name == "f_bavail" else getattr(self._stat, name)

    monkeypatch.setattr(writer_mod.os, "statvfs", OnlyRootsRoomLeft)
    with Writer(tmp_path, segment_size=1024) as w:
        assert w.append_many([b"x" * 100] * 30) == 29
    assert len(values(tmp_path)) == 30


def test_a_shared_writer_reserves_again_after_it_cut_a_dead_writers_torn_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cutting the torn tail of a writer that died gives back every block past the cut, this
    writer's reservation too: it must not go on counting it (its next write went unreserved, and
    a full disk then was met mid-write, by the take-back, not before)."""
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    first = Writer(tmp_path, shared=True)
    first.append(b"one")
    assert first._reserved > first._seg_len  # reserved ahead
    with open(first.segment.path, "ab") as torn:  # a shared writer killed mid-append
        torn.write(encode(1, 1, 0, b"", b"x" * 100)[:60])
    asked: list[tuple[int, int]] = []
    real = writer_mod.reserve

    def recorded(fd: int, offset: int, length: int) -> bool:
        asked.append((offset, length))
        return real(fd, offset, length)

    monkeypatch.setattr(writer_mod, "reserve", recorded)
    assert first.append(b"two") == 1
    assert len(first.recoveries) == 1
    assert asked and asked[0][0] == len(b"one") + OVERHEAD  # reserved again from the cut
    first.close()
    assert values(tmp_path) == [b"one", b"two"]


def spares(path: Path) -> list[str]:
    return sorted(name for name in os.listdir(path / "jnl") if SPARE.match(name))


def test_a_batch_that_rolls_reserves_its_new_segments_before_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: list[int]
) -> None:
    """The room of the segments a batch starts is reserved before any of it is written: a disk
    that another journal fills between the check of the room and the roll (here, every
    reservation in another file than the segment appended to fails) fails the batch before it
    writes. It was written up to the roll, read by a follower, then taken back: a message never
    stored, whose offset the next append reused."""
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    w = Writer(tmp_path, segment_size=1024)
    w.append(b"kept")
    follower = Scanner(tmp_path, 0, timeout=0.2)
    assert [m.value for m in follower] == [b"kept"]
    current = os.stat(w.segment.path).st_ino
    real = writer_mod.reserve

    def full_elsewhere(fd: int, offset: int, length: int) -> bool:
        if os.fstat(fd).st_ino != current:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, offset, length)

    monkeypatch.setattr(writer_mod, "reserve", full_elsewhere)
    writes.clear()
    with pytest.raises(StorageError, match="No space left on device") as info:
        w.append_many([b"lost %d" % i + b"." * 200 for i in range(8)])  # two segments' worth
    assert info.value.errno == errno.ENOSPC and info.value.offset == 1
    assert writes == []
    assert list(follower) == []
    assert spares(tmp_path) == []
    monkeypatch.undo()
    assert w.append_many([b"after %d" % i + b"." * 200 for i in range(8)]) == 8
    w.close()
    assert [m.value[:7] for m in follower] == [b"after %d" % i for i in range(8)]
    follower.close()
    assert len(list_segments(tmp_path)) == 2


def test_the_segments_a_batch_starts_keep_the_room_reserved_for_them(tmp_path: Path) -> None:
    """A spare file's blocks become its segment's: the batch's later pieces are written into
    room already there, and no spare file stays."""
    if not can_reserve(tmp_path):
        pytest.skip("this file system cannot reserve space")
    with Writer(tmp_path, segment_size=64 * 1024) as w:
        w.append_many([b"x" * 4000] * 40)  # three segments
        bases = [s.base for s in list_segments(tmp_path)]
        assert len(bases) == 3 and w.segment.base == bases[-1]
        stat = os.stat(w.segment.path)
        assert allocated(stat) >= stat.st_size > 0
        assert spares(tmp_path) == []
    assert values(tmp_path) == [b"x" * 4000] * 40


def test_a_writer_opening_removes_the_spares_a_killed_writer_left(tmp_path: Path) -> None:
    """A spare exists only while its writer holds the journal's lock: one found by a writer that
    takes the lock was left by a writer killed mid-append, and is deleted (with its blocks);
    ``check`` reports one whose process is gone."""
    with Writer(tmp_path) as w:
        w.append(b"kept")
    assert SPARE.match(spare_path(segment_at(tmp_path, 1)).name)  # (this process's: alive)
    leftover = tmp_path / "jnl" / f"{1:016x}.{2**40}.spare"  # a process that cannot be
    with open(leftover, "wb") as f:
        reserve(f.fileno(), 0, 1024 * 1024)
    os.utime(leftover, (1, 1))  # long ago
    report = check(tmp_path)
    assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("segment", leftover, False)]
    assert values(tmp_path) == [b"kept"]  # readers pass it by
    with Writer(tmp_path) as w:
        assert spares(tmp_path) == []
        assert w.append(b"next") == 1
    assert values(tmp_path) == [b"kept", b"next"]
    assert check(tmp_path).problems == []


@given(
    start=st.integers(0, 300),
    sizes=st.lists(st.integers(1, 200), min_size=1, max_size=30),
    segment_size=st.integers(1, 500),
)
def test_a_batch_is_split_where_sej_rolls(start: int, sizes: list[int], segment_size: int) -> None:
    """``split_at_rolls``: pieces that follow each other over the whole batch, each ended by the
    first message that reaches the segment size (counted from its segment's start), and no
    other message reaching it."""
    starts = list(accumulate(sizes, initial=start))
    pieces = split_at_rolls(starts, segment_size)
    assert [first for first, _, _ in pieces] == [0] + [end for _, end, _ in pieces[:-1]]
    assert pieces[-1][1] == len(sizes)
    for k, (first, end, shift) in enumerate(pieces):
        assert shift == (0 if k == 0 else starts[first])
        ends = [starts[i + 1] - shift for i in range(first, end)]
        assert all(e < segment_size for e in ends[:-1])
        assert k == len(pieces) - 1 or ends[-1] >= segment_size
