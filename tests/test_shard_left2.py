"""Bugs of the sharding layer found by a second audit: each test here failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import Error
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
