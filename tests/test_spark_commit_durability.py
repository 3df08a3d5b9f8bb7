"""The exactly-once commit journal survives a power cut whatever the data's sync policy: a record
(an intent, a commit) is on stable storage, its segment's directory entry too, before the append
it describes starts (no Spark session)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import recovery, writer  # noqa: E402
from journalq.journal import sync as sync_module  # noqa: E402
from journalq.spark.targets import Target  # noqa: E402
from journalq.spark.writing import COMMIT, INTENT, CommitLog  # noqa: E402


def test_commit_log_records_and_their_directory_entries_are_synced(tmp_path, monkeypatch):
    synced_dirs: list[Path] = []
    real = recovery.fsync_dir

    def recording(directory):
        synced_dirs.append(Path(directory))
        return real(directory)

    monkeypatch.setattr(writer, "fsync_dir", recording)
    monkeypatch.setattr(recovery, "fsync_dir", recording)
    target = Target(tmp_path / "out", "journal")
    log = CommitLog(target, "query-1")
    before = sync_module.syncs_done()
    log.append(INTENT, {"k": "intent", "b": 0, "p": 0, "s": "", "e": 0, "n": 1, "d": "1:0"})
    # a power cut now must not take the intent (its segment, or the directories that hold it)
    assert sync_module.syncs_done() > before
    for directory in (log.path / "jnl", log.path, target.commits_dir):
        assert directory.parent in synced_dirs, directory  # the entry of each directory made
    assert (log.path / "jnl") in synced_dirs  # the segment's own entry
    synced_dirs.clear()
    log.append(COMMIT, {"k": "commit", "b": 0})
    assert log.committed(0)
