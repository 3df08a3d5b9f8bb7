"""Appending Spark's rows to journals, and doing it exactly once when asked.

Rows arrive as Arrow record batches. ``value`` is required (BINARY, or STRING stored as UTF-8);
``key`` (BINARY or STRING), ``type`` (an integer type, 0..255), ``timestamp`` (TIMESTAMP) and
``timestamp_ns`` (BIGINT, exact, wins over ``timestamp``) are optional; NULL means "none": an
empty key, type 0, the time of the append. The columns the data source itself reads (``offset``,
``shard``, ``attributes``, ``body``) are ignored, so a DataFrame read from one journal can be
appended to another; any other column is refused. In a sharded root a row goes to the shard
``crc32(key) & (2**bit - 1)``, sej's default, through a shared writer per shard directory.

Exactly once (the streaming sink, and batch writes given a ``writeId``): each task records, in a
small sej journal beside the target (``_spark_commits/<query>/``), an *intent* before it appends:
its (batch, partition, shard), the offset the append starts at, how many messages and a digest
of them, all under the shard's writer lock. The driver then records the batch as *committed*. A
task that Spark runs again for the same batch (after a crash, a retry, a restart from the
checkpoint) finds the batch committed, or finds its intents and checks the messages at their
offsets against its rows, and appends only what is not there (see ``_not_appended_yet``). Only a
task run again reads the log: empty files beside it mark the tasks and commits it holds records of
(see ``CommitLog``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from journalq.errors import ZERO_TIMESTAMP, CorruptionError, Error, InvalidMessageError, OffsetOutOfRangeError
from journalq.journal import Message, Scanner, Writer
from journalq.journal.offsets import end_offset, first_offset
from journalq.journal.recovery import fsync_dir, make_dirs
from journalq.journal.segment import list_segments, remove_segment, segment_bases
from journalq.shard.naming import shard_name, shard_of
from journalq.spark.targets import Target

WRITABLE = ("value", "key", "type", "timestamp", "timestamp_ns")
IGNORED = ("offset", "shard", "attributes", "body")
INTENT, COMMIT = 1, 2  # record types in the commit journal
CRASH_ENV = "JOURNALQ_SPARK_TEST_CRASH"  # test hook, see crash_point()


class WriteError(Error, ValueError):
    """A DataFrame that cannot be appended to a journal (a missing or mistyped column, a bad row)."""


@dataclass(frozen=True)
class WriteSpec:
    """Which of the writable columns the DataFrame has, and whether strings need encoding."""

    columns: tuple[str, ...]
    string_key: bool = False
    string_value: bool = False


def check_schema(schema) -> WriteSpec:
    """The columns of a DataFrame to append, checked (``WriteError`` says what is wrong)."""
    from pyspark.sql.types import (
        BinaryType,
        ByteType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    from journalq.spark.schema import repeated_columns

    fields = {f.name: f.dataType for f in schema.fields}
    twice = [name for name in repeated_columns(schema) if name in WRITABLE]  # (others: ignored)
    if twice:
        raise WriteError(
            f"column(s) {', '.join(twice)} appear more than once (a join's?): "
            "select or rename the one to write"
        )
    if "value" not in fields:
        raise WriteError(
            "a DataFrame appended to a journal needs a value column (BINARY or STRING); "
            f"it has {', '.join(fields) or 'no columns'}"
        )
    unknown = [name for name in fields if name not in WRITABLE and name not in IGNORED]
    if unknown:
        raise WriteError(
            f"column(s) {', '.join(unknown)} cannot be written to a journal; the columns are "
            f"value, key, type, timestamp, timestamp_ns ({', '.join(IGNORED)} are ignored)"
        )
    expected = {
        "value": (BinaryType, StringType),
        "key": (BinaryType, StringType),
        "type": (ByteType, ShortType, IntegerType, LongType),
        "timestamp": (TimestampType, TimestampNTZType),
        "timestamp_ns": (LongType,),
    }
    for name, kinds in expected.items():
        if name in fields and not isinstance(fields[name], kinds):
            raise WriteError(
                f"column {name} is {fields[name].simpleString()}; it must be "
                + " or ".join(k().simpleString() for k in kinds)
            )
    return WriteSpec(
        tuple(n for n in WRITABLE if n in fields),
        string_key=isinstance(fields.get("key"), StringType),
        string_value=isinstance(fields["value"], StringType),
    )


# -- rows to messages -------------------------------------------------------------------------------


def batch_messages(batch, spec: WriteSpec) -> tuple[list[Message], list[bytes]]:
    """The messages of an Arrow record batch, and their keys (for sharding)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    names = batch.schema.names

    def column(name: str):
        return batch.column(names.index(name))

    values = column("value")
    if values.null_count:
        raise WriteError(f"value is NULL in {values.null_count} of {n} rows; every message needs a value")
    if spec.string_value:
        values = values.cast(pa.binary())
    values = values.to_pylist()
    keys: list[bytes]
    if "key" in spec.columns:
        key_column = column("key")
        if spec.string_key:
            key_column = key_column.cast(pa.binary())
        keys = [k or b"" for k in key_column.to_pylist()]
        too_long = [k for k in keys if len(k) > 127]
        if too_long:
            raise WriteError(f"a key of {len(too_long[0])} bytes: sej keys hold at most 127 bytes")
    else:
        keys = [b""] * n
    if "type" in spec.columns:
        types_column = column("type")
        if types_column.null_count:
            types_column = types_column.fill_null(0)
        low, high = pc.min(types_column).as_py(), pc.max(types_column).as_py()
        if n and (low < 0 or high > 255):
            raise WriteError(f"type must be from 0 to 255; the data has {low if low < 0 else high}")
        types = types_column.to_pylist()
    else:
        types = [0] * n
    stamps: list[int | None] = [None] * n
    if "timestamp" in spec.columns:
        ts = column("timestamp").cast(pa.int64())  # microseconds
        stamps = [None if v is None else v * 1000 for v in ts.to_pylist()]
    if "timestamp_ns" in spec.columns:
        exact = column("timestamp_ns").to_pylist()
        stamps = [e if e is not None else s for e, s in zip(exact, stamps)]
    if "timestamp" in spec.columns:  # timestamp_ns, a BIGINT, always fits
        _check_stamps(stamps)
    new = tuple.__new__
    messages = [new(Message, (0, t, ty, k, v)) for t, ty, k, v in zip(stamps, types, keys, values)]
    return messages, keys


