"""``journalq pipeline NAME``: the Spark pipelines of ``journalq.spark.pipelines``.

Spark is imported only when a pipeline runs, so the rest of the command line starts as fast as
before and works without PySpark installed. Each pipeline prints one JSON line that sums up what
it did; errors are the usual one line on stderr.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from journalq.cli.data import DirectoryPath
from journalq.cli.main import CommandError
from journalq.journal.offsets import offset_path
from journalq.journal.sync import POLICY_FORMS, SyncPolicy


def _spark_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option("--master", default=None, envvar="JOURNALQ_SPARK_MASTER",
                  help="Spark master: local[N] (default local[*]), spark://HOST:PORT, ... (env JOURNALQ_SPARK_MASTER).")
    @click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
                  help="A Spark setting, e.g. --conf spark.sql.shuffle.partitions=8 (repeatable).")
    @functools.wraps(command)
    def wrapper(*args: Any, master: str | None, confs: tuple[str, ...], **kwargs: Any) -> Any:
        conf = {}
        for pair in confs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise CommandError(f"--conf takes KEY=VALUE, not {pair!r}")
            conf[key.strip()] = value
        return command(*args, spark_settings={"master": master or "local[*]", "conf": conf}, **kwargs)

    return wrapper


def _session(settings: dict[str, Any], app: str) -> Any:
    try:
        from journalq.spark import session
    except ImportError as exc:  # pragma: no cover - PySpark missing
        raise CommandError(f"the pipelines need PySpark: pip install 'journalq[spark]' ({exc})") from None
    conf = {"spark.sql.shuffle.partitions": "8", **settings["conf"]}
    return session(settings["master"], f"journalq-{app}", conf, log_level="ERROR")


def _one_line(exc: BaseException) -> str:
    """The message of a Spark error: the journalq error raised in a Python worker when there is
    one, else the first line Spark gives."""
    text = str(exc)
    found = re.findall(r"journalq\.[\w.]+Error: (.+)", text)
    if found:
        return found[-1].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first


def _run(settings: dict[str, Any], app: str, work: Callable[[Any], Any],
         check: Callable[[], Any] | None = None) -> Any:
    """Run ``work(spark)``; ``check()`` first, so that a wrong path fails before Spark starts."""
    from journalq.errors import Error

    if check is not None:
        check()
    spark = _session(settings, app)
    try:
        return work(spark)
    except (Error, OSError, CommandError, click.exceptions.Exit):
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            raise CommandError(_one_line(exc)) from exc
        raise
    finally:
        spark.stop()


_SOURCE = [
    click.option("--data", type=DirectoryPath(file_okay=False), default=None,
                 help="The broker's data directory (with --topic)."),
    click.option("--topic", default=None, help="The topic in --data."),
    click.option("--journal", type=DirectoryPath(file_okay=False), default=None,
                 help="A journal directory instead of --data/--topic."),
]


def _source(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_SOURCE):
        command = option(command)
    return command


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


@click.group()
def pipeline() -> None:
    """Spark pipelines over journals and topics (needs PySpark and Java 17).

    \b
    archive    a topic's history to Parquet by date, resumable
    aggregate  JSON events to event-time window statistics, to a topic and to Parquet
    import     JSON lines, Parquet or CSV files into a topic

    Each runs on a local Spark (--master local[N], the default local[*]) or a cluster
    (--master spark://HOST:PORT) whose executors see the same paths.
    """


@pipeline.command()
@_source
@click.option("--output", type=DirectoryPath(file_okay=False), required=True,
              help="The Parquet directory (partitioned by date=YYYY-MM-DD).")
@click.option("--name", default="spark-archive", show_default=True,
              help="The reader offset (TOPIC/ofs/NAME.ofs) that remembers what was archived.")
@click.option("--skip-lost", is_flag=True, help="Archive from the oldest message left when retention "
              "deleted messages not archived yet (the default is to fail).")
@_spark_options
def archive(data: Path | None, topic: str | None, journal: Path | None, output: Path, name: str,
            skip_lost: bool, spark_settings: dict[str, Any]) -> None:
    """Export what a topic received since the last run to Parquet, partitioned by UTC date.

    Run it again (from cron, say) to export what came since: every message is archived once.
    """
    from journalq.spark.pipelines import archive as run_archive, check_source

    def check() -> None:
        check_source(_str(journal), _str(data), topic)
        offset_path(".", name)  # checks the reader's name, else first taken once Spark has started

    result = _run(spark_settings, "archive", lambda spark: run_archive(
        spark, str(output), journal=_str(journal), data=_str(data), topic=topic, name=name,
        fail_on_data_loss=not skip_lost), check)
    click.echo(result.to_json())


def _interval(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An interval as Spark takes it, checked before Spark starts (as a usage error naming the option)."""
    from journalq.errors import InvalidArgumentError
    from journalq.spark.pipelines import check_interval

    try:
        return check_interval(f"--{param.name}", value)
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc), ctx) from None


@pipeline.command()
@_source
@click.option("--output-topic", default=None, help="The topic (in --data) that receives the statistics.")
@click.option("--output-journal", type=DirectoryPath(file_okay=False), default=None,
              help="A journal that receives the statistics, instead of --output-topic.")
