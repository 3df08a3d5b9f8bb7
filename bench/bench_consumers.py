"""consumers: REST and SQS consumers against the server (``journalq serve --sync always``).

Each client fetches a message (``GET /{queue}/messages``) and deletes it by the id the fetch gave
(``DELETE /{queue}/messages/{id}``), or, through SQS's JSON protocol, receives one
(``ReceiveMessage``) and deletes it by its receipt (``DeleteMessage``), again and again, for a
fixed time (5 s; 1.5 s with ``--quick``), from a queue filled beforehand (through the library,
by this process, while the server runs: many processes share a data directory), with 1, 16 and
64 clients. A delete is a durable write (a fetch's delivery is not synced), so concurrent
consumers share syncs as senders do; the server takes both in batches per queue (one receive,
or one delete and its sync, for the requests under way). Beside it, in the same run, the
physical limit: write 100 bytes + fdatasync of one file, one after another (as the server
benchmark's).

The client: ``wrk`` when it is on PATH, with a Lua script (a fetched id or receipt goes into a
list; a connection's next request deletes one from it if any, else fetches), else a Python
asyncio client (one connection per client, a fetch then its delete). The figure is the messages
consumed per second: the server's ``journalq_messages_deleted_total`` over the run (with wrk, up
to one a client more: the requests under way when it stops, which it does not count), over the
run's time.

Each run is checked: the queue's available and in-flight messages and those deleted add up to
what was filled (nothing lost, nothing deleted twice), and the queue did not run dry (which
would make the figure a floor).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_server import CLIENTS, Server, _fsync_loop, _free_port, _tool
from harness import Context, Result, ms, rate, summarize
from server_load import _stats, wrk_outcome

from journalq.queue import Broker

BODY = b"x" * 100

WRK_SCRIPTS = {
    "rest": """
local taken = {{}}
function request()
  local n = #taken
  if n > 0 then
    local id = taken[n]
    taken[n] = nil
    return wrk.format("DELETE", "/{queue}/messages/" .. id)
  end
  return wrk.format("GET", "/{queue}/messages")
