"""Names of shard directories, as sej's ``shard`` package makes them, and sej's default key hash.

A sharded root holds one sej directory per shard, named ``[prefix].[shard-bit].[shard-index]``:

* ``prefix`` matches ``[a-zA-Z0-9_-]*``; when it is empty, ``[prefix].`` including the dot is
  omitted (``2.001``), so a name never starts with a dot;
* ``shard-bit`` is one lowercase hex digit from ``1`` to ``a``: the shard count is ``2**bit``;
* ``shard-index`` is three lowercase hex digits from ``000`` to ``3ff``, below ``2**bit``.

Everything here is pure (``list_shards`` only lists a directory), so that the rules can be tested
alone and shared by the sharded writer, the merged reader and the command line.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from journalq.errors import Error

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

MIN_SHARD_BIT = 1
MAX_SHARD_BIT = 10
_PREFIX = re.compile(r"[a-zA-Z0-9_-]*")
# The prefix group is optional as a whole, dot included; an empty prefix with a dot (".2.001") is
# not a name sej makes, so it is not accepted either.
_NAME = re.compile(r"(?:(?P<prefix>[a-zA-Z0-9_-]+)\.)?(?P<bit>[1-9a])\.(?P<index>[0-3][0-9a-f]{2})")


class ShardNameError(Error, ValueError):
    """A prefix, shard bit or shard index that cannot make a shard directory name."""


@dataclass(frozen=True, order=True)
class ShardName:
    """The parts of a shard directory name; ``str()`` gives the name itself.

    Ordering is by (prefix, bit, index), the order in which a root's shards are read.
    """

    prefix: str
    bit: int
    index: int

    def __post_init__(self) -> None:
        _validate(self.prefix, self.bit, self.index)

    def __str__(self) -> str:
        parts = f"{self.bit:x}.{self.index:03x}"
        return f"{self.prefix}.{parts}" if self.prefix else parts

    @property
    def count(self) -> int:
        """How many shards a root with this name's bit has."""
        return 1 << self.bit


def _validate(prefix: str, bit: int, index: int) -> None:
    """Raise a ``ShardNameError`` that names the part that breaks sej's naming rules."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ShardNameError(f"shard prefix {prefix!r} must contain only letters, digits, '_' and '-'")
    if isinstance(bit, bool) or not isinstance(bit, int) or not MIN_SHARD_BIT <= bit <= MAX_SHARD_BIT:
        raise ShardNameError(f"shard bit must be an integer from {MIN_SHARD_BIT} to {MAX_SHARD_BIT}, not {bit!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < (1 << bit):
        raise ShardNameError(
            f"shard index must be an integer from 0 to {(1 << bit) - 1} for shard bit {bit}, not {index!r}"
        )


def shard_name(prefix: str, bit: int, index: int) -> str:
    """The directory name of shard ``index`` of ``2**bit`` shards; ``ShardNameError`` if invalid."""
    return str(ShardName(prefix, bit, index))


def parse_shard_name(name: str) -> ShardName | None:
    """The parts of a shard directory name, or None when ``name`` is not one.

    Only names exactly as ``shard_name`` writes them are accepted (lowercase hex, three index
    digits), so that parsing and formatting are inverse and one shard has one name.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    bit, index = int(match["bit"], 16), int(match["index"], 16)
    if index >= 1 << bit:
        return None
    return ShardName(match["prefix"] or "", bit, index)


def list_shards(root: str | os.PathLike[str]) -> list[tuple[ShardName, Path]]:
    """The shard directories directly under ``root``, sorted by (prefix, bit, index).

    Entries that are not directories or whose names are not shard names are ignored, as sej does
    with the other files of a root. A missing ``root`` raises ``FileNotFoundError``.
    """
    root = Path(root)
    shards = []
    with os.scandir(root) as entries:
        for entry in entries:
            parsed = parse_shard_name(entry.name)
            if parsed is not None and entry.is_dir():
                shards.append((parsed, root / entry.name))
    shards.sort(key=lambda item: item[0])
    return shards


def shard_of(key: bytes, bit: int) -> int:
    """The shard that sej's default hash sends ``key`` to: the low ``bit`` bits of its CRC-32 (IEEE)."""
    if isinstance(bit, bool) or not isinstance(bit, int) or not MIN_SHARD_BIT <= bit <= MAX_SHARD_BIT:
        raise ShardNameError(f"shard bit must be an integer from {MIN_SHARD_BIT} to {MAX_SHARD_BIT}, not {bit!r}")
    return zlib.crc32(key) & ((1 << bit) - 1)
