"""Many processes, no daemon: producers and consumers in separate processes share one data
directory. Exactly-once delivery while no visibility timeout expires; a consumer killed with
SIGKILL loses nothing (its messages come back to another consumer); a process killed while
writing channel state leaves it recoverable; a dedup id sent again after its window is
deduplicated alike in every process."""

from __future__ import annotations

import collections
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
from test_queue_lookahead import broker  # noqa: F401 (fixture)

import journalq.queue.channel as channel_module
from journalq.journal import end_offset
from journalq.journal.codec import encode
from journalq.journal.lock import FileLock
from journalq.journal.offsets import read_offset
from journalq.journal.segment import list_segments, lock_path, scan_segment
from journalq.queue import Broker
from journalq.queue.state import ChannelState, Event, EventKind

CONSUMER = textwrap.dedent(
    """
    import os, sys, time
    from journalq.queue import Broker

    root, out, done = sys.argv[1], sys.argv[2], sys.argv[3]
    with Broker(root, sync="none") as broker, open(out, "w") as log:
        q = broker.queue("jobs")
        log.write(f"consumer {q.consumer_id}\\n")
        idle = 0
        while True:
            got = q.receive(10, wait=0.2)
            if got:
                idle = 0
                log.write("".join(m.body.decode() + "\\n" for m in got))
                errors = q.delete_many([m.receipt for m in got])
                if any(errors):
                    log.write(f"error {errors}\\n")
                log.flush()
            elif os.path.exists(done):
                idle += 1
                if idle >= 3:
                    break
    """
)

PRODUCER = textwrap.dedent(
    """
    import sys
    from journalq.queue import Broker

    root, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        for start in range(first, first + count, 50):
            q.send_many([b"%d" % i for i in range(start, min(start + 50, first + count))])
    """
)


def tear_state_tail(channel: Path, rng: random.Random) -> bool:
    """Append the first bytes of an event, as a writer killed in the middle of it leaves them
    (under the journal's lock). Not over a torn tail that no writer has cut yet (then False):
    every writer cuts one before it appends, so a killed writer's torn bytes never follow
    another's. Two in a row read as a whole message with a wrong size field, which a reader
    rightly takes for damage: the crash stress test, on a busy machine, tore a topic twice
    before any producer took its lock, and a consumer raised ``CorruptionError``."""
    last = list_segments(channel)[-1]
    if not scan_segment(last, 0, last.base).clean:
        return False
    at = end_offset(channel)
    type_, key, value = Event(EventKind.FINISH, 0, 1).encode()
    data = encode(at, time.time_ns(), type_, key, value)
    with open(last.path, "ab") as f:
        f.write(data[: rng.randint(1, len(data) - 1)])
    return True


def spawn(code: str, *args: object, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, **kwargs)