def _check_stamps(stamps: list[int | None]) -> None:
    """Refuse, before anything is appended, a TIMESTAMP outside sej's int64 nanoseconds."""
    bad = next((s for s in stamps if s is not None and not ZERO_TIMESTAMP <= s < 2**63), None)
    if bad is not None:
        when = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=bad // 1000)
        raise WriteError(
            f"a timestamp of {when.isoformat()} cannot be stored: sej keeps nanoseconds since the "
            "epoch in 64 bits, 1677-09-21 to 2262-04-11 UTC"
        )


def group_by_shard(target: Target, messages: list[Message], keys: list[bytes]) -> dict[str, tuple[Path, list[Message]]]:
    """Messages per shard directory: all to the journal, or by sej's key hash in a sharded root."""
    if not messages:
        return {}
    if not target.sharded:
        return {"": (target.path, messages)}
    assert target.bit is not None and target.prefix is not None
    bit = target.bit
    known: dict[bytes, int] = {}  # keys repeat: hash each once
    groups: dict[int, list[Message]] = {}
    for message, key in zip(messages, keys):
        index = known.get(key)
        if index is None:
            index = known[key] = shard_of(key, bit)
        groups.setdefault(index, []).append(message)
    out = {}
    for idx in sorted(groups):
        name = shard_name(target.prefix, target.bit, idx)
        out[name] = (target.path / name, groups[idx])
    return out


