"""Slow clients under uvicorn's h11 protocol, which ``journalq serve`` runs when httptools is
missing: they are cut off as under journalq's httptools protocol (``test_server_direct``)."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_server_direct import serving
from test_server_harness import ServerProcess, read_all

from journalq.server.h11_protocol import StoppingH11Protocol
from journalq.server.protocol import DirectHttpToolsProtocol

PROTOCOLS = pytest.mark.parametrize(
    "protocol", [StoppingH11Protocol, DirectHttpToolsProtocol], ids=["h11", "httptools"]
)


@PROTOCOLS
def test_a_connection_that_never_sends_a_request_is_closed(tmp_path: Path, protocol: type) -> None:
    """Under h11 such a connection was held for as long as its client liked (uvicorn's h11 protocol
    times only the wait after an answer)."""
    with serving(tmp_path / "data", protocol, keep_alive=1) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=15) as silent:
        try:
            assert silent.recv(1) == b""  # closed by the server, with nothing said
        except TimeoutError:
            pytest.fail("the server still held the connection after 15 s")


@PROTOCOLS
def test_a_request_head_that_dribbles_in_is_408_after_the_head_timeout(tmp_path: Path, protocol: type) -> None:
    """A slowloris: a byte of its head every half second, never ending it. Under h11 each byte
    put the wait off, forever."""
    with serving(tmp_path / "data", protocol, keep_alive=1, body_timeout=2) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=15) as slow:
        slow.sendall(b"GET /q HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        for _ in range(24):  # 12 s at most, far past the 2 s head timeout
            try:
                slow.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.5)
        answer = read_all(slow)
    assert answer.startswith(b"HTTP/1.1 408"), answer


@PROTOCOLS
def test_a_client_that_never_reads_its_answers_is_cut_off(tmp_path: Path, protocol: type) -> None:
    """Requests pipelined (here, for the OpenAPI document: no token needed) by a client that never
    reads: once the answers fill the socket's buffers the answer under way waits for room, and the
    connection was held for good (its wait for a request does not begin until that answer is out),
    so a few thousand such clients (the concurrency limit) kept everybody else out. A connection
    whose answer makes no progress for the head timeout is now closed."""
    with serving(tmp_path / "data", protocol, keep_alive=1, body_timeout=2) as port, \
            socket.socket() as greedy:
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        greedy.connect(("127.0.0.1", port))
        asks = 1000  # ~14 MB of answers: far more than the sockets' buffers hold
        greedy.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * asks)
        time.sleep(8)  # not reading, far past the 2 s head timeout
        greedy.settimeout(10)
        taken = b""
        try:
            while chunk := greedy.recv(1 << 20):
                taken += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert taken.count(b"HTTP/1.1 200") < asks, "every answer went out: the connection was held all along"


@pytest.fixture
def few_open_files() -> Iterator[None]:
    """Servers started meanwhile inherit a soft limit of 256 open files (a hard one of the
    current hard limit), as under a system's usual soft limit of 1024, only smaller."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit on open files is {hard}: no room above the soft one to test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_beyond_the_soft_open_files_limit_do_not_keep_clients_out(
    tmp_path: Path, few_open_files: None
) -> None:
    """A soft limit on open files below the server's concurrency limit (4096 connections) let a
    few hundred idle connections (no token needed to open one) take every descriptor: the next
    client's connection was accepted and dropped unanswered, for as long as the idle ones were
    renewed. The server now raises its soft limit to the hard one, as Go's runtime does."""
    server = ServerProcess(tmp_path / "data", log_dir=tmp_path).start()
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))  # ours
    idle: list[socket.socket] = []
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(400)]
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        for s in idle:
            s.close()
        server.check_clean_stop()


def test_the_hub_alone_raises_its_open_files_limit_too(tmp_path: Path, few_open_files: None) -> None:
    """``journalq hub serve`` takes connections as ``serve`` does: under a soft limit of 256 open
    files, 400 idle connections kept the next client out until it raised the limit as well."""
    from hub_processes import free_port, kill, start_hub, wait_until

    port = free_port()
    hub = start_hub(tmp_path / "hub", "127.0.0.1", port, tmp_path)
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))  # ours
    idle: list[socket.socket] = []
    try:
        url = f"http://127.0.0.1:{port}/hub/v1/status"

        def answers() -> bool:
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until("the hub", answers, 30)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(400)]
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        for s in idle:
            s.close()
        kill(hub)


def test_a_client_that_reads_slowly_is_not_stalled() -> None:
    """The rule under the cut-off: a client counts as stalled once it has taken nothing of an
    answer for the limit; one that takes some between two looks is kept, however long the
    transport's buffer stays over its high-water mark (a large answer to a slow client). Before,
    the limit ran from the pause, whatever the client took meanwhile."""
    from journalq.server.polling import AnswerStall

    stall = AnswerStall(10.0)
    assert stall.remaining(0.0, 0) is None  # not paused
    stall.paused(0.0, 1_000_000)
    assert stall.remaining(9.0, 1_000_000) == 1.0
    assert stall.remaining(9.5, 900_000) == 10.0  # it took some: ten more seconds from now
    assert stall.remaining(19.0, 900_000) == 0.5
    assert stall.remaining(19.5, 900_000) == 0.0  # nothing taken for ten seconds
    stall.resumed()
    assert stall.remaining(30.0, 0) is None
