"""The ``journalq`` Python data source: batch and streaming reads, batch and streaming writes.

See ``journalq.spark`` for how to use it and README.md for the options. This module holds the
classes Spark drives; the work is done in ``reading``, ``writing`` and ``columnar``.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - Spark 4.0 hands rows instead of Arrow batches
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase

try:  # Spark 4.2+: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


from journalq.errors import Error
from journalq.journal.writer import DEFAULT_SEGMENT_SIZE
from journalq.spark import options as opts
from journalq.spark import predicates, reading, writing
from journalq.spark.reading import DataLossError, ReadSpec, ShardRange
from journalq.spark.schema import SCHEMA, check_read_schema
from journalq.spark.targets import Target, for_writing, resolve, segment_size_for

NAME = "journalq"
DEFAULT_MAX_PARTITION_BYTES = 32 << 20

# The options each use takes (README.md describes them); any other is refused.
_READ_OPTIONS = ("topic", "startingOffsets", "startingTimestamp", "minPartitions", "maxPartitionBytes",
                 "failOnDataLoss")
BATCH_READ_OPTIONS = (*_READ_OPTIONS, "endingOffsets", "endingTimestamp", "filterPushdown")
STREAM_READ_OPTIONS = (*_READ_OPTIONS, "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
_WRITE_OPTIONS = ("topic", "shardBit", "shardPrefix", "sync", "segmentSize")
BATCH_WRITE_OPTIONS = (*_WRITE_OPTIONS, "writeId")
STREAM_WRITE_OPTIONS = _WRITE_OPTIONS


def _path(options) -> str:
    path = opts.get(options, "path")
    listed = opts.get(options, "paths")  # what Spark passes for load([a, b]), as a JSON list
    if not path and listed:
        import json

        try:
            paths = json.loads(listed)
        except ValueError:
            paths = None
        if not isinstance(paths, list):
            paths = [listed]
        if len(paths) == 1:
            return str(paths[0])
        # Each journal's shards are named alike ("" for a plain journal): their rows would mix.
        raise opts.OptionError(
            f"journalq reads one path per load(), not {len(paths)} ({', '.join(map(str, paths))}): "
            "load each and union the DataFrames"
        )
    return path or ""


def _target(options) -> Target:
    return resolve(_path(options), opts.get(options, "topic"))


# -- partitions -----------------------------------------------------------------------------------


class Split(InputPartition):
    """One partition: offsets ``[start, end)`` of one shard."""

    def __init__(self, index: int, r: ShardRange, token: str | None = None, host: str | None = None) -> None:
        super().__init__(index)
        self.range = r
        self.token = token  # identifies the plan, for the pushdown guard
        self.host = host


def _splits(ranges: Sequence[ShardRange], options, token: str | None = None) -> list[Split]:
    pieces = reading.split(
        ranges,
        min_partitions=opts.integer(options, "minPartitions", None, minimum=1),
        max_partition_bytes=opts.size(options, "maxPartitionBytes", DEFAULT_MAX_PARTITION_BYTES),
    )
    host = socket.gethostname() if token else None
    return [Split(i, r, token, host) for i, r in enumerate(pieces)]


def plan_batch(options) -> list[ShardRange]:
    """The ranges a batch read covers: startingOffsets/startingTimestamp to endingOffsets/
    endingTimestamp, per shard."""
    target = _target(options)
    shards = target.shards
    starting = opts.offsets(options, "startingOffsets", "earliest", ("earliest", "latest"))
    ending = opts.offsets(options, "endingOffsets", "latest", ("latest",))
    start_ts = _starting_timestamp(options)
    end_ts = opts.timestamp_ns(options, "endingTimestamp")
    if end_ts is not None and opts.get(options, "endingOffsets") is not None:
        raise opts.OptionError("give endingOffsets or endingTimestamp, not both")
    reading.check_known_shards(starting, shards, "startingOffsets")
    reading.check_known_shards(ending, shards, "endingOffsets")
    fail = opts.boolean(options, "failOnDataLoss", True)
    ranges = []
    for shard in shards:
        first, end = reading.bounds(shard)
        s = reading.resolve_offset(starting, shard.name, first, end, default=first)
        e = reading.resolve_offset(ending, shard.name, first, end, default=end)
        _check_not_past_end("endingOffsets", e, shard.name, end)
        _check_not_past_end("startingOffsets", s, shard.name, end)
        if e < s:  # not an empty read: the offsets were given the wrong way round
            raise opts.OptionError(
                f"endingOffsets: offset {e} of shard {shard.name!r} is before where the read starts ({s})"
            )
        if s < first:
            if fail:
                raise DataLossError(
                    f"startingOffsets: offset {s} of shard {shard.name!r} is no longer stored (the "
                    f"journal starts at {first}); set failOnDataLoss=false to start from there",
                    file=shard.path,
                )
            s = first
        if start_ts is not None:
            s = reading.first_offset_at(shard.path, start_ts, s, e)
        if end_ts is not None:
            e = reading.first_offset_at(shard.path, end_ts, s, e)
        ranges.append(ShardRange(shard.name, shard.path, s, e))
    return ranges


def _starting_timestamp(options) -> int | None:
    start_ts = opts.timestamp_ns(options, "startingTimestamp")
    if start_ts is not None and opts.get(options, "startingOffsets") is not None:
        raise opts.OptionError("give startingOffsets or startingTimestamp, not both")
    return start_ts


def _check_not_past_end(option: str, offset: int, shard: str, end: int) -> None:
    if offset > end:
        raise opts.OptionError(f"{option}: offset {offset} of shard {shard!r} is past its end ({end})")


# -- the pushdown guard ---------------------------------------------------------------------------
#
# Spark 4.x keeps one read plan per loaded DataFrame (PythonDataSourceV2.readInfo): the plan made
# when filters were last pushed is reused by the DataFrame's other scans, in the same query (a
# union or join of the DataFrame with itself) and in later queries without pushable filters.
# Pruning by filters pushed for another scan would drop rows that scan needs. So:
#   1. every pushed filter is also handed back to Spark, which evaluates it after the scan:
#      reading more than needed is always safe;
#   2. the plan covers everything; pruning happens in read(), only when allowed;
#   3. pruning is allowed only while every push for this loaded DataFrame had the same filters
#      (a registry on the driver's host), and
#   4. only for the first SQL execution that runs the plan, on the host that planned it (a marker
#      per plan in the host's temporary directory): a later query reusing the plan reads all;
#   5. a second scan reading a pruned plan's split in the same stage of that execution (a union
#      of the DataFrame with itself, df.union(df.where("type = 1")), whose scan without filters
#      never reaches Python) fails the query with SharedPlanError instead of returning wrong rows.
# What the guard cannot see: the two scans in different stages (a self-join,
# df.join(df.where("type = 1"), "key")) look like one scan read twice (a sort samples its input
# first). That is why pushdown is off unless the option filterPushdown=true asks for it; README.md
# says so.


def _guard_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), f"journalq-spark-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _register_push(source_id: str, conditions: list) -> bool:
    """Record a push for this loaded DataFrame; True while every push had these conditions."""
    import json

    directory = _guard_dir()
    _sweep(directory)
    line = json.dumps(sorted(map(repr, conditions)))
    path = os.path.join(directory, f"pushes-{source_id}")
    with open(path, "a+", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        f.seek(0)
        seen = {x.strip() for x in f if x.strip()}
    return seen == {line}


GUARD_AGE = 86400.0  # the guard's files are swept after a day


def _plan_token() -> str:
    """A new plan's id; it starts with when it was made (seconds), see ``_may_prune``."""
    return f"{int(time.time())}-{uuid.uuid4().hex}"


