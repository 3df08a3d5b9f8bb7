"""The load generator of the server benchmark (started by bench_server.py, one process for the run).

It runs in a process of its own, apart from the servers it drives, and takes one JSON command per
line on stdin, answering each with one JSON line on stdout:

``{"cmd": "prepare", "api": "rest"|"sqs", "endpoint": URL, "queue": NAME, "clients": N}``
    Make the queue (REST ``PUT /NAME``; SQS ``CreateQueue``), open N clients and send one
    (untimed) message with each, so that connections are open and clients warm. Answers
    ``{"ready": true, "queue_url": ...}``.
``{"cmd": "go", "seconds": S}``
    The N clients send 100-byte messages one after another, each as soon as its previous one is
    answered, for S seconds. Answers ``count`` (requests answered 2xx), ``errors``, ``seconds``
    (from the start to the last answer), ``latencies`` (ms, one per request), ``cpu`` (this
    process's CPU seconds over the run: user + system, every thread).
``{"cmd": "finish"}``
    Count the messages the queue holds (REST ``GET /NAME``'s ``available``; SQS
    ``ApproximateNumberOfMessages``), then delete the queue. Answers ``{"stored": n}``.
``{"cmd": "forget"}``
    Drop the clients' queue without touching it (when the load is spread over several generator
    processes, one of them finishes the queue they shared).

Two kinds of client:

* ``rest``: a minimal HTTP/1.1 keep-alive client on asyncio (uvloop when installed): one
  connection per client, a prebuilt request written, the answer's head read up to the blank line
  and its body by ``Content-Length``. A few tens of microseconds of CPU per request: far less than
  the server spends.
* ``sqs``: boto3 ``send_message``, one client (made from one session) per thread, retries off.
  boto3 spends about as much CPU per request as a light server does; the benchmark reports how
  much of the machine this process used.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

BODY = b"x" * 100  # the message body: 100 bytes (ASCII, so the same as an SQS MessageBody)


def _cpu() -> float:
    return time.process_time()


# -- REST: raw HTTP/1.1 on asyncio ----------------------------------------------------------------


class RestClient:
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


async def _http(host: str, port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on a connection of its own (setup and checks, not timed)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n".encode() + body
        )
        data = await reader.read()
    finally:
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head[9:12]), rest


class RestLoad:
    def __init__(self, endpoint: str, queue: str, clients: int) -> None:
        url = urlsplit(endpoint)
        self.host, self.port, self.queue, self.n = url.hostname or "127.0.0.1", url.port or 80, queue, clients
        self.clients: list[RestClient] = []

    async def prepare(self) -> str:
        status, body = await _http(self.host, self.port, "PUT", f"/{self.queue}")
        if status not in (200, 201):
            raise RuntimeError(f"PUT /{self.queue}: {status} {body[:200]!r}")
        request = (
            f"POST /{self.queue}/messages HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        for _ in range(self.n):
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.clients.append(RestClient(reader, writer, request))
        statuses = await asyncio.gather(*(c.call() for c in self.clients))
        if any(s != 201 for s in statuses):
            raise RuntimeError(f"warm-up POSTs answered {sorted(set(statuses))}")
        return f"http://{self.host}:{self.port}/{self.queue}"

    async def go(self, seconds: float) -> dict[str, Any]:
        latencies: list[float] = []
        errors: list[int] = []
        ends: list[float] = []

        async def client_loop(client: RestClient, deadline: float) -> None:
            perf = time.perf_counter
            end = perf()
            while end < deadline:
                t0 = perf()
                status = await client.call()
                end = perf()
                if status == 201:
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
                "seconds": max(ends) - start, "latencies": latencies, "cpu": cpu}

    async def finish(self) -> int:
        status, body = await _http(self.host, self.port, "GET", f"/{self.queue}")
        if status != 200:
            raise RuntimeError(f"GET /{self.queue}: {status} {body[:200]!r}")
        stored = int(json.loads(body)["available"])
        status, body = await _http(self.host, self.port, "DELETE", f"/{self.queue}")
        if status != 204:
            raise RuntimeError(f"DELETE /{self.queue}: {status} {body[:200]!r}")
        return stored


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
                "seconds": max(ends) - start, "latencies": latencies, "cpu": cpu}

    def finish(self) -> int:
        client = self.clients[0]
        attributes = client.get_queue_attributes(QueueUrl=self.url, AttributeNames=["ApproximateNumberOfMessages"])
        client.delete_queue(QueueUrl=self.url)
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


# -- the command loop -----------------------------------------------------------------------------


async def main() -> None:
    loop = asyncio.get_running_loop()
    load: RestLoad | SqsLoad | None = None
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        command = json.loads(line)
        cmd = command["cmd"]
        if cmd == "prepare":
            if command["api"] == "rest":
                load = RestLoad(command["endpoint"], command["queue"], command["clients"])
                url = await load.prepare()
            else:
                load = SqsLoad(command["endpoint"], command["queue"], command["clients"])
                url = await loop.run_in_executor(None, load.prepare)
            answer: dict[str, Any] = {"ready": True, "queue_url": url}
        elif cmd == "go":
            assert load is not None
            if isinstance(load, RestLoad):
                answer = await load.go(command["seconds"])
            else:
                answer = load.go(command["seconds"])  # threads; nothing else runs meanwhile
        elif cmd == "finish":
            assert load is not None
            if isinstance(load, RestLoad):
                stored = await load.finish()
            else:
                stored = await loop.run_in_executor(None, load.finish)
            answer, load = {"stored": stored}, None
        elif cmd == "forget":  # another generator process finished the shared queue
            if isinstance(load, RestLoad):
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
