"""Deleting queues and topics: what a deleter that was SIGKILLed between renaming a directory and
removing it left behind is removed by the next broker that opens (or the next delete), never under
a deleter that is still at work; a queue made again with the name of a half-deleted one works; a
long poll caught between a sharded topic's shards and its directory going ends as not found."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from journalq.errors import InvalidNameError, QueueNotFoundError, SettingsFileError
from journalq.queue import Broker
from conftest import synced_paths

# Deletes queue ARGV[2] of ARGV[1]; stops once the first directory is renamed, before anything in
# it is removed: "crash" SIGKILLs itself there, "wait" waits for its stdin to close, then goes on.
DELETER = textwrap.dedent(
    """
    import os, signal, sys
    from journalq.queue import Broker

    root, name, how = sys.argv[1:]
    replace = os.replace

    def stopped(source, target):
        replace(source, target)
        if os.path.basename(target).startswith(".deleted-"):
            print(os.path.basename(target), flush=True)
            if how == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.stdin.read()

    os.replace = stopped
    Broker(root, sync="none").delete(name)
    """
)


def deleter(root: Path, name: str, how: str, env: dict) -> tuple[subprocess.Popen, str]:
    """A process deleting ``name``, stopped (or dead) after its first rename; and the doomed name."""
    child = subprocess.Popen(
        [sys.executable, "-c", DELETER, str(root), name, how],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    doomed = child.stdout.readline().strip()
    assert doomed.startswith(f".deleted-{name}"), doomed
    return child, doomed


def leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(".deleted-"))


def test_a_delete_cut_short_by_sigkill_is_finished_by_the_next_broker(tmp_path: Path, child_env: dict) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs").send_many([b"x" * 1000] * 50)
    child, doomed = deleter(root, "jobs", "crash", child_env)
    assert child.wait(30) == -signal.SIGKILL
    assert leftovers(root) == [doomed] and os.listdir(root / doomed)  # the crash left it whole
    with Broker(root, sync="none") as broker:
        assert leftovers(root) == []
        assert broker.names() == []
        # A new queue with the name of the half-deleted one starts empty and works.
        q = broker.queue("jobs")
        q.send(b"new")
        assert [m.body for m in q.receive(10)] == [b"new"]


def test_a_directory_that_a_live_process_is_deleting_is_left_to_it(tmp_path: Path, child_env: dict) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("jobs").send(b"x")
        broker.queue("other")
    child, doomed = deleter(root, "jobs", "wait", child_env)
    try:
        with Broker(root, sync="none") as broker:
            assert leftovers(root) == [doomed]  # its deleter is alive: not removed under it
            broker.delete("other")  # a delete cleans up too, but not what is still being deleted
            assert leftovers(root) == [doomed] and broker.names() == []
            broker.queue("jobs").send(b"again")  # made again while the old one is being removed
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(30) == 0
    assert leftovers(root) == []  # its deleter finished it
    with Broker(root, sync="none") as broker:
        assert [m.body for m in broker.queue("jobs").receive(10)] == [b"again"]


def test_leftovers_of_earlier_versions_and_of_reused_pids_are_removed(tmp_path: Path) -> None:
    """Leftovers named ``.deleted-NAME-PID`` without a lock (before deletes took one), even one
    that names this very process's pid, have no deleter: they are removed."""
    root = tmp_path / "data"
    for pid in (os.getpid(), 999_999_999):
        (root / f".deleted-jobs-{pid}" / "jnl").mkdir(parents=True)
        (root / f".deleted-jobs-{pid}" / "jnl" / "0000000000000000.jnl").write_bytes(b"old")
    (root / ".deleted-a-file").write_bytes(b"not a directory: not ours")
    with Broker(root, sync="none") as broker:
        assert leftovers(root) == [".deleted-a-file"]
        broker.queue("jobs").send(b"x")
        broker.delete("jobs")  # its own rename cannot meet a leftover's name
        assert leftovers(root) == [".deleted-a-file"] and broker.names() == []
        with pytest.raises(QueueNotFoundError):
            broker.delete("jobs")


