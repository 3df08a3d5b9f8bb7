"""Locking: one exclusive writer at a time, shared writers appending together, killed writers."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

import journalq.journal.index as index_mod
import journalq.journal.recovery as recovery_mod
from journalq.errors import BusyError, Error, LockedError, StorageError
from journalq.journal import Scanner, Writer
from journalq.journal import writer as writer_mod
from journalq.journal.codec import encode
from journalq.journal.inspect import check
from journalq.journal.lock import FileLock
from journalq.journal.segment import list_segments, lock_path, segment_at
from journalq.journal.writer import BACKLOG_BYTES, held
from conftest import journal_values, small_journal

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def scan_all(path: Path):
    with Scanner(path, 0) as s:
        return list(s)


def run_child(script: str, *args, env, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


TRY_OPEN = """
    import sys
    from journalq.journal import Writer, LockedError
    try:
        w = Writer(sys.argv[1], shared=sys.argv[2] == "shared")
    except LockedError as e:
        print("LockedError:", e)
    else:
        print("opened", w.append(b"from child"))
        w.close()
"""


# -- exclusive writers -----------------------------------------------------------------------


def test_second_exclusive_writer_in_the_same_process(tmp_path):
    first = Writer(tmp_path)
    first.append(b"a")
    with pytest.raises(LockedError) as info:
        Writer(tmp_path)
    message = str(info.value)
    assert "another writer holds the lock" in message
    assert f"exclusive writer, pid {os.getpid()}" in message
    assert str(tmp_path / "jnl.lck") in message
    assert info.value.file == tmp_path / "jnl.lck"
    first.append(b"b")  # the refused writer did not disturb the first
    first.close()
    with Writer(tmp_path) as second:
        assert second.append(b"c") == 2
    assert [m.value for m in scan_all(tmp_path)] == [b"a", b"b", b"c"]


def test_second_exclusive_writer_in_another_process(tmp_path, child_env):
    first = Writer(tmp_path)
    first.append(b"a")
    result = run_child(TRY_OPEN, tmp_path, "exclusive", env=child_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("LockedError: another writer holds the lock")
    assert f"pid {os.getpid()}" in result.stdout
    first.close()
    result = run_child(TRY_OPEN, tmp_path, "exclusive", env=child_env)
    assert result.stdout.strip() == "opened 1", result.stderr
    assert [m.value for m in scan_all(tmp_path)] == [b"a", b"from child"]


def test_a_writer_in_another_process_blocks_this_one_until_it_exits(tmp_path, child_env):
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from journalq.journal import Writer\n"
         "w = Writer(sys.argv[1]); w.append(b'child'); print('ready', flush=True); sys.stdin.readline(); w.close()",
         str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(LockedError, match=f"exclusive writer, pid {child.pid}"):
            Writer(tmp_path)
        with pytest.raises(LockedError, match="an exclusive writer holds the journal; shared writers cannot join"):
            Writer(tmp_path, shared=True)
        child.stdin.write("close\n")
        child.stdin.flush()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with Writer(tmp_path) as w:
        assert w.append(b"parent") == 1


def test_a_killed_exclusive_writer_leaves_the_lock_free(tmp_path, child_env):
    result = run_child(
        "import os, signal, sys\nfrom journalq.journal import Writer\n"
        "w = Writer(sys.argv[1]); w.append(b'x'); os.kill(os.getpid(), signal.SIGKILL)",
        tmp_path,
        env=child_env,
    )
    assert result.returncode == -signal.SIGKILL
    with Writer(tmp_path) as w:
        assert w.append(b"y") == 1


# -- shared writers --------------------------------------------------------------------------


def test_shared_writer_refused_while_an_exclusive_writer_holds_the_journal(tmp_path, child_env):
    exclusive = Writer(tmp_path)
    with pytest.raises(LockedError) as info:
        Writer(tmp_path, shared=True)
    assert "an exclusive writer holds the journal; shared writers cannot join it" in str(info.value)
    assert f"pid {os.getpid()}" in str(info.value)
    result = run_child(TRY_OPEN, tmp_path, "shared", env=child_env)
    assert "LockedError: an exclusive writer holds the journal" in result.stdout, result.stderr
    exclusive.close()
    with Writer(tmp_path, shared=True) as shared:
        assert shared.append(b"x") == 0


def test_exclusive_writer_between_shared_appends(tmp_path):
    shared = Writer(tmp_path, shared=True)
    shared.append(b"s0")
    exclusive = Writer(tmp_path)  # the lock is free between shared appends
    exclusive.append(b"e1")
    with pytest.raises(LockedError, match="an exclusive writer holds the journal"):
        shared.append(b"lost")
    exclusive.append(b"e2")
    exclusive.close()
    assert shared.append(b"s3") == 3  # caught up with the exclusive writer's appends
    shared.close()
    assert [m.value for m in scan_all(tmp_path)] == [b"s0", b"e1", b"e2", b"s3"]


def test_a_shared_writer_follows_a_segment_another_started_early(tmp_path):
    """A hub's copy starts a segment where its source did, before the current one is full: the
    other shared writers must append there, not to the segment they last saw unchanged."""
    one, two = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    one.append(b"a")
    two.append(b"b")  # two has seen segment 0 too
    one.append_encoded(encode(2, 5, 0, b"", b"c"), new_segment=True)  # segment 2, segment 0 unchanged
    assert two.append(b"d") == 3
    one.close()
    two.close()
    assert sorted(p.name for p in (tmp_path / "jnl").glob("*.jnl")) == ["0000000000000000.jnl", "0000000000000002.jnl"]
    assert [m.value for m in scan_all(tmp_path)] == [b"a", b"b", b"c", b"d"]


def counted_access(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names a writer looks up (``os.access``) from now on, for a new segment."""
    looked: list[str] = []
    real = os.access

    def access(path, *args, **kwargs):  # noqa: ANN001, ANN202
        looked.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(writer_mod.os, "access", access)
    return looked


