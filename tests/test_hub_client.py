"""The hub's client: the pusher's resume logic against a hub that fails (before or after it
stores), shard roots, sources, backoff."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from journalq.errors import HubConflictError, HubError, HubGapError, HubUnavailableError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, Pusher, sources_at
from journalq.hub.protocol import Held, PushResult
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.shard import ShardedWriter


def write(path: Path, count: int, start: int = 0, segment_size: int = 3000) -> None:
    with Writer(path, segment_size=segment_size) as writer:
        writer.append_many([b"m%d" % i * (1 + i % 9) for i in range(start, start + count)])


def segments(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((path / "jnl").glob("*.jnl"))}


class FlakyHub:
    """A hub (a ``HubStore`` in the process) whose calls fail as a network would: before the
    request reaches it, or after it stored a push but before the answer comes back."""

    def __init__(self, store: HubStore, failure_rate: float, seed: int = 1) -> None:
        self.store, self.failure_rate, self.rng = store, failure_rate, random.Random(seed)
        self.failures = 0

    def _maybe_fail(self) -> None:
        if self.rng.random() < self.failure_rate:
            self.failures += 1
            raise HubUnavailableError("connection reset (injected)")

    def held(self, client_id: str, journal: str) -> Held:
        self._maybe_fail()
        return self.store.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        self._maybe_fail()
        result = self.store.push(push)
        self._maybe_fail()  # stored, but the answer is lost
        return result


def no_wait() -> Backoff:
    return Backoff(initial=0.0, maximum=0.0)


@pytest.fixture
def store(tmp_path: Path):
    with HubStore(tmp_path / "hub") as hub:
        yield hub


def test_a_push_through_failures_before_and_after_storing_copies_every_journal_exactly(
    tmp_path: Path, store: HubStore
) -> None:
    write(tmp_path / "orders", 600)
    with ShardedWriter(tmp_path / "events", prefix="events", bit=2, segment_size=2000) as sharded:
        for i in range(800):
            sharded.append(b"e%d" % i, key=b"k%d" % (i % 37))
    flaky = FlakyHub(store, failure_rate=0.3)
    with Pusher(flaky, "c1", [tmp_path / "orders", tmp_path / "events"], chunk=500, backoff=no_wait()) as pusher:
        copies = pusher.run()
    assert flaky.failures > 20 and not any(c.failed for c in copies)
    names = sorted(c.name for c in copies)
    assert names == ["events.2.000", "events.2.001", "events.2.002", "events.2.003", "orders"]
    assert segments(store.root / "c1.orders") == segments(tmp_path / "orders")
    for name in names[:4]:
        assert segments(store.root / f"c1.{name}") == segments(tmp_path / "events" / name)


def test_a_pusher_copies_what_is_appended_between_runs(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 100)
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        pusher.run()
        write(tmp_path / "j", 100, start=100)
        (copy,) = pusher.run()
    assert copy.hub_next == 200 and segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_a_source_past_zero_starts_its_copy_at_its_oldest_segment(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 300)
    for path in sorted((tmp_path / "j" / "jnl").glob("*"))[:4]:
        path.unlink()
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        (copy,) = pusher.run()
    assert copy.failed is None and segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_messages_deleted_before_they_were_copied_are_reported(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "j", 300)
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        pusher.run()
    write(tmp_path / "j", 300, start=300)
    for path in sorted((tmp_path / "j" / "jnl").glob("*"))[:-4]:
        path.unlink()
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        (copy,) = pusher.run()
    assert isinstance(copy.failed, HubGapError) and "deleted before they were copied" in str(copy.failed)


def test_a_journal_that_is_not_the_copied_one_is_refused_and_the_others_go_on(tmp_path: Path, store: HubStore) -> None:
    store.push(Push("c1", "a", 0, 0, encode_batch(0, 0, [b"other", b"journal", b"entirely"])[0]))
    write(tmp_path / "a", 50)
    write(tmp_path / "b", 50)
    with Pusher(store, "c1", [tmp_path / "a", tmp_path / "b"], backoff=no_wait()) as pusher:
        copies = {c.name: c for c in pusher.run()}
    assert isinstance(copies["a"].failed, HubConflictError) and copies["b"].failed is None
    assert store.held("c1", "a").next == 3 and store.held("c1", "b").next == 50


def test_a_hub_that_holds_more_than_the_journal_is_a_conflict(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "a", 50)
    with Pusher(store, "c1", [tmp_path / "a"], backoff=no_wait()) as pusher:
        pusher.run()
    for path in (tmp_path / "a" / "jnl").iterdir():
        path.unlink()
    write(tmp_path / "a", 10)  # recreated
    with Pusher(store, "c1", [tmp_path / "a"], backoff=no_wait()) as pusher:
        (copy,) = pusher.run()
    assert isinstance(copy.failed, HubConflictError) and "past the end" in str(copy.failed)


def test_an_unreachable_hub_is_given_up_on_only_when_asked(tmp_path: Path, store: HubStore) -> None:
    write(tmp_path / "a", 5)
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    with Pusher(
        FlakyHub(store, 1.0), "c1", [tmp_path / "a"], backoff=no_wait(), give_up_after=10, clock=clock
    ) as pusher:
        with pytest.raises(HubUnavailableError, match="gave up after 10 s"):
            pusher.run()


def test_sources_are_journals_and_shards_by_name(tmp_path: Path) -> None:
    write(tmp_path / "x" / "orders", 1)
    write(tmp_path / "y" / "orders", 1)
    write(tmp_path / "root" / "2.000", 1)
    write(tmp_path / "root" / "2.001", 1)
    assert [n for n, _ in sources_at([tmp_path / "x" / "orders", tmp_path / "root"])] == ["2.000", "2.001", "orders"]
    with pytest.raises(HubError, match="two journals would have one name on the hub, 'orders'"):
        sources_at([tmp_path / "x" / "orders", tmp_path / "y" / "orders"])


def test_backoff_doubles_up_to_its_maximum_with_jitter() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(8)]
    assert all(0.75 * 0.1 * 2**i <= d <= 0.1 * 2**i for i, d in enumerate(delays[:3]))
    assert all(0.75 <= d <= 1.0 for d in delays[4:])
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_a_journal_without_its_first_segment_yet_is_copied_once_it_has_one(tmp_path: Path, store: HubStore) -> None:
    # A writer makes jnl/ before its first segment: a pusher (following a root, say) may look in
    # between, and must not stay stuck on the segment it did not find.
    (tmp_path / "j" / "jnl").mkdir(parents=True)
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        (copy,) = pusher.run()
        assert copy.hub_next == 0
        write(tmp_path / "j", 50)
        (copy,) = pusher.run()
    assert copy.failed is None and copy.hub_next == 50
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_a_journal_replaced_while_it_is_followed_is_reported_not_taken_for_caught_up(
    tmp_path: Path, store: HubStore
) -> None:
    """A followed journal deleted and made anew under the same name: the reader, at the end of
    the old one's newest segment (deleted now: gc never deletes that one), must not take the old
    file's end for the journal's for ever (the new journal would never be copied, nor refused),
    nor go on in the new journal without the hub comparing (two journals in one copy)."""
    write(tmp_path / "j", 50)
    with Pusher(store, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
        (copy,) = pusher.run()
        assert copy.hub_next == 50
        copied = segments(store.root / "c1.j")
        shutil.rmtree(tmp_path / "j")
        write(tmp_path / "j", 300)
        for _ in range(3):
            pusher.round()
    assert copy.failed is not None and "deleted or replaced" in str(copy.failed)
    assert segments(store.root / "c1.j") == copied


class SwappableHub:
    """A hub whose store can be replaced between calls, as a hub restarted on another root."""

    def __init__(self, store: HubStore) -> None:
        self.store = store

    def held(self, client_id: str, journal: str) -> Held:
        return self.store.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        return self.store.push(push)


def test_a_copy_the_hub_lost_is_copied_again_from_the_start_not_from_a_segment_start(tmp_path: Path) -> None:
    """The hub lost a copy (deleted, or never synced under --sync none) while a pusher followed
    its journal, at a segment start of the source: the pusher's next push, there, would start a
    new copy that lacks every message before it. It is copied again from the journal's start."""
    with Writer(tmp_path / "j", segment_size=3000) as writer:
        while writer.segment.base != writer.next_offset or writer.next_offset == 0:
            writer.append(b"m" * 40)  # until a segment was just started: the pusher stops there
    hub = SwappableHub(HubStore(tmp_path / "hub"))
    try:
        with Pusher(hub, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
            (copy,) = pusher.run()
            at = copy.hub_next
            assert at and (tmp_path / "j" / "jnl" / f"{at:016x}.jnl").exists()
            hub.store.close()
            shutil.rmtree(tmp_path / "hub" / "c1.j")
            hub.store = HubStore(tmp_path / "hub")  # restarted, without the copy
            write(tmp_path / "j", 10, start=at)
            (copy,) = pusher.run()
        assert copy.failed is None and hub.store.held("c1", "j").first == 0
        assert segments(tmp_path / "hub" / "c1.j") == segments(tmp_path / "j")
    finally:
        hub.store.close()
