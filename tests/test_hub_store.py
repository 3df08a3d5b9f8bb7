"""The hub's store: copies byte-identical to their sources, read back by offset, bad pushes
refused with nothing changed, and storage failures and shutdowns under a push."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.errors import (
    CorruptionError,
    DamagedPushError,
    HubConflictError,
    HubError,
    HubGapError,
    HubUnavailableError,
    InvalidClientIdError,
    InvalidJournalPathError,
    JournalError,
    OffsetOutOfRangeError,
    StorageError,
)
from journalq.hub import HubStore, Push, RawReader
from journalq.hub import store as store_module
from journalq.hub.protocol import Held
from journalq.journal import Writer
from journalq.journal.codec import decode, encode_batch
from journalq.journal.segment import READ_CHUNK, segment_at
from journalq.server.hub import create_hub_app
from conftest import fifo_at, returned_at_once, size_past_the_end


def write(path: Path, count: int, segment_size: int = 4000, start: int = 0) -> None:
    with Writer(path, segment_size=segment_size) as writer:
        for i in range(start, start + count):
            writer.append(b"v" * (i % 40), key=b"key-%d" % i, type=i % 4)


def segments(path: Path) -> dict[str, bytes]:
    """A journal's segment files by name (journalq's sparse .idx files left out)."""
    return {p.name: p.read_bytes() for p in sorted((path / "jnl").glob("*.jnl"))}


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
    }


def push_all(store: HubStore, client: str, name: str, source: Path, chunk: int = 1000, start: int = 0) -> Held:
    with RawReader(source) as reader:
        offset = start
        while True:
            run = reader.read(offset, chunk)
            if not run.count:
                return store.held(client, name)
            offset = store.push(Push(client, name, run.first, run.segment, run.data)).held.next


@pytest.fixture
def store(tmp_path: Path):
    with HubStore(tmp_path / "hub") as hub:
        yield hub


def test_a_copy_is_byte_identical_segment_by_segment(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "orders", 700)
    held = push_all(store, "c1", "orders", tmp_path / "orders", chunk=777)
    assert held.next == 700 and held.first == 0
    source = segments(tmp_path / "orders")
    assert len(source) > 5 and segments(store.root / "c1.orders") == source
    assert store.status() == {"c1": {"orders": held}}


def test_pushing_again_skips_what_is_held_and_a_copy_follows_appends(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 100)
    push_all(store, "c1", "j", tmp_path / "j")
    with RawReader(tmp_path / "j") as reader:
        run = reader.read(40, 10_000)
    result = store.push(Push("c1", "j", run.first, run.segment, run.data))
    assert (result.appended, result.skipped, result.held.next) == (0, run.count, 100)
    write(tmp_path / "j", 150, start=100)
    assert push_all(store, "c1", "j", tmp_path / "j", start=90).next == 250
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_reading_back_by_client_journal_and_offset(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 300)
    push_all(store, "c1", "j", tmp_path / "j")
    (got,) = store.get("c1", "j", 123)
    assert (got.offset, got.key, got.type) == (123, b"key-123", 3)
    assert [m.offset for m in store.get("c1", "j", 298, 10)] == [298, 299]
    assert store.get("c1", "j", 300) == []
    with pytest.raises(OffsetOutOfRangeError):
        store.get("c1", "j", 301)
    with pytest.raises(HubError, match="holds no journal 'other'"):
        store.get("c1", "other", 0)
    raw = store.read_raw("c1", "j", 10, 1)
    assert raw.first == 10 and raw.count == 1


def test_a_source_that_starts_past_zero_is_copied_from_its_first_segment(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 400)
    oldest = sorted((tmp_path / "j" / "jnl").glob("*"))
    for path in oldest[:4]:  # as retention deletes old segments
        path.unlink()
    first = int(sorted((tmp_path / "j" / "jnl").glob("*.jnl"))[0].stem, 16)
    held = push_all(store, "c1", "j", tmp_path / "j", start=first)
    assert held == Held(first, 400, held.segment) and first > 0
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_shards_keep_their_directory_names(tmp_path: Path, store: HubStore) -> None:
    for name in ("events.1.000", "events.1.001"):
        write(tmp_path / "root" / name, 20)
        push_all(store, "web-1", name, tmp_path / "root" / name)
    assert sorted(p.name for p in store.root.iterdir()) == ["web-1.events.1.000", "web-1.events.1.001"]


def _refused(store: HubStore, tmp_path: Path, error: type[Exception], match: str, push: object) -> None:
    before = snapshot(store.root)
    with pytest.raises(error, match=match):
        store.push(push() if callable(push) else push)  # type: ignore[arg-type]
    assert snapshot(store.root) == before, "a refused push changed the hub's files"


@pytest.fixture
def held_copy(tmp_path: Path, store: HubStore) -> Path:
    write(tmp_path / "j", 50)
    push_all(store, "c1", "j", tmp_path / "j")
    return tmp_path / "j"


def test_a_wrong_client_id_is_refused_and_changes_nothing(tmp_path: Path, store: HubStore, held_copy: Path) -> None:
    data = encode_batch(50, 0, [b"x"])[0]
    for bad in ["", "a.b", "../c1", "c1/j"]:
        _refused(store, tmp_path, InvalidClientIdError, "client id", lambda: Push(bad, "j", 50, 0, data))


def test_paths_that_leave_the_root_are_refused_and_change_nothing(
    tmp_path: Path, store: HubStore, held_copy: Path
) -> None:
    data = encode_batch(0, 0, [b"x"])[0]
    for bad in ["/etc", "..", "../../tmp", "x/../../y", "a/b"]:
        _refused(store, tmp_path, InvalidJournalPathError, "journal path", lambda: Push("c1", bad, 0, 0, data))
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / "c1.escape").symlink_to(outside)
    _refused(store, tmp_path, InvalidJournalPathError, "symbolic link", Push("c1", "escape", 0, 0, data))
    (store.root / "c1.inner").mkdir()
    (store.root / "c1.inner" / "jnl").symlink_to(outside)
    _refused(store, tmp_path, InvalidJournalPathError, "symbolic link", Push("c1", "inner", 0, 0, data))
    (store.root / "c1.file").write_bytes(b"not a journal")
    _refused(store, tmp_path, InvalidJournalPathError, "not a directory", Push("c1", "file", 0, 0, data))
    assert list(outside.iterdir()) == []
    assert store.status() == {"c1": {"j": Held(0, 50, 0)}}  # the links are not copies


def test_a_damaged_message_is_refused_and_changes_nothing(tmp_path: Path, store: HubStore, held_copy: Path) -> None:
    good = encode_batch(50, 0, [b"abc", b"def", b"ghi"])[0]
    damaged = good[: len(good) // 2 + 3] + b"\xff" + good[len(good) // 2 + 4 :]
    _refused(store, tmp_path, DamagedPushError, "damaged|whole message", Push("c1", "j", 50, 0, damaged))
    _refused(store, tmp_path, DamagedPushError, "not a whole message", Push("c1", "j", 50, 0, good[:-2]))
    # Right bytes, wrong first offset: the offsets in the bytes are checked against it.
    _refused(store, tmp_path, DamagedPushError, "offset 50 where 49 was due", Push("c1", "j", 49, 0, good))
    # A new journal is not created by a refused push either.
    _refused(store, tmp_path, DamagedPushError, "damaged", Push("c1", "new", 0, 0, b"\x00" * 30))
    assert not (store.root / "c1.new").exists()


def test_a_gap_is_refused_and_changes_nothing(tmp_path: Path, store: HubStore, held_copy: Path) -> None:
    data = encode_batch(52, 0, [b"x", b"y"])[0]
    _refused(store, tmp_path, HubGapError, "offsets 50 to 51 would be missing", Push("c1", "j", 52, 0, data))
    _refused(store, tmp_path, HubGapError, "segment start", Push("c1", "new", 52, 40, data))


def test_messages_that_differ_from_the_held_ones_are_refused(tmp_path: Path, store: HubStore, held_copy: Path) -> None:
    with RawReader(held_copy) as reader:
        run = reader.read(45, 100_000)
    other = bytearray(run.data)
    other[-5] ^= 0x01  # a value byte of the last held message, plus nothing new
    more = encode_batch(50, 0, [b"new"])[0]
    _refused(store, tmp_path, HubConflictError, "differ", Push("c1", "j", 45, 0, bytes(other) + more))


def test_concurrent_pushes_of_one_journal_store_each_message_once(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 500, segment_size=3000)
    errors: list[BaseException] = []

    def pusher() -> None:
        try:
            push_all(store, "c1", "j", tmp_path / "j", chunk=300)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pusher) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_a_copy_left_empty_restarts_where_the_next_push_starts(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 200)
    (store.root / "c1.j" / "jnl").mkdir(parents=True)
    (store.root / "c1.j" / "jnl" / "0000000000000000.jnl").touch()  # left by a hub that died
    for path in sorted((tmp_path / "j" / "jnl").glob("*"))[:2]:
        path.unlink()
    first = int(sorted((tmp_path / "j" / "jnl").glob("*.jnl"))[0].stem, 16)
    assert push_all(store, "c1", "j", tmp_path / "j", start=first).first == first
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")
    assert not os.path.exists(store.root / "c1.j" / "jnl" / "0000000000000000.jnl")


# -- the journal writer's append_encoded, which the store appends with -----------------------------


def test_a_copy_deleted_while_the_hub_runs_is_copied_anew(tmp_path: Path, store: HubStore) -> None:
    """The writer the hub keeps open for a copy finds its files gone (deleted, to have it copied
    anew): that push is answered as a storage failure (503: the client asks again what the hub
    holds), and the hub lets the writer go instead of failing every later push of the copy."""
    write(tmp_path / "j", 100)
    push_all(store, "c1", "j", tmp_path / "j")
    shutil.rmtree(store.root / "c1.j")
    assert store.held("c1", "j").empty
    with pytest.raises(StorageError, match="c1.j"):
        push_all(store, "c1", "j", tmp_path / "j")
    assert push_all(store, "c1", "j", tmp_path / "j").next == 100
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_a_push_that_the_store_closes_under_leaves_no_writer_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close`` (the hub shutting down) while a push is on its way to open the copy's writer: the
    push is refused as "unavailable" (503: push again later), and closes the writer it opened,
    which ``close`` had not seen. Before, the push went on and its writer stayed open."""
    write(tmp_path / "j", 20)
    store = HubStore(tmp_path / "hub")
    real_start = store_module._start_copy

    def start_then_shut_down(path: Path, offset: int) -> None:
        real_start(path, offset)
        store.close()

    monkeypatch.setattr(store_module, "_start_copy", start_then_shut_down)
    opened: list[Writer] = []
    monkeypatch.setattr(store_module, "Writer", lambda *a, **k: opened.append(Writer(*a, **k)) or opened[-1])
    with pytest.raises(HubUnavailableError, match="shutting down"):
        push_all(store, "c1", "j", tmp_path / "j")
    assert len(opened) == 1 and opened[0].closed
    with pytest.raises(HubUnavailableError, match="shutting down"):  # and every later push
        push_all(store, "c1", "j", tmp_path / "j")


