"""The journal layer against the vectors written by the Go reference implementation (h12.io/sej)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from itertools import islice
from pathlib import Path

import pytest

from journalq.errors import Error
from journalq.journal import (
    ZERO_TIMESTAMP,
    Message,
    OffsetOutOfRangeError,
    Scanner,
    Writer,
    end_offset,
    first_offset,
    read_offset,
)
from journalq.journal import index as index_mod
from journalq.journal.segment import list_segments

pytestmark = pytest.mark.usefixtures("vectors_untouched")

TORN_TAIL = 30  # the torn/ vector ends in the first 30 bytes of a 51st message


def scan_all(path: Path, offset: int = 0) -> list[Message]:
    with Scanner(path, offset) as scanner:
        return list(scanner)


def as_tuples(messages):
    return [(m.offset, m.timestamp_ns, m.type, bytes(m.key), bytes(m.value)) for m in messages]


# -- reading what sej wrote ------------------------------------------------------------------


def test_expected_files_are_what_the_readme_says(expected_plain, expected_torn, expected_sharded):
    # Guards the tests below against a wrong or partial vector set.
    assert len(expected_plain) == 3000
    assert len(expected_torn) == 50
    assert sorted(expected_sharded) == [f"events.2.{i:03d}" for i in range(4)]
    assert any(m.timestamp_ns == ZERO_TIMESTAMP for m in expected_plain)
    assert {len(m.key) for m in expected_plain} >= {0, 127}
    assert any(len(m.value) == 0 for m in expected_plain)


def test_plain_reads_exactly_as_expected(copy_vector, expected_plain):
    got = scan_all(copy_vector("plain"))
    assert as_tuples(got) == as_tuples(expected_plain)
    assert all(type(m.key) is bytes and type(m.value) is bytes for m in got)


def test_plain_original_reads_from_offset_zero(sej_vectors, expected_plain):
    # Reading from the start is a pure read: it works on the read-only original as it is.
    assert as_tuples(scan_all(sej_vectors / "plain")) == as_tuples(expected_plain)


def test_torn_reads_the_whole_messages_only(sej_vectors, expected_torn):
    assert as_tuples(scan_all(sej_vectors / "torn")) == as_tuples(expected_torn)


def test_sharded_reads_exactly_as_expected_per_shard(sej_vectors, expected_sharded):
    shards = sorted(p.name for p in (sej_vectors / "sharded").iterdir() if p.is_dir())
    assert shards == sorted(expected_sharded)
    for shard, expected in expected_sharded.items():
        assert [m.offset for m in expected] == list(range(len(expected))), shard
        got = scan_all(sej_vectors / "sharded" / shard)
        assert as_tuples(got) == as_tuples(expected), shard


def test_reader_offsets_committed_by_sej(sej_vectors):
    assert read_offset(sej_vectors / "plain", "alpha") == 1465
    assert read_offset(sej_vectors / "plain", "beta") == 1150
    assert read_offset(sej_vectors / "plain", "never-committed") == 0


def test_first_and_end_offsets(sej_vectors):
    assert first_offset(sej_vectors / "plain") == 0
    assert end_offset(sej_vectors / "plain") == 3000
    assert first_offset(sej_vectors / "torn") == 0
    assert end_offset(sej_vectors / "torn") == 50


# -- seeking ---------------------------------------------------------------------------------


def seek_targets(path: Path, end: int, seed: int) -> list[int]:
    bases = [s.base for s in list_segments(path)]
    assert len(bases) > 10, "the plain vector should have many segments"
    targets = {0, 1, end - 1, end}
    for base in bases:
        targets.update(k for k in (base - 1, base, base + 1) if 0 <= k <= end)
    rng = random.Random(seed)
    targets.update(rng.randrange(end) for _ in range(60))
    return sorted(targets)


def check_seeks(path: Path, expected: list[Message], targets: list[int]) -> None:
    end = len(expected)
    for k in targets:
        with Scanner(path, offset=k) as scanner:
            assert scanner.offset == k
            got = list(islice(scanner, 5))
            if k == end:
                assert got == []
            else:
                assert got, f"seek to {k} yielded nothing"
                assert got[0].offset == k, f"seek to {k} started at {got[0].offset}"
                assert as_tuples(got) == as_tuples(expected[k : k + 5])


def test_seek_on_a_copy_yields_from_exactly_k(copy_vector, expected_plain):
    path = copy_vector("plain")
    targets = seek_targets(path, len(expected_plain), seed=1)
    check_seeks(path, expected_plain, targets)
    # The seeks built indexes for the sealed segments; seeking again uses them.
    assert any(p.suffix == ".idx" for p in (path / "jnl").iterdir())
    check_seeks(path, expected_plain, targets)
    # A seek reads on to the end of the journal, across segments.
    assert as_tuples(scan_all(path, 2500)) == as_tuples(expected_plain[2500:])


def test_seek_past_the_end_is_refused(copy_vector, expected_plain):
    path = copy_vector("plain")
    with pytest.raises(OffsetOutOfRangeError, match="past the end"):
        Scanner(path, offset=len(expected_plain) + 1)
    with pytest.raises(Error, match="0 or more") as refused:  # a bad argument, not out of range
        Scanner(path, offset=-1)
    assert not isinstance(refused.value, OffsetOutOfRangeError)


READ_ONLY_SEEKS = textwrap.dedent(
    """
    import json, sys
    from itertools import islice
    from pathlib import Path
    from journalq.journal import Scanner
    path = Path(sys.argv[1])
    # The test must really run where nothing can be written, or it proves nothing.
    try:
        open(path / "jnl" / "probe.tmp", "wb")
    except PermissionError:
        pass
    else:
        print("WRITABLE")
        sys.exit(3)
    expected = [json.loads(line)["offset"] for line in open(sys.argv[2])]
    targets = json.loads(sys.argv[3])
    for k in targets:
        with Scanner(path, offset=k) as s:
            got = [m.offset for m in islice(s, 3)]
        want = expected[k : k + 3]
        if got != want:
            print("MISMATCH", k, got, want)
            sys.exit(1)
    print("OK", len(targets))
    """
)


def test_seek_on_the_read_only_original(sej_vectors, expected_plain, child_env, monkeypatch):
    """Seeking must work where the index cannot be written (and must write nothing there)."""
    path = sej_vectors / "plain"
    targets = seek_targets(path, len(expected_plain), seed=2)
    cmd = [sys.executable, "-c", READ_ONLY_SEEKS, str(path), str(sej_vectors / "plain.expected.jsonl"), repr(targets)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            # Root ignores the read-only modes: make the index writes fail as they would for
            # anyone else, in this process.
            real_open = open

            def refusing_open(file, mode="r", *args, **kwargs):
                if any(c in mode for c in "wax+"):
                    raise PermissionError(13, "Permission denied", str(file))
                return real_open(file, mode, *args, **kwargs)

            monkeypatch.setattr(index_mod, "open", refusing_open, raising=False)
            check_seeks(path, expected_plain, targets)
            return
        # Run as root without the capability to override file modes: truly read-only.
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--", *cmd]
    result = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"OK {len(targets)}"


# -- recovering the torn vector --------------------------------------------------------------


def test_writer_cuts_and_keeps_the_torn_tail(copy_vector, sej_vectors, expected_torn):
    path = copy_vector("torn")
    segment = path / "jnl" / "0000000000000000.jnl"
    original = segment.read_bytes()
    whole = len(original) - TORN_TAIL

    with Writer(path) as writer:
        assert len(writer.recoveries) == 1
        recovery = writer.recoveries[0]
        assert recovery.file == segment
        assert recovery.position == whole
        assert recovery.next_offset == 50
        assert recovery.last_timestamp_ns == expected_torn[-1].timestamp_ns
        assert recovery.cut_bytes == TORN_TAIL
        assert recovery.saved_to.parent == path / "cut"
        assert recovery.saved_to.read_bytes() == original[whole:]
        assert len(recovery.saved_to.read_bytes()) == TORN_TAIL
        assert str(segment) in str(recovery) and "30 bytes" in str(recovery)
        assert segment.stat().st_size == whole
        assert segment.read_bytes() == original[:whole]
        assert writer.next_offset == 50
        assert writer.append(b"after the tear", key=b"k") == 50

    got = scan_all(path)
    assert len(got) == 51
    assert as_tuples(got[:50]) == as_tuples(expected_torn)
    assert (got[50].offset, got[50].key, got[50].value) == (50, b"k", b"after the tear")
    assert end_offset(path) == 51
    # The original is untouched (vectors_untouched checks the whole tree too).
    assert (sej_vectors / "torn" / "jnl" / "0000000000000000.jnl").read_bytes() == original


def test_writer_on_a_clean_copy_recovers_nothing(copy_vector):
    path = copy_vector("plain")
    with Writer(path, segment_size=65536) as writer:
        assert writer.recoveries == []
        assert writer.next_offset == 3000
        assert writer.append(b"x") == 3000
    assert not (path / "cut").exists()
    assert end_offset(path) == 3001
