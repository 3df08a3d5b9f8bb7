"""The broker's handles and the shape of what it makes: queues, topics, their settings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from journalq.errors import InvalidSettingError, QueueNotFoundError, SettingsFileError
from journalq.queue import Broker, QueueSettings
from journalq.queue import settings as settings_file
from journalq.queue.settings import check_number


@pytest.mark.parametrize("shards", [1, 2])
def test_queue_if_made_finds_queues_and_makes_no_channel_on_a_topic(tmp_path: Path, shards: int) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("q", shards=shards)
        assert broker.queue_if_made("q") is queue
        topic = broker.topic("t", shards=shards)
        assert broker.queue_if_made("t") is None  # no channel at all
        topic.channel("a")
        assert broker.queue_if_made("t") is None
        assert topic.channel_names() == ["a"]
        with pytest.raises(QueueNotFoundError):
            broker.queue_if_made("missing")
    with Broker(tmp_path, sync="none") as broker:  # a queue this process has not opened yet
        found = broker.queue_if_made("q")
        assert found is not None and found is broker.queue("q")


def test_a_standard_queue_cannot_take_a_fifo_dead_letter_queue_nor_the_reverse(store_root: Path | str) -> None:
    """SQS's rule: a FIFO queue's dead-letter queue is FIFO, a standard queue's standard. A FIFO
    dead letter keeps its group, which a standard queue ignores; a standard queue's have none,
    which a FIFO queue's consumers would get as FIFO messages of no group."""
    with Broker(store_root, sync="none") as broker:
        broker.queue("fifo-dlq", fifo=True)
        broker.queue("dlq")
        with pytest.raises(InvalidSettingError, match="'fifo-dlq'.*FIFO"):
            broker.queue("jobs", max_receive_count=2, dead_letter_queue="fifo-dlq")
        assert not broker.exists("jobs")  # refused before it was made
        with pytest.raises(InvalidSettingError, match="'dlq'.*standard"):
            broker.queue("tasks", fifo=True, max_receive_count=2, dead_letter_queue="dlq")
        jobs = broker.queue("jobs", max_receive_count=2, dead_letter_queue="dlq")
        with pytest.raises(InvalidSettingError, match="FIFO"):
            jobs.configure(dead_letter_queue="fifo-dlq")
        with pytest.raises(InvalidSettingError, match="FIFO"):
            jobs.configure(fifo=True)  # its dead-letter queue stays standard
        with pytest.raises(InvalidSettingError, match="'jobs'"):
            broker.queue("dlq").configure(fifo=True)  # the dead-letter queue of a standard one
        assert jobs.settings.dead_letter_queue == "dlq" and not jobs.settings.fifo
        assert not broker.queue("dlq").settings.fifo
        # The same kind is taken, both ways.
        tasks = broker.queue("tasks", fifo=True, max_receive_count=2, dead_letter_queue="fifo-dlq")
        assert tasks.settings.dead_letter_queue == "fifo-dlq"


def test_a_fifo_queue_cannot_name_a_dead_letter_queue_that_is_not_there(store_root: Path | str) -> None:
    """The first move makes a missing dead-letter queue, standard; a standard queue that is to be
    one of a FIFO queue's is refused too."""
    with Broker(store_root, sync="none") as broker:
        with pytest.raises(InvalidSettingError, match="'later'.*does not exist"):
            broker.queue("tasks", fifo=True, max_receive_count=2, dead_letter_queue="later")
        broker.queue("jobs", max_receive_count=2, dead_letter_queue="later")  # a standard queue may
        with pytest.raises(InvalidSettingError, match="'jobs'"):
            broker.queue("later", fifo=True)  # the standard queue's dead-letter queue
        assert not broker.exists("later")


