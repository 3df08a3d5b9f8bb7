"""Leftovers of the hub's last audit: how the hub answers damage on its own side, what ``hub
status`` says, a copy lost while its source is idle, backoff per journal, and the hub server's
bound on requests at once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from hub_processes import JOURNALQ, child_env, free_port, kill, wait_until
from test_hub_crash import hub_answers

from journalq.cli.main import cli
from journalq.errors import HubUnavailableError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.hub.protocol import Held, PushResult
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app

URL = "/hub/v1/journals"


def write(path: Path, count: int, segment_size: int = 2500) -> None:
    with Writer(path, segment_size=segment_size) as writer:
        writer.append_many([b"value-%d" % i for i in range(count)])


def damage_first_message(segment: Path) -> None:
    damaged = bytearray(segment.read_bytes())
    damaged[3] ^= 0xFF  # the first message's offset
    segment.write_bytes(bytes(damaged))


def test_a_damaged_copy_on_the_hub_is_a_5xx_that_the_pusher_retries_not_a_refusal(tmp_path: Path) -> None:
    """Damage in the hub's own copy is the hub's problem, not the request's: 500 (logged), which
    the client takes as a hub to wait out and push to again, never a 400 that would end the
    journal's copying for good."""
    root = tmp_path / "hub"
    first = encode_batch(0, 1, [b"a" * 40, b"b" * 40, b"c" * 40])[0]
    second = encode_batch(3, 1, [b"d" * 40])[0]
    with TestClient(create_hub_app(root), raise_server_exceptions=False) as http:
        assert http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=first).status_code == 200
        assert http.post(f"{URL}/c1/j", params={"first": 3, "segment": 3}, content=second).status_code == 200
        damage_first_message(root / "c1.j" / "jnl" / "0000000000000000.jnl")  # not the last segment
        read = http.get(f"{URL}/c1/j/messages", params={"offset": 0})
        compared = http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=first)
        for answer in (read, compared):
            assert answer.status_code == 500 and answer.json()["kind"] == "journal", answer.text
            assert "hub" not in answer.json()["error"]  # the reason, not where the hub keeps it
        client = HubClient("http://hub", http=http)
        with pytest.raises(HubUnavailableError, match="500"):
            client.push(Push("c1", "j", 0, 0, first))
        with pytest.raises(HubUnavailableError, match="500"):
            client.read("c1", "j", 0)


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
    write(tmp_path / "orders", 3)
    write(tmp_path / "events", 1)
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


class BusyForOne:
    """A hub in the process that answers one journal's pushes as a busy hub does (503: its copy
    locked by another program, say) and takes the others'."""

    def __init__(self, store: HubStore, busy: str) -> None:
        self.store, self.busy, self.refused = store, busy, 0

    def held(self, client_id: str, journal: str) -> Held:
        return self.store.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        if push.journal == self.busy:
            self.refused += 1
            raise HubUnavailableError("hub answered 503: not stored: the copy is locked (injected)")
        return self.store.push(push)


def test_one_journal_answered_503_does_not_slow_the_others(tmp_path: Path) -> None:
    """Backoff is per journal: while the hub turns one journal's pushes away, the others are
    pushed at full speed, not after every wait of the busy one."""
    write(tmp_path / "busy", 5)
    write(tmp_path / "free", 400)  # 400 chunks of one message: 50 rounds of 8 chunks
    with HubStore(tmp_path / "hub", sync="none") as store:  # pushes as fast as can be: the waits show
        hub = BusyForOne(store, "busy")
        with Pusher(hub, "c1", [tmp_path / "busy", tmp_path / "free"], chunk=64, parallel=1,
                    backoff=Backoff(initial=0.05, maximum=0.05)) as pusher:
            started = time.monotonic()
            pusher.run(follow=True, stop=lambda: pusher.copies["free"].caught_up or time.monotonic() - started > 20)
            took = time.monotonic() - started
        assert store.held("c1", "free").next == 400 and pusher.copies["busy"].failed is None
        assert took < 1.0, f"the free journal took {took:.1f} s (50 rounds, each waiting out the busy one?)"
        assert 2 <= hub.refused <= 2 + took / 0.05 * 1.5  # the busy one was tried again, at its own pace


def test_a_copy_lost_while_its_source_is_idle_is_copied_anew_at_the_next_check(tmp_path: Path) -> None:
    """The hub lost the copy (its directory removed) while nothing is appended to the source: the
    pusher notices at its periodic check (one question per journal, none of its bytes), not only
    once the source is appended to again, and copies it anew."""
    write(tmp_path / "j", 30, segment_size=400)
    write(tmp_path / "other", 3)
    with HubStore(tmp_path / "hub") as store:
        asked = []

        class Counting:
            def held(self, client_id: str, journal: str) -> Held:
                asked.append(journal)
                return store.held(client_id, journal)

            def push(self, push: Push) -> PushResult:
                return store.push(push)

        with Pusher(Counting(), "c1", [tmp_path / "j", tmp_path / "other"], check_interval=0.3,
                    report_interval=0.05, backoff=Backoff(initial=0.0, maximum=0.0)) as pusher:
            done = threading.Event()
            follower = threading.Thread(target=pusher.run, kwargs={"follow": True, "stop": done.is_set})
            follower.start()
            try:
                wait_for(lambda: all(c.caught_up for c in pusher.copies.values()))
                original = segments(tmp_path / "j")
                store.close()  # as a hub restarted with the copy gone
                shutil.rmtree(tmp_path / "hub" / "c1.j")
                asked.clear()
                with HubStore(tmp_path / "hub") as again:
                    store = again
                    wait_for(lambda: segments(tmp_path / "hub" / "c1.j") == original)
                    time.sleep(0.5)
                    assert asked.count("other") <= 4  # a question per check, not per round
            finally:
                done.set()
                follower.join(10)
        assert segments(tmp_path / "hub" / "c1.other") == segments(tmp_path / "other")


def segments(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((path / "jnl").glob("*.jnl"))}


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


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