def test_messages_a_push_skips_are_synced_before_it_says_the_hub_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub killed after writing a push but before syncing it leaves those messages in its
    copy, not on stable storage. A client resuming sends the last of them again, to compare:
    the answer, skipped and held up to their end, must not come before they are synced."""
    import journalq.journal.writer as writer_module

    with Writer(tmp_path / "j") as writer:
        writer.append_many([b"m%d" % i for i in range(50)])
    with HubStore(tmp_path / "hub") as store:
        push_all(store, "c1", "j", tmp_path / "j")
    with Writer(tmp_path / "j") as writer:
        writer.append_many([b"m%d" % i for i in range(50, 100)])
    with RawReader(tmp_path / "j") as reader:
        unsynced, last = reader.read(50, 100_000), reader.read(99, 1)
    assert (unsynced.next, last.first, last.count) == (100, 99, 1)
    copy = tmp_path / "hub" / "c1.j" / "jnl" / "0000000000000000.jnl"
    with open(copy, "ab") as f:  # written, as by the killed hub, and never synced
        f.write(unsynced.data)

    synced: list[tuple[int, int]] = []  # (inode, size) of each file synced
    real = writer_module.fdatasync

    def recording(fd: int) -> None:
        real(fd)
        synced.append((os.fstat(fd).st_ino, os.fstat(fd).st_size))

    monkeypatch.setattr(writer_module, "fdatasync", recording)
    with HubStore(tmp_path / "hub") as store:
        result = store.push(Push("c1", "j", last.first, last.segment, last.data))
        assert (result.held.next, result.appended, result.skipped) == (100, 0, 1)
        assert (copy.stat().st_ino, copy.stat().st_size) in synced, "answered before the copy was synced"


def test_append_encoded_writes_the_bytes_as_they_are_and_starts_segments_when_asked(tmp_path: Path) -> None:
    from journalq.errors import CorruptionError

    first = encode_batch(0, 5, [b"a", b"b"])[0]
    second = encode_batch(2, 6, [b"c"])[0]
    with Writer(tmp_path / "j", segment_size=2**40) as writer:
        assert writer.append_encoded(first) == 1
        with pytest.raises(CorruptionError, match="offset 0 where 2 was due"):
            writer.append_encoded(first)
        with pytest.raises(CorruptionError, match="incomplete message"):
            writer.append_encoded(second[:-1])
        assert writer.append_encoded(b"") is None
        assert writer.append_encoded(second, new_segment=True) == 2
        assert writer.next_offset == 3
    assert segments(tmp_path / "j") == {"0000000000000000.jnl": first, "0000000000000002.jnl": second}


def test_two_stores_on_one_root_share_each_copy(tmp_path: Path) -> None:
    """As hub processes serving one root do (``journalq serve --workers N``): each push takes
    the copy's lock and catches up with what the other appended."""
    write(tmp_path / "j", 600, segment_size=2500)
    errors: list[BaseException] = []
    with HubStore(tmp_path / "hub") as one, HubStore(tmp_path / "hub") as two:

        def pusher(store: HubStore) -> None:
            try:
                push_all(store, "c1", "j", tmp_path / "j", chunk=400)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=pusher, args=(s,)) for s in (one, two, one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert segments(tmp_path / "hub" / "c1.j") == segments(tmp_path / "j")


def test_writers_beyond_max_open_are_closed_and_reopened_when_pushed_again(tmp_path: Path) -> None:
    with HubStore(tmp_path / "hub", max_open=2) as store:
        for name in ("a", "b", "c", "d"):
            write(tmp_path / name, 30)
            push_all(store, "c1", name, tmp_path / name, chunk=300)
        assert len(store._writers) == 2
        write(tmp_path / "a", 30, start=30)
        assert push_all(store, "c1", "a", tmp_path / "a", start=25).next == 60
    for name in ("a", "b", "c", "d"):
        assert segments(tmp_path / "hub" / f"c1.{name}") == segments(tmp_path / name)


def test_a_raw_reader_finds_the_first_segment_made_after_it_looked(tmp_path: Path) -> None:
    (tmp_path / "j" / "jnl").mkdir(parents=True)
    with RawReader(tmp_path / "j") as reader:
        assert reader.read(0).count == 0
        write(tmp_path / "j", 3)
        run = reader.read(0)
        assert (run.first, run.count) == (0, 3)
    (tmp_path / "k" / "jnl").mkdir(parents=True)
    with RawReader(tmp_path / "k") as reader:
        assert reader.read(0).count == 0
        (tmp_path / "k" / "jnl" / "000000000000000a.jnl").touch()  # a journal that starts at 10
        with Writer(tmp_path / "k") as writer:
            writer.append(b"ten")
        with pytest.raises(OffsetOutOfRangeError, match="starts at 10"):
            reader.read(0)
        assert reader.read(10).count == 1


@pytest.mark.parametrize("damage", ["segment missing", "cut inside a message"])
def test_a_raw_reader_at_damage_before_the_last_segment_says_so(tmp_path: Path, damage: str) -> None:
    """A finished segment that ends where no segment starts (one lost, or itself cut short inside
    a message) was read as the journal's end: ``hub push --once`` said "caught-up" and exited 0
    with the rest never copied, and a push that follows waited there for ever."""
    with Writer(tmp_path / "j", segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 10)  # 2 messages per segment: 0, 2, 4, 6, 8
    segment = tmp_path / "j" / "jnl" / "0000000000000002.jnl"
    if damage == "segment missing":
        (tmp_path / "j" / "jnl" / "0000000000000004.jnl").unlink()
        reason, due = "offsets 4-5 are missing", 4
    else:
        os.truncate(segment, segment.stat().st_size - 10)  # offset 3 cut short
        reason, due = "incomplete message .* at the end of a finished segment", 3
    for start in (0, 2):  # a segment reached by a roll, or sought
        with RawReader(tmp_path / "j") as reader:
            got = 0
            with pytest.raises(CorruptionError, match=reason) as info:
                while True:
                    run = reader.read(start + got)
                    assert run.count, f"offset {start + got} read as the journal's end"
                    got += run.count
            assert start + got == due and info.value.file == segment


def test_a_raw_reader_at_a_size_past_the_last_segments_end_before_indexed_messages_says_so(tmp_path: Path) -> None:
    """An incomplete message at the last segment's end that the index shows whole messages after
    is damage (a size field that reaches past the end), not an append under way: ``hub push
    --once`` would say "caught-up" with the rest never copied."""
    segment = size_past_the_end(tmp_path / "j", 500)
    with RawReader(tmp_path / "j") as reader:
        got = 0
        with pytest.raises(CorruptionError, match="yet the whole message .* stands after it") as info:
            while True:
                run = reader.read(got)
                assert run.count, f"offset {got} read as the journal's end"
                got += run.count
        assert got == 500 and (info.value.file, info.value.offset) == (segment, 500)


def test_a_raw_reader_seeks_past_a_message_larger_than_one_read(tmp_path: Path) -> None:
    """A journal without journalq's sparse index (sej writes none) is decoded from its segment's
    start to the offset asked for; a message larger than one read (1 MiB) may be on the way, as
    when a push resumes past it."""
    with Writer(tmp_path / "j") as writer:
        writer.append_many([b"x"] * 5 + [b"B" * (READ_CHUNK + 1000)] + [b"y"] * 5)
    for idx in (tmp_path / "j" / "jnl").glob("*.idx"):
        idx.unlink()
    with RawReader(tmp_path / "j") as reader:
        run = reader.read(8, 100)
    assert (run.first, run.count) == (8, 3)
    with HubStore(tmp_path / "hub") as store:
        push_all(store, "c1", "j", tmp_path / "j", chunk=100)
        assert push_all(store, "c1", "j", tmp_path / "j", chunk=100, start=9).next == 11  # a resume
    assert segments(tmp_path / "hub" / "c1.j") == segments(tmp_path / "j")


def test_the_locks_of_copies_go_once_nobody_holds_or_waits_for_them(tmp_path: Path) -> None:
    write(tmp_path / "j", 5)
    with HubStore(tmp_path / "hub", max_open=4) as store:
        for n in range(300):  # a hub that serves many journals keeps no lock per journal it ever saw
            push_all(store, "c1", f"j{n}", tmp_path / "j")
        assert len(store._copy_locks) == 0
        assert len(store._writers) == 4


def test_keyed_locks_let_one_holder_in_per_key_and_keep_no_idle_lock() -> None:
    from journalq.hub.store import KeyedLocks

    locks = KeyedLocks()
    inside: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    counting = threading.Lock()
    errors: list[BaseException] = []

    def worker(key: str) -> None:
        try:
            for _ in range(300):
                with locks.hold(key):
                    with counting:
                        inside[key] += 1
                        most[key] = max(most[key], inside[key])
                    time.sleep(0.0001)  # another thread of the key would come in now, were it let in
                    with counting:
                        inside[key] -= 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(key,)) for key in "abababab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and most == {"a": 1, "b": 1} and len(locks) == 0
    assert locks.acquire("a") and not locks.acquire("a", blocking=False)  # held: refused, not waited for
    assert len(locks) == 1
    locks.release("a")
    assert len(locks) == 0