def test_a_sharded_delete_cut_short_can_be_done_again(tmp_path: Path, child_env: dict) -> None:
    root = tmp_path / "data"
    with Broker(root, sync="none") as broker:
        broker.queue("orders", shards=4).send_many([{"body": b"%d" % i, "key": str(i)} for i in range(40)])
    child, doomed = deleter(root, "orders", "crash", child_env)
    assert child.wait(30) == -signal.SIGKILL
    assert doomed.startswith(".deleted-orders.2.000-")  # the shards go first
    with Broker(root, sync="none") as broker:
        assert leftovers(root) == []
        assert broker.names() == ["orders"]  # still listed, to be deleted again
        broker.delete("orders")
        assert sorted(os.listdir(root)) == []
        q = broker.queue("orders", shards=4)
        q.send(b"new", key="k")
        assert [m.body for m in q.receive(10)] == [b"new"]


def _no_shards_on_zookeeper(store_root: Path | str, shards: int) -> None:
    if shards > 1 and not isinstance(store_root, Path):
        pytest.skip("the ZooKeeper store has no shards")


@pytest.mark.parametrize("shards", [1, 2])
def test_a_queue_deleted_and_made_again_by_another_process(store_root: Path | str, shards: int) -> None:
    """A process that had the queue open neither sends into the deleted directory (a send that
    says it stored what no one can read), nor takes the new queue of the same name for the one it
    opened (its state would skip new messages and give out others twice): QueueNotFoundError, and
    ``broker.queue`` opens the new queue. (On ZooKeeper: neither sends into the new queue nor acts
    on its tasks.)"""
    _no_shards_on_zookeeper(store_root, shards)
    with Broker(store_root, sync="none") as mine, Broker(store_root, sync="none") as other:
        q = mine.queue("jobs", shards=shards)
        q.send_many([{"body": b"old %d" % i, "group_id": "g"} for i in range(2)])  # one shard
        (m,) = q.receive()
        q.delete(m.receipt)
        other.delete("jobs")
        for call in (lambda: q.send(b"lost"), q.receive, q.stats):
            with pytest.raises(QueueNotFoundError, match="deleted"):
                call()
        again = other.queue("jobs", shards=shards)
        again.send_many([{"body": b"new %d" % i, "group_id": "g"} for i in range(3)])
        for call in (lambda: q.send(b"lost"), q.receive, q.stats, lambda: q.delete(m.receipt),
                     lambda: q.release(m.receipt), lambda: q.task(m.id), lambda: q.delete_id(m.id), q.purge):
            with pytest.raises(QueueNotFoundError, match="deleted"):
                call()
        with pytest.raises(QueueNotFoundError, match="deleted"):
            q.topic.gc()  # (which commits the cursors of its channels)
        reopened = mine.queue("jobs")
        assert reopened is not q
        got = [m.body for m in reopened.receive(10)]
        assert got == [b"new 0", b"new 1", b"new 2"]  # (a group's next ones follow its first)
        assert again.receive(10) == []  # the group is in flight, with ``reopened``
        assert reopened.stats().in_flight == len(got)


@pytest.mark.parametrize("shards", [1, 2])
def test_what_was_got_of_a_deleted_queue_refuses_to_work(store_root: Path | str, shards: int) -> None:
    """A queue object of the broker that deleted the queue: a send made the directory again (a
    journal without settings, which the next queue of that name took in) and said it stored."""
    _no_shards_on_zookeeper(store_root, shards)
    with Broker(store_root, sync="none") as broker:
        q = broker.queue("jobs", shards=shards)
        q.send(b"before")
        broker.delete("jobs")
        for call in (lambda: q.send(b"after"), q.receive, q.stats):
            with pytest.raises(QueueNotFoundError, match="deleted"):
                call()
        assert not broker.exists("jobs") and broker.names() == []
        if isinstance(store_root, Path):
            assert not (store_root / "jobs").exists()
        again = broker.queue("jobs", shards=shards)
        with pytest.raises(QueueNotFoundError, match="deleted"):
            q.receive()
        assert again.receive(10) == [] and again.stats().available == 0