@pytest.mark.parametrize("shards", [1, 2])
def test_a_queue_closed_is_opened_anew_by_the_broker(tmp_path: Path, shards: int) -> None:
    """The broker kept the handle it gave, closed or not: after ``q.close()``, ``broker.queue``
    gave it again, whose receives returned nothing for ever (a closed channel's long poll ends
    empty), while its messages waited."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("q", shards=shards)
        queue.send(b"kept")
        queue.close()
        again = broker.queue("q")
        assert again is not queue
        got = again.receive(1)
        assert [m.body for m in got] == [b"kept"]
        again.delete(got[0].receipt)
        assert broker.queue("q") is again  # one handle while it is open
        broker.topic("q").close()  # closes its channels: the queue too
        reopened = broker.queue("q")
        reopened.send(b"after")
        assert [m.body for m in reopened.receive(1)] == [b"after"]


@pytest.mark.parametrize("shards", [1, 2])
def test_a_channel_closed_is_opened_anew_by_its_topic(tmp_path: Path, shards: int) -> None:
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("t", shards=shards)
        channel = topic.channel("a")
        topic.send(b"kept")
        channel.close()
        again = topic.channel("a")
        assert again is not channel and [m.body for m in again.receive(1)] == [b"kept"]
        assert topic.channel("a") is again


@pytest.mark.parametrize(
    ("setting", "value"),
    [("visibility_timeout", 10**400), ("max_receive_count", 10**400), ("segment_size", -(10**400)),
     ("retention_bytes", -(10**400)), ("delay", 10**5000)],
    ids=["visibility_timeout", "max_receive_count", "segment_size", "retention_bytes", "delay"],
)
def test_a_number_too_large_for_a_float_is_a_setting_error(tmp_path: Path, setting: str, value: int) -> None:
    """``math.isfinite`` of an int past a float's range raised OverflowError, not the error that
    names the setting (a queue.json written by hand with such a number: not SettingsFileError)."""
    extra = {"dead_letter_queue": "dlq"} if setting == "max_receive_count" else {}
    with pytest.raises(InvalidSettingError, match=setting):
        QueueSettings(**{setting: value}, **extra)
    with pytest.raises(InvalidSettingError, match="wait"):
        check_number("wait", -value, 0, 20)
    if value < 10**1000:  # (JSON reads no int of over 4300 digits)
        (tmp_path / "q").mkdir()
        (tmp_path / "q" / "queue.json").write_text(json.dumps({setting: value, **extra}))
        with pytest.raises(SettingsFileError, match=setting):
            settings_file.load(tmp_path / "q")


def test_a_huge_size_is_a_size(tmp_path: Path) -> None:
    assert QueueSettings(segment_size=10**400).segment_size == 10**400  # no upper bound: nothing overflows


def test_a_dead_letter_queue_made_again_by_a_move_is_of_its_sources_kind(store_root: Path | str) -> None:
    """A move to a dead-letter queue deleted since it was named makes it again: a FIFO queue's as
    a FIFO queue (made with default settings, it was standard, whose consumers ignore the groups
    that its dead letters keep, and which no FIFO queue may name)."""
    with Broker(store_root, sync="none") as broker:
        broker.queue("dlq", fifo=True)
        jobs = broker.queue("jobs", fifo=True, max_receive_count=1, dead_letter_queue="dlq")
        broker.delete("dlq")
        jobs.send(b"x", group_id="g")
        jobs.release(jobs.receive(1)[0].receipt)
        assert jobs.receive(1) == []  # moved to the dead-letter queue, made again
        dlq = broker.queue("dlq", create=False)
        assert dlq.settings.fifo
        got = dlq.receive(1)
        assert [(m.body, m.group_id) for m in got] == [(b"x", "g")]


def _open_segments(topic_path: Path) -> list[str]:
    """The segments of ``topic_path`` that this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # (the listing's own descriptor, closed by now)
        if target.startswith(str(topic_path)) and target.endswith(".jnl"):
            found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
@pytest.mark.parametrize("shards", [1, 2])
def test_a_topic_closed_after_deduplicated_sends_holds_no_segment_open(tmp_path: Path, shards: int) -> None:
    """A topic's deduplication reads its journal with a scanner of its own, which its close (and
    a change of dedup_window) left open: a descriptor leaked per topic opened and closed."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("q", shards=shards)
        queue.send(b"x", dedup_id="a")
        queue.send(b"x", dedup_id="a")
        broker.topic("q").close()
        assert _open_segments(tmp_path / "q") == []
        broker.queue("q").send(b"y", dedup_id="b")
        broker.configure("q", dedup_window=60)  # its deduplication read again, with the new window
        broker.queue("q").send(b"y", dedup_id="b")
        broker.topic("q").close()
        assert _open_segments(tmp_path / "q") == []


def test_dead_letter_ids_of_two_shards_differ_whatever_their_tokens(tmp_path: Path) -> None:
    """A dead letter's deduplication id named the sharded queue, the channel, the channel's token
    and the offset: the same offset in two shards differed by the random token alone, and when
    those met, the dead-letter queue dropped the second shard's letter as a duplicate."""
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("q", shards=2)
        first, second = (broker.topic("q").shards[i].channel("default") for i in range(2))
        second._token = first._token  # (the 1 in 2**32 that a pair of channels meets)
        assert first._dead_letter_id(0) != second._dead_letter_id(0)
        queue.close()
