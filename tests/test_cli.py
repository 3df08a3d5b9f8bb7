"""The ``journalq`` command, against the Go reference vectors and journals it writes itself.

Most tests run the click command in-process (``CliRunner``); the error cases, broken pipes and
following run the installed ``journalq`` script in a subprocess, since what matters there is what
a person sees on a terminal. The vectors are copied first: even reading a journal may write its
sparse index files beside the segments.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from journalq.cli.main import cli, parse_time
from journalq.errors import ZERO_TIMESTAMP
from journalq.journal import ReaderOffset, Writer
from journalq.journal.codec import HEADER
from journalq.journal.inspect import check, describe
from journalq.shard import ShardName, ShardNameError, list_shards, parse_shard_name, shard_name, shard_of

VECTORS = Path(os.environ.get("JOURNALQ_VECTORS", Path(__file__).resolve().parents[2] / "shared/vectors/sej"))
pytestmark = pytest.mark.skipif(not VECTORS.is_dir(), reason=f"no sej vectors at {VECTORS}")

_SCRIPT = Path(sys.executable).parent / "journalq"
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "journalq.cli.main"]


# -- helpers ----------------------------------------------------------------------------------


def copy_vector(name: str, destination: Path) -> Path:
    """A writable copy of a vector directory (the originals are read-only)."""
    target = destination / name
    shutil.copytree(VECTORS / name, target, copy_function=shutil.copyfile)
    for directory, _, _ in os.walk(target):
        os.chmod(directory, os.stat(directory).st_mode | stat.S_IWUSR)
    return target


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of every vector for the tests that only read (reading may add index files)."""
    root = tmp_path_factory.mktemp("vectors")
    for name in ("plain", "sharded", "torn"):
        copy_vector(name, root)
    return root


def expected_lines(name: str) -> list[str]:
    return (VECTORS / f"{name}.expected.jsonl").read_text().splitlines(keepends=True)


def expected_records(name: str) -> list[dict]:
    return [json.loads(line) for line in expected_lines(name)]


