"""Bugs found by using the ``journalq`` command as a person and a script would: each test here
failed before its fix."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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
