"""The pipelines ``journalq pipeline NAME`` runs, as functions of a Spark session.

* ``archive``: a topic's (or journal's) history to Parquet, partitioned by UTC date, resumable;
* ``aggregate``: a stream of JSON events to event-time window statistics, written to a topic and
  to Parquet, exactly once;
* ``import_files``: JSON lines, Parquet or CSV files into a topic, once per set of files.

They run unchanged on ``local[N]`` and on a cluster (``spark://...``), as long as every executor
sees the data directories at the same paths.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from journalq.errors import Error, InvalidArgumentError
from journalq.journal.offsets import ReaderOffset, end_offset
from journalq.journal.recovery import fsync_dir, fsync_file, make_dirs
from journalq.queue.settings import check_name
from journalq.spark.reading import DataLossError, first_offset
from journalq.spark.targets import for_writing, resolve
from journalq.spark.writing import CommitLog

FORMAT = "journalq"
ARCHIVE_PREFIX = "jq-"  # archived files: jq-<start>-<end>-<Spark's name>, offsets in 20 digits
STAGING = "_staging"  # Spark skips names starting with "_" when reading the archive back


class PipelineError(Error):
    """A pipeline that cannot run as asked."""


def _source_options(journal: str | None, data: str | None, topic: str | None) -> tuple[str, dict[str, str]]:
    if journal and (data or topic):
        raise PipelineError("give a journal path, or a data directory and a topic, not both")
    if journal:
        return journal, {}
    if data and topic:
        return data, {"topic": topic}
    raise PipelineError("give a journal path (--journal), or a data directory and a topic (--data, --topic)")


def check_source(journal: str | None, data: str | None, topic: str | None) -> None:
    """Fail now (before Spark starts) when the source is missing or not a journal or topic."""
    path, options = _source_options(journal, data, topic)
    resolve(path, options.get("topic"))


def utc_date(timestamp: Any) -> Any:
    """The UTC date of a TIMESTAMP column, whatever the session's time zone."""
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(F.unix_micros(timestamp) / 86_400_000_000).cast("int"))


# -- archive ----------------------------------------------------------------------------------------


@dataclass
class ArchiveResult:
    source: str
    output: str
    start: int
    end: int
    messages: int
    files: int = 0
    dates: list[str] = field(default_factory=list)
    removed_leftovers: int = 0

    def to_json(self) -> str:
        return json.dumps({"pipeline": "archive", **asdict(self)})


def archive(
    spark: Any,
    output: str,
    *,
    journal: str | None = None,
    data: str | None = None,
    topic: str | None = None,
    name: str = "spark-archive",
    fail_on_data_loss: bool = True,
) -> ArchiveResult:
    """Export what the topic got since the last run to ``output`` as Parquet, partitioned by
    ``date`` (the UTC date of the message's timestamp; the zero time goes to Hive's default
    partition), then commit the topic's reader offset ``ofs/<name>.ofs``.

    Columns: offset, timestamp, timestamp_ns, type, key, value, attributes, and body for queue
    envelopes (NULL for plain messages, whose body is their value: ``coalesce(body, value)``).
    A run writes into ``output/_staging/``, moves the files into place with names that carry
    the offset range (``jq-<start>-<end>-...``) and only then commits the offset; a run that died
    before its commit is cleaned up by the next one (its files have a start at or past the
    committed offset), so every message is archived exactly once.
    """
    from pyspark.sql import functions as F

    path, options = _source_options(journal, data, topic)
    target = resolve(path, options.get("topic"))
    if target.sharded:
        raise PipelineError(
            f"{target.path} is a root of shards; archive each shard directory on its own (--journal ROOT/SHARD)"
        )
    source = str(target.path)
    out = Path(output).absolute()
    with ReaderOffset(source, name) as position:  # its lock keeps a second archiver out
        committed = position.value
        first, end = first_offset(source), end_offset(source)
        start = committed
        if committed > end:
            raise PipelineError(
                f"the reader offset {name} ({committed}) is past the end of {source} ({end}): was the "
                "topic deleted and made again? Set it with `journalq offset DIR NAME --set N`"
            )
        if committed < first:
            if fail_on_data_loss:
                raise DataLossError(
                    f"messages {committed} to {first} were deleted before they were archived; "
                    "run with --skip-lost to archive from what is left",
                    file=source,
                )
            start = first
        removed = _remove_leftovers(out, committed)
        result = ArchiveResult(source, str(out), start, end, end - start, removed_leftovers=removed)
        if start >= end:
            return result
        staging = out / STAGING / f"{start:020d}-{end:020d}"
        shutil.rmtree(staging, ignore_errors=True)
        df = (
            spark.read.format(FORMAT)
            .option("startingOffsets", json.dumps({"": start}))
            .option("endingOffsets", json.dumps({"": end}))
            .load(source)
        )
        df = df.select(
            "offset", "timestamp", "timestamp_ns", "type", "key", "value", "attributes",
            F.when(F.col("type") == 0xE0, F.col("body")).alias("body"),
            utc_date(F.col("timestamp")).alias("date"),
        )
        df.write.mode("append").partitionBy("date").parquet(str(staging))
        moved, dates = _move_into_place(staging, out, f"{ARCHIVE_PREFIX}{start:020d}-{end:020d}-")
        position.commit(end)
        shutil.rmtree(staging, ignore_errors=True)
        try:
            (out / STAGING).rmdir()
        except OSError:
            pass
        result.files, result.dates = moved, dates
        return result