def test_four_consumers_drain_10000_messages_exactly_once(tmp_path: Path, child_env: dict) -> None:
    root, done = tmp_path / "data", tmp_path / "producers-done"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs", visibility_timeout=600)  # no timeout expires during the test
        broker.queue("jobs").send_many([b"%d" % i for i in range(2000)])  # some before they start
    logs = [tmp_path / f"consumer-{n}.log" for n in range(4)]
    consumers = [spawn(CONSUMER, root, log, done, env=child_env) for log in logs]
    producers = [spawn(PRODUCER, root, first, 4000, env=child_env) for first in (2000, 6000)]
    try:
        for p in producers:
            assert p.wait(120) == 0
        done.touch()
        for c in consumers:
            assert c.wait(120) == 0
    finally:
        for p in producers + consumers:
            if p.poll() is None:
                p.kill()
                p.wait()
    received: collections.Counter[int] = collections.Counter()
    per_consumer = []
    for log in logs:
        lines = log.read_text().splitlines()
        assert lines[0].startswith("consumer ")
        assert not [line for line in lines if line.startswith("error")]
        bodies = [int(line) for line in lines[1:]]
        per_consumer.append(len(bodies))
        received.update(bodies)
    assert sorted(received) == list(range(10_000)), "lost messages"
    assert [b for b, n in received.items() if n > 1] == [], "delivered twice"
    assert sum(per_consumer) == 10_000
    with Broker(root, sync="none") as broker:
        stats = broker.queue("jobs").stats()
        assert (stats.available, stats.in_flight, stats.delayed, stats.dead) == (0, 0, 0, 0)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from journalq.queue import Broker

    with Broker(sys.argv[1], sync="none") as broker:
        q = broker.queue("jobs")
        got = q.receive(5, visibility_timeout=2.0)
        print(q.consumer_id, *[m.id for m in got], flush=True)
        time.sleep(600)  # "working" until killed
    """
)

TAKER = textwrap.dedent(
    """
    import sys, time
    from journalq.queue import Broker

    with Broker(sys.argv[1], sync="none") as broker:
        q = broker.queue("jobs")
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            batch = q.receive(10, wait=5)
            q.delete_many([m.receipt for m in batch])
            got += batch
        print(q.consumer_id, *[f"{m.id}:{m.receive_count}" for m in got], flush=True)
    """
)


def test_consumer_killed_mid_work_loses_nothing(tmp_path: Path, child_env: dict) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        q.send_many([b"%d" % i for i in range(5)])
    holder = spawn(HOLDER, root, env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline().split()
        holder_id, held = line[0], line[1:]
        assert held == ["0", "1", "2", "3", "4"]
        with Broker(root, sync="none") as broker:
            q = broker.queue("jobs")
            assert q.consumers() == {holder_id: held}
            assert q.receive(10) == []  # hidden while the holder "works"
        os.kill(holder.pid, signal.SIGKILL)
        assert holder.wait(10) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
    taker = subprocess.run(
        [sys.executable, "-c", TAKER, str(root)], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert taker.returncode == 0, taker.stderr
    taker_id, *got = taker.stdout.split()
    assert taker_id != holder_id
    assert sorted(got) == [f"{i}:2" for i in range(5)]  # each redelivered once, receive_count 2
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        assert q.consumers() == {} and q.stats().in_flight == 0 and q.receive(10) == []


BUSY = textwrap.dedent(
    """
    import random, sys, time
    from journalq.queue import Broker

    root, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    out = sys.stdout
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        out.write(f"consumer {q.consumer_id}\\n")
        out.flush()
        while True:
            got = q.receive(rng.randint(1, 30), visibility_timeout=120)
            if not got:
                break
            out.write("recv " + " ".join(m.id for m in got) + "\\n")
            out.flush()
            time.sleep(rng.uniform(0, 0.003))  # "work", so that no round drains the queue
            if rng.random() < 0.5:
                for m in got:
                    q.delete(m.receipt)
            else:
                q.delete_many([m.receipt for m in got])
            out.write("del " + " ".join(m.id for m in got) + "\\n")
            out.flush()
    """
)


def test_process_killed_while_writing_state_leaves_it_recoverable(tmp_path: Path, child_env: dict) -> None:
    """Rounds of: a consumer in a busy receive/delete loop, killed at a random moment; the next
    round's process opens the channel and goes on. At the end nothing is lost and nothing was
    delivered twice while its visibility had not expired.

    A small append is one write(2), so a SIGKILL practically never tears one: every other round
    also leaves the torn tail of an event (the first bytes of a FINISH), as a process killed in
    the middle of that write would."""
    total, rounds = 20_000, 8
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs").send_many([b"%d" % i for i in range(total)])
    rng = random.Random(1234)
    received: collections.Counter[str] = collections.Counter()
    acked: set[str] = set()
    dead_consumers = []
    for round_ in range(rounds):
        child = spawn(BUSY, root, rng.randrange(1 << 30), env=child_env, stdout=subprocess.PIPE, text=True)
        try:
            first = child.stdout.readline()
            assert first.startswith("consumer "), first
            time.sleep(rng.uniform(0.1, 0.4))
            os.kill(child.pid, signal.SIGKILL)
            output = child.stdout.read()
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
        dead_consumers.append(first.split()[1])
        assert "\ndel " in "\n" + output, "a round did no work (after a torn tail?)"
        if round_ % 2:
            tear_state_tail(root / "jobs" / "channels" / "default", rng)
        for line in output.split("\n")[:-1]:  # the last piece may be a line cut by the kill
            kind, _, ids = line.partition(" ")
            if kind == "recv":
                received.update(ids.split())
            elif kind == "del":
                acked.update(ids.split())
    assert [i for i, n in received.items() if n > 1] == [], "delivered twice while hidden"
    assert acked, "the children did no work"
    with Broker(root, sync="none") as broker:
        q = broker.queue("jobs")
        held = q.consumers()
        assert set(held) <= set(dead_consumers)
        held_ids = {i for ids in held.values() for i in ids}
        states = {str(i): q.task(str(i)).state for i in range(total)}
        finished = {i for i, s in states.items() if s == "finished"}
        assert acked <= finished, "an acknowledged delete was lost"
        assert not finished & held_ids
        drained = []
        while got := q.receive(100, visibility_timeout=120):
            drained += [m.id for m in got]
            assert all(m.receive_count == 1 for m in got)
            q.delete_many([m.receipt for m in got])
    assert not set(drained) & finished, "a finished message was delivered again"
    assert not set(drained) & held_ids, "a hidden message was delivered again"
    assert not set(drained) & set(received), "a message delivered to a killed consumer came back early"
    assert len(drained) == len(set(drained))
    assert finished | held_ids | set(drained) == {str(i) for i in range(total)}, "lost messages"


def test_a_backlog_applied_out_of_the_lock_is_applied_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two consumers (two brokers: two processes' writers and locks) in turn, one of them taking
    many rounds between the other's: the other takes in that backlog out of the lock, while the
    first does another round (appended between the backlog and the hold). Every event is applied
    exactly once: its state is what a fresh process rebuilds from the journal, and each message
    is received once. (No compaction: a snapshot would hide an event applied twice before it.)"""
    monkeypatch.setattr(channel_module, "SNAPSHOT_SMALL_EVERY", channel_module.SNAPSHOT_EVERY)
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        qa.send_many([b"%d" % i for i in range(3000)])
        got: list[bytes] = []
        done = {"a": [], "b": []}

        def round_of(name: str, q) -> None:
            messages = q.receive(10, delete=done[name])
            done[name] = [m.receipt for m in messages]
            got.extend(m.body for m in messages)

        backlogs = []
        take = qb._take_backlog

        def take_then_let_a_go_on(messages) -> None:
            backlogs.append(len(messages))
            take(messages)
            round_of("a", qa)  # b is out of the lock now

        qb._writer.backlog_taker = take_then_let_a_go_on
        while True:
            for _ in range(8):  # a dozen events and more: a backlog for b
                round_of("a", qa)
            round_of("b", qb)
            if not done["a"] and not done["b"]:
                break
        assert len(backlogs) > 20
        assert sorted(got, key=int) == [b"%d" % i for i in range(3000)]
        qb.stats()  # b catches up with a's last rounds
        with Broker(tmp_path, sync="none") as c:
            fresh = c.queue("jobs").state
            assert qb.state.events_applied == fresh.events_applied
            assert qb.state.snapshot() == fresh.snapshot()


