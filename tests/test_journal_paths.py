"""Journal paths that are not what they must be: a file where a journal's directory (or its
``jnl/``, or its ``ofs/``) goes. The error must say so, as a journalq error naming the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import JournalError
from journalq.journal import ReaderOffset, Writer, set_offset

pytestmark = pytest.mark.usefixtures("vectors_untouched")


def test_a_writer_on_a_file_says_it_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    # It was FileExistsError "File exists: 'f'": as if the journal were there already.
    with pytest.raises(JournalError, match="not a directory") as info:
        Writer(tmp_path / "f")
    assert info.value.file == tmp_path / "f"
    assert (tmp_path / "f").read_bytes() == b"x"


def test_a_writer_whose_jnl_is_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "jnl").write_bytes(b"x")
    with pytest.raises(JournalError, match="not a directory") as info:
        Writer(tmp_path / "j", sync="always")
    assert info.value.file == tmp_path / "j" / "jnl"


def test_reader_offsets_whose_ofs_is_a_file_say_so(tmp_path: Path) -> None:
    (tmp_path / "ofs").write_bytes(b"x")
    with pytest.raises(JournalError, match="not a directory") as info:
        ReaderOffset(tmp_path, "alpha")
    assert info.value.file == tmp_path / "ofs"
    with pytest.raises(JournalError, match="not a directory"):
        set_offset(tmp_path, "alpha", 3)
    assert (tmp_path / "ofs").read_bytes() == b"x"
