"""A real ZooKeeper server on loopback, for tests and benchmarks: a free port, its data in a
directory of its own, started and stopped (also killed with SIGKILL and started again on the same
port and data, as a crashed server would be).

It runs Debian's ``zookeeper`` package (``/usr/share/java/zookeeper.jar``, whose manifest names
its dependencies) with ``java``; ``ZooKeeperServer.available()`` says why it cannot when it cannot.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from journalq.closing import Closing
from journalq.errors import StoreUnavailableError

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ruok(port: int, timeout: float = 1.0) -> bool:
    """Whether a ZooKeeper server answers ``imok`` on ``port`` of loopback."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"
    except OSError:
        return False


class ZooKeeperServer(Closing):
    """A standalone ZooKeeper server: ``with ZooKeeperServer() as zk: Broker(zk.url("/jq"))``.

    ``tick`` (milliseconds) bounds session timeouts: clients may ask for 2 to 20 ticks, so the
    default of 100 ms allows sessions of 0.2 to 2 seconds (short ones make tests of a dead
    consumer quick; a longer one asked for is cut to 2 s).
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, port: int | None = None,
                 tick: int = 100) -> None:
        reason = self.available()
        if reason is not None:
            raise StoreUnavailableError(reason)
        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="journalq-zk-") if data_dir is None else data_dir)
        self.port = port or free_port()
        self.tick = tick
        self.process: subprocess.Popen[bytes] | None = None
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.start()
        except BaseException:
            self.close()  # whatever failed (even an interrupt): no process, no temporary directory
            raise

    @staticmethod
    def available() -> str | None:
        """None when a server can be started here; otherwise why not."""
        if shutil.which("java") is None:
            return "no java on PATH (install openjdk-17-jre-headless)"
        if not ZOOKEEPER_JAR.is_file():
            return f"no {ZOOKEEPER_JAR} (install Debian's zookeeper package: apt-get install zookeeper)"
        return None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/journalq") -> str:
        """The ``zk://`` URL of ``path`` on this server, as ``Broker`` takes it."""
        return f"zk://{self.hosts}{path}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (again) on the same port and data directory; return once it answers."""
        if self.process is not None and self.process.poll() is None:
            return
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick}\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\n"
            # every write is on the server's disk (fsync'd) before it is acknowledged: the default
            "forceSync=yes\n"
        )
        log = open(self.data_dir / "server.log", "ab")
        try:
            self.process = subprocess.Popen(
                ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Dzookeeper.jmx.log4j.disable=true",
                 "-cp", f"{ZOOKEEPER_JAR}:/etc/zookeeper/conf", MAIN_CLASS, str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not ruok(self.port):
            if self.process.poll() is not None:
                raise StoreUnavailableError(
                    f"ZooKeeper exited with status {self.process.returncode} at start; {self._log_end()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise StoreUnavailableError(f"ZooKeeper did not answer on port {self.port} within {timeout:g}s")
            time.sleep(0.1)

    def _log_end(self, lines: int = 5) -> str:
        """Where the server's log is and how it ends; a directory of the server's own is removed
        when its start fails, so then the end of the log is all there is to read."""
        log = self.data_dir / "server.log"
        try:
            text = log.read_text(errors="replace").rstrip().splitlines()[-lines:]
        except OSError:
            text = []
        where = "its log ends" if self._own_dir else f"{log} ends"
        return f"{where}:\n" + "\n".join(text) if text else f"{log} is empty"

    def kill(self) -> None:
        """SIGKILL the server, as a crash would: what it acknowledged is in its data directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