def _archived_range(name: str) -> tuple[int, int] | None:
    if not name.startswith(ARCHIVE_PREFIX):
        return None
    parts = name[len(ARCHIVE_PREFIX):].split("-", 2)
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _remove_leftovers(out: Path, committed: int) -> int:
    """Delete the files of runs that never committed (their range starts at or past the
    committed offset), and their staging directories."""
    removed = 0
    if not out.is_dir():
        return 0
    for directory, _, files in os.walk(out):
        if STAGING in Path(directory).relative_to(out).parts:
            continue
        for name in files:
            span = _archived_range(name)
            if span is not None and span[0] >= committed:
                os.unlink(os.path.join(directory, name))
                removed += 1
    shutil.rmtree(out / STAGING, ignore_errors=True)
    return removed


def _move_into_place(staging: Path, out: Path, prefix: str) -> tuple[int, list[str]]:
    """Move a run's files from ``staging`` into ``out``, durably: Spark does not sync what it
    writes, and the reader offset is committed right after this."""
    moved = 0
    dates = set()
    touched = {out}
    for directory, _, files in os.walk(staging):
        relative = Path(directory).relative_to(staging)
        for name in sorted(files):
            if name.startswith((".", "_")):
                continue  # checksums, _SUCCESS
            destination = out / relative
            make_dirs(destination, durable=True)
            source = os.path.join(directory, name)
            fsync_file(source)
            os.replace(source, destination / f"{prefix}{name}")
            touched.add(destination)
            moved += 1
            if relative.parts:
                dates.add(relative.parts[0].split("=", 1)[-1])
    for directory in touched:
        fsync_dir(directory)
    fsync_dir(out.parent)  # Spark may have made ``out`` for this run
    return moved, sorted(dates)


# -- aggregate ------------------------------------------------------------------------------------

_UNITS = r"(?:years?|months?|weeks?|days?|hours?|minutes?|seconds?|milliseconds?|microseconds?)"
# Spark's interval text (``IntervalUtils.fromIntervalString``, tried on Spark 4): ``[interval] N
# unit [N unit]...``, N signed, a fraction only of seconds, case ignored; or SQL's INTERVAL with
# quoted parts (``INTERVAL '10 minutes'``, ``INTERVAL '1:30' HOUR TO MINUTE``), left for Spark to
# judge: this check must refuse nothing that Spark takes.
_PLAIN_INTERVAL = re.compile(
    rf"\s*(?:interval\s+)?(?:[+-]?\s*(?:\d+\s+{_UNITS}|(?:\d+\.\d*|\.\d+)\s+seconds?)(?:\s+|$))+",
    re.IGNORECASE | re.ASCII,
)
_SQL_INTERVAL = re.compile(r"\s*interval\b.*'.*'.*", re.IGNORECASE | re.ASCII | re.DOTALL)