def test_a_rolls_only_writer_looks_for_a_new_segment_only_after_others_appended(tmp_path, monkeypatch):
    """``rolls_only`` (a queue's state journal): only a writer that appends to a segment starts
    the next, by filling it, so a hold that finds the segment as this writer left it looks up no
    new name in the directory (a lookup of a name never seen, at every hold, cost ~3 µs of a
    receive's ~9 µs a message). After another's appends it looks, and follows its roll; without
    the promise, every hold looks, as it must for segments started early (above)."""
    size = 3 * 27 + 3 * 126  # three one-byte messages, then three of 100 bytes fill a segment
    promised = Writer(tmp_path, shared=True, segment_size=size, rolls_only=True)
    other = Writer(tmp_path, shared=True, segment_size=size, rolls_only=True)
    plain = Writer(tmp_path, shared=True, segment_size=size)
    promised.append(b"a")
    looked = counted_access(monkeypatch)
    for value in (b"b", b"c"):
        promised.append(value)
        with promised.hold():
            pass
    assert looked == []
    with plain.hold():
        pass
    assert looked  # (at its next offset, 3)
    looked.clear()
    with plain.hold():
        pass
    assert looked, "a writer without the promise looks at every hold"
    other.append_many([bytes(100)] * 3)  # offsets 3-5 fill segment 0; segment 6 begins
    assert other.segment.base == 6
    looked.clear()
    assert promised.append(b"g") == 6
    assert promised.segment.base == 6 and looked
    for w in (promised, other, plain):
        w.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(7))


def test_a_rolls_only_writer_follows_a_roll_at_the_end_of_a_backlog(tmp_path):
    """The others' backlog, read out of the lock, ended with a roll: the segment this writer
    then holds is as long as it read it, but the next one began, and the hold must find it."""
    a = Writer(tmp_path, shared=True, segment_size=28 + 40 * 130, rolls_only=True)
    b = Writer(tmp_path, shared=True, segment_size=28 + 40 * 130, rolls_only=True)
    a.append(b"a0")
    taken: list[int] = []
    a.backlog_taker = lambda messages: taken.extend(m.offset for m in messages)
    b.append_many(backlog_values(b"b", 40))  # 130 bytes each: b fills segment 0 with the last, and rolls
    assert b.segment.base == 41
    assert a.append(b"a41") == 41
    assert taken == list(range(1, 41)) and a.segment.base == 41
    a.close()
    b.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(42))


def backlog_values(name: bytes, count: int) -> list[bytes]:
    """Messages of one size whose bytes, ``count`` of them, make more than a backlog."""
    values = [name + b"%03d" % i + bytes(100) for i in range(count)]
    assert sum(len(v) for v in values) > BACKLOG_BYTES
    return values


def test_a_backlog_is_handed_out_of_the_lock_and_the_catch_up_reads_only_what_came_after(tmp_path):
    """A shared writer with a ``backlog_taker`` that finds more than ``BACKLOG_BYTES`` appended by
    the others lets the lock go, hands the whole messages to the taker, and takes the lock again:
    what others appended meanwhile is caught up under it, nothing twice, nothing skipped."""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    handed: list[list] = []

    def take(messages: list) -> None:
        assert not a._lock.held  # out of the lock: another writer may append now
        handed.append(list(messages))
        b.append_many([b"meanwhile %d" % i for i in range(3)])

    a.backlog_taker = take
    b.append_many(backlog_values(b"b", 40))
    with a.hold():
        (backlog,) = handed
        assert [(m.offset, m.value[:4]) for m in backlog] == [(1 + i, b"b%03d" % i) for i in range(40)]
        assert [(m.offset, m.value) for m in a.caught_up] == [(41 + i, b"meanwhile %d" % i) for i in range(3)]
        assert a.append(b"a1") == 44
    assert not a.backlog_lost
    b.append(b"small")  # a few bytes: caught up under the lock, as ever
    with a.hold():
        assert len(handed) == 1
        assert [m.value for m in a.caught_up] == [b"small"]
    a.close()
    b.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(46))
    with Writer(tmp_path) as again:
        assert again.recoveries == []


def test_a_backlog_taken_back_after_it_was_handed_out_is_read_again(tmp_path):
    """A writer whose append fails (a full disk) takes back what it wrote, under its lock: when
    another writer had read those bytes out of the lock, its catch-up finds them changed (here
    written over by as many bytes, so that the size alone would not tell), reads on from before
    them and sets ``backlog_lost`` for the taker to rebuild."""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    start = a.segment.path.stat().st_size
    handed: list[list] = []

    def take(messages: list) -> None:
        handed.append(list(messages))
        os.truncate(a.segment.path, start)  # b's batch taken back ...
        with Writer(tmp_path, shared=True) as c:  # ... and another writer's in its place
            c.append_many(backlog_values(b"c", 40))

    a.backlog_taker = take
    b.append_many(backlog_values(b"b", 40))
    with a.hold():
        assert [m.value[:4] for m in handed[0]] == [b"b%03d" % i for i in range(40)]
        assert a.backlog_lost
        assert [(m.offset, m.value[:4]) for m in a.caught_up] == [(1 + i, b"c%03d" % i) for i in range(40)]
        assert a.append(b"a1") == 41
    a.close()
    b.close()
    assert [m.value[:4] for m in scan_all(tmp_path)] == [b"a0"] + [b"c%03d" % i for i in range(40)] + [b"a1"]