@pytest.mark.parametrize("run_dry", [False, True])
def test_a_queue_that_another_process_is_removing_is_not_found(tmp_path: Path, run_dry: bool) -> None:
    """Another process's delete renames the directory away, then removes its files one by one:
    a receive or send of a process that has the queue open, and finds a file gone meanwhile, is
    told that the queue was deleted (QueueNotFoundError), not of the file (FileNotFoundError,
    which the server answered 500 to an SQS ReceiveMessage). So is a receive of a queue run dry,
    which takes no lock (the first files removed)."""
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"before")
        (got,) = q.receive(visibility_timeout=60)
        if run_dry:
            q.delete(got.receipt)
            assert q.receive() == [] and q.receive() == []
        doomed = tmp_path / ".deleted-jobs-1-0badcafe"
        os.replace(tmp_path / "jobs", doomed)  # the deleter's first step (``removal``)
        for lock in (doomed / "channels" / "default" / "jnl.lck", doomed / "jnl.lck"):
            lock.unlink()  # the first files its removal took
        for call in (q.receive, lambda: q.send(b"lost")):
            with pytest.raises(QueueNotFoundError, match="deleted"):
                call()


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("wait", [0, 5])
def test_an_idle_poller_is_told_when_another_process_deletes_the_queue(
    tmp_path: Path, shards: int, wait: float
) -> None:
    """A consumer of a queue run dry receives without the channel's lock (it can tell there is
    nothing to give): it is told all the same, at once, when another process deletes the queue,
    waiting (a long poll) or not."""
    with Broker(tmp_path, sync="none") as broker, Broker(tmp_path, sync="none") as other:
        q = broker.queue("jobs", shards=shards)
        q.send_many([b"a", b"b"])
        got = q.receive(10)
        assert not any(q.delete_many([m.receipt for m in got]))
        assert q.receive(10) == [] and q.receive(10) == []  # the second passes the channel by
        deleting = threading.Timer(0.3 if wait else 0, lambda: other.delete("jobs"))
        deleting.start()
        if not wait:
            deleting.join()
        started = time.monotonic()
        with pytest.raises(QueueNotFoundError, match="deleted"):
            q.receive(10, wait=wait)
        deleting.join()
        assert time.monotonic() - started < 4


