"""Arguments the command refuses, whichever subcommand takes them: a file where a directory goes,
an empty path, text that is not UTF-8, a ZooKeeper out of reach, options Spark would have read
only once started. A refused command says so in one line and makes nothing (no queue, no
dead-letter queue, no data directory)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import Result

from test_cli import COMMAND, run


# -- a file where a directory is due ----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("write", "{file}"),
        ("write", "{file}/journal"),
        ("demo", "--data", "{file}", "--messages", "1"),
        ("queue", "send", "jobs", "x", "--data", "{file}"),
        ("queue", "create", "jobs", "--data", "{file}"),
    ],
)
def test_a_file_given_as_a_directory_is_named_as_not_a_directory(tmp_path: Path, args: tuple[str, ...]) -> None:
    """It said "File exists: FILE", which reads as a refusal to overwrite it."""
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    result = run(*(arg.format(file=file) for arg in args), input="a\n")
    assert result.exit_code == 1
    assert result.stderr == f"journalq: error: not a directory ({file})\n"
    assert file.read_text() == "kept\n"


# -- the ZooKeeper store out of reach -----------------------------------------------------------


@pytest.mark.parametrize("command", [("queue", "list"), ("serve", "--port", "0")])
def test_a_zookeeper_store_out_of_reach_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    """kazoo's note on every reconnection attempt (a warning of the logger the store gives it)
    was printed too: some twenty 'journalq: warning: Connection dropped' lines around the error;
    serve printed sixty, then uvicorn's traceback of the app's failed start (exit status 3)."""
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    process = subprocess.run([*COMMAND, *command, "--data", f"zk://127.0.0.1:{port}/jq"],
                             capture_output=True, timeout=120, check=False)
    assert process.returncode == 1
    assert process.stderr.decode() == f"journalq: error: no ZooKeeper answered at 127.0.0.1:{port} within 15s\n"


# -- an empty path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("write", ""),
        ("scan", ""),
        ("info", ""),
        ("check", "", "--repair"),
        ("offset", "", "reader", "--set", "0"),
        ("demo", "--data", "", "--messages", "1"),
        ("queue", "send", "jobs", "x", "--data", ""),
        ("queue", "create", "jobs", "--data", ""),
        ("hub", "push", "--to", "http://127.0.0.1:1", "--client-id", "c", "--once", ""),
        ("hub", "serve", "--root", "", "--port", "0"),
        ("pipeline", "archive", "--journal", "", "--output", "out"),
    ],
)
def test_an_empty_path_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    """An empty DIR or --data ("$UNSET_VARIABLE") was the current directory: write made a
    journal in it, queue send a queue."""
    monkeypatch.chdir(tmp_path)
    result = run(*args, input="a\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("journalq: error: Invalid value for ") and "is empty" in result.stderr
    assert list(tmp_path.iterdir()) == []


# -- arguments that are not UTF-8 ---------------------------------------------------------------


_NOT_UTF8 = "ab\udcff"  # how Python passes the argument bytes b"ab\xff" (surrogateescape)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("send", "sharded", "x", "--key", _NOT_UTF8), "--key"),
        (("send", "sharded", "x", "--attribute", f"a={_NOT_UTF8}"), "--attribute"),
        (("send", "sharded", "x", "--dedup-id", _NOT_UTF8), "--dedup-id"),
        (("send", "sharded", "x", "--metadata", f'"{_NOT_UTF8}"'), "--metadata"),
        (("receive", "sharded", "--filter", f"a={_NOT_UTF8}"), "--filter"),
        (("delete", "sharded", _NOT_UTF8), "RECEIPT..."),
        (("create", "other", "--enum", f"level=low,{_NOT_UTF8}"), "--enum"),
    ],
)
def test_an_option_that_is_not_utf8_is_refused_by_name(tmp_path: Path, args: tuple[str, ...], option: str) -> None:
    """Bytes that are not UTF-8 in an argument stored as text failed a sharded queue's send --key
    with a traceback, the others with "message metadata cannot be stored as JSON: ... surrogates
    not allowed", naming no option; create --enum stored them in queue.json, as escapes no JSON
    reader takes for text."""
    data = tmp_path / "data"
    assert run("queue", "create", "sharded", "--shards", "2", "--data", data, "--sync", "none").exit_code == 0
    result = run("queue", *args, "--data", data, "--sync", "none")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"journalq: error: Invalid value for '{option}': not UTF-8: byte ")
    assert len(result.stderr.splitlines()) == 1
    stats = json.loads(run("queue", "stats", "sharded", "--data", data, "--format", "jsonl").stdout)
    assert stats["available"] == 0
    assert run("queue", "list", "--data", data, "--format", "jsonl").stdout == '{"name":"sharded"}\n'  # none made


# -- a refused send ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("--delay", "5000", "message delay must be 0 to 900 seconds, not 5000.0"),
        ("--group-id", "", "group_id must be a string of 1 to 128 characters, not ''"),
        ("--metadata", "NaN", "task metadata must be JSON: Out of range float values are not JSON compliant"),
        ("--attributes", '{"n": {"type": "Number", "value": "ten"}}', "attribute 'n': 'ten' is not a number"),
    ],
)
def test_a_send_refused_for_its_message_makes_no_queue(tmp_path: Path, option: str, value: str, error: str) -> None:
    """send made the missing queue (and the data directory) first, then refused the message: the
    refused send left an empty queue behind."""
    data = tmp_path / "data"
    result = run("queue", "send", "jobs", "hello", option, value, "--data", data, "--sync", "none")
    assert result.exit_code == 1
    assert result.stderr == f"journalq: error: {error}\n"
    assert not data.exists()
    assert run("queue", "create", "jobs", "--data", data, "--sync", "none").exit_code == 0
    result = run("queue", "send", "jobs", "hello", option, value, "--data", data, "--sync", "none")
    assert (result.exit_code, result.stderr) == (1, f"journalq: error: {error}\n")  # as before, to a queue there
    assert json.loads(run("queue", "stats", "jobs", "--data", data, "--format", "jsonl").stdout)["available"] == 0


# -- a refused queue command makes nothing; a file as the data directory ---------------------------


def queue(data: Path, *args: object, input: str | None = None) -> Result:
    return run("queue", *args, "--data", data, "--sync", "none", input=input)


def test_send_with_a_key_to_a_missing_queue_creates_nothing(tmp_path: Path) -> None:
    """send --key to a queue that does not exist made the queue (unsharded, as send makes it),
    then refused the key: the refused send left a queue behind."""
    data = tmp_path / "data"
    result = queue(data, "send", "jobs", "hello", "--key", "k")
    assert result.exit_code == 1
    assert result.output == "journalq: error: --key picks a shard: queue 'jobs' is not sharded\n"
    listed = queue(data, "list", "--format", "jsonl")
    assert listed.exit_code == 0 and listed.stdout == ""
    # A sharded queue takes the key, an unsharded one refuses it as before.
    assert queue(data, "create", "orders", "--shards", "2").exit_code == 0
    assert queue(data, "send", "orders", "hello", "--key", "k").exit_code == 0
    assert queue(data, "create", "plain").exit_code == 0
    assert queue(data, "send", "plain", "hello", "--key", "k").exit_code == 1


def test_a_file_as_the_data_directory_of_a_command_that_makes_nothing(tmp_path: Path) -> None:
    """send and create said "not a directory (FILE)"; the other subcommands said "no data
    directory FILE (give --data DIR ...)", as if nothing were there."""
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    for args in (("list",), ("stats",), ("receive", "jobs"), ("purge", "jobs"), ("gc",)):
        result = queue(file, *args)
        assert result.exit_code == 1
        assert result.output == f"journalq: error: not a directory ({file})\n", args
    assert file.read_text() == "kept\n"
    missing = queue(tmp_path / "none", "list")
    assert missing.output.startswith(f"journalq: error: no data directory {tmp_path / 'none'} (give --data DIR")


