"""Sharded queues, third audit: deduplication across shards (a duplicate ``dedup_id`` sent with
another group or key, which routes it to another shard, is dropped as on an unsharded queue and
as SQS's DeduplicationScope "queue" does), in one process, in a batch and from two processes at
once."""

from __future__ import annotations

import collections
import textwrap
import threading
import time
import zlib
from pathlib import Path

from journalq.queue import Broker
from journalq.queue.envelope import decode
from journalq.journal import Scanner
from test_queue_processes import spawn


def shard_of(id_or_receipt: str) -> int:
    return int(id_or_receipt.split(".", 1)[0])


def groups_in_other_shards(shards: int, count: int) -> list[str]:
    """``count`` group ids that route to ``count`` different shards."""
    found: dict[int, str] = {}
    for n in range(10_000):
        group = f"group-{n}"
        found.setdefault(zlib.crc32(group.encode()) & (shards - 1), group)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough shards")


def stored_dedup_ids(root: Path, name: str, shards: int) -> collections.Counter[str]:
    """The dedup ids of every message stored in every shard of ``name``, counted."""
    counted: collections.Counter[str] = collections.Counter()
    bit = shards.bit_length() - 1
    for index in range(shards):
        with Scanner(root / f"{name}.{bit:x}.{index:03d}") as scanner:
            for message in scanner:
                counted[decode(message.type, message.value).dedup_id] += 1
    return counted


def test_a_duplicate_sent_with_another_group_is_dropped(tmp_path: Path) -> None:
    a, b, c = groups_in_other_shards(4, 3)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        first = queue.send(b"paid", dedup_id="order-1", group_id=a)
        assert shard_of(first) == zlib.crc32(a.encode()) & 3
        assert queue.send(b"paid again", dedup_id="order-1", group_id=b) == first
        assert queue.send(b"paid by key", dedup_id="order-1", key="customer-9") == first
        assert queue.send(b"paid bare", dedup_id="order-1") == first
        assert queue.send(b"other", dedup_id="order-2", group_id=c) != first
        assert queue.stats().available == 2
        assert sorted(m.body for m in queue.receive(10)) == [b"other", b"paid"]
    assert stored_dedup_ids(tmp_path, "orders", 4) == {"order-1": 1, "order-2": 1}


def test_a_duplicate_in_another_shard_is_dropped_from_a_batch(tmp_path: Path) -> None:
    a, b, c = groups_in_other_shards(8, 3)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=8)
        first = queue.send(b"one", dedup_id="x", group_id=a)
        ids = queue.send_many(
            [
                {"body": b"two", "dedup_id": "y", "group_id": b},  # new, and again in c below
                {"body": b"one again", "dedup_id": "x", "group_id": b},  # sent before, to a
                {"body": b"two again", "dedup_id": "y", "group_id": c},
                {"body": b"three", "group_id": c},
            ]
        )
        assert ids[1] == first
        assert ids[2] == ids[0] and shard_of(ids[0]) == zlib.crc32(b.encode()) & 7
        assert len(set(ids)) == 3
        assert queue.stats().available == 3
    assert stored_dedup_ids(tmp_path, "orders", 8) == {"x": 1, "y": 1, None: 1}


def test_a_duplicate_in_another_shard_is_taken_again_after_the_window(tmp_path: Path) -> None:
    a, b = groups_in_other_shards(4, 2)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4, dedup_window=0.5)
        first = queue.send(b"one", dedup_id="x", group_id=a)
        time.sleep(0.6)
        second = queue.send(b"one later", dedup_id="x", group_id=b)
        assert second != first and shard_of(second) == zlib.crc32(b.encode()) & 3
        assert queue.send(b"one again", dedup_id="x", group_id=a) == second  # its window now
        assert queue.stats().available == 2


SENDER = textwrap.dedent(
    """
    import sys, time
    from journalq.queue import Broker

    root, group, start, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    with Broker(root, sync="none") as broker:
        queue = broker.queue("orders")
        time.sleep(max(0.0, start - time.time()))  # both senders start together
        for n in range(count):
            if n % 2:
                print(queue.send(b"%d" % n, dedup_id=str(n), group_id=group))
            else:  # a batch of one: the duplicate of the other process, or of the one before
                print(*queue.send_many([{"body": b"%d" % n, "dedup_id": str(n), "group_id": group},
                                        {"body": b"%d" % n, "dedup_id": str(n), "group_id": group + "x"}]))
    """
)


def test_two_processes_sending_the_same_dedup_ids_with_other_groups_store_each_once(
    tmp_path: Path, child_env: dict
) -> None:
    a, b = groups_in_other_shards(4, 2)
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("orders", shards=4)
    count, start = 300, time.time() + 1.5
    senders = [spawn(SENDER, tmp_path, group, start, count, env=child_env, stdout=-1, text=True) for group in (a, b)]
    outputs = []
    for sender in senders:
        out, _ = sender.communicate(timeout=120)
        assert sender.returncode == 0
        outputs.append(out.splitlines())
    stored = stored_dedup_ids(tmp_path, "orders", 4)
    assert stored == {str(n): 1 for n in range(count)}
    # Both processes were given the id of the one message stored for each dedup id.
    for n, (mine, theirs) in enumerate(zip(*outputs)):
        assert len(set(mine.split() + theirs.split())) == 1, n


def test_threads_sending_the_same_dedup_ids_with_other_groups_store_each_once(tmp_path: Path) -> None:
    groups = groups_in_other_shards(4, 4)
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("orders", shards=4)
        results: dict[str, list[str]] = {}

        def send(group: str) -> None:
            results[group] = [queue.send(b"%d" % n, dedup_id=str(n), group_id=group) for n in range(100)]

        threads = [threading.Thread(target=send, args=(group,)) for group in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(len({results[g][n] for g in groups}) == 1 for n in range(100))
    assert stored_dedup_ids(tmp_path, "orders", 4) == {str(n): 1 for n in range(100)}


# -- garbage collection with a shard's segment that cannot be opened ------------------------------

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