def _sweep(directory: str, age: float = GUARD_AGE) -> None:
    now = time.time()
    try:
        for name in os.listdir(directory):
            full = os.path.join(directory, name)
            try:
                if now - os.stat(full).st_mtime > age:
                    os.unlink(full)
            except OSError:
                pass
    except OSError:
        pass


def _publish(name: str, value: str) -> str:
    """Create the marker ``name`` holding ``value`` unless it exists; return what it holds."""
    final = os.path.join(_guard_dir(), name)
    tmp = f"{final}.{os.getpid()}.{uuid.uuid4().hex}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(value)
    try:
        os.link(tmp, final)  # atomic: the first task to get here wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(final, encoding="utf-8") as f:
        return f.read()


class SharedPlanError(Error):
    """One query scans a loaded DataFrame twice and Spark gave both scans the same pushed plan."""


def _may_prune(token: str, split: int) -> bool:
    """Whether this task may prune by the filters pushed for plan ``token``: only in the first
    SQL execution that runs the plan. In it, the same split read by another task of the same
    stage is a second scan using this plan (a union of the DataFrame with itself): the query
    fails rather than let one scan get the other's rows. (A split read again by another stage is
    allowed: a sort samples its input in a job of its own before reading it.)"""
    from pyspark import TaskContext

    made = token.split("-", 1)[0]
    if not made.isdigit() or time.time() - int(made) > GUARD_AGE / 2:
        return False  # its markers may have been swept: reading everything is always right
    context = TaskContext.get()
    if context is None:
        return False
    execution = context.getLocalProperty("spark.sql.execution.root.id") or context.getLocalProperty(
        "spark.sql.execution.id"
    )
    if execution is None:
        return False
    if _publish(f"plan-{token}", execution) != execution:
        return False  # a later query reusing the plan: read everything, Spark filters
    claimer = f"{context.stageId()}:{context.partitionId()}"
    first = _publish(f"claim-{token}-{split}-{context.stageId()}", claimer)
    if first != claimer:
        raise SharedPlanError(
            "this query scans one loaded journalq DataFrame twice, and Spark (4.x) gave both scans "
            "the read plan made for the filters pushed by one of them, so journalq cannot tell "
            "which rows each scan needs. Load the DataFrame once per use "
            "(spark.read.format('journalq').load(...)), or set the option filterPushdown=false"
        )
    return True