def test_a_refused_create_leaves_no_dead_letter_queue(tmp_path: Path) -> None:
    """create made the dead-letter queue first, then the queue: a queue refused then (a sharded
    queue's name with a '.', say) left its dead-letter queue behind."""
    data = tmp_path / "data"
    for args in (
        ("a.b", "--shards", "2", "--dead-letter-queue", "dead"),  # refused as the queue is made
        ("jobs", "--dead-letter-queue", "x.2.001"),  # a dead-letter queue's name that no queue can have
    ):
        result = queue(data, "create", *args)
        assert result.exit_code == 1, args
        assert queue(data, "list", "--format", "jsonl").stdout == "", args
    made = queue(data, "create", "jobs", "--dead-letter-queue", "dead")
    assert made.exit_code == 0
    assert json.loads(made.stdout)["settings"]["dead_letter_queue"] == "dead"
    assert queue(data, "list", "--format", "jsonl").stdout == '{"name":"dead"}\n{"name":"jobs"}\n'


def test_a_refused_fifo_create_makes_no_data_directory(tmp_path: Path) -> None:
    """A FIFO queue naming a dead-letter queue that is not there is refused, as before; the data
    directory it named, not there either, was made first and left behind empty."""
    data = tmp_path / "data"
    result = queue(data, "create", "jobs.fifo", "--fifo", "--dead-letter-queue", "dead")
    assert result.exit_code == 1
    assert result.output.startswith("journalq: error: FIFO queue 'jobs.fifo' cannot take 'dead' as its dead-letter")
    assert not data.exists()
    assert queue(data, "create", "dead.fifo", "--fifo").exit_code == 0
    assert queue(data, "create", "jobs.fifo", "--fifo", "--dead-letter-queue", "dead.fifo").exit_code == 0


