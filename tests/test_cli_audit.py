"""Bugs found by using the ``journalq`` command as a person and a script would: each test here
failed before its fix."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from journalq.cli.main import cli
from journalq.journal import Writer
from journalq.queue import Queue

_SCRIPT = Path(sys.executable).parent / "journalq"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "journalq.cli.main"]


def run(*args: object, input: bytes | str | None = None) -> Result:
    """The command in-process; an unexpected exception fails the test with its traceback."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


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


# -- write --format jsonl ---------------------------------------------------------------------


def test_a_jsonl_line_that_is_not_utf8_is_refused_as_such(tmp_path: Path) -> None:
    """JSON lines are UTF-8: a line of other bytes is named as not UTF-8 (it was blamed on a
    'utf-16-le' codec), and a line in UTF-16 is refused rather than stored."""
    journal = tmp_path / "j"
    result = run("write", journal, "--format", "jsonl", input=b'{"value":"ok"}\n\xff\xfe\x00bin\n')
    assert result.exit_code == 1
    assert result.stderr.startswith("journalq: error: line 2: not UTF-8: byte 1 is 0xff")
    result = run("write", journal, "--format", "jsonl", input=b'\xef\xbb\xbf{"value":"\xff"}\n')
    assert "line 1: not UTF-8: byte 14 is 0xff" in result.stderr
    utf16 = '{"value":"sixteen"}'.encode("utf-16-le")
    result = run("write", journal, "--format", "jsonl", input=utf16 + b"\n")
    assert result.exit_code == 1 and "line 1: not valid JSON" in result.stderr
    assert run("scan", journal, "--count").stdout == "0\n"


def test_a_jsonl_line_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    assert run("write", journal, "--format", "jsonl", input=b'\xef\xbb\xbf{"value":"a"}\n').exit_code == 0
    assert run("scan", journal, "--format", "text").stdout == "a\n"


# -- a file where a directory is due ----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("write", "{file}"),
        ("write", "{file}/journal"),
        ("demo", "--data", "{file}", "--messages", "1"),
        ("queue", "send", "jobs", "x", "--data", "{file}"),
        ("queue", "create", "jobs", "--data", "{file}"),
    ],
)
def test_a_file_given_as_a_directory_is_named_as_not_a_directory(tmp_path: Path, args: tuple[str, ...]) -> None:
    """It said "File exists: FILE", which reads as a refusal to overwrite it."""
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    result = run(*(arg.format(file=file) for arg in args), input="a\n")
    assert result.exit_code == 1
    assert result.stderr == f"journalq: error: not a directory ({file})\n"
    assert file.read_text() == "kept\n"


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


# -- queue send of many lines, failing part way -------------------------------------------------


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


# -- offset -----------------------------------------------------------------------------------


def test_offset_set_while_a_reader_holds_the_name_names_the_reader(tmp_path: Path) -> None:
    """It said "another writer holds the lock", of a reader offset."""
    from journalq.journal import ReaderOffset

    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append_many([b"a", b"b"])
    with ReaderOffset(journal, "billing"):
        result = run("offset", journal, "billing", "--set", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"journalq: error: reader 'billing' is in use: another process holds {journal / 'ofs' / 'billing.lck'}; "
        "stop that reader first\n"
    )
    assert run("offset", journal, "billing").stdout == "0\n"


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


# -- the ZooKeeper store out of reach -----------------------------------------------------------


@pytest.mark.parametrize("command", [("queue", "list"), ("serve", "--port", "0")])
def test_a_zookeeper_store_out_of_reach_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    """kazoo's note on every reconnection attempt (a warning of the logger the store gives it)
    was printed too: some twenty 'journalq: warning: Connection dropped' lines around the error;
    serve printed sixty, then uvicorn's traceback of the app's failed start (exit status 3)."""
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    process = subprocess.run([*COMMAND, *command, "--data", f"zk://127.0.0.1:{port}/jq"],
                             capture_output=True, timeout=120, check=False)
    assert process.returncode == 1
    assert process.stderr.decode() == f"journalq: error: no ZooKeeper answered at 127.0.0.1:{port} within 15s\n"