# -- batch reading ----------------------------------------------------------------------------------


class JournalReader(DataSourceReader):
    """A batch read (without filter pushdown)."""

    def __init__(self, source_id: str, options, schema) -> None:
        self.source_id = source_id
        self.options = dict(options)
        self.schema = check_read_schema(schema)
        self.conditions: list = []
        self.prune = False
        self.token: str | None = None

    def partitions(self) -> list[Split]:
        return _splits(plan_batch(self.options), self.options, self.token) or [Split(0, ShardRange("", "", 0, 0))]

    def read(self, partition: Split) -> Iterator:
        prune = False
        if self.prune and self.token is not None and partition.host == socket.gethostname():
            prune = _may_prune(self.token, partition.value)
        spec = ReadSpec(
            self.schema,
            self.conditions,
            prune=prune,
            fail_on_data_loss=opts.boolean(self.options, "failOnDataLoss", True),
        )
        if partition.range.count:
            yield from reading.read_range(partition.range, spec)


class JournalFilteringReader(JournalReader):
    """A batch read that takes the filters Spark pushes down (``offset``, ``timestamp``,
    ``timestamp_ns``, ``type``, ``shard``): it seeks to the offsets they allow, skips shards they
    exclude and drops rows before they reach Spark, which evaluates them again (see above)."""

    def pushFilters(self, filters):  # noqa: N802 - Spark's name
        conditions = [c for c in (predicates.translate(f) for f in filters) if c is not None]
        if conditions:
            self.conditions = conditions
            self.token = _plan_token()
            self.prune = _register_push(self.source_id, conditions)
        return list(filters)  # all of them: Spark filters again, whatever plan it ends up using


