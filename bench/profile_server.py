"""CPU per request of the server's direct path, in one process, without sockets (not part of run.py).

    .venv/bin/python bench/profile_server.py [--api rest|sqs] [--stage http|batch|store] [--requests N]
    .venv/bin/python bench/profile_server.py --profile ...   # the same under cProfile

``DirectHttpToolsProtocol`` (what ``journalq serve`` runs) gets 64 connections whose transports
only count what is written to them; each round feeds one 100-byte ``POST /q/messages`` (or an SQS
``SendMessage``) to each connection and waits until all 64 are answered. What is timed is this
process's CPU (``time.process_time``, every thread's) per request: the HTTP parsing, the protocol
and the app's Python, the batch's store, without the kernel's share of a socket's reads and writes
and without the disk (the broker runs with ``sync="none"``; ``--sync always`` adds each batch's
``fdatasync``, on the event loop while syncs are quick, at the disk's pace: noisier). The figures repeat
within a few per cent from run to run, unlike the server benchmark's on a shared machine, so a
change to the direct path can be weighed here first.

``--stage``: ``http`` answers each request as it is taken from the parser (the protocol alone:
uvicorn's parser callbacks, the request cycle, the answer); ``batch`` runs the app's direct path
and its batching with a store that returns at once (no queue, no thread); ``store`` (default) is
the whole path. The server process's garbage collector is readied as ``journalq serve`` does it
(``settle_heap``) unless ``--plain-gc``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import journalq  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

import uvicorn  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from journalq.queue import Broker  # noqa: E402
from journalq.server.app import _plain_sent_answer, create_app, settle_heap  # noqa: E402
from journalq.server.batching import Batcher  # noqa: E402
from journalq.server.config import ServerConfig  # noqa: E402
from journalq.server.protocol import DirectHttpToolsProtocol  # noqa: E402

CONNECTIONS = 64
BODY = b"x" * 100
_SQS_PAYLOAD = json.dumps({"QueueUrl": "http://127.0.0.1:8080/000000000000/q", "MessageBody": BODY.decode()}).encode()
REQUESTS = {
    "rest": b"POST /q/messages HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: 100\r\n\r\n" + BODY,
    "sqs": b"POST / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n"
    b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: %d\r\n\r\n" % len(_SQS_PAYLOAD) + _SQS_PAYLOAD,
}


class CountingTransport(asyncio.Transport):
    """A connection's transport that keeps nothing: it counts answers and wakes the round's waiter
    once every connection has had its answer."""

    written = 0
    target = 0
    round_done: asyncio.Future[None] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        cls = CountingTransport
        cls.written += 1
        if cls.round_done is not None and cls.written >= cls.target and not cls.round_done.done():
            cls.round_done.set_result(None)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0  # everything written is taken at once (the idle sweep asks, for stalled answers)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _batchers(app: Any) -> list[Batcher[Any, Any]]:
    """The app's send batchers (REST's and SQS's), found in its direct handlers' closures."""
    found = []
    for handler in (app.direct_route({"method": "POST", "path": "/q/messages", "headers": []}),
                    app.direct_route({"method": "POST", "path": "/", "headers": []})):
        for cell in handler.__closure__ or ():
            if isinstance(cell.cell_contents, Batcher):
                found.append(cell.cell_contents)
    return found


async def run(api: str, stage: str, requests: int, data: Path, sync: str = "none") -> float:
    """CPU seconds per request."""
    app = create_app(ServerConfig(data=data, sync=sync))
    config = uvicorn.Config(app, http=DirectHttpToolsProtocol, log_level="warning", access_log=False,
                            timeout_keep_alive=5, limit_concurrency=4096, h11_max_incomplete_event_size=64 * 1024)
    config.load()
    async with app.router.lifespan_context(app):
        with Broker(data) as broker:
            broker.queue("q")
        if stage == "http":
            def answer_at_once(scope: Any, body: bytes, respond: Any) -> bool:
                respond(201, [(b"x-message-id", b"1"), (b"content-length", b"0")], b"")
                return True

            app.direct_route = lambda scope: answer_at_once
        elif stage == "batch":
            async def stored_at_once(queue: str, items: Sequence[Any]) -> list[Any]:
                if api == "rest":
                    return ["1"] * len(items)
                # What the store answers a SendMessage of a body alone: its whole answer.
                return [_plain_sent_answer("1", "0" * 32) for _ in items]

            for batcher in _batchers(app):
                batcher._store = stored_at_once
        state = ServerState()
        connections = []
        for _ in range(CONNECTIONS):
            connection = DirectHttpToolsProtocol(config=config, server_state=state, app_state={})
            connection.connection_made(CountingTransport())
            connections.append(connection)
        request = REQUESTS[api]
        loop = asyncio.get_running_loop()

        async def round_of_requests() -> None:
            CountingTransport.target = CountingTransport.written + CONNECTIONS
            CountingTransport.round_done = loop.create_future()
            for connection in connections:
                connection.data_received(request)
            await CountingTransport.round_done

        for _ in range(20):  # warm up: the queue's writer, the metrics' children, the caches
            await round_of_requests()
        rounds = max(1, requests // CONNECTIONS)
        started = time.process_time()
        for _ in range(rounds):
            await round_of_requests()
        return (time.process_time() - started) / (rounds * CONNECTIONS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", default="rest", choices=sorted(REQUESTS))
    parser.add_argument("--stage", default="store", choices=("http", "batch", "store"))
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs (the least CPU time is printed)")
    parser.add_argument("--plain-gc", action="store_true", help="leave the garbage collector as Python sets it")
    parser.add_argument("--profile", action="store_true", help="one run under cProfile; prints the top functions")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sync", default="none",
                        help="the broker's sync policy (always: each batch's fdatasync and thread hop counted too)")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if not args.plain_gc:
        settle_heap()
    best = float("inf")
    for _ in range(1 if args.profile else args.repeat):
        data = Path(tempfile.mkdtemp(prefix="journalq-profile-server-"))
        try:
            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None)
            with runner:
                if args.profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                best = min(best, runner.run(run(args.api, args.stage, args.requests, data, args.sync)))
                if args.profile:
                    profiler.disable()
        finally:
            shutil.rmtree(data, ignore_errors=True)
    print(f"{args.api}, stage {args.stage}: {best * 1e6:.2f} µs of CPU per request "
          f"({'under cProfile' if args.profile else f'best of {args.repeat}'}; "
          f"garbage collector {'as Python sets it' if args.plain_gc else 'settled'})")
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