def test_a_backlog_whose_taking_in_failed_part_way_is_applied_once(tmp_path: Path) -> None:
    """Applying a backlog raises after some of its events (a MemoryError, say): the receive
    fails, and the next one rebuilds the state (the writer's ``backlog_lost``). Before, the
    events applied before the error were applied again: the state's count of them (which times
    compaction) ran ahead of a fresh process's."""
    with Broker(tmp_path, sync="none") as a, Broker(tmp_path, sync="none") as b:
        qa, qb = a.queue("jobs"), b.queue("jobs")
        qa.send_many([b"%d" % i for i in range(300)])
        got: list[bytes] = []
        done: dict[str, list[str]] = {"a": [], "b": []}

        def round_of(name: str, q) -> None:
            messages = q.receive(10, delete=done[name])
            done[name] = [m.receipt for m in messages]
            got.extend(m.body for m in messages)

        take = qb._take_backlog
        failures = []

        def take_failing_once(messages) -> None:
            state = qb.state
            if failures:
                take(messages)
                return
            applied = []

            def apply_then_fail(*record) -> int:
                if len(applied) == 5:
                    failures.append(len(applied))
                    raise MemoryError("applying the backlog")
                applied.append(record)
                return ChannelState.apply_record(state, *record)

            state.apply_record = apply_then_fail  # type: ignore[method-assign]
            try:
                take(messages)
            finally:
                del state.apply_record

        qb._writer.backlog_taker = take_failing_once
        round_of("b", qb)
        for _ in range(8):  # a backlog for b
            round_of("a", qa)
        with pytest.raises(MemoryError):
            round_of("b", qb)
        assert failures == [5]
        while True:
            for _ in range(8):
                round_of("a", qa)
            round_of("b", qb)
            if not done["a"] and not done["b"]:
                break
        assert sorted(got, key=int) == [b"%d" % i for i in range(300)]
        qb.stats()
        with Broker(tmp_path, sync="none") as c:
            fresh = c.queue("jobs").state
            assert qb.state.events_applied == fresh.events_applied
            assert qb.state.snapshot() == fresh.snapshot()


