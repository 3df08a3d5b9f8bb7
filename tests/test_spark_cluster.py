"""A pipeline on a Spark standalone cluster: a master and a worker started from the PySpark
installation on loopback, ``journalq pipeline archive --master spark://...`` run as the command
line runs it, then both stopped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Message, Writer  # noqa: E402
from journalq.journal.offsets import read_offset  # noqa: E402
from journalq.queue import Broker  # noqa: E402
from journalq.spark.testing import StandaloneCluster  # noqa: E402

pytestmark = [pytest.mark.usefixtures("vectors_untouched"), pytest.mark.slow]


def test_archive_pipeline_on_a_standalone_cluster(tmp_path, child_env):
    data, out = tmp_path / "data", tmp_path / "archive"
    with Broker(data, sync="none") as broker:
        path = broker.topic("events").path
    with Writer(path, shared=True) as w:
        w.append_many([Message(timestamp_ns=1_714_521_600_000_000_000 + i * 3_600_000_000_000, value=b"e%d" % i)
                       for i in range(1000)])
    with StandaloneCluster(cores=2, memory="1g", workdir=tmp_path / "cluster") as cluster:
        command = [
            sys.executable, "-m", "journalq.cli.main", "pipeline", "archive",
            "--data", "data", "--topic", "events", "--output", "archive",  # relative: the driver's
            "--master", cluster.url, "--conf", "spark.executor.memory=512m",
            "--conf", "spark.cores.max=2",
        ]
        done = subprocess.run(command, cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        worker_log = (tmp_path / "cluster" / "worker.log").read_text()
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["start"], summary["end"], summary["messages"]) == (0, 1000, 1000)
    assert "Asked to launch executor" in worker_log  # the work ran on the cluster's executor
    assert read_offset(path, "spark-archive") == 1000
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert table.num_rows == 1000
    assert sorted(table.column("offset").to_pylist()) == list(range(1000))
    assert len(set(table.column("date").to_pylist())) == 42  # 1000 hours