@click.option("--parquet", type=DirectoryPath(file_okay=False), required=True,
              help="The Parquet directory that receives the statistics too (partitioned by date).")
@click.option("--checkpoint", type=DirectoryPath(file_okay=False), required=True,
              help="Spark's checkpoint directory: keep it to resume where the job stopped.")
@click.option("--window", default="1 minute", show_default=True, callback=_interval,
              help="Length of the event-time windows.")
@click.option("--watermark", default="10 minutes", show_default=True, callback=_interval,
              help="How late an event may be; a window is written once the watermark passes its end.")
@click.option("--time-field", default="time", show_default=True,
              help="The JSON field with the event time (ISO 8601 or seconds); the message time without it.")
@click.option("--key-field", default=None, help="The JSON field to group by (one group without it).")
@click.option("--value-field", default=None, help="The JSON field to sum, min, max and average.")
@click.option("--starting-offsets", type=click.Choice(["earliest", "latest"]), default="earliest",
              show_default=True, help="Where a new job (no checkpoint yet) starts reading.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=None,
              help="At most this many messages per micro-batch.")
@click.option("--available-now", is_flag=True,
              help="Process what is there now, then stop (instead of running until interrupted).")
@click.option("--interval", default="10 seconds", show_default=True, help="Micro-batch interval when running on.")
@_spark_options
def aggregate(data: Path | None, topic: str | None, journal: Path | None, output_topic: str | None,
              output_journal: Path | None, parquet: Path, checkpoint: Path, window: str, watermark: str,
              time_field: str, key_field: str | None, value_field: str | None, starting_offsets: str,
              max_offsets_per_trigger: int | None, available_now: bool, interval: str,
              spark_settings: dict[str, Any]) -> None:
    """Aggregate a topic of JSON events in event-time windows, exactly once, to a topic and to Parquet.

    Each window's count, sum, min, max and average per key goes to the output topic as a JSON
    message (keyed by the group) and to Parquet, once the watermark has passed the window.
    """
    from journalq.spark.pipelines import AggregateSettings, aggregate as run_aggregate, check_aggregate

    settings = AggregateSettings(
        parquet=str(parquet), checkpoint=str(checkpoint), journal=_str(journal), data=_str(data),
        topic=topic, output_journal=_str(output_journal), output_topic=output_topic, window=window,
        watermark=watermark, time_field=time_field, key_field=key_field, value_field=value_field,
        starting_offsets=starting_offsets, max_offsets_per_trigger=max_offsets_per_trigger,
        available_now=available_now, interval=interval,
    )

    def work(spark: Any) -> dict[str, Any]:
        queries = run_aggregate(spark, settings)
        return {q.name: sum(p.get("numInputRows", 0) for p in q.recentProgress) for q in queries}

    rows = _run(spark_settings, "aggregate", work, lambda: check_aggregate(settings))
    import json

    click.echo(json.dumps({"pipeline": "aggregate", "input_rows": rows}))


@pipeline.command("import")
@_source
@click.option("--format", "fmt", type=click.Choice(["jsonl", "json", "parquet", "csv"]), required=True,
              help="jsonl (json): one message per line, the line itself; parquet, csv: one per row, as JSON.")
@click.option("--key-field", default=None, help="The field or column that becomes the message key.")
@click.option("--timestamp-field", default=None, help="The field or column that becomes the message timestamp.")
@click.option("--no-header", is_flag=True, help="CSV files have no header line (columns _c0, _c1, ...).")
@click.option("--infer-schema", is_flag=True, help="CSV: numbers as numbers in the JSON (default: strings).")
@click.option("--force", is_flag=True, help="Import files again even though they were imported before.")
@click.option("--sync", default="none", show_default=True, metavar="POLICY",
              help=f"The topic writers' sync policy: {POLICY_FORMS}.")
@click.argument("inputs", nargs=-1, required=True)
@_spark_options
def import_(data: Path | None, topic: str | None, journal: Path | None, fmt: str, key_field: str | None,
            timestamp_field: str | None, no_header: bool, infer_schema: bool, force: bool, sync: str,
            inputs: tuple[str, ...], spark_settings: dict[str, Any]) -> None:
    """Load files (JSON lines, Parquet, CSV; files, directories or globs) into a topic, once.

    The same files imported again append nothing unless --force; an import that failed half way
    completes without duplicates when run again.
    """
    from journalq.spark.pipelines import import_files, input_files

    if fmt != "csv" and (no_header or infer_schema):  # before Spark starts, and not ignored
        raise click.UsageError(f"--no-header and --infer-schema are for --format csv, not {fmt}")

    def check() -> None:
        SyncPolicy.parse(sync)  # else first read by the writers, once Spark has started
        input_files(list(inputs))

    result = _run(spark_settings, "import", lambda spark: import_files(
        spark, list(inputs), fmt, journal=_str(journal), data=_str(data), topic=topic,
        key_field=key_field, timestamp_field=timestamp_field, header=not no_header,
        infer_schema=infer_schema, force=force, sync=sync), check)
    click.echo(result.to_json())
