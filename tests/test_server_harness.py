"""The real server as a subprocess (``.venv/bin/journalq serve``): the harness the other
``test_server_*`` modules import, and the tests of the server's life cycle itself — loopback by
default, one start line with its address, a clean exit (code 0) on SIGTERM and SIGINT with the
requests under way finished (a POST whose body is still arriving; a long poll ended at once, 204),
also when SIGINT comes again while it stops, ``--workers``; a send that comes after the stores
stopped is a 503.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from journalq.queue import Broker

REPO = Path(__file__).resolve().parents[1]
JOURNALQ = REPO / ".venv" / "bin" / "journalq"
if not JOURNALQ.exists():  # another environment: the console script beside this interpreter
    JOURNALQ = Path(sys.executable).with_name("journalq")

START_LINE = re.compile(r"serving .* on http://(?P<host>[^:/\s]+):(?P<port>\d+)")


def free_port() -> int:
    """A port nobody listens on now (bound to 0 and closed; the caller retries on a collision)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``journalq serve --data DATA --port PORT [args]`` in a subprocess, its output in a file."""

    def __init__(self, data: Path, *args: str, log_dir: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.data = Path(data)
        self.args = list(args)
        self.log_dir = Path(log_dir) if log_dir is not None else self.data.parent
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_file: Path | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file and self.log_file.exists() else ""

    def start_lines(self) -> list[str]:
        return [line for line in self.log().splitlines() if START_LINE.search(line)]

    def start(self, timeout: float = 20.0) -> ServerProcess:
        """Start on a free port (another one when the port was taken meanwhile); wait for /healthz."""
        last_error = ""
        for _attempt in range(5):
            self.port = free_port()
            self.starts += 1
            self.log_file = self.log_dir / f"server-{self.port}-{self.starts}.log"
            env = dict(os.environ if self.env is None else self.env)
            env["PYTHONUNBUFFERED"] = "1"
            with open(self.log_file, "wb") as out:
                self.process = subprocess.Popen(
                    [str(JOURNALQ), "serve", "--data", str(self.data), "--port", str(self.port), *self.args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # a group of its own: ``kill`` takes its workers too
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                try:
                    if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            last_error = self.log()
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            if "address already in use" not in last_error.lower():
                break
        raise AssertionError(f"the server did not start; its output:\n{last_error}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        """Send ``sig`` and wait for the exit; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the server did not exit within {timeout} s of signal {sig}:\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL the server and, with ``--workers``, its worker processes: all at once, as a
        crash of the machine's processes would (the workers outlive a parent killed alone)."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def worker_pids(self) -> list[int]:
        """The worker processes of ``--workers N`` now (uvicorn replaces one that dies)."""
        assert self.process is not None
        pid = self.process.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:
            return []
        workers = []
        for child in map(int, children):
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    workers.append(child)
            except FileNotFoundError:
                pass  # gone meanwhile
        return workers

    def check_clean_stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop with ``sig``: exit code 0, and one start line naming the address in this run's log."""
        code = self.stop(sig)
        log = self.log()
        assert code == 0, f"exit code {code} after signal {sig}; output:\n{log}"
        lines = self.start_lines()
        assert len(lines) == 1, f"expected one start line, got {lines!r}; output:\n{log}"
        match = START_LINE.search(lines[0])
        assert match is not None and int(match["port"]) == self.port, lines[0]
        assert match["host"] == "127.0.0.1", lines[0]
        assert "Traceback" not in log, log


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``start_server(*args, data=None)``: a running server (data defaults to ``tmp_path/data``);
    every one still running at the end is stopped with SIGTERM, which must give exit code 0 and
    exactly one start line with the address."""
    servers: list[ServerProcess] = []

    def start(*args: str, data: Path | None = None, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(data or tmp_path / "data", *args, log_dir=tmp_path, env=env)
        servers.append(server)
        return server.start()

    yield start
    problems = []
    for server in servers:
        if server.process is not None and server.process.poll() is None:
            try:
                server.check_clean_stop()
            except AssertionError as exc:
                problems.append(str(exc))
    assert not problems, "\n\n".join(problems)


def module_server(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[ServerProcess]:
    """For a module-scoped fixture: one server for the whole module, stopped cleanly after it."""
    root = tmp_path_factory.mktemp("server")
    server = ServerProcess(root / "data", *args, log_dir=root).start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.check_clean_stop()


def raw_request(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes; return the first answer (headers and a Content-Length body), or what came
    until the server closed or ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return read_answer(s)


def read_answer(s: socket.socket) -> bytes:
    data = b""
    try:
        while True:
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if length is not None and len(rest) >= int(length[1]):
                    return data
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except (TimeoutError, ConnectionResetError):
        return data


def read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def metric_families(text: str) -> dict[str, Any]:
    """The metric families of a scrape's text, by name."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def metric_sample(families: dict[str, Any], family: str, sample: str, **labels: str) -> float | None:
    """The value of the first sample ``sample`` of ``family`` with ``labels``, or None."""
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def await_waiting_receives(url: str, queue: str, count: int, timeout: float = 30, **get: Any) -> None:
    """Return once ``count`` receives of ``queue`` wait in the server at ``url`` (its gauge
    ``journalq_receives_waiting``; ``get``: httpx's, such as ``headers``): a test that acts on
    polls under way knows they are, where a fixed sleep is outrun by a loaded host."""
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.get(f"{url}/metrics", timeout=timeout, **get)
        answer.raise_for_status()
        families = metric_families(answer.text)
        # (No family before a worker's first poll: with workers, the values live in their files.)
        gauge = "journalq_receives_waiting"
        waiting = (metric_sample(families, gauge, gauge, queue=queue) if gauge in families else None) or 0.0
        if waiting == count:
            return
        assert time.monotonic() < deadline, f"{waiting} receives of {queue!r} waiting after {timeout} s, not {count}"
        time.sleep(0.02)


