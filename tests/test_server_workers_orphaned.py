"""``serve --workers N`` whose supervisor is killed (SIGKILL, the OOM killer): its workers kept
serving, holding the port (a new server could not bind it) and the data directory. They now
stop as the supervisor would have stopped them, cleanly."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
from test_server_harness import ServerProcess


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie (reaped by whoever adopted it) is gone


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--workers", "2", log_dir=tmp_path).start()
    workers: list[int] = []
    try:
        httpx.put(f"{server.url}/q").raise_for_status()
        httpx.post(f"{server.url}/q/messages", content=b"kept").raise_for_status()
        deadline = time.monotonic() + 20
        while len(workers := server.worker_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, server.log()
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)  # the supervisor alone
        server.process.wait()
        deadline = time.monotonic() + 30
        while (any(map(_alive, workers)) or _port_taken(server.port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), f"workers {workers} still run:\n{server.log()}"
        assert not _port_taken(server.port)
        # They stopped cleanly (a SIGTERM's stop: journals synced, no traceback), and kept what they stored.
        assert "Traceback" not in server.log(), server.log()
        again = ServerProcess(server.data, log_dir=tmp_path).start()
        try:
            assert httpx.get(f"{again.url}/q/messages").content == b"kept"
        finally:
            again.check_clean_stop()
    finally:  # this test's own workers, by pid, when they outlived their supervisor
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