def test_a_torn_message_is_not_handed_out_with_a_backlog(tmp_path):
    """A writer killed mid-append leaves a torn message: the backlog handed out of the lock stops
    before it, and the catch-up under the lock cuts it, as it did before."""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    handed: list[list] = []
    a.backlog_taker = lambda messages: handed.append(list(messages))
    b.append_many(backlog_values(b"b", 40))
    torn = encode(41, 5, 0, b"", b"torn" + bytes(100))
    with open(a.segment.path, "ab") as f:
        f.write(torn[:-10])
    with a.hold():
        assert [m.offset for m in handed[0]] == list(range(1, 41))
        assert a.caught_up == []
        assert len(a.recoveries) == 1
        assert a.append(b"a1") == 41
    a.close()
    b.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(42))


def test_a_backlog_whose_taker_raised_is_read_again_and_marked_lost(tmp_path):
    """A taker that raises (a damaged event, a MemoryError) may have taken in some of the backlog,
    not all: the hold raises with the lock let go, ``backlog_lost`` tells the taker to rebuild, and
    the next catch-up reads those messages again. (Before, the writer went on past them: a
    channel, whose count of applied events had not moved, read them again from its journal and
    applied twice those it had taken in before the error.)"""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    taken: list[int] = []

    def take(messages: list) -> None:
        taken.extend(m.offset for m in messages[:5])
        raise MemoryError("taking in the backlog")

    a.backlog_taker = take
    b.append_many(backlog_values(b"b", 40))
    with pytest.raises(MemoryError):
        with a.hold():
            pass
    assert taken == [1, 2, 3, 4, 5]
    assert not a._lock.held
    probe = FileLock(tmp_path / "jnl.lck")
    assert probe.try_acquire(wait=False)  # the lock is free
    probe.close()
    assert a.backlog_lost
    a.backlog_taker = None
    with a.hold():
        assert [m.offset for m in a.caught_up] == list(range(1, 41))
        assert a.append(b"a1") == 41
    a.close()
    b.close()
    assert [m.offset for m in scan_all(tmp_path)] == list(range(42))


def test_a_backlog_left_unchecked_is_checked_before_another_is_read(tmp_path):
    """A hold that handed out a backlog and then failed to take the lock again (interrupted while
    it waited) leaves that backlog unchecked: the next hold checks it under the lock before it
    reads another out of it. Here it was taken back and written over meanwhile, and more came
    after: before, the next backlog was read from its end and its check took the place of the
    first one's, so ``backlog_lost`` never told the taker."""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    start = a.segment.path.stat().st_size
    handed: list[list] = []
    a.backlog_taker = lambda messages: handed.append([m.value[:4] for m in messages])
    b.append_many(backlog_values(b"b", 40))
    take_lock = a._take_shared_lock
    takes: list[int] = []

    def interrupted_the_second_time() -> None:
        takes.append(1)
        if len(takes) == 2:  # after the backlog
            raise KeyboardInterrupt
        take_lock()

    a._take_shared_lock = interrupted_the_second_time  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        with a.hold():
            pass
    del a._take_shared_lock
    assert handed == [[b"b%03d" % i for i in range(40)]]
    os.truncate(a.segment.path, start)  # b's batch taken back ...
    with Writer(tmp_path, shared=True) as c:  # ... another's in its place, as long, and more
        c.append_many(backlog_values(b"c", 40))
        c.append_many(backlog_values(b"d", 40))
    with a.hold():
        assert a.backlog_lost
        assert [m.value[:4] for m in a.caught_up] == [b"c%03d" % i for i in range(40)] + [
            b"d%03d" % i for i in range(40)
        ]
        assert a.append(b"a1") == 81
    a.close()
    b.close()


def test_held_reopens_again_when_the_reopened_segment_is_collected_too(tmp_path):
    """``held``: the writer ``reopen`` gives for one whose segment was collected takes the lock
    again only when held; another process's compaction may collect its segment too in between
    (found by tests/test_queue_crash_stress.py). The hold reopens until it holds."""

    def grow_roll_and_collect(writer):
        # Another process appends to ``writer``'s segment until it rolls, then deletes it.
        gone = writer.segment
        while writer.segment == gone:
            writer.append(b"y" * 40)
        gone.path.unlink()
        gone.index_path.unlink(missing_ok=True)

    with (
        Writer(tmp_path, shared=True, segment_size=200) as mine,
        Writer(tmp_path, shared=True, segment_size=200) as other,
    ):
        mine.append(b"x")
        grow_roll_and_collect(other)
        reopened = []

        def reopen():
            reopened.append(Writer(tmp_path, shared=True, segment_size=200))
            if len(reopened) == 1:
                reopened[0].append(b"z")  # it has read its segment: the other's appends are new
                grow_roll_and_collect(other)  # before the hold takes the lock again
            return reopened[-1]

        with held(mine, reopen) as writer:
            assert writer is reopened[-1] and len(reopened) == 2
            assert writer.next_offset == other.next_offset
            last = writer.append(b"last")
        for w in reopened:
            w.close()
    with Scanner(tmp_path, last) as scanner:
        assert [m.value for m in scanner] == [b"last"]