end
function response(status, headers, body)
  if status == 200 then
    taken[#taken + 1] = headers["x-message-id"]
  end
end
""",
    "sqs-json": """
local taken = {{}}
local queue_url = "{queue_url}"
wrk.headers["Content-Type"] = "application/x-amz-json-1.0"
function request()
  local n = #taken
  if n > 0 then
    local receipt = taken[n]
    taken[n] = nil
    wrk.headers["X-Amz-Target"] = "AmazonSQS.DeleteMessage"
    return wrk.format("POST", "/", nil, '{{"QueueUrl": "' .. queue_url .. '", "ReceiptHandle": "' .. receipt .. '"}}')
  end
  wrk.headers["X-Amz-Target"] = "AmazonSQS.ReceiveMessage"
  return wrk.format("POST", "/", nil, '{{"QueueUrl": "' .. queue_url .. '"}}')
end
function response(status, headers, body)
  if status == 200 then
    local receipt = string.match(body, '"ReceiptHandle": "([^"]+)"')
    if receipt then taken[#taken + 1] = receipt end
  end
end
""",
}
API_NAMES = {"rest": "REST fetch + delete by id", "sqs-json": "SQS JSON ReceiveMessage + DeleteMessage"}


class Consumers:
    """One run: a fresh queue filled with ``filled`` messages, ``clients`` consumers for
    ``seconds``; the result with the server's counts before and after."""

    def __init__(self, server: Server, data: Path, api: str, queue: str, clients: int, filled: int) -> None:
        self.server, self.data, self.api, self.queue = server, data, api, queue
        self.clients, self.filled = clients, filled
        self.queue_url = f"{server.endpoint}/000000000000/{queue}"

    def fill(self) -> None:
        status, body = self.server.request("PUT", f"/{self.queue}")
        if status != 201:
            raise RuntimeError(f"PUT /{self.queue}: {status} {body[:200]!r}")
        with Broker(self.data, sync="none") as broker:  # beside the server, as another process
            queue = broker.queue(self.queue, create=False)
            for start in range(0, self.filled, 1000):
                queue.send_many([BODY] * min(1000, self.filled - start))
        os.sync()  # (off the clock: the server then reads what the page cache holds)

    def run(self, seconds: float, client: str) -> dict[str, Any]:
        self.fill()
        deleted_before, syncs_before = self._deleted(), self.server.syncs() or 0.0
        cpu_before = self.server.cpu()
        if client == "wrk":
            outcome = self._wrk(seconds)
        else:
            outcome = asyncio.run(self._python(seconds))
        cpu = self.server.cpu() - cpu_before
        deleted, stats = self._settled()
        deleted -= deleted_before
        syncs = (self.server.syncs() or 0.0) - syncs_before
        if stats["available"] + stats["in_flight"] + deleted != self.filled:
            raise RuntimeError(f"queue {self.queue}: filled {self.filled}, deleted {deleted:.0f}, now {stats}: "
                               "messages lost or deleted twice")
        if stats["available"] == 0:
            raise RuntimeError(f"queue {self.queue} ran dry ({self.filled} filled): fill more")
        if outcome["errors"]:
            raise RuntimeError(f"{self.clients} consumers of {self.queue}: {outcome['errors']} requests failed")
        self.server.request("DELETE", f"/{self.queue}")
        requests = outcome["requests"]
        return {
            "rate": deleted / outcome["seconds"],
            "requests_per_s": round(requests / outcome["seconds"], 1),
            "deleted": int(deleted),
            "seconds": round(outcome["seconds"], 3),
            "median_ms": outcome["latency"].get("median", float("nan")),
            "p99_ms": outcome["latency"].get("p99", float("nan")),
            "server_cores": round(cpu / outcome["seconds"], 3),
            "server_us_per_request": round(cpu / requests * 1e6, 2) if requests else None,
            "syncs_per_msg": round(syncs / deleted, 5) if deleted else None,
        }

    def _settled(self) -> tuple[float, dict[str, Any]]:
        """The messages deleted so far and the queue's counts, once the requests under way when
        the clients stopped are done (the deletes counted the same before and after the counts)."""
        for _ in range(50):
            deleted = self._deleted()
            status, body = self.server.request("GET", f"/{self.queue}")
            if status != 200:
                raise RuntimeError(f"GET /{self.queue}: {status} {body[:200]!r}")
            if self._deleted() == deleted:
                return deleted, json.loads(body)
            time.sleep(0.1)
        raise RuntimeError(f"the deletes of queue {self.queue} did not settle within 5 s")

    def _deleted(self) -> float:
        status, body = self.server.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics: {status}")
        found = re.search(rf'^journalq_messages_deleted_total\{{queue="{re.escape(self.queue)}"\}} (\S+)$',
                          body.decode(), re.M)
        return float(found[1]) if found else 0.0

    def _wrk(self, seconds: float) -> dict[str, Any]:
        fd, script = tempfile.mkstemp(suffix=".lua", prefix="journalq-consume-")
        with os.fdopen(fd, "w") as f:
            f.write(WRK_SCRIPTS[self.api].format(queue=self.queue, queue_url=self.queue_url))
        try:
            whole = max(1, round(seconds))  # wrk takes whole seconds; the rate is over the time it reports
            finished = _run(["wrk", "-t1", f"-c{self.clients}", f"-d{whole}s", "--timeout", "60s", "--latency",
                             "-s", script, self.server.endpoint])
        finally:
            os.unlink(script)
        outcome = wrk_outcome(finished)
        return {**outcome, "requests": outcome["count"] + outcome["errors"]}

    async def _python(self, seconds: float) -> dict[str, Any]:
        host, port = "127.0.0.1", self.server.port
        latencies: list[float] = []
        counts = {"requests": 0, "errors": 0}

        def request(method: str, path: str, payload: dict[str, Any] | None = None, action: str = "") -> bytes:
            if payload is None:
                return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            body = json.dumps(payload).encode()
            return (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nX-Amz-Target: AmazonSQS.{action}\r\n"
                    f"Content-Type: application/x-amz-json-1.0\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

        if self.api == "rest":
            fetch = request("GET", f"/{self.queue}/messages")
        else:
            fetch = request("POST", "/", {"QueueUrl": self.queue_url}, "ReceiveMessage")

        def delete_of(head: bytes, body: bytes) -> bytes | None:
            """The delete of what a fetch answered, None when it got nothing."""
            if self.api == "rest":
                given = re.search(rb"(?im)^x-message-id:\s*(\S+)", head)
                return None if given is None else request("DELETE", f"/{self.queue}/messages/{given[1].decode()}")
            messages = json.loads(body).get("Messages")
            if not messages:
                return None
            payload = {"QueueUrl": self.queue_url, "ReceiptHandle": messages[0]["ReceiptHandle"]}
            return request("POST", "/", payload, "DeleteMessage")

        async def call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       request: bytes) -> tuple[int, bytes, bytes]:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            body = await reader.readexactly(int(length[1])) if length else b""
            latencies.append((time.perf_counter() - started) * 1000)
            counts["requests"] += 1
            return int(head[9:12]), head, body

        async def consumer(deadline: float) -> None:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                while time.perf_counter() < deadline:
                    status, head, body = await call(reader, writer, fetch)
                    delete = delete_of(head, body) if status == 200 else None
                    if delete is not None:
                        status, _, _ = await call(reader, writer, delete)
                    if status >= 300:
                        counts["errors"] += 1
            finally:
                writer.close()

        started = time.perf_counter()
        await asyncio.gather(*(consumer(started + seconds) for _ in range(self.clients)))
        return {**counts, "seconds": time.perf_counter() - started, "latency": _stats(latencies)}


def _run(command: list[str]) -> str:
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if finished.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({finished.returncode}): {finished.stdout}{finished.stderr}")
    return finished.stdout


def run(ctx: Context) -> list[Result]:
    seconds = 1.5 if ctx.quick else 5.0
    loop_seconds = 1.0 if ctx.quick else 2.0
    filled = 60_000 if ctx.quick else 200_000
    root = ctx.scratch("consumers")
    root.mkdir(parents=True)
    data = root / "data"
    client = "wrk" if shutil.which("wrk") else "python"
    port = _free_port()
    server = Server("journalq-always", [_tool("journalq"), "serve", "--data", str(data), "--port", str(port),
                                        "--sync", "always"], root / "server.log", port)
    plan = [(api, n) for n in CLIENTS for api in API_NAMES]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {cell: [] for cell in plan}
    loop_rates: list[float] = []
    loop_rounds: list[list[float]] = []
    try:
        server.start()
        ctx.log(f"  server up :{port}; {len(plan)} configurations x {seconds:g} s, {ctx.repeat} rounds, "
                f"{filled} messages a queue; client: {client}")
        for r in range(ctx.repeat):
            loop_rate, loop_lat = _fsync_loop(root / "fsync-loop", loop_seconds)
            loop_rates.append(loop_rate)
            loop_rounds.append(loop_lat)
            ctx.log(f"  round {r + 1}: fdatasync loop {loop_rate:.0f} syncs/s")
            for api, n in plan:
                outcome = Consumers(server, data, api, f"consume-{api}-{n}-r{r}", n, filled).run(seconds, client)
                runs[(api, n)].append(outcome)
                ctx.log(f"    {api:8} x{n:<2}: {rate(outcome['rate']):>12} consumed "
                        f"({outcome['requests_per_s']:.0f} requests/s), "
                        f"p50 {ms(outcome['median_ms'])}, p99 {ms(outcome['p99_ms'])}, "
                        f"{outcome['syncs_per_msg']} syncs/msg, server {outcome['server_cores']:.2f} cores "
                        f"({outcome['server_us_per_request']} µs/req)")
    finally:
        server.stop()

    loop_best = max(loop_rates)
    loop_lat = summarize(loop_rounds)
    results = [Result(
        "consumers", "physical limit: write 100 B + fdatasync, one file, one after another",
        loop_best, "msg/s", f"best of {ctx.repeat}",
        figure=f"{loop_best:.0f} syncs/s, p50 {ms(loop_lat['median'])}, p99 {ms(loop_lat['p99'])}",
        extra={"seconds_per_run": loop_seconds, "runs": [round(x, 1) for x in loop_rates]},
    )]
    for api, n in sorted(plan):
        cell = runs[(api, n)]
        best = max(cell, key=lambda outcome: outcome["rate"])
        median = sorted(outcome["median_ms"] for outcome in cell)[len(cell) // 2]
        p99 = sorted(outcome["p99_ms"] for outcome in cell)[len(cell) // 2]
        results.append(Result(
            "consumers", f"sync always, {API_NAMES[api]} ({client}), {n} clients",
            best["rate"], "msg/s", f"best of {ctx.repeat}", "fdatasync loop", loop_best,
            figure=f"{rate(best['rate'])} ({best['requests_per_s'] / 1000:.1f} k req/s), p50 {ms(median)}, "
                   f"p99 {ms(p99)}; {best['syncs_per_msg']} syncs/msg",
            extra={"api": api, "clients": n, "seconds_per_run": seconds, "filled": filled, "median_ms": median,
                   "p99_ms": p99, "runs": cell},
        ))
    return results
