"""The command's standard streams and interruptions: Ctrl-C, a closed standard input or output, a
reader gone mid-write, a failure part way through the input. The command stops with one line that
says what was stored (or sent, or deleted), and the status a script can act on."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
from journalq.journal import Writer
from journalq.queue import Queue

from test_cli import COMMAND, run


# -- Ctrl-C -----------------------------------------------------------------------------------


def test_ctrl_c_stops_scan_follow_quietly_with_status_130(tmp_path: Path) -> None:
    """Ctrl-C is how a person ends ``scan --follow``: what was read is printed, and the command
    ends with the shell's status for SIGINT, not click's "Aborted!" and status 1."""
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append(b"before")
    follower = subprocess.Popen(
        [*COMMAND, "scan", journal, "--follow", "--format", "text"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"before\n"  # it is following now
        follower.send_signal(signal.SIGINT)
        stdout, stderr = follower.communicate(timeout=20)
    finally:
        follower.kill()
    assert stderr == b"" and stdout == b""
    assert follower.returncode == 130


def test_ctrl_c_during_receive_wait_is_status_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("queue", "create", "jobs", "--data", tmp_path, "--sync", "none").exit_code == 0

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Queue, "receive", interrupted)
    result = run("queue", "receive", "jobs", "--wait", "20", "--data", tmp_path, "--sync", "none")
    assert result.exit_code == 130
    assert result.stderr == "" and result.stdout == ""


# -- closed standard streams ------------------------------------------------------------------


def run_shell(command: str) -> subprocess.CompletedProcess:
    """``command`` with ``journalq`` standing for the command itself, run by a shell (which can
    close a standard stream: ``<&-``, ``>&-``)."""
    return subprocess.run(
        command.replace("journalq", " ".join(COMMAND)), shell=True, capture_output=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("command", "stream"),
    [
        ("journalq write {journal} <&-", "input"),
        ("journalq queue send jobs --data {data} <&-", "input"),
        ("journalq scan {journal} >&-", "output"),
        ("journalq info {journal} >&-", "output"),
        ("journalq offset {journal} reader >&-", "output"),
        ("journalq queue receive jobs --delete --data {data} >&-", "output"),
        ("journalq --help >&-", "output"),
    ],
)
def test_a_closed_standard_stream_is_a_one_line_error(tmp_path: Path, command: str, stream: str) -> None:
    """Python leaves None for a closed stdin or stdout: the commands failed with a traceback, and
    click's echo printed nothing, silently."""
    journal, data = tmp_path / "j", tmp_path / "data"
    with Writer(journal) as writer:
        writer.append(b"kept")
    assert run("queue", "send", "jobs", "hello", "--data", data, "--sync", "none").exit_code == 0
    process = run_shell(command.format(journal=journal, data=data))
    assert process.returncode == 1
    assert process.stderr.decode() == f"journalq: error: standard {stream} is closed\n"
    assert run("scan", journal, "--count").stdout == "1\n"
    stats = json.loads(run("queue", "stats", "jobs", "--data", data, "--format", "jsonl").stdout)
    assert stats["available"] + stats["in_flight"] == 1  # not deleted unseen


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_receive_delete_whose_reader_goes_mid_write_deletes_nothing(tmp_path: Path, unbuffered: str) -> None:
    """With PYTHONUNBUFFERED (``python -u``), stdout wrote straight to the pipe, and what a write cut
    short by the reader's going was dropped silently: ``receive --delete`` then deleted, with exit
    status 0, the messages it never printed."""
    data = tmp_path / "data"
    lines = "".join(f"{n:0200d}\n" for n in range(1000))  # far more than a pipe holds
    assert run("queue", "send", "jobs", "--data", data, "--sync", "none", input=lines).exit_code == 0
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    process = subprocess.Popen([*COMMAND, "queue", "receive", "jobs", "-n", "1000", "--delete", "--data", data],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout is not None
    assert process.stdout.read(100)  # the receive is writing, and waits for room in the pipe
    time.sleep(0.5)
    process.stdout.close()  # the reader goes, as ``| head -1`` does
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stderr
    assert b"Traceback" not in stderr
    stats = json.loads(run("queue", "stats", "jobs", "--data", data, "--format", "jsonl").stdout)
    assert stats["in_flight"] == 1000  # received, not deleted: each comes back


def test_send_of_lines_whose_output_is_closed_says_which_lines_were_sent(tmp_path: Path) -> None:
    """``journalq queue send jobs < lines | head -1`` stopped at the first batch whose ids it could
    not print, silently: the lines after it were never sent, and nothing said so."""
    data, lines = tmp_path / "data", tmp_path / "lines"
    lines.write_text("".join(f"line {n}\n" for n in range(20000)))  # ids far beyond what a pipe holds
    with lines.open("rb") as stdin:
        process = subprocess.Popen([*COMMAND, "queue", "send", "jobs", "--data", data, "--sync", "none"],
                                   stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None
        assert process.stdout.readline() == b'{"id":"0"}\n'
        process.stdout.close()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    error = re.fullmatch(rb"journalq: error: standard output was closed; nothing from line (\d+) on was sent; "
                         rb"the lines before it were sent\n", stderr)
    assert error is not None, stderr
    stats = json.loads(run("queue", "stats", "jobs", "--data", data, "--format", "jsonl").stdout)
    assert stats["available"] == int(error[1]) - 1 < 20000


# -- failing part way through many lines ---------------------------------------------------------


def test_send_of_lines_that_fails_part_way_says_which_lines_were_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch partly stored (a sharded queue or the ZooKeeper store) raises PartialSendError: the
    ids of its stored messages were not printed, and the error gave positions in the batch, not
    lines, nor that the earlier batches were stored."""
    cli_main = importlib.import_module("journalq.cli.main")  # the package exports the function main
    from journalq.errors import PartialSendError, QueueError
    from journalq.queue.topic import Topic

    monkeypatch.setattr(cli_main, "_LINES_PER_BATCH", 3)
    send_many = Topic.send_many
    calls = []

    def fails_in_the_second_batch(self: Topic, items: list) -> list[str]:
        calls.append(len(items))
        if len(calls) < 2:
            return send_many(self, items)
        stored = send_many(self, items[:1])
        raise PartialSendError([*stored, None, None], QueueError("the disk went away"))

    monkeypatch.setattr(Topic, "send_many", fails_in_the_second_batch)
    data = tmp_path / "data"
    result = run("queue", "send", "jobs", "--data", data, "--sync", "none", input="1\n2\n3\n4\n5\n6\n7\n8\n")
    assert result.exit_code == 1
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"id": str(i)} for i in range(4)]
    assert result.stderr == (
        "journalq: error: the disk went away: lines 5-6 were not sent, nor any from line 7 on "
        "(lines 1-4 were: their ids are printed)\n"
    )


def test_write_that_fails_part_way_says_which_lines_were_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk in a later batch said only "No space left on device", not that the lines
    before that batch were stored, as a bad line's error does."""
    import errno

    cli_main = importlib.import_module("journalq.cli.main")
    monkeypatch.setattr(cli_main, "_LINES_PER_BATCH", 3)
    append_many = Writer.append_many
    calls = []

    def full_in_the_second_batch(self: Writer, items: list) -> int:
        calls.append(len(items))
        if len(calls) < 2:
            return append_many(self, items)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Writer, "append_many", full_in_the_second_batch)
    journal = tmp_path / "j"
    result = run("write", journal, input="1\n2\n3\n4\n5\n")
    assert result.exit_code == 1
    assert result.stderr == (
        "journalq: error: No space left on device; nothing from line 4 on was stored; "
        "lines before 4 were stored, up to offset 2\n"
    )
    monkeypatch.undo()
    assert run("scan", journal, "--format", "text").stdout == "1\n2\n3\n"


# -- Ctrl-C part way through the input ----------------------------------------------------------


def interrupted_reading(lines: bytes, after: int):  # type: ignore[no-untyped-def]
    """Standard input that gives ``lines`` in reads of ``after`` lines, then is interrupted (a
    person typing lines at a terminal presses Ctrl-C instead of Ctrl-D)."""
    import io

    class Interrupted(io.BytesIO):
        def __init__(self) -> None:
            super().__init__()
            self.lines = iter(lines.splitlines(keepends=True)[:after])

        def read(self, size: int | None = -1) -> bytes:
            line = next(self.lines, None)
            if line is None:
                raise KeyboardInterrupt
            return line

    return Interrupted()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("write", "{tmp}/j"),
         "interrupted; nothing from line 4 on was stored; lines before 4 were stored, up to offset 2"),
        (("queue", "send", "jobs", "--data", "{tmp}/data"),
         "interrupted; nothing from line 4 on was sent; the lines before it were sent"),
    ],
)
def test_ctrl_c_part_way_through_the_input_says_what_was_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], said: str
) -> None:
    """It stopped silently (click's "Aborted!"), with the lines read since the last batch not
    stored and no word of it."""
    cli_main = importlib.import_module("journalq.cli.main")
    monkeypatch.setattr(cli_main, "_LINES_PER_BATCH", 3)
    stdin = interrupted_reading(b"1\n2\n3\n4\n5\n", after=5)
    result = CliRunner().invoke(cli, [a.format(tmp=tmp_path) for a in args], input=stdin, catch_exceptions=False)
    assert result.exit_code == 130
    assert result.stderr == f"journalq: error: {said}\n"