def test_a_shared_writer_whose_directory_was_moved_away_never_joins_the_new_one(tmp_path):
    """A queue deleted (its directory renamed away) and made again under the same name: a shared
    writer of the old one, still open in some process, must not take a segment of the new journal
    for one started in its own (it looks for them in its own directory first)."""
    old = Writer(tmp_path / "q", shared=True)
    old.append(b"a")
    old.append(b"b")  # next offset 2
    (tmp_path / "q").rename(tmp_path / "gone")
    new = Writer(tmp_path / "q", shared=True)
    new.append(b"A")
    new.append(b"B")
    new.append_encoded(encode(2, 5, 0, b"", b"C"), new_segment=True)  # the new journal's segment 2
    assert old.append(b"c") == 2
    old.close()
    new.close()
    assert [m.value for m in scan_all(tmp_path / "q")] == [b"A", b"B", b"C"]
    assert [m.value for m in scan_all(tmp_path / "gone")] == [b"a", b"b", b"c"]


def _append_in_thread(writer: Writer, value: bytes):
    result: dict = {}

    def run():
        try:
            result["offset"] = writer.append(value)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def check_shared_writers_wait_for_each_other(path: Path, meanwhile: Callable[[], object] = lambda: None) -> None:
    a = Writer(path, shared=True)
    b = Writer(path, shared=True)
    meanwhile()  # what happens to the journal while these two run
    base = a.append(b"a0")
    # Another shared writer in the middle of an append holds the lock now.
    holder = FileLock(path / "jnl.lck")
    holder.acquire()
    thread, result = _append_in_thread(b, b"b1")
    thread.join(0.3)
    holder.release()
    thread.join(30)
    holder.close()
    assert not thread.is_alive()
    assert "error" not in result, f"a shared writer was refused by another shared writer: {result.get('error')}"
    assert result["offset"] == base + 1
    assert a.append(b"a2") == base + 2
    a.close()
    b.close()
    assert [m.value for m in scan_all(path)][-3:] == [b"a0", b"b1", b"a2"]


def test_shared_writers_wait_for_each_other(tmp_path):
    check_shared_writers_wait_for_each_other(tmp_path)


def test_shared_writers_wait_for_each_other_after_an_exclusive_writer_closed(tmp_path):
    with Writer(tmp_path) as w:
        w.append(b"exclusive")
    check_shared_writers_wait_for_each_other(tmp_path)


def kill_an_exclusive_writer(path: Path, env: dict[str, str]) -> None:
    result = run_child(
        "import os, signal, sys\nfrom journalq.journal import Writer\n"
        "w = Writer(sys.argv[1]); w.append(b'x'); os.kill(os.getpid(), signal.SIGKILL)",
        path,
        env=env,
    )
    assert result.returncode == -signal.SIGKILL


def test_shared_writers_wait_for_each_other_after_an_exclusive_writer_was_killed(tmp_path, child_env):
    kill_an_exclusive_writer(tmp_path, child_env)
    check_shared_writers_wait_for_each_other(tmp_path)


def test_running_shared_writers_wait_for_each_other_after_an_exclusive_writer_was_killed(tmp_path, child_env):
    """The killed exclusive writer's note stays in the lock file, and shared writers that were
    running already (idle while it lived) do not open again to clear it: they must not take it
    for a live exclusive writer whenever another shared writer holds the lock."""
    check_shared_writers_wait_for_each_other(tmp_path, lambda: kill_an_exclusive_writer(tmp_path, child_env))


def test_shared_writers_wait_for_each_other_after_an_exclusive_writer_failed_to_open(tmp_path, monkeypatch):
    """An exclusive writer that took the lock, wrote its note and then failed to open (here: its
    segments could not be listed) left the note behind: shared writers already running took it
    for a live exclusive writer, and refused to append while another shared writer held the lock."""

    def failed_exclusive_open() -> None:
        with monkeypatch.context() as patch:
            patch.setattr(writer_mod, "list_segments", _too_many_open_files)
            with pytest.raises(OSError):
                Writer(tmp_path)

    check_shared_writers_wait_for_each_other(tmp_path, failed_exclusive_open)


def _too_many_open_files(path: object) -> list:
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


SHARED_CHILD = """
    import os, random, signal, sys
    import journalq.journal.writer as writer_mod
    from journalq.journal import Writer

    path, wid, ops, seed, die_after = (
        sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    )

    class Dying:
        # The writer's os, whose write() puts half the bytes in and then kills the process.
        def __getattr__(self, name):
            return getattr(os, name)

        def write(self, fd, data):
            os.write(fd, bytes(data[: max(1, len(data) // 2)]))
            os.kill(os.getpid(), signal.SIGKILL)

    w = Writer(path, shared=True, segment_size=2048)
    print("ready", flush=True)
    sys.stdin.readline()
    rng = random.Random(seed)
    seq = 0
    out = []
    for op in range(ops):
        if op == die_after:
            writer_mod.os = Dying()
        if rng.random() < 0.5:
            offset = w.append(b"w%d-%d;" % (wid, seq) + b"." * rng.randrange(100))
            print(offset, seq, 1, flush=True)
            seq += 1
        else:
            n = rng.randint(2, 5)
            last = w.append_many([b"w%d-%d;" % (wid, seq + i) + b"." * rng.randrange(100) for i in range(n)])
            print(last - n + 1, seq, n, flush=True)
            seq += n
    w.close()
    print("done", seq, len(w.recoveries), flush=True)
"""