def check_interval(name: str, text: object) -> str:
    """Refuse ``text`` for the interval ``name`` (an aggregation's window or watermark) unless it
    is in the form Spark takes ("10 minutes", "1 hour 30 minutes", "INTERVAL '10 minutes'"), so
    that it is refused before Spark starts, by name; returns it."""
    if not isinstance(text, str) or not (_PLAIN_INTERVAL.fullmatch(text) or _SQL_INTERVAL.fullmatch(text)):
        raise InvalidArgumentError(
            f"{name}: {text!r} is not an interval as Spark writes one: a number and a unit (year, month, week, "
            "day, hour, minute, second, millisecond, microsecond) once or more, as '10 minutes' or "
            "'1 hour 30 minutes', or INTERVAL '...'"
        )
    return text


@dataclass
class AggregateSettings:
    """What the aggregation pipeline reads, computes and writes (see ``aggregate``)."""

    parquet: str
    checkpoint: str
    journal: str | None = None
    data: str | None = None
    topic: str | None = None
    output_journal: str | None = None
    output_topic: str | None = None  # in ``data``
    window: str = "1 minute"
    watermark: str = "10 minutes"
    time_field: str = "time"
    key_field: str | None = None
    value_field: str | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    available_now: bool = False
    interval: str = "10 seconds"


def event_statistics(spark: Any, events: Any, settings: AggregateSettings) -> Any:
    """The windowed statistics of a DataFrame read from the journalq source (streaming or not).

    Each message's body is a JSON object; its event time is the field ``time_field`` (an ISO 8601
    string, or seconds since the epoch), or the message's timestamp when the field is missing or
    unreadable; the group is the field ``key_field`` (as a string; "" without one) and the
    statistics are of the number in ``value_field``. Messages that are not JSON objects count
    with the message time and the empty group. Windows close ``watermark`` after their end.
    """
    from pyspark.sql import functions as F

    body = F.col("body").cast("string")

    def field_of(name: str) -> Any:
        return F.get_json_object(body, "$." + name)

    raw_time = field_of(settings.time_field)
    event_time = F.coalesce(
        F.try_to_timestamp(raw_time),
        F.timestamp_seconds(raw_time.try_cast("double")),
        F.col("timestamp"),
    )
    key = F.coalesce(field_of(settings.key_field), F.lit("")) if settings.key_field else F.lit("")
    value = field_of(settings.value_field).try_cast("double") if settings.value_field else F.lit(None).cast("double")
    rows = events.select(event_time.alias("event_time"), key.alias("key"), value.alias("value")).where(
        F.col("event_time").isNotNull()
    )
    stats = (
        rows.withWatermark("event_time", settings.watermark)
        .groupBy(F.window("event_time", settings.window), F.col("key"))
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("value").alias("sum"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("avg"),
        )
    )
    return stats.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "key",
        "count",
        "sum",
        "min",
        "max",
        "avg",
    )


def _aggregate_output(settings: AggregateSettings) -> tuple[str, dict[str, str]]:
    """Where the aggregation writes its statistics: the path and the data source's options."""
    if settings.output_journal and settings.output_topic:
        raise PipelineError("give an output journal or an output topic, not both")
    if settings.output_topic:
        if not settings.data:
            raise PipelineError("an output topic lives in the data directory: give --data")
        return settings.data, {"topic": settings.output_topic}
    if settings.output_journal:
        return settings.output_journal, {}
    raise PipelineError("give an output topic (--output-topic) or journal (--output-journal)")


def check_aggregate(settings: AggregateSettings) -> None:
    """Fail now (before Spark starts) when the source or the output is missing, given twice or
    misnamed. Creates nothing: the output is made when the aggregation starts."""
    check_source(settings.journal, settings.data, settings.topic)
    check_interval("window", settings.window)
    check_interval("watermark", settings.watermark)
    _, out_options = _aggregate_output(settings)
    if "topic" in out_options:
        check_name(out_options["topic"], "topic")  # else first refused by the broker making it


