"""``inspect``: ``describe`` (``journalq info``, the hub's status), ``check`` and its repair, and
``first_offset_since``, over journals that change under them or hold what is no segment (a
segment collected since it was listed, a dangling link, damage before an index's entries)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
from journalq.errors import JournalError
from journalq.journal import Scanner, Writer, index
from journalq.journal.inspect import check, describe
from journalq.journal.segment import list_segments, segment_at

from conftest import size_past_the_end, small_journal

pytestmark = pytest.mark.usefixtures("vectors_untouched")


# -- a segment collected (a queue's gc) after it was listed ------------------------------------


def _collected_after_listing(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first segment of the journal at ``path`` collected (a gc) just after ``inspect``'s
    first listing of its segments, which names it still; its later listings do not (one that
    names it still is a segment that cannot be opened, such as a dangling link: not collected)."""
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.segment import list_segments, remove_segment

    stale = [list_segments(path)]
    remove_segment(stale[0][0])
    monkeypatch.setattr(inspect_mod, "list_segments", lambda p: stale.pop() if stale else list_segments(p))


def test_check_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_journal(tmp_path, 8)  # segments 0, 3 and 6
    _collected_after_listing(tmp_path, monkeypatch)
    # It was a bare FileNotFoundError, out of a check of a sound journal.
    report = check(tmp_path)
    assert report.ok and report.problems == []
    assert (report.messages, report.segments) == (5, 2)


def test_describe_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_journal(tmp_path, 8)  # segments 0, 3 and 6
    _collected_after_listing(tmp_path, monkeypatch)
    # It was a bare FileNotFoundError (`journalq info` on a live queue's topic).
    info = describe(tmp_path)
    assert [s.base for s in info.segments] == [3, 6]
    assert (info.first_offset, info.end_offset, info.messages) == (3, 8, 5)


def test_first_offset_since_passes_over_a_segment_collected_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import journalq.journal.inspect as inspect_mod
    from journalq.journal.inspect import first_offset_since
    from journalq.journal.segment import list_segments, remove_segment

    small_journal(tmp_path, 8)
    listed = list_segments(tmp_path)
    remove_segment(listed[0])
    monkeypatch.setattr(inspect_mod, "list_segments", lambda path: listed)
    # It was OffsetOutOfRangeError ("offset 0 is no longer stored"): the scan began where the
    # journal had begun, from its own listing, not at the oldest message stored.
    assert first_offset_since(tmp_path, 0) == 3
    assert first_offset_since(tmp_path, 2**62) == 8


# -- temporary files ----------------------------------------------------------------------------


@pytest.mark.parametrize("pid", ["0", "4294967296", "99999999999999999999999"])
def test_check_takes_a_temporary_file_naming_no_possible_process_for_abandoned(tmp_path: Path, pid: str) -> None:
    small_journal(tmp_path)
    leftover = tmp_path / "jnl" / f"{0:016x}.idx.{pid}.tmp"
    leftover.write_bytes(b"x")
    os.utime(leftover, (1, 1))  # long ago
    # A pid past a C long raised OverflowError out of check; pid 0 (os.kill's "my process
    # group") was taken for a live process's write in progress, for ever.
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.file, p.fixed) for p in report.problems] == [("index", leftover, True)]
    assert not leftover.exists()


# -- a dangling link with a segment's name -----------------------------------------------------