class Appender:
    """Shared writers for the shard directories of one target, opened as rows reach them."""

    def __init__(self, target: Target, *, sync: str, segment_size: int) -> None:
        self.target = target
        self.sync = sync
        self.segment_size = segment_size
        self.writers: dict[str, Writer] = {}

    def writer(self, shard: str, path: Path) -> Writer:
        writer = self.writers.get(shard)
        if writer is None:
            writer = self.writers[shard] = Writer(
                path, shared=True, sync=self.sync, segment_size=self.segment_size
            )
        return writer

    def append(self, messages: list[Message], keys: list[bytes]) -> dict[str, list[int]]:
        """Append; returns {shard: [first offset, count]} for what was appended."""
        out: dict[str, list[int]] = {}
        for shard, (path, group) in group_by_shard(self.target, messages, keys).items():
            last = _append(self.writer(shard, path), group)
            out[shard] = [last - len(group) + 1, len(group)]
        return out

    def close(self) -> None:
        errors = []
        for writer in self.writers.values():
            try:
                writer.close()
            except Exception as exc:  # close every writer, then report
                errors.append(exc)
        self.writers.clear()
        if errors:
            raise errors[0]


def _append(writer: Writer, messages: list[Message]) -> int:
    try:
        last = writer.append_many(messages)
    except InvalidMessageError as exc:
        raise WriteError(f"a row cannot be stored as a sej message: {exc}") from None
    assert last is not None
    return last


# -- exactly once ---------------------------------------------------------------------------------


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


def log_name(query_id: str) -> str:
    """A directory name for a query id or write id (hashed when it is not a plain name)."""
    if _SAFE_ID.match(query_id) and ".." not in query_id:
        return query_id
    return "h-" + hashlib.sha256(query_id.encode()).hexdigest()[:32]


def digest(messages: Iterable[Message]) -> str:
    """An order-insensitive digest of messages' type, key and value (not their timestamps, which
    a replay may change)."""
    total, count = 0, 0
    blake = hashlib.blake2b
    for m in messages:
        h = blake(bytes((m.type, len(m.key))), digest_size=8)
        h.update(m.key)
        h.update(m.value)
        total = (total + int.from_bytes(h.digest(), "big")) & 0xFFFFFFFFFFFFFFFF
        count += 1
    return f"{count}:{total:016x}"