def test_a_negative_release_delay_is_refused_by_its_name(tmp_path: Path) -> None:
    """release --delay -1 said "visibility timeout is -1.0", an option it was not given."""
    data = tmp_path / "data"
    assert queue(data, "send", "jobs", "hello").exit_code == 0
    (got,) = [json.loads(line) for line in queue(data, "receive", "jobs").stdout.splitlines()]
    result = queue(data, "release", "jobs", got["receipt"], "--delay", "-1")
    assert result.exit_code == 1
    assert result.output == "journalq: error: delay is -1.0; it must be from 0 to 43200\n"
    assert queue(data, "release", "jobs", got["receipt"], "--delay", "0").exit_code == 0


# -- pipeline options checked before Spark starts ------------------------------------------------


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline command that starts Spark fails the test: its options must be refused first."""
    import journalq.cli.pipeline as pipeline

    def refuse(*args: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(pipeline, "_session", refuse)


def test_pipeline_import_refuses_a_bad_sync_before_spark_starts(tmp_path: Path, no_spark: None) -> None:
    """--sync was first read by the topic's writers on Spark's executors: a typo cost a Spark
    start (half a minute here) before its one-line error."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n')
    result = run("pipeline", "import", "--format", "jsonl", "--journal", tmp_path / "j", "--sync", "bogus", source)
    assert result.exit_code == 1
    assert result.output.startswith("journalq: error: unknown sync policy 'bogus': use none, always, or group")
    assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "j").exists()


def test_pipeline_archive_refuses_a_bad_reader_name_before_spark_starts(tmp_path: Path, no_spark: None) -> None:
    """--name was first checked when the archive took its reader offset, once Spark had started."""
    journal = tmp_path / "j"
    assert run("write", journal, input="a\n").exit_code == 0
    result = run("pipeline", "archive", "--journal", journal, "--output", tmp_path / "out", "--name", "../x")
    assert result.exit_code == 1
    assert result.output == (
        "journalq: error: reader name '../x' must be letters, digits, '.', '_' or '-', not starting with '.'\n"
    )
    assert not (journal / "ofs").exists()


# What Spark 4's IntervalUtils.fromIntervalString took and refused (tried through py4j): each
# taken text must pass the check; each refused one is refused (but the few Spark refuses for
# their values, not their form, that the check leaves to it).
SPARK_TAKES = [
    "1 minute", "10 minutes", "  10 minutes  ", "interval 10 minutes", "INTERVAL 10 MINUTES", "10 Minutes",
    "INTERVAL '10 minutes'", "interval'10 minutes'", "1 hour 30 minutes", "-5 seconds", "+ 5 seconds", "- 5 seconds",
    "1.5 seconds", "1. seconds", ".5 seconds", "2 weeks", "1 month", "1 YEARS", "5 milliseconds", "1 microsecond",
    "INTERVAL '1' DAY", "INTERVAL '1:30' HOUR TO MINUTE", "interval 1 hour '30' minutes", "interval -'5' seconds",
    "1 minute 1 minute", "10\tminutes", "10 minutes\n", "00005 seconds",
]
SPARK_REFUSES = [
    "bogus", "", "'10 minutes'", "10minutes", "10 min", "10 mins", "10 s", "10 ms", "1 h", "10", "interval",
    "1 hour, 30 minutes", "1.5 minutes", "1.5 microseconds", "1 nanosecond", "P1D", "PT10M", "1e3 seconds",
    "1_000 seconds", "10 minutes;", "10 minutes interval", "1 hour30 minutes", "+-5 seconds", "5.seconds",
    "1 second 1", "1 hour '30' minutes", "\u00a010 minutes",
]


@pytest.mark.parametrize("option", ["--window", "--watermark"])
def test_pipeline_aggregate_checks_its_intervals_before_spark_starts(
    tmp_path: Path, no_spark: None, option: str
) -> None:
    """--window and --watermark were first refused by Spark, once it had started, in its words."""
    journal = tmp_path / "j"
    assert run("write", journal, input="{}\n").exit_code == 0
    args = ("pipeline", "aggregate", "--journal", journal, "--output-journal", tmp_path / "out",
            "--parquet", tmp_path / "pq", "--checkpoint", tmp_path / "cp")
    for text in SPARK_REFUSES:
        result = run(*args, option, text)
        assert result.exit_code == 2, (text, result.output)
        assert result.output.startswith(f"journalq: error: {option}: {text!r} is not an interval"), result.output
    for text in SPARK_TAKES:
        with pytest.raises(AssertionError, match="Spark started"):
            run(*args, option, text)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cp").exists()
