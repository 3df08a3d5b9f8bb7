"""The channel state machine (``journalq.queue.state``) alone: events in, decisions out.

Unit tests for each event, then a hypothesis state machine that applies random sequences of
events at a rising clock and checks the invariants after every step: cursor <= frontier, no offset
both finished and in flight, group holds never negative (and equal to the hidden deliveries of
each group), snapshot -> restore gives an equivalent state, and replaying the whole event log in a
fresh state (what another process does) gives the same state.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from journalq.queue.state import ChannelState, Event, EventKind, StaleReceipt

S = 1_000_000_000  # one second in nanoseconds


def deliver(offset: int, seq: int, visible_at: int, consumer: str = "c1", group: str | None = None) -> Event:
    return Event(EventKind.DELIVER, offset, seq, visible_at, consumer, group=group)


def finish(offset: int, seq: int = 1) -> Event:
    return Event(EventKind.FINISH, offset, seq)


def observe(state: ChannelState, now: int) -> dict:
    """Everything a caller can see of a state at ``now`` (after ``expire``)."""
    state.expire(now)
    top = max([state.frontier + 2, *state.finished_at, *state.metadata]) + 1
    return {
        "cursor": state.cursor,
        "frontier": state.frontier,
        "inflight": {o: (d.seq, d.visible_at, d.consumer, d.group) for o, d in state.inflight.items()},
        "ready": list(state.ready),
        "skipped": list(state.skipped),
        "finished": sorted(state.finished),
        "group_holds": dict(state.group_holds),
        "metadata": dict(state.metadata),
        "finished_at": dict(state.finished_at),
        "dead": state.dead,
        "collected_below": state.collected_below,
        "last_collect": state.last_collect,
        "candidates": list(state.candidates()),
        "next_expiry": state.next_expiry(),
        "tasks": [state.task_state(o, now) for o in range(top)],
    }


def check_invariants(state: ChannelState) -> None:
    assert 0 <= state.cursor <= state.frontier
    inflight = set(state.inflight)
    assert not inflight & state.finished, "an offset both finished and in flight"
    assert not inflight & set(state.skipped)
    assert not state.finished & set(state.skipped)
    assert set(state.ready) <= inflight
    for offsets in (inflight, state.finished, set(state.skipped)):
        assert all(state.cursor <= o < state.frontier for o in offsets)
    assert state.cursor not in state.finished  # the cursor always stops at an unfinished offset
    assert all(n > 0 for n in state.group_holds.values()), state.group_holds
    hidden: dict[str, int] = {}
    for offset, d in state.inflight.items():
        assert d.offset == offset and d.seq >= 1
        if d.group is not None and offset not in state.ready:
            hidden[d.group] = hidden.get(d.group, 0) + 1
    assert state.group_holds == hidden


# -- unit tests ------------------------------------------------------------------------------


def test_event_encode_decode_round_trip() -> None:
    events = [
        deliver(7, 3, 123 * S, "host:1:abc", group="g1"),
        deliver(0, 1, 5, "c"),
        Event(EventKind.FINISH, 9, 2),
        Event(EventKind.DEAD, 9, 4),
        Event(EventKind.VISIBILITY, 4, 1, 99 * S),
        Event(EventKind.METADATA, 12, payload=b'{"a":1}'),
        Event(EventKind.SKIP_TO, 40),
        Event(EventKind.SNAPSHOT, 0, payload=ChannelState().snapshot()),
        Event(EventKind.COLLECT, 0, visible_at=-5 * S),
    ]
    for event in events:
        type_, key, value = event.encode()
        assert Event.decode(type_, key, value) == event


def test_deliver_and_finish_in_order_move_the_cursor() -> None:
    s = ChannelState()
    s.apply(deliver(0, 1, 10 * S), 0)
    s.apply(deliver(1, 1, 10 * S), 0)
    assert (s.cursor, s.frontier) == (0, 2)
    s.apply(finish(0), 1)
    assert s.cursor == 1
    s.apply(finish(1), 1)
    assert (s.cursor, s.frontier) == (2, 2)
    assert not s.inflight and not s.finished
    check_invariants(s)


def test_finish_out_of_order_keeps_the_cursor_at_the_oldest_unfinished() -> None:
    s = ChannelState()
    for o in range(3):
        s.apply(deliver(o, 1, 10 * S), 0)
    s.apply(finish(2), 1)
    assert s.cursor == 0 and s.finished == {2}
    s.apply(finish(1), 1)
    assert s.cursor == 0 and s.finished == {1, 2}
    s.apply(finish(0), 1)
    assert s.cursor == 3 and s.finished == set()
    check_invariants(s)


def test_delivering_past_the_frontier_skips_the_offsets_between() -> None:
    s = ChannelState()
    s.apply(deliver(3, 1, 10 * S), 0)
    assert s.frontier == 4 and list(s.skipped) == [0, 1, 2]
    assert list(s.candidates()) == [0, 1, 2]
    s.apply(deliver(1, 1, 10 * S), 0)
    assert list(s.skipped) == [0, 2]
    check_invariants(s)


def test_visibility_expires_by_the_clock_alone() -> None:
    s = ChannelState()
    s.apply(deliver(0, 1, 10 * S), 0)
    s.expire(9 * S)
    assert list(s.candidates()) == [] and s.next_expiry() == 10 * S
    assert s.task_state(0, 9 * S) == "claimed"
    s.expire(10 * S)
    assert list(s.candidates()) == [0]
    assert s.task_state(0, 10 * S) == "inserted"
    assert s.receive_count(0) == 1 and s.next_expiry() is None
    s.apply(deliver(0, 2, 20 * S, "c2"), 11 * S)
    assert list(s.candidates()) == [] and s.receive_count(0) == 2
    check_invariants(s)


def test_expired_message_comes_before_newer_ones() -> None:
    s = ChannelState()
    s.apply(deliver(0, 1, 5 * S), 0)
    s.apply(deliver(1, 1, 50 * S), 0)
    s.apply(Event(EventKind.SKIP_TO, 0), 0)  # no-op: below the cursor
    s.expire(6 * S)
    assert list(s.candidates()) == [0]  # the caller then reads new ones from the frontier (2)
    assert s.frontier == 2


def test_change_visibility_hides_again_and_releases() -> None:
    s = ChannelState()
    s.apply(deliver(0, 1, 5 * S, group="g"), 0)
    s.apply(Event(EventKind.VISIBILITY, 0, 1, 100 * S), 1 * S)
    s.expire(10 * S)
    assert list(s.candidates()) == [] and s.group_holds == {"g": 1}
    s.apply(Event(EventKind.VISIBILITY, 0, 1, 11 * S), 10 * S)  # release in 1 s
    s.expire(11 * S)
    assert list(s.candidates()) == [0] and s.group_holds == {}
    # a ready delivery hidden again is held again
    s.apply(Event(EventKind.VISIBILITY, 0, 1, 30 * S), 12 * S)
    s.expire(12 * S)
    assert s.group_holds == {"g": 1}
    # a visibility change of an older delivery changes nothing
    s.apply(deliver(0, 2, 40 * S, group="g"), 31 * S)
    s.apply(Event(EventKind.VISIBILITY, 0, 1, 0), 32 * S)
    s.expire(33 * S)
    assert s.inflight[0].seq == 2 and s.inflight[0].visible_at == 40 * S
    check_invariants(s)


def test_receipts_of_earlier_deliveries_are_stale() -> None:
    s = ChannelState()
    s.apply(deliver(5, 1, 1 * S), 0)
    assert s.check_receipt(5, 1).seq == 1
    s.expire(2 * S)
    s.apply(deliver(5, 2, 10 * S, "other"), 2 * S)
    with pytest.raises(StaleReceipt, match=r"delivered again \(delivery 2\)"):
        s.check_receipt(5, 1)
    s.apply(finish(5, 2), 3 * S)
    with pytest.raises(StaleReceipt, match="no longer in flight"):
        s.check_receipt(5, 2)


def test_group_holds_follow_hidden_deliveries() -> None:
    s = ChannelState()
    s.apply(deliver(0, 1, 10 * S, group="a"), 0)
    s.apply(deliver(1, 1, 10 * S, group="b"), 0)
    s.apply(deliver(2, 1, 20 * S, group="a"), 0)
    assert s.group_holds == {"a": 2, "b": 1}
    s.expire(10 * S)
    assert s.group_holds == {"a": 1}
    s.apply(finish(0), 11 * S)  # finishing a ready delivery does not unhold twice
    s.apply(finish(1), 11 * S)
    assert s.group_holds == {"a": 1}
    s.apply(finish(2), 11 * S)
    assert s.group_holds == {}
    check_invariants(s)


def test_dead_counts_and_records() -> None:
    s = ChannelState()
    s.apply(deliver(0, 3, 1 * S), 0)
    s.apply(Event(EventKind.DEAD, 0, 3), 5 * S)
    assert s.dead == 1 and s.cursor == 1
    assert s.task_state(0, 6 * S) == "dead"
    assert s.finished_at == {0: (5 * S, "dead")}


def test_skip_to_forgets_everything_below() -> None:
    s = ChannelState()
    s.apply(deliver(2, 1, 10 * S, group="g"), 0)
    s.apply(deliver(6, 1, 10 * S), 0)
    s.apply(finish(4), 0)
    s.apply(Event(EventKind.SKIP_TO, 5), 1)
    assert s.cursor == 5 and 2 not in s.inflight and s.group_holds == {}
    assert list(s.skipped) == [5] and s.frontier == 7
    check_invariants(s)
    s.apply(Event(EventKind.SKIP_TO, 10), 2)
    assert (s.cursor, s.frontier) == (10, 10) and not s.inflight
    check_invariants(s)


def test_metadata_and_task_states() -> None:
    s = ChannelState()
    s.apply(Event(EventKind.METADATA, 0, payload=b'{"step":1}'), 0)
    assert s.task_state(0, 0) == "inserted" and s.metadata[0] == {"step": 1}
    s.apply(deliver(0, 1, 10 * S, "worker"), 0)
    assert s.task_state(0, 1 * S) == "claimed"
    s.apply(finish(0), 2 * S)
    assert s.task_state(0, 3 * S) == "finished"
    assert s.finished_at[0] == (2 * S, "finished")  # kept: it has metadata


def test_collect_forgets_finished_tasks_after_their_lifetime() -> None:
    s = ChannelState()
    s.apply(Event(EventKind.METADATA, 0, payload=b'{"x":1}'), 0)
    s.apply(deliver(0, 1, 10 * S), 0)
    s.apply(deliver(1, 1, 10 * S), 0)
    s.apply(finish(0), 1 * S)
    s.apply(finish(1), 1 * S)
    s.apply(Event(EventKind.COLLECT, 0, visible_at=-100 * S), 2 * S)  # lifetime not over yet
    assert s.task_state(0, 3 * S) == "finished" and s.task_state(1, 3 * S) == "finished"
    # the second collection forgets what was finished before the first one's mark
    s.apply(Event(EventKind.COLLECT, 0, visible_at=3 * S), 4 * S)
    assert s.task_state(0, 5 * S) is None and s.task_state(1, 5 * S) is None
    assert 0 not in s.metadata and s.collected_below == 2
    assert s.task_state(2, 5 * S) == "inserted"  # not sent yet: the channel cannot tell


def test_snapshot_restore_round_trip() -> None:
    s = ChannelState()
    s.apply(deliver(0, 2, 30 * S, "a", group="g"), 0)
    s.apply(deliver(3, 1, 5 * S, "b"), 0)
    s.apply(finish(2), 0)
    s.apply(Event(EventKind.DEAD, 1, 1), 0)
    s.apply(Event(EventKind.METADATA, 3, payload=b'{"k":[1,2]}'), 0)
    s.apply(Event(EventKind.COLLECT, 0, visible_at=0), 1 * S)
    payload = s.snapshot()
    # Plain JSON; each delivery in flight an array [offset, seq, visible_at, consumer, group, stamp].
    assert json.loads(payload)["inflight"] == [[0, 2, 30 * S, "a", "g", 0], [3, 1, 5 * S, "b", None, 0]]
    r = ChannelState()
    r.apply(Event(EventKind.SNAPSHOT, 0, payload=payload), 2 * S)
    for now in (2 * S, 6 * S, 31 * S):
        assert observe(r, now) == observe(s, now)
    check_invariants(r)


# -- random sequences of events --------------------------------------------------------------

OFFSETS = st.integers(0, 24)
CONSUMERS = st.sampled_from(["c1", "c2", "c3"])


class ChannelStateMachine(RuleBasedStateMachine):
    """Random events, as a channel records them, at a clock that only goes forward."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ChannelState()
        self.now = 1_000 * S
        self.log: list[tuple[Event, int]] = []

    def record(self, event: Event) -> None:
        self.state.apply(event, self.now)
        self.log.append((event, self.now))

    @rule(seconds=st.integers(0, 40))
    def tick(self, seconds: int) -> None:
        self.now += seconds * S
        self.state.expire(self.now)

    @rule(offset=OFFSETS, consumer=CONSUMERS, hide=st.integers(0, 30))
    def deliver(self, offset: int, consumer: str, hide: int) -> None:
        """What a receive records: the next delivery number of a message that may go out."""
        group = (None, None, "a", "b")[offset % 4]  # a message's group never changes
        s = self.state
        s.expire(self.now)
        if offset in s.inflight and offset not in s.ready:
            return  # hidden: a receive would not take it
        if offset < s.cursor or offset in s.finished:
            return
        seq = s.receive_count(offset) + 1
        self.record(deliver(offset, seq, self.now + hide * S, consumer, group))
        assert s.inflight[offset].seq == seq

    @rule(offset=OFFSETS, seq=st.integers(1, 4))
    def finish_any(self, offset: int, seq: int) -> None:
        """A FINISH as recorded (only current deliveries get one), or a stale one that changes
        nothing because it names a finished offset."""
        s = self.state
        delivery = s.inflight.get(offset)
        if delivery is not None:
            self.record(finish(offset, delivery.seq))
            assert offset not in s.inflight
            assert offset < s.cursor or offset in s.finished
        elif offset < s.cursor or offset in s.finished:
            before = observe(s, self.now)
            self.record(finish(offset, seq))
            assert observe(s, self.now) == before

    @precondition(lambda self: self.state.inflight)
    @rule(data=st.data(), dead=st.booleans())
    def finish_in_flight(self, data: st.DataObject, dead: bool) -> None:
        s = self.state
        offset = data.draw(st.sampled_from(sorted(s.inflight)))
        seq = s.inflight[offset].seq
        dead_before = s.dead
        self.record(Event(EventKind.DEAD if dead else EventKind.FINISH, offset, seq))
        assert s.dead == dead_before + dead
        assert s.task_state(offset, self.now) == ("dead" if dead else "finished")

    @precondition(lambda self: self.state.inflight)
    @rule(data=st.data(), seconds=st.integers(0, 30), stale=st.booleans())
    def change_visibility(self, data: st.DataObject, seconds: int, stale: bool) -> None:
        s = self.state
        offset = data.draw(st.sampled_from(sorted(s.inflight)))
        seq = s.inflight[offset].seq
        if stale:
            before = observe(s, self.now)
            self.record(Event(EventKind.VISIBILITY, offset, seq + 1, self.now + seconds * S))
            assert observe(s, self.now) == before
        else:
            self.record(Event(EventKind.VISIBILITY, offset, seq, self.now + seconds * S))
            s.expire(self.now)
            assert (offset in s.ready) == (seconds == 0)

    @rule(offset=OFFSETS)
    def skip_to(self, offset: int) -> None:
        self.record(Event(EventKind.SKIP_TO, offset))
        assert self.state.cursor >= offset

    @rule(offset=OFFSETS, value=st.integers(0, 9))
    def metadata(self, offset: int, value: int) -> None:
        self.record(Event(EventKind.METADATA, offset, payload=json.dumps({"v": value}).encode()))

    @rule(lifetime=st.integers(0, 60))
    def collect(self, lifetime: int) -> None:
        self.record(Event(EventKind.COLLECT, 0, visible_at=self.now - lifetime * S))

    @rule()
    def compact(self) -> None:
        """A SNAPSHOT event as a channel appends it: the state replaces itself by its snapshot."""
        before = observe(self.state, self.now)
        self.record(Event(EventKind.SNAPSHOT, 0, payload=self.state.snapshot()))
        assert observe(self.state, self.now) == before

    @invariant()
    def invariants_hold(self) -> None:
        check_invariants(self.state)

    @invariant()
    def candidates_are_available(self) -> None:
        s = self.state
        s.expire(self.now)
        candidates = list(s.candidates())
        assert candidates == sorted(set(candidates))
        for offset in candidates:
            assert s.cursor <= offset < s.frontier and offset not in s.finished
            assert offset not in s.inflight or offset in s.ready

    @invariant()
    def snapshot_restores_an_equivalent_state(self) -> None:
        restored = ChannelState()
        restored.apply(Event(EventKind.SNAPSHOT, 0, payload=self.state.snapshot()), self.now)
        check_invariants(restored)
        for later in (self.now, self.now + 15 * S, self.now + 100 * S):
            twin = ChannelState()
            twin.restore(self.state.snapshot())
            assert observe(twin, later) == observe(_replay(self.log), later)

    @invariant()
    def replay_gives_the_same_state(self) -> None:
        """Another process that applies the same events (expiring at other moments) agrees."""
        assert observe(_replay(self.log), self.now) == observe(self.state, self.now)


def _replay(log: list[tuple[Event, int]]) -> ChannelState:
    state = ChannelState()
    for event, at in log:
        state.apply(event, at)
    return state


ChannelStateMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestChannelStateMachine = ChannelStateMachine.TestCase