def run_shared_writers(path: Path, env, ops: list[int], die_after: dict[int, int]):
    children = []
    for wid, n in enumerate(ops):
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(SHARED_CHILD), str(path), str(wid), str(n),
                 str(1000 + wid), str(die_after.get(wid, -1))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
        )
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        for child in children:  # all at once
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return [(child.returncode, out, err) for child, (out, err) in zip(children, outputs)]


def parse_acks(out: str):
    acks, done = [], None
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "done":
            done = (int(parts[1]), int(parts[2]))
        else:
            acks.append(tuple(map(int, parts)))
    return acks, done


def check_shared_journal(path: Path, results, die_after: dict[int, int]):
    messages = scan_all(path)
    assert [m.offset for m in messages] == list(range(len(messages))), "offsets are not dense"
    by_writer: dict[int, list[tuple[int, int]]] = {}
    for m in messages:
        head = m.value.split(b";")[0]
        wid, seq = map(int, head[1:].split(b"-"))
        by_writer.setdefault(wid, []).append((seq, m.offset))
    recoveries = 0
    for wid, (code, out, err) in enumerate(results):
        acks, done = parse_acks(out)
        seen = by_writer.get(wid, [])
        seqs = [seq for seq, _ in seen]
        assert seqs == sorted(set(seqs)), f"writer {wid}: messages repeated or out of order"
        where = dict(seen)
        for offset, seq, n in acks:  # every acknowledged message, a batch at consecutive offsets
            for i in range(n):
                assert where.get(seq + i) == offset + i, f"writer {wid}: seq {seq + i} not at {offset + i}"
        if wid in die_after:
            assert code == -signal.SIGKILL, err
            assert done is None
            acked = sum(n for _, _, n in acks)
            # Its last, torn append was a single message or a batch of at most 5: whole messages
            # at its start may be kept (a crash is not an I/O error: no take-back), never more.
            assert seqs == list(range(len(seqs))), f"writer {wid}: messages missing or out of order"
            assert acked <= len(seqs) < acked + 5
        else:
            assert code == 0, err
            total, recovered = done
            assert seqs == list(range(total)), f"writer {wid}: not every message is there exactly once"
            recoveries += recovered
    return messages, recoveries


def test_four_shared_writer_processes_append_at_once(tmp_path, child_env):
    path = tmp_path / "journal"
    with Writer(path) as w:  # made by an exclusive writer first, as a journal often is
        w.append(b"w9-0;")
    results = run_shared_writers(path, child_env, [200, 200, 200, 200], {})
    messages, recoveries = check_shared_journal(path, results, {})
    assert recoveries == 0
    assert len(messages) > 800
    segments = sorted((path / "jnl").glob("*.jnl"))
    assert len(segments) > 10, "the writers should have rolled segments"
    for s in segments:  # each segment starts at the offset its name says
        data = s.read_bytes()
        if data:
            assert int.from_bytes(data[:8], "big") == int(s.stem, 16)


def test_a_shared_writer_killed_mid_append_is_recovered_by_the_others(tmp_path, child_env):
    path = tmp_path / "journal"
    die_after = {0: 25}
    results = run_shared_writers(path, child_env, [200, 300, 300, 300], die_after)
    messages, recoveries = check_shared_journal(path, results, die_after)
    assert recoveries == 1, "exactly one surviving writer should have cut the torn append"
    cut = list((path / "cut").iterdir())
    assert len(cut) == 1
    torn = cut[0].read_bytes()
    assert 0 < len(torn) < len(encode(0, 0, 0, b"", b"w0-0;" + b"." * 100)) * 5
    assert torn[:8] != b"" and cut[0].name.split("@")[0] in {p.name for p in (path / "jnl").glob("*.jnl")}
    with Writer(path) as w:
        assert w.recoveries == []
        assert w.next_offset == len(messages)


def test_an_idle_shared_writer_whose_segment_and_the_next_were_collected_appends_at_the_end(tmp_path):
    """A shared writer idle on a segment it read to the end, while another started the next
    segment early (as a hub's copy does where its source did) and went on past it, and both
    segments were collected since. Its catch-up finds its segment deleted with nothing appended
    after its end, and no segment where its next offset would begin one. Before, it then appended
    to the deleted segment: the message was answered as stored and lost. Now the hold reopens at
    the journal's end. (Without an early segment a full one is rolled in the append that fills
    it, so a writer that read it to the end finds the next.)"""
    with (
        Writer(tmp_path, shared=True, segment_size=200) as idle,
        Writer(tmp_path, shared=True, segment_size=200) as busy,
    ):
        idle.append(b"early")  # offset 0, segment 0
        busy.append_encoded(encode(1, 5, 0, b"", b"c"), new_segment=True)  # segment 1 begins early
        with idle.hold():
            pass  # it reads segment 0 to its end, and goes on in segment 1
        assert idle.segment.base == 1
        busy.append_encoded(encode(2, 5, 0, b"", b"d"), new_segment=True)  # segment 2
        busy.append_encoded(encode(3, 5, 0, b"", b"e"), new_segment=True)  # segment 3, the last
        for segment in list_segments(tmp_path)[:-1]:  # collected: all but the last
            segment.path.unlink()
            segment.index_path.unlink(missing_ok=True)
        end = busy.next_offset
        reopened = []

        def reopen():
            reopened.append(Writer(tmp_path, shared=True, segment_size=200))
            return reopened[-1]

        with held(idle, reopen) as writer:
            last = writer.append(b"late")
        assert last == end and writer is reopened[0]
        for w in reopened:
            w.close()
    with Scanner(tmp_path, last) as scanner:
        assert [m.value for m in scanner] == [b"late"]


