"""The broker: a data directory of topics and queues, with no process running for it.

``Broker(root)`` is cheap: it only opens what is asked of it, and any number of processes may
have one over the same directory at once.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

from journalq.closing import Closing
from journalq.errors import InvalidNameError, QueueNotFoundError, SettingsFileError
from journalq.journal.recovery import fsync_dir
from journalq.journal.sync import SyncPolicy
from journalq.queue import settings as settings_file
from journalq.queue import sharded
from journalq.queue.channel import channel_dir
from journalq.queue.removal import remove_directory, remove_leftovers
from journalq.queue.settings import (
    QueueSettings,
    check_dead_letter_kinds,
    check_for_queue,
    check_name,
    dead_letter_sources,
)
from journalq.queue.sharded import ShardedQueue, ShardedTopic
from journalq.queue.topic import Topic, channel_names_in
from journalq.queue.workqueue import DEFAULT_CHANNEL, Queue
from journalq.queue.zookeeper import is_zookeeper_url, open_broker

__all__ = ["DEFAULT_CHANNEL", "Broker", "Queue"]

log = logging.getLogger("journalq.queue")

_NO_FILE = frozenset((errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP))
"""The errors of a ``stat`` that ``Path.is_file`` answers False to (any other raises)."""


class Broker(Closing):
    """Topics and queues under ``root``.

    ``sync``: the sync policy of every journal the broker writes (``"always"`` by default: each
    send and each change of a message's state is on stable storage before the call returns;
    ``"none"`` is much faster and still survives the death of the process).
    """

    def __new__(cls, root: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        """``Broker("zk://host:port[,host:port]/path")`` is the ZooKeeper store (kazoo is
        imported only then); anything else is a data directory."""
        if cls is Broker and is_zookeeper_url(root):
            return open_broker(root, *args, **kwargs)  # type: ignore[arg-type]
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike[str], *, sync: str | SyncPolicy = "always") -> None:
        self.root = Path(root)
        self._root_text = os.fspath(self.root)  # for exists(): os.path.join of a Path costs ~10,000 instructions
        self.sync = str(SyncPolicy.parse(sync))
        self.durable = SyncPolicy.parse(sync).mode != "none"
        """Whether making, changing and deleting queues is synced too (unless ``sync="none"``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(self.root)  # of deletes that a crash cut short (see ``removal``)
        self._topics: dict[str, Topic] = {}
        self._queues: dict[str, Queue] = {}
        self._lock = threading.RLock()  # one Topic and one Queue object per name, across threads

    def topic(self, name: str, *, create: bool = True, **settings: Any) -> Topic:
        """The topic ``name``; created (with ``settings``) when missing and ``create`` is true.
        A topic made with ``shards`` > 1 is a ``journalq.queue.sharded.ShardedTopic``."""
        sharded.check_topic_name(check_name(name))
        with self._lock:
            return self._topic(name, create, settings)

    def _topic(self, name: str, create: bool, settings: dict[str, Any]) -> Topic:
        topic = self._topics.get(name)
        if topic is not None and topic.gone:  # deleted by another process: open what is there now
            self.forget(name)
            topic = None
        if topic is not None and not settings:
            return topic
        path = self.root / name
        current = settings_file.load(path)
        if current is None:
            if not create:
                raise QueueNotFoundError(f"no queue or topic {name!r} in {self.root}")
            wanted = sharded.check_dead_letter_queue(check_for_queue(name, QueueSettings().replace(**settings)))
            sharded.check_new(self.root, name, wanted)
            self._check_dead_letter_kinds(name, None, wanted)
            path.mkdir(parents=True, exist_ok=True)
            if settings_file.create(path, wanted, durable=self.durable):
                current, settings = wanted, {}
            else:  # another process made it meanwhile: its settings stand, ours are a change
                current = settings_file.load(path)
                if current is None:
                    raise QueueNotFoundError(f"queue or topic {name!r} in {self.root} was deleted as it was made")
        if settings:
            updated = sharded.check_dead_letter_queue(check_for_queue(name, current.replace(**settings)))
            if updated != current:
                sharded.check_change(name, current, updated)
                self._check_dead_letter_kinds(name, current, updated)
                settings_file.save(path, updated, durable=self.durable)
                current = updated
        if topic is None:
            opened = None
            try:
                opened = sharded.open_topic(self, name, current)
                # Held before its journal is made (the journal exists from creation on, so that
                # followers can watch it): a writer would make a directory deleted meanwhile again.
                opened._hold_directory()
                opened._get_writer()
            except BaseException as exc:
                if opened is not None:
                    opened.close()  # and its directory's descriptor, held above, with it
                if not isinstance(exc, (FileNotFoundError, QueueNotFoundError)):
                    raise
                if isinstance(exc, FileNotFoundError) and settings_file.load(path) is not None:
                    raise
                # Another process's delete took the directory away after its settings were read.
                raise QueueNotFoundError(
                    f"queue or topic {name!r} in {self.root} was deleted as it was opened"
                ) from None
            topic = self._topics[name] = opened
        topic.use_settings(current)
        return topic

    def _check_dead_letter_kinds(self, name: str, before: QueueSettings | None, after: QueueSettings) -> None:
        check_dead_letter_kinds(name, before, after, self._settings_of, self.dead_letter_sources)

    def _settings_of(self, name: str) -> QueueSettings | None:
        return settings_file.load(self.root / name)

    def dead_letter_sources(self, name: str) -> list[tuple[str, QueueSettings]]:
        """The queues (name and settings) whose dead-letter queue is ``name``, but ``name`` itself;
        one whose settings file is damaged is left out (its problem, not this listing's)."""
        return dead_letter_sources(name, self.names(), self._settings_of)

    def queue(self, name: str, *, create: bool = True, **settings: Any) -> Queue:
        """The queue ``name``: a topic with the one channel ``default``."""
        with self._lock:
            topic = self.topic(name, create=create, **settings)
            queue = self._open_queue(name, topic)
            if queue is None:
                if isinstance(topic, Topic):
                    queue = self._queues[name] = Queue(topic, DEFAULT_CHANNEL)
                else:
                    queue = self._queues[name] = ShardedQueue(topic, DEFAULT_CHANNEL)
                topic._channels[DEFAULT_CHANNEL] = queue
            return queue

    def channel_names(self, name: str) -> list[str]:
        """The channels of topic ``name`` (of every shard), read from its directories: nothing is
        opened (no journal, no lock), so that a read-only data directory can be listed.
        ``QueueNotFoundError`` when nothing has the name."""
        check_name(name)
        current = settings_file.load(self.root / name)
        if current is None:
            raise QueueNotFoundError(f"no queue or topic {name!r} in {self.root}")
        directories = [name] if current.shards == 1 else sharded.shard_dirs(name, current.shards)
        return sorted({channel for d in directories for channel in channel_names_in(self.root / d)})

    def queue_if_made(self, name: str) -> Queue | ShardedQueue | None:
        """The queue ``name`` when its topic has the channel ``default`` (``queue`` made it); None
        for a topic whose channels are its own, or that has none yet (made with ``topic``):
        ``queue`` would give it that channel, which takes every message of the topic again and
        holds its gc back for a consumer that may never come. ``QueueNotFoundError`` when nothing
        has the name. For what must make no channel: the server's sends, deletes and purges."""
        with self._lock:
            topic = self.topic(name, create=False)
            queue = self._open_queue(name, topic)
            if queue is not None:
                return queue  # open here: no look at the directory (the server's every send asks)
            if not _has_default_channel(topic):
                return None
            return self.queue(name, create=False)

    def opened(self, name: str) -> Queue | ShardedQueue | Topic | None:
        """What a send to ``name`` goes through (``queue_if_made``'s queue, else the topic) when
        this broker has it open already; None when using it would open something first: recover
        its journals and load its channel's state, which at a deep backlog takes tens to hundreds
        of milliseconds (a caller that must not wait, the server's event loop, lets a thread do
        that). Opens nothing and takes no lock: for the loop, as it goes; another thread may be
        opening it meanwhile."""
        topic = self._topics.get(name)
        if topic is None or topic.gone:
            return None
        queue = self._open_queue(name, topic)
        if queue is not None:
            return queue
        return None if _has_default_channel(topic) else topic

    def _open_queue(self, name: str, topic: Topic | ShardedTopic) -> Queue | ShardedQueue | None:
        """The queue ``name`` this broker has open on ``topic``, or None: it is opened anew when
        its topic was (``_topic``) or it was closed (``close``, or its topic's): a closed
        channel's receives return nothing, its messages waiting."""
        queue = self._queues.get(name)
        return queue if queue is not None and queue.topic is topic and not queue._closed else None

    def forget(self, name: str) -> None:
        """Close what this broker has open of ``name``; the next use opens it again (recovering its
        journals), as after a storage failure that left a writer unusable."""
        with self._lock:
            self._queues.pop(name, None)
            topic = self._topics.pop(name, None)
        if topic is not None:
            try:
                topic.close()
            except OSError:
                pass  # the storage that failed may fail the close too: the files are closed anyway

    def reopen_failed(self) -> list[str]:
        """Forget every topic whose writer failed, so that the next use reopens and recovers it;
        returns their names."""
        with self._lock:
            failed = [name for name, topic in self._topics.items() if topic.failed]
        for name in failed:
            self.forget(name)
        return failed

    def configure(self, name: str, **changes: Any) -> QueueSettings:
        return self.topic(name, create=False, **changes).settings

    def names(self) -> list[str]:
        """The topics and queues in the data directory."""
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [
            n for n in entries
            if not n.startswith(".") and (self.root / n / settings_file.SETTINGS_FILE).is_file()
        ]

    def exists(self, name: str) -> bool:
        check_name(name)
        # ``Path.is_file`` as it answers (and fails), of a str: the Path built per call cost ~3 of
        # the ~4.8 µs (the server's SQS sends ask once a batch). The name is checked: no separator.
        try:
            mode = os.stat(f"{self._root_text}/{name}/{settings_file.SETTINGS_FILE}").st_mode
        except OSError as exc:
            if exc.errno in _NO_FILE:
                return False
            raise
        return stat.S_ISREG(mode)

    def delete(self, name: str) -> None:
        """Delete a queue or topic and all its messages; also one whose settings file is damaged
        (``SettingsFileError`` everywhere else), which cannot be opened to be mended."""
        check_name(name)
        if not self.exists(name):
            raise QueueNotFoundError(f"no queue or topic {name!r} in {self.root}")
        opened = self._topics.get(name)
        self.forget(name)
        if opened is not None:
            opened.gone = True  # what was got of it refuses to work (a send would make it again)
        try:
            shards: int | None = (settings_file.load(self.root / name) or QueueSettings()).shards
        except SettingsFileError:
            shards = None  # damaged: deleting it is the way out (its shards are found by name)
        sharded.delete_shards(self.root, name, shards)
        if not remove_directory(self.root, name):
            raise QueueNotFoundError(f"queue or topic {name!r} in {self.root} was deleted meanwhile")
        if self.durable:
            fsync_dir(self.root)  # gone for good: a power cut does not bring the queue back
        remove_leftovers(self.root)

    def gc(self) -> dict[str, int]:
        """Garbage-collect every topic now; returns files deleted per topic. Left out: one that
        another process deletes meanwhile (opened to be collected, it would be made again), a
        directory whose name no queue can have, and, with a warning, one whose settings file is
        damaged (which does not keep the others from being collected)."""
        deleted: dict[str, int] = {}
        for name in self.names():
            try:
                deleted[name] = len(self.topic(name, create=False).gc())
            except (QueueNotFoundError, InvalidNameError):
                continue
            except SettingsFileError as exc:
                log.warning("queue %r is not collected: %s", name, exc)
        return deleted

    def close(self) -> None:
        for topic in self._topics.values():
            topic.close()
        self._topics.clear()
        self._queues.clear()


def _has_default_channel(topic: Topic | ShardedTopic) -> bool:
    """Whether the queue's channel ``default`` was made in ``topic`` (``Broker.queue``): a stat of
    its directory; any shard's answers (a sharded channel is made in every shard)."""
    paths = topic.shard_paths if isinstance(topic, ShardedTopic) else [topic.path]
    return any(channel_dir(path, DEFAULT_CHANNEL).is_dir() for path in paths)
