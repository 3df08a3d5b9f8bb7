"""Helpers for testing Spark jobs on journals: a small local session, the rows a query's scans
returned, and a Spark standalone cluster (a master and a worker on loopback) started from the
PySpark installation, for trying a job on a cluster without installing Spark.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from journalq.spark import session


def local_session(**conf: str) -> Any:
    """A ``local[2]`` session for tests: two shuffle partitions, no UI, quiet. Reuses the active
    session (starting Spark takes seconds: share one per test module, or per run)."""
    settings = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.driver.memory": "1g",
    }
    settings.update(conf)
    return session("local[2]", "journalq-tests", settings, log_level="ERROR")


def scanned_rows(df: Any) -> int:
    """Collect ``df`` and return how many rows its data source scans handed to Spark (the
    ``numOutputRows`` metric of each BatchScan): how much a pushed filter saved."""
    df.collect()
    total = 0

    def walk(node: Any) -> None:
        nonlocal total
        name = node.nodeName()
        if "BatchScan" in name:
            total += int(node.metrics().apply("numOutputRows").value())
        if name == "AdaptiveSparkPlan":
            walk(node.executedPlan())
        children = node.children()
        for i in range(children.size()):
            walk(children.apply(i))

    walk(df._jdf.queryExecution().executedPlan())
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """A Spark standalone master and one worker on 127.0.0.1, from pyspark's own jars.

        with StandaloneCluster(cores=2, memory="2g") as cluster:
            journalq pipeline archive ... --master cluster.url

    The processes are started with ``java -cp <pyspark>/jars/*`` (what ``spark-class`` runs) and
    stopped, by their process ids, on exit. Logs and the worker's directory are in ``workdir``.
    """

    def __init__(self, cores: int = 2, memory: str = "1g", workdir: str | os.PathLike[str] | None = None) -> None:
        self.cores = cores
        self.memory = memory
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="journalq-spark-cluster-"))
        self.port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        home = spark_home()
        java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) or "java"
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_SCALA_VERSION="2.13", SPARK_LOCAL_IP="127.0.0.1")
        log = open(self.workdir / f"{name}.log", "wb")
        command = [java, "-Xmx256m", "-cp", f"{home}/jars/*", "-Dspark.master.rest.enabled=false", *args]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=self.workdir, start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def _wait_for(self, name: str, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        log = self.workdir / f"{name}.log"
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if re.search(pattern, text):
                return
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the Spark {name} exited:\n{text[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"the Spark {name} did not start in {timeout:.0f} s: see {log}")

    def start(self, timeout: float = 60.0) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(_free_port())])
        self._wait_for("master", r"I have been elected leader|Starting Spark master", timeout)
        self._start("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(self.cores), "--memory", self.memory,
                               "--webui-port", str(_free_port()), "--work-dir", str(self.workdir / "work"),
                               self.url])
        self._wait_for("worker", r"Successfully registered with master", timeout)
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                try:  # its own session: the worker's executors go with it
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        self.processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._own_dir and exc_type is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
