"""Crashes, power cuts and damage in the files of a channel beside its state journal and in the
journal's events: what a torn or damaged file leaves must be recovered or refused with an error
that names it, and what a change says is durable must be synced in the order that keeps it so."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import journalq.journal.writer as writer_module
import journalq.queue.channel as channel_module
from journalq.errors import CorruptionError
from journalq.journal import Message, Scanner
from journalq.journal.codec import OVERHEAD
from journalq.journal.offsets import read_offset
from journalq.journal.segment import list_segments
from journalq.queue import Broker
from journalq.queue.state import EventKind
from conftest import synced_paths


# -- the channel's token (channel.id) ----------------------------------------------------------------


@pytest.mark.parametrize("torn", [b"", b"\0" * 9, b"3f1\n", b"\xff\xfe garbage"])
def test_a_torn_channel_token_is_made_anew_and_receipts_work_in_every_process(tmp_path: Path, torn: bytes) -> None:
    """``channel.id`` as a power cut can leave it (never synced: empty, or zero-filled) or damaged:
    the channel makes a new token, the same for every process, rather than give out receipts
    that no other process takes as its own."""
    root = tmp_path / "data"
    with Broker(root) as broker:
        broker.queue("jobs").send_many([b"a", b"b"])
    token_file = root / "jobs" / "channels" / "default" / "channel.id"
    token_file.write_bytes(torn)
    with Broker(root) as first, Broker(root) as second:
        received = first.queue("jobs").receive(2)
        assert [m.body for m in received] == [b"a", b"b"]
        second.queue("jobs").delete(received[0].receipt)  # parsed by another channel object
        first.queue("jobs").delete(received[1].receipt)
        assert first.queue("jobs").receive(1) == []
    assert re.fullmatch(r"[0-9a-f]{8}\n", token_file.read_text())


@pytest.mark.parametrize("sync", ["always", "group:5ms", "none"])
def test_a_new_channel_token_reaches_stable_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str) -> None:
    """The token is in every receipt: a power cut that lost it (or left it empty) would make the
    receipts given out before it refused, so it is synced, file and entry, unless ``sync="none"``."""
    root = (tmp_path / "data").resolve()
    with Broker(root, sync=sync) as broker:
        synced = synced_paths(monkeypatch)
        broker.queue("jobs")
    channel = root / "jobs" / "channels" / "default"
    if sync == "none":
        assert not [p for p in synced if p.startswith(str(channel / "channel.id"))]
        return
    contents = [i for i, p in enumerate(synced) if p.startswith(str(channel / "channel.id."))]
    assert contents, synced
    assert str(channel) in synced[contents[-1] :], synced  # then its entry


# -- damaged events in the state journal ---------------------------------------------------------


def _event_bytes(channel: Path, offset: int) -> tuple[Path, int, Message]:
    """The segment holding state event ``offset``, the position of its header, and the event."""
    position = 0
    segment = list_segments(channel)[-1]
    with Scanner(channel, segment.base) as scanner:
        for message in scanner.read_batch():
            if message.offset == offset:
                return segment.path, position, message
            position += OVERHEAD + len(message.key) + len(message.value)
    raise AssertionError(f"no event {offset} in {segment.path}")


@pytest.mark.parametrize(
    "damage",
    [
        "unknown event type",
        "snapshot that is not JSON",
        "delivery too short",
    ],
)
def test_a_damaged_state_event_is_an_error_naming_the_journal_and_offset(tmp_path: Path, damage: str) -> None:
    """sej's messages carry no checksum: a flipped bit in an event's type or value is framed as
    well as before. Applying it must fail with a ``CorruptionError`` that names the channel's
    journal and the event's offset (not a bare ValueError or struct.error), leaving the file as it is."""
    root = tmp_path / "data"
    with Broker(root) as broker:
        queue = broker.queue("jobs")
        queue.send_many([b"a", b"b", b"c"])
        queue.delete(queue.receive(1)[0].receipt)
    channel = root / "jobs" / "channels" / "default"
    with Scanner(channel, 0) as scanner:
        events = {m.type: m.offset for m in scanner.read_batch()}
    target = events[EventKind.DELIVER]
    segment, position, event = _event_bytes(channel, target)
    data = bytearray(segment.read_bytes())
    type_at = position + 16  # after offset and timestamp
    if damage == "unknown event type":
        data[type_at] = 99
    elif damage == "snapshot that is not JSON":
        data[type_at] = EventKind.SNAPSHOT
    else:  # a FINISH read as a DELIVER: 12 bytes where 20 are due
        segment, position, event = _event_bytes(channel, events[EventKind.FINISH])
        target = event.offset
        data[position + 16] = EventKind.DELIVER
    segment.write_bytes(bytes(data))
    with Broker(root) as broker, pytest.raises(CorruptionError) as info:
        broker.queue("jobs")
    assert info.value.file == channel and info.value.offset == target, str(info.value)
    assert "state event" in str(info.value)
    assert segment.read_bytes() == bytes(data)  # nothing cut or rewritten