@pytest.fixture
def dangling(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A journal of segments 0, 2, 4, 6 and 8 (the last, empty) where one of them, as
    ``request.param`` says, is a link to nowhere: the link."""
    with Writer(tmp_path, segment_size=100) as writer:
        writer.append_many([b"v" * 30] * 9)  # two messages a segment
    assert [s.base for s in list_segments(tmp_path)] == [0, 2, 4, 6, 8]
    link = segment_at(tmp_path, request.param).path
    link.unlink()
    link.symlink_to(tmp_path / "nowhere")
    return link


@pytest.mark.parametrize("dangling", [0, 4, 8], indirect=True, ids=["first", "middle", "last"])
def test_describe_names_a_segment_that_is_a_dangling_link(tmp_path: Path, dangling: Path) -> None:
    """``describe`` (``journalq info``, the hub's status) skipped it as a segment collected since
    the listing: the journal read as whole without it (a last one gone, its end one segment
    early). A segment listed still that cannot be opened is refused by name, as one that is a
    directory."""
    with pytest.raises(JournalError) as info:
        describe(tmp_path)
    assert (info.value.reason, info.value.file) == ("segment is listed but cannot be opened", dangling)
    result = CliRunner().invoke(cli, ["info", str(tmp_path), "--format", "jsonl"])
    assert result.exit_code != 0 and str(dangling) in result.output, result.output


@pytest.mark.parametrize("dangling", [0, 4, 8], indirect=True, ids=["first", "middle", "last"])
@pytest.mark.parametrize("repair", [False, True])
def test_check_reports_a_segment_that_is_a_dangling_link(tmp_path: Path, dangling: Path, repair: bool) -> None:
    """``check`` skipped it the same way, and said the journal was ok; with ``repair`` and the
    last segment the link, it failed with a bare FileNotFoundError. It is a segment problem,
    named, never repaired (a directory there is one too)."""
    report = check(tmp_path, repair=repair)
    assert not report.ok
    assert [(p.kind, p.file, p.reason, p.fixed) for p in report.problems] == [
        ("segment", dangling, "segment is listed but cannot be opened", False)
    ]
    assert dangling.is_symlink()


# -- check --repair of an index past damage ------------------------------------------------------


def _damage_offset_field(segment_path, position: int) -> None:
    data = bytearray(segment_path.read_bytes())
    data[position + 7] ^= 0x01  # the low byte of the offset field of the message there
    segment_path.write_bytes(bytes(data))


def test_check_repair_keeps_the_index_entries_past_damage(tmp_path):
    # The sound index entries past damage in a sealed segment are what let a reader seek over
    # it (to a committed offset after it). check called them stale, and --repair rebuilt the
    # index from the messages before the damage only: the seek then failed at the damage.
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first = list_segments(tmp_path)[0]
    assert first.index_path.exists()
    _damage_offset_field(first.path, 32 * 500)  # every message is 32 bytes
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000
    report = check(tmp_path)
    assert [p.kind for p in report.problems] == ["segment"]
    assert "offset 501 where 500 was due" in report.problems[0].reason
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.fixed) for p in report.problems] == [("segment", False)]
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000


def test_check_repair_of_a_stale_index_past_damage_keeps_the_sound_entries(tmp_path):
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first = list_segments(tmp_path)[0]
    entries = index.read_entries(first)
    assert len(entries) > 2
    _damage_offset_field(first.path, 32 * 100)
    # One entry that points at no message: the index is stale, and rebuilt.
    index.write_index(first, [*entries, (entries[-1][0] + 1, entries[-1][1] + 5)])
    report = check(tmp_path, repair=True)
    assert [(p.kind, p.fixed) for p in report.problems] == [("segment", False), ("index", True)]
    assert index.read_entries(first) == entries
    assert check(tmp_path).remaining == report.remaining[:1]
    with Scanner(tmp_path, 1000) as scanner:
        assert scanner.read_batch(1)[0].offset == 1000


# -- where whole messages start again after damage (``Problem.resume``) ----------------------------


def test_check_names_the_first_index_entry_past_damage_as_where_messages_resume(tmp_path):
    """What a channel stuck at the damage skips to (``journalq queue skip``): the first entry of the
    index past the damage that the segment confirms, and from there a scanner reads on."""
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first = list_segments(tmp_path)[0]
    _damage_offset_field(first.path, 32 * 500)
    (problem,) = check(tmp_path).problems
    resume, position = next(e for e in index.read_entries(first) if e[0] > 500)
    assert (problem.offset, problem.resume) == (500, resume)
    assert f"whole messages start again at offset {resume} (byte {position}" in problem.reason
    with Scanner(tmp_path, resume) as scanner:
        assert scanner.read_batch(1)[0].offset == resume


def test_check_names_the_next_segment_where_no_index_entry_follows_damage(tmp_path):
    with Writer(tmp_path, segment_size=50_000) as writer:
        writer.append_many([b"v%05d" % i for i in range(3000)])
    first, second = list_segments(tmp_path)[:2]
    last_message = first.path.stat().st_size - 32
    _damage_offset_field(first.path, last_message)  # after the segment's last index entry
    (problem,) = check(tmp_path).problems
    assert (problem.kind, problem.offset, problem.resume) == ("segment", second.base - 1, second.base)
    assert problem.reason.endswith(f"whole messages start again at offset {second.base} (the next segment)")


def test_check_names_no_resume_for_a_tail_that_a_writer_cuts(tmp_path):
    with Writer(tmp_path) as writer:
        writer.append_many([b"v%05d" % i for i in range(100)])
    (segment,) = list_segments(tmp_path)
    with segment.path.open("ab") as f:
        f.write(b"\xff" * 20)
    (problem,) = check(tmp_path).problems
    assert (problem.kind, problem.resume) == ("tail", None)
    assert "start again" not in problem.reason


def test_check_says_a_size_that_reaches_past_the_end_before_indexed_messages_is_damage(tmp_path):
    """Such a message looks like an append under way, but a writer indexes only whole messages,
    in order: with an entry after it, it is damage, and check says so, and where to go on."""
    segment = size_past_the_end(tmp_path, 500)
    each = segment.stat().st_size // 2000  # every message takes as many bytes
    (problem,) = check(tmp_path).problems
    assert (problem.kind, problem.offset) == ("segment", 500) and problem.resume is not None
    assert problem.reason.startswith(
        f"incomplete message ({each * 1500} bytes to the segment's end), yet whole messages stand after it"
    ), problem.reason
