"""The journal's leftovers checked again by the fifth pass: each test here failed before its fix."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import journalq.journal.index as index_mod
from journalq.errors import StorageError
from journalq.journal import Scanner, Writer

# -- a storage failure while a shared writer catches up ----------------------------------------


def _failing(err: int) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise OSError(err, os.strerror(err))

    return fail


def test_a_read_failure_at_a_shared_writers_catch_up_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = Writer(tmp_path, shared=True), Writer(tmp_path, shared=True)
    mine.append(b"one")
    other.append(b"two")  # read by ``mine`` at its next append
    with monkeypatch.context() as patched:
        patched.setattr(os, "pread", _failing(errno.EIO))
        # It was the bare OSError, naming no file.
        with pytest.raises(StorageError, match="Input/output error") as info:
            mine.append(b"three")
    assert info.value.errno == errno.EIO
    assert info.value.file == mine.segment.path and info.value.offset == 1
    assert "nothing was appended" in str(info.value)
    assert not mine.failed
    assert mine.append(b"three") == 2  # the lock was let go, and the catch-up is done again
    other.append(b"four")
    for writer in (mine, other):
        writer.close()
    with Scanner(tmp_path) as scanner:
        assert [m.value for m in scanner] == [b"one", b"two", b"three", b"four"]


def test_a_full_disk_opening_the_segment_another_shared_writer_started_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = Writer(tmp_path, shared=True, segment_size=100), Writer(tmp_path, shared=True, segment_size=100)
    mine.append(b"v" * 20)
    other.append_many([b"w" * 20] * 3)  # 46 bytes each: offset 3 starts the next segment
    assert other.segment.base == 3 and mine.segment.base == 0
    real_open_index = index_mod.open_index

    def full_disk(segment: object, flags: int = os.O_RDONLY) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(other.segment.index_path))
        return real_open_index(segment, flags)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        patched.setattr(index_mod, "open_index", full_disk)
        with pytest.raises(StorageError, match="No space left on device") as info:
            mine.append(b"x")
    assert info.value.errno == errno.ENOSPC
    assert (info.value.file, info.value.offset) == (other.segment.index_path, 3)
    assert mine.append(b"x") == 4 and mine.segment.base == 3
    for writer in (mine, other):
        writer.close()
    with Scanner(tmp_path) as scanner:
        assert [m.offset for m in scanner] == [0, 1, 2, 3, 4]
