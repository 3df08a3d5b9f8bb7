"""Recovery of a segment's tail: cut what is not a whole, valid message, and keep it.

A crash can leave the last segment ending in part of a message; damage can leave anything. The
writer trusts nothing past the last valid message: it moves the bytes after it into
``DIR/cut/<segment>@<position>`` (synced before the segment is shortened, so nothing is ever lost
unseen), truncates the segment there and reports what it did.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from journalq.errors import CorruptionError, format_timestamp
from journalq.journal.segment import Segment, SegmentScan

log = logging.getLogger("journalq.journal")


@dataclass(frozen=True)
class Recovery:
    """What recovery cut from a segment."""

    file: Path
    position: int
    next_offset: int
    last_timestamp_ns: int | None
    cut_bytes: int
    saved_to: Path
    reason: str

    def __str__(self) -> str:
        return (
            f"recovered {self.file}: cut {self.cut_bytes} bytes at byte {self.position} "
            f"(where offset {self.next_offset} was due; last message kept has timestamp "
            f"{format_timestamp(self.last_timestamp_ns)}), because: {self.reason}; "
            f"the bytes are kept in {self.saved_to}"
        )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cut_tail(root: Path, segment: Segment, scan: SegmentScan) -> Recovery:
    """Save the bytes of ``segment`` after ``scan.end`` beside the journal, then truncate there."""
    cut_dir = root / "cut"
    cut_dir.mkdir(exist_ok=True)
    saved_to = cut_dir / f"{segment.path.name}@{scan.end}"
    with open(segment.path, "r+b") as f:
        f.seek(scan.end)
        bad = f.read()
        with open(saved_to, "wb") as out:
            out.write(bad)
            out.flush()
            os.fsync(out.fileno())
        fsync_dir(cut_dir)
        f.truncate(scan.end)
        f.flush()
        os.fsync(f.fileno())
    problem = scan.problem or CorruptionError("bytes after the last message")
    recovery = Recovery(
        segment.path, scan.end, scan.next_offset, scan.last_timestamp_ns, len(bad), saved_to, problem.reason
    )
    log.warning("%s", recovery)
    return recovery