def test_a_backlog_taken_back_before_its_segment_was_deleted_is_reported_lost(tmp_path):
    """The backlog handed out was taken back and written over, and then another process's
    compaction started a new segment and deleted this one, all before the hold took the lock
    again. The catch-up cannot go on in a deleted segment (``FileNotFoundError``), but it still
    compares the backlog through its descriptor and sets ``backlog_lost``, and ``held`` hands
    that to the writer that it reopens, for the taker to rebuild. (Before, the deletion was
    noticed first and the backlog never checked: a channel kept events that were taken back.)"""
    a, b = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    a.append(b"a0")
    start = a.segment.path.stat().st_size
    first = a.segment

    def take(messages: list) -> None:
        os.truncate(first.path, start)  # b's batch taken back ...
        with Writer(tmp_path, shared=True) as c:  # ... another's in its place, as long ...
            c.append_many(backlog_values(b"c", 40))
            c.append_encoded(encode(41, 5, 0, b"", b"snapshot"), new_segment=True)  # ... then compacted
        first.path.unlink()
        first.index_path.unlink(missing_ok=True)

    a.backlog_taker = take
    b.append_many(backlog_values(b"b", 40))
    with pytest.raises(FileNotFoundError):
        with a.hold():
            pass
    assert a.backlog_lost
    reopened: list[Writer] = []

    def reopen() -> Writer:
        reopened.append(Writer(tmp_path, shared=True))
        return reopened[-1]

    with held(a, reopen) as writer:
        assert writer is reopened[0] and writer is not a
        assert writer.backlog_lost
        assert writer.append(b"a1") == 42
    writer.close()
    b.close()
    with Scanner(tmp_path, 41) as rest:
        assert [(m.offset, m.value) for m in rest] == [(41, b"snapshot"), (42, b"a1")]


# -- a storage failure while a shared writer catches up ----------------------------------------


def _failing(err: int) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise OSError(err, os.strerror(err))

    return fail


def test_a_read_failure_at_a_shared_writers_catch_up_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    mine.append(b"one")
    other.append(b"two")  # read by ``mine`` at its next append
    with monkeypatch.context() as patched:
        patched.setattr(os, "pread", _failing(errno.EIO))
        # It was the bare OSError, naming no file.
        with pytest.raises(StorageError, match="Input/output error") as info:
            mine.append(b"three")
    assert info.value.errno == errno.EIO
    assert info.value.file == mine.segment.path and info.value.offset == 1
    assert "nothing was appended" in str(info.value)
    assert not mine.failed
    assert mine.append(b"three") == 2  # the lock was let go, and the catch-up is done again
    other.append(b"four")
    for writer in (mine, other):
        writer.close()
    with Scanner(tmp_path) as scanner:
        assert [m.value for m in scanner] == [b"one", b"two", b"three", b"four"]


@pytest.mark.parametrize("shared", [False, True])
def test_a_read_failure_opening_a_writer_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    with Writer(tmp_path) as first:
        first.append_many([b"one", b"two"])
        segment = first.segment.path
    with monkeypatch.context() as patched:
        patched.setattr(os, "pread", _failing(errno.EIO))
        # It was the bare OSError, naming no file.
        with pytest.raises(StorageError, match="Input/output error") as info:
            Writer(tmp_path, shared=shared)
    assert info.value.errno == errno.EIO and info.value.file == segment
    with Writer(tmp_path, shared=shared) as again:  # nothing held, nothing lost
        assert again.append(b"three") == 2
    with Scanner(tmp_path) as scanner:
        assert [m.value for m in scanner] == [b"one", b"two", b"three"]


def test_a_full_disk_opening_the_segment_another_shared_writer_started_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = Writer(tmp_path, shared=True, segment_size=100), Writer(tmp_path, shared=True, segment_size=100)
    mine.append(b"v" * 20)
    other.append_many([b"w" * 20] * 3)  # 46 bytes each: offset 3 starts the next segment
    assert other.segment.base == 3 and mine.segment.base == 0
    real_open_index = index_mod.open_index

    def full_disk(segment: object, flags: int = os.O_RDONLY) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(other.segment.index_path))
        return real_open_index(segment, flags)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        patched.setattr(index_mod, "open_index", full_disk)
        with pytest.raises(StorageError, match="No space left on device") as info:
            mine.append(b"x")
    assert info.value.errno == errno.ENOSPC
    assert (info.value.file, info.value.offset) == (other.segment.index_path, 3)
    assert mine.append(b"x") == 4 and mine.segment.base == 3
    for writer in (mine, other):
        writer.close()
    with Scanner(tmp_path) as scanner:
        assert [m.offset for m in scanner] == [0, 1, 2, 3, 4]


