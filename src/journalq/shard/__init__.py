"""Sharded roots: a directory of sej journals named ``[prefix].[shard-bit].[shard-index]``."""

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

__all__ = [
    "MAX_SHARD_BIT",
    "MIN_SHARD_BIT",
    "ShardName",
    "ShardNameError",
    "list_shards",
    "parse_shard_name",
    "shard_name",
    "shard_of",
]