class CommitLog:
    """The commit journal of one query (or write id) on one target.

    Beside its ``jnl/``, ``marks/`` says with empty files which tasks' intents on which shards
    (``t-BATCH-PARTITION-SHARD``) and which batches' commits (``c-BATCH``) may have records in
    it. Each mark is on stable storage before the record it stands for is appended, so that a
    task with no mark (the first run of every task) knows without reading the log that it
    appended nothing there, and a batch with no mark that it is not committed: only a task run
    again reads the log, and an import of N tasks no longer reads it N times. A mark without its
    record (a crash in between) only costs a read.
    The marks are a function of the log: ``marks/ready`` says that they cover it; without it (a
    log that an older journalq wrote, marks deleted, a rebuild cut short) they are made again
    from the log, read once.
    """

    SEGMENT_SIZE = 1 << 20
    KEEP_SEGMENTS = 4  # older segments go: a replay only ever needs the last batch's records

    # Whatever the data's policy: an intent that a power cut takes while the append it describes
    # stays would let a replay append it again (the data's own files are synced on close even
    # under "none", but not the entry of a new segment). About half a millisecond a record.
    SYNC = "always"

    def __init__(self, target: Target, query_id: str) -> None:
        self.path = target.commits_dir / log_name(query_id)
        self.marks = self.path / "marks"
        self.query_id = query_id
        # What ``records`` last read: (since_batch, the offset it read up to, the records). The
        # log is only appended to, so a later call reads only what came since: a task that
        # appends to many shards (a writeId import's) reads the log once, not once a shard.
        self._read: tuple[int, int, list[dict]] | None = None
        self._marks_ready = False

    def records(self, since_batch: int) -> list[dict]:
        """The records of batches ``since_batch`` and later, read backward from the end until an
        older batch's commit (a replay concerns the newest batches only; a batch begins after the
        one before committed). An older batch's intent is passed over, not taken for the end: a
        task attempt of that batch left running (a zombie) may write one after newer records.
        Read again, only the records appended since are read, with the same rule."""
        if not (self.path / "jnl").is_dir():
            return []
        high = end_offset(self.path)
        out: list[dict] | None = None
        if self._read is not None and self._read[0] == since_batch and self._read[1] <= high:
            out = self._read_on(since_batch, self._read[1], high, list(self._read[2]))
        if out is None:
            out = self._read_back(since_batch, high)
        self._read = (since_batch, high, out)
        return list(out)

    def task_records(self, batch: int, partition: int, shard: str) -> list[dict]:
        """``records(batch)`` as task ``partition`` of ``batch`` needs them to append to ``shard``:
        none, and the log not read, when neither the task's intents there nor the batch's commit
        are marked (no record of either is in it; the other tasks' intents only bound this task's
        own). Per shard: a run's own intent on one shard does not send it to read the log for
        the next one, yet another run of the task (Spark's speculation) is seen."""
        if self._marked(f"t-{batch}-{partition}-{shard}") or self._marked(f"c-{batch}"):
            return self.records(batch)
        return []

    def _read_back(self, since_batch: int, high: int) -> list[dict]:
        out: list[dict] = []
        bases = segment_bases(self.path)
        first = bases[0] if bases else 0
        window = 256
        while high > first:
            low = max(first, high - window)
            batch = _messages_at(self.path, low, high - low)
            if batch is None:
                break
            done = False
            for index in range(len(batch) - 1, -1, -1):
                record = self._record(batch[index].value, low + index)
                if record.get("b", -1) >= since_batch:
                    out.append(record)
                elif record.get("k") == "commit":
                    done = True
                    break
            if done:
                break
            high, window = low, min(window * 4, 65536)
        out.reverse()
        return out

    def _read_on(self, since_batch: int, low: int, high: int, out: list[dict]) -> list[dict] | None:
        """``out`` (the records read up to ``low``) with those from ``low`` to ``high``, as
        ``_read_back`` would take them; None when they are gone (the log deleted meanwhile)."""
        batch = _messages_at(self.path, low, high - low)
        if batch is None or len(batch) < high - low:
            return None
        for index, message in enumerate(batch):
            record = self._record(message.value, low + index)
            if record.get("b", -1) >= since_batch:
                out.append(record)
            elif record.get("k") == "commit":
                out.clear()  # read backward, reading would stop here
        return out

    def _record(self, value: bytes, offset: int) -> dict:
        try:
            record = json.loads(value)
        except ValueError:  # not UTF-8, or not JSON
            record = None
        if not isinstance(record, dict):
            raise CorruptionError(
                f"the commit log {self.path} is damaged: the record at offset {offset} is not a JSON "
                "object (written by something other than journalq's Spark sink?)"
            )
        return record

    def append(self, kind: int, record: dict) -> None:
        mark = _mark_of(record)
        if mark is not None:
            self._mark(mark)  # before the record: a record is never there without its mark
        with Writer(self.path, shared=True, sync=self.SYNC, segment_size=self.SEGMENT_SIZE) as writer:
            writer.append(json.dumps(record, separators=(",", ":")).encode(), type=kind)
        if kind == COMMIT:
            self._trim(record["b"])

    def _trim(self, batch: int) -> None:
        for segment in list_segments(self.path)[: -self.KEEP_SEGMENTS]:
            remove_segment(segment)
        try:
            names = os.listdir(self.marks)
        except FileNotFoundError:
            return
        committed = {name[2:] for name in names if name.startswith("c-")}
        oldest = self._oldest_batch()
        for name in names:
            kind, _, rest = name.partition("-")
            number = rest.partition("-")[0]
            if not number.isdigit():
                continue
            # A committed batch's tasks are sent to the log by its commit's mark; a commit the log
            # no longer holds (its segments trimmed) would not be found there either.
            if (kind == "t" and int(number) <= batch and number in committed) or (
                kind == "c" and oldest is not None and int(number) < oldest
            ):
                (self.marks / name).unlink(missing_ok=True)

    def _oldest_batch(self) -> int | None:
        """The batch of the oldest record the log holds (None when it cannot say)."""
        found = _messages_at(self.path, first_offset(self.path), 1)
        if not found:
            return None
        batch = self._record(found[0].value, found[0].offset).get("b")
        return batch if isinstance(batch, int) else None

    def _mark(self, name: str) -> None:
        """Make the mark ``name``, its directory entry on stable storage when this returns."""
        self._ready_marks()
        _touch(self.marks / name)
        fsync_dir(self.marks)  # also when it was there: made by a run killed before its sync

    def _marked(self, name: str) -> bool:
        """Whether the mark ``name`` is there (never, in a log with no records yet)."""
        if not (self.path / "jnl").is_dir():
            return False
        self._ready_marks()
        return os.path.exists(self.marks / name)

    def _ready_marks(self) -> None:
        """Make the marks cover the log, from the log itself when ``marks/ready`` is missing."""
        if self._marks_ready:
            return
        ready = self.marks / "ready"
        if not ready.exists():
            make_dirs(self.marks, durable=True)
            # Records appended meanwhile are marked by their writers: reading to the end now
            # covers the others.
            names = {_mark_of(self._record(m.value, m.offset)) for m in _all_messages(self.path)}
            for name in names - {None}:
                _touch(self.marks / name)
            fsync_dir(self.marks)  # the marks, then the word that they are all there
            _touch(ready)
            fsync_dir(self.marks)
        self._marks_ready = True

    def committed(self, batch: int, records: list[dict] | None = None) -> bool:
        if records is None:
            if not self._marked(f"c-{batch}"):
                return False  # a commit's record is never there without its mark
            records = self.records(batch)
        return any(r.get("k") == "commit" and r.get("b") == batch for r in records)


