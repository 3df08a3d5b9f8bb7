"""Following and reading journals: a closed scanner (plain, sharded, following an empty journal)
refuses to read rather than read again; follows with timeouts longer than poll(2) can wait, and
timeouts that are not finite refused; a follower told at once that its segment was removed; a file
where jnl/ goes named as not a directory; pipeline aggregate's output options checked before Spark
starts. Each test here failed before its fix."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
from journalq.errors import Error, JournalError, TruncatedError
from journalq.journal import Scanner, Writer
from journalq.journal.inspect import check, describe, require_journal
from journalq.journal.segment import list_segments
from journalq.journal.watch import DirectoryWatch
from journalq.shard import ShardedScanner, ShardedWriter


# Over 2**31 - 1 milliseconds (about 24.8 days), the most one poll() can wait.
LONG = 3e6


def _in_thread(call: Callable[[], Any], then: Callable[[], Any], limit: float = 20.0) -> Any:
    """``call()`` in a thread, ``then()`` here once it waits; what ``call`` returned, or raised."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.2)  # let it wait
    then()
    thread.join(limit)
    assert not thread.is_alive(), "still waiting"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _journal(path: Path, n: int) -> Path:
    with Writer(path) as writer:
        for i in range(n):
            writer.append(b"%d" % i)
    return path


def test_a_closed_scanner_refuses_to_read_rather_than_read_again(tmp_path: Path) -> None:
    """Once closed, a scanner reopened its segment at the start and gave the messages again."""
    path = _journal(tmp_path / "j", 5)
    scanner = Scanner(path)
    assert [m.offset for m in scanner.read_batch(2)] == [0, 1]  # 3 more decoded, not handed out
    scanner.close()
    assert scanner.offset == 2  # still says where it stopped
    with pytest.raises(JournalError, match="scanner is closed"):
        scanner.read_batch()
    with pytest.raises(JournalError, match="scanner is closed"):
        list(scanner)
    scanner.close()  # twice is harmless
    assert scanner.offset == 2
    with Scanner(path, scanner.offset) as resumed:
        assert [m.offset for m in resumed] == [2, 3, 4]