def test_a_shared_writer_that_cannot_open_the_segment_another_started_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up that went on to the segment another writer started, and could not open it
    (too many open files), had closed the segment it was on: every later append failed with
    EBADF, for good, and ``failed`` did not say so. It now stays on its segment until the next
    one is open, and the next append goes on."""
    import journalq.journal.writer as writer_mod

    first = Writer(tmp_path, shared=True, segment_size=100)
    second = Writer(tmp_path, shared=True, segment_size=100)
    first.append(b"x" * 40)
    second.append(b"y" * 40)  # 66 + 66 bytes: the second rolls, and starts segment 2
    real = writer_mod.IndexAppender
    failures = [OSError(errno.EMFILE, os.strerror(errno.EMFILE))]

    def index_appender(*args: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(writer_mod, "IndexAppender", index_appender)
    with pytest.raises(OSError, match="Too many open files"):
        first.append(b"lost")
    assert not failures and not first.failed
    assert first.append(b"z") == 2
    assert second.append(b"w") == 3
    first.close()
    second.close()
    assert journal_values(tmp_path) == [b"x" * 40, b"y" * 40, b"z", b"w"]


def test_a_shared_writer_clears_a_dead_exclusive_writers_note_when_it_takes_the_lock(tmp_path):
    """The note a killed exclusive writer left in jnl.lck stayed when a shared writer that was
    open already took the lock for its appends: once the dead writer's pid was reused, a writer
    that found the lock held (for one append) read the note and refused with a ``LockedError``
    naming the dead holder, instead of waiting for the append."""
    shared = Writer(tmp_path, shared=True)
    try:
        # What a killed exclusive writer leaves, its pid since reused by a live process (this one).
        FileLock(lock_path(tmp_path)).write_note(f"exclusive writer, pid {os.getpid()}")
        shared.append(b"after the exclusive writer died")
        assert FileLock(lock_path(tmp_path)).read_note() == ""
        opened: list[object] = []

        def open_another() -> None:
            try:
                Writer(tmp_path, shared=True).close()
                opened.append("opened")
            except Error as exc:
                opened.append(exc)

        with shared.hold():  # another shared writer's append in progress
            other = threading.Thread(target=open_another)
            other.start()
            time.sleep(0.2)
        other.join(10)
        assert opened == ["opened"]
    finally:
        shared.close()


# -- a torn tail cut on a full disk: a shared writer's catch-up, a writer's opening -------------


class _FullFile:
    """A cut file on a full disk: part of what is written goes in, then ENOSPC."""

    def __init__(self, real: BinaryIO) -> None:
        self._real = real

    def write(self, data: bytes) -> int:
        self._real.write(data[: len(data) // 2])
        self._real.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


def _torn_tail(writer: Writer, offset: int) -> bytes:
    """What a shared writer killed mid-append leaves: the first 60 bytes of message ``offset``."""
    torn = encode(offset, 1, 0, b"", b"x" * 100)[:60]
    with open(writer.segment.path, "ab") as segment:
        segment.write(torn)
    return torn


def test_a_full_disk_while_a_shared_writer_cuts_a_torn_tail_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(tmp_path, shared=True)
    writer.append(b"one")
    size = writer.segment.path.stat().st_size
    torn = _torn_tail(writer, 1)
    real_new_file = recovery_mod._new_file
    monkeypatch.setattr(recovery_mod, "_new_file", lambda *a: (lambda p, f: (p, _FullFile(f)))(*real_new_file(*a)))
    # It was a bare OSError, naming no file, out of the append.
    with pytest.raises(StorageError, match="No space left on device") as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC
    assert info.value.file == writer.segment.path and info.value.position == size
    assert "nothing was cut" in str(info.value)
    # Nothing cut, nothing half saved: the segment holds what it held, torn tail too.
    assert writer.segment.path.read_bytes()[size:] == torn
    assert not any((tmp_path / "cut").iterdir())
    assert writer.recoveries == []
    monkeypatch.setattr(recovery_mod, "_new_file", real_new_file)  # room again
    assert writer.append(b"two") == 1
    [recovery] = writer.recoveries
    assert recovery.saved_to.read_bytes() == torn
    writer.close()
    assert journal_values(tmp_path) == [b"one", b"two"]


def test_a_full_disk_while_opening_cuts_a_torn_tail_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Writer(tmp_path) as writer:
        writer.append(b"one")
        torn = _torn_tail(writer, 1)
    real_new_file = recovery_mod._new_file
    monkeypatch.setattr(recovery_mod, "_new_file", lambda *a: (lambda p, f: (p, _FullFile(f)))(*real_new_file(*a)))
    with pytest.raises(StorageError, match="No space left on device") as info:
        Writer(tmp_path)
    assert info.value.errno == errno.ENOSPC and info.value.file == segment_at(tmp_path, 0).path
    assert segment_at(tmp_path, 0).path.read_bytes().endswith(torn)
    assert not any((tmp_path / "cut").iterdir())
    monkeypatch.setattr(recovery_mod, "_new_file", real_new_file)
    with Writer(tmp_path) as writer:
        assert writer.append(b"two") == 1
    assert journal_values(tmp_path) == [b"one", b"two"]


def test_a_shared_writer_on_a_really_full_disk_cuts_a_torn_tail_once_there_is_room(tmpfs: Path) -> None:
    writer = Writer(tmpfs / "j", shared=True)
    writer.append(b"one")
    torn = _torn_tail(writer, 1)
    filler = tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to its last byte
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(StorageError) as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC
    assert writer.segment.path.read_bytes().endswith(torn)
    filler.unlink()
    assert writer.append(b"two") == 1
    writer.close()
    assert journal_values(tmpfs / "j") == [b"one", b"two"]


def test_a_full_disk_at_the_reservation_after_a_shared_writers_cut_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import journalq.journal.writer as writer_mod

    writer = Writer(tmp_path, shared=True)
    writer.append(b"one")
    torn = _torn_tail(writer, 1)

    def full(fd: int, offset: int, length: int) -> bool:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_mod, "reserve", full)
    with pytest.raises(StorageError, match="nothing of them was stored") as info:
        writer.append(b"two")
    assert info.value.errno == errno.ENOSPC and info.value.offset == 1
    [recovery] = writer.recoveries  # the cut was done, and kept
    assert recovery.saved_to.read_bytes() == torn
    monkeypatch.undo()
    assert writer.append(b"two") == 1
    writer.close()
    assert journal_values(tmp_path) == [b"one", b"two"]


# -- check --repair beside writers: it locks as a shared writer does ----------------------------


def test_check_repair_beside_a_shared_writer_does_not_refuse_its_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repair recovered the last segment through an exclusive writer: an append of a queue's
    shared writer (another process) meanwhile was refused with LockedError ("an exclusive writer
    holds the journal"), and a repair run while one appended was refused. The repair now takes
    the lock as the shared writers do, for its recovery only."""
    shared = Writer(tmp_path, shared=True)
    shared.append(b"one")
    torn = _torn_tail(shared, 1)
    appended: list[int] = []
    real_close = Writer.close

    def close_after_an_append(self: Writer) -> None:
        if self is not shared and not appended:  # the repair's writer: another process appends
            appended.append(shared.append(b"two"))
        real_close(self)

    monkeypatch.setattr(Writer, "close", close_after_an_append)
    report = check(tmp_path, repair=True)
    assert appended == [1]
    assert report.ok and [r.saved_to.read_bytes() for r in report.recoveries] == [torn]
    shared.close()
    assert journal_values(tmp_path) == [b"one", b"two"]


