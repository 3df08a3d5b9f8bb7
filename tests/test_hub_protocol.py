"""The hub protocol's pure part: names, what a push carries, and the hub's decision on it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journalq.errors import (
    DamagedPushError,
    HubConflictError,
    HubError,
    HubGapError,
    InvalidClientIdError,
    InvalidJournalPathError,
)
from journalq.hub.protocol import (
    Held,
    Push,
    check_client_id,
    check_journal_name,
    check_overlap,
    copy_dir_name,
    journal_url,
    parse_copy_dir_name,
    plan_push,
)
from journalq.journal.codec import OVERHEAD, Message, decode, encode_batch


def run(first: int, count: int, size: int = 10) -> bytes:
    messages = [Message(0, 1_000 + i, i % 3, b"k%d" % i, bytes([i % 251]) * (size + i % 7)) for i in range(count)]
    return encode_batch(first, 0, messages)[0]


def push(first: int, data: bytes, segment: int | None = None) -> Push:
    return Push("client-1", "orders", first, first if segment is None else segment, data)


@pytest.mark.parametrize("good", ["a", "Z9", "client_1", "web-01", "x" * 64])
def test_client_ids_that_are_taken(good: str) -> None:
    assert check_client_id(good) == good


@pytest.mark.parametrize("bad", ["", "a.b", "a/b", "..", "é", "a b", "x" * 65, None, 3])
def test_client_ids_that_are_refused(bad: object) -> None:
    with pytest.raises(InvalidClientIdError, match="client id"):
        check_client_id(bad)


@pytest.mark.parametrize("good", ["orders", "events.2.003", "2.001", "a-b_c.d", "with space"])
def test_journal_names_that_are_taken(good: str) -> None:
    assert check_journal_name(good) == good


@pytest.mark.parametrize(
    "bad, why",
    [
        ("/etc", "absolute"),
        ("..", r"leaves the hub's root"),
        ("../x", r"leaves the hub's root"),
        ("a/../../x", r"leaves the hub's root"),
        ("a/b", "more than one directory"),
        (".", "starts with a dot"),
        (".hidden", "starts with a dot"),
        ("a\\..\\b", "backslash"),
        ("a\x00b", "control character"),
        ("", "directory name"),
        ("x" * 200, "over"),
    ],
)
def test_journal_paths_that_could_leave_the_root_are_refused(bad: str, why: str) -> None:
    with pytest.raises(InvalidJournalPathError, match=why):
        check_journal_name(bad)


def test_copy_directory_names_are_client_dot_journal_and_parse_back() -> None:
    assert copy_dir_name("c1", "events.2.003") == "c1.events.2.003"
    assert parse_copy_dir_name("c1.events.2.003") == ("c1", "events.2.003")
    assert parse_copy_dir_name("nodot") is None and parse_copy_dir_name(".hub") is None
    assert journal_url("c1", "with space") == "/hub/v1/journals/c1/with%20space"


def test_a_push_names_a_segment_at_or_before_its_first_offset() -> None:
    with pytest.raises(DamagedPushError, match="past the first offset"):
        Push("c", "j", 5, 6, b"")
    with pytest.raises(DamagedPushError, match="64-bit"):
        Push("c", "j", -1, 0, b"")


def test_held_round_trips_and_refuses_nonsense() -> None:
    held = Held(3, 10, 7)
    assert Held.from_json(held.to_json()) == held and not held.empty and Held(4, 4, 4).empty
    for bad in [None, {"first": 5, "next": 4, "segment": 0}, {"first": "0", "next": 1, "segment": 0}, {"first": 0}]:
        with pytest.raises(ValueError):
            Held.from_json(bad)


def test_a_push_onto_what_the_hub_holds_is_appended_whole() -> None:
    data = run(10, 5)
    plan = plan_push(push(10, data, segment=0), Held(0, 10, 0))
    assert (plan.count, plan.skipped, plan.append, plan.overlap, plan.new_segment) == (5, 0, data, b"", False)


def test_what_the_hub_holds_already_is_skipped_and_compared() -> None:
    data = run(10, 5)
    plan = plan_push(push(10, data, segment=0), Held(0, 13, 0))
    messages, _ = decode(plan.append)
    assert [m.offset for m in messages] == [13, 14] and plan.skipped == 3 and plan.count == 2
    assert plan.overlap_first == 10 and plan.overlap + plan.append == data
    check_overlap(push(10, data), plan, plan.overlap)  # the same bytes: fine
    with pytest.raises(HubConflictError, match="differ from the ones the hub holds"):
        check_overlap(push(10, data), plan, plan.overlap[:-1] + b"\x01")


def test_a_push_entirely_held_appends_nothing() -> None:
    plan = plan_push(push(0, run(0, 4)), Held(0, 9, 0))
    assert (plan.count, plan.skipped, plan.append) == (0, 4, b"")


def test_overlap_older_than_what_the_hub_still_holds_is_skipped_without_comparing() -> None:
    data = run(0, 6)
    plan = plan_push(push(0, data), Held(2, 4, 2))
    assert plan.overlap_first == 2 and plan.skipped == 4 and plan.count == 2
    assert decode(plan.overlap)[0][0].offset == 2


def test_a_gap_is_refused_and_says_what_the_hub_holds() -> None:
    with pytest.raises(HubGapError, match="offsets 10 to 11 would be missing") as caught:
        plan_push(push(12, run(12, 2), segment=0), Held(0, 10, 0))
    assert caught.value.held == 10


def test_an_empty_copy_starts_at_a_segment_start_of_the_source() -> None:
    plan = plan_push(push(100, run(100, 3), segment=100), Held())
    assert plan.start_at == 100 and plan.count == 3 and not plan.new_segment
    with pytest.raises(HubGapError, match="push from a segment start"):
        plan_push(push(101, run(101, 3), segment=100), Held())


def test_a_new_source_segment_starts_a_new_segment_of_the_copy() -> None:
    assert plan_push(push(50, run(50, 2), segment=50), Held(0, 50, 0)).new_segment
    assert not plan_push(push(50, run(50, 2), segment=50), Held(0, 50, 50)).new_segment  # already there
    # The segment starts inside what is skipped: the copy has it already.
    assert not plan_push(push(48, run(48, 4), segment=48), Held(0, 50, 48)).new_segment


def test_an_empty_push_asks_only() -> None:
    plan = plan_push(push(7, b""), Held(0, 3, 0))
    assert (plan.count, plan.append, plan.start_at) == (0, b"", None)


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda d: d[:-1], "not a whole message"),
        (lambda d: d + b"\x00" * 5, "not a whole message"),
        (lambda d: d[:OVERHEAD + 5 - 1] + b"\x00" + d[OVERHEAD + 5:], "size field"),  # first message's size field
        (lambda d: b"\x00" * 7 + b"\x09" + d[8:], "offset 9 where 0 was due"),
        (lambda d: d[:17] + b"\xff" + d[18:], "negative key length"),
    ],
)
def test_damaged_pushes_are_refused_with_where(damage, why: str) -> None:
    data = encode_batch(0, 0, [b"abcde", b"fghij"])[0]
    with pytest.raises(DamagedPushError, match=why) as caught:
        plan_push(push(0, damage(data)), Held())
    assert "of the push" in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 6),
    held_next=st.integers(0, 8),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    extra=st.binary(max_size=40),
)
def test_damaged_bytes_are_refused_or_are_whole_messages_at_dense_offsets(count, held_next, edits, cut, extra) -> None:
    """Whatever is done to the bytes, the hub either refuses with a HubError or takes whole
    messages whose offsets follow on from what it holds. (The format has no checksum: a changed
    key or value byte is a different, well-formed message, which no check can tell.)"""
    data = bytearray(run(0, count))
    for where, value in edits:
        data[where % len(data)] = value
    damaged = bytes(data[: cut % (len(data) + 1)]) + extra
    held = Held(0, held_next, 0)
    try:
        plan = plan_push(push(0, damaged), held)
    except HubError:
        return
    taken, used = decode(plan.overlap + plan.append, 0, None, 0)
    assert used == len(damaged) and len(taken) == plan.skipped + plan.count
    appended, _ = decode(plan.append, 0, None, held.next if plan.count else None)
    assert [m.offset for m in appended] == list(range(held.next, held.next + plan.count))
