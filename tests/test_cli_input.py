"""``journalq write`` and ``journalq queue send`` store lines as they come from a slow producer
(``tail -f log | journalq write DIR``): a batch ends when the input pauses, not only when it fills.
The commands run as subprocesses fed through a pipe that stays open."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from journalq.cli.main import _line_batches
from journalq.journal import Scanner
from journalq.journal.segment import journal_dir

_SCRIPT = Path(sys.executable).parent / "journalq"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "journalq.cli.main"]


def stored(directory: Path) -> list[bytes]:
    if not journal_dir(directory).is_dir():
        return []
    with Scanner(directory) as scanner:
        return [m.value for m in scanner.read_batch() or []]


def eventually(probe: Callable[[], object], expected: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while (got := probe()) != expected:
        assert time.monotonic() < deadline, f"still {got!r}, waiting for {expected!r}"
        time.sleep(0.02)


@pytest.fixture
def producer() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start a command whose standard input is a pipe left open until the test closes it."""
    started: list[subprocess.Popen] = []

    def start(*args: object) -> subprocess.Popen:
        process = subprocess.Popen(
            [*COMMAND, *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def feed(process: subprocess.Popen, data: bytes) -> None:
    assert process.stdin is not None
    process.stdin.write(data)
    process.stdin.flush()


def test_write_stores_each_line_while_the_input_stays_open(tmp_path: Path, producer) -> None:  # noqa: ANN001
    journal = tmp_path / "j"
    process = producer("write", journal)
    feed(process, b"one\n")
    eventually(lambda: stored(journal), [b"one"])
    feed(process, b"two\nthr")  # a line's start: stored only once its end comes
    eventually(lambda: stored(journal), [b"one", b"two"])
    time.sleep(0.2)
    assert stored(journal) == [b"one", b"two"]
    feed(process, b"ee\nlast, with no newline")
    eventually(lambda: stored(journal), [b"one", b"two", b"three"])
    process.stdin.close()
    assert process.wait(timeout=30) == 0, process.stderr.read()
    assert stored(journal) == [b"one", b"two", b"three", b"last, with no newline"]


def read_line(stream: IO[bytes], seconds: float = 20.0) -> bytes:
    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, "no output line"
    return stream.readline()


def test_queue_send_sends_and_prints_each_line_while_the_input_stays_open(tmp_path: Path, producer) -> None:  # noqa: ANN001
    process = producer("queue", "send", "q", "--data", tmp_path / "data", "--sync", "none")
    feed(process, b"first\n")
    first = json.loads(read_line(process.stdout))["id"]
    feed(process, b"second\n")
    second = json.loads(read_line(process.stdout))["id"]
    assert first != second
    process.stdin.close()
    assert process.wait(timeout=30) == 0, process.stderr.read()
    assert process.stdout.read() == b""


def test_a_bad_line_after_a_pause_names_its_number_and_keeps_what_came_before(
    tmp_path: Path, producer  # noqa: ANN001
) -> None:
    journal = tmp_path / "j"
    process = producer("write", journal, "--format", "jsonl")
    feed(process, b'{"value": "a"}\n{"value": "b"}\n')
    eventually(lambda: stored(journal), [b"a", b"b"])
    feed(process, b'{"value": "c"}\nnot json\n')
    process.stdin.close()
    assert process.wait(timeout=30) == 1
    error = process.stderr.read().decode()
    assert error.startswith("journalq: error: line 4: not valid JSON"), error
    assert "nothing from line 3 on was stored; lines before 3 were stored, up to offset 1" in error
    assert stored(journal) == [b"a", b"b"]


def test_a_file_still_gives_full_batches(tmp_path: Path) -> None:
    lines = b"".join(b"%d\n" % i for i in range(10_000))
    path = tmp_path / "lines"
    path.write_bytes(lines)
    with path.open("rb") as stream:
        sizes = [(first, len(batch)) for first, batch in _line_batches(stream)]
    assert sizes == [(1, 4096), (4097, 4096), (8193, 1808)]


def next_within(batches: Iterator[tuple[int, list[bytes]]], seconds: float = 10.0) -> object:
    """``next(batches)``, failing (rather than hanging) if it waits for more input."""
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(next(batches, None)), daemon=True)
    reader.start()
    reader.join(seconds)
    assert got, "the batch waited for more input"
    return got[0]


def test_a_pipe_gives_what_came_so_far_as_one_batch() -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as stream:
        try:
            os.write(write_end, b"a\nb\nc")
            batches = _line_batches(stream)
            assert next_within(batches) == (1, [b"a\n", b"b\n"])  # "c" waits for its end
            os.write(write_end, b"\nd\n")
            assert next_within(batches) == (3, [b"c\n", b"d\n"])
        finally:
            os.close(write_end)  # (before the stream's close, which waits for a reader still in it)
        assert next_within(batches) is None
