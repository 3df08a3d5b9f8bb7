"""Sharded roots: a directory of sej journals named ``[prefix].[shard-bit].[shard-index]``.

``ShardedWriter`` sends each message to the journal of its key's shard (sej's ``shard.Writer``);
``ShardedScanner`` reads, and follows, every shard of a root with an offset per shard.
"""

from journalq.shard.layout import ShardLayout, ShardLayoutError, journals_at, read_layout, shard_dir_name
from journalq.shard.naming import (
    MAX_SHARD_BIT,
    MIN_SHARD_BIT,
    ShardName,
    ShardNameError,
    list_shards,
    parse_shard_name,
    shard_name,
    shard_of,
)
from journalq.shard.scanner import ShardedScanner
from journalq.shard.writer import HashFunc, ShardedWriter

__all__ = [
    "MAX_SHARD_BIT",
    "MIN_SHARD_BIT",
    "HashFunc",
    "ShardLayout",
    "ShardLayoutError",
    "ShardName",
    "ShardNameError",
    "ShardedScanner",
    "ShardedWriter",
    "journals_at",
    "list_shards",
    "parse_shard_name",
    "read_layout",
    "shard_dir_name",
    "shard_name",
    "shard_of",
]
