"""Processes for the hub's crash tests: steady writers, a TCP proxy that cuts connections, and
the scenario that kills and restarts the hub and its clients while the writers append.

Run as a script for the pieces that must live in a process of their own (in a network namespace,
say): ``hub_processes.py write ...`` and ``hub_processes.py proxy ...``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from journalq.journal.offsets import end_offset  # noqa: E402

JOURNALQ = [sys.executable, "-c", "from journalq.cli.main import main; main()"]
SEGMENT_SIZE = 24 * 1024  # small: many segments, so that segment starts are copied often


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- a steady writer ------------------------------------------------------------------------------


def write_steadily(plain: list[Path], sharded: list[Path], stop: Path, rate: float, seed: int) -> None:
    """Append to each journal about ``rate`` messages a second until ``stop`` exists."""
    from journalq.journal import Writer
    from journalq.shard import ShardedWriter

    rng = random.Random(seed)
    writers: list = [Writer(p, segment_size=SEGMENT_SIZE) for p in plain]
    writers += [ShardedWriter(r, prefix="events", bit=2, segment_size=SEGMENT_SIZE) for r in sharded]
    started, n = time.monotonic(), 0
    try:
        while not stop.exists():
            for writer in writers:
                batch = [(b"k%d" % rng.randrange(50), rng.randbytes(rng.randrange(1, 400))) for _ in range(10)]
                for key, value in batch:
                    writer.append(value, key=key)
            n += 10
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        for writer in writers:
            writer.close()


# -- a proxy that cuts connections ------------------------------------------------------------------


class CuttingProxy:
    """Forwards TCP connections from ``listen`` to ``upstream``; ``cut_all()`` resets every open
    connection, and with ``chaos`` each new connection may be reset after a random number of
    bytes (mid-request or mid-answer)."""

    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0), chaos: float = 0.0,
                 seed: int = 7) -> None:
        self.upstream = upstream
        self.chaos = chaos
        self.rng = random.Random(seed)
        self.cuts = 0
        self.mid_transfer_cuts = 0  # by chaos, after some bytes of a request or an answer
        self._server = socket.create_server(listen, reuse_port=False)
        self.address = self._server.getsockname()[:2]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(downstream)
                continue
            for s in (downstream, upstream):  # no Nagle delay on top of the endpoints' own
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                budget = self.rng.randrange(1, 30_000) if self.rng.random() < self.chaos else None
                self._open |= {downstream, upstream}
            pair = _Pair(budget)
            threading.Thread(target=self._pump, args=(downstream, upstream, pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, pair), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, pair: _Pair) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if pair.spend(len(data)):
                    with self._lock:
                        self.cuts += 1
                        self.mid_transfer_cuts += 1
                    sink.sendall(data[: len(data) // 2])
                    break
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)
        _reset(s)

    def cut_all(self) -> int:
        with self._lock:
            sockets, self._open = list(self._open), set()
            self.cuts += len(sockets) // 2
        for s in sockets:
            _reset(s)
        return len(sockets) // 2

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.cut_all()


@dataclass
class _Pair:
    budget: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spend(self, n: int) -> bool:
        with self.lock:
            if self.budget is None:
                return False
            self.budget -= n
            return self.budget <= 0


def _reset(s: socket.socket) -> None:
    """End the connection now, with a reset (RST) where the kernel can send one. (A shutdown
    first: close() alone does not end a connection that another thread is blocked reading.)"""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    for end in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
        try:
            end()
        except OSError:
            pass


# -- the scenario -----------------------------------------------------------------------------------


@dataclass
class Client:
    client_id: str
    directories: list[Path]
    url: str
    prefix: list[str] = field(default_factory=list)  # e.g. ip netns exec NS
    process: subprocess.Popen | None = None
    log: Path | None = None


def start_client(client: Client, log_dir: Path) -> None:
    client.log = log_dir / f"push-{client.client_id}.log"
    with open(client.log, "ab") as out:
        client.process = subprocess.Popen(
            [*client.prefix, *JOURNALQ, "hub", "push", "--to", client.url, "--client-id", client.client_id,
             "--chunk", "8192", "--timeout", "10", "--progress", "jsonl", *map(str, client.directories)],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(),
        )


def start_hub(root: Path, host: str, port: int, log_dir: Path, prefix: Sequence[str] = ()) -> subprocess.Popen:
    with open(log_dir / "hub.log", "ab") as out:
        process = subprocess.Popen(
            [*prefix, *JOURNALQ, "hub", "serve", "--root", str(root), "--host", host, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(),
        )
    return process


def wait_until(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def kill(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(10)


def journal_pairs(hub_root: Path, clients: list[Client]) -> list[tuple[Path, Path]]:
    """(source journal, its copy on the hub) for every journal the clients push."""
    from journalq.hub.client import sources_at

    return [(path, hub_root / f"{c.client_id}.{name}") for c in clients for name, path in sources_at(c.directories)]


def caught_up(pairs: list[tuple[Path, Path]]) -> bool:
    for source, copy in pairs:
        if not (copy / "jnl").is_dir() or end_offset(copy) != end_offset(source):
            return False
    return True


def segment_files(path: Path) -> dict[str, bytes]:
    """A journal's segments by name, but for an empty last one: a writer starts the next segment
    as soon as one is full, and a copy gets that segment with its first message only."""
    files = {p.name: p.read_bytes() for p in sorted((path / "jnl").glob("*.jnl"))}
    if files and not files[max(files)]:
        del files[max(files)]
    return files


def run_scenario(
    *,
    hub_root: Path,
    log_dir: Path,
    start_the_hub: Callable[[], subprocess.Popen],
    hub_ready: Callable[[], bool],
    clients: list[Client],
    writers: list[list[str]],
    stop_file: Path,
    cut: Callable[[], object],
    rounds: int,
    seed: int,
) -> dict[str, int]:
    """Kill and restart the hub and the clients, and cut connections, ``rounds`` times while the
    writers append; then let the clients catch up and return what was done. The caller compares."""
    rng = random.Random(seed)
    done = {"hub killed": 0, "client killed": 0, "connections cut": 0}
    writer_processes = [subprocess.Popen(w, env=child_env()) for w in writers]
    hub = start_the_hub()
    started = time.monotonic()
    try:
        wait_until("the hub to answer", hub_ready, 30)
        for client in clients:
            start_client(client, log_dir)
        actions = ["hub", "client", "cut"] * (rounds // 3 + 1)
        rng.shuffle(actions)
        for action in actions[:rounds]:
            time.sleep(rng.uniform(0.3, 0.9))
            if action == "hub":
                kill(hub)
                time.sleep(rng.uniform(0.0, 0.4))
                hub = start_the_hub()
                wait_until("the hub to answer again", hub_ready, 30)
                done["hub killed"] += 1
            elif action == "client":
                client = rng.choice(clients)
                kill(client.process)
                start_client(client, log_dir)
                done["client killed"] += 1
            else:
                cut()
                done["connections cut"] += 1
        done["rounds s"] = round(time.monotonic() - started, 1)
        stop_file.touch()
        for w in writer_processes:
            assert w.wait(30) == 0, "a writer failed"
        pairs = journal_pairs(hub_root, clients)
        wait_until("every copy to catch up with its source", lambda: caught_up(pairs), 60)
        done["catch-up s"] = round(time.monotonic() - started - done["rounds s"], 1)
        for client in clients:
            assert client.process is not None and client.process.poll() is None, (
                f"client {client.client_id} exited: {client.log.read_text()[-2000:] if client.log else ''}"
            )
    finally:
        stop_file.touch()
        for client in clients:
            kill(client.process)
        kill(hub)
        for w in writer_processes:
            kill(w)
    return done


# -- as a script ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("--plain", type=Path, action="append", default=[])
    w.add_argument("--sharded", type=Path, action="append", default=[])
    w.add_argument("--stop", type=Path, required=True)
    w.add_argument("--rate", type=float, default=1000)
    w.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("proxy")
    p.add_argument("--listen", required=True, help="HOST:PORT")
    p.add_argument("--upstream", required=True, help="HOST:PORT")
    p.add_argument("--chaos", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.what == "write":
        write_steadily(args.plain, args.sharded, args.stop, args.rate, args.seed)
        return
    host, port = args.listen.rsplit(":", 1)
    up_host, up_port = args.upstream.rsplit(":", 1)
    proxy = CuttingProxy((up_host, int(up_port)), (host, int(port)), chaos=args.chaos)
    signal.signal(signal.SIGUSR1, lambda *_: proxy.cut_all())  # cut every connection now
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


def writer_command(plain: list[Path], sharded: list[Path], stop: Path, rate: float, seed: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "write", "--stop", str(stop), "--rate", str(rate),
            "--seed", str(seed), *[a for p in plain for a in ("--plain", str(p))],
            *[a for r in sharded for a in ("--sharded", str(r))]]


if __name__ == "__main__":
    main()
