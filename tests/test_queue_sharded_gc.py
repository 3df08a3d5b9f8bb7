"""Garbage collection of sharded topics: once per interval for all shards, keeping in every shard
what a channel of another process has not read, collecting the other shards when one fails; and
of a topic (sharded or not) with a segment that cannot be opened: it raises, naming the segment,
instead of listing the segments again for ever."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from test_queue_dead_letter_moves import broker  # noqa: F401 (fixture)
from test_queue_processes import spawn

from journalq.queue import Broker


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


# -- collection over every shard -------------------------------------------------------------------


def test_a_sharded_receive_collects_the_topic_once_per_interval(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's channel collects when due; the topic's gc, which counts ``retention_bytes``
    over every shard, runs once for them all (it ran once per shard, each listing every shard)."""
    from journalq.queue.sharded import ShardedTopic

    queue = broker.queue("orders", shards=4, retention_bytes=10**6, task_gc_interval=0.5)
    calls: list[int] = []
    real = ShardedTopic.size_cuts
    monkeypatch.setattr(ShardedTopic, "size_cuts", lambda self: calls.append(1) or real(self))
    for _ in range(3):
        queue.send_many([b"%d" % i for i in range(8)])
        time.sleep(0.55)
        calls.clear()
        got = queue.receive(10)  # from every shard
        assert len({m.id.split(".")[0] for m in got}) > 1
        queue.delete_many([m.receipt for m in got])
        assert len(calls) == 1


def test_a_sharded_gc_keeps_what_a_channel_of_another_process_has_not_read(tmp_path: Path) -> None:
    """The gc of a process that only sends (it opened no channel) keeps, in every shard, what a
    channel that another process made has not read there, also in shards it never received
    from; and collects once that channel is done."""
    with Broker(tmp_path, sync="none") as consuming:
        consuming.topic("events", shards=4, segment_size=4096)
        slow = consuming.topic("events").channel("slow")
        with Broker(tmp_path, sync="none") as sending:
            topic = sending.topic("events")
            sent = topic.send_many([b"%04d" % i + b"." * 100 for i in range(800)])
            first = slow.receive(5)  # from its home shard only
            slow.delete_many([m.receipt for m in first])
            slow.commit_cursor()
            topic.gc()
            rest = []
            while got := slow.receive(50):
                rest += got
                slow.delete_many([m.receipt for m in got])
            assert sorted(m.id for m in first + rest) == sorted(sent)
            slow.commit_cursor()
            assert topic.gc()  # once it is done


def test_a_sharded_gc_collects_the_other_shards_when_one_fails(broker: Broker, tmp_path: Path) -> None:
    """One shard whose gc fails (a damaged offset file) no longer keeps the shards after it from
    being collected; its failure is raised once all were tried."""
    from journalq.errors import JournalError
    from journalq.journal.segment import list_segments

    topic = broker.topic("events", shards=4, segment_size=4096)
    channel = topic.channel("c")
    topic.send_many([{"body": b"%04d" % i + b"." * 100, "key": b"k%d" % i} for i in range(800)])
    while got := channel.receive(100):
        channel.delete_many([m.receipt for m in got])
    channel.commit_cursor()
    before = [len(list_segments(shard.path)) for shard in topic.shards]
    assert min(before) > 1
    damaged = topic.shards[1].path / "ofs" / "c.ofs"
    damaged.unlink()
    damaged.mkdir()  # read_offset: "the offset file is a directory"
    with pytest.raises(JournalError, match="directory"):
        topic.gc()
    after = [len(list_segments(shard.path)) for shard in topic.shards]
    assert after[1] == before[1]
    assert [after[i] for i in (0, 2, 3)] == [1, 1, 1]
