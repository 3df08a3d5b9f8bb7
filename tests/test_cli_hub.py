"""The ``journalq hub`` commands: ``push``, ``get`` and ``status`` (in the process, against a hub
app in the process) and ``serve`` (as a process): their options, their output and exit status."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import time
import warnings
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.cli.main import cli
from journalq.hub import HubStore
from journalq.hub.client import HubClient
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app
from journalq.shard import ShardedWriter

from conftest import write_numbered
from hub_processes import JOURNALQ, child_env, free_port, kill, start_hub, wait_until
from test_cli import run
from test_hub_crash import hub_answers

URL = "/hub/v1/journals"


# -- hub status ---------------------------------------------------------------------------------


@pytest.fixture
def hub_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``journalq hub ...`` run in the process, its ``--hub`` being a hub app in the process
    that holds ``orders`` of clients web-1 (3 messages) and web-2 (1 message)."""
    import journalq.cli.hub as cli_hub

    with TestClient(create_hub_app(tmp_path / "hub")) as http:
        monkeypatch.setattr(cli_hub, "HubClient", lambda url, token=None, **kw: HubClient(url, http=http))
        for client_id, count in (("web-1", 3), ("web-2", 1)):
            answer = http.post(f"{URL}/{client_id}/orders", params={"first": 0, "segment": 0},
                               content=encode_batch(0, 1, [b"m"] * count)[0])
            assert answer.status_code == 200

        def run(*args: str):
            return CliRunner().invoke(cli, ["hub", "status", "--hub", "http://hub:8090", "--format", "jsonl", *args])

        yield run


def test_hub_status_without_a_client_id_lists_every_client_s_copies(hub_cli) -> None:
    result = hub_cli()
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    got = [(r["client_id"], r["journal"], r["hub_next"]) for r in rows]
    assert got == [("web-1", "orders", 3), ("web-2", "orders", 1)]