@pytest.mark.parametrize("lure", ["damaged", "unfinished"])
def test_a_raw_reader_takes_no_index_entry_that_the_segment_does_not_confirm(tmp_path: Path, lure: str) -> None:
    """An index entry that points into a value holding its offset's 8 bytes (a queue's events
    hold offsets) is not where the reader starts: the segment, not the index, says where each
    message is. (Before, a read from the lie's offset on began inside that value: "damage".)"""
    from test_journal_index import lured_journal

    values = lured_journal(tmp_path, lure, sealed=True)
    for offset in range(len(values)):
        with RawReader(tmp_path) as reader:
            run = reader.read(offset)
        messages, _ = decode(run.data, 0, len(run.data), offset)
        assert run.first == offset and messages[0].value == values[offset]


def test_a_copy_started_where_a_fifo_has_its_first_segments_name_is_refused_by_name(store: HubStore) -> None:
    """Starting a copy creates its first segment with a plain open, which waited for ever for the
    reader of a named pipe found with that name (made since the copy's listing): the one refusal
    of what has a segment's name but is no file, as every other opening of a segment."""
    copy = store.copy_path("c1", "j")
    segment_at(copy, 5).path.parent.mkdir(parents=True)
    with fifo_at(segment_at(copy, 5).path) as fifo:
        error = returned_at_once(lambda: store_module._start_copy(copy, 5))
        assert isinstance(error, JournalError) and error.file == fifo, error
        assert error.reason == "not a segment: a special file has a segment's name"


