"""A streaming read plans micro-batches only over messages on stable storage: the segments it
reports an end in are synced first, whatever the writer's sync policy. Else a power cut could
take a planned (even committed) batch's messages from a journal written with sync none, and the
offsets taken again by new messages after recovery would be passed over by the next batch: new
messages silently skipped (no Spark session)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import ReadAllAvailable  # noqa: E402

from journalq.journal import Writer  # noqa: E402
from journalq.shard import ShardedWriter  # noqa: E402
from journalq.spark import reading  # noqa: E402
from journalq.spark.schema import SCHEMA  # noqa: E402
from journalq.spark.source import JournalStreamReader  # noqa: E402


@pytest.fixture
def synced(monkeypatch) -> list[Path]:
    """The files and directories the reader synced, in order."""
    done: list[Path] = []
    monkeypatch.setattr(reading, "fsync_file", lambda path: done.append(Path(path)), raising=False)
    monkeypatch.setattr(reading, "fsync_dir", lambda path: done.append(Path(path)), raising=False)
    return done


def segment_files(path: Path) -> list[Path]:
    return sorted((path / "jnl").glob("*.jnl"))


def test_the_segments_a_micro_batch_is_planned_over_are_synced_first(tmp_path: Path, synced: list[Path]) -> None:
    path = tmp_path / "j"
    with Writer(path, sync="none", segment_size=300) as writer:
        writer.append_many([b"m%03d" % i for i in range(30)])  # several segments, none synced
        segments = segment_files(path)
        assert len(segments) >= 3
        reader = JournalStreamReader({"path": str(path), "startingOffsets": "earliest"}, SCHEMA)
        assert reader.initialOffset() == {"": 0}
        assert reader.latestOffset({"": 0}, ReadAllAvailable()) == {"": 30}
        assert set(segments) <= set(synced) and path / "jnl" in synced
        synced.clear()
        assert reader.latestOffset({"": 30}, ReadAllAvailable()) == {"": 30}
        assert synced == []  # nothing new: nothing synced again
        writer.append(b"m030")
        assert reader.latestOffset({"": 30}, ReadAllAvailable()) == {"": 31}
        assert segment_files(path)[-1] in synced and segments[0] not in synced  # only what grew


def test_a_stream_starting_at_the_latest_offset_syncs_what_it_starts_after(tmp_path: Path, synced) -> None:
    """Its start is past those messages: lost in a power cut and written anew, they would be
    skipped."""
    path = tmp_path / "j"
    with Writer(path, sync="none") as writer:
        writer.append_many([b"x"] * 5)
    reader = JournalStreamReader({"path": str(path)}, SCHEMA)
    assert reader.initialOffset() == {"": 5}
    assert segment_files(path)[0] in synced


def test_each_shard_of_a_root_is_synced_with_the_offsets_planned(tmp_path: Path, synced) -> None:
    root = tmp_path / "root"
    with ShardedWriter(root, bit=1, sync="none") as writer:
        for i in range(20):
            writer.append(b"v%d" % i, key=b"k%d" % i)
    reader = JournalStreamReader({"path": str(root), "startingOffsets": "earliest"}, SCHEMA)
    start = reader.initialOffset()
    synced.clear()
    ends = reader.latestOffset(start, ReadAllAvailable())
    assert sum(ends.values()) == 20
    for shard in ends:
        assert segment_files(root / shard)[0] in synced


def test_a_journal_made_again_is_synced_anew(tmp_path: Path, synced) -> None:
    import shutil

    path = tmp_path / "j"
    with Writer(path, sync="none", segment_size=300) as writer:
        writer.append_many([b"m%03d" % i for i in range(30)])
    reader = JournalStreamReader({"path": str(path), "startingOffsets": "earliest"}, SCHEMA)
    assert reader.latestOffset({"": 0}, ReadAllAvailable()) == {"": 30}
    shutil.rmtree(path)
    with Writer(path, sync="none", segment_size=300) as writer:
        writer.append_many([b"n%03d" % i for i in range(20)])
    synced.clear()
    reader.latestOffset({"": 30}, ReadAllAvailable())  # went back: partitions() says so
    assert set(segment_files(path)) <= set(synced)  # the new journal's, all of them


def test_a_failed_sync_is_a_storage_error_naming_the_file(tmp_path: Path, monkeypatch) -> None:
    import errno

    from journalq.errors import StorageError

    path = tmp_path / "j"
    with Writer(path) as writer:
        writer.append_many([b"x"] * 3)

    def failing(file) -> None:
        raise OSError(errno.EIO, "Input/output error", str(file))

    monkeypatch.setattr(reading, "fsync_file", failing)
    reader = JournalStreamReader({"path": str(path), "startingOffsets": "earliest"}, SCHEMA)
    with pytest.raises(StorageError, match="cannot sync the journal .*Input/output error") as caught:
        reader.initialOffset()
    assert caught.value.file == segment_files(path)[0]

    def read_only(file) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(file))

    monkeypatch.setattr(reading, "fsync_file", read_only)
    assert reader.initialOffset() == {"": 0}  # nothing to sync there: its writer could not either


def test_the_segments_directory_is_synced_only_when_a_segment_was_made(tmp_path: Path, synced) -> None:
    path = tmp_path / "j"
    with Writer(path, sync="none", segment_size=300) as writer:
        writer.append_many([b"m%03d" % i for i in range(3)])
        reader = JournalStreamReader({"path": str(path), "startingOffsets": "earliest"}, SCHEMA)
        assert reader.latestOffset({"": 0}, ReadAllAvailable()) == {"": 3}
        synced.clear()
        writer.append(b"m003")  # into the same segment
        reader.latestOffset({"": 3}, ReadAllAvailable())
        assert synced == segment_files(path)
        synced.clear()
        writer.append_many([b"m%03d" % i for i in range(4, 30)])  # new segments
        reader.latestOffset({"": 4}, ReadAllAvailable())
        assert path / "jnl" in synced
