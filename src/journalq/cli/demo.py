"""``journalq demo``: the library's main features in a few seconds, on a journal in a data directory.

It appends a few thousand messages with a ``Writer`` while a second reader (a ``Scanner`` in a
thread) follows the appends, then seeks into the middle of the journal and commits a named reader
offset, and says what happened in a few lines. Each run appends to the same journal, so running it
again also shows a writer reopening (and, after a crash, recovering) an existing journal.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from journalq.cli.main import counted
from journalq.journal.codec import Message
from journalq.journal.inspect import describe
from journalq.journal.offsets import ReaderOffset, read_offset
from journalq.journal.scanner import Scanner
from journalq.journal.writer import Writer

DEMO_READER = "demo"
_SEGMENT_SIZE = 64 * 1024  # small, so that a few thousand messages span several segments
_BATCH = 100
_FOLLOW_TIMEOUT = 5.0  # the follower gives up after this long without a message: the demo ends


class _Follower(threading.Thread):
    """Follows the journal from ``start`` until it has seen ``expected`` messages, noting for each
    how long after its timestamp (set by the writer) it arrived."""

    def __init__(self, path: Path, start: int, expected: int) -> None:
        super().__init__(name="journalq-demo-follower", daemon=True)
        # Opened here, before the writes begin, so that it starts at the old end of the journal.
        self.scanner = Scanner(path, start, timeout=_FOLLOW_TIMEOUT)
        self.expected = expected
        self.latencies_ns: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.scanner:
                while len(self.latencies_ns) < self.expected and (batch := self.scanner.read_batch()):
                    now = time.time_ns()
                    self.latencies_ns.extend(now - m.timestamp_ns for m in batch)
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def _messages(first: int, count: int) -> Iterator[list[Message]]:
    """The demo's messages in batches: JSON values, keys from ten users."""
    for start in range(0, count, _BATCH):
        yield [
            Message(
                type=1,
                key=f"user-{(first + i) % 10}".encode(),
                value=json.dumps({"n": first + i, "event": "demo", "amount": (first + i) % 97}).encode(),
            )
            for i in range(start, min(start + _BATCH, count))
        ]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def run_demo(path: Path, count: int = 5000) -> Iterator[str]:
    """Run the demonstration on the journal at ``path``, yielding lines that say what it did."""
    with Writer(path, segment_size=_SEGMENT_SIZE) as writer:
        for recovery in writer.recoveries:
            yield f"opening the journal recovered it: {recovery}"
        start = writer.next_offset
        follower = _Follower(path, start, count)
        follower.start()
        began = time.perf_counter()
        for batch in _messages(start, count):
            writer.append_many(batch)
            time.sleep(0.001)  # spread the appends, so that the follower sees them arrive
        elapsed = time.perf_counter() - began
    follower.join(_FOLLOW_TIMEOUT + 1)
    if follower.error is not None:
        raise follower.error

    journal = describe(path)
    yield (
        f"wrote {counted(count, 'message')} to {path} (offsets {start}-{start + count - 1}) in {elapsed:.2f} s; "
        f"the journal now holds {counted(journal.messages, 'message')} in {counted(len(journal.segments), 'segment')}"
    )
    seen = follower.latencies_ns
    latency = f"; latency median {_ms(statistics.median(seen))}, max {_ms(max(seen))}" if seen else ""
    yield f"a follower (a second Scanner, in a thread) saw {len(seen)} of the {count} appends as they came{latency}"

    middle = start + count // 2
    with Scanner(path, middle) as scanner:
        found = scanner.read_batch(3)
    yield f"seeking to offset {middle} (through segment names and the sparse index) reads:"
    for message in found:
        yield f"    {message.offset}  key={message.key.decode()}  value={message.value.decode()}"

    committed = middle + len(found)
    with ReaderOffset(path, DEMO_READER) as reader:
        before = reader.value
        reader.commit(committed)
    yield (
        f"reader offset {DEMO_READER!r}: was {before}, committed {read_offset(path, DEMO_READER)} "
        f"(in {path / 'ofs' / (DEMO_READER + '.ofs')}, 8 bytes, as sej keeps it)"
    )
    yield f"next: journalq info {path}; journalq scan {path} --from {middle} --format text | head -3"
