"""server: the HTTP server (``journalq serve``) under concurrent senders, against the disk's sync
rate, moto's in-memory SQS and the most uvicorn serves with an app that does nothing.

The real server runs as a subprocess (``journalq serve --data DIR --port P``), with ``--sync
always`` (a message is answered only once synced; one worker, and ``--workers 2``) and with
``--sync none``. A load generator, a separate process (``bench/server_load.py``), drives it with
1, 16 and 64 concurrent clients, each sending its next message as soon as the previous one is
answered, for a fixed time (5 s; 1.5 s with ``--quick``, which wrk rounds to whole seconds), with

* ``rest``: mq's REST API, ``POST /{queue}/messages`` with a 100-byte body, and ``sqs-json``:
  SQS's JSON ``SendMessage`` (``POST /`` with ``X-Amz-Target``), prebuilt requests sent by a lean
  client: ``wrk`` when it is on PATH (a few µs of CPU per request), else a minimal HTTP/1.1
  keep-alive client on asyncio (a few tens of µs); one connection per client;
* ``sqs``: boto3 ``send_message`` (the Amazon SQS JSON protocol, ``POST /``), one boto3 client per
  thread, the threads spread over two generator processes (in one, the GIL holds boto3 to one
  core: 15-20 % fewer requests). boto3 costs about as much CPU per request as the server: on a
  2-core machine the load generator takes a large part of the machine, which the table shows.

Each run sends to a fresh queue, checks afterwards that the queue holds every message answered
2xx (plus the untimed warm-up ones, one per client; with wrk, plus up to one per client that was
under way when wrk stopped, which wrk does not count), and deletes it. Beside them, in the same
run:

* the physical limit: ``write`` of 100 bytes + ``fdatasync`` of one file, one after another, for
  2 s (1 s with ``--quick``), on the file system of the servers' data: syncs per second;
* moto's in-memory SQS server (``moto_server``), driven by the same boto3 load. moto's
  ``send_message`` counts the queue's messages (``Queue.attributes``) at every send, so its rate
  falls as the run fills the queue: each run starts from an empty queue, as journalq's do;
* the ceiling: ``bench/bare_asgi.py``, an ASGI app that answers 201 at once under uvicorn with
  journalq's settings, driven by the same ``rest`` load: what uvicorn and its ASGI layer alone
  cost per request, and so the most any ASGI app under it can serve on this machine (journalq
  takes its sends from the HTTP parser without that layer: see bench/README.md).

Aims (from the issue): with ``--sync always`` and 64 clients, throughput at least 5 times the
syncs per second of the loop (group commit: concurrent requests share syncs), and with
``--sync none``, journalq ahead of moto under the boto3 load (journalq / moto > 1). The server's
``journalq_syncs_total`` (``GET /metrics``) is read before and after each run: syncs per request
show the group commit (not with 2 workers: each counts its own). Throughputs (requests per
second; one message per request) are the best of ``repeat`` runs; latencies (seen by the client,
from writing the request to reading the whole answer) the median over the runs of each run's
median and p99 (with boto3 over two processes, the higher of the two processes' figures). All
configurations are interleaved in each round. CPU: the load generator's and the server's CPU time
over the timed window, in cores (1.00 = one core busy for the whole run; the machine has
``os.cpu_count()``), and the server's CPU per request (µs/req): unlike the throughput, it hardly
depends on how much of the machine the other processes on it leave.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import Context, Result, ms, rate, summarize

HERE = Path(__file__).resolve().parent
LOAD = str(HERE / "server_load.py")
CLIENTS = (1, 16, 64)
GROUP_COMMIT_AIM = 5.0  # durable msg/s with 64 clients >= this x the fdatasync loop's syncs/s
MOTO_AIM = 1.0  # sync none, boto3: journalq / moto above this
VALUE = 100
BARE = "bare-asgi"  # the ceiling: bench/bare_asgi.py
GENERATORS = 2  # load generator processes: boto3 clients are spread over them, REST uses one

SERVER_CONTEXT = (
    "server: one message per request (msg/s = requests/s); latencies seen by the client. CPU in cores\n"
    "over the timed window (gen = load generator processes, srv = server processes; µs/req: server CPU\n"
    "per request), out of "
    f"{os.cpu_count()}: boto3 costs about\nas much CPU per request as the server, so the boto3 rows share "
    "the machine with a heavy client (the\nsame for journalq and moto). syncs/msg: journalq_syncs_total "
    "(GET /metrics) over the run / requests.\nmoto's send_message counts the queue's messages at every send "
    "(O(queue depth)): its rate falls as a\nrun fills its queue, so the journalq/moto ratio grows with the "
    "run's length (each run starts empty).\nceiling: an ASGI app answering at once under the same uvicorn "
    "and load; no ASGI app under this\nuvicorn serves more on this machine (journalq's sends skip the ASGI "
    "layer; ratio: to the fdatasync\nloop). ratio_to_ceiling in the JSON."
)


def _tool(name: str) -> str:
    """An executable of this venv (next to the running Python), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found; run scripts/setup.sh (moto_server comes with the bench extra)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    name: str  # "journalq-always", "journalq-always-w2", "journalq-none", "moto"
    command: list[str]
    log_path: Path
    port: int
    workers: int = 1
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_path, "wb")
        try:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self._log_tail()}")
            try:
                self.get("/healthz" if self.name.startswith("journalq") else "/moto-api/")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer within 60 s: {self._log_tail()}") from None
                time.sleep(0.1)

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path)

    def request(self, method: str, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def syncs(self) -> float | None:
        """journalq_syncs_total of the server (None for moto, and with several worker processes:
        each counts its own, and ``GET /metrics`` reaches one of them)."""
        if not self.name.startswith("journalq") or self.workers > 1:
            return None
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics of {self.name}: {status}")
        for line in body.decode().splitlines():
            if line.startswith("journalq_syncs_total "):
                return float(line.split()[1])
        raise RuntimeError(f"no journalq_syncs_total in {self.name}'s /metrics")

    def cpu(self) -> float:
        """CPU seconds of the server's processes (uvicorn's worker processes are its children)."""
        assert self.process is not None
        pids = [self.process.pid]
        if self.workers > 1:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
        return sum(_cpu_seconds(pid) for pid in pids)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


class Generator:
    """The load generator process (bench/server_load.py), one JSON command and answer per line."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, LOAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator stopped (exit {self.process.wait()})")
        return json.loads(line)

    def ask(self, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.receive()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One configuration (server, API, clients), measured once per round."""

    server: str
    api: str
    clients: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    latency_rounds: list[dict[str, float]] = field(default_factory=list)  # each run's median, p90, p99, max

    def latency(self) -> dict[str, float]:
        """Each statistic, the median over the runs."""
        return {
            name: statistics.median(r[name] for r in self.latency_rounds) for name in ("median", "p90", "p99", "max")
        }

    def best(self) -> dict[str, Any]:
        return max(self.runs, key=lambda r: r["rate"])

    @property
    def rate(self) -> float:
        return self.best()["rate"]


def _split(api: str, clients: int, gens: list[Generator]) -> list[tuple[Generator, int]]:
    """Which generator processes take how many clients: the lean clients in one process, boto3
    spread over all of them (one process of boto3 threads is held to one core by the GIL)."""
    if api != "sqs" or clients == 1:
        return [(gens[0], clients)]
    share = [clients // len(gens) + (i < clients % len(gens)) for i in range(len(gens))]
    return [(g, n) for g, n in zip(gens, share) if n]


def _measure(
    gens: list[Generator], server: Server, api: str, clients: int, seconds: float, queue: str, client: str
) -> tuple[dict, dict[str, float]]:
    parts = _split(api, clients, gens)
    # One queue for all the processes: the first makes it, the others find it (PUT and
    # CreateQueue take an existing queue).
    extra_min = extra_max = 0
    for gen, n in parts:
        ready = gen.ask(cmd="prepare", api=api, endpoint=server.endpoint, queue=queue, clients=n, client=client)
        if not ready.get("ready"):
            raise RuntimeError(f"prepare failed: {ready}")
        extra_min, extra_max = extra_min + ready["extra_min"], extra_max + ready["extra_max"]
    syncs0, cpu0 = server.syncs(), server.cpu()
    for gen, _ in parts:
        gen.send(cmd="go", seconds=seconds)
    answers = [gen.receive() for gen, _ in parts]
    cpu1, syncs1 = server.cpu(), server.syncs()
    if server.name == BARE:  # it stores nothing: there is nothing to count
        stored = None
        for gen, _ in parts:
            gen.ask(cmd="forget")
    else:
        stored = parts[0][0].ask(cmd="finish")["stored"]  # counts, then deletes the queue
        for gen, _ in parts[1:]:
            gen.ask(cmd="forget")
    count = sum(got["count"] for got in answers)
    errors = sum(got["errors"] for got in answers)
    if errors:
        raise RuntimeError(
            f"{server.name} {api} x{clients}: {errors} failed requests: {[g['error_statuses'] for g in answers]}"
        )
    if stored is not None and not count + extra_min <= stored <= count + extra_max:  # see server_load.py's "prepare"
        raise RuntimeError(
            f"{server.name} {api} x{clients}: {count} messages answered (+{extra_min} to {extra_max} not timed), "
            f"{stored} stored"
        )
    wall = max(got["seconds"] for got in answers)
    # One process's statistics, or (boto3 over several) the worst of each: the latencies of
    # the processes' clients are alike, and their p99 is not the mean of theirs.
    latency = {name: max(got["latency"][name] for got in answers) for name in ("median", "p90", "p99", "max")}
    run = {
        "rate": count / wall,
        "requests": count,
        "seconds": round(wall, 4),
        "median_ms": round(latency["median"], 4),
        "p99_ms": round(latency["p99"], 4),
        "gen_processes": len(parts),
        "gen_cores": round(sum(got["cpu"] for got in answers) / wall, 3),
        "server_cores": round((cpu1 - cpu0) / wall, 3),
        "server_us_per_request": round((cpu1 - cpu0) / count * 1e6, 2),
    }
    if syncs0 is not None and syncs1 is not None:
        run["syncs"] = int(syncs1 - syncs0)
        run["syncs_per_msg"] = round((syncs1 - syncs0) / count, 5)
    return run, latency


def _fsync_loop(path: Path, seconds: float) -> tuple[float, list[float]]:
    """write 100 bytes + fdatasync, one after another, for ``seconds``: syncs/s and each one's ms."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"x" * VALUE
    fdatasync = getattr(os, "fdatasync", os.fsync)
    latencies = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fdatasync(fd)
        perf = time.perf_counter
        start = perf()
        deadline = start + seconds
        end = start
        while end < deadline:
            t0 = perf()
            os.write(fd, data)
            fdatasync(fd)
            end = perf()
            latencies.append((end - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return len(latencies) / (end - start), latencies


# -- results --------------------------------------------------------------------------------------


def _figure(cell: Cell, lat: dict[str, float]) -> str:
    best = cell.best()
    text = f"{rate(cell.rate)}, p50 {ms(lat['median'])}, p99 {ms(lat['p99'])}"
    if "syncs_per_msg" in best:
        text += f", {best['syncs_per_msg']:.3f} syncs/msg"
    return text + (f"; CPU gen {best['gen_cores']:.2f} srv {best['server_cores']:.2f}"
                   f" ({best['server_us_per_request']:.0f} µs/req)")


_API = {"rest": "REST POST /{q}/messages", "sqs-json": "SQS JSON SendMessage", "sqs": "boto3 send_message"}


def _case(cell: Cell, client: str) -> str:
    what = _API[cell.api] + (f" ({client})" if cell.api != "sqs" else "")
    if cell.server == "moto":
        return f"moto_server (in memory), {what}, {cell.clients} clients"
    if cell.server == BARE:
        return f"ceiling: ASGI app answering at once, same uvicorn, {what}, {cell.clients} clients"
    sync, _, workers = cell.server.removeprefix("journalq-").partition("-w")
    return f"sync {sync}{f', {workers} workers' if workers else ''}, {what}, {cell.clients} clients"


def _extra(cell: Cell, lat: dict[str, float], seconds: float) -> dict[str, Any]:
    best = cell.best()
    extra = {
        "server": cell.server, "api": cell.api, "clients": cell.clients, "seconds_per_run": seconds,
        "value_size": VALUE,
        "median_ms": round(lat["median"], 4), "p90_ms": round(lat["p90"], 4), "p99_ms": round(lat["p99"], 4),
        "max_ms": round(lat["max"], 4),
        "gen_cores": best["gen_cores"], "server_cores": best["server_cores"],
        "server_us_per_request": best["server_us_per_request"],
        "runs": cell.runs,
    }
    if "syncs_per_msg" in best:
        extra["syncs_per_msg"] = best["syncs_per_msg"]
    return extra


def run(ctx: Context) -> list[Result]:
    seconds = 1.5 if ctx.quick else 5.0
    loop_seconds = 1.0 if ctx.quick else 2.0
    root = ctx.scratch("server")
    root.mkdir(parents=True)
    journalq, moto = _tool("journalq"), _tool("moto_server")
    client = "wrk" if shutil.which("wrk") else "python"  # the lean client of the rest and sqs-json rows
    servers: dict[str, Server] = {}
    for name, sync, workers in (("journalq-always", "always", 1), ("journalq-always-w2", "always", 2),
                                ("journalq-none", "none", 1)):
        port = _free_port()
        servers[name] = Server(
            name, [journalq, "serve", "--data", str(root / f"data-{name}"), "--port", str(port), "--sync", sync,
                   "--workers", str(workers)],
            root / f"{name}.log", port, workers,
        )
    port = _free_port()
    servers["moto"] = Server("moto", [moto, "-H", "127.0.0.1", "-p", str(port)], root / "moto.log", port)
    port = _free_port()
    servers[BARE] = Server(BARE, [sys.executable, str(HERE / "bare_asgi.py"), str(port)], root / "bare.log", port)
    plan = [
        ("journalq-always", "rest"), ("journalq-always", "sqs-json"), ("journalq-always", "sqs"),
        ("journalq-always-w2", "rest"),
        ("journalq-none", "rest"), ("journalq-none", "sqs"),
        ("moto", "sqs"),
        (BARE, "rest"),
    ]
    cells = {(s, a, n): Cell(s, a, n) for n in CLIENTS for s, a in plan}
    loop_rates: list[float] = []
    loop_rounds: list[list[float]] = []
    gens: list[Generator] = []
    try:
        for server in servers.values():
            server.start()
        ctx.log(f"  servers up: {', '.join(f'{s.name} :{s.port}' for s in servers.values())}; "
                f"{len(cells)} configurations x {seconds:g} s, {ctx.repeat} rounds; lean client: {client}")
        gens = [Generator() for _ in range(GENERATORS)]
        for r in range(ctx.repeat):
            loop_rate, loop_lat = _fsync_loop(root / "fsync-loop", loop_seconds)  # beside the data dirs
            loop_rates.append(loop_rate)
            loop_rounds.append(loop_lat)
            ctx.log(f"  round {r + 1}: fdatasync loop {loop_rate:.0f} syncs/s")
            for n in CLIENTS:
                for s, a in plan:
                    cell = cells[(s, a, n)]
                    run_, latency = _measure(gens, servers[s], a, n, seconds, f"bench-{a}-{n}-r{r}", client)
                    cell.runs.append(run_)
                    cell.latency_rounds.append(latency)
                    ctx.log(
                        f"    {s:18} {a:8} x{n:<2}: {rate(run_['rate']):>12}, p50 {ms(run_['median_ms']):>9}, "
                        f"p99 {ms(run_['p99_ms']):>9}"
                        + (f", {run_['syncs_per_msg']:.3f} syncs/msg" if "syncs_per_msg" in run_ else "")
                        + f", CPU gen {run_['gen_cores']:.2f} srv {run_['server_cores']:.2f}"
                        + f" ({run_['server_us_per_request']:.0f} µs/req)"
                    )
    finally:
        for gen in gens:
            gen.close()
        for server in servers.values():
            server.stop()

    results: list[Result] = []
    loop_best = max(loop_rates)
    loop_lat = summarize(loop_rounds)
    results.append(Result(
        "server", "physical limit: write 100 B + fdatasync, one file, one after another",
        loop_best, "msg/s", f"best of {ctx.repeat}",
        figure=f"{loop_best:.0f} syncs/s, p50 {ms(loop_lat['median'])}, p99 {ms(loop_lat['p99'])}",
        extra={"seconds_per_run": loop_seconds, "runs": [round(x, 1) for x in loop_rates],
               "median_ms": round(loop_lat["median"], 4), "p99_ms": round(loop_lat["p99"], 4)},
    ))
    loop_name = "fdatasync loop"
    for s, a in plan:
        for n in CLIENTS:
            cell = cells[(s, a, n)]
            lat = cell.latency()
            result = Result(
                "server", _case(cell, client), cell.rate, "msg/s", f"best of {ctx.repeat}",
                figure=_figure(cell, lat), extra=_extra(cell, lat, seconds),
            )
            if s.startswith("journalq-always"):
                result.baseline_name, result.baseline_value = loop_name, loop_best
                if n == 64:
                    result.aim = f">= {GROUP_COMMIT_AIM:g}x syncs/s"
                    result.aim_met = cell.rate >= GROUP_COMMIT_AIM * loop_best
            elif s == "journalq-none" and a == "sqs":
                moto_rate = cells[("moto", "sqs", n)].rate
                result.baseline_name, result.baseline_value = "moto_server", moto_rate
                result.aim, result.aim_met = "> moto", cell.rate > MOTO_AIM * moto_rate
            if s == "journalq-always" and ("journalq-none", a, n) in cells:  # what durability costs
                result.extra["ratio_to_sync_none"] = round(cell.rate / cells[("journalq-none", a, n)].rate, 4)
            if s == BARE:  # how far above the disk's syncs any app under this uvicorn could go
                result.baseline_name, result.baseline_value = loop_name, loop_best
            elif a == "rest":
                result.extra["ratio_to_ceiling"] = round(cell.rate / cells[(BARE, "rest", n)].rate, 4)
            if s.startswith("journalq") and a == "sqs":
                result.extra["ratio_to_moto"] = round(cell.rate / cells[("moto", "sqs", n)].rate, 4)
            results.append(result)
    return results
