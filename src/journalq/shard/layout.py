"""What a sharded root holds: which shard directories make one sharded journal, and where each is.

A sharded journal is a root directory with one sej journal per shard, named as ``naming`` says
(``[prefix].[bit].[index]``, all with the same prefix and shard bit). Shard bit 0 means no
sharding, as in sej's ``shard.Shard.Dir``: the journal is ``ROOT/prefix``, or the root itself when
the prefix is empty. Its "shard name" is then that directory's name relative to the root: the
prefix, or ``""`` for the root itself.

This module only reads directory listings; the sharded writer, the sharded scanner and the
command line share it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from journalq.errors import JournalError
from journalq.journal.inspect import require_journal
from journalq.journal.segment import journal_dir
from journalq.shard.naming import (
    MAX_SHARD_BIT,
    ShardName,
    ShardNameError,
    list_shards,
    parse_shard_name,
    shard_name,
)

__all__ = [
    "ShardLayout",
    "ShardLayoutError",
    "check_bit",
    "check_prefix",
    "describe_groups",
    "journals_at",
    "parse_shard_dir",
    "read_layout",
    "shard_dir_name",
    "shard_groups",
]


class ShardLayoutError(JournalError):
    """A root whose directories are not one sharded journal: shards with mixed prefixes or shard
    bits, a journal and shards side by side, or a shard that the prefix and bit asked for exclude."""


def check_prefix(prefix: str) -> str:
    """``prefix`` when sej could name shards with it, else the naming module's ``ShardNameError``."""
    shard_name(prefix, 1, 0)  # validates the prefix (the bit and index are valid)
    return prefix


def check_bit(bit: int) -> int:
    """``bit`` when it is 0 (no sharding) or a shard bit; else ``ShardNameError``."""
    if isinstance(bit, int) and not isinstance(bit, bool) and bit == 0:
        return 0
    if isinstance(bit, bool) or not isinstance(bit, int) or not 0 <= bit <= MAX_SHARD_BIT:
        raise ShardNameError(f"shard bit must be an integer from 0 (no sharding) to {MAX_SHARD_BIT}, not {bit!r}")
    return bit


def shard_dir_name(prefix: str, bit: int, index: int) -> str:
    """The directory of shard ``index`` relative to the root, as sej's ``Shard.Dir`` makes it:
    ``[prefix].[bit].[index]``, or for bit 0 the prefix itself (``""``: the root)."""
    if check_bit(bit) == 0:
        if index != 0:
            raise ShardNameError(f"shard index must be 0 for shard bit 0 (no sharding), not {index!r}")
        return check_prefix(prefix)
    return shard_name(prefix, bit, index)


def _group_name(prefix: str, bit: int) -> str:
    return f"{prefix}.{bit:x}.*" if prefix else f"{bit:x}.*"


def shard_groups(found: list[tuple[ShardName, Path]]) -> dict[tuple[str, int], int]:
    """How many of the shards ``found`` (as ``list_shards`` gives them) each (prefix, shard bit)
    has, in name order: a root is one sharded journal when there is one group."""
    groups: dict[tuple[str, int], int] = {}
    for name, _ in found:
        groups[(name.prefix, name.bit)] = groups.get((name.prefix, name.bit), 0) + 1
    return dict(sorted(groups.items()))


def describe_groups(groups: dict[tuple[str, int], int]) -> str:
    """``shard_groups`` for people: ``events.2.* (4 shards), orders.1.* (1 shard)``."""
    return ", ".join(f"{_group_name(p, b)} ({n} shard{'s' if n != 1 else ''})" for (p, b), n in groups.items())


@dataclass(frozen=True)
class ShardLayout:
    """The sharded journal found in a root.

    ``prefix`` and ``bit`` are None while the root holds no journal of the kind asked for (an
    empty root, to be filled later). ``shards`` maps each shard's name (its directory relative to
    the root) to its directory, in name order (for shard bit 0: one entry, the prefix or ``""``).
    """

    root: Path
    prefix: str | None
    bit: int | None
    shards: dict[str, Path] = field(default_factory=dict)