def _mark_of(record: dict) -> str | None:
    """The name of the mark that stands for a record of the commit log (None: no mark)."""
    if record.get("k") == "intent":
        return f"t-{record['b']}-{record['p']}-{record.get('s', '')}"
    if record.get("k") == "commit":
        return f"c-{record['b']}"
    return None


def _touch(file: Path) -> None:
    os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _all_messages(path: Path) -> Iterator[Message]:
    """Every message of the journal at ``path``, from the oldest still stored (from the oldest
    again when a trim deletes what was to be read next)."""
    if not (path / "jnl").is_dir():
        return
    while True:
        try:
            with Scanner(path) as scanner:
                yield from scanner
            return
        except OffsetOutOfRangeError:
            continue


def _messages_at(path: Path, start: int, n: int) -> list[Message] | None:
    """Up to ``n`` messages from ``start`` (fewer where the journal ends); None when retention
    deleted them."""
    n = min(n, end_offset(path) - start)
    if n <= 0:
        return []
    found: list[Message] = []
    try:
        with Scanner(path, start) as scanner:
            while len(found) < n and (chunk := scanner.read_batch(n - len(found))):
                found.extend(chunk)
    except OffsetOutOfRangeError:
        return None
    return found


def _not_appended_yet(
    path: Path, records: list[dict], task: tuple[int, int, str], shard: str, group: list[Message]
) -> list[Message]:
    """The messages of ``group`` that earlier runs of ``task`` (batch, partition, the digest of
    ``group``) did not append to ``shard``.

    A run records its intent (where its append starts, how many, the digest of the task's rows)
    under the shard's writer lock, right before the append. A run killed part way through its
    append left a prefix of it (whole messages: recovery cuts a torn one); the next intent
    recorded on the shard starts where that prefix ends, so it bounds what the run can have
    appended (and tells a run that appended nothing from another task's identical rows).
    """
    on_shard = [r for r in records if r.get("k") == "intent" and r.get("s") == shard]
    wanted = Counter((m.type, m.key, m.value) for m in group)
    appended: Counter[tuple[int, bytes, bytes]] = Counter()
    for i, r in enumerate(on_shard):
        if (r.get("b"), r.get("p"), r.get("d")) != task:
            continue
        start = r["e"]
        n = min([r["n"], *(x["e"] - start for x in on_shard[i + 1 :] if x["e"] >= start)])
        found = _messages_at(path, start, n)
        if found is None:
            # Retention deleted them since: they were written (nothing at that offset can be
            # older than the intent).
            return []
        for m in found:
            content = (m.type, m.key, m.value)
            if appended[content] == wanted[content]:
                break  # past this run's messages
            appended[content] += 1
    # A run appends in order: of rows alike, the first ones are those appended (so a replay in
    # the same order appends exactly the rest, in its order; one in another order, the same rows).
    rest = []
    for m in group:
        content = (m.type, m.key, m.value)
        if appended[content]:
            appended[content] -= 1
        else:
            rest.append(m)
    return rest


