"""The load generator of the server benchmark (started by bench_server.py, one process for the run).

It runs in a process of its own, apart from the servers it drives, and takes one JSON command per
line on stdin, answering each with one JSON line on stdout:

``{"cmd": "prepare", "api": API, "endpoint": URL, "queue": NAME, "clients": N, "client": CLIENT}``
    API is ``"rest"``, ``"sqs-json"`` or ``"sqs"``; CLIENT is ``"wrk"`` or ``"python"``.
    Make the queue (REST ``PUT /NAME``; SQS ``CreateQueue``) and get N clients ready. Answers
    ``{"ready": true, "queue_url": ..., "extra_min": a, "extra_max": b}``: after the run the queue
    must hold the messages answered plus between a and b more (the untimed warm-up message each
    client sends; with wrk, the requests under way when it stopped, which it does not count).
``{"cmd": "go", "seconds": S}``
    The N clients send 100-byte messages one after another, each as soon as its previous one is
    answered, for S seconds. Answers ``count`` (requests answered 2xx), ``errors``, ``seconds``
    (from the start to the last answer), ``latency`` (ms: median, p90, p99, max), ``cpu`` (this
    process's CPU seconds over the run, user + system, every thread; with wrk, wrk's).
``{"cmd": "finish"}``
    Count the messages the queue holds (REST ``GET /NAME``'s ``available``; SQS
    ``ApproximateNumberOfMessages``), then delete the queue. Answers ``{"stored": n}``.
``{"cmd": "forget"}``
    Drop the clients' queue without touching it (when the load is spread over several generator
    processes, one of them finishes the queue they shared).

The requests:

* ``rest``: mq's ``POST /NAME/messages``; ``sqs-json``: SQS's JSON ``SendMessage`` (``POST /``
  with ``X-Amz-Target``), both prebuilt and sent again and again by a lean client: ``wrk`` (C,
  a few µs of CPU per request) when the benchmark finds it, else a minimal HTTP/1.1 keep-alive
  client on asyncio (uvloop when installed), one connection per client, which reads the answer's
  head up to the blank line and its body by ``Content-Length`` (a few tens of µs per request).
* ``sqs``: boto3 ``send_message``, one client (made from one session) per thread, retries off.
  boto3 spends about as much CPU per request as a light server does; the benchmark reports how
  much of the machine this process used.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import sys
import tempfile
import threading
import time
from typing import Any
from urllib.parse import urlsplit

BODY = b"x" * 100  # the message body: 100 bytes (ASCII, so the same as an SQS MessageBody)


def _cpu() -> float:
    return time.process_time()


# -- lean clients: one prebuilt request, sent again and again ------------------------------------


def _stats(latencies: list[float]) -> dict[str, float]:
    """Median, p90, p99 and max of one run's latencies (ms)."""
    values = sorted(latencies)
    if not values:
        return {}

    def rank(p: float) -> float:  # nearest rank, as the harness's percentile()
        return values[max(0, min(len(values) - 1, round(p / 100 * len(values) + 0.5) - 1))]

    return {"median": rank(50), "p90": rank(90), "p99": rank(99), "max": values[-1]}


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
        self.reader, self.writer, self.request = reader, writer, request

    async def call(self) -> int:
        """Send the request, read the whole answer; its status."""
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise RuntimeError("chunked answers are not handled by this client")
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def _http(
    host: str, port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One request on a connection of its own (setup and checks, not timed)."""
    reader, writer = await asyncio.open_connection(host, port)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n{extra}"
            f"Connection: close\r\n\r\n".encode() + body
        )
        data = await reader.read()
    finally:
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head[9:12]), rest


SQS_JSON = "application/x-amz-json-1.0"


class Target:
    """What a lean client sends: mq's REST ``POST /{queue}/messages`` (api ``rest``) or SQS's JSON
    ``SendMessage`` (api ``sqs-json``), with the setup and checks around a run."""

    def __init__(self, api: str, endpoint: str, queue: str) -> None:
        url = urlsplit(endpoint)
        self.api, self.queue = api, queue
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.path, self.body, self.status, self.url = "", b"", 0, ""
        self.headers: dict[str, str] = {}

    async def _sqs(self, action: str, request: dict[str, Any]) -> dict[str, Any]:
        headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": SQS_JSON}
        status, body = await _http(self.host, self.port, "POST", "/", json.dumps(request).encode(), headers)
        if status != 200:
            raise RuntimeError(f"{action}: {status} {body[:200]!r}")
        return json.loads(body)

    async def prepare(self) -> None:
        if self.api == "rest":
            status, body = await _http(self.host, self.port, "PUT", f"/{self.queue}")
            if status not in (200, 201):
                raise RuntimeError(f"PUT /{self.queue}: {status} {body[:200]!r}")
            self.path, self.body, self.status = f"/{self.queue}/messages", BODY, 201
            self.headers = {"Content-Type": "application/octet-stream"}
            self.url = f"http://{self.host}:{self.port}/{self.queue}"
        else:
            self.url = (await self._sqs("CreateQueue", {"QueueName": self.queue}))["QueueUrl"]
            self.path, self.status = "/", 200
            self.body = json.dumps({"QueueUrl": self.url, "MessageBody": BODY.decode()}).encode()
            self.headers = {"X-Amz-Target": "AmazonSQS.SendMessage", "Content-Type": SQS_JSON}

    def request(self) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"{extra}Content-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body

    async def finish(self) -> int:
        """The messages the queue holds; then it is deleted."""
        if self.api == "rest":
            status, body = await _http(self.host, self.port, "GET", f"/{self.queue}")
            if status != 200:
                raise RuntimeError(f"GET /{self.queue}: {status} {body[:200]!r}")
            stored = int(json.loads(body)["available"])
            status, body = await _http(self.host, self.port, "DELETE", f"/{self.queue}")
            if status != 204:
                raise RuntimeError(f"DELETE /{self.queue}: {status} {body[:200]!r}")
            return stored
        got = await self._sqs(
            "GetQueueAttributes", {"QueueUrl": self.url, "AttributeNames": ["ApproximateNumberOfMessages"]}
        )
        await self._sqs("DeleteQueue", {"QueueUrl": self.url})
        return int(got["Attributes"]["ApproximateNumberOfMessages"])


class RawLoad:
    """The Python lean client: asyncio (uvloop when installed), one keep-alive connection per
    client, each warmed with one (untimed) request."""

    def __init__(self, target: Target, clients: int) -> None:
        self.target, self.n = target, clients
        self.clients: list[RawClient] = []

    async def prepare(self) -> dict[str, Any]:
        await self.target.prepare()
        request = self.target.request()
        for _ in range(self.n):
            reader, writer = await asyncio.open_connection(self.target.host, self.target.port)
            self.clients.append(RawClient(reader, writer, request))
        statuses = await asyncio.gather(*(c.call() for c in self.clients))
        if any(s != self.target.status for s in statuses):
            raise RuntimeError(f"warm-up requests answered {sorted(set(statuses))}")
        # Stored beyond the answered ones: exactly the warm-up messages.
        return {"queue_url": self.target.url, "extra_min": self.n, "extra_max": self.n}

    async def go(self, seconds: float) -> dict[str, Any]:
        latencies: list[float] = []
        errors: list[int] = []
        ends: list[float] = []
        expected = self.target.status

        async def client_loop(client: RawClient, deadline: float) -> None:
            perf = time.perf_counter
            end = perf()
            while end < deadline:
                t0 = perf()
                status = await client.call()
                end = perf()
                if status == expected:
                    latencies.append((end - t0) * 1000)
                else:
                    errors.append(status)
            ends.append(end)

        cpu0 = _cpu()
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(c, start + seconds) for c in self.clients))
        cpu = _cpu() - cpu0
        for client in self.clients:
            client.close()
        return {"count": len(latencies), "errors": len(errors), "error_statuses": sorted(set(errors)),
                "seconds": max(ends) - start, "latency": _stats(latencies), "cpu": cpu}

    async def finish(self) -> int:
        return await self.target.finish()


WRK_SCRIPT = """
wrk.method = "POST"
wrk.path = {path}
wrk.body = {body}
{headers}
"""


def _lua_string(text: str) -> str:
    return '"' + "".join(c if c.isalnum() or c in " -_./:{},[]" else f"\\{ord(c):03d}" for c in text) + '"'


def _wrk_ms(text: str) -> float:
    """A duration as wrk prints it (``850.00us``, ``1.23ms``, ``2.00s``) in ms."""
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("m", 60e3), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"not a wrk duration: {text!r}")


def wrk_outcome(text: str) -> dict[str, Any]:
    """What wrk's output (with ``--latency``) says of a run: ``count`` (requests answered 2xx or
    3xx), ``errors`` (the others, and socket errors), ``error_statuses``, ``seconds`` (the run's
    time as wrk reports it) and ``latency`` (ms: median, p90, p99, max)."""
    answered = re.search(r"(\d+) requests in ([\d.]+)(m?s)", text)
    if answered is None:
        raise RuntimeError(f"no request count in wrk's output: {text}")
    wall = float(answered[2]) * (1e-3 if answered[3] == "ms" else 1.0)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = int(failed[1]) if failed else 0
    statuses = [f"{errors} non-2xx"] if errors else []
    if sockets and any(int(x) for x in sockets.groups()):
        errors += sum(int(x) for x in sockets.groups())
        statuses.append(sockets[0])
    latency = {name: _wrk_ms(m[1]) for name, m in (
        (name, re.search(rf"^\s+{p}%\s+(\S+)", text, re.M))
        for name, p in (("median", 50), ("p90", 90), ("p99", 99))
    ) if m}
    top = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", text)
    if top:
        latency["max"] = _wrk_ms(top[1])
    return {"count": int(answered[1]) - errors, "errors": errors, "error_statuses": statuses, "seconds": wall,
            "latency": latency}


class WrkLoad:
    """wrk (C, one thread, event loop on epoll): N keep-alive connections, each sending its next
    request as soon as the last is answered, for the run's time. It costs a few µs of CPU per
    request, so the server gets nearly the whole of the machine's other core. wrk counts the
    requests answered; those under way when it stops are neither counted nor known: they may be
    stored or not (0 to N messages beyond the answered ones)."""

    def __init__(self, target: Target, clients: int) -> None:
        self.target, self.n = target, clients
        self.script = ""

    async def prepare(self) -> dict[str, Any]:
        await self.target.prepare()
        headers = "\n".join(f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in self.target.headers.items())
        fd, self.script = tempfile.mkstemp(suffix=".lua", prefix="journalq-wrk-")
        with os.fdopen(fd, "w") as f:
            f.write(WRK_SCRIPT.format(path=_lua_string(self.target.path), body=_lua_string(self.target.body.decode()),
                                      headers=headers))
        return {"queue_url": self.target.url, "extra_min": 0, "extra_max": self.n}

    async def go(self, seconds: float) -> dict[str, Any]:
        endpoint = f"http://{self.target.host}:{self.target.port}"
        whole = max(1, round(seconds))  # wrk takes whole seconds; the rate is over the time it reports
        command = [
            "wrk", "-t1", f"-c{self.n}", f"-d{whole}s", "--timeout", "60s", "--latency", "-s", self.script, endpoint
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        text = out.decode(errors="replace")
        if process.returncode != 0:
            raise RuntimeError(f"wrk failed ({process.returncode}): {text}")
        os.unlink(self.script)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return {**wrk_outcome(text), "cpu": cpu}

    async def finish(self) -> int:
        return await self.target.finish()


# -- SQS: boto3, a client per thread --------------------------------------------------------------

_sessions: dict[str, Any] = {}
_clients: dict[str, list[Any]] = {}  # endpoint -> clients made so far (reused between runs)


def _boto3_clients(endpoint: str, n: int) -> list[Any]:
    import boto3
    from botocore.config import Config

    session = _sessions.setdefault(endpoint, boto3.session.Session())
    made = _clients.setdefault(endpoint, [])
    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=1,
                    connect_timeout=10, read_timeout=60)
    while len(made) < n:  # made one after another in this thread: sessions are not thread-safe
        made.append(session.client(
            "sqs", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
            aws_secret_access_key="bench-secret", config=config,
        ))
    return made[:n]


class SqsLoad:
    def __init__(self, endpoint: str, queue: str, clients: int) -> None:
        self.endpoint, self.queue, self.n = endpoint, queue, clients
        self.clients = _boto3_clients(endpoint, clients)
        self.url = ""

    def _threads(self, work) -> None:
        threads = [threading.Thread(target=work, args=(c,)) for c in self.clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def prepare(self) -> str:
        self.url = self.clients[0].create_queue(QueueName=self.queue)["QueueUrl"]
        body = BODY.decode()
        failures: list[BaseException] = []

        def warm(client: Any) -> None:
            try:
                client.send_message(QueueUrl=self.url, MessageBody=body)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        self._threads(warm)
        if failures:
            raise RuntimeError(f"warm-up send_message failed: {failures[0]!r}")
        return self.url

    def go(self, seconds: float) -> dict[str, Any]:
        body = BODY.decode()
        url = self.url
        latencies: list[float] = []
        errors: list[str] = []
        ends: list[float] = []
        barrier = threading.Barrier(self.n + 1)
        deadline = [0.0]

        def work(client: Any) -> None:
            send, perf = client.send_message, time.perf_counter
            barrier.wait()
            end = perf()
            while end < deadline[0]:
                t0 = perf()
                try:
                    send(QueueUrl=url, MessageBody=body)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    end = perf()
                    errors.append(type(exc).__name__ + ": " + str(exc)[:200])
                    continue
                end = perf()
                latencies.append((end - t0) * 1000)
            ends.append(end)

        threads = [threading.Thread(target=work, args=(c,)) for c in self.clients]
        for t in threads:
            t.start()
        cpu0 = _cpu()
        start = time.perf_counter()
        deadline[0] = start + seconds
        barrier.wait()
        for t in threads:
            t.join()
        cpu = _cpu() - cpu0
        return {"count": len(latencies), "errors": len(errors), "error_statuses": sorted(set(errors))[:5],
                "seconds": max(ends) - start, "latency": _stats(latencies), "cpu": cpu}

    def finish(self) -> int:
        client = self.clients[0]
        attributes = client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["ApproximateNumberOfMessages"])
        client.delete_queue(QueueUrl=self.url)
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


# -- the command loop -----------------------------------------------------------------------------


async def main() -> None:
    loop = asyncio.get_running_loop()
    load: RawLoad | WrkLoad | SqsLoad | None = None
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        command = json.loads(line)
        cmd = command["cmd"]
        if cmd == "prepare":
            api, clients = command["api"], command["clients"]
            if api == "sqs":
                load = SqsLoad(command["endpoint"], command["queue"], clients)
                url = await loop.run_in_executor(None, load.prepare)
                answer: dict[str, Any] = {"queue_url": url, "extra_min": clients, "extra_max": clients}
            else:
                target = Target(api, command["endpoint"], command["queue"])
                load = WrkLoad(target, clients) if command.get("client") == "wrk" else RawLoad(target, clients)
                answer = await load.prepare()
            answer["ready"] = True
        elif cmd == "go":
            assert load is not None
            if isinstance(load, SqsLoad):
                answer = load.go(command["seconds"])  # threads; nothing else runs meanwhile
            else:
                answer = await load.go(command["seconds"])
        elif cmd == "finish":
            assert load is not None
            if isinstance(load, SqsLoad):
                stored = await loop.run_in_executor(None, load.finish)
            else:
                stored = await load.finish()
            answer, load = {"stored": stored}, None
        elif cmd == "forget":  # another generator process finished the shared queue
            if isinstance(load, RawLoad):
                for client in load.clients:
                    client.close()
            answer, load = {"forgotten": True}, None
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
