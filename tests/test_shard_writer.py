"""ShardedWriter: routing by key, lazy shards, batches, shard bit 0 and the errors."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from journalq.errors import Error, InvalidMessageError, JournalError
from journalq.journal import Message, Scanner, Writer
from journalq.shard import (
    ShardedScanner,
    ShardedWriter,
    ShardLayoutError,
    ShardNameError,
    shard_dir_name,
    shard_of,
)


def read(path: Path) -> list[Message]:
    with Scanner(path) as scanner:
        return list(scanner)


def dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def keys_for(bit: int, index: int, n: int, hash=shard_of) -> list[bytes]:
    """``n`` keys that ``hash`` sends to shard ``index``."""
    out, i = [], 0
    while len(out) < n:
        key = b"key-%d" % i
        if hash(key, bit) == index:
            out.append(key)
        i += 1
    return out


# -- routing ----------------------------------------------------------------------------------


def test_default_hash_is_crc32_of_the_key(tmp_path: Path) -> None:
    keys = [b"key-%d" % i for i in range(200)]
    with ShardedWriter(tmp_path, "t", 3) as writer:
        placed = [writer.append(b"v" + key, key) for key in keys]
        assert [writer.shard_for(k) for k in keys] == [name for name, _ in placed]
    for key, (name, offset) in zip(keys, placed):
        assert name == f"t.3.{zlib.crc32(key) & 7:03x}"
    for name in {name for name, _ in placed}:
        messages = read(tmp_path / name)
        # Offsets count per shard, in the order the shard got them.
        assert [(name, m.offset) for m in messages] == [p for p in placed if p[0] == name]
        assert all(zlib.crc32(m.key) & 7 == int(name[-3:], 16) for m in messages)
        assert all(m.value == b"v" + m.key for m in messages)


def test_a_custom_hash_gets_the_key_and_the_bit(tmp_path: Path) -> None:
    seen = []

    def by_first_byte(key: bytes, bit: int) -> int:
        seen.append((key, bit))
        return key[0] % (1 << bit) if key else 0

    with ShardedWriter(tmp_path, "c", 2, hash=by_first_byte) as writer:
        assert writer.append(b"x", b"\x05abc") == ("c.2.001", 0)
        assert writer.append(b"y", b"\x07") == ("c.2.003", 0)
        assert writer.append(b"z", b"\x0b") == ("c.2.003", 1)
        assert writer.append_many([Message(key=b"\x02"), Message(key=b"\x03"), Message(key=b"\x00")]) == [
            ("c.2.002", 0),
            ("c.2.003", 2),
            ("c.2.000", 0),
        ]
    assert (b"\x05abc", 2) in seen and all(bit == 2 for _, bit in seen)
    assert [m.value for m in read(tmp_path / "c.2.003")] == [b"y", b"z", b""]


def test_keyless_messages_go_to_the_shard_of_the_empty_key(tmp_path: Path) -> None:
    with ShardedWriter(tmp_path, "", 4) as writer:
        assert writer.append_many([b"a", b"b"]) == [("4.000", 0), ("4.000", 1)]
        assert writer.append(b"c") == ("4.000", 2)
    assert dirs(tmp_path) == ["4.000"]  # crc32(b"") == 0; an empty prefix drops its dot, as sej does


# -- lazy opening -----------------------------------------------------------------------------


def test_shards_are_made_on_their_first_message_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardedWriter(root, "lazy", 3) as writer:
        assert not root.exists() and writer.writers == {}
        writer.append(b"1", keys_for(3, 5, 1)[0])
        assert dirs(root) == ["lazy.3.005"]
        writer.append_many([Message(key=k) for k in keys_for(3, 2, 3) + keys_for(3, 5, 2)])
        assert dirs(root) == ["lazy.3.002", "lazy.3.005"]
        assert list(writer.writers) == ["lazy.3.002", "lazy.3.005"]
        assert writer.next_offsets == {"lazy.3.002": 3, "lazy.3.005": 3}
        assert len(writer.shard_names) == 8 and writer.shard_names[7] == "lazy.3.007"
    assert dirs(root) == ["lazy.3.002", "lazy.3.005"]


def test_a_refused_key_makes_no_shard(tmp_path: Path) -> None:
    with ShardedWriter(tmp_path / "r", "k", 2) as writer:
        with pytest.raises(InvalidMessageError, match="at most 127"):
            writer.append(b"v", b"k" * 128)
        with pytest.raises(InvalidMessageError, match="at most 127"):
            writer.append_many([Message(key=b"a"), Message(key=b"k" * 128)])
        with pytest.raises(InvalidMessageError, match="must be bytes, not str"):
            writer.append(b"v", "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError, match="item 1 .* not bytes"):
            writer.append_many([Message(key=b"a"), Message(key="text")])  # type: ignore[arg-type]
    assert not (tmp_path / "r").exists()


def test_reopening_appends_after_what_is_there(tmp_path: Path) -> None:
    keys = keys_for(2, 1, 3)
    with ShardedWriter(tmp_path, "re", 2) as writer:
        writer.append(b"a", keys[0])
    with ShardedWriter(tmp_path, "re", 2) as writer:
        assert writer.append_many([Message(key=keys[1]), Message(key=keys[2])]) == [("re.2.001", 1), ("re.2.001", 2)]


# -- batches ----------------------------------------------------------------------------------


def test_append_many_groups_by_shard_keeping_each_shards_order(tmp_path: Path, monkeypatch) -> None:
    calls = []
    original = Writer.append_many

    def spy(self, items):
        calls.append((self.path.name, len(items)))
        return original(self, items)

    monkeypatch.setattr(Writer, "append_many", spy)
    items = [Message(timestamp_ns=i, type=i % 256, key=b"k%d" % (i % 13), value=b"v%d" % i) for i in range(500)]
    with ShardedWriter(tmp_path, "g", 2) as writer:
        placed = writer.append_many(iter(items))  # any iterable
        assert writer.append_many([]) == []
    assert len(placed) == len(items)
    # One append_many per shard, in the order each shard first appears in the batch.
    first_seen = list(dict.fromkeys(name for name, _ in placed))
    assert [name for name, _ in calls] == first_seen
    for name, n in calls:
        assert n == sum(1 for p in placed if p[0] == name)
        got = read(tmp_path / name)
        mine = [m for m, p in zip(items, placed) if p[0] == name]
        assert [(m.timestamp_ns, m.type, m.key, m.value) for m in got] == [
            (m.timestamp_ns, m.type, m.key, m.value) for m in mine
        ]
        assert [m.offset for m in got] == [p[1] for p in placed if p[0] == name] == list(range(n))


def test_flush_sync_close_and_closed(tmp_path: Path) -> None:
    writer = ShardedWriter(tmp_path, "f", 1, sync="group:5ms,100")
    writer.append_many([Message(key=b"a"), Message(key=b"b"), Message(key=b"c")])
    writer.flush()
    writer.sync()
    writer.close()
    writer.close()  # harmless
    with pytest.raises(Error, match="closed"):
        writer.append(b"x")
    with pytest.raises(Error, match="closed"):
        writer.append_many([b"x"])
    assert sum(len(read(tmp_path / d)) for d in dirs(tmp_path)) == 3


def test_shared_writers_append_to_the_same_shards(tmp_path: Path) -> None:
    keys = keys_for(1, 0, 2) + keys_for(1, 1, 2)
    with ShardedWriter(tmp_path, "s", 1, shared=True) as one, ShardedWriter(tmp_path, "s", 1, shared=True) as two:
        assert one.append(b"1", keys[0]) == ("s.1.000", 0)
        assert two.append(b"2", keys[1]) == ("s.1.000", 1)
        assert two.append(b"3", keys[2]) == ("s.1.001", 0)
        assert one.append(b"4", keys[3]) == ("s.1.001", 1)
    assert [m.value for m in read(tmp_path / "s.1.000")] == [b"1", b"2"]


# -- shard bit 0: no sharding -----------------------------------------------------------------


def test_shard_bit_0_writes_one_journal_at_the_root_or_the_prefix(tmp_path: Path) -> None:
    assert shard_dir_name("", 0, 0) == "" and shard_dir_name("p", 0, 0) == "p"
    with ShardedWriter(tmp_path / "a", bit=0) as writer:
        assert writer.shard_names == [""]
        assert writer.append(b"1", b"any key") == ("", 0)
        assert writer.append_many([Message(key=b"x"), b"y"]) == [("", 1), ("", 2)]
    assert [m.value for m in read(tmp_path / "a")] == [b"1", b"", b"y"]  # the root is the journal
    with ShardedWriter(tmp_path / "b", "events", 0) as writer:
        assert writer.append(b"1", b"k") == ("events", 0)
    assert dirs(tmp_path / "b") == ["events"] and len(read(tmp_path / "b" / "events")) == 1
    # And read back as one shard named by its directory.
    with ShardedScanner(tmp_path / "a") as scanner:
        assert [(name, m.value) for name, m in scanner] == [("", b"1"), ("", b""), ("", b"y")]
    with ShardedScanner(tmp_path / "b", prefix="events") as scanner:
        assert [(name, m.offset) for name, m in scanner] == [("events", 0)]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "bit", "match"),
    [
        ("bad.prefix", 2, "shard prefix"),
        ("sp ace", 2, "shard prefix"),
        (3, 2, "shard prefix"),
        ("ok", 11, "shard bit"),
        ("ok", -1, "shard bit"),
        ("ok", True, "shard bit"),
        ("ok", "2", "shard bit"),
    ],
)
def test_bad_prefix_or_bit_is_the_naming_error(tmp_path: Path, prefix, bit, match: str) -> None:
    with pytest.raises(ShardNameError, match=match):
        ShardedWriter(tmp_path, prefix, bit)
    assert dirs(tmp_path) == []


@pytest.mark.parametrize("index", [4, -1, 1.0, None])
def test_a_hash_giving_a_bad_index_is_the_naming_error(tmp_path: Path, index) -> None:
    with ShardedWriter(tmp_path, "h", 2, hash=lambda key, bit: index) as writer:
        with pytest.raises(ShardNameError, match="shard index must be an integer from 0 to 3"):
            writer.append(b"v", b"k")
        with pytest.raises(ShardNameError, match="shard index"):
            writer.append_many([Message(key=b"k")])
    assert dirs(tmp_path) == []


def test_other_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(Error, match="hash must be a callable"):
        ShardedWriter(tmp_path, hash=3)  # type: ignore[arg-type]
    with pytest.raises(Error, match="segment_size"):
        ShardedWriter(tmp_path, segment_size=0)
    with pytest.raises(Error):
        ShardedWriter(tmp_path, sync="sometimes")


def test_a_root_with_the_same_prefix_and_another_bit_is_refused(tmp_path: Path) -> None:
    with ShardedWriter(tmp_path, "events", 2) as writer:
        writer.append(b"v", b"k")
    with pytest.raises(ShardLayoutError, match="shard bit 3.*shard bit 2"):
        ShardedWriter(tmp_path, "events", 3)
    with pytest.raises(ShardLayoutError, match="unsharded|shard bit 2"):
        ShardedWriter(tmp_path, "events", 0)
    with ShardedWriter(tmp_path, "other", 3) as writer:  # another prefix is another journal
        writer.append(b"v", b"k")
    with ShardedWriter(tmp_path / "plain", bit=0) as writer:
        writer.append(b"v")
    with pytest.raises(ShardLayoutError, match="unsharded journal"):
        ShardedWriter(tmp_path / "plain", "", 2)
    with pytest.raises(JournalError):
        ShardedWriter(tmp_path / "plain" / "jnl" / "0000000000000000.jnl", "x", 1)  # not a directory


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
