"""Garbage collection of a topic (sharded or not) with a segment that cannot be opened: it raises,
naming the segment, instead of listing the segments again for ever."""

from __future__ import annotations

import textwrap
from pathlib import Path

from test_queue_processes import spawn


def _printed_by(script: str, tmp_path: Path, child_env: dict) -> str:
    """What ``script``, run in a child process with ``tmp_path``, printed; it must end well
    within 30 s (a gc that lists segments for ever would not)."""
    child = spawn(script, tmp_path, env=child_env, stdout=-1, stderr=-1, text=True)
    try:
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    return out


GC_WITH_A_DANGLING_SEGMENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from journalq.errors import JournalError
    from journalq.queue import Broker

    root = Path(sys.argv[1])
    with Broker(root, sync="none") as broker:
        queue = broker.queue("orders", shards=2, segment_size=4096, retention_bytes=100_000)
        queue.send_many([{"body": b"y" * 500, "key": "d"} for _ in range(40)])  # all to shard 0
        while got := queue.receive(10):
            queue.delete_many([m.receipt for m in got])
        queue.commit_cursor()
        queue.send_many([{"body": b"x" * 500, "key": "a"} for _ in range(40)])  # to shard 1, kept
        damaged, other = sorted((root / "orders.1.001" / "jnl").glob("*.jnl")), (root / "orders.1.000" / "jnl")
        before = len(list(other.glob("*.jnl")))
        damaged[1].unlink()
        damaged[1].symlink_to(root / "nowhere")  # listed, but no open can read it
        try:
            broker.topic("orders").gc()
        except JournalError as exc:
            print("raised:", exc)
        print("other shard:", before, "->", len(list(other.glob("*.jnl"))))
    """
)


def test_gc_of_a_sharded_topic_with_a_segment_that_cannot_be_opened_raises_not_spins(
    tmp_path: Path, child_env: dict
) -> None:
    """Retention by size listed every shard's segments again and again, for ever, while one of
    them could not be stat'ed (a dangling link): a send, once its gc was due, never returned."""
    out = _printed_by(GC_WITH_A_DANGLING_SEGMENT, tmp_path, child_env)
    raised, other = out.splitlines()
    assert raised.startswith("raised: segment is listed but cannot be opened") and "orders.1.001" in raised, out
    before, after = map(int, other.removeprefix("other shard: ").split(" -> "))
    assert after == 1 < before, out  # the other shard collected all the same


GC_OF_A_TOPIC_WITH_A_DANGLING_SEGMENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from journalq.errors import JournalError
    from journalq.queue import Broker

    root = Path(sys.argv[1])
    with Broker(root, sync="none") as broker:
        queue = broker.queue("orders", segment_size=4096, retention_bytes=100_000)
        queue.send_many([b"y" * 500 for _ in range(40)])
        while got := queue.receive(10):
            queue.delete_many([m.receipt for m in got])
        queue.commit_cursor()
        segments = sorted((root / "orders" / "jnl").glob("*.jnl"))
        segments[1].unlink()
        segments[1].symlink_to(root / "nowhere")  # listed, but no open can read it
        try:
            broker.topic("orders").gc()
        except JournalError as exc:
            print("raised:", exc)
    """
)


def test_gc_of_a_topic_with_a_segment_that_cannot_be_opened_raises_not_spins(tmp_path: Path, child_env: dict) -> None:
    """As a sharded topic's: an unsharded topic's gc listed its segments again and again, for
    ever, while one of them could not be opened (a dangling link), taking it for one deleted
    meanwhile by another process's gc."""
    out = _printed_by(GC_OF_A_TOPIC_WITH_A_DANGLING_SEGMENT, tmp_path, child_env)
    assert out.startswith("raised: segment is listed but cannot be opened") and "orders/jnl" in out, out