def _pushdown_disabled_by_spark() -> bool:
    """Whether Spark is planning this read with filter pushdown disabled: its planner then
    refuses a reader that defines ``pushFilters`` (``DATA_SOURCE_PUSHDOWN_DISABLED``), so the
    reader without it is used. (Spark does not tell a data source its configuration; its planner
    has it in a local variable.)"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "pyspark.sql.worker.plan_data_source_read":
            enabled = frame.f_locals.get("enable_pushdown")
            if enabled is not None:
                return not enabled
        frame = frame.f_back
    return False


# -- streaming reading ------------------------------------------------------------------------------


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: offsets per shard in the checkpoint, as ``{"<shard>": next offset}``.
    A micro-batch is planned only over messages on stable storage: the reader syncs the segments
    it reports an end in (once each growth), whatever sync policy their writer chose."""

    def __init__(self, options, schema) -> None:
        self.options = dict(options)
        self.schema = check_read_schema(schema)
        self.max_offsets = opts.integer(options, "maxOffsetsPerTrigger", None, minimum=1)
        self.min_offsets = opts.integer(options, "minOffsetsPerTrigger", None, minimum=1)
        if self.min_offsets is not None and self.max_offsets is not None and self.min_offsets > self.max_offsets:
            # as Kafka's source: no batch could ever hold the minimum it waits for
            raise opts.OptionError(
                f"option minOffsetsPerTrigger ({self.min_offsets}) is higher than option "
                f"maxOffsetsPerTrigger ({self.max_offsets}): a micro-batch would wait for more "
                "messages than it may take"
            )
        self.max_delay = opts.duration(options, "maxTriggerDelay", 15 * 60.0)
        self.fail = opts.boolean(options, "failOnDataLoss", True)
        for name in ("endingOffsets", "endingTimestamp"):
            if opts.get(options, name) is not None:
                raise opts.OptionError(f"option {name} is for batch reads only")
        self._available_now: dict[str, int] | None = None
        # When the last batch was planned; None before the first, which (as Kafka's source) does
        # not wait for minOffsetsPerTrigger: the delay counts from a batch.
        self._last_trigger: float | None = None
        self._synced: dict[str, int] = {}  # per shard, the end up to which it was made durable

    # offsets

    def _ends(self) -> dict[str, int]:
        return {shard.name: reading.end_offset(shard.path) for shard in _target(self.options).shards}

    def _durable(self, ends: dict[str, int], since: dict[str, int]) -> None:
        """Sync each shard up to ``ends`` (read before: what was synced holds them), from where
        this reader synced it last, else from ``since`` (the batch's start; the first offset
        when unknown), all of it when it went back (made again). Offsets planned, or started
        after, then outlive a power cut whatever the writer's sync policy: a planned batch never
        covers messages that recovery would cut."""
        for shard, end in ends.items():
            done = self._synced.get(shard)
            if done == end:
                continue
            path = _shard_path(self.options, shard)
            if done is None:
                low = since.get(shard, reading.first_offset(path))
            elif end < done:
                low = reading.first_offset(path)  # made again (or cut): what was synced is gone
            else:
                low = done
            reading.make_durable(path, low, entries=done is None or end < done)
            self._synced[shard] = end

    def initialOffset(self) -> dict:  # noqa: N802
        target = _target(self.options)
        starting = opts.offsets(self.options, "startingOffsets", "latest", ("earliest", "latest"))
        reading.check_known_shards(starting, target.shards, "startingOffsets")
        start_ts = _starting_timestamp(self.options)
        out = {}
        for shard in target.shards:
            first, end = reading.bounds(shard)
            offset = reading.resolve_offset(starting, shard.name, first, end, default=first)
            # Past the end, the messages up to it would be skipped once they came.
            _check_not_past_end("startingOffsets", offset, shard.name, end)
            if start_ts is not None:
                offset = reading.first_offset_at(shard.path, start_ts, first, end)
            out[shard.name] = offset
        # Messages before the start are passed over: lost and written anew, they would be skipped.
        self._durable(out, out)
        return out

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # noqa: N802
        ends = self._ends()
        self._durable(ends, start or {})
        if self._available_now is not None:
            ends = {s: min(e, self._available_now_end(s, start)) for s, e in ends.items()}
        if start is None:  # Spark before 4.2: no admission control
            return ends
        current = dict(start)
        for shard in ends:
            first = reading.first_offset(_shard_path(self.options, shard))
            current.setdefault(shard, first)
            if not self.fail and current[shard] < first:
                # Skipped (partitions() starts there): counted, they would make empty batches.
                current[shard] = first
        went_back = {s: e for s, e in ends.items() if s in start and e < start[s]}
        if went_back:  # made again, or cut: partitions() fails or (failOnDataLoss=false) rereads it
            return {**current, **went_back}
        available = {s: max(0, ends.get(s, current[s]) - current[s]) for s in current}
        max_rows, min_rows = self._limits(limit)
        total = sum(available.values())
        if total == 0:
            return current
        if min_rows and total < min_rows and self._available_now is None and self._last_trigger is not None:
            if time.monotonic() - self._last_trigger < self.max_delay:
                return dict(start)  # wait for more (or for maxTriggerDelay)
        if max_rows is not None and total > max_rows:
            available = allocate(available, max_rows)
        self._last_trigger = time.monotonic()
        return {s: current[s] + available[s] for s in current}

    def _available_now_end(self, shard: str, start: dict | None) -> int:
        """Where Trigger.AvailableNow stops reading ``shard``: its end when it was prepared. A
        shard made since had nothing then: it stops where it starts (not at 0, which would go
        back from a shard that starts past 0: a hub's copy, one whose first segments are deleted)."""
        assert self._available_now is not None
        if shard in self._available_now:
            return self._available_now[shard]
        if start is not None and shard in start:
            return start[shard]
        return reading.first_offset(_shard_path(self.options, shard))

    def _limits(self, limit) -> tuple[int | None, int | None]:
        if ReadAllAvailable is None or limit is None or isinstance(limit, ReadAllAvailable):
            return None, None
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, self.min_offsets
        if isinstance(limit, ReadMinRows):
            return self.max_offsets, limit.min_rows
        return self.max_offsets, self.min_offsets

    def getDefaultReadLimit(self):  # noqa: N802
        if ReadAllAvailable is None:
            return None
        if self.max_offsets is not None:
            return ReadMaxRows(self.max_offsets)
        if self.min_offsets is not None:
            return ReadMinRows(self.min_offsets)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:  # noqa: N802
        return self._ends()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._available_now = self._ends()

    # reading

    def partitions(self, start: dict, end: dict) -> list[Split]:
        ranges = []
        for shard, e in sorted(end.items()):
            path = _shard_path(self.options, shard)
            first = reading.first_offset(path)
            s = start.get(shard, first)
            if s > e:
                if self.fail:
                    raise DataLossError(
                        f"shard {shard!r} went back from offset {s} to {e} (was it deleted and made "
                        "again?); set failOnDataLoss=false to read it from its start",
                        file=path,
                    )
                s = min(first, e)
            if s < first and s < e:
                if self.fail:
                    raise DataLossError(
                        f"offsets {s} to {min(first, e)} of shard {shard!r} were deleted (retention) "
                        "before this query read them; set failOnDataLoss=false to skip them",
                        file=path,
                        offset=s,
                    )
                s = min(first, e)
            ranges.append(ShardRange(shard, path, s, e))
        return _splits(ranges, self.options)

    def read(self, partition: Split) -> Iterator:
        spec = ReadSpec(self.schema, [], prune=False, fail_on_data_loss=self.fail)
        yield from reading.read_range(partition.range, spec)

    def commit(self, end: dict) -> None:
        pass


