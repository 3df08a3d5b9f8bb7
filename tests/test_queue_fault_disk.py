"""A full disk and the queue layer's garbage collection: the gc is what frees space, so it must
not wait for a write that the full disk refuses (publishing a channel's cursor makes a file)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

import journalq.queue.channel as channel_module
from journalq.journal import first_offset, read_offset
from journalq.journal.segment import list_segments
from journalq.queue import Broker
from test_queue_gc import PER_SEGMENT, SEGMENT, body, drain


def full_disk_for_cursors(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """From now on every commit of a channel's cursor fails as on a full disk (it writes a new
    file); returns the files refused."""
    refused: list[Path] = []

    def write_offset(file: Path, offset: int, *, sync: bool = True) -> None:
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
