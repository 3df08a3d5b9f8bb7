"""``journalq queue ...``: work queues from the command line.

Most tests run the click command in-process (``CliRunner``); the error cases also run the installed
``journalq`` script in a subprocess, since what matters there is exactly what a person sees.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_queue_lookahead import DAMAGED_AT, damaged_topic

from journalq.cli.main import cli
from journalq.journal.inspect import check
from journalq.queue import Broker

_SCRIPT = Path(sys.executable).parent / "journalq"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "journalq.cli.main"]


# -- helpers ----------------------------------------------------------------------------------


def run(data: Path, *args: object, input: bytes | str | None = None) -> Result:
    """``journalq queue ARGS --data DATA --sync none`` in-process; unexpected exceptions propagate."""
    argv = ["queue", *map(str, args), "--data", str(data)]
    if "--sync" not in argv:
        argv += ["--sync", "none"]
    return CliRunner().invoke(cli, argv, input=input, catch_exceptions=False)


def ok(data: Path, *args: object, input: bytes | str | None = None) -> list[dict]:
    """The JSON lines of a command that must succeed."""
    result = run(data, *args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return [json.loads(line) for line in result.stdout.splitlines()]


def fails(data: Path, *args: object, needle: str = "", code: int | None = None) -> str:
    """A command that must fail with one ``journalq: error:`` line; returns it."""
    result = run(data, *args)
    assert result.exit_code != 0 if code is None else result.exit_code == code, result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("journalq: error: "), result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


def run_process(data: Path, *args: object, input: bytes | None = None) -> subprocess.CompletedProcess:
    argv = [*COMMAND, "queue", *map(str, args), "--data", str(data), "--sync", "none"]
    return subprocess.run(argv, input=input, capture_output=True, timeout=30, check=False)


def receive(data: Path, queue: str, *args: object) -> list[dict]:
    return ok(data, "receive", queue, *args)


@pytest.fixture
def data(store_root: Path | str) -> Path | str:
    return store_root


# -- send, receive, delete --------------------------------------------------------------------


def test_send_receive_delete_round_trip(data: Path) -> None:
    [sent] = ok(data, "send", "jobs", "resize 1.jpg", "--attribute", "size=1024", "--attribute", "kind=a=b",
                "--metadata", '{"owner": "ann"}', "--group-id", "g1")
    assert set(sent) == {"id"}
    [got] = receive(data, "jobs")
    assert got["id"] == sent["id"]
    assert got["body"] == "resize 1.jpg"
    assert got["attributes"] == {"size": {"type": "String", "value": "1024"},
                                 "kind": {"type": "String", "value": "a=b"}}
    assert got["receive_count"] == 1
    assert got["group_id"] == "g1" and got["metadata"] == {"owner": "ann"}
    assert abs(got["sent_at_ns"] / 1e9 - time.time()) < 60
    assert got["sent_at"].endswith("Z") and got["sent_at"][:19] == time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.gmtime(got["sent_at_ns"] // 10**9))
    [task] = ok(data, "task", "jobs", got["id"])
    assert task["state"] == "claimed" and task["metadata"] == {"owner": "ann"} and task["consumer"]

    assert ok(data, "delete", "jobs", got["receipt"]) == [{"receipt": got["receipt"], "deleted": True}]
    assert receive(data, "jobs") == []
    assert ok(data, "task", "jobs", got["id"])[0]["state"] == "finished"
    # The receipt is spent: deleting again is an error, reported per receipt and as one line.
    result = run(data, "delete", "jobs", got["receipt"])
    assert result.exit_code == 1 and json.loads(result.stdout)["deleted"] is False
    assert result.stderr.startswith("journalq: error: 1 of 1 not deleted: receipt ")


def test_send_one_message_per_stdin_line_and_bodies_that_are_not_text(data: Path) -> None:
    sent = ok(data, "send", "lines", input=b"one\ntwo\n\xff\xfe\nthree")
    got = receive(data, "lines", "-n", 10)
    assert [m.get("body") for m in got] == ["one", "two", None, "three"]
    assert [m["id"] for m in got] == [s["id"] for s in sent]
    assert base64.b64decode(got[2]["body_b64"]) == b"\xff\xfe"
    assert ok(data, "send", "lines", input=b"") == []


def test_send_a_whole_file_or_standard_input_as_one_binary_message(data: Path, tmp_path: Path) -> None:
    blob = bytes(range(256)) + b"\nsecond line\n"  # newlines and every byte: one message
    (tmp_path / "blob").write_bytes(blob)
    [from_file] = ok(data, "send", "blobs", "--file", tmp_path / "blob")
    [from_stdin] = ok(data, "send", "blobs", "--file", "-", input=blob)
    got = receive(data, "blobs", "-n", 10)
    assert [m["id"] for m in got] == [from_file["id"], from_stdin["id"]]
    assert [base64.b64decode(m["body_b64"]) for m in got] == [blob, blob]
    fails(data, "send", "blobs", "body", "--file", tmp_path / "blob", needle="not both", code=1)
    fails(data, "send", "blobs", "--file", tmp_path / "missing", needle="missing", code=2)


def test_receive_delete_flag_and_filters_on_send(data: Path) -> None:
    ok(data, "send", "jobs", "a")
    ok(data, "send", "jobs", "b", "--filter", "region=eu")
    [got] = receive(data, "jobs", "-n", 10, "--delete", "--filter", "region=us")
    assert got["body"] == "a" and got["filters"] == {}
    [got] = receive(data, "jobs", "-n", 10, "--delete", "--filter", "region=eu")
    assert got["body"] == "b" and got["filters"] == {"region": "eu"}
    [stats] = ok(data, "stats", "jobs")
    assert (stats["available"], stats["in_flight"]) == (0, 0)


def test_dedup_id_and_delay(data: Path) -> None:
    first = ok(data, "send", "jobs", "x", "--dedup-id", "d1")
    assert ok(data, "send", "jobs", "x", "--dedup-id", "d1") == first
    ok(data, "send", "jobs", "later", "--delay", "60")
    [stats] = ok(data, "stats", "jobs")
    assert (stats["available"], stats["delayed"]) == (1, 1)


def test_visibility_timeout_brings_a_message_back(data: Path) -> None:
    ok(data, "send", "jobs", "work")
    [first] = receive(data, "jobs", "--visibility-timeout", 0.5)
    assert first["receive_count"] == 1
    assert receive(data, "jobs") == []  # hidden
    time.sleep(0.6)
    [second] = receive(data, "jobs", "--visibility-timeout", 30)
    assert second["id"] == first["id"] and second["receive_count"] == 2
    assert second["receipt"] != first["receipt"]
    fails(data, "delete", "jobs", first["receipt"], needle="delivered again")


def test_release_and_change_visibility(data: Path) -> None:
    ok(data, "send", "jobs", "work")
    [got] = receive(data, "jobs")
    assert ok(data, "release", "jobs", got["receipt"]) == [{"receipt": got["receipt"], "released": True, "delay": 0.0}]
    [again] = receive(data, "jobs")
    assert again["receive_count"] == 2
    assert ok(data, "change-visibility", "jobs", again["receipt"], 0) == [
        {"receipt": again["receipt"], "visibility_timeout": 0.0}
    ]
    [third] = receive(data, "jobs", "--visibility-timeout", 60)
    assert third["receive_count"] == 3
    fails(data, "release", "jobs", again["receipt"], needle="delivered again")
    fails(
        data, "change-visibility", "jobs", third["receipt"], 50000,
        needle="visibility timeout is 50000.0; it must be from 0 to 43200",
    )
    fails(data, "release", "jobs", "not-a-receipt", needle="not a receipt")


def test_wait_returns_when_nothing_comes(data: Path) -> None:
    ok(data, "create", "jobs")
    started = time.monotonic()
    assert receive(data, "jobs", "--wait", 0.3) == []
    assert 0.25 <= time.monotonic() - started < 5


# -- queues -----------------------------------------------------------------------------------


def test_stats_counts_and_purge(data: Path) -> None:
    ok(data, "send", "a", input="1\n2\n3\n4\n")
    ok(data, "send", "a", "later", "--delay", "600")
    ok(data, "create", "b")
    receive(data, "a", "-n", 1, "--visibility-timeout", 60)
    rows = ok(data, "stats")
    assert [r["name"] for r in rows] == ["a", "b"]
    a, b = rows
    assert set(a) == {"name", "available", "in_flight", "delayed", "dead", "oldest_age", "damage"}
    assert a["damage"] is None and b["damage"] is None
    assert (a["available"], a["in_flight"], a["delayed"], a["dead"]) == (3, 1, 1, 0)
    assert isinstance(a["oldest_age"], float) and 0 <= a["oldest_age"] < 60
    assert (b["available"], b["in_flight"], b["oldest_age"]) == (0, 0, None)
    assert ok(data, "stats", "b") == [b]

    table = run(data, "stats", "--format", "table")
    assert table.exit_code == 0
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["name", "available", "in_flight", "delayed", "dead", "oldest_age"]
    assert lines[1].split() == ["b", "0", "0", "0", "0", "-"]

    assert ok(data, "purge", "a") == [{"name": "a", "purged": True}]
    [a] = ok(data, "stats", "a")
    assert (a["available"], a["in_flight"], a["delayed"]) == (0, 0, 0)
    assert receive(data, "a", "-n", 10) == []


def test_create_list_and_delete_queue(data: Path) -> None:
    [created] = ok(data, "create", "jobs", "--visibility-timeout", 5, "--delay", 1, "--retention-seconds", "none",
                   "--fifo", "--content-based-dedup", "--enum", "size=s,m,l")
    assert created["name"] == "jobs" and created["created"] is True
    settings = created["settings"]
    assert settings["visibility_timeout"] == 5 and settings["delay"] == 1 and settings["retention_seconds"] is None
    assert settings["fifo"] is True and settings["content_based_dedup"] is True
    assert settings["enums"] == {"size": ["s", "m", "l"]}
    # The same again changes nothing; other settings are refused.
    assert ok(data, "create", "jobs", "--visibility-timeout", 5)[0]["created"] is False
    fails(data, "create", "jobs", "--visibility-timeout", 6, needle="visibility_timeout is 5.0, not 6.0")

    ok(data, "create", "other")
    assert ok(data, "list") == [{"name": "jobs"}, {"name": "other"}]
    assert ok(data, "delete-queue", "jobs") == [{"name": "jobs", "deleted": True}]
    assert ok(data, "list") == [{"name": "other"}]
    fails(data, "delete-queue", "jobs", needle="no queue 'jobs'")


def test_a_fifo_queue_naming_a_missing_dead_letter_queue_is_refused_in_words_every_caller_knows(data: Path) -> None:
    """The refusal said "make it first, with fifo=True": the library's spelling, which neither
    --fifo (here) nor SQS's FifoQueue is (SQS's own check answers first, in AWS's words)."""
    ok(data, "create", "other")
    line = fails(data, "create", "jobs", "--fifo", "--dead-letter-queue", "missing", "--max-receive-count", 3,
                 needle="'missing' does not exist")
    assert line.endswith("make it first, as a FIFO queue")
    assert ok(data, "list") == [{"name": "other"}]


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` where nothing can be written: its directories made read-only by chmod (not as
    root, whom chmod does not stop) or, as root, a read-only bind mount of it; skips when
    neither can be had."""
    if os.geteuid() != 0:
        directories = [path, *(p for p in path.rglob("*") if p.is_dir())]
        for directory in directories:
            directory.chmod(0o555)
        try:
            yield path
        finally:
            for directory in directories:
                directory.chmod(0o755)
        return
    view = path.parent / "read-only"
    view.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(view)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"as root, chmod does not stop writes, and no read-only bind mount here ({done.stderr.strip()})")
    try:
        yield view
    finally:
        subprocess.run(["umount", "--lazy", str(view)], check=False)  # lazy: a file left open cannot keep it mounted


@pytest.mark.files_only("a read-only data directory")
def test_a_read_only_data_directory_is_listed_and_stats_says_it_must_write(data: Path) -> None:
    ok(data, "create", "jobs")
    ok(data, "create", "wide", "--shards", 2)
    ok(data, "send", "jobs", "x")
    receive(data, "jobs")
    with read_only(data) as view:
        # It failed on the lock file, jnl.lck, which it opened for writing.
        assert ok(view, "list") == [{"name": "jobs"}, {"name": "wide"}]
        for names in (["jobs"], []):
            line = fails(view, "stats", *names, needle=f"queue stats must write in {view / 'jobs'}")
            assert "jnl.lck" in line
    [jobs] = ok(data, "stats", "jobs")
    assert (jobs["available"], jobs["in_flight"]) == (0, 1)


def test_the_data_directory_comes_from_the_environment(tmp_path: Path) -> None:
    data = tmp_path / "from-env"
    result = CliRunner(env={"JOURNALQ_DATA": str(data)}).invoke(cli, ["queue", "send", "jobs", "x"])
    assert result.exit_code == 0, result.stderr
    assert Broker(data).names() == ["jobs"]


def test_dead_letters_and_redrive(data: Path) -> None:
    ok(data, "create", "jobs", "--max-receive-count", 2, "--dead-letter-queue", "jobs-dlq")
    assert ok(data, "list") == [{"name": "jobs"}, {"name": "jobs-dlq"}]  # the DLQ is made too
    ok(data, "send", "jobs", input="poison 1\npoison 2\npoison 3\n")
    for count in (1, 2):
        got = receive(data, "jobs", "-n", 10, "--visibility-timeout", 0)
        assert [m["receive_count"] for m in got] == [count] * 3
    assert receive(data, "jobs", "-n", 10) == []  # a third delivery would be one too many
    jobs, dlq = ok(data, "stats", "jobs", "jobs-dlq")
    assert (jobs["dead"], jobs["available"], dlq["available"]) == (3, 0, 3)
    [dead] = receive(data, "jobs-dlq", "--visibility-timeout", 0)
    assert dead["body"] == "poison 1"
    assert dead["source"]["queue"] == "jobs" and dead["source"]["count"] == 2

    assert ok(data, "redrive", "jobs-dlq", "--max", 1) == [{"name": "jobs-dlq", "to": None, "moved": 1}]
    [back] = receive(data, "jobs", "-n", 10)
    assert back["body"] == "poison 1" and back["receive_count"] == 1

    ok(data, "create", "elsewhere")
    assert ok(data, "redrive", "jobs-dlq", "--to", "elsewhere") == [{"name": "jobs-dlq", "to": "elsewhere", "moved": 2}]
    assert [m["body"] for m in receive(data, "elsewhere", "-n", 10)] == ["poison 2", "poison 3"]
    assert ok(data, "redrive", "jobs-dlq")[0]["moved"] == 0
    fails(data, "redrive", "jobs-dlq", "--to", "missing", needle="no queue 'missing'")
    fails(data, "redrive", "jobs-dlq", "--to", "jobs-dlq", needle="dead-letter queue itself")


def test_filters_at_least(data: Path) -> None:
    ok(data, "create", "gpu", "--enum", "perf=low,standard,high")
    ok(data, "send", "gpu", "needs standard", "--filter", "perf=standard")
    ok(data, "send", "gpu", "needs high", "--filter", "perf=high")
    ok(data, "send", "gpu", "needs nothing")
    fails(data, "send", "gpu", "bad", "--filter", "perf=extreme", needle="not one of")

    got = receive(data, "gpu", "-n", 10, "--filter", "perf=standard:at_least", "--delete")
    assert [m["body"] for m in got] == ["needs standard", "needs nothing"]
    assert receive(data, "gpu", "-n", 10, "--filter", "perf=standard") == []  # absolute: high != standard
    got = receive(data, "gpu", "-n", 10, "--filter", "perf=high:at_least")
    assert [m["body"] for m in got] == ["needs high"]

    fails(data, "receive", "gpu", "--filter", "perf=extreme:at_least", needle="not one of")
    fails(data, "receive", "gpu", "--filter", "zone=eu:at_least", needle="no ordered enum")
    fails(data, "receive", "gpu", "--filter", "novalue", needle="not NAME=VALUE")


def test_gc(data: Path) -> None:
    ok(data, "send", "jobs", "x")
    assert ok(data, "gc") == [{"name": "jobs", "deleted_files": 0}]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.files_only("a missing data directory")
def test_commands_on_a_missing_queue_fail_and_create_nothing(data: Path) -> None:
    fails(data, "receive", "nope", needle="no data directory")
    fails(data, "list", needle="no data directory")
    fails(data, "create", "jobs", "--delay", 1000, needle="setting delay")
    assert not data.exists()
    ok(data, "create", "jobs")
    for args in (
        ("receive", "nope"), ("stats", "nope"), ("stats", "jobs", "nope"), ("purge", "nope"),
        ("delete", "nope", "0.1"), ("release", "nope", "0.1"), ("change-visibility", "nope", "0.1", "1"),
        ("task", "nope", "0"), ("redrive", "nope"), ("delete-queue", "nope"), ("skip", "nope", "--to", "0"),
        ("send", "nope", "x", "--no-create"),
    ):
        fails(data, *args, needle="no queue 'nope'", code=1)
    assert ok(data, "list") == [{"name": "jobs"}]
    assert sorted(p.name for p in data.iterdir()) == ["jobs"]


def test_skip_finishes_what_is_below_the_offset_and_names_the_shard_of_a_sharded_queue(data: Path) -> None:
    """``queue skip`` is the way past damage that ``check`` reports (its resume offset): the
    damage itself is tested with ``Channel.skip_to``; here the command's arguments and output."""
    ok(data, "send", "jobs", input="".join(f"m{i}\n" for i in range(10)))
    if isinstance(data, str):  # ZooKeeper's store keeps tasks, not a journal
        fails(data, "skip", "jobs", "--to", 4, needle="'jobs' is stored in ZooKeeper: it has no journal offsets")
        return
    receive(data, "jobs", "-n", 2, "--visibility-timeout", 600)  # in flight: finished too
    assert ok(data, "skip", "jobs", "--to", 4) == [
        {"name": "jobs", "channel": "default", "shard": None, "to": 4, "skipped": 4}
    ]
    assert ok(data, "skip", "jobs", "--to", 3, "--channel", "default")[0]["skipped"] == 0
    assert [m["body"] for m in receive(data, "jobs", "-n", 10)] == [f"m{i}" for i in range(4, 10)]
    past = "offset 11 is past the end of topic 'jobs': its next message will be offset 10"
    fails(data, "skip", "jobs", "--to", 11, needle=past)
    fails(data, "skip", "jobs", "--to", 1, "--shard", "x", needle="'jobs' is not sharded: it has no shard 'x'")
    fails(data, "skip", "jobs", "--to", 1, "--channel", "x", needle="'jobs' in")
    fails(data, "skip", "jobs", "--to", 1, "--channel", "x", needle="has no channel 'x': its channels are default")
    fails(data, "skip", "jobs", "--to", -1, needle="-1")

    ok(data, "create", "wide", "--shards", 2)
    with Broker(data, sync="none") as broker:
        queue = broker.queue("wide", create=False)
        queue.send_many([{"body": b"w%d" % i, "key": b"k%d" % i} for i in range(20)])
        first, second = queue.topic.shard_names
        in_first = queue.shard_stats()[first].available
    fails(data, "skip", "wide", "--to", 1, needle="'wide' is sharded: name the shard with --shard")
    unknown = f"'x' is not a shard of 'wide': its shards are {first} to {second}"
    fails(data, "skip", "wide", "--to", 1, "--shard", "x", needle=unknown)
    assert ok(data, "skip", "wide", "--to", in_first, "--shard", first) == [
        {"name": "wide", "channel": "default", "shard": first, "to": in_first, "skipped": in_first}
    ]
    [wide] = ok(data, "stats", "wide")
    assert wide["available"] == 20 - in_first


def test_skip_of_a_topic_s_channel_names_it_and_leaves_the_others(tmp_path: Path) -> None:
    """Each channel of a topic is stuck at damage alone, and skips alone; a channel that does not
    exist is refused, not made (it would get every message of the topic)."""
    data = tmp_path / "data"
    with Broker(data, sync="none") as broker:
        topic = broker.topic("events")
        topic.channel("audit"), topic.channel("billing")  # (made before the sends: each gets them all)
        topic.send_many([b"e%d" % i for i in range(6)])
    fails(data, "skip", "events", "--to", 4, needle="'events' in")
    fails(data, "skip", "events", "--to", 4, needle="is a topic with the channels audit, billing, not a queue")
    assert ok(data, "skip", "events", "--to", 4, "--channel", "audit") == [
        {"name": "events", "channel": "audit", "shard": None, "to": 4, "skipped": 4}
    ]
    fails(data, "skip", "events", "--to", 4, "--channel", "nope",
          needle="has no channel 'nope': its channels are audit, billing")
    with Broker(data, sync="none") as broker:
        topic = broker.topic("events", create=False)
        assert [m.body for m in topic.channel("audit").receive(10)] == [b"e4", b"e5"]
        assert len(topic.channel("billing").receive(10)) == 6
        assert broker.channel_names("events") == ["audit", "billing"]


def test_stats_say_where_damage_stops_a_queue_until_it_is_skipped(tmp_path: Path) -> None:
    """``damage`` in the JSON lines; a table says it on stderr, under the counts; a skip to
    where ``check`` says whole messages start again clears it."""
    data = tmp_path / "data"
    segment, _ = damaged_topic(data, "value length")
    ok(data, "create", "sound")
    jobs, sound = ok(data, "stats")
    assert str(segment) in jobs["damage"] and f"offset {DAMAGED_AT}" in jobs["damage"] and sound["damage"] is None
    table = run(data, "stats", "--format", "table")
    assert table.exit_code == 0 and "damage" not in table.stdout
    assert table.stderr.splitlines() == [f"jobs: stopped at damage: {jobs['damage']}"]
    (problem,) = [p for p in check(data / "jobs").problems if p.kind == "segment"]
    ok(data, "skip", "jobs", "--to", problem.resume)
    assert ok(data, "stats", "jobs")[0]["damage"] is None


def test_attributes_of_every_type_round_trip(data: Path) -> None:
    """``--attributes`` takes what ``receive`` prints, so a message can be sent again as it came."""
    typed = {"n": {"type": "Number.int", "value": "42"}, "bin": {"type": "Binary", "value_b64": "AP8="},
             "s": {"type": "String", "value": "x y"}}
    ok(data, "send", "jobs", "first", "--attributes", json.dumps(typed), "--attribute", "plain=1")
    [got] = receive(data, "jobs")
    assert got["attributes"] == {**typed, "plain": {"type": "String", "value": "1"}}
    ok(data, "send", "jobs", "again", "--attributes", json.dumps(got["attributes"]))
    [again] = receive(data, "jobs")
    assert again["attributes"] == got["attributes"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (("send", "../x", "body"), "queue name '../x'"),
        (("receive", "../x"), "queue name '../x'"),
        (("create", "../x"), "queue name '../x'"),
        (("create", "q", "--dead-letter-queue", "../x"), "dead-letter queue name"),
        (("create", "q", "--visibility-timeout", "-1"), "visibility_timeout"),
        (("create", "q", "--max-receive-count", "3"), "needs a dead_letter_queue"),
        (("create", "q", "--max-receive-count", "3", "--dead-letter-queue", "q"), "its own dead-letter queue"),
        (("create", "q", "--enum", "perf=a,,b"), "lowest first"),
        (("create", "q", "--retention-seconds", "soon"), "not a number of seconds"),
        (("create", "q", "--visibility-timeout", "nan"), "not a finite number"),
        (("send", "jobs", "x", "--delay", "901"), "delay must be 0 to 900"),
        (("send", "jobs", "x", "--metadata", "{not json"), "--metadata is not valid JSON"),
        (("send", "jobs", "x", "--attribute", "novalue"), "not NAME=VALUE"),
        (("send", "jobs", "x", "--attributes", "[1]"), "--attributes is a JSON object"),
        (("send", "jobs", "x", "--attributes", "{"), "--attributes is not valid JSON"),
        (("send", "jobs", "x", "--attributes", '{"n": "1"}'), "'n' must be {\"type\": TYPE"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Number", "value": 1}}'), "'n' must be"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Number", "value": "1", "x": "2"}}'), "'n' must be"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Number", "value": "4x2"}}'),
         "attribute 'n': '4x2' is not a number"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Number", "value": "1e300"}}'), "out of range"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Date", "value": "1"}}'),
         "not String, Number or Binary"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Binary", "value_b64": "!"}}'), "not base64"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "Binary", "value": "1"}}'), "takes bytes"),
        (("send", "jobs", "x", "--attributes", '{"n": {"type": "String", "value": "1"}}', "--attribute", "n=2"),
         "given by both --attribute and --attributes"),
        (("send", "jobs", "x", "--sync", "sometimes"), "unknown sync policy"),
        (("receive", "jobs", "-n", "0"), "-n"),
        (("receive", "jobs", "--visibility-timeout", "-1"), "visibility_timeout"),
        (("delete", "jobs", "garbage"), "not a receipt"),
        (("task", "jobs", "x"), "message id 'x'"),
        (("task", "jobs", "99"), "no task '99'"),
        (("frobnicate",), "No such command"),
    ],
)
def test_bad_input_is_a_one_line_error(data: Path, args: tuple[str, ...], needle: str) -> None:
    ok(data, "create", "jobs")
    fails(data, *args, needle=needle)
    assert ok(data, "list") == [{"name": "jobs"}]  # nothing made by the failure


def test_errors_as_a_person_sees_them(data: Path) -> None:
    """The installed script: one line on stderr, no traceback, non-zero exit status."""
    created = run_process(data, "create", "jobs")
    assert created.returncode == 0, created.stderr
    for args, needle in (
        (("receive", "missing"), "no queue 'missing'"),
        (("receive", "../x"), "queue name"),
        (("delete", "jobs", "1.1"), "not deleted"),
        (("receive", "jobs", "-n", "lots"), "not a valid integer"),
    ):
        process = run_process(data, *args)
        stderr = process.stderr.decode()
        assert process.returncode != 0
        assert "Traceback" not in stderr and b"Traceback" not in process.stdout
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("journalq: error: ") and needle in lines[0], stderr
    sent = run_process(data, "send", "jobs", input=b"a\nb\n")
    assert sent.returncode == 0 and len(sent.stdout.splitlines()) == 2


@pytest.mark.files_only("the ZooKeeper store has one channel per queue")
def test_a_topic_with_channels_of_its_own_is_not_a_queue(data: Path) -> None:
    """Opening it as a queue would add a channel that gets every old message and holds back gc."""
    with Broker(data) as broker:
        topic = broker.topic("events")
        topic.channel("audit")
        topic.send(b"e")
    ok(data, "create", "jobs")
    assert ok(data, "list") == [{"name": "jobs"}]
    assert [r["name"] for r in ok(data, "stats")] == ["jobs"]
    fails(data, "receive", "events", needle="topic with the channels audit, not a queue")
    assert ok(data, "send", "events", "more") == [{"id": "1"}]  # sending to a topic is fine
    assert sorted(p.name for p in (data / "events" / "channels").iterdir()) == ["audit"]
