"""Crash safety: a writer killed with SIGKILL at random moments, over and over.

A child process appends with ``sync="always"`` (single appends and batches) and prints each offset
once its append has returned; the parent kills it at a random moment, reopens the journal and
checks that every acknowledged message is there with the right value, that offsets are dense, and
that nothing appears that the child did not append (the values of each round are exactly the
child's first appends, in order).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from journalq.journal import Scanner, Writer

pytestmark = pytest.mark.usefixtures("vectors_untouched")

ROUNDS = 25
SEGMENT_SIZE = 4096


def value(round_: int, seq: int) -> bytes:
    """What the child appends as message ``seq`` of round ``round_``."""
    return b"%d:%d:" % (round_, seq) + bytes([seq % 251]) * ((seq * 37 + round_) % 300)


CHILD = textwrap.dedent(
    """
    import random, sys
    from journalq.journal import Writer

    def value(round_, seq):
        return b"%d:%d:" % (round_, seq) + bytes([seq % 251]) * ((seq * 37 + round_) % 300)

    path, round_, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    w = Writer(path, sync="always", segment_size=SEGMENT_SIZE)
    out = sys.stdout
    out.write(f"ready {w.next_offset}\\n")
    out.flush()
    seq = 0
    while True:
        if rng.random() < 0.5:
            offset = w.append(value(round_, seq))
            out.write(f"{offset} {seq}\\n")
            seq += 1
        else:
            # Mostly small batches; now and then one spanning several segments (several writes).
            n = rng.randint(100, 300) if rng.random() < 0.1 else rng.randint(2, 6)
            last = w.append_many([value(round_, seq + i) for i in range(n)])
            out.write("".join(f"{last - n + 1 + i} {seq + i}\\n" for i in range(n)))
            seq += n
        out.flush()
    """
).replace("SEGMENT_SIZE", str(SEGMENT_SIZE))


def run_round(path: Path, round_: int, rng: random.Random, env) -> tuple[int, list[tuple[int, int]]]:
    """Start a child, kill it at a random moment; its start offset and acknowledged (offset, seq)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(round_), str(rng.randrange(2**32))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    lines: list[bytes] = []
    ready = threading.Event()

    def read():
        for line in child.stdout:
            lines.append(line)
            ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(30), "the child did not start"
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reader.join(30)
    stderr = child.stderr.read().decode(errors="replace")
    child.stderr.close()
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL, f"the child died on its own: {stderr}"
    assert lines and lines[0].startswith(b"ready "), f"no ready line: {lines[:2]} {stderr}"
    start = int(lines[0].split()[1])
    acks = []
    for line in lines[1:]:
        if line.endswith(b"\n"):  # a line cut by the kill was not acknowledged as a whole
            offset, seq = map(int, line.split())
            acks.append((offset, seq))
    return start, acks


def test_sigkill_during_appends_loses_nothing_acknowledged(tmp_path, child_env):
    path = tmp_path / "journal"
    rng = random.Random(20240501)
    history: list[bytes] = []  # every value in the journal, by offset, after the last round
    total_acks = 0
    recoveries = 0
    spares_left = 0  # spare segments of an append cut by the kill (see ``segment.spare_path``)
    for round_ in range(ROUNDS):
        start, acks = run_round(path, round_, rng, child_env)
        assert start == len(history), f"round {round_}: the child started at {start}, not {len(history)}"
        total_acks += len(acks)

        spares_left += len(list((path / "jnl").glob("*.spare")))
        with Writer(path, segment_size=SEGMENT_SIZE) as w:  # reopening recovers
            recoveries += len(w.recoveries)
            assert all(r.saved_to.exists() for r in w.recoveries)
            assert list((path / "jnl").glob("*.spare")) == [], "the spares of the killed append were kept"
            end = w.next_offset
        with Scanner(path) as s:
            messages = list(s)
        assert [m.offset for m in messages] == list(range(len(messages))), f"round {round_}: offsets not dense"
        assert len(messages) == end
        values = [m.value for m in messages]
        # Earlier rounds are untouched.
        assert values[: len(history)] == history, f"round {round_}: earlier messages changed"
        # This round: exactly the child's first appends, in order.
        mine = values[len(history) :]
        assert mine == [value(round_, seq) for seq in range(len(mine))], f"round {round_}: unexpected values"
        # Every acknowledged message is there, at the offset it was given.
        for offset, seq in acks:
            assert offset == start + seq, f"round {round_}: seq {seq} acknowledged at offset {offset}"
            assert offset < len(values), f"round {round_}: acknowledged offset {offset} lost"
            assert values[offset] == value(round_, seq)
        history = values

    segments = sorted((path / "jnl").glob("*.jnl"))
    print(
        f"{ROUNDS} rounds: {total_acks} acknowledged, {len(history)} messages, {len(segments)} segments, "
        f"{recoveries} recoveries, {spares_left} spare segments left by the kills"
    )
    assert total_acks > ROUNDS, "the children appended too little before being killed"
    assert len(segments) > ROUNDS // 2, "the segments should have rolled many times during the rounds"
    # Seeking still works everywhere after all that (the indexes survived the kills).
    for k in range(0, len(history), max(1, len(history) // 50)):
        with Scanner(path, k) as s:
            first = next(iter(s))
        assert first.offset == k and first.value == history[k]