def test_check_repair_beside_an_exclusive_writer_is_refused(tmp_path: Path) -> None:
    with Writer(tmp_path) as writer:
        writer.append(b"one")
        with pytest.raises(LockedError, match="exclusive writer"):
            check(tmp_path, repair=True)
        assert check(tmp_path).ok  # without repair: no lock


def test_check_repair_beside_a_writer_that_holds_the_lock_for_good_is_refused_not_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sej's own writer holds jnl.lck for its lifetime and leaves no note: a repair that waited
    for the lock as a shared writer does (for one append) would wait for ever."""
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.lock import FileLock

    small_journal(tmp_path)
    monkeypatch.setattr(inspect_mod, "_LOCK_WAIT", 0.3)
    sej = FileLock(tmp_path / "jnl.lck")
    sej.acquire()
    outcome: list[BaseException | None] = []

    def repair() -> None:
        try:
            check(tmp_path, repair=True)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=repair, daemon=True)
    thread.start()
    thread.join(10)
    sej.close()  # lets a hung repair go on
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], LockedError), outcome
    assert "held the lock" in str(outcome[0])


# -- DeferredSyncs(wait=False): an event loop's appends do not wait for another holder -----------


def test_in_a_block_that_does_not_wait_a_journal_another_process_holds_is_busy_at_once(tmp_path: Path) -> None:
    """Another process's hold (here another open file description's ``flock``, as a process
    has): the block's first append raises ``BusyError`` instead of waiting, having stored
    nothing, and takes the journal as soon as it is free."""
    with Writer(tmp_path, shared=True) as writer:
        writer.append(b"before")
        other = FileLock(lock_path(tmp_path))
        assert other.try_acquire()
        try:
            with writer_mod.DeferredSyncs(wait=False):
                with pytest.raises(BusyError, match="another process holds the journal's lock"):
                    writer.append_many([b"refused"])
                with pytest.raises(BusyError):
                    with writer.hold():
                        pass
            assert writer.next_offset == 1
        finally:
            other.close()
        with writer_mod.DeferredSyncs(wait=False):
            writer.append(b"taken")
    assert [m.value for m in scan_all(tmp_path)] == [b"before", b"taken"]


def test_in_a_block_that_does_not_wait_a_writer_another_thread_holds_is_busy_at_once(tmp_path: Path) -> None:
    """The writer's mutex, held by another thread of the process (its collection, say): busy too."""
    with Writer(tmp_path, shared=True) as writer:
        holding, done = threading.Event(), threading.Event()

        def hold() -> None:
            with writer.hold():
                holding.set()
                done.wait(30)

        thread = threading.Thread(target=hold)
        thread.start()
        try:
            assert holding.wait(30)
            with writer_mod.DeferredSyncs(wait=False):
                with pytest.raises(BusyError, match="another thread of this process"):
                    writer.append(b"refused")
        finally:
            done.set()
            thread.join()
        assert writer.next_offset == 0


def test_after_the_blocks_first_hold_the_next_ones_wait(tmp_path: Path) -> None:
    """Once the block took a hold, it may have changed something: a later hold that finds its
    journal held waits for it, as outside the block (and so does every hold of a block that
    waits, the default)."""
    first, second = tmp_path / "first", tmp_path / "second"
    with Writer(first, shared=True) as a, Writer(second, shared=True) as b:
        for wait in (False, True):
            other = FileLock(lock_path(second))
            assert other.try_acquire()
            timer = threading.Timer(1.0, other.close)
            timer.start()
            try:
                with writer_mod.DeferredSyncs(wait=wait):
                    if not wait:
                        a.append(b"the first hold")
                    assert other.held  # (so the append below finds the lock held, and waits)
                    b.append(b"waited for")
            finally:
                timer.join()
        assert b.next_offset == 2