def aggregate(spark: Any, settings: AggregateSettings, *, wait: bool = True) -> list[Any]:
    """Start the aggregation: JSON events from a topic, statistics per event-time window (with a
    watermark) to another topic (as JSON, keyed by the group) and to Parquet (partitioned by the
    window's UTC date). Two streaming queries over the same source, each exactly once by its own
    sink (journalq's commit journal; Spark's file sink log), each with its checkpoint under
    ``checkpoint/`` (``journal``, ``parquet``). Windows are written once closed (output mode
    append). Returns the queries; with ``wait`` waits until they end (``available_now``) or one
    fails (then stops the other and raises)."""
    from pyspark.sql import functions as F

    path, options = _source_options(settings.journal, settings.data, settings.topic)
    out_path, out_options = _aggregate_output(settings)
    resolve(path, options.get("topic"))  # fail now, clearly, when the source is missing
    for_writing(out_path, out_options.get("topic"))

    reader = spark.readStream.format(FORMAT).options(**options).option("startingOffsets", settings.starting_offsets)
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    stats = event_statistics(spark, reader.load(path), settings)
    checkpoint = Path(settings.checkpoint)

    def trigger(writer: Any) -> Any:
        return (
            writer.trigger(availableNow=True) if settings.available_now
            else writer.trigger(processingTime=settings.interval)
        )

    as_json = F.to_json(F.struct(*[F.col(c) for c in stats.columns]))
    key = F.when(F.octet_length("key") <= 127, F.col("key")).otherwise(F.sha1(F.col("key").cast("binary")))
    to_journal = trigger(
        stats.select(key.cast("binary").alias("key"), as_json.cast("binary").alias("value"))
        .writeStream.format(FORMAT)
        .options(**out_options)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint / "journal"))
        .queryName("journalq-aggregate-journal")
    ).start(out_path)
    try:
        to_parquet = trigger(
            stats.withColumn("date", utc_date(F.col("window_start")))
            .writeStream.format("parquet")
            .partitionBy("date")
            .outputMode("append")
            .option("path", settings.parquet)
            .option("checkpointLocation", str(checkpoint / "parquet"))
            .queryName("journalq-aggregate-parquet")
        ).start()
    except BaseException:
        to_journal.stop()
        raise
    queries = [to_journal, to_parquet]
    if wait:
        wait_for(spark, queries)
    return queries


def wait_for(spark: Any, queries: list[Any]) -> None:
    """Wait until every query ended; if one fails, stop the others and raise its error."""
    pending = list(queries)
    try:
        while pending:
            # In turn, a second at a time: waiting on one query alone would miss another failing.
            for query in list(pending):
                if len(pending) == 1:
                    query.awaitTermination()  # raises when it failed
                    pending.remove(query)
                elif query.awaitTermination(1):
                    pending.remove(query)
    except BaseException:
        for query in queries:
            try:
                query.stop()
            except Exception:
                pass
        raise


# -- import ---------------------------------------------------------------------------------------

IMPORT_FORMATS = ("jsonl", "parquet", "csv")


@dataclass
class ImportResult:
    target: str
    files: int
    messages: int
    write_id: str
    skipped: bool = False

    def to_json(self) -> str:
        return json.dumps({"pipeline": "import", **asdict(self)})


def input_files(inputs: list[str]) -> list[Path]:
    """Files named, found under directories named (hidden and ``_`` files skipped), or matched
    by glob patterns; sorted, each once."""
    found: set[Path] = set()
    for item in inputs:
        matches = glob.glob(item) if any(ch in item for ch in "*?[") else [item]
        if not matches:
            raise PipelineError(f"no file matches {item}")
        for match in matches:
            p = Path(match)
            if p.is_dir():
                for directory, dirs, files in os.walk(p):
                    dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
                    found.update(Path(directory) / f for f in files if not f.startswith((".", "_")))
            elif p.is_file():
                found.add(p)
            else:
                raise PipelineError(f"{p} does not exist")
    return sorted(p.resolve() for p in found)