def test_a_queue_deleted_while_it_is_being_opened_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's delete renames the directory away between the reading of its settings
    and the opening of its journal: QueueNotFoundError (the REST fetch answered that 500 as a
    FileNotFoundError), and nothing of it stays open or is made again."""
    from journalq.queue import broker as broker_module

    with Broker(tmp_path, sync="none") as maker:
        maker.queue("jobs").send(b"x")
    real_load = broker_module.settings_file.load
    deleted: list[bool] = []

    def load_then_deleted(path: Path) -> object:
        loaded = real_load(path)
        if loaded is not None and path == tmp_path / "jobs" and not deleted:
            deleted.append(True)  # (the deleter reads the settings too)
            with Broker(tmp_path, sync="none") as deleter:
                deleter.delete("jobs")
        return loaded

    with Broker(tmp_path, sync="none") as broker:
        monkeypatch.setattr(broker_module.settings_file, "load", load_then_deleted)
        with pytest.raises(QueueNotFoundError, match="deleted as it was opened"):
            broker.queue("jobs", create=False)
        monkeypatch.setattr(broker_module.settings_file, "load", real_load)
        assert not broker.exists("jobs")
        with pytest.raises(QueueNotFoundError):
            broker.queue("jobs", create=False)
    assert not (tmp_path / "jobs").exists()


def test_closing_a_broker_after_another_deleted_its_queue_leaves_nothing(tmp_path: Path) -> None:
    """Its channels' cursors are not written: that made the directory again, and a cursor there
    would let gc take the segments of a new queue of the name for consumed."""
    mine = Broker(tmp_path, sync="none")
    q = mine.queue("jobs")
    q.send_many([b"x"] * 3)
    assert not any(q.delete_many([m.receipt for m in q.receive(3)]))
    with Broker(tmp_path, sync="none") as other:
        other.delete("jobs")
    mine.close()
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("sync", ["always", "group:5ms", "none"])
def test_making_changing_and_deleting_a_queue_reach_stable_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    """A queue answered as made (or changed, or deleted) survives a power cut unless the broker's
    policy is ``sync="none"``: its settings file, the directory entries that name it and the
    rename of a delete are synced before the call returns."""
    root = (tmp_path / "data").resolve()
    with Broker(root, sync=sync) as broker:
        synced = synced_paths(monkeypatch)
        broker.queue("q")
        made = list(synced)
        broker.configure("q", visibility_timeout=5)
        changed = synced[len(made):]
        broker.delete("q")
        deleted = synced[len(made) + len(changed):]
    if sync == "none":
        assert made == changed == deleted == []
        return
    assert any(p.startswith(str(root / "q" / "queue.json.")) for p in made), made  # its contents
    assert str(root / "q") in made and str(root) in made, made  # its entry, and its directory's
    assert any(p.startswith(str(root / "q" / "queue.json.")) for p in changed), changed
    assert str(root / "q") in changed, changed  # the rename
    assert deleted[-1] == str(root), deleted


def test_exists_answers_as_path_is_file_of_the_settings_file(tmp_path: Path) -> None:
    """``Broker.exists`` stats a str path (cheaper than a Path built per call): it answers what
    ``Path.is_file`` of the queue's settings file answers, whatever lies at that name."""
    from journalq.queue import settings as settings_file

    root = tmp_path / "data"
    with Broker(root) as broker:
        broker.queue("made")
        (root / "bare").mkdir()  # a directory with no settings file
        (root / "plain-file").write_text("not a queue")  # a file where a directory would be
        (root / "settings-dir" / settings_file.SETTINGS_FILE).mkdir(parents=True)  # not a file
        (root / "looped").mkdir()
        (root / "looped" / settings_file.SETTINGS_FILE).symlink_to(root / "looped" / settings_file.SETTINGS_FILE)
        (root / "linked").symlink_to(root / "made")
        names = ["made", "bare", "plain-file", "settings-dir", "looped", "linked", "absent"]
        answers = {name: broker.exists(name) for name in names}
        assert answers == {name: (root / name / settings_file.SETTINGS_FILE).is_file() for name in names}
        assert [name for name, found in answers.items() if found] == ["made", "linked"]
        with pytest.raises(InvalidNameError):
            broker.exists("../made")


