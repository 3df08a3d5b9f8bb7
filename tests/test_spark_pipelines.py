"""The pipelines end to end on generated data, on a real local Spark session: archive (resumable,
exactly once, leftovers of a dead run cleaned up), aggregate (event-time windows to a topic and to
Parquet, exactly once across runs), import (JSON lines, CSV, Parquet; once per set of files; file
names taken literally); and, without a session, the archive's syncs and waiting for queries."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Message, Scanner, Writer  # noqa: E402
from journalq.journal.offsets import read_offset  # noqa: E402
from journalq.queue import Broker  # noqa: E402
from journalq.spark import pipelines  # noqa: E402
from journalq.spark.testing import local_session  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")

DAY = 86_400_000_000_000
T0 = 1_714_521_600_000_000_000  # 2024-05-01T00:00:00Z


@pytest.fixture(scope="module")
def spark():
    return local_session()


def messages(path: Path) -> list[Message]:
    with Scanner(path) as scanner:
        return list(scanner)


# -- archive ----------------------------------------------------------------------------------


def fill_topic(data: Path, start: int, count: int) -> None:
    """Plain messages spread over three days, then a few queue envelopes (sent now)."""
    with Broker(data, sync="none") as broker:
        topic = broker.topic("events")
        with Writer(topic.path, shared=True) as w:
            w.append_many([Message(timestamp_ns=T0 + (i % 3) * DAY + i, value=b"event %d" % i)
                           for i in range(start, start + count)])
        topic.send(b"envelope %d" % start, attributes={"origin": "test"})


def archived(spark, out: Path) -> list:
    return spark.read.parquet(str(out)).orderBy("offset").collect()


def test_archive_is_resumable_and_exactly_once(spark, tmp_path):
    data, out = tmp_path / "data", tmp_path / "archive"
    fill_topic(data, 0, 300)
    first = pipelines.archive(spark, str(out), data=str(data), topic="events")
    assert (first.start, first.end, first.messages) == (0, 301, 301)
    assert read_offset(data / "events", "spark-archive") == 301
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    assert set(first.dates) == {"2024-05-01", "2024-05-02", "2024-05-03", today}
    rows = archived(spark, out)
    assert [r.offset for r in rows] == list(range(301))
    assert [bytes(r.value) for r in rows[:300]] == [b"event %d" % i for i in range(300)]
    assert str(rows[4].date) == "2024-05-02" and rows[4].timestamp_ns == T0 + DAY + 4
    assert rows[0].body is None and bytes(rows[300].body) == b"envelope 0"
    assert rows[300].attributes == {"origin": "test"}

    again = pipelines.archive(spark, str(out), data=str(data), topic="events")
    assert again.messages == 0 and again.files == 0

    # A run that died after moving files into place but before committing its offset left files
    # whose range starts at the committed offset: the next run removes them, then redoes them.
    fill_topic(data, 301, 99)
    leftover_dir = out / "date=2024-05-01"
    real = next(leftover_dir.glob("jq-*.parquet"))
    shutil.copyfile(real, leftover_dir / f"jq-{301:020d}-{350:020d}-part-dead.parquet")
    third = pipelines.archive(spark, str(out), data=str(data), topic="events")
    assert third.removed_leftovers == 1 and (third.start, third.end) == (301, 401)
    rows = archived(spark, out)
    assert [r.offset for r in rows] == list(range(401))
    assert not (out / pipelines.STAGING).exists()


def test_archive_refuses_lost_messages_unless_asked(spark, tmp_path):
    path, out = tmp_path / "j", tmp_path / "archive"
    with Writer(path, segment_size=1024) as w:
        w.append_many([Message(timestamp_ns=T0, value=b"x" * 60)] * 100)
    first = sorted((path / "jnl").glob("*.jnl"))[0]
    first.unlink()
    with pytest.raises(Exception, match="deleted before they were archived"):
        pipelines.archive(spark, str(out), journal=str(path))
    result = pipelines.archive(spark, str(out), journal=str(path), fail_on_data_loss=False)
    assert result.end == 100 and result.start > 0
    assert spark.read.parquet(str(out)).count() == 100 - result.start


# -- aggregate --------------------------------------------------------------------------------


def events(start_minute: int, minutes: int) -> list[dict]:
    out = []
    for m in range(start_minute, start_minute + minutes):
        for s in range(0, 60, 7):
            t = T0 // 1_000_000_000 + 600 + m * 60 + s
            key = "abc"[(m + s) % 3]
            out.append(
                {"time": dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(), "user": key, "amount": s + m}
            )
    return out


def expected_windows(all_events: list[dict], watermark_s: int) -> dict[tuple[str, str], dict]:
    latest = max(dt.datetime.fromisoformat(e["time"]) for e in all_events)
    horizon = latest - dt.timedelta(seconds=watermark_s)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in all_events:
        t = dt.datetime.fromisoformat(e["time"])
        start = t.replace(second=0)
        if start + dt.timedelta(minutes=1) <= horizon:
            groups[(start.strftime("%Y-%m-%dT%H:%M:%S.000Z"), e["user"])].append(float(e["amount"]))
    return {k: {"count": len(v), "sum": sum(v), "min": min(v), "max": max(v)} for k, v in groups.items()}


def test_aggregate_to_topic_and_parquet_exactly_once(spark, tmp_path):
    data = tmp_path / "data"
    settings = pipelines.AggregateSettings(
        parquet=str(tmp_path / "stats"), checkpoint=str(tmp_path / "checkpoint"), data=str(data),
        topic="events", output_topic="stats", window="1 minute", watermark="90 seconds",
        key_field="user", value_field="amount", available_now=True,
    )
    sent: list[dict] = []
    with Broker(data, sync="none") as broker:
        topic = broker.topic("events")
        batch = events(0, 6)
        sent += batch
        topic.send_many([json.dumps(e).encode() for e in batch])
    pipelines.aggregate(spark, settings)
    with Broker(data, sync="none") as broker:
        batch = events(6, 5)
        sent += batch
        broker.topic("events").send_many(
            [{"body": json.dumps(e).encode(), "attributes": {"n": i}} for i, e in enumerate(batch)]
        )
    pipelines.aggregate(spark, settings)  # resumes from its checkpoints

    expected = expected_windows(sent, 90)
    from_topic = [json.loads(m.value) for m in messages(data / "stats")]
    keyed = {(r["window_start"], r["key"]): r for r in from_topic if r["key"]}
    assert len(keyed) == len([r for r in from_topic if r["key"]])  # none twice
    assert {k: {f: keyed[k][f] for f in ("count", "sum", "min", "max")} for k in keyed} == expected
    assert all(m.key == r["key"].encode() for m, r in zip(messages(data / "stats"), from_topic))

    parquet = spark.read.parquet(str(tmp_path / "stats")).where("key != ''").collect()
    from_parquet = {
        (r.window_start.replace(tzinfo=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
         if r.window_start.tzinfo is None
         else r.window_start.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z"), r.key):
        {"count": r["count"], "sum": r["sum"], "min": r["min"], "max": r["max"]}
        for r in parquet
    }
    assert len(parquet) == len(from_parquet) == len(expected)
    assert {str(r.date) for r in parquet} == {"2024-05-01"}


# -- import -----------------------------------------------------------------------------------


def test_import_jsonl_csv_parquet_once(spark, tmp_path):
    data = tmp_path / "data"
    inputs = tmp_path / "in"
    inputs.mkdir()
    lines = [json.dumps({"id": i, "user": f"u{i % 4}", "ts": f"2024-05-01T00:00:{i:02d}Z"}) for i in range(40)]
    (inputs / "a.jsonl").write_text("\n".join(lines[:25]) + "\n\n")
    (inputs / "b.jsonl").write_text("\n".join(lines[25:]) + "\n")
    result = pipelines.import_files(spark, [str(inputs)], "jsonl", data=str(data), topic="imported",
                                    key_field="user", timestamp_field="ts")
    assert (result.files, result.messages, result.skipped) == (2, 40, False)
    got = messages(data / "imported")
    assert sorted(m.value.decode() for m in got) == sorted(lines)  # each line, byte for byte
    for m in got:
        record = json.loads(m.value)
        assert m.key == record["user"].encode()
        assert m.timestamp_ns == T0 + record["id"] * 1_000_000_000
    again = pipelines.import_files(spark, [str(inputs / "*.jsonl")], "jsonl", data=str(data), topic="imported",
                                   key_field="user", timestamp_field="ts")
    assert again.skipped and len(messages(data / "imported")) == 40

    csv = tmp_path / "rows.csv"
    csv.write_text("id,name,when\n" + "".join(f"{i},n{i},{1714521600 + i}\n" for i in range(10)))
    result = pipelines.import_files(spark, [str(csv)], "csv", data=str(data), topic="rows",
                                    key_field="name", timestamp_field="when", infer_schema=True)
    rows = messages(data / "rows")
    assert result.messages == 10 and len(rows) == 10
    assert sorted(json.loads(m.value)["id"] for m in rows) == list(range(10))
    assert {m.timestamp_ns for m in rows} == {T0 + i * 1_000_000_000 for i in range(10)}

    parquet = tmp_path / "pq"
    spark.range(30).selectExpr("id", "cast(id % 3 as string) as part").write.parquet(str(parquet))
    result = pipelines.import_files(spark, [str(parquet)], "parquet", journal=str(tmp_path / "plain"))
    assert result.messages == 30
    assert sorted(json.loads(m.value)["id"] for m in messages(tmp_path / "plain")) == list(range(30))
    forced = pipelines.import_files(spark, [str(parquet)], "parquet", journal=str(tmp_path / "plain"), force=True)
    assert forced.messages == 30 and len(messages(tmp_path / "plain")) == 60

    with pytest.raises(pipelines.PipelineError, match="no column 'nope'"):
        pipelines.import_files(spark, [str(parquet)], "parquet", journal=str(tmp_path / "x"), key_field="nope")
    with pytest.raises(pipelines.PipelineError, match="does not exist"):
        pipelines.import_files(spark, [str(tmp_path / "missing.csv")], "csv", journal=str(tmp_path / "x"))


# -- archive syncs before its offset commits; waiting for several queries (no Spark session) -------


def test_archived_files_are_synced_before_the_offset_commits(tmp_path: Path, monkeypatch) -> None:
    # Spark's local file writes are not fsynced: the archiver committed its reader offset while
    # the Parquet files' data (and a new date directory's entry in the output) could still be
    # lost in a power cut, losing those messages from the archive for good.
    from journalq.spark import pipelines

    staging, out = tmp_path / "out" / "_staging" / "run", tmp_path / "out"
    (staging / "date=2026-01-02").mkdir(parents=True)
    (staging / "date=2026-01-02" / "part-0.parquet").write_bytes(b"data")
    (staging / "date=2026-01-02" / ".part-0.parquet.crc").write_bytes(b"crc")
    from conftest import synced_paths

    synced = synced_paths(monkeypatch)
    moved, dates = pipelines._move_into_place(staging, out, "jq-1-2-")
    assert (moved, dates) == (1, ["2026-01-02"])
    placed = out / "date=2026-01-02" / "jq-1-2-part-0.parquet"
    assert placed.read_bytes() == b"data"
    assert str(placed) in synced or str(staging / "date=2026-01-02" / "part-0.parquet") in synced
    assert str(out) in synced  # the new date directory's entry
    assert str(out / "date=2026-01-02") in synced


class _Failed(Exception):
    pass


class _Query:
    """A streaming query's waiting methods: ``runs_forever`` (a processing-time trigger), or
    failed with ``error``."""

    def __init__(self, *, runs_forever: bool = False, error: Exception | None = None) -> None:
        self.runs_forever, self.error, self.stopped = runs_forever, error, False

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        if self.error is not None:
            raise self.error
        if self.runs_forever and not self.stopped:
            if timeout is None:
                raise AssertionError("waited without end on a running query")
            return False
        return True if timeout is not None else None

    def stop(self) -> None:
        self.stopped = True


def test_wait_for_sees_the_second_query_fail_while_the_first_runs() -> None:
    # wait_for waited on the first query (which never ends under a processing-time trigger)
    # before looking at the second: aggregate hung with its Parquet query dead.
    from journalq.spark.pipelines import wait_for

    running, failed = _Query(runs_forever=True), _Query(error=_Failed("parquet sink failed"))
    with pytest.raises(_Failed, match="parquet sink failed"):
        wait_for(None, [running, failed])
    assert running.stopped


def test_wait_for_returns_when_every_query_ended() -> None:
    from journalq.spark.pipelines import wait_for

    queries = [_Query(), _Query()]
    wait_for(None, queries)
    assert not any(q.stopped for q in queries)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_import_takes_file_names_literally_not_as_globs(tmp_path: Path, fmt: str) -> None:
    # Spark expanded "x[1].jsonl" as a Hadoop glob, which matches x1.jsonl: that file was
    # imported twice and x[1].jsonl never.
    spark = local_session()
    inputs = tmp_path / "in"
    inputs.mkdir()
    if fmt == "jsonl":
        (inputs / "x[1].jsonl").write_text('{"n": "bracket"}\n')
        (inputs / "x1.jsonl").write_text('{"n": "plain"}\n')
    else:
        (inputs / "x[1].csv").write_text("n\nbracket\n")
        (inputs / "x1.csv").write_text("n\nplain\n")
    result = pipelines.import_files(spark, [str(inputs)], fmt, journal=str(tmp_path / "j"))
    with Scanner(tmp_path / "j") as scanner:
        values = sorted(m.value for m in scanner)
    assert (result.files, result.messages) == (2, 2)
    bracket, plain = (b'{"n":"bracket"}', b'{"n":"plain"}') if fmt == "csv" else (
        b'{"n": "bracket"}', b'{"n": "plain"}')
    assert values == [bracket, plain]