# -- deduplication in every process ----------------------------------------------------------------


def test_a_dedup_id_sent_again_after_its_window_is_deduplicated_in_every_process(broker: Broker) -> None:
    q = broker.queue("jobs", dedup_window=1.0)
    with Broker(broker.root, sync="none") as other_broker:
        other = other_broker.queue("jobs")
        assert q.send(b"a", dedup_id="X") == other.send(b"a again", dedup_id="X") == "0"
        time.sleep(1.1)  # the window of the first send is over: the id may be sent again
        again = q.send(b"b", dedup_id="X")
        assert again == "1"
        assert other.send(b"b again", dedup_id="X") == again  # was "2": stored twice
        with Broker(broker.root, sync="none") as fresh:  # one that reads the window from the journal
            assert fresh.queue("jobs").send(b"b once more", dedup_id="X") == again
    assert [m.body for m in q.receive(10)] == [b"a", b"b"]


def test_an_idle_poll_of_a_queue_run_dry_waits_for_no_lock(tmp_path: Path) -> None:
    """A receive that can tell, without the channel's lock, that there is nothing to give (every
    message it saw finished, none sent since) takes no lock: an idle poller neither waits for nor
    holds up the consumers at work (here another process's, holding the lock). It still
    publishes the cursor. A message sent since, and one in flight that may come back, are looked
    for under the lock."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send_many([b"one", b"two"])
        got = q.receive(2, visibility_timeout=0.2)
        q.delete_many([m.receipt for m in got])  # finished by a delete: the cursor not published
        assert read_offset(q.topic.path, q.name) == 0
        other_process = FileLock(lock_path(q.path))  # a lock of its own, as another process's
        assert other_process.try_acquire(wait=False)
        try:
            idle, got = _receiving(q)
            idle.join(5)
            assert got == [[]]
            assert read_offset(q.topic.path, q.name) == 2  # published all the same
            q.send(b"three")
            looking, got = _receiving(q)
            looking.join(0.5)
            assert looking.is_alive()  # looks for it under the lock: waits for it
        finally:
            other_process.release()
        looking.join(5)
        assert [[m.body for m in messages] for messages in got] == [[b"three"]]
        assert q.receive(1) == []  # in flight: looked for under the lock
        time.sleep(0.3)
        assert [m.body for m in q.receive(1)] == [b"three"]  # it came back


def _receiving(q: object) -> tuple[threading.Thread, list]:
    """``q.receive(1, visibility_timeout=0.2)`` started in a thread, and the list that gets what
    it returns."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(q.receive(1, visibility_timeout=0.2)), daemon=True)
    thread.start()
    return thread, got