def test_closing_a_scanner_mid_iteration_ends_it_with_the_error(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j", 5)
    scanner = Scanner(path)
    iteration = iter(scanner)
    assert next(iteration).offset == 0
    scanner.close()
    with pytest.raises(JournalError, match="scanner is closed"):
        next(iteration)
    assert scanner.offset == 1


def test_a_closed_following_scanner_of_an_empty_journal_refuses_to_read(tmp_path: Path) -> None:
    """With no segment open (an empty journal), a read looked for one again, as if never closed."""
    path = tmp_path / "j"
    Writer(path).close()
    scanner = Scanner(path, timeout=0)
    assert scanner.read_batch() == []
    scanner.close()
    with pytest.raises(JournalError, match="scanner is closed"):
        scanner.read_batch()


def test_a_watch_waits_longer_than_poll_can(tmp_path: Path) -> None:
    """A wait over 2**31 - 1 ms raised OverflowError from poll (inotify's read)."""
    with DirectoryWatch(tmp_path) as watch:
        assert _in_thread(lambda: watch.wait(LONG), lambda: (tmp_path / "new").write_bytes(b"x")) is True


def test_a_wait_without_end_wakes_to_look_again_at_least_every_second(tmp_path: Path) -> None:
    """A signal that comes as a wait begins is handled only when the wait's system call returns:
    an endless wait ignored Ctrl-C for good (``scan --follow``, 1 time in 10-20 when the signal came
    just after an append). A wait with no timeout, or a long one, now says "look again" (True,
    nothing changed) within about a second, and the caller waits anew."""
    with DirectoryWatch(tmp_path) as watch:
        for timeout in (None, LONG):
            started = time.monotonic()
            assert watch.wait(timeout) is True
            assert time.monotonic() - started < 10


def test_a_scanner_follows_with_a_timeout_longer_than_poll_can_wait(tmp_path: Path) -> None:
    """``journalq scan J --timeout 3e6`` gave a traceback (OverflowError) instead of waiting."""
    path = _journal(tmp_path / "j", 2)
    with Scanner(path, 2, timeout=LONG) as scanner, Writer(path) as writer:
        batch = _in_thread(scanner.read_batch, lambda: writer.append(b"late"))
    assert [(m.offset, m.value) for m in batch] == [(2, b"late")]


def test_a_sharded_scanner_follows_with_a_timeout_longer_than_poll_can_wait(tmp_path: Path) -> None:
    with ShardedWriter(tmp_path, "e", 1) as writer:
        shard, offset = writer.append(b"first", key=b"k")
        with ShardedScanner(tmp_path, {shard: offset + 1}, timeout=LONG) as scanner:
            got = _in_thread(scanner.read_batch, lambda: writer.append(b"late", key=b"k"))
    assert got is not None
    name, batch = got
    assert (name, [m.value for m in batch]) == (shard, [b"late"])


@pytest.mark.parametrize("timeout", [math.inf, -math.inf, math.nan])
def test_a_timeout_that_is_not_finite_is_refused(tmp_path: Path, timeout: float) -> None:
    """inf passed the check (and then overflowed the wait), though the command line refuses it
    and None already means waiting for ever."""
    path = _journal(tmp_path / "j", 1)
    with pytest.raises(Error, match=r"timeout must be a finite number of seconds, 0 or more .*not (inf|-inf|nan)"):
        Scanner(path, timeout=timeout)
    with pytest.raises(Error, match="timeout must be a finite number of seconds"):
        ShardedScanner(path, timeout=timeout)


def test_a_file_where_jnl_goes_is_named_not_a_directory(tmp_path: Path) -> None:
    """It was called "not a journal directory: it has no jnl/ subdirectory", which it has, as a
    file; the rest of the journal layer says "not a directory" and names the file."""
    path = tmp_path / "j"
    path.mkdir()
    (path / "jnl").write_bytes(b"")
    for look in (require_journal, describe, check):
        with pytest.raises(JournalError, match=r"^not a directory \(.*/j/jnl\)$"):
            look(path)


@pytest.mark.parametrize(
    ("outputs", "error"),
    [
        ((), "give an output topic (--output-topic) or journal (--output-journal)"),
        (("--output-topic", "stats", "--output-journal", "OUT"), "give an output journal or an output topic, not both"),
        (("--output-topic", "stats"), "an output topic lives in the data directory: give --data"),
        (("--output-topic", "../x", "--data", "DATA"), "topic name '../x'"),
    ],
)
def test_pipeline_aggregate_checks_its_output_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outputs: tuple[str, ...], error: str
) -> None:
    """The output options were first checked by the pipeline, once Spark had started (half a
    minute here) before the one-line error."""
    import journalq.cli.pipeline as pipeline

    def no_spark(*args: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(pipeline, "_session", no_spark)
    journal = _journal(tmp_path / "j", 1)
    (tmp_path / "data").mkdir()
    places = {"OUT": str(tmp_path / "out"), "DATA": str(tmp_path / "data")}
    args = ["pipeline", "aggregate", "--journal", str(journal), "--parquet", str(tmp_path / "pq"),
            "--checkpoint", str(tmp_path / "cp"), *(places.get(a, a) for a in outputs)]
    if "--data" in args:  # the source is then a topic of the data directory, which needs one
        args[2:4] = ["--topic", "events"]
        with Writer(tmp_path / "data" / "events") as writer:
            writer.append(b"{}")
        (tmp_path / "data" / "events" / "queue.json").write_text("{}")
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 1
    assert result.output.startswith(f"journalq: error: {error}")
    assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "cp").exists()


def test_a_follower_learns_at_once_that_its_segment_was_removed(tmp_path):
    # A failed append's new segment is taken back by unlinking it. The watch did not wake for a
    # deletion: a follower in that segment slept until the next append, or its timeout, and then
    # ended as if nothing had happened, the messages it returned from it being gone.
    with Writer(tmp_path) as writer:
        writer.append_many([b"a", b"b", b"c"])
    segment = list_segments(tmp_path)[-1]
    with Scanner(tmp_path, 0, timeout=3) as scanner:
        assert len(scanner.read_batch()) == 3
        timer = threading.Timer(0.2, os.unlink, [segment.path])
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(TruncatedError, match="removed under the scanner"):
                scanner.read_batch()
        finally:
            timer.join()
        assert time.monotonic() - started < 2