# -- an empty path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("write", ""),
        ("scan", ""),
        ("info", ""),
        ("check", "", "--repair"),
        ("offset", "", "reader", "--set", "0"),
        ("demo", "--data", "", "--messages", "1"),
        ("queue", "send", "jobs", "x", "--data", ""),
        ("queue", "create", "jobs", "--data", ""),
        ("hub", "push", "--to", "http://127.0.0.1:1", "--client-id", "c", "--once", ""),
        ("hub", "serve", "--root", "", "--port", "0"),
        ("pipeline", "archive", "--journal", "", "--output", "out"),
    ],
)
def test_an_empty_path_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    """An empty DIR or --data ("$UNSET_VARIABLE") was the current directory: write made a
    journal in it, queue send a queue."""
    monkeypatch.chdir(tmp_path)
    result = run(*args, input="a\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("journalq: error: Invalid value for ") and "is empty" in result.stderr
    assert list(tmp_path.iterdir()) == []


# -- arguments that are not UTF-8 ---------------------------------------------------------------

_NOT_UTF8 = "ab\udcff"  # how Python passes the argument bytes b"ab\xff" (surrogateescape)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("send", "sharded", "x", "--key", _NOT_UTF8), "--key"),
        (("send", "sharded", "x", "--attribute", f"a={_NOT_UTF8}"), "--attribute"),
        (("send", "sharded", "x", "--dedup-id", _NOT_UTF8), "--dedup-id"),
        (("send", "sharded", "x", "--metadata", f'"{_NOT_UTF8}"'), "--metadata"),
        (("receive", "sharded", "--filter", f"a={_NOT_UTF8}"), "--filter"),
        (("delete", "sharded", _NOT_UTF8), "RECEIPT..."),
        (("create", "other", "--enum", f"level=low,{_NOT_UTF8}"), "--enum"),
    ],
)
def test_an_option_that_is_not_utf8_is_refused_by_name(tmp_path: Path, args: tuple[str, ...], option: str) -> None:
    """Bytes that are not UTF-8 in an argument stored as text failed a sharded queue's send --key
    with a traceback, the others with "message metadata cannot be stored as JSON: ... surrogates
    not allowed", naming no option; create --enum stored them in queue.json, as escapes no JSON
    reader takes for text."""
    data = tmp_path / "data"
    assert run("queue", "create", "sharded", "--shards", "2", "--data", data, "--sync", "none").exit_code == 0
    result = run("queue", *args, "--data", data, "--sync", "none")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"journalq: error: Invalid value for '{option}': not UTF-8: byte ")
    assert len(result.stderr.splitlines()) == 1
    stats = json.loads(run("queue", "stats", "sharded", "--data", data, "--format", "jsonl").stdout)
    assert stats["available"] == 0
    assert run("queue", "list", "--data", data, "--format", "jsonl").stdout == '{"name":"sharded"}\n'  # none made


# -- a refused send ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("--delay", "5000", "message delay must be 0 to 900 seconds, not 5000.0"),
        ("--group-id", "", "group_id must be a string of 1 to 128 characters, not ''"),
        ("--metadata", "NaN", "task metadata must be JSON: Out of range float values are not JSON compliant"),
        ("--attributes", '{"n": {"type": "Number", "value": "ten"}}', "attribute 'n': 'ten' is not a number"),
    ],
)
def test_a_send_refused_for_its_message_makes_no_queue(tmp_path: Path, option: str, value: str, error: str) -> None:
    """send made the missing queue (and the data directory) first, then refused the message: the
    refused send left an empty queue behind."""
    data = tmp_path / "data"
    result = run("queue", "send", "jobs", "hello", option, value, "--data", data, "--sync", "none")
    assert result.exit_code == 1
    assert result.stderr == f"journalq: error: {error}\n"
    assert not data.exists()
    assert run("queue", "create", "jobs", "--data", data, "--sync", "none").exit_code == 0
    result = run("queue", "send", "jobs", "hello", option, value, "--data", data, "--sync", "none")
    assert (result.exit_code, result.stderr) == (1, f"journalq: error: {error}\n")  # as before, to a queue there
    assert json.loads(run("queue", "stats", "jobs", "--data", data, "--format", "jsonl").stdout)["available"] == 0


# -- hub get ----------------------------------------------------------------------------------


def test_hub_get_of_an_offset_past_what_offsets_hold_is_a_usage_error() -> None:
    """An OFFSET of 2**64 or more went to the hub, whose refusal was printed as its raw JSON:
    'refused: {"detail":[{"type":"less_than",...'."""
    result = run("hub", "get", "j", 2**64, "--hub", "http://127.0.0.1:1", "--client-id", "c")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"journalq: error: Invalid value for 'OFFSET': {2**64} is not in the range 0<=x<={2**64 - 1}."
    )


@pytest.mark.parametrize("command", [("push", "{journal}", "--to"), ("get", "j", "0", "--hub"), ("status", "--hub")])
def test_a_bad_client_id_is_a_usage_error_in_every_hub_command(tmp_path: Path, command: tuple[str, ...]) -> None:
    """status refused a client id the hub would refuse as a usage error (status 2); push and get
    as a failure (status 1), in other words, and push only after it had begun."""
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append(b"kept")
    args = [arg.format(journal=journal) for arg in command]
    result = run("hub", *args, "http://127.0.0.1:1", "--client-id", "a b")
    assert result.exit_code == 2
    assert result.stderr.startswith("journalq: error: Invalid value for '--client-id': client id 'a b' must be ")
