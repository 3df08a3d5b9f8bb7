"""journalq on Spark: a PySpark data source for journals, and the pipelines that use it.

    from journalq.spark import session          # or: journalq.spark.register(spark)

    spark = session("local[2]")                  # PYSPARK_PYTHON, UTC, pushdown, ``journalq`` registered
    df = spark.read.format("journalq").load("data/events")          # a journal, a root of shards,
    df = spark.read.format("journalq").option("topic", "events").load("data")   # or a topic
    stream = spark.readStream.format("journalq").load("data/events")
    df.select("value").write.format("journalq").mode("append").save("data/copy")

Columns (``journalq.spark.schema``): ``offset``, ``timestamp`` (UTC; NULL for the zero time),
``timestamp_ns`` (exact), ``type``, ``key``, ``value`` (the raw sej value), ``shard`` (``""`` for
a plain journal or topic), ``attributes`` (a queue message's, else NULL) and ``body`` (a queue
message's body: the envelope's body for type 0xE0, the value for every other message). README.md
lists the options. Needs PySpark 4 (``pip install journalq[spark]``) and Java 17.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from journalq.errors import Error

__all__ = ["NAME", "SCHEMA", "register", "session"]

NAME = "journalq"


def register(spark: Any = None) -> Any:
    """Register the ``journalq`` data source with ``spark`` (the active session by default);
    returns the session. Registering twice is harmless."""
    from pyspark.sql import SparkSession

    from journalq.spark.source import JournalDataSource

    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise Error("no active Spark session: pass one to journalq.spark.register(spark)")
    spark.dataSource.register(JournalDataSource)
    return spark


def session(
    master: str | None = None,
    app_name: str = "journalq",
    conf: dict[str, str] | None = None,
    *,
    ui: bool = False,
    log_level: str | None = "WARN",
) -> Any:
    """A Spark session set up for journalq (an existing one is reused, as ``getOrCreate`` does):

    * Python workers run this interpreter (``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``, unless
      already set), so they import the same journalq, numpy and pyarrow;
    * filter pushdown for Python data sources on (``spark.sql.python.filterPushdown.enabled``);
    * the session time zone is UTC (dates and windows of the pipelines are UTC dates);
    * the web UI off unless ``ui``; the ``journalq`` data source registered.

    ``master``: ``local[2]``, ``spark://host:7077``... (None: whatever spark-submit or the default
    gives). ``conf`` is applied last, so it can change any of the above.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
    }
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level:
        spark.sparkContext.setLogLevel(log_level)
    return register(spark)


def __getattr__(name: str) -> Any:
    if name == "SCHEMA":
        from journalq.spark.schema import SCHEMA

        return SCHEMA
    raise AttributeError(name)