def _shard_path(options, shard: str) -> str:
    target = _target(options)
    if not shard:
        return str(target.path)
    return str(target.path / shard)


def allocate(available: dict[str, int], limit: int) -> dict[str, int]:
    """Share ``limit`` offsets among shards in proportion to what each has (as Kafka's
    maxOffsetsPerTrigger). What rounding leaves goes first to shards whose share rounded to 0
    (else a small shard beside a big backlog would never be read), then to the fullest."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    out = {s: a * limit // total for s, a in available.items()}
    remaining = limit - sum(out.values())
    for s in sorted(available, key=lambda k: (out[k] > 0, -available[k], k)):
        if remaining <= 0:
            break
        if out[s] < available[s]:
            out[s] += 1
            remaining -= 1
    return out


# -- writing ------------------------------------------------------------------------------------


@dataclass
class JournalCommit(WriterCommitMessage):
    result: writing.TaskResult


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise writing.WriteError(
            "journalq only appends: a journal's messages cannot be overwritten; use mode('append') "
            "(outputMode('append') for streams)"
        )


def _write_setup(options, schema, overwrite: bool) -> tuple[writing.WriteSpec, Target, str, int]:
    """What both sinks check and settle on the driver before any task runs: append mode, the
    columns, the target, the sync policy and the segment size."""
    from journalq.journal.sync import SyncPolicy

    _refuse_overwrite(overwrite)
    spec = writing.check_schema(schema)
    bit = opts.integer(options, "shardBit", None, minimum=1)
    prefix = opts.get(options, "shardPrefix")
    if prefix is not None and bit is None:
        raise opts.OptionError("option shardPrefix names the shards of a new root: it needs the option shardBit")
    target = for_writing(_path(options), opts.get(options, "topic"), shard_bit=bit, shard_prefix=prefix or "")
    sync = opts.get(options, "sync") or "none"
    SyncPolicy.parse(sync)  # refuse a bad policy now, not in every task
    default_size = opts.size(options, "segmentSize", DEFAULT_SEGMENT_SIZE)
    explicit = opts.get(options, "segmentSize") is not None
    return spec, target, sync, default_size if explicit else segment_size_for(target, default_size)


class JournalWriter(DataSourceArrowWriter):
    """A batch append, never all-or-nothing: a failed job keeps what its finished tasks appended
    (a journal has no undo). Without the option ``writeId`` it is at least once: a task that
    Spark runs again (a lost executor, speculation) appends its rows again. With ``writeId`` the
    append happens once per id: a task run again, or the same write run again after a failure,
    appends only what is missing, and once committed a write with that id appends nothing."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        self.write_id = opts.get(options, "writeId")
        if self.write_id == "":  # an id from an empty variable: not a plain append, silently
            raise opts.OptionError("option writeId is empty: give the write an id, or leave the option out")
        self.spec, self.target, self.sync, self.segment_size = _write_setup(options, schema, overwrite)

    def write(self, iterator) -> JournalCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        appender = writing.Appender(self.target, sync=self.sync, segment_size=self.segment_size)
        try:
            if self.write_id:
                messages, keys = [], []
                for batch in writing.iter_batches(iterator):
                    m, k = writing.batch_messages(batch, self.spec)
                    messages.extend(m)
                    keys.extend(k)
                log = writing.CommitLog(self.target, self.write_id)
                result = writing.append_exactly_once(appender, log, 0, partition, messages, keys)
            else:
                result = writing.TaskResult(None, None, partition)
                for batch in writing.iter_batches(iterator):
                    messages, keys = writing.batch_messages(batch, self.spec)
                    for shard, (first, count) in appender.append(messages, keys).items():
                        done = result.appended.setdefault(shard, [first, 0])
                        done[1] += count
                    result.rows += len(messages)
        finally:
            appender.close()
        return JournalCommit(result)

    def commit(self, messages) -> None:
        if self.write_id:
            log = writing.CommitLog(self.target, self.write_id)
            writing.commit_batch(log, 0, [m.result for m in messages if m is not None])

    def abort(self, messages) -> None:
        pass  # appended messages stay (a journal has no undo); a rerun with writeId completes it


