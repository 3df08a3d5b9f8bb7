"""``journalq serve`` refusing to start: each bad start is one line that names the problem (the
address, the directory, the option) and a non-zero exit, never uvicorn's bare ``[Errno 98]`` nor a
traceback, and nothing is served."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_harness import JOURNALQ

from journalq.errors import InvalidSettingError


SERVERS = {"serve": ("serve", "--data"), "hub serve": ("hub", "serve", "--root")}
"""Each server command, with the option that names its directory (both start the same way)."""


def serve(*args: str, command: str = "serve", timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``journalq serve ARGS`` (or another of ``SERVERS``), which is expected to give up at
    once; ARGS start with the directory."""
    *words, directory_option = SERVERS[command]
    argv = [str(JOURNALQ), *words, directory_option, *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"journalq {command} {args} started instead of refusing: {exc.stdout!r}") from None


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a refused start (after checking the exit status and output)."""
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "serving" not in done.stdout + done.stderr, done  # no start line: nothing was served
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "workers"), [("serve", ["--workers", "1"]), ("serve", ["--workers", "2"]), ("hub serve", [])]
)
def test_a_port_in_use_is_one_line_naming_the_address(
    tmp_path: Path, taken_port: int, command: str, workers: list[str]
) -> None:
    done = serve(str(tmp_path / "data"), "--port", str(taken_port), *workers, command=command)
    line = one_line_error(done)
    assert line == f"journalq: error: cannot listen on 127.0.0.1:{taken_port}: Address already in use", line
    assert done.returncode == 1


def test_an_address_that_cannot_be_listened_on_is_named(tmp_path: Path) -> None:
    line = one_line_error(serve(str(tmp_path / "data"), "--host", "host.invalid", "--port", "8080"))
    assert line.startswith("journalq: error: cannot listen on host.invalid:8080: "), line


@pytest.mark.parametrize("command", SERVERS)
def test_data_that_is_a_file_is_refused(tmp_path: Path, command: str) -> None:
    option = SERVERS[command][-1]
    file = tmp_path / "a-file"
    file.write_bytes(b"not a directory")
    done = serve(str(file), "--port", "0", command=command)
    if command == "serve":
        assert one_line_error(done) == f"journalq: error: {option} {file} is not a directory"
    else:  # click's own check of the option (file_okay=False): a usage error
        assert done.returncode == 2 and f"Invalid value for '{option}'" in done.stderr, done
    under = file / "data"
    line = one_line_error(serve(str(under), "--port", "0", command=command))
    assert line == f"journalq: error: {option} {under}: cannot make the directory: Not a directory", line
    assert file.read_bytes() == b"not a directory"


@pytest.fixture
def read_only_directory(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write to: one without write permission, or (root writes
    there anyway) a read-only tmpfs."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(directory)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"root, and cannot mount a read-only tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False)


def test_data_that_cannot_be_written_is_refused(read_only_directory: Path) -> None:
    line = one_line_error(serve(str(read_only_directory), "--port", "0"))
    assert line == f"journalq: error: --data {read_only_directory} is not writable", line
    missing = read_only_directory / "data"
    line = one_line_error(serve(str(missing), "--port", "0"))
    assert line.startswith(f"journalq: error: --data {missing}: cannot make the directory: "), line


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--port", "65536", "65536 is not in the range 0<=x<=65535"),
        ("--port", "-1", "-1 is not in the range 0<=x<=65535"),
        ("--port", "http", "'http' is not a valid integer"),
        ("--workers", "0", "0 is not in the range 1<=x<=64"),
        ("--max-message-size", "0", "0 is not in the range"),
    ],
)
def test_bad_option_values_are_named(tmp_path: Path, option: str, value: str, problem: str) -> None:
    done = serve(str(tmp_path / "data"), option, value)
    assert done.returncode == 2, done  # click's usage error
    assert f"Invalid value for '{option}': {problem}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0.1", "the session timeout is 0.1; it must be from 0.2 to 600"),
        ("601", "the session timeout is 601.0; it must be from 0.2 to 600"),
        ("nan", "the session timeout must be a finite number, not nan"),
        ("inf", "the session timeout must be a finite number, not inf"),
    ],
)
def test_a_zookeeper_session_timeout_out_of_range_is_named(value: str, problem: str) -> None:
    """Refused before anything starts (the store would refuse it in the server's start-up:
    uvicorn's traceback and exit 3). No ZooKeeper needed: nothing connects."""
    line = one_line_error(serve("zk://127.0.0.1:1/journalq", "--port", "0", "--zk-session-timeout", value))
    assert line == f"journalq: error: --zk-session-timeout {value}: {problem}", line


def test_a_zookeeper_session_timeout_for_a_directory_is_refused(tmp_path: Path) -> None:
    line = one_line_error(serve(str(tmp_path / "data"), "--port", "0", "--zk-session-timeout", "5"))
    assert line == f"journalq: error: --zk-session-timeout 5: a session timeout is the ZooKeeper store's, " \
                   f"and {tmp_path / 'data'} is a directory", line
    assert not (tmp_path / "data").exists()
    done = serve(str(tmp_path / "data"), "--zk-session-timeout", "soon")
    assert done.returncode == 2 and (
        "Invalid value for '--zk-session-timeout': 'soon' is not a valid float" in done.stderr
    )


@pytest.mark.parametrize("command", SERVERS)
@pytest.mark.parametrize("token", ["", " ", "two words", "line\nbreak"])
def test_a_token_that_guards_nothing_is_refused(tmp_path: Path, token: str, command: str) -> None:
    """``--token "$TOKEN"`` with TOKEN unset would guard the API with ``Bearer `` alone."""
    line = one_line_error(serve(str(tmp_path / "data"), "--port", "0", "--token", token, command=command))
    assert line.startswith("journalq: error: --token is empty or holds a space or control character"), line
    assert line.endswith("leave --token out for an open hub" if "hub" in command else "open REST API"), line


@pytest.mark.parametrize("flag", ["--zk-producer-gc", "--no-zk-producer-gc"])
def test_producer_gc_for_a_directory_is_refused(tmp_path: Path, flag: str) -> None:
    """``serve`` could not set the ZooKeeper store's ``producer_gc`` at all; now it can, and a data
    directory, whose store has no such option, refuses it in the words of ``queue send``."""
    line = one_line_error(serve(str(tmp_path / "data"), "--port", "0", flag))
    assert line == f"journalq: error: {flag} is an option of the ZooKeeper store (--data zk://...), and " \
                   f"{tmp_path / 'data'} is a directory", line
    assert not (tmp_path / "data").exists()


def test_producer_gc_reaches_every_workers_broker() -> None:
    """The workers rebuild the configuration from the environment: the option goes with it."""
    from journalq.server.config import ENVIRONMENT_VARIABLE, ServerConfig

    for producer_gc, options in ((False, {"producer_gc": False}), (True, {"producer_gc": True}), (None, {})):
        config = ServerConfig(data="zk://127.0.0.1:2181/jq", producer_gc=producer_gc)
        rebuilt = ServerConfig.from_environment({ENVIRONMENT_VARIABLE: config.to_environment()})
        assert rebuilt == config and rebuilt.store_options() == options
    with pytest.raises(InvalidSettingError, match="producer_gc is the ZooKeeper store's"):
        ServerConfig(data=Path("data"), producer_gc=False)