def status_of(answer: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    assert match is not None, f"not an HTTP answer: {answer[:200]!r}"
    return int(match[1])


QUERY_MODEL = Path(__file__).parent / "data" / "botocore-sqs-query"
"""botocore 1.31.60's model of SQS (its documentation left out): the Query protocol, which
botocore spoke to SQS before its JSON protocol. A client made with it is such an SDK."""


def botocore_session(*, query: bool = False):
    """A new botocore session; with ``query``, one whose SQS speaks the Query protocol
    (``QUERY_MODEL``), as older SDKs do."""
    import botocore.session

    session = botocore.session.get_session()
    if query:
        session.get_component("data_loader").search_paths.insert(0, str(QUERY_MODEL))
    return session


def sqs_client(url: str, key: str = "AKIDEXAMPLE", secret: str = "secret", *, query: bool = False, **config: object):
    """A boto3 SQS client for the server at ``url``, with one attempt per call (no retries);
    with ``query``, one that speaks SQS's Query protocol (``botocore_session``)."""
    import boto3
    from botocore.config import Config

    return boto3.Session(botocore_session=botocore_session(query=query)).client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}, **config),  # type: ignore[arg-type]
    )


# -- the life cycle -----------------------------------------------------------------------------


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # TCP_LISTEN
                found.add(address)
    return found