def import_files(
    spark: Any,
    inputs: list[str],
    fmt: str,
    *,
    journal: str | None = None,
    data: str | None = None,
    topic: str | None = None,
    key_field: str | None = None,
    timestamp_field: str | None = None,
    header: bool = True,
    infer_schema: bool = False,
    force: bool = False,
    sync: str = "none",
) -> ImportResult:
    """Append the records of files to a topic (or journal): one message per JSON line (the line
    itself, byte for byte; blank lines skipped), per Parquet row or per CSV row (as a JSON object
    of the row's columns). ``key_field`` names the field or column whose value (as a string)
    becomes the message key; ``timestamp_field`` the one that becomes its timestamp (ISO 8601 or
    seconds since the epoch; a timestamp column as is), else the time of the append.

    A set of files (by path, size and modification time) is imported once: running the same
    import again appends nothing (``force`` imports them again), and a job that failed half way
    completes when run again, without duplicates (the write id makes the append exactly once).
    Messages keep the order of the records within each of Spark's input partitions only.
    """
    from pyspark.sql import functions as F

    fmt = {"json": "jsonl", "ndjson": "jsonl", "json-lines": "jsonl"}.get(fmt.lower(), fmt.lower())
    if fmt not in IMPORT_FORMATS:
        raise PipelineError(f"format {fmt!r}: choose one of {', '.join(IMPORT_FORMATS)}")
    files = input_files(inputs)
    if not files:
        raise PipelineError("no input files")
    path, options = _source_options(journal, data, topic)
    target = for_writing(path, options.get("topic"))
    identity = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    spec = json.dumps([identity, fmt, key_field, timestamp_field, header, infer_schema])
    write_id = "import-" + hashlib.sha256(spec.encode()).hexdigest()[:32]
    if force:
        write_id += "-" + os.urandom(8).hex()
    log = CommitLog(target, write_id)
    if log.committed(0):
        return ImportResult(str(target.path), len(files), 0, write_id, skipped=True)

    # input_files found these files: Spark must not expand "[", "*", ... in their names as globs
    # (its option __globPaths__=false reads a file twice when another matches the pattern).
    names = [re.sub(r"([{}\[\]*?\\])", r"\\\1", str(p)) for p in files]
    if fmt == "jsonl":
        lines = spark.read.text(names).where(F.trim("value") != "")
        line = F.col("value")

        def field_of(name: str) -> Any:
            return F.get_json_object(line, "$." + name)

        df = lines.select(line.cast("binary").alias("value"), *(
            [field_of(key_field).alias("_key")] if key_field else []
        ), *([field_of(timestamp_field).alias("_time")] if timestamp_field else []))
    else:
        reader = spark.read
        if fmt == "csv":
            reader = reader.option("header", header).option("inferSchema", infer_schema)
        rows = reader.format(fmt).load(names)
        for wanted in (key_field, timestamp_field):
            if wanted and wanted not in rows.columns:
                raise PipelineError(f"the files have no column {wanted!r} (they have {', '.join(rows.columns)})")
        df = rows.select(
            F.to_json(F.struct(*[F.col(f"`{c}`") for c in rows.columns])).cast("binary").alias("value"),
            *([F.col(f"`{key_field}`").alias("_key")] if key_field else []),
            *([F.col(f"`{timestamp_field}`").alias("_time")] if timestamp_field else []),
        )
    columns = [F.col("value")]
    if key_field:
        columns.append(F.col("_key").cast("string").cast("binary").alias("key"))
    if timestamp_field:
        raw = F.col("_time")
        kind = dict(df.dtypes)["_time"]
        if kind.startswith("timestamp"):
            when = raw
        elif kind in ("int", "bigint", "double", "float", "smallint", "tinyint") or kind.startswith("decimal"):
            when = F.timestamp_seconds(raw.cast("double"))
        else:
            text = raw.cast("string")
            when = F.coalesce(F.try_to_timestamp(text), F.timestamp_seconds(text.try_cast("double")))
        columns.append(when.alias("timestamp"))
    writer = df.select(*columns).write.format(FORMAT).mode("append").options(**options)
    writer.option("writeId", write_id).option("sync", sync).save(path)
    records = log.records(0)
    rows_written = next((r.get("rows", 0) for r in records if r.get("k") == "commit"), 0)
    return ImportResult(str(target.path), len(files), rows_written, write_id)
