"""A full disk and the queue layer's garbage collection: the gc is what frees space, so it must
not wait for a write that the full disk refuses (publishing a channel's cursor makes a file)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

import journalq.journal.writer as writer_module
import journalq.queue.channel as channel_module
from journalq.errors import StorageError
from journalq.journal import first_offset, read_offset
from journalq.journal.segment import list_segments
from journalq.queue import Broker
from test_queue_gc import PER_SEGMENT, SEGMENT, body, drain


def full_disk_for_cursors(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """From now on every commit of a channel's cursor fails as on a full disk (it writes a new
    file); returns the files refused."""
    refused: list[Path] = []

    def write_offset(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
        refused.append(file)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

    monkeypatch.setattr(channel_module, "write_offset", write_offset)
    return refused


def test_gc_on_a_full_disk_deletes_what_the_channels_of_this_process_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("events", segment_size=SEGMENT, task_gc_interval=3600)
        topic.send_many([body(i) for i in range(300)])
        fast, slow = topic.channel("fast"), topic.channel("slow")
        assert len(drain(fast)) == 300 and len(drain(slow, 200)) == 200
        refused = full_disk_for_cursors(monkeypatch)
        deleted = broker.gc()["events"]
        assert refused, "no cursor commit was tried"
        assert deleted > 0
        # What the slower channel finished, as this process knows it; nothing it still needs.
        assert 200 - PER_SEGMENT < first_offset(topic.path) <= 200
        assert read_offset(topic.path, "slow") == 0  # never published: the disk is full
        assert drain(slow) == [body(i) for i in range(200, 300)]


def test_a_channel_collects_segments_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A channel's own collection (every ``task_gc_interval``) deletes consumed segments when its
    cursor cannot be published, and the receive that ran it goes on."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, task_gc_interval=0.05)
        queue.send_many([body(i) for i in range(400)])
        assert len(drain(queue, 390)) == 390
        segments = len(list_segments(queue.topic.path))
        refused = full_disk_for_cursors(monkeypatch)
        time.sleep(0.06)
        assert [m.body for m in queue.receive(1)] == [body(390)]
        assert refused, "no cursor commit was tried"
        assert len(list_segments(queue.topic.path)) < segments
        assert 390 - PER_SEGMENT < first_offset(queue.topic.path) <= 390


class _FullUntilGone:
    """The journal writer's ``os``, whose writes fail as on a full disk while ``file`` (a consumed
    segment, whose deletion frees the space) is there."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if self.file.exists():
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


def test_a_channel_whose_state_cannot_grow_still_collects_segments_on_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection's first step is an event in the channel's journal, which the full disk
    refuses: the gc must run all the same (with the state as the journal has it), or the space
    never comes back."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, task_gc_interval=0.05)
        queue.send_many([body(i) for i in range(400)])
        assert len(drain(queue, 390)) == 390
        consumed = list_segments(queue.topic.path)[0].path
        full_disk_for_cursors(monkeypatch)
        disk = _FullUntilGone(consumed)
        monkeypatch.setattr(writer_module, "os", disk)
        time.sleep(0.06)
        with pytest.raises(StorageError) as info:  # the collection could not be recorded ...
            queue.receive(1)
        assert info.value.errno == errno.ENOSPC and disk.refused
        assert not consumed.exists()  # ... but its gc freed the space
        assert 390 - PER_SEGMENT < first_offset(queue.topic.path) <= 390
        assert [m.body for m in queue.receive(1)] == [body(390)]


def test_the_gc_of_a_failed_collection_keeps_what_the_failed_deletes_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer loop's deletes go with its receive's events: when the full disk refuses them,
    the gc that runs anyway counts them as not done (they are not), so their segment stays."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("jobs", segment_size=SEGMENT, task_gc_interval=0.05)
        queue.send_many([body(i) for i in range(400)])
        assert len(drain(queue, 390)) == 390
        held = queue.receive(10, visibility_timeout=600)
        assert [m.body for m in held] == [body(i) for i in range(390, 400)]
        consumed = list_segments(queue.topic.path)[0].path
        full_disk_for_cursors(monkeypatch)
        monkeypatch.setattr(writer_module, "os", _FullUntilGone(consumed))
        time.sleep(0.06)
        with pytest.raises(StorageError):
            queue.receive(1, delete=[m.receipt for m in held])
        assert not consumed.exists()
        assert first_offset(queue.topic.path) <= 390  # not past the deletes that failed
        assert queue.delete_many([m.receipt for m in held]) == [None] * 10  # still in flight
        assert [m.body for m in queue.receive(10)] == []


def test_compaction_on_a_full_disk_keeps_the_older_snapshot_and_the_call_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction appends its snapshot, then points ``snapshot.ofs`` at it (a new file). When the
    full disk refused the pointer, the receive that compacted failed although its deletes were
    recorded (a consumer loop retrying it was then told nothing was deleted); the state
    segments are kept instead, the pointer names the older snapshot, and the call goes on."""
    monkeypatch.setattr(channel_module, "SNAPSHOT_EVERY", 10)
    monkeypatch.setattr(channel_module, "STATE_SEGMENT_SIZE", 4096)
    refused: list[Path] = []
    overwrite_offset = channel_module.overwrite_offset

    def full_for_snapshots(file: Path, offset: int, *, sync: bool = True, inside: Path | None = None) -> None:
        if file.name == "snapshot.ofs":
            refused.append(file)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        overwrite_offset(file, offset, sync=sync, inside=inside)

    with Broker(tmp_path, sync="always") as broker:
        queue = broker.queue("jobs")
        queue.send_many([body(i) for i in range(100)])
        got = queue.receive(9)
        monkeypatch.setattr(channel_module, "overwrite_offset", full_for_snapshots)
        state_segments = len(list_segments(queue.path))
        while got:  # compacts on the way; the last receive deletes the last batch and gets none
            got = queue.receive(9, delete=[m.receipt for m in got])
        assert queue.stats().in_flight == 0
        assert refused, "no compaction was tried"
        assert len(list_segments(queue.path)) >= state_segments  # nothing deleted without the pointer
        assert not (queue.path / "ofs" / "snapshot.ofs").exists()
    with Broker(tmp_path) as broker:  # rebuilt from the first event: everything deleted
        assert broker.queue("jobs").receive(10) == []
        assert broker.queue("jobs").stats().available == 0
