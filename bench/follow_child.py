"""The processes of the follow benchmark (started by bench_follow.py, one role each).

Every role prints ``ready`` once set up; a sending role then waits for a line on stdin before it
starts. Receiving roles print one JSON list of latencies in nanoseconds (``time.time_ns()`` on
receipt minus the sender's ``time.time_ns()`` at sending); the pipe sender prints round trips.

    writer        DIR COUNT INTERVAL_S     Writer(DIR).append() every INTERVAL_S (sync none)
    follower      DIR COUNT TIMEOUT_S      Scanner(DIR, follow=True, timeout=TIMEOUT_S)
    poller        DIR COUNT TIMEOUT_S      Scanner(DIR) read to its end, then time.sleep(0.001)
    pipe-sender   FD_OUT FD_BACK COUNT INTERVAL_S   8-byte time_ns into a pipe, waits for an echo
    pipe-receiver FD_IN FD_ECHO COUNT      reads them, echoes one byte
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

src = Path(__file__).resolve().parent.parent / "src"
try:
    import journalq  # noqa: F401
except ImportError:
    sys.path.insert(0, str(src))

from journalq.journal import Scanner, Writer  # noqa: E402

VALUE = bytes(range(100))


def ready() -> None:
    print("ready", flush=True)


def paced(count: int, interval: float):
    """Yield ``count`` times, every ``interval`` seconds from now (sleeping in between)."""
    start = time.perf_counter()
    for i in range(count):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


def writer(directory: str, count: str, interval: str) -> None:
    with Writer(directory) as w:
        ready()
        sys.stdin.readline()
        append = w.append
        for _ in paced(int(count), float(interval)):
            append(VALUE)


def follower(directory: str, count: str, timeout: str) -> None:
    n = int(count)
    latencies = []
    record, now = latencies.append, time.time_ns
    with Scanner(directory, follow=True, timeout=float(timeout)) as scanner:
        ready()
        for message in scanner:
            record(now() - message.timestamp_ns)
            if len(latencies) == n:
                break
    print(json.dumps(latencies), flush=True)


def poller(directory: str, count: str, timeout: str) -> None:
    n, limit = int(count), float(timeout)
    latencies = []
    record, now = latencies.append, time.time_ns
    with Scanner(directory) as scanner:
        ready()
        last_news = time.monotonic()
        while len(latencies) < n and time.monotonic() - last_news < limit:
            for message in scanner:  # to the current end; iterating again resumes
                record(now() - message.timestamp_ns)
                last_news = time.monotonic()
            time.sleep(0.001)
    print(json.dumps(latencies[:n]), flush=True)


def pipe_sender(fd_out: str, fd_back: str, count: str, interval: str) -> None:
    out, back = int(fd_out), int(fd_back)
    round_trips = []
    ready()
    sys.stdin.readline()
    for _ in paced(int(count), float(interval)):
        sent = time.time_ns()
        os.write(out, sent.to_bytes(8, "big"))
        os.read(back, 1)
        round_trips.append(time.time_ns() - sent)
    print(json.dumps(round_trips), flush=True)


def pipe_receiver(fd_in: str, fd_echo: str, count: str) -> None:
    source, echo = int(fd_in), int(fd_echo)
    latencies = []
    ready()
    for _ in range(int(count)):
        data = b""
        while len(data) < 8:
            chunk = os.read(source, 8 - len(data))
            if not chunk:
                raise SystemExit("pipe closed early")
            data += chunk
        latencies.append(time.time_ns() - int.from_bytes(data, "big"))
        os.write(echo, b"x")
    print(json.dumps(latencies), flush=True)


ROLES = {
    "writer": writer,
    "follower": follower,
    "poller": poller,
    "pipe-sender": pipe_sender,
    "pipe-receiver": pipe_receiver,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