@dataclass
class TaskResult:
    """What a task appended: its ids, and {shard: [first offset, count]} (or skipped)."""

    query_id: str | None
    batch_id: int | None
    partition: int
    appended: dict = field(default_factory=dict)
    skipped: bool = False
    rows: int = 0


def append_exactly_once(
    appender: Appender,
    log: CommitLog,
    batch_id: int,
    partition: int,
    messages: list[Message],
    keys: list[bytes],
) -> TaskResult:
    """Append a task's rows once for (query, batch, partition), whatever Spark replays."""
    result = TaskResult(log.query_id, batch_id, partition, rows=len(messages))
    if log.committed(batch_id):
        result.skipped = True
        return result
    for shard, (path, group) in group_by_shard(appender.target, messages, keys).items():
        expected = digest(group)
        writer = appender.writer(shard, path)
        with writer.hold():  # no other writer appends to this shard until the intent is kept
            records = log.task_records(batch_id, partition, shard)
            if log.committed(batch_id, records):
                result.skipped = True
                return result
            rest = _not_appended_yet(path, records, (batch_id, partition, expected), shard, group)
            if not rest:
                continue
            start = writer.next_offset
            # "d" identifies the task's rows (all of them); "n" counts what this append adds.
            log.append(INTENT, {"k": "intent", "b": batch_id, "p": partition, "s": shard, "e": start,
                                "n": len(rest), "d": expected})
            crash_point("after-intent", batch_id)
            _append(writer, rest)
        result.appended[shard] = [start, len(rest)]
        crash_point("task-after-write", batch_id)
    return result


def commit_batch(log: CommitLog, batch_id: int, results: list[TaskResult]) -> None:
    """Record that a batch is complete (the driver, once every task succeeded)."""
    if not log.committed(batch_id):
        shards: dict[str, int] = {}
        for r in results:
            for shard, (_, count) in r.appended.items():
                shards[shard] = shards.get(shard, 0) + count
        log.append(COMMIT, {"k": "commit", "b": batch_id, "rows": sum(r.rows for r in results),
                            "shards": shards, "t": time.time()})
    crash_point("sink-commit", batch_id)


# -- test hook ------------------------------------------------------------------------------------


def crash_point(name: str, batch_id: int | None) -> None:
    """Tests set ``JOURNALQ_SPARK_TEST_CRASH=NAME:BATCH`` (e.g. ``sink-commit:1``) to kill the Spark
    driver (the JVM this Python worker descends from) with SIGKILL at that point, once: the
    marker file ``$JOURNALQ_SPARK_TEST_CRASH_ONCE`` keeps a restarted query from crashing again."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or wanted != f"{name}:{batch_id}":
        return
    once = os.environ.get(CRASH_ENV + "_ONCE")
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.close(fd)
        except FileExistsError:
            return
    pid = _driver_jvm()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        os._exit(137)  # this worker goes down with its driver (and lets go of inherited pipes)


def _driver_jvm() -> int | None:
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return None
        if b"java" in cmdline.split(b"\0")[0] and b"SparkSubmit" in cmdline:
            return pid
        pid = parent
    return None


def iter_batches(iterator: Iterator) -> Iterator:
    """Arrow record batches from what Spark hands a writer (batches, or rows on old versions)."""
    import pyarrow as pa

    rows = []
    for item in iterator:
        if isinstance(item, pa.RecordBatch):
            yield item
        else:
            rows.append(item.asDict() if hasattr(item, "asDict") else dict(item))
            if len(rows) >= 10_000:
                yield pa.RecordBatch.from_pylist(rows)
                rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows)