def test_help_shows_the_defaults() -> None:
    out = subprocess.run([str(JOURNALQ), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--data", "--host", "--port", "--workers", "--token", "--aws-key", "--max-message-size"):
        assert option in out
    assert "127.0.0.1" in out and "8080" in out


def test_listens_on_loopback_by_default_and_logs_one_start_line(start_server) -> None:
    server = start_server()
    if Path("/proc/net/tcp").exists():
        # 0100007F is 127.0.0.1 in /proc's byte order; 0.0.0.0 would be 00000000
        assert _listening_addresses(server.port) == {"0100007F"}
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
    server.check_clean_stop(signal.SIGTERM)


def test_sigint_stops_cleanly_too(start_server) -> None:
    server = start_server()
    httpx.put(f"{server.url}/q").raise_for_status()
    httpx.post(f"{server.url}/q/messages", content=b"kept").raise_for_status()
    server.check_clean_stop(signal.SIGINT)
    # The journals were closed properly: a new server finds the message, and no lock is left.
    again = start_server(data=server.data)
    got = httpx.get(f"{again.url}/q/messages")
    assert got.status_code == 200 and got.content == b"kept"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_ends_long_polls_at_once_and_lets_a_slow_post_finish(start_server, sig: int) -> None:
    """A long poll may have up to an hour to wait: the stop answers it 204 within about a second
    (before, it held the stop for the 30 s of uvicorn's graceful shutdown, then was answered
    500). A POST whose body is still arriving is answered 201 and stored."""
    server = start_server()
    httpx.put(f"{server.url}/q").raise_for_status()
    httpx.put(f"{server.url}/idle").raise_for_status()
    results: dict[str, object] = {}

    def long_poll() -> None:
        response = httpx.get(f"{server.url}/idle/messages", params={"wait": 600}, timeout=60)
        results["poll"] = (response.status_code, time.monotonic())

    poller = threading.Thread(target=long_poll)
    poller.start()
    # A POST whose body is under way when the signal comes.
    body = b"sent across the shutdown"
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    s.sendall(
        b"POST /q/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body[:5]
    )
    await_waiting_receives(server.url, "idle", 1)
    time.sleep(0.2)  # and the POST's first bytes have reached the server
    assert server.process is not None
    signalled = time.monotonic()
    server.process.send_signal(sig)
    time.sleep(0.3)
    s.sendall(body[5:])
    answer = read_all(s)
    s.close()
    poller.join(60)
    assert status_of(answer) == 201, answer
    assert re.search(rb"(?i)x-message-id: 0\.[0-9a-f]{8}\r", answer), answer
    status, ended = results["poll"]  # type: ignore[misc]
    assert status == 204, results
    assert ended - signalled < 3, f"the long poll ended {ended - signalled:.1f} s after the signal"
    assert server.stop() == 0, server.log()
    assert time.monotonic() - signalled < 10, f"the server took {time.monotonic() - signalled:.1f} s to stop"
    assert len(server.start_lines()) == 1, server.log()
    assert "Traceback" not in server.log(), server.log()
    # Synced and closed: a new server has the message the POST was answered 201 for.
    again = start_server(data=server.data)
    got = httpx.get(f"{again.url}/q/messages")
    assert got.status_code == 200 and got.content == body


def test_a_stop_ends_sqs_long_polls_at_once(start_server) -> None:
    """An SQS ReceiveMessage waiting (20 s, the longest SQS allows, and a queue's default wait)
    is answered with no message within about a second of SIGTERM; before, it held the stop for
    the rest of its wait."""
    server = start_server()
    sqs = sqs_client(server.url)
    urls = [sqs.create_queue(QueueName="idle")["QueueUrl"],
            sqs.create_queue(QueueName="waits", Attributes={"ReceiveMessageWaitTimeSeconds": "20"})["QueueUrl"]]
    results: dict[str, object] = {}

    def long_poll(url: str, **wait: int) -> None:
        answer = sqs_client(server.url, read_timeout=60).receive_message(QueueUrl=url, **wait)
        results[url] = (answer.get("Messages"), time.monotonic())

    pollers = [threading.Thread(target=long_poll, args=(urls[0],), kwargs={"WaitTimeSeconds": 20}),
               threading.Thread(target=long_poll, args=(urls[1],))]
    for poller in pollers:
        poller.start()
    time.sleep(1.5)  # both polls are waiting
    assert not results
    assert server.process is not None
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    for poller in pollers:
        poller.join(30)
    for url in urls:
        messages, ended = results[url]  # type: ignore[misc]
        assert messages is None
        assert ended - signalled < 3, f"{url}: the poll ended {ended - signalled:.1f} s after the signal"
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log(), server.log()


def test_new_connections_are_refused_once_stopping(start_server) -> None:
    server = start_server()
    assert server.stop() == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/healthz", timeout=2)


def test_workers(start_server) -> None:
    """``--workers 2``: two processes share the data directory; every one sees every message."""
    server = start_server("--workers", "2")
    with httpx.Client(base_url=server.url) as client:
        client.put("/w").raise_for_status()
        ids = [client.post("/w/messages", content=b"m%d" % i).headers["x-message-id"] for i in range(20)]
        assert len(set(ids)) == 20
        bodies = []
        while (r := client.get("/w/messages")).status_code == 200:
            bodies.append(r.content)
            client.delete(f"/w/messages/{r.headers['x-message-id']}").raise_for_status()
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(20))
    server.check_clean_stop(signal.SIGTERM)



@pytest.mark.parametrize("workers", ["1", "2"])
def test_port_zero_start_line_names_the_port_bound(tmp_path: Path, workers: str) -> None:
    """``--port 0``: the system picks a port, and the start line names it (not 0). The port takes
    connections once the line is out, before the workers have started (none is refused)."""
    log_file = tmp_path / "server.log"
    with open(log_file, "wb") as out:
        process = subprocess.Popen(
            [str(JOURNALQ), "serve", "--data", str(tmp_path / "data"), "--port", "0", "--workers", workers],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 30
        match = None
        while match is None and time.monotonic() < deadline and process.poll() is None:
            match = START_LINE.search(log_file.read_text(errors="replace"))
            time.sleep(0.05)
        assert match is not None, log_file.read_text(errors="replace")
        port = int(match["port"])
        assert port != 0
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(40) == 0, log_file.read_text(errors="replace")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_sent_again_and_again_still_ends_in_a_clean_exit(start_server, sig: int) -> None:
    """A supervisor (or a test harness) may repeat its stop signal until the process is gone. One
    that came while Python finalized, after the clean stop, met the default action that Python
    puts back then: the server died of it (exit -15 or -2) after stopping cleanly, and a SIGINT
    sent again could hang the stop for good. A second SIGINT was uvicorn's forced exit (the app's
    shutdown skipped, a traceback of the lifespan it cancelled); it now asks for the stop under
    way, as SIGTERM does (``journalq.server.stopping``)."""
    server = start_server()
    httpx.put(f"{server.url}/q").raise_for_status()
    httpx.post(f"{server.url}/q/messages", content=b"kept").raise_for_status()
    assert server.process is not None
    deadline = time.monotonic() + 30
    while server.process.poll() is None and time.monotonic() < deadline:
        server.process.send_signal(sig)
        time.sleep(0.002)
    assert server.process.wait(10) == 0, server.log()
    assert "Traceback" not in server.log(), server.log()
    with Broker(server.data) as broker:
        assert [m.body for m in broker.queue("q", create=False).receive(10)] == [b"kept"]


@pytest.mark.parametrize("collecting", [True, False])
def test_a_send_that_comes_after_the_stores_stopped_is_503(tmp_path, collecting: bool) -> None:
    """A request still open when the server stops (uvicorn's graceful wait over) reaches a store
    pool that is shut down: a 503 with Retry-After, nothing stored (it was a 500 and a traceback).
    ``collecting``: the send would collect the queue, and is stored in a thread; or not (a gc
    interval longer than the machine's uptime), when a batch is appended on the event loop
    unless the stores stopped (it was stored, and answered 503)."""
    import asyncio

    import httpx

    from journalq.queue import Broker
    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    if not collecting:
        with Broker(tmp_path) as broker:
            assert time.monotonic() < 10**8
            broker.queue("q", task_gc_interval=10**8).send(b"first: it collects")
            assert [m.body for m in broker.queue("q").receive(1, visibility_timeout=0)] == [b"first: it collects"]

    async def run() -> list[httpx.Response]:
        app = create_app(ServerConfig(data=tmp_path, retry_after=3))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            async with app.router.lifespan_context(app):
                assert (await client.put("/q")).status_code == (201 if collecting else 200)  # (200: there)
            return [await client.post("/q/messages", content=b"late"),
                    await client.post("/", content=b'{"QueueUrl": "http://testserver/000000000000/q",'
                                      b' "MessageBody": "late"}',
                                      headers={"X-Amz-Target": "AmazonSQS.SendMessage",
                                               "Content-Type": "application/x-amz-json-1.0"})]

    answers = asyncio.run(run())
    assert [a.status_code for a in answers] == [503, 503]
    assert all(a.headers["retry-after"] == "3" for a in answers)
    with Broker(tmp_path) as broker:
        assert broker.queue("q").stats().available == (0 if collecting else 1)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigint_sent_again_while_the_server_stops_still_stops_it_gracefully(
    start_server: Callable[..., ServerProcess], workers: str,
) -> None:
    """A second SIGINT (Ctrl-C pressed twice: the terminal signals every process of the group,
    the workers of ``--workers`` too) was uvicorn's forced exit: the request under way was cut
    off (a 500 for a long poll that would have ended with 204 within a second), the app's
    shutdown skipped (journals neither synced nor closed) and its lifespan cancelled, tracebacks
    in the log. Every signal now asks for the same graceful stop, as SIGTERM's do."""
    server = start_server("--workers", workers)
    httpx.put(f"{server.url}/q").raise_for_status()
    httpx.post(f"{server.url}/q/messages", content=b"kept").raise_for_status()
    httpx.put(f"{server.url}/empty").raise_for_status()
    polled: list[int] = []
    poll = threading.Thread(target=lambda: polled.append(
        httpx.get(f"{server.url}/empty/messages", params={"wait": 20}, timeout=30).status_code))
    poll.start()
    await_waiting_receives(server.url, "empty", 1)
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGINT)  # as a terminal does (the server leads its group)
    time.sleep(0.1)  # the stop has begun: the poll is ending
    os.killpg(server.process.pid, signal.SIGINT)
    assert server.process.wait(30) == 0, server.log()
    poll.join(30)
    assert polled == [204], server.log()
    assert "Traceback" not in server.log(), server.log()
    with Broker(server.data) as broker:
        assert [m.body for m in broker.queue("q", create=False).receive(10)] == [b"kept"]