DAMAGES = {
    "not JSON": "{bad",
    "not an object": "[]",
    "a bad setting": json.dumps({"visibility_timeout": -1}),
    "an unknown setting": json.dumps({"colour": "red"}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("shards", [1, 4])
def test_a_queue_whose_settings_are_damaged_can_be_deleted(tmp_path: Path, damage: str, shards: int) -> None:
    """Deleting is the way out of a damaged settings file: every other call refuses the queue."""
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("jobs", shards=shards).send(b"x")
        broker.queue("other").send(b"kept")
        (tmp_path / "jobs" / "queue.json").write_text(DAMAGES[damage])
        broker.forget("jobs")
        with pytest.raises(SettingsFileError):
            broker.queue("jobs")
        broker.delete("jobs")
        assert broker.names() == ["other"]
        assert sorted(os.listdir(tmp_path)) == ["other"]  # its shards too
        with pytest.raises(QueueNotFoundError):
            broker.delete("jobs")
        assert [m.body for m in broker.queue("jobs", shards=shards).receive(10)] == []  # made anew
        assert [m.body for m in broker.queue("other").receive()] == [b"kept"]


def test_a_damaged_queue_open_in_this_broker_can_be_deleted(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"x")
        (tmp_path / "jobs" / "queue.json").write_text("{bad")
        broker.delete("jobs")
        assert broker.names() == []
        with pytest.raises(QueueNotFoundError):
            q.send(b"y")


def test_the_command_deletes_a_queue_whose_settings_are_damaged(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from journalq.cli.main import cli

    with Broker(tmp_path, sync="none") as broker:
        broker.queue("jobs").send(b"x")
    (tmp_path / "jobs" / "queue.json").write_text("{bad")

    def run(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(cli, ["queue", *args, "--data", str(tmp_path)], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    code, _, err = run("stats", "jobs")  # the others keep refusing it, naming the file
    assert code != 0 and "queue.json" in err and "Traceback" not in err
    code, out, _ = run("delete-queue", "jobs")
    assert (code, json.loads(out)) == (0, {"name": "jobs", "deleted": True})
    assert not (tmp_path / "jobs").exists()


def test_the_commands_over_every_queue_go_past_a_damaged_one(tmp_path: Path) -> None:
    """``journalq queue list`` and ``stats`` (of every queue) failed on the first queue whose
    settings file is damaged: the damaged queue could not even be found to be deleted. ``list``
    shows it, ``stats`` leaves it out; both warn."""
    from click.testing import CliRunner

    from journalq.cli.main import cli

    with Broker(tmp_path, sync="none") as broker:
        broker.queue("a-damaged").send(b"x")
        broker.queue("b").send(b"y")
    (tmp_path / "a-damaged" / "queue.json").write_text("{bad")

    def rows(*args: str) -> list[dict]:
        result = CliRunner().invoke(cli, ["queue", *args, "--data", str(tmp_path)], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    assert rows("list", "--format", "jsonl") == [{"name": "a-damaged"}, {"name": "b"}]
    assert [(r["name"], r["available"]) for r in rows("stats", "--format", "jsonl")] == [("b", 1)]


def test_a_queue_deleted_as_its_channel_is_opened_is_not_found(tmp_path: Path, monkeypatch) -> None:
    """Another process deletes the queue after this one checked that it is there and before its
    channel's journal writer made its directories: the writer made the queue's directory again,
    with the channel's state in it, or failed with a raw FileNotFoundError (the server answered
    500 with a traceback to a long poll that began as the queue went)."""
    from journalq.journal import Writer
    from journalq.queue import channel as channel_module

    with Broker(tmp_path) as maker:
        maker.queue("doomed").send(b"x")
    deleter = Broker(tmp_path)
    opener = Broker(tmp_path)
    opener.topic("doomed", create=False)  # opened and checked, its channel not yet

    def deleted_first(*args, **kwargs):
        deleter.delete("doomed")
        return Writer(*args, **kwargs)

    monkeypatch.setattr(channel_module, "Writer", deleted_first)
    with pytest.raises(QueueNotFoundError, match="doomed"):
        opener.queue("doomed", create=False)
    # Nothing of it made again: a queue made later with its name would have found the channel's
    # state (its cursor past the new queue's first messages) and skipped them.
    assert not (tmp_path / "doomed").exists()
    monkeypatch.undo()
    opener.close()
    deleter.close()


@pytest.mark.parametrize("when", ["opening", "receiving"])
def test_a_queue_deleted_as_its_journals_are_read_is_not_found(tmp_path: Path, monkeypatch, when: str) -> None:
    """Another process deletes the queue after this one's channel writer was made, as a scanner
    of the channel's state (its opening) or of the topic (a receive's read-ahead) starts: the
    scanner found no directory, and the JournalError ("no journal directory here") was answered
    500 to a REST long poll whose queue was deleted under it. It is QueueNotFoundError, and
    nothing of the channel stays open."""
    from journalq.journal import Scanner
    from journalq.queue import channel as channel_module

    with Broker(tmp_path) as maker:
        maker.queue("doomed").send(b"x")
    deleter = Broker(tmp_path)
    opener = Broker(tmp_path)
    if when == "receiving":
        q = opener.queue("doomed", create=False)
    opened: list[Scanner] = []

    def deleted_first(*args, **kwargs):
        if not opened:
            deleter.delete("doomed")
        opened.append(None)
        return Scanner(*args, **kwargs)

    monkeypatch.setattr(channel_module, "Scanner", deleted_first)
    with pytest.raises(QueueNotFoundError, match="doomed"):
        if when == "opening":
            opener.queue("doomed", create=False)
        else:
            q.receive(wait=0)
    assert opened and not (tmp_path / "doomed").exists()
    monkeypatch.undo()
    opener.close()
    deleter.close()


def test_a_sharded_queue_deleted_as_a_shard_channel_is_opened_is_not_found(tmp_path: Path, monkeypatch) -> None:
    """Another process deletes a sharded queue just as this one made a shard's channel: the
    shard's directory was held after its channel was made, and a raw FileNotFoundError (which
    the server's long poll answered 500) came out of the opening. The directory is held first;
    the queue opens, and its receive finds the queue deleted (QueueNotFoundError)."""
    from journalq.queue import topic as topic_module

    with Broker(tmp_path) as maker:
        maker.queue("doomed", shards=2).send(b"x")
    deleter = Broker(tmp_path)
    opener = Broker(tmp_path)
    sharded = opener.topic("doomed", create=False)
    real_channel = topic_module.Channel

    def deleted_after(*args, **kwargs):
        channel = real_channel(*args, **kwargs)
        if (tmp_path / "doomed").exists():
            deleter.delete("doomed")
        return channel

    monkeypatch.setattr(topic_module, "Channel", deleted_after)
    with pytest.raises(QueueNotFoundError, match="doomed"):
        sharded.channel("default").receive(wait=0)
    assert not (tmp_path / "doomed").exists()
    monkeypatch.undo()
    opener.close()
    deleter.close()


@pytest.mark.parametrize("opened", ["every shard", "one shard"])
def test_a_sharded_long_poll_meets_a_delete_between_shards_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: str
) -> None:
    """``Broker.delete`` removes a sharded topic's shards before its own directory: a long poll of
    another broker (process) caught in between raises ``QueueNotFoundError`` (the server's 404),
    not whatever a missing shard's file gave (a 500)."""
    from journalq.queue import broker as broker_module

    shards_gone, carry_on = threading.Event(), threading.Event()
    real = broker_module.remove_directory

    def slow_remove(root: Path, name: str) -> bool:
        shards_gone.set()
        carry_on.wait(10)
        return real(root, name)

    outcome: list[object] = []
    with Broker(tmp_path, sync="none") as polling, Broker(tmp_path, sync="none") as deleting:
        queue = polling.queue("orders", shards=4)
        if opened == "every shard":
            queue.send_many([b"x%d" % i for i in range(16)])
            queue.delete_many([m.receipt for m in queue.receive(100)])
        else:
            queue.receive(1)  # opens its home shard's channel only

        def poll() -> None:
            try:
                outcome.append(queue.receive(10, wait=5))
            except Exception as exc:  # noqa: BLE001 - what it raised is the point
                outcome.append(exc)

        monkeypatch.setattr(broker_module, "remove_directory", slow_remove)
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)  # the poll is waiting
        deleter = threading.Thread(target=deleting.delete, args=("orders",))
        deleter.start()
        assert shards_gone.wait(10)
        poller.join(10)
        carry_on.set()
        deleter.join(10)
        assert not poller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], QueueNotFoundError), outcome