def test_hub_status_of_local_journals_needs_the_client_they_are_copied_as(tmp_path: Path, hub_cli) -> None:
    """Local journals are one client's: without ``--client-id`` each would be matched with every
    client's copy of its name (web-2's shown 2 behind web-1's journal), so it is a usage error."""
    write_numbered(tmp_path / "orders", 3)
    write_numbered(tmp_path / "events", 1)
    result = hub_cli(str(tmp_path / "orders"), str(tmp_path / "events"))
    assert result.exit_code == 2 and "--client-id" in result.output, result.output
    result = hub_cli("--client-id", "web-1", str(tmp_path / "orders"), str(tmp_path / "events"))
    assert result.exit_code == 0, result.output
    rows = {r["journal"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert rows["orders"] == {"client_id": "web-1", "journal": "orders", "hub_first": 0, "hub_next": 3,
                              "local_next": 3, "lag": 0}
    assert rows["events"]["client_id"] == "web-1" and rows["events"]["lag"] == 1


def test_hub_status_says_so_when_the_client_has_no_copies_or_its_id_is_bad(hub_cli) -> None:
    result = hub_cli("--client-id", "nobody")
    assert result.exit_code == 0 and not result.stdout
    assert "no journal of client 'nobody'" in result.stderr
    result = hub_cli("--client-id", "web 1")
    assert result.exit_code == 2 and "web 1" in result.output, result.output


# -- hub serve ----------------------------------------------------------------------------------


def test_the_hub_server_bounds_the_requests_it_handles_at_once(tmp_path: Path) -> None:
    """Past ``--max-requests`` requests under way (each may hold a push body of up to 64 MiB and
    a thread), the hub answers 503 at once, with ``Retry-After`` and the connection closed (so
    that many pushers cannot take every descriptor and all the memory), and serves again once
    requests end."""
    port = free_port()
    with open(tmp_path / "hub.log", "ab") as out:
        hub = subprocess.Popen(
            [*JOURNALQ, "hub", "serve", "--root", str(tmp_path / "hub"), "--port", str(port), "--max-requests", "2"],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(),
        )
    try:
        wait_until("the hub", lambda: hub_answers(f"http://127.0.0.1:{port}"), 20)
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(2)]
        try:
            for s in stalled:  # a push whose body comes slowly holds its request's place
                s.sendall(b"POST /hub/v1/journals/c1/j?first=0&segment=0 HTTP/1.1\r\nHost: hub\r\n"
                          b"Content-Length: 1000\r\n\r\nxx")
            time.sleep(0.5)
            busy = httpx.get(f"http://127.0.0.1:{port}/hub/v1/status", timeout=5)
            assert busy.status_code == 503 and busy.json()["kind"] == "busy", busy.text
            assert busy.headers["retry-after"] == "1" and busy.headers["connection"] == "close"
            assert "2 requests" in busy.json()["error"]
        finally:
            for s in stalled:
                s.close()
        wait_until("the places", lambda: httpx.get(f"http://127.0.0.1:{port}/hub/v1/status").status_code == 200, 10)
    finally:
        kill(hub)


def test_sigint_sent_again_while_the_hub_stops_still_stops_it_gracefully(tmp_path: Path) -> None:
    """Ctrl-C pressed twice while a push is under way was uvicorn's forced exit: the hub's
    shutdown (its copies' writers synced and closed) skipped and the request cut off. Every stop
    signal now asks for the same graceful stop, as with ``journalq serve``."""
    port = free_port()
    log = tmp_path / "hub.log"
    with open(log, "ab") as out:
        hub = subprocess.Popen(
            [*JOURNALQ, "hub", "serve", "--root", str(tmp_path / "hub"), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True,
        )
    try:
        wait_until("the hub", lambda: hub_answers(f"http://127.0.0.1:{port}"), 20)
        stalled = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:  # a push whose body comes slowly: the stop waits for it
            stalled.sendall(b"POST /hub/v1/journals/c1/j?first=0&segment=0 HTTP/1.1\r\nHost: hub\r\n"
                            b"Content-Length: 1000\r\n\r\nxx")
            time.sleep(0.5)
            os.killpg(hub.pid, signal.SIGINT)  # as a terminal does (the hub leads its group)
            time.sleep(0.3)
            os.killpg(hub.pid, signal.SIGINT)
            time.sleep(0.3)
            assert hub.poll() is None, log.read_text()  # still waiting for the push, not forced out
        finally:
            stalled.close()
        assert hub.wait(20) == 0, log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        kill(hub)


# -- hub URLs; hub push of a root of many shards --------------------------------------------------


@pytest.mark.parametrize("command", [
    ["push", "--to", "localhost:8090", "--client-id", "c", "--once", "--give-up-after", "0"],
    ["status", "--hub", "localhost:8090"],
    ["get", "--hub", "localhost:8090", "--client-id", "c", "j", "0"],
])
def test_the_hub_commands_refuse_a_url_without_http_as_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    with Writer(tmp_path / "j") as writer:
        writer.append(b"x")
    args = ["hub", *command] + ([str(tmp_path / "j")] if command[0] == "push" else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "localhost:8090" in result.output and "http://HOST:PORT" in result.output


def test_hub_push_of_a_root_of_many_shards_is_not_held_back_by_the_soft_open_files_limit(tmp_path: Path) -> None:
    """The pusher keeps a descriptor open per journal it follows, and a root of shards has up
    to 1024 (shard bit 'a'): as ``hub serve``, ``hub push`` raises its soft limit on open files
    to the hard one. Under the usual soft limit of 1024 it died 'Too many open files' part way
    through such a root; here, a root of 128 shards under a soft limit of 100."""
    with ShardedWriter(tmp_path / "events", prefix="events", bit=7) as sharded:
        for i in range(2000):
            sharded.append(b"e%d" % i, key=b"k%d" % i)
    assert len(list((tmp_path / "events").iterdir())) == 128
    port = free_port()
    hub = start_hub(tmp_path / "hub", "127.0.0.1", port, tmp_path)
    try:
        wait_until("the hub", lambda: hub_answers(f"http://127.0.0.1:{port}"), 30)

        def low_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        pushed = subprocess.run(
            [*JOURNALQ, "hub", "push", "--to", f"http://127.0.0.1:{port}", "--client-id", "c1", "--once",
             "--give-up-after", "10", str(tmp_path / "events")],
            capture_output=True, text=True, env=child_env(), preexec_fn=low_limit, timeout=120,
        )
    finally:
        kill(hub)
    assert pushed.returncode == 0, pushed.stderr[-500:]
    with HubStore(tmp_path / "hub") as store:
        assert sum(held.next for held in store.status()["c1"].values()) == 2000


# -- hub get's OFFSET, client ids ----------------------------------------------------------------


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


@pytest.mark.parametrize("option", ["--give-up-after", "--timeout", "--check-interval"])
def test_hub_push_seconds_must_be_finite(tmp_path: Path, option: str) -> None:
    """``hub push --give-up-after nan`` passed the option's range (NaN compares false) and never
    gave up; ``--timeout inf`` overflowed the wait. Each is a one-line usage error before anything
    is pushed."""
    journal = tmp_path / "j"
    assert run("write", journal, input="a\n").exit_code == 0
    for value in ("nan", "inf"):
        result = run("hub", "push", journal, "--to", "http://127.0.0.1:9", "--client-id", "c1", "--once",
                     option, value)
        assert result.exit_code == 2, (value, result.output)
        assert result.output.startswith(f"journalq: error: Invalid value for '{option}'"), result.output
        assert len(result.output.splitlines()) == 1