# -- compaction ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["always", "group:60000ms"])
def test_a_snapshot_is_on_stable_storage_before_snapshot_ofs_points_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    """Compaction points ``ofs/snapshot.ofs`` (synced) at its SNAPSHOT event and deletes the state
    segments before it. Under a group policy the event must be synced first: a power cut that
    kept the pointer and the deletes but not the event would leave a channel that cannot be
    opened (the pointer is past the journal's end) and whose earlier events are gone."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 6)
    synced: list[tuple[str, int]] = []  # (file, its size) at each data sync of a journal
    fdatasync = writer_module.fdatasync

    def noting(fd: int) -> None:
        fdatasync(fd)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))

    monkeypatch.setattr(writer_module, "fdatasync", noting)
    pointed: list[bool] = []
    overwrite_offset = channel_module.overwrite_offset

    def checking(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
        if file.name == "snapshot.ofs":
            channel = file.parent.parent
            segment = list_segments(channel)[-1].path
            with Scanner(channel, offset) as scanner:
                assert scanner.read_batch(1)[0].type == EventKind.SNAPSHOT
            pointed.append((str(segment.resolve()), segment.stat().st_size) in synced)
        overwrite_offset(file, offset, sync=sync, inside=inside)

    monkeypatch.setattr(channel_module, "overwrite_offset", checking)
    with Broker(tmp_path / "data", sync=sync) as broker:
        queue = broker.queue("jobs")
        queue.send_many([b"%d" % i for i in range(20)])
        for _ in range(10):
            queue.delete(queue.receive(1)[0].receipt)
        # A consumer loop's deletes are written with its next events, before a snapshot that
        # its receive makes: the pointer still names the snapshot.
        done: list[str] = []
        while got := queue.receive(1, delete=done):
            done = [m.receipt for m in got]
    assert len(pointed) > 1 and all(pointed), pointed


def compacted_channel(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The channel directory of a queue ``jobs`` under ``root`` (sync="none"): 20 messages sent,
    10 received and deleted one by one, its state compacted every 6 changes."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 6)
    with Broker(root, sync="none") as broker:
        queue = broker.queue("jobs")
        queue.send_many([b"%d" % i for i in range(20)])
        for _ in range(10):
            queue.delete(queue.receive(1)[0].receipt)
    return root / "jobs" / "channels" / "default"


@pytest.mark.parametrize("where", ["past the end", "at the end", "at a later event"])
def test_a_snapshot_pointer_that_names_no_snapshot_is_replayed_from_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """Under ``sync="none"`` a power cut can keep ``snapshot.ofs`` and lose the snapshot it names,
    and the events appended after the restart then take its offsets: wherever the pointer lands
    (past the end, at it, or at an event that is no snapshot), the channel replays the events
    that are left and says so, instead of refusing to open for good or starting its state at an
    event in the middle (which would give out again everything deleted before it)."""
    root = tmp_path / "data"
    channel = compacted_channel(root, monkeypatch)
    pointer = channel / "ofs" / "snapshot.ofs"
    with Scanner(channel, read_offset(channel, "snapshot")) as scanner:
        events = scanner.read_batch()
    assert events[0].type == EventKind.SNAPSHOT and len(events) > 1
    end = events[-1].offset + 1
    lost_at = {"past the end": end + 4, "at the end": end, "at a later event": events[1].offset}[where]
    pointer.write_bytes(lost_at.to_bytes(8, "big"))
    with caplog.at_level("WARNING", logger="journalq.queue"), Broker(root, sync="none") as broker:
        bodies = []
        while got := broker.queue("jobs").receive(10):
            bodies += [m.body for m in got]
    # The snapshot is still there, in the events replayed: nothing deleted comes again.
    assert sorted(bodies) == sorted(b"%d" % i for i in range(10, 20))
    assert "holds no snapshot" in caplog.text and str(pointer) in caplog.text


def test_a_snapshot_pointer_before_its_snapshot_is_taken_without_a_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Versions before 2026-11-29 pointed ``snapshot.ofs`` at the deletes that compaction wrote
    just before its snapshot: the snapshot found after them is taken, with no warning."""
    root = tmp_path / "data"
    channel = compacted_channel(root, monkeypatch)
    snapshot_at = read_offset(channel, "snapshot")
    assert snapshot_at > list_segments(channel)[0].base + 1
    (channel / "ofs" / "snapshot.ofs").write_bytes((snapshot_at - 2).to_bytes(8, "big"))
    replayed: list[int] = []
    apply_events = channel_module.Channel._apply_events

    def noting(self: channel_module.Channel, batch: list[Message]) -> None:
        replayed.append(batch[0].offset)
        apply_events(self, batch)

    monkeypatch.setattr(channel_module.Channel, "_apply_events", noting)
    with caplog.at_level("WARNING", logger="journalq.queue"), Broker(root, sync="none") as broker:
        bodies = [m.body for m in broker.queue("jobs").receive(10)]
    assert replayed[0] == snapshot_at
    assert sorted(bodies) == sorted(b"%d" % i for i in range(10, 20))
    assert "snapshot" not in caplog.text
