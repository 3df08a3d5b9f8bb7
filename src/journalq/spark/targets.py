"""What a ``path`` names: a journal directory, a root of shards, or a topic of a broker.

* a journal directory (``DIR/jnl/``) is one shard, named ``""``;
* a root of shards holds sej shard directories (``[prefix].[bit].[index]``), one shard each;
* a topic is a journal directory with the broker's ``queue.json`` beside it: give its own path,
  or the broker's data directory as ``path`` and the topic's name as the ``topic`` option. A
  sharded topic (``shards`` > 1) keeps only ``queue.json`` there and its shards beside it in the
  data directory (``NAME.[bit].[index]``): it is read, and written by key, as a root of shards.

For writing, a path that does not exist yet becomes a plain journal, or a root of ``2**shardBit``
shards named with ``shardPrefix`` when the option ``shardBit`` is given; a missing topic is
created through the broker (with its settings file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from journalq.errors import Error, QueueNotFoundError
from journalq.journal.segment import journal_dir
from journalq.shard.naming import ShardName, list_shards, shard_name

SETTINGS_FILE = "queue.json"
COMMITS_DIR = "_spark_commits"  # beside the target's journals: exactly-once bookkeeping of writes


@dataclass(frozen=True)
class Shard:
    name: str  # "" for a plain journal
    path: str


@dataclass
class Target:
    path: Path
    kind: str  # "journal", "topic" or "sharded"
    shards: list[Shard] = field(default_factory=list)
    prefix: str | None = None  # for writing into a sharded root
    bit: int | None = None
    topic: Path | None = None  # a sharded topic's own directory (its queue.json), beside its shards

    @property
    def commits_dir(self) -> Path:
        """Where the exactly-once bookkeeping of writes goes: in the topic's own directory for a
        sharded topic (its data directory holds other topics)."""
        return (self.topic or self.path) / COMMITS_DIR

    @property
    def sharded(self) -> bool:
        return self.kind == "sharded"

    def shard_path(self, index: int) -> Path:
        assert self.prefix is not None and self.bit is not None
        return self.path / shard_name(self.prefix, self.bit, index)


def _topic_path(path: str, topic: str | None) -> Path:
    if not path:
        raise Error("the journalq data source needs a path: load(PATH) / save(PATH) or option('path', ...)")
    root = Path(path).absolute()  # executors run elsewhere (a cluster worker's directory)
    if topic is None:
        return root
    from journalq.queue.settings import check_name

    check_name(topic, "topic")
    return root / topic


def resolve(path: str, topic: str | None = None) -> Target:
    """The target at ``path`` for reading; a clear error when it is none of the three kinds."""
    where = _topic_path(path, topic)
    if topic is not None and not (where / SETTINGS_FILE).is_file():
        raise QueueNotFoundError(f"no topic {topic!r} in {where.parent}")
    if not where.is_dir():
        what = "is a file, not a directory" if where.exists() else "does not exist"
        raise Error(f"{where} {what} (a journal directory, a root of shards or a topic was expected)")
    sharded_topic = _sharded_topic(where)
    if sharded_topic is not None:
        return sharded_topic
    if journal_dir(where).is_dir() or (where / SETTINGS_FILE).is_file():
        kind = "topic" if (where / SETTINGS_FILE).is_file() else "journal"
        return Target(where, kind, [Shard("", str(where))])
    shards = list_shards(where)
    if shards:
        return _sharded(where, shards)
    raise Error(
        f"{where} is not a journal directory (no jnl/), a root of shards ([prefix].[bit].[index] "
        "directories) or a topic (no queue.json)"
    )


def _sharded_topic(where: Path) -> Target | None:
    """The shards of the broker topic at ``where`` when it is a sharded one, else None."""
    if journal_dir(where).is_dir() or not (where / SETTINGS_FILE).is_file():
        return None
    from journalq.queue import settings
    from journalq.queue.sharded import shard_bit, shard_dirs

    loaded = settings.load(where)
    if loaded is None or loaded.shards == 1:
        return None
    root = where.parent
    shards = [Shard(name, str(root / name)) for name in shard_dirs(where.name, loaded.shards) if (root / name).is_dir()]
    return Target(root, "sharded", shards, where.name, shard_bit(loaded.shards), topic=where)


def _sharded(root: Path, shards: list[tuple[ShardName, Path]]) -> Target:
    kinds = {(name.prefix, name.bit) for name, _ in shards}
    prefix, bit = next(iter(kinds)) if len(kinds) == 1 else (None, None)
    return Target(root, "sharded", [Shard(str(name), str(p)) for name, p in shards], prefix, bit)


def for_writing(
    path: str,
    topic: str | None = None,
    *,
    shard_bit: int | None = None,
    shard_prefix: str = "",
) -> Target:
    """The target at ``path`` for appending, created when missing (see the module's docstring)."""
    where = _topic_path(path, topic)
    if topic is not None:
        if shard_bit is not None:
            raise Error(f"{where} is a topic: its shards are its settings; leave out the option shardBit")
        if not (where / SETTINGS_FILE).is_file():
            from journalq.queue.broker import Broker

            with Broker(where.parent, sync="none") as broker:
                broker.topic(topic)
        return _sharded_topic(where) or Target(where, "topic", [Shard("", str(where))])
    if where.exists() and not where.is_dir():
        raise Error(f"{where} is a file, not a journal directory")
    if where.is_dir():
        sharded_topic = _sharded_topic(where)
        if sharded_topic is not None:
            if shard_bit is not None:
                raise Error(f"{where} is a sharded topic: its shards are set; leave out the option shardBit")
            return sharded_topic
        if journal_dir(where).is_dir() or (where / SETTINGS_FILE).is_file():
            if shard_bit is not None:
                raise Error(f"{where} is a journal, not a root of shards: leave out the option shardBit")
            kind = "topic" if (where / SETTINGS_FILE).is_file() else "journal"
            return Target(where, kind, [Shard("", str(where))])
        shards = list_shards(where)
        if shards:
            target = _sharded(where, shards)
            if target.bit is None:
                raise Error(
                    f"{where} holds shards of several prefixes or shard bits; "
                    "a sharded write needs one [prefix].[bit] set"
                )
            if shard_bit is not None and (shard_bit, shard_prefix) != (target.bit, target.prefix):
                raise Error(
                    f"{where} holds shards with prefix {target.prefix!r} and shard bit {target.bit}, "
                    f"not prefix {shard_prefix!r} and bit {shard_bit}"
                )
            return target
        visible = [name for name in os.listdir(where) if not name.startswith((".", "_"))]
        if visible and shard_bit is None:
            raise Error(
                f"{where} is neither a journal nor a root of shards, and not empty "
                f"({', '.join(sorted(visible)[:5])}...): refusing to write into it"
            )
    if shard_bit is not None:
        # Validates prefix and bit; shard directories are made as messages reach them.
        shard_name(shard_prefix, shard_bit, 0)
        where.mkdir(parents=True, exist_ok=True)
        return Target(where, "sharded", [], shard_prefix, shard_bit)
    return Target(where, "journal", [Shard("", str(where))])


def segment_size_for(target: Target, default: int) -> int:
    """A topic's ``segment_size`` setting; ``default`` for other journals."""
    if target.kind != "topic" and target.topic is None:
        return default
    from journalq.queue import settings

    loaded = settings.load(target.topic or target.path)
    return loaded.segment_size if loaded is not None else default