def run(*args: object, input: bytes | str | None = None) -> Result:
    """The command in-process; an unexpected exception fails the test with its traceback."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def run_process(*args: object, input: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*COMMAND, *map(str, args)], input=input, capture_output=True, timeout=timeout, check=False
    )


def assert_one_line_error(process: subprocess.CompletedProcess, *needles: str) -> str:
    """A failure as the command must show it: one ``journalq: error:`` line, nothing else."""
    stderr = process.stderr.decode()
    assert process.returncode != 0
    assert "Traceback" not in stderr and b"Traceback" not in process.stdout
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("journalq: error: "), stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def scan_records(*args: object) -> list[dict]:
    result = run("scan", *args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def count(*args: object) -> int:
    result = run("scan", *args, "--count")
    assert result.exit_code == 0, result.output
    return int(result.stdout)


# -- scan: the vectors, byte for byte ---------------------------------------------------------


@pytest.mark.parametrize("name", ["plain", "torn"])
def test_scan_prints_the_expected_file_byte_for_byte(vectors: Path, name: str) -> None:
    result = run("scan", vectors / name, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == (VECTORS / f"{name}.expected.jsonl").read_bytes()


def test_scan_jsonl_is_the_default_format(vectors: Path) -> None:
    assert run("scan", vectors / "torn").stdout_bytes == (VECTORS / "torn.expected.jsonl").read_bytes()


def test_scan_of_a_sharded_root_reads_every_shard_in_name_order_with_dir_first(vectors: Path) -> None:
    result = run("scan", vectors / "sharded")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines(keepends=True)
    assert all(line.startswith('{"dir":"events.2.00') for line in lines)
    dirs = [json.loads(line)["dir"] for line in lines]
    assert dirs == sorted(dirs)  # shard after shard, in name order

    def by_shard(lines: list[str]) -> list[str]:
        return sorted(lines, key=lambda line: (json.loads(line)["dir"], json.loads(line)["offset"]))

    assert lines == by_shard(expected_lines("sharded"))


# -- write ------------------------------------------------------------------------------------


def test_write_text_then_scan_gives_the_lines_back(tmp_path: Path) -> None:
    lines = ["hello", "wörld", "", "last line without newline"]
    result = run("write", tmp_path / "j", "--verbose", input="\n".join(lines).encode())
    assert result.exit_code == 0, result.output
    assert result.stdout == "3\n"  # the last offset
    assert run("scan", tmp_path / "j", "--format", "text").stdout == "".join(f"{line}\n" for line in lines)
    assert run("scan", tmp_path / "j", "--format", "raw").stdout_bytes == "".join(lines).encode()
    records = scan_records(tmp_path / "j")
    assert [r["offset"] for r in records] == [0, 1, 2, 3]
    assert all(r["type"] == 0 and r["key_b64"] == "" and r["timestamp_ns"] > 0 for r in records)


def test_write_text_applies_key_and_type_to_every_line(tmp_path: Path) -> None:
    assert run("write", tmp_path / "j", "--key", "user-1", "--type", "7", input=b"a\nb\n").exit_code == 0
    records = scan_records(tmp_path / "j")
    assert [base64.b64decode(r["value_b64"]) for r in records] == [b"a", b"b"]
    assert {(r["type"], base64.b64decode(r["key_b64"])) for r in records} == {(7, b"user-1")}


def test_write_jsonl_of_a_scan_rebuilds_the_same_journal(vectors: Path, tmp_path: Path) -> None:
    """scan output is valid write input: every field, the zero time included, survives."""
    dumped = run("scan", vectors / "plain").stdout_bytes
    result = run("write", tmp_path / "copy", "--format", "jsonl", "--segment-size", 65536, input=dumped)
    assert result.exit_code == 0, result.output
    assert run("scan", tmp_path / "copy").stdout_bytes == (VECTORS / "plain.expected.jsonl").read_bytes()


def test_write_jsonl_fields(tmp_path: Path) -> None:
    lines = [
        {"value": "plain text"},
        {"value_b64": base64.b64encode(b"\x00\xff").decode(), "key": "k", "type": 3},
        {"value": "", "key_b64": base64.b64encode(b"\x01").decode(), "timestamp_ns": 1_700_000_000_000_000_000},
        {"value": "zero time", "timestamp_ns": None},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n\n"  # a blank line is skipped
    assert run("write", tmp_path / "j", "--format", "jsonl", "--type", "9", input=text).exit_code == 0
    records = scan_records(tmp_path / "j")
    assert [base64.b64decode(r["value_b64"]) for r in records] == [b"plain text", b"\x00\xff", b"", b"zero time"]
    assert [r["type"] for r in records] == [9, 3, 9, 9]  # --type is the default
    assert [base64.b64decode(r["key_b64"]) for r in records] == [b"", b"k", b"\x01", b""]
    assert records[2]["timestamp_ns"] == 1_700_000_000_000_000_000
    assert records[3]["timestamp_ns"] is None
    assert describe(tmp_path / "j").messages == 4


def test_write_appends_in_batches_and_to_an_existing_journal(tmp_path: Path) -> None:
    many = "".join(f"{i}\n" for i in range(10_000)).encode()
    assert run("write", tmp_path / "j", "--segment-size", 50_000, input=many).exit_code == 0
    result = run("write", tmp_path / "j", "-v", "--sync", "group:10ms", input=b"more\n")
    assert result.stdout == "10000\n"
    values = run("scan", tmp_path / "j", "--format", "text").stdout.splitlines()
    assert values == [str(i) for i in range(10_000)] + ["more"]
    assert len(describe(tmp_path / "j").segments) > 1


def test_a_bad_line_names_its_number_and_stores_nothing_of_its_batch(tmp_path: Path) -> None:
    good = "".join(json.dumps({"value": str(i)}) + "\n" for i in range(5000))
    result = run("write", tmp_path / "j", "--format", "jsonl", input=good + '{"value": 5}\n')
    assert result.exit_code == 1
    assert result.stderr.startswith("journalq: error: line 5001: 'value' must be a string")
    assert "nothing from line 4097 on was stored" in result.stderr  # the first batch was
    assert count(tmp_path / "j") == 4096


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"valu": "x"}', "unknown field 'valu'"),
        ('{"key": "x"}', "no 'value' or 'value_b64'"),
        ('{"value": "x", "value_b64": "eA=="}', "not both"),
        ('{"value_b64": "not base64!"}', "not valid base64"),
        ('{"value": "x", "type": 256}', "type must be an integer from 0 to 255"),
        ('{"value": "x", "type": true}', "'type' must be an integer, not true"),
        ('{"value": "x", "timestamp_ns": false}', "'timestamp_ns' must be an integer, not false"),
        ('{"value": "x", "key": "' + "k" * 128 + '"}', "key is 128 bytes"),
    ],
)
def test_bad_jsonl_lines_are_one_line_errors(tmp_path: Path, line: str, reason: str) -> None:
    result = run("write", tmp_path / "j", "--format", "jsonl", input=f'{{"value": "ok"}}\n{line}\n')
    assert result.exit_code == 1
    assert result.stderr.startswith("journalq: error: line 2: ") and reason in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert count(tmp_path / "j") == 0  # the good first line was in the same batch


def test_scan_from_the_oldest_while_gc_deletes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc deleting the oldest segment just after the first listing of the journal's segments:
    the scan starts at the oldest message still stored, not with 'no longer stored'."""
    jnl = tmp_path / "j" / "jnl"
    with Writer(tmp_path / "j", segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 6)  # 56-byte messages: 2 per segment
    real_listdir = os.listdir
    listed = []

    def listdir_then_collect(path=".", *args):
        names = real_listdir(path, *args)
        if Path(path) == jnl and not listed:
            listed.append(names)
            (jnl / "0000000000000000.jnl").unlink()
        return names

    monkeypatch.setattr(os, "listdir", listdir_then_collect)
    result = run("scan", tmp_path / "j", "--format", "text")
    assert listed, "the fault did not happen"
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["v" * 30] * 4


