"""ShardedScanner: every shard of a root, offsets per shard, following, and the errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from journalq.errors import Error, JournalError, OffsetOutOfRangeError
from journalq.journal import Message, Writer
from journalq.journal import watch as watch_module
from journalq.journal.segment import list_segments
from journalq.shard import ShardedScanner, ShardedWriter, ShardLayoutError, ShardNameError, shard_of


def keys_for(bit: int, index: int, n: int) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        key = b"key-%d" % i
        if shard_of(key, bit) == index:
            out.append(key)
        i += 1
    return out


def fill(root: Path, counts: dict[int, int], prefix: str = "p", bit: int = 2, **options) -> dict[str, list[bytes]]:
    """Write ``counts[i]`` messages to shard ``i``, interleaved; the values written, per shard."""
    written: dict[str, list[bytes]] = {}
    keys = {i: keys_for(bit, i, 1)[0] for i in counts}
    with ShardedWriter(root, prefix, bit, **options) as writer:
        items = []
        for n in range(max(counts.values())):
            for i, count in counts.items():
                if n < count:
                    items.append(Message(key=keys[i], value=b"%d:%d" % (i, n)))
        for name, item in zip((name for name, _ in writer.append_many(items)), items):
            written.setdefault(name, []).append(item.value)
    return written


def collect(pairs) -> dict[str, list[Message]]:
    got: dict[str, list[Message]] = {}
    for name, message in pairs:
        got.setdefault(name, []).append(message)
    return got


def values(got: dict[str, list[Message]]) -> dict[str, list[bytes]]:
    return {name: [m.value for m in messages] for name, messages in got.items()}


# -- reading ----------------------------------------------------------------------------------


def test_reads_every_shard_in_order_within_each(tmp_path: Path) -> None:
    written = fill(tmp_path, {0: 300, 1: 5, 3: 1000})
    with ShardedScanner(tmp_path) as scanner:
        assert scanner.shards == ["p.2.000", "p.2.001", "p.2.003"]
        got = collect(scanner)
        assert scanner.offsets == {"p.2.000": 300, "p.2.001": 5, "p.2.003": 1000}
        assert list(scanner) == []  # at the end; iterating again resumes (nothing new)
    assert values(got) == written
    assert all([m.offset for m in ms] == list(range(len(ms))) for ms in got.values())


def test_batches_go_round_robin_over_the_shards(tmp_path: Path) -> None:
    fill(tmp_path, {0: 3000, 1: 3000, 2: 250})
    with ShardedScanner(tmp_path) as scanner:
        names, sizes = [], Counter()
        while batch := scanner.read_batch(100):
            names.append(batch[0])
            sizes[batch[0]] += len(batch[1])
            assert 1 <= len(batch[1]) <= 100
    a, b, c = "p.2.000", "p.2.001", "p.2.002"
    assert sizes == {a: 3000, b: 3000, c: 250}
    # Each shard in turn while all have messages, then the two left in turn.
    last_c = len(names) - 1 - names[::-1].index(c)
    assert last_c >= 5 and names[: last_c + 1] == ([a, b, c] * len(names))[: last_c + 1]
    rest = names[last_c + 1 :]
    assert rest[:-1] == ([a, b] * len(rest))[: len(rest) - 1]


def test_missing_offsets_start_at_the_first_stored_message(tmp_path: Path) -> None:
    written = fill(tmp_path, {0: 400, 2: 50}, segment_size=2000)
    segments = list_segments(tmp_path / "p.2.000")
    assert len(segments) > 2
    segments[0].path.unlink()  # as if cleaned up: p.2.000 now starts later
    with ShardedScanner(tmp_path) as scanner:
        got = collect(scanner)
    assert got["p.2.000"][0].offset == segments[1].base
    assert values(got)["p.2.000"] == written["p.2.000"][segments[1].base :]
    assert values(got)["p.2.002"] == written["p.2.002"]


def test_offsets_resume_with_nothing_lost_or_twice(tmp_path: Path) -> None:
    written = fill(tmp_path, {0: 700, 1: 20000, 2: 3, 3: 9000})
    seen: list[tuple[str, int]] = []
    checkpoints = []
    offsets = None
    # Stop after odd amounts, by iterating and by read_batch, and resume from ``offsets`` each time.
    for stop in (1, 37, 4000, 1, 9999, 50, 10**9):
        with ShardedScanner(tmp_path, offsets) as scanner:
            n = 0
            for name, message in scanner:
                seen.append((name, message.offset))
                n += 1
                if n == stop:
                    break
            if n == stop and stop % 2:  # a batch after a broken-off iteration starts where it stopped
                batch = scanner.read_batch(10)
                if batch:
                    seen.extend((batch[0], m.offset) for m in batch[1])
            offsets = scanner.offsets
            checkpoints.append(offsets)
    assert len(seen) == len(set(seen)) == sum(len(v) for v in written.values())
    assert offsets == {name: len(v) for name, v in written.items()}
    for name, v in written.items():
        assert sorted(o for n, o in seen if n == name) == list(range(len(v)))


def test_iterating_again_reads_shards_made_since_as_well(tmp_path: Path) -> None:
    """Without follow, iterating again after the end reads what came since: appends to the
    shards read before, and a shard made meanwhile, as a new scanner would."""
    fill(tmp_path, {0: 5})
    with ShardedScanner(tmp_path) as scanner:
        assert len(list(scanner)) == 5
        more = fill(tmp_path, {0: 2, 3: 4})
        assert values(collect(scanner)) == {"p.2.000": more["p.2.000"], "p.2.003": more["p.2.003"]}
        assert scanner.shards == ["p.2.000", "p.2.003"]
        assert scanner.offsets == {"p.2.000": 7, "p.2.003": 4}


def test_an_iteration_goes_on_after_what_read_batch_took_meanwhile(tmp_path: Path) -> None:
    """``read_batch`` between two steps of one iteration takes the messages that come next; the
    iteration then goes on after them, neither giving them twice nor skipping any."""
    fill(tmp_path, {0: 10, 1: 4})
    with ShardedScanner(tmp_path) as scanner:
        iteration = iter(scanner)
        seen = [(name, m.offset) for name, m in (next(iteration) for _ in range(3))]
        name, batch = scanner.read_batch(2)  # the rest of the batch the iteration is in
        seen += [(name, m.offset) for m in batch]
        name, batch = scanner.read_batch(100)  # to the end of that batch
        seen += [(name, m.offset) for m in batch]
        seen += [(name, m.offset) for name, m in iteration]
    assert sorted(seen) == [("p.2.000", i) for i in range(10)] + [("p.2.001", i) for i in range(4)]


def test_offsets_for_some_shards_only(tmp_path: Path) -> None:
    written = fill(tmp_path, {0: 10, 1: 10, 2: 10})
    with ShardedScanner(tmp_path, {"p.2.001": 7, "p.2.002": 10}) as scanner:
        got = values(collect(scanner))
    assert got == {"p.2.000": written["p.2.000"], "p.2.001": written["p.2.001"][7:]}


def test_a_prefix_picks_one_journal_of_a_mixed_root(tmp_path: Path) -> None:
    a = fill(tmp_path, {0: 3, 1: 3}, prefix="a", bit=1)
    b = fill(tmp_path, {2: 4}, prefix="b", bit=2)
    fill(tmp_path, {0: 5}, prefix="", bit=3)
    with ShardedScanner(tmp_path, prefix="a") as scanner:
        assert values(collect(scanner)) == a
    with ShardedScanner(tmp_path, prefix="b") as scanner:
        assert values(collect(scanner)) == b
    with ShardedScanner(tmp_path, prefix="") as scanner:
        assert scanner.shards == ["3.000"]
    with ShardedScanner(tmp_path, prefix="none-such") as scanner:
        assert list(scanner) == [] and scanner.offsets == {} and scanner.shards == []


# -- errors -----------------------------------------------------------------------------------


def test_mixed_prefixes_without_a_prefix_are_named(tmp_path: Path) -> None:
    fill(tmp_path, {0: 1, 1: 1}, prefix="a", bit=1)
    fill(tmp_path, {2: 1}, prefix="b", bit=2)
    with pytest.raises(ShardLayoutError, match=r"a\.1\.\* \(2 shards\), b\.2\.\* \(1 shard\); give a prefix"):
        ShardedScanner(tmp_path)


def test_mixed_bits_are_named_even_with_a_prefix(tmp_path: Path) -> None:
    fill(tmp_path, {0: 1}, prefix="e", bit=1)
    (tmp_path / "e.3.005").mkdir()
    for prefix in (None, "e"):
        with pytest.raises(ShardLayoutError, match=r"different shard bits: e\.1\.\* \(1 shard\), e\.3\.\* \(1 shard\)"):
            ShardedScanner(tmp_path, prefix=prefix)


def test_a_journal_beside_shards_is_refused(tmp_path: Path) -> None:
    fill(tmp_path, {0: 1}, prefix="", bit=2)
    Writer(tmp_path).close()
    with pytest.raises(ShardLayoutError, match="both a journal"):
        ShardedScanner(tmp_path, prefix="")
    with pytest.raises(ShardLayoutError, match=r"both a journal \(jnl/ in the root\) and shards 2\.\*"):
        ShardedScanner(tmp_path)


def test_bad_arguments(tmp_path: Path) -> None:
    fill(tmp_path, {0: 3, 1: 3})
    with pytest.raises(ShardNameError, match="shard prefix"):
        ShardedScanner(tmp_path, prefix="a.b")
    with pytest.raises(ShardNameError, match="not a shard directory name"):
        ShardedScanner(tmp_path, {"p.2.4": 0})
    with pytest.raises(ShardNameError, match="not a shard directory name"):
        ShardedScanner(tmp_path, {"p.2.004": 0})  # index past 2**bit
    with pytest.raises(ShardLayoutError, match=r"'q\.2\.000' is not a shard of this root, whose shards are p\.2\.\*"):
        ShardedScanner(tmp_path, {"q.2.000": 0})
    with pytest.raises(ShardLayoutError, match="not a shard of this root"):
        ShardedScanner(tmp_path, {"p.1.000": 0})
    with pytest.raises(Error, match="integer >= 0"):
        ShardedScanner(tmp_path, {"p.2.000": -1})
    with pytest.raises(OffsetOutOfRangeError, match="past the end"):
        ShardedScanner(tmp_path, {"p.2.000": 4})
    with pytest.raises(OffsetOutOfRangeError, match="not in the root"):
        ShardedScanner(tmp_path, {"p.2.002": 1})
    with ShardedScanner(tmp_path, {"p.2.002": 0, "p.2.000": 3}) as scanner:  # 0 for a shard to come is fine
        assert len(list(scanner)) == 3
        assert scanner.offsets == {"p.2.000": 3, "p.2.001": 3, "p.2.002": 0}
    with pytest.raises(JournalError, match="no such directory"):
        ShardedScanner(tmp_path / "missing")
    with pytest.raises(Error, match="max_messages"):
        ShardedScanner(tmp_path).read_batch(0)


def test_arguments_of_the_wrong_type_get_errors_naming_them(tmp_path: Path) -> None:
    fill(tmp_path, {0: 3})
    with pytest.raises(Error, match="offsets must map shard names"):
        ShardedScanner(tmp_path, [("p.2.000", 1)])  # type: ignore[arg-type]
    with pytest.raises(Error, match="timeout must be"):
        ShardedScanner(tmp_path, timeout="5")  # type: ignore[arg-type]
    with ShardedScanner(tmp_path) as scanner, pytest.raises(Error, match="max_messages"):
        scanner.read_batch("5")  # type: ignore[arg-type]


# -- following --------------------------------------------------------------------------------


def test_follow_ends_after_timeout_without_news(tmp_path: Path) -> None:
    fill(tmp_path, {0: 5, 3: 5})
    with ShardedScanner(tmp_path, timeout=0.3) as scanner:
        started = time.monotonic()
        assert len(list(scanner)) == 10
        assert 0.25 <= time.monotonic() - started < 3
    (tmp_path / "empty").mkdir()
    with ShardedScanner(tmp_path / "empty", timeout=0.2) as scanner:
        started = time.monotonic()
        assert scanner.read_batch() is None
        assert 0.15 <= time.monotonic() - started < 3


@pytest.mark.parametrize("notify", [True, False], ids=["inotify", "polling"])
def test_follow_in_one_process_sees_appends_and_new_shards(tmp_path: Path, monkeypatch, notify: bool) -> None:
    if not notify:  # where inotify is missing, the watch polls: new shards are found all the same
        monkeypatch.setattr(watch_module, "INotify", None)
    fill(tmp_path, {0: 2})
    keys = {i: keys_for(2, i, 1)[0] for i in range(4)}
    got = []
    with ShardedScanner(tmp_path, follow=True, timeout=5) as scanner:
        done = threading.Event()

        def write() -> None:
            with ShardedWriter(tmp_path, "p", 2) as writer:
                for i in (0, 2, 1, 2, 3):
                    time.sleep(0.05)
                    writer.append(b"late", keys[i])
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        for name, message in scanner:
            got.append((name, message.offset, message.value))
            if len(got) == 7:
                break
        thread.join()
        assert scanner.offsets == {"p.2.000": 3, "p.2.001": 1, "p.2.002": 2, "p.2.003": 1}
        assert scanner._watch is not None and scanner._watch.notified == (notify and watch_module.INotify is not None)
    assert sorted(got) == sorted(
        [("p.2.000", 0, b"0:0"), ("p.2.000", 1, b"0:1"), ("p.2.000", 2, b"late"), ("p.2.002", 0, b"late"),
         ("p.2.001", 0, b"late"), ("p.2.002", 1, b"late"), ("p.2.003", 0, b"late")]
    )


def test_follow_refuses_a_new_shard_of_another_prefix(tmp_path: Path) -> None:
    fill(tmp_path, {0: 1})
    with ShardedScanner(tmp_path, timeout=5) as scanner:
        assert len(scanner.read_batch()[1]) == 1
        fill(tmp_path, {0: 1}, prefix="other", bit=2)
        with pytest.raises(ShardLayoutError, match="other"):
            scanner.read_batch()


CHILD = textwrap.dedent(
    """
    import sys, time
    from journalq.journal import Message
    from journalq.shard import ShardedWriter, shard_of

    root, = sys.argv[1:]
    keys = {}
    n = 0
    while len(keys) < 4:
        key = b"key-%d" % n
        keys.setdefault(shard_of(key, 2), key)
        n += 1
    with ShardedWriter(root, "p", 2) as writer:
        # Phase 1: the two shards the follower found when it started.
        for seq in range(50):
            writer.append(b"1:%d" % seq, keys[seq % 2])
        time.sleep(0.2)
        # Phase 2: shard 2 appears (created while the follower waits), and shard 0 goes on.
        writer.append_many([Message(key=keys[2 if seq % 3 else 0], value=b"2:%d" % seq) for seq in range(300)])
        time.sleep(0.2)
        # Phase 3: shard 3 appears, in a big batch, with one message at a time to shard 1.
        writer.append_many([Message(key=keys[3], value=b"3:%d" % seq) for seq in range(20000)])
        for seq in range(20):
            writer.append(b"4:%d" % seq, keys[1])
            time.sleep(0.002)
    print("done", flush=True)
    """
)


def test_follow_across_processes_and_shards_created_later(tmp_path: Path, child_env) -> None:
    root = tmp_path / "root"
    fill(root, {0: 3, 1: 3})  # shards 0 and 1 exist before the follower starts; 2 and 3 do not
    expected_new = {"p.2.000": 25 + 100, "p.2.001": 25 + 20, "p.2.002": 200, "p.2.003": 20000}
    total = sum(expected_new.values())
    with ShardedScanner(root, {"p.2.000": 3, "p.2.001": 3}, follow=True, timeout=15) as scanner:
        assert scanner.shards == ["p.2.000", "p.2.001"]
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root)], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            got: dict[str, list[Message]] = {}
            count = 0
            for name, message in scanner:
                got.setdefault(name, []).append(message)
                count += 1
                if count == total:
                    break
            out, err = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 0, err.decode()
        assert scanner.shards == ["p.2.000", "p.2.001", "p.2.002", "p.2.003"]
        assert scanner.offsets == {"p.2.000": 128, "p.2.001": 48, "p.2.002": 200, "p.2.003": 20000}
    assert {name: len(ms) for name, ms in got.items()} == expected_new
    for name, ms in got.items():
        start = 3 if name in ("p.2.000", "p.2.001") else 0
        assert [m.offset for m in ms] == list(range(start, start + len(ms))), name
    odd_phase_1 = [b"1:%d" % s for s in range(1, 50, 2)]
    assert [m.value for m in got["p.2.001"]] == odd_phase_1 + [b"4:%d" % s for s in range(20)]
    assert [m.value for m in got["p.2.002"]][:3] == [b"2:1", b"2:2", b"2:4"]
    assert [m.value for m in got["p.2.003"]][-1] == b"3:19999"


def test_follow_resumes_from_offsets_with_new_shards(tmp_path: Path) -> None:
    written = fill(tmp_path, {1: 30, 2: 30})
    with ShardedScanner(tmp_path, follow=True, timeout=0.2) as scanner:
        first = [(name, m.offset) for _, (name, m) in zip(range(40), scanner)]
        offsets = scanner.offsets
    more = fill(tmp_path, {0: 10, 2: 5})
    with ShardedScanner(tmp_path, offsets, follow=True, timeout=0.2) as scanner:
        rest = [(n, m.offset) for n, m in scanner]
    seen = first + rest
    assert len(seen) == 40 + len(rest)
    assert Counter(name for name, _ in seen) == {"p.2.000": 10, "p.2.001": 30, "p.2.002": 35}
    assert len(set(seen)) == len(seen)
    assert len(written["p.2.002"]) + len(more["p.2.002"]) == 35


def test_a_closed_sharded_scanner_refuses_to_read_rather_than_read_again(tmp_path: Path) -> None:
    """Its shards' scanners read their journals again from the start once closed, so iterating
    a closed sharded scanner gave every message a second time, with no error."""
    with ShardedWriter(tmp_path, "e", 1) as writer:
        placed = [writer.append(b"%d" % i, key=b"k%d" % i) for i in range(20)]
    with ShardedScanner(tmp_path) as scanner:
        read = [(name, message.offset) for name, message in scanner]
    assert sorted(read) == sorted(placed)
    checkpoint = scanner.offsets  # still there after close: what to resume from
    assert checkpoint == {shard: sum(n == shard for n, _ in placed) for shard in ("e.1.000", "e.1.001")}
    with pytest.raises(Error, match="sharded scanner of .* is closed"):
        list(scanner)
    with pytest.raises(Error, match="is closed"):
        scanner.read_batch()
    scanner.close()  # twice is harmless
    with ShardedScanner(tmp_path, checkpoint) as resumed:
        assert list(resumed) == []