def read_layout(root: str | os.PathLike[str], prefix: str | None = None) -> ShardLayout:
    """The sharded journal in ``root``.

    With ``prefix`` None: the root itself when it is a journal (it has ``jnl/``), else its shard
    directories, which must all have one prefix and one shard bit (``ShardLayoutError`` naming
    the groups found otherwise). With a ``prefix``: only shards with that prefix, which must
    share one shard bit; failing those, the unsharded journal ``ROOT/prefix`` (``ROOT`` for
    ``""``) when it exists. A missing root is a ``JournalError``.
    """
    root = Path(root)
    if prefix is not None:
        check_prefix(prefix)
    if not root.is_dir():
        raise JournalError("no such directory" if not root.exists() else "not a directory", file=root)
    try:
        found = list_shards(root)
    except FileNotFoundError:  # removed meanwhile
        raise JournalError("no such directory", file=root) from None
    if prefix is not None:
        found = [(name, path) for name, path in found if name.prefix == prefix]
    groups = shard_groups(found)
    if len(groups) > 1:
        listed = describe_groups(groups)
        prefixes = {p for p, _ in groups}
        if len(prefixes) > 1:
            hint = "give a prefix to read one of them"
            reason = f"shards of more than one prefix: {listed}; {hint}"
        else:
            reason = f"shards of one prefix with different shard bits: {listed}; they are not one sharded journal"
        raise ShardLayoutError(f"cannot read the root as one sharded journal: it holds {reason}", file=root)
    plain = root / prefix if prefix else root  # the unsharded (bit 0) journal's directory
    plain_is_journal = journal_dir(plain).is_dir()
    if groups:
        ((group_prefix, bit),) = groups
        if plain_is_journal:
            raise ShardLayoutError(
                f"cannot read the root as one sharded journal: it holds both a journal "
                f"({'jnl/ in ' + repr(prefix) if prefix else 'jnl/ in the root'}) "
                f"and shards {_group_name(group_prefix, bit)}",
                file=root,
            )
        return ShardLayout(root, group_prefix, bit, {str(name): path for name, path in found})
    if plain_is_journal:
        name = prefix or ""
        return ShardLayout(root, name, 0, {name: plain})
    return ShardLayout(root, prefix, None, {})


def parse_shard_dir(name: str, layout: ShardLayout, prefix: str | None) -> ShardName | None:
    """Check that ``name`` (a key of an offsets mapping) can be a shard of ``layout``; return its
    parts (None for the unsharded journal's name). ``ShardNameError`` for a name that is no shard
    name, ``ShardLayoutError`` for one of another prefix or shard bit."""
    if not isinstance(name, str):
        raise ShardNameError(f"a shard is named by its directory name (a str), not {name!r}")
    if layout.bit == 0:
        if name in layout.shards:
            return None
        raise ShardLayoutError(
            f"{name!r} is not a shard of this root: it is one unsharded journal, named {next(iter(layout.shards))!r}",
            file=layout.root,
        )
    parsed = parse_shard_name(name)
    if parsed is None:
        raise ShardNameError(
            f"{name!r} is not a shard directory name: [prefix].[bit].[index], with a lowercase hex bit "
            "from 1 to a and a three-digit lowercase hex index below 2**bit"
        )
    want_prefix = layout.prefix if layout.prefix is not None else prefix
    if (want_prefix is not None and parsed.prefix != want_prefix) or (
        layout.bit is not None and parsed.bit != layout.bit
    ):
        expected = _group_name(want_prefix or "", layout.bit) if layout.bit else f"prefix {want_prefix!r}"
        raise ShardLayoutError(f"{name!r} is not a shard of this root, whose shards are {expected}", file=layout.root)
    return parsed


def journals_at(path: str | os.PathLike[str]) -> list[tuple[str | None, Path]]:
    """The journals that a directory stands for, for commands that read each on its own: the
    directory itself when it is a journal (named None), else every shard of a root in name order,
    each named by its directory. Unlike ``read_layout``, shards of mixed prefixes or shard bits
    are all listed (each is named). Anything else: ``require_journal``'s ``JournalError``."""
    path = Path(path)
    if path.is_dir() and not journal_dir(path).is_dir():
        shards = list_shards(path)
        if shards:
            return [(str(name), shard_path) for name, shard_path in shards]
    return [(None, require_journal(path))]