class JournalStreamWriter(_StreamWriterBase):
    """The streaming sink, exactly once: see ``journalq.spark.writing``."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        self.spec, self.target, self.sync, self.segment_size = _write_setup(options, schema, overwrite)

    def write(self, iterator) -> JournalCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if query_id is None or batch_id is None:
            raise Error("the journalq streaming sink runs in a streaming query only (no query or batch id)")
        messages, keys = [], []
        for batch in writing.iter_batches(iterator):
            m, k = writing.batch_messages(batch, self.spec)
            messages.extend(m)
            keys.extend(k)
        appender = writing.Appender(self.target, sync=self.sync, segment_size=self.segment_size)
        try:
            log = writing.CommitLog(self.target, query_id)
            result = writing.append_exactly_once(
                appender, log, int(batch_id), context.partitionId(), messages, keys
            )
        finally:
            appender.close()
        return JournalCommit(result)

    def commit(self, messages, batchId: int) -> None:  # noqa: N803
        results = [m.result for m in messages if m is not None]
        query_ids = {r.query_id for r in results if r.query_id}
        for query_id in query_ids:
            log = writing.CommitLog(self.target, query_id)
            writing.commit_batch(log, batchId, results)

    def abort(self, messages, batchId: int) -> None:  # noqa: N803
        pass  # what tasks appended stays; Spark runs the batch again and the intents skip it


# -- the data source ------------------------------------------------------------------------------


class JournalDataSource(DataSource):
    """``spark.read.format("journalq").load(PATH)``: see ``journalq.spark``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options) -> None:
        super().__init__(options)
        self.source_id = uuid.uuid4().hex  # one per load(): the pushdown guard's registry key

    def schema(self):
        return SCHEMA

    def reader(self, schema) -> JournalReader:
        # Off unless asked for: Spark 4 can hand one scan's pushed filters to another scan of the
        # same DataFrame (a self-join), and a wrong answer is worse than a slow one.
        opts.check_names(self.options, BATCH_READ_OPTIONS, "batch reads")
        mode = (opts.get(self.options, "filterPushdown") or "false").strip().lower()
        if mode not in ("auto", "true", "false"):
            raise opts.OptionError(f"option filterPushdown must be true, false or auto, not {mode!r}")
        if mode == "false" or _pushdown_disabled_by_spark():
            return JournalReader(self.source_id, self.options, schema)
        return JournalFilteringReader(self.source_id, self.options, schema)

    def streamReader(self, schema) -> JournalStreamReader:  # noqa: N802
        reader = JournalStreamReader(self.options, schema)  # says why endingOffsets is refused
        opts.check_names(self.options, STREAM_READ_OPTIONS, "streaming reads")
        return reader

    def writer(self, schema, overwrite: bool) -> JournalWriter:
        opts.check_names(self.options, BATCH_WRITE_OPTIONS, "batch writes")
        return JournalWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool) -> JournalStreamWriter:  # noqa: N802
        opts.check_names(self.options, STREAM_WRITE_OPTIONS, "streaming writes")
        return JournalStreamWriter(self.options, schema, overwrite)