def test_write_refuses_a_root_of_shards(vectors: Path) -> None:
    result = run("write", vectors / "sharded", input=b"x\n")
    assert result.exit_code == 1 and "root of shards" in result.stderr


# -- scan: filters ----------------------------------------------------------------------------


def test_scan_from_an_offset(vectors: Path) -> None:
    records = scan_records(vectors / "plain", "--from", 2990)
    assert [r["offset"] for r in records] == list(range(2990, 3000))
    assert records == expected_records("plain")[2990:]
    assert count(vectors / "plain", "--from", 3000) == 0


def test_scan_filters_by_type_and_time(vectors: Path) -> None:
    expected = expected_records("plain")
    stamps = sorted(r["timestamp_ns"] for r in expected if r["timestamp_ns"] is not None)
    middle = stamps[len(stamps) // 2]
    type_ = expected[0]["type"]

    def at_least(r: dict) -> bool:
        return r["timestamp_ns"] is not None and r["timestamp_ns"] >= middle

    assert count(vectors / "plain", "--type", type_) == sum(r["type"] == type_ for r in expected)
    assert count(vectors / "plain", "--since", middle) == sum(map(at_least, expected))
    assert count(vectors / "plain", "--until", middle) == sum(not at_least(r) for r in expected)
    since = scan_records(vectors / "plain", "--since", middle, "--from", 1000, "--type", type_)
    assert since == [r for r in expected[1000:] if at_least(r) and r["type"] == type_]


def test_scan_times_in_rfc_3339_and_nanoseconds_agree(vectors: Path) -> None:
    by_text = count(vectors / "plain", "--since", "2025-01-01T00:00:00Z", "--until", "2027-06-30")
    by_ns = count(vectors / "plain", "--since", 1_735_689_600 * 10**9, "--until", 1_814_313_600 * 10**9)
    assert by_text == by_ns > 0


def test_scan_of_a_root_filters_every_shard(vectors: Path) -> None:
    expected = expected_records("sharded")
    assert count(vectors / "sharded") == len(expected) == 1000
    assert count(vectors / "sharded", "--type", 7) == sum(r["type"] == 7 for r in expected)


def test_parse_time() -> None:
    assert parse_time("1970-01-01T00:00:01Z") == 10**9
    assert parse_time("1970-01-01T00:00:01") == 10**9  # naive is UTC
    assert parse_time("1970-01-01 00:00:01.000000123Z") == 10**9 + 123  # nanoseconds kept
    assert parse_time("1970-01-01T02:00:01+02:00") == 10**9
    assert parse_time("1970-01-02") == 86_400 * 10**9
    assert parse_time("-5") == -5
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_a_bad_time_is_a_usage_error(vectors: Path) -> None:
    result = run("scan", vectors / "plain", "--since", "yesterday")
    assert result.exit_code == 2 and "is not a time" in result.stderr


def test_follow_sees_appends_and_stops_after_the_timeout(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append(b"before")
    follower = subprocess.Popen(
        [*COMMAND, "scan", journal, "--follow", "--timeout", "1.5", "--format", "text"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.3)
    with Writer(journal) as writer:
        writer.append_many([b"after-1", b"after-2"])
    stdout, stderr = follower.communicate(timeout=20)
    assert follower.returncode == 0, stderr
    assert stdout == b"before\nafter-1\nafter-2\n"


def test_from_needs_one_journal(vectors: Path) -> None:
    result = run("scan", vectors / "sharded", "--from", "3")
    assert result.exit_code == 2 and "one shard directory" in result.stderr


def test_follow_a_root_of_shards(tmp_path: Path) -> None:
    """Following a root reads every shard, and one created while following."""
    from journalq.shard import ShardedWriter

    root = tmp_path / "root"
    with ShardedWriter(root, prefix="ev", bit=2) as writer:
        writer.append(b"before", key=b"a")
    follower = subprocess.Popen(
        [*COMMAND, "scan", root, "--timeout", "1.5", "--format", "jsonl"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)
    with ShardedWriter(root, prefix="ev", bit=2) as writer:
        placed = [writer.append(b"key %d" % i, key=b"k%d" % i) for i in range(8)]
    stdout, stderr = follower.communicate(timeout=20)
    assert follower.returncode == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert sorted((line["dir"], line["offset"]) for line in lines) == sorted(
        [("ev.2.%03d" % shard_of(b"a", 2), 0)] + placed
    )


def test_a_closed_pipe_ends_scan_quietly(vectors: Path) -> None:
    process = subprocess.run(
        f"{' '.join(COMMAND)} scan {vectors / 'plain'} | head -n 1",
        shell=True, capture_output=True, timeout=30, check=False,
    )
    assert process.stdout.decode() == expected_lines("plain")[0]
    assert process.stderr == b""


# -- info -------------------------------------------------------------------------------------


def test_info_prints_segments_then_a_summary_as_json_lines(vectors: Path) -> None:
    result = run("info", vectors / "plain")
    assert result.exit_code == 0, result.output
    *segments, summary = [json.loads(line) for line in result.stdout.splitlines()]
    expected = expected_records("plain")
    assert summary == {
        "journal": str(vectors / "plain"),
        "segments": 28,
        "size_bytes": sum(p.stat().st_size for p in (vectors / "plain/jnl").glob("*.jnl")),
        "first_offset": 0,
        "end_offset": 3000,
        "messages": 3000,
        "first_timestamp_ns": expected[0]["timestamp_ns"],
        "last_timestamp_ns": expected[-1]["timestamp_ns"],
    }
    assert len(segments) == 28 and sum(s["messages"] for s in segments) == 3000
    for previous, following in zip(segments, segments[1:]):
        assert previous["end_offset"] == following["first_offset"] == following["base"]
    for s in segments:  # each segment's ends, as the expected file has them
        assert s["first_timestamp_ns"] == expected[s["first_offset"]]["timestamp_ns"]
        assert s["last_timestamp_ns"] == expected[s["end_offset"] - 1]["timestamp_ns"]


def test_info_of_a_torn_journal_counts_only_whole_messages(vectors: Path) -> None:
    summary = json.loads(run("info", vectors / "torn").stdout.splitlines()[-1])
    assert (summary["messages"], summary["end_offset"]) == (50, 50)


def test_info_of_a_root_describes_every_shard(vectors: Path) -> None:
    objects = [json.loads(line) for line in run("info", vectors / "sharded").stdout.splitlines()]
    summaries = [o for o in objects if "journal" in o]
    assert [o["dir"] for o in summaries] == [f"events.2.00{i}" for i in range(4)]
    assert sum(o["messages"] for o in summaries) == 1000
    assert all(next(iter(o)) == "dir" for o in objects)


def test_info_table_for_people(vectors: Path) -> None:
    result = run("info", vectors / "plain", "--format", "table")
    assert result.exit_code == 0
    assert "28 segments, 3000 messages (offsets 0-2999; next 3000)" in result.stdout
    assert "0000000000000b92.jnl" in result.stdout and "zero-time" in result.stdout


# -- check ------------------------------------------------------------------------------------


def test_check_reports_the_torn_tail_and_repair_cuts_it(tmp_path: Path) -> None:
    torn = copy_vector("torn", tmp_path)
    result = run("check", torn)
    assert result.exit_code == 1
    problems = [json.loads(line) for line in result.stdout.splitlines()]
    tail = next(p for p in problems if p["kind"] == "tail")
    assert (tail["position"], tail["offset"], tail["fixed"], tail["resume"]) == (17777, 50, False, None)
    assert tail["file"].endswith("0000000000000000.jnl") and "incomplete message" in tail["reason"]

    repaired = run("check", torn, "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert all(json.loads(line)["fixed"] for line in repaired.stdout.splitlines())
    assert (torn / "cut" / "0000000000000000.jnl@17777").stat().st_size == 30
    again = run("check", torn)
    assert (again.exit_code, again.stdout) == (0, "")
    assert run("scan", torn).stdout_bytes == (VECTORS / "torn.expected.jsonl").read_bytes()


def test_check_of_a_sej_journal_reports_missing_indexes_until_repaired(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    for index_file in (plain / "jnl").glob("*.idx"):
        index_file.unlink()  # as sej wrote it
    result = run("check", plain)
    assert result.exit_code == 1
    assert {json.loads(line)["kind"] for line in result.stdout.splitlines()} == {"index"}
    assert run("check", plain, "--repair").exit_code == 0
    assert run("check", plain, "--format", "table").stdout.endswith("ok; 28 segments, 3000 messages checked\n")
    assert run("scan", plain).stdout_bytes == (VECTORS / "plain.expected.jsonl").read_bytes()


def test_check_finds_a_stale_index_and_rebuilds_it(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    assert check(plain, repair=True).ok
    index_file = plain / "jnl" / "0000000000000067.idx"
    data = bytearray(index_file.read_bytes())
    data[16 + 15] ^= 0x01  # the position of the first entry, one byte off
    index_file.write_bytes(bytes(data))
    report = check(plain)
    assert not report.ok
    assert [(p.kind, p.file) for p in report.problems] == [("index", index_file)]
    assert "stale" in report.problems[0].reason
    assert check(plain, repair=True).ok and check(plain).ok


def test_check_of_a_root_checks_every_shard(vectors: Path) -> None:
    assert run("check", vectors / "sharded", "--repair").exit_code == 0
    result = run("check", vectors / "sharded", "--format", "table")
    assert result.exit_code == 0
    assert result.stdout.count(": ok; 1 segment,") == 4


def damage_middle_segment(journal: Path) -> Path:
    """Flip the offset field of the first message of the journal's middle segment."""
    segments = sorted((journal / "jnl").glob("*.jnl"))
    middle = segments[len(segments) // 2]
    with open(middle, "r+b") as f:
        header = bytearray(f.read(HEADER.size))
        header[2] ^= 0xFF
        f.seek(0)
        f.write(header)
    return middle


def test_check_reports_damage_in_a_middle_segment_and_does_not_cut_it(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    middle = damage_middle_segment(plain)
    size = middle.stat().st_size
    result = run("check", plain, "--repair")
    assert result.exit_code == 1
    remaining = [json.loads(line) for line in result.stdout.splitlines() if '"fixed":false' in line]
    assert len(remaining) == 1
    assert remaining[0]["kind"] == "segment" and remaining[0]["file"] == str(middle)
    assert remaining[0]["position"] == 0 and remaining[0]["offset"] == int(middle.stem, 16)
    assert middle.stat().st_size == size


# -- offset -----------------------------------------------------------------------------------


def test_offset_reads_the_reader_offsets_sej_committed(vectors: Path) -> None:
    assert run("offset", vectors / "plain", "alpha").stdout == "1465\n"
    assert run("offset", vectors / "plain", "beta").stdout == "1150\n"
    assert run("offset", vectors / "plain", "never-committed").stdout == "0\n"


def test_offset_set_and_reset_to(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    assert run("offset", plain, "alpha", "--set", 2000).stdout == "2000\n"
    assert run("offset", plain, "alpha").stdout == "2000\n"
    assert (plain / "ofs" / "alpha.ofs").read_bytes() == (2000).to_bytes(8, "big")

    expected = expected_records("plain")
    moment = expected[500]["timestamp_ns"]
    first = next(r["offset"] for r in expected if r["timestamp_ns"] is not None and r["timestamp_ns"] >= moment)
    assert run("offset", plain, "beta", "--reset-to", moment).stdout == f"{first}\n"
    assert run("offset", plain, "beta").stdout == f"{first}\n"
    assert run("offset", plain, "beta", "--reset-to", "2200-01-01T00:00:00Z").stdout == "3000\n"


def test_offset_refuses_what_a_reader_could_not_resume_from(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    result = run("offset", plain, "alpha", "--set", 3001)
    assert result.exit_code == 1 and "past the end of the journal (the next offset is 3000)" in result.stderr
    assert run("offset", plain, "alpha").stdout == "1465\n"
    assert run("offset", plain, "alpha", "--set", 1, "--reset-to", 0).exit_code == 2


def test_offset_set_mends_a_damaged_offset_file(tmp_path: Path) -> None:
    """A damaged ``.ofs`` is reported when read, and ``--set`` (or ``--reset-to``) is how it is
    mended: it commits over it. A reader holding the name still keeps it."""
    plain = copy_vector("plain", tmp_path)
    (plain / "ofs" / "alpha.ofs").write_bytes(b"\x00\x01\x02")
    read = run("offset", plain, "alpha")
    assert read.exit_code == 1 and "offset file holds 3 bytes, not 8" in read.stderr
    assert run("offset", plain, "alpha", "--set", 1000).stdout == "1000\n"
    assert run("offset", plain, "alpha").stdout == "1000\n"
    with ReaderOffset(plain, "alpha"):
        held = run("offset", plain, "alpha", "--set", 5)
    assert held.exit_code == 1 and "alpha.lck" in held.stderr
    assert run("offset", plain, "alpha").stdout == "1000\n"


# -- errors: one line, never a traceback ------------------------------------------------------


@pytest.mark.parametrize("command", ["scan", "info", "check", "offset"])
def test_a_missing_directory_is_a_one_line_error(tmp_path: Path, command: str) -> None:
    extra = ["alpha"] if command == "offset" else []
    process = run_process(command, tmp_path / "missing", *extra)
    assert_one_line_error(process, "no such directory", str(tmp_path / "missing"))


def test_a_directory_that_is_not_a_journal_is_a_one_line_error(tmp_path: Path) -> None:
    assert_one_line_error(run_process("scan", tmp_path), "not a journal directory")


def test_a_key_over_127_bytes_is_a_one_line_error(tmp_path: Path) -> None:
    process = run_process("write", tmp_path / "j", "--key", "k" * 200, input=b"value\n")
    assert_one_line_error(process, "200 bytes", "127")


def test_scanning_a_damaged_segment_is_a_one_line_error(tmp_path: Path) -> None:
    plain = copy_vector("plain", tmp_path)
    middle = damage_middle_segment(plain)
    process = run_process("scan", plain)
    assert_one_line_error(process, str(middle), "byte 0", "journalq check")
    good = process.stdout.decode().splitlines(keepends=True)
    assert good == expected_lines("plain")[: int(middle.stem, 16)]  # everything before it


def test_a_locked_journal_is_a_one_line_error(tmp_path: Path) -> None:
    with Writer(tmp_path / "j"):
        process = run_process("write", tmp_path / "j", input=b"x\n")
    assert_one_line_error(process, "another writer holds the lock")


def test_a_bad_sync_policy_is_a_one_line_error(tmp_path: Path) -> None:
    """It names the forms taken, as ``--help`` does (it said group[:Nms][,N], and group,1000
    is refused)."""
    for policy in ("sometimes", "group,1000"):
        assert_one_line_error(run_process("write", tmp_path / "j", "--sync", policy, input=b""), "sync policy",
                              "group[:Nms,N]")


@pytest.mark.parametrize("policy", ["none", "always", "group", "group:10ms", "group:1000", "group:10ms,1000"])
def test_every_sync_policy_the_help_gives_is_taken(tmp_path: Path, policy: str) -> None:
    """``--help`` says group[:Nms,N] with either part left out (it once said group[:Nms][,N],
    and group,1000 is refused)."""
    result = run("write", tmp_path / "j", "--sync", policy, "-v", input="a\nb\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "1\n"



@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--bogus",), ("No such option '--bogus'", "see 'journalq --help'")),
        (("frobnicate",), ("No such command 'frobnicate'",)),
        (("scan",), ("Missing argument 'DIR'", "see 'journalq scan --help'")),
        (("scan", "j", "--bogus"), ("No such option '--bogus'", "see 'journalq scan --help'")),
        (("scan", "j", "--since", "yesterday"), ("'yesterday' is not a time",)),
        (("offset", "j", "alpha", "--set", "1", "--reset-to", "0"), ("give --set or --reset-to, not both",)),
        (("hub", "push", "--to", "http://127.0.0.1:1", "--client-id", "c"), ("Missing argument 'DIR...'",)),
        (("serve", "--port", "65536"), ("Invalid value for '--port'", "see 'journalq serve --help'")),
        (("pipeline", "archive", "--bogus"), ("No such option '--bogus'", "see 'journalq pipeline archive --help'")),
        # CSV-only options with another format: refused before Spark starts, not ignored
        (("pipeline", "import", "--journal", "j", "--format", "jsonl", "--no-header", "in.jsonl"),
         ("--no-header and --infer-schema are for --format csv, not jsonl",)),
    ],
)
def test_a_usage_error_is_a_one_line_error(tmp_path: Path, args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    """As the README says of every command: one line on stderr (exit status 2), not click's
    usage block, for the top level and every group's subcommands alike."""
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append(b"x")
    process = run_process(*(journal if arg == "j" else arg for arg in args))
    assert_one_line_error(process, *needles)
    assert process.returncode == 2
    assert process.stdout == b""

# -- demo -------------------------------------------------------------------------------------


def test_demo_runs_and_runs_again(tmp_path: Path) -> None:
    first = run_process("demo", "--data", tmp_path, timeout=60)
    assert first.returncode == 0, first.stderr
    assert b"offsets 0-4999" in first.stdout and b"saw 5000 of the 5000" in first.stdout
    second = run_process("demo", "--data", tmp_path, timeout=60)
    assert second.returncode == 0, second.stderr
    assert b"offsets 5000-9999" in second.stdout and b"was 2503, committed 7503" in second.stdout
    assert describe(tmp_path / "demo").messages == 10_000 and check(tmp_path / "demo").ok


# -- the library helpers the command stands on ------------------------------------------------


def test_shard_names() -> None:
    assert shard_name("events", 2, 3) == "events.2.003"
    assert shard_name("", 10, 0x3FF) == "a.3ff"
    assert str(ShardName("x_y-z", 1, 1)) == "x_y-z.1.001"
    assert parse_shard_name("events.2.003") == ShardName("events", 2, 3)
    assert parse_shard_name("2.001") == ShardName("", 2, 1)
    for not_a_shard in [".2.001", "events.2.004", "events.b.000", "events.2.0A0", "events.2.01", "jnl", "a.b.2.001"]:
        assert parse_shard_name(not_a_shard) is None, not_a_shard
    for bad in [("a.b", 2, 0), ("x", 0, 0), ("x", 11, 0), ("x", 2, 4), ("x", 2, -1)]:
        with pytest.raises(ShardNameError):
            shard_name(*bad)


def test_list_shards_sorts_by_prefix_bit_index(tmp_path: Path) -> None:
    for name in ["b.1.001", "a.2.003", "a.1.000", "a.2.000", "not-a-shard", "2.001"]:
        (tmp_path / name).mkdir()
    (tmp_path / "a.1.001").write_text("a file, not a shard")
    assert [str(name) for name, _ in list_shards(tmp_path)] == ["2.001", "a.1.000", "a.2.000", "a.2.003", "b.1.001"]


def test_shard_of_is_the_shard_sej_chose(vectors: Path) -> None:
    for record in expected_records("sharded"):
        shard = parse_shard_name(record["dir"])
        assert shard is not None
        assert shard_of(base64.b64decode(record["key_b64"]), shard.bit) == shard.index


def test_zero_time_is_null_in_json(vectors: Path) -> None:
    records = scan_records(vectors / "plain")
    zero = [r for r in records if r["timestamp_ns"] is None]
    assert zero and ZERO_TIMESTAMP < 0


# -- counts in words, and --count when following ------------------------------------------------


def test_one_segment_is_not_said_segments(tmp_path):
    """info and check said "1 segments" and "1 messages"."""
    with Writer(tmp_path / "j") as writer:
        writer.append(b"only")
    info = run("info", tmp_path / "j", "--format", "table").stdout.splitlines()[0]
    assert info.startswith(f"{tmp_path / 'j'}: 1 segment, 1 message (offsets 0-0; next 1)")
    checked = run("check", tmp_path / "j", "--format", "table").stdout
    assert checked == f"{tmp_path / 'j'}: ok; 1 segment, 1 message checked\n"
    with Writer(tmp_path / "j", segment_size=10) as writer:
        writer.append(b"two")  # the first segment is over its size: a second one
    assert ": 2 segments, 2 messages" in run("info", tmp_path / "j", "--format", "table").stdout


def _output_until(process: subprocess.Popen, expected: bytes, seconds: float = 10) -> bytes:
    """What ``process`` printed, once it printed ``expected`` (or ``seconds`` passed)."""
    assert process.stdout is not None
    fd, out, deadline = process.stdout.fileno(), b"", time.monotonic() + seconds
    while not out.endswith(expected) and (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            if not (chunk := os.read(fd, 4096)):
                break
            out += chunk
    return out


def test_scan_follow_count_prints_the_count_as_it_changes(tmp_path, child_env):
    """Following, --count printed nothing, ever: the count came once the scan ended, and a
    scan that follows without a timeout ends only with Ctrl-C (quietly)."""
    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append_many([b"a", b"b"])
    follower = subprocess.Popen(
        [sys.executable, "-m", "journalq.cli.main", "scan", str(journal), "--follow", "--count"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env,
    )
    try:
        assert _output_until(follower, b"2\n") == b"2\n"
        with Writer(journal) as writer:
            writer.append(b"c")
        assert _output_until(follower, b"3\n") == b"3\n"
    finally:
        follower.send_signal(signal.SIGINT)
        _, stderr = follower.communicate(timeout=20)
    assert follower.returncode == 130, stderr
    # With a timeout the last line is the count; nothing came: 0, once.
    assert run("scan", journal, "--timeout", "0.1", "--count").stdout == "3\n"
    assert run("scan", journal, "--from", "3", "--timeout", "0.1", "--count").stdout == "0\n"


# -- write --format jsonl: not UTF-8, a byte order mark; offset --set beside a reader ------------


def test_a_jsonl_line_that_is_not_utf8_is_refused_as_such(tmp_path: Path) -> None:
    """JSON lines are UTF-8: a line of other bytes is named as not UTF-8 (it was blamed on a
    'utf-16-le' codec), and a line in UTF-16 is refused rather than stored."""
    journal = tmp_path / "j"
    result = run("write", journal, "--format", "jsonl", input=b'{"value":"ok"}\n\xff\xfe\x00bin\n')
    assert result.exit_code == 1
    assert result.stderr.startswith("journalq: error: line 2: not UTF-8: byte 1 is 0xff")
    result = run("write", journal, "--format", "jsonl", input=b'\xef\xbb\xbf{"value":"\xff"}\n')
    assert "line 1: not UTF-8: byte 14 is 0xff" in result.stderr
    utf16 = '{"value":"sixteen"}'.encode("utf-16-le")
    result = run("write", journal, "--format", "jsonl", input=utf16 + b"\n")
    assert result.exit_code == 1 and "line 1: not valid JSON" in result.stderr
    assert run("scan", journal, "--count").stdout == "0\n"


def test_a_jsonl_line_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    assert run("write", journal, "--format", "jsonl", input=b'\xef\xbb\xbf{"value":"a"}\n').exit_code == 0
    assert run("scan", journal, "--format", "text").stdout == "a\n"


def test_offset_set_while_a_reader_holds_the_name_names_the_reader(tmp_path: Path) -> None:
    """It said "another writer holds the lock", of a reader offset."""
    from journalq.journal import ReaderOffset

    journal = tmp_path / "j"
    with Writer(journal) as writer:
        writer.append_many([b"a", b"b"])
    with ReaderOffset(journal, "billing"):
        result = run("offset", journal, "billing", "--set", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"journalq: error: reader 'billing' is in use: another process holds {journal / 'ofs' / 'billing.lck'}; "
        "stop that reader first\n"
    )
    assert run("offset", journal, "billing").stdout == "0\n"


# -- roots with a shard being made or damaged; scan's --timeout; following a root -----------------


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
