"""Bugs of the sharding layer found by a second audit: each test here failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import Error, InvalidMessageError
from journalq.journal import Message
from journalq.shard import ShardedScanner, ShardedWriter


def test_a_closed_sharded_scanner_refuses_to_read_rather_than_read_again(tmp_path: Path) -> None:
    """Its shards' scanners read their journals again from the start once closed, so iterating
    a closed sharded scanner gave every message a second time, with no error."""
    with ShardedWriter(tmp_path, "e", 1) as writer:
        placed = [writer.append(b"%d" % i, key=b"k%d" % i) for i in range(20)]
    with ShardedScanner(tmp_path) as scanner:
        read = [(name, message.offset) for name, message in scanner]
    assert sorted(read) == sorted(placed)
    checkpoint = scanner.offsets  # still there after close: what to resume from
    assert checkpoint == {shard: sum(n == shard for n, _ in placed) for shard in ("e.1.000", "e.1.001")}
    with pytest.raises(Error, match="sharded scanner of .* is closed"):
        list(scanner)
    with pytest.raises(Error, match="is closed"):
        scanner.read_batch()
    scanner.close()  # twice is harmless
    with ShardedScanner(tmp_path, checkpoint) as resumed:
        assert list(resumed) == []


def test_a_refused_message_makes_no_shard(tmp_path: Path) -> None:
    """A refused key made no shard, but a refused value, type or timestamp did: the shard's
    directory, an empty journal that then held the root to its shard bit."""
    root = tmp_path / "r"
    with ShardedWriter(root, "k", 2) as writer:
        with pytest.raises(InvalidMessageError, match="type"):
            writer.append(b"v", b"k", type=256)
        with pytest.raises(InvalidMessageError, match="value"):
            writer.append("text", b"k")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError, match="timestamp"):
            writer.append(b"v", b"k", timestamp_ns=2**63)
        with pytest.raises(InvalidMessageError):
            writer.append_many([Message(key=b"a", value=b"v", type=-1)])
        with pytest.raises(InvalidMessageError):
            # The group of the first shard in the batch is refused: nothing is stored.
            writer.append_many([Message(key=b"b", value="text"), Message(key=b"a", value=b"v")])  # type: ignore[arg-type]
        assert writer.writers == {}
    assert not root.exists() or list(root.iterdir()) == []
    with ShardedWriter(root, "k", 3) as writer:  # the root is not held to shard bit 2
        name, offset = writer.append(b"v", b"k")
    assert offset == 0 and name.startswith("k.3.")