# -- storage failures and shutdowns of the store ---------------------------------------------------


def test_a_full_disk_when_a_copy_starts_is_answered_503_and_the_copy_starts_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting a copy (its directory and first segment) on a full disk is a storage failure as
    any other of a push: ``StorageError``, answered 503 naming the problem, which the pusher
    waits out. It was an ``OSError`` out of the store: a bare 500 'Internal Server Error'."""
    real = store_module.fsync_dir
    full = [True]

    def fsync_dir(path: Path) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path)

    monkeypatch.setattr(store_module, "fsync_dir", fsync_dir)
    data = encode_batch(0, 1, [b"a", b"b"])[0]
    with HubStore(tmp_path / "hub") as store:
        with pytest.raises(StorageError, match="No space left"):
            store.push(Push("c1", "j", 0, 0, data))
    with TestClient(create_hub_app(tmp_path / "hub2"), raise_server_exceptions=False) as http:
        answer = http.post("/hub/v1/journals/c1/j", params={"first": 0, "segment": 0}, content=data)
        assert answer.status_code == 503 and answer.json()["kind"] == "storage"
        assert "No space left" in answer.json()["error"] and answer.headers["retry-after"] == "1"
        full[0] = False
        answer = http.post("/hub/v1/journals/c1/j", params={"first": 0, "segment": 0}, content=data)
        assert answer.status_code == 200 and answer.json()["next"] == 2


def test_a_copy_started_again_after_a_failed_start_syncs_its_entry_in_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first push that made the copy's directory but failed (or died) before syncing the
    root: the push that starts the copy later syncs the root, or a power cut could take the
    copy's directory, with every push acknowledged into it, away."""
    real = store_module.fsync_dir
    synced: list[Path] = []
    fail = [True]

    def fsync_dir(path: Path) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(store_module, "fsync_dir", fsync_dir)
    data = encode_batch(0, 1, [b"a", b"b"])[0]
    with HubStore(tmp_path / "hub") as store:
        with pytest.raises(StorageError):
            store.push(Push("c1", "j", 0, 0, data))
        assert store.push(Push("c1", "j", 0, 0, data)).held.next == 2
    assert store.root in synced and store.root / "c1.j" in synced


def test_a_push_whose_writer_the_closing_store_closed_is_answered_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub shutting down (``close``) just as a push takes the copy's open writer: the push is
    'unavailable' (503: push again), not the writer's 'is closed' error, which the hub answered
    400 and the pusher took for a refusal of the journal."""
    store = HubStore(tmp_path / "hub")
    store.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]))
    real_hold = Writer.hold

    def hold_after_close(writer: Writer):
        store.close()
        return real_hold(writer)

    monkeypatch.setattr(Writer, "hold", hold_after_close)
    with pytest.raises(HubUnavailableError, match="shutting down"):
        store.push(Push("c1", "j", 1, 0, encode_batch(1, 1, [b"b"])[0]))
