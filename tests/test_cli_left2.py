"""Bugs of the ``journalq`` command found by a second audit of the command line: each test here
failed before its fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from journalq.cli.main import cli


def run(*args: object, input: bytes | str | None = None) -> Result:
    """The command in-process; an unexpected exception fails the test with its traceback."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def _root_with_an_unfinished_shard(sej_vectors: Path, tmp_path: Path) -> Path:
    """The vectors' root of four shards, with events.2.003 as a writer killed while making it
    leaves it: the shard's directory, no jnl/ in it yet."""
    root = tmp_path / "root"
    shutil.copytree(sej_vectors / "sharded", root)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the vectors are read-only
    shutil.rmtree(root / "events.2.003")
    (root / "events.2.003").mkdir()
    return root


def test_info_and_check_of_a_root_take_a_shard_without_jnl_as_empty(sej_vectors: Path, tmp_path: Path) -> None:
    """scan reads such a shard as empty; info and check failed on it ("not a journal
    directory"), after printing the shards before it, and check --repair did not get past it."""
    root = _root_with_an_unfinished_shard(sej_vectors, tmp_path)
    scanned = run("scan", root, "--count")
    assert scanned.exit_code == 0 and scanned.stdout == "782\n"

    result = run("info", root, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    summaries = [obj for obj in map(json.loads, result.stdout.splitlines()) if "journal" in obj]
    assert [s["dir"] for s in summaries] == ["events.2.000", "events.2.001", "events.2.002", "events.2.003"]
    assert summaries[-1] | {"journal": None} == {
        "dir": "events.2.003", "journal": None, "segments": 0, "size_bytes": 0, "first_offset": 0,
        "end_offset": 0, "messages": 0, "first_timestamp_ns": None, "last_timestamp_ns": None,
    }
    table = run("info", root, "--format", "table")
    assert table.exit_code == 0 and "[events.2.003]" in table.stdout

    for repair in ([], ["--repair"]):
        checked = run("check", root, "--format", "table", *repair)
        assert "not a journal directory" not in checked.output
        assert f"{root / 'events.2.003'}: ok; 0 segments, 0 messages checked" in checked.stdout
    assert not (root / "events.2.003" / "jnl").exists()  # check makes no journal


def test_scan_timeout_must_be_a_finite_number_of_seconds(tmp_path: Path) -> None:
    """--timeout inf ended scan in a traceback (OverflowError) once it waited, and nan was taken
    as an option value and refused later by the scanner (status 1); both are usage errors."""
    journal = tmp_path / "j"
    assert run("write", journal, input="a\n").exit_code == 0
    for shown in (journal, tmp_path):  # a journal, and a root of one shard
        if shown == tmp_path:
            journal.rename(tmp_path / "e.1.000")
        for value in ("inf", "nan", "-inf", "-1"):
            result = run("scan", shown, "--timeout", value, "--count")
            assert result.exit_code == 2, (value, result.output)
            assert result.output.startswith("journalq: error: Invalid value for '--timeout'")
            assert len(result.output.splitlines()) == 1
        assert run("scan", shown, "--timeout", "0.2", "--count").stdout == "1\n"


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


def test_follow_of_a_root_of_several_sharded_journals_says_what_to_do(tmp_path: Path) -> None:
    """scan without --follow reads every shard of such a root (a data directory with two
    sharded queues, say); with --follow it failed with the library's "give a prefix to read one
    of them", which the command line has no way to give."""
    root = tmp_path / "root"
    for shard in ("orders.1.000", "orders.1.001", "events.1.000"):
        assert run("write", root / shard, input=f"{shard}\n").exit_code == 0
    assert run("scan", root, "--count").stdout == "3\n"
    result = run("scan", root, "--timeout", "0.1")
    assert result.exit_code == 1
    assert result.output == (
        f"journalq: error: {root} holds the shards of more than one sharded journal "
        "(events.1.* (1 shard), orders.1.* (2 shards)): --follow follows one; "
        "follow one shard directory, or scan the root without --follow\n"
    )


def test_pipeline_import_refuses_a_bad_sync_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--sync was first read by the topic's writers on Spark's executors: a typo cost a Spark
    start (half a minute here) before its one-line error."""
    import journalq.cli.pipeline as pipeline

    def no_spark(*args: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(pipeline, "_session", no_spark)
    source = tmp_path / "in.jsonl"
    source.write_text('{"a": 1}\n')
    result = run("pipeline", "import", "--format", "jsonl", "--journal", tmp_path / "j", "--sync", "bogus", source)
    assert result.exit_code == 1
    assert result.output.startswith("journalq: error: unknown sync policy 'bogus': use none, always, or group")
    assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "j").exists()


def test_pipeline_archive_refuses_a_bad_reader_name_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--name was first checked when the archive took its reader offset, once Spark had started."""
    import journalq.cli.pipeline as pipeline

    def no_spark(*args: object) -> None:
        raise AssertionError("Spark started")

    monkeypatch.setattr(pipeline, "_session", no_spark)
    journal = tmp_path / "j"
    assert run("write", journal, input="a\n").exit_code == 0
    result = run("pipeline", "archive", "--journal", journal, "--output", tmp_path / "out", "--name", "../x")
    assert result.exit_code == 1
    assert result.output == (
        "journalq: error: reader name '../x' must be letters, digits, '.', '_' or '-', not starting with '.'\n"
    )
    assert not (journal / "ofs").exists()


def test_a_shard_whose_jnl_is_a_file_is_no_unfinished_shard(tmp_path: Path) -> None:
    """Only a missing jnl/ is a shard being made: a file in its place is damage, named."""
    root = tmp_path / "root"
    assert run("write", root / "e.1.000", input="a\n").exit_code == 0
    (root / "e.1.001").mkdir()
    (root / "e.1.001" / "jnl").write_bytes(b"")
    for command in ("scan", "info", "check"):
        result = run(command, root)
        assert result.exit_code == 1, command
        error = result.output.splitlines()[-1]
        assert error.startswith("journalq: error: not a ") and str(root / "e.1.001") in error, command


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


@pytest.mark.parametrize("option", ["--give-up-after", "--timeout", "--check-interval"])
def test_hub_push_seconds_must_be_finite(tmp_path: Path, option: str) -> None:
    """``hub push --give-up-after nan`` passed the option's range (NaN compares false) and never
    gave up; ``--timeout inf`` overflowed the wait. Each is a one-line usage error before anything
    is pushed."""
    journal = tmp_path / "j"
    assert run("write", journal, input="a\n").exit_code == 0
    for value in ("nan", "inf"):
        result = run("hub", "push", journal, "--to", "http://127.0.0.1:9", "--client-id", "c1", "--once",
                     option, value)
        assert result.exit_code == 2, (value, result.output)
        assert result.output.startswith(f"journalq: error: Invalid value for '{option}'"), result.output
        assert len(result.output.splitlines()) == 1
