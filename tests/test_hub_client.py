"""The hub's client: the pusher's resume logic against a hub that fails (before or after it
stores), lost its copy or answers two ends, shard roots, sources, backoff (per journal), hub
URLs, following until nothing is left to follow, and closing part way through a round."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import httpx
import pytest

from journalq.errors import HubConflictError, HubError, HubGapError, HubUnavailableError, InvalidJournalPathError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, HubClient, Pusher, sources_at
from journalq.hub.protocol import Held, PushResult, check_journal_name
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.shard import ShardedWriter

from conftest import write_numbered
from hub_processes import wait_until


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


# -- backoff per journal; a copy lost while its source is idle ------------------------------------


class BusyForOne:
    """A hub in the process that answers one journal's pushes as a busy hub does (503: its copy
    locked by another program, say) and takes the others'."""

    def __init__(self, store: HubStore, busy: str) -> None:
        self.store, self.busy, self.refused = store, busy, 0

    def held(self, client_id: str, journal: str) -> Held:
        return self.store.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        if push.journal == self.busy:
            self.refused += 1
            raise HubUnavailableError("hub answered 503: not stored: the copy is locked (injected)")
        return self.store.push(push)


def test_one_journal_answered_503_does_not_slow_the_others(tmp_path: Path) -> None:
    """Backoff is per journal: while the hub turns one journal's pushes away, the others are
    pushed at full speed, not after every wait of the busy one."""
    write_numbered(tmp_path / "busy", 5)
    write_numbered(tmp_path / "free", 400)  # 400 chunks of one message: 50 rounds of 8 chunks
    with HubStore(tmp_path / "hub", sync="none") as store:  # pushes as fast as can be: the waits show
        hub = BusyForOne(store, "busy")
        with Pusher(hub, "c1", [tmp_path / "busy", tmp_path / "free"], chunk=64, parallel=1,
                    backoff=Backoff(initial=0.05, maximum=0.05)) as pusher:
            started = time.monotonic()
            pusher.run(follow=True, stop=lambda: pusher.copies["free"].caught_up or time.monotonic() - started > 20)
            took = time.monotonic() - started
        assert store.held("c1", "free").next == 400 and pusher.copies["busy"].failed is None
        assert took < 1.0, f"the free journal took {took:.1f} s (50 rounds, each waiting out the busy one?)"
        assert 2 <= hub.refused <= 2 + took / 0.05 * 1.5  # the busy one was tried again, at its own pace


def test_a_copy_lost_while_its_source_is_idle_is_copied_anew_at_the_next_check(tmp_path: Path) -> None:
    """The hub lost the copy (its directory removed) while nothing is appended to the source: the
    pusher notices at its periodic check (one question per journal, none of its bytes), not only
    once the source is appended to again, and copies it anew."""
    write_numbered(tmp_path / "j", 30, segment_size=400)
    write_numbered(tmp_path / "other", 3)
    with HubStore(tmp_path / "hub") as store:
        asked = []

        class Counting:
            def held(self, client_id: str, journal: str) -> Held:
                asked.append(journal)
                return store.held(client_id, journal)

            def push(self, push: Push) -> PushResult:
                return store.push(push)

        with Pusher(Counting(), "c1", [tmp_path / "j", tmp_path / "other"], check_interval=0.3,
                    report_interval=0.05, backoff=Backoff(initial=0.0, maximum=0.0)) as pusher:
            done = threading.Event()
            follower = threading.Thread(target=pusher.run, kwargs={"follow": True, "stop": done.is_set})
            follower.start()
            try:
                wait_for(lambda: all(c.caught_up for c in pusher.copies.values()))
                original = segments(tmp_path / "j")
                store.close()  # as a hub restarted with the copy gone
                shutil.rmtree(tmp_path / "hub" / "c1.j")
                asked.clear()
                with HubStore(tmp_path / "hub") as again:
                    store = again
                    wait_for(lambda: segments(tmp_path / "hub" / "c1.j") == original)
                    time.sleep(0.5)
                    assert asked.count("other") <= 4  # a question per check, not per round
            finally:
                done.set()
                follower.join(10)
        assert segments(tmp_path / "hub" / "c1.other") == segments(tmp_path / "other")


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class TwoProcesses:
    """Two hub processes serving one root (as several may): what it holds asked of the one,
    pushes sent to the other."""

    def __init__(self, asked: HubStore, pushed: HubStore) -> None:
        self.asked, self.pushed = asked, pushed

    def held(self, client_id: str, journal: str) -> Held:
        return self.asked.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        return self.pushed.push(push)


def test_a_pusher_told_two_ends_by_the_hub_retries_and_gives_up_instead_of_spinning(tmp_path: Path) -> None:
    """Two hubs of separate roots behind one address (or any hub whose answers disagree): the
    pusher went back and forth between them at full speed, for ever, saying nothing."""
    source = tmp_path / "j"
    with Writer(source, segment_size=200) as writer:
        writer.append_many([b"value-%d" % i for i in range(12)])
    with HubStore(tmp_path / "one") as one, HubStore(tmp_path / "other") as other:
        deadline = time.monotonic() + 20
        pusher = Pusher(TwoProcesses(one, other), "c1", [source], parallel=1, give_up_after=0.3,
                        backoff=Backoff(initial=0.01, maximum=0.05))
        with pytest.raises(HubUnavailableError, match=r"gave up after 0\.3 s: the hub said it holds c1\.j up to "
                                                      r"offset 7 .* then up to 0 .*disagree"):
            pusher.run(stop=lambda: time.monotonic() > deadline)
        assert time.monotonic() < deadline


# -- backoff, hub URLs, following, a lost copy, 408, journal names, closing ---------------------------


def test_backoff_stays_at_its_maximum_however_long_the_hub_is_down() -> None:
    """A hub down for an hour (well over a thousand attempts at two seconds) is still waited
    for: the delay stays at its maximum instead of overflowing a float."""
    backoff = Backoff(initial=0.05, maximum=2.0)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert all(1.5 <= d <= 2.0 for d in delays[-100:])
    backoff = Backoff(initial=0.0, maximum=1.0)  # no wait at all, however many attempts
    assert [backoff.next_delay() for _ in range(5000)][-1] == 0.0


@pytest.mark.parametrize("url", ["localhost:8090", "hub", "ftp://hub:8090", "http://", "http://hub:99999", "http://hub:0"])
def test_a_hub_url_that_is_not_http_host_port_is_refused_at_once(url: str) -> None:
    """Not retried for ever as an unreachable hub: the URL itself is wrong, and said so."""
    with pytest.raises(HubError, match="hub URL") as caught:
        HubClient(url)
    assert not isinstance(caught.value, HubUnavailableError)


def test_following_ends_once_every_journal_was_refused(tmp_path: Path, store: HubStore) -> None:
    """Nothing is left to follow: ``hub push`` (which follows by default) exits 1 saying why,
    instead of waiting for ever with nothing to push."""
    store.push(Push("c1", "a", 0, 0, encode_batch(0, 0, [b"other", b"journal"])[0]))
    write(tmp_path / "a", 20)
    started = time.monotonic()
    with Pusher(store, "c1", [tmp_path / "a"], backoff=no_wait(), report_interval=0.05) as pusher:
        (copy,) = pusher.run(follow=True, stop=lambda: time.monotonic() - started > 5)
    assert isinstance(copy.failed, HubConflictError)
    assert time.monotonic() - started < 3


def test_following_goes_on_while_one_journal_is_left(tmp_path: Path, store: HubStore) -> None:
    store.push(Push("c1", "a", 0, 0, encode_batch(0, 0, [b"other", b"journal"])[0]))
    write(tmp_path / "a", 20)
    write(tmp_path / "b", 20)
    started = time.monotonic()
    with Pusher(store, "c1", [tmp_path / "a", tmp_path / "b"], backoff=no_wait(), report_interval=0.05) as pusher:
        copies = pusher.run(follow=True, stop=lambda: time.monotonic() - started > 1)
    assert time.monotonic() - started > 1
    assert [c.failed is None for c in copies] == [False, True] and store.held("c1", "b").next == 20


def test_following_a_root_of_shards_goes_on_though_every_shard_was_refused(tmp_path: Path, store: HubStore) -> None:
    """A root's new shards are pushed too: refused ones are no reason to stop following it."""
    with ShardedWriter(tmp_path / "events", prefix="events", bit=1, segment_size=2000) as sharded:
        for i in range(40):
            sharded.append(b"e%d" % i, key=b"k%d" % i)
    for shard in ("events.1.000", "events.1.001"):
        store.push(Push("c1", shard, 0, 0, encode_batch(0, 0, [b"other", b"journal", b"entirely"])[0]))
    started = time.monotonic()
    with Pusher(store, "c1", [tmp_path / "events"], backoff=no_wait(), report_interval=0.05) as pusher:
        copies = pusher.run(follow=True, stop=lambda: time.monotonic() - started > 1)
    assert time.monotonic() - started > 1 and all(isinstance(c.failed, HubConflictError) for c in copies)


def test_a_copy_the_hub_lost_mid_segment_is_copied_anew_from_the_oldest_segment(tmp_path: Path) -> None:
    """A hub that lost a copy (restarted without it) answers the pusher's next push, inside a
    segment, with a gap at 0: the pusher asks what the hub holds, and a source whose oldest
    segments were deleted (retention) starts the copy anew at its oldest segment, as a first
    push does, instead of failing with 'deleted before they were copied'."""
    write(tmp_path / "j", 300)
    for path in sorted((tmp_path / "j" / "jnl").glob("*"))[:4]:
        path.unlink()
    hub = HubStore(tmp_path / "hub")
    pusher = Pusher(hub, "c1", [tmp_path / "j"], backoff=no_wait())
    try:
        (copy,) = pusher.run()
        assert copy.failed is None
        hub.close()
        shutil.rmtree(tmp_path / "hub" / "c1.j")  # lost, with the hub
        write(tmp_path / "j", 5, start=300)  # the next push starts inside a segment
        pusher.hub = hub = HubStore(tmp_path / "hub")
        (copy,) = pusher.run()
    finally:
        pusher.close()
        hub.close()
    assert copy.failed is None
    assert segments(tmp_path / "hub" / "c1.j") == segments(tmp_path / "j")


def test_a_push_answered_408_is_pushed_again_not_taken_for_a_refusal(tmp_path: Path, store: HubStore) -> None:
    """The hub answers 408 when a push's body stopped arriving for a while (a network that
    stalls): the push is sent again, as after a cut connection, instead of the journal being
    given up as refused (hub push would exit 1)."""
    write(tmp_path / "j", 30)
    stalls = [1]

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and stalls:
            stalls.pop()
            return httpx.Response(408, json={"error": "the push stopped arriving: no bytes for 10 s",
                                             "kind": "timeout"}, headers={"connection": "close"})
        held = store.held("c1", "j")
        if request.method == "GET":
            return httpx.Response(200, json=held.to_json())
        first, segment = int(request.url.params["first"]), int(request.url.params["segment"])
        result = store.push(Push("c1", "j", first, segment, request.content))
        return httpx.Response(200, json=result.to_json())

    http = httpx.Client(base_url="http://hub", transport=httpx.MockTransport(answer))
    with HubClient("http://hub", http=http) as client:
        with pytest.raises(HubUnavailableError, match="stopped arriving"):
            client.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]))
        stalls.append(1)
        with Pusher(client, "c1", [tmp_path / "j"], backoff=no_wait()) as pusher:
            (copy,) = pusher.run()
    assert copy.failed is None and not stalls
    assert segments(store.root / "c1.j") == segments(tmp_path / "j")


def test_a_journal_whose_directory_name_is_not_utf8_is_refused_by_name(tmp_path: Path, store: HubStore) -> None:
    """A local directory named with bytes that are not UTF-8 cannot be named on the hub: the
    pusher reports that journal as refused, naming why, instead of crashing on a
    UnicodeEncodeError (a traceback out of hub push)."""
    name = os.fsdecode(b"j\xff")
    with pytest.raises(InvalidJournalPathError, match="UTF-8"):
        check_journal_name(name)
    write(tmp_path / name, 5)
    write(tmp_path / "ok", 5)
    with Pusher(store, "c1", [tmp_path / name, tmp_path / "ok"], backoff=no_wait()) as pusher:
        copies = {c.name: c for c in pusher.run()}
    assert isinstance(copies[name].failed, InvalidJournalPathError) and copies["ok"].failed is None


class SlowHub:
    """A hub in the process that takes a while over each push (a slow link, a slow disk)."""

    def __init__(self, store: HubStore, delay: float) -> None:
        self.store, self.delay, self.pushes = store, delay, 0

    def held(self, client_id: str, journal: str) -> Held:
        return self.store.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        time.sleep(self.delay)
        self.pushes += 1
        return self.store.push(push)


def test_closing_a_pusher_part_way_through_a_round_stops_it_promptly(tmp_path: Path, store: HubStore) -> None:
    """Ctrl-C (or SIGTERM) on hub push closes the pusher part way through a round: the journals
    not begun are not pushed any more, and those being pushed stop after their current chunk.
    Before, closing waited for the whole round, a few chunks of every journal (minutes, for a
    root of many shards over a slow link)."""
    for i in range(12):
        write(tmp_path / f"j{i}", 100)
    hub = SlowHub(store, 0.05)
    pusher = Pusher(hub, "c1", [tmp_path / f"j{i}" for i in range(12)], chunk=64, parallel=2, backoff=no_wait())

    def push_a_round() -> None:
        with contextlib.suppress(CancelledError):  # the journals not begun, when closed
            pusher.round()

    pushing = threading.Thread(target=push_a_round)
    pushing.start()
    wait_until("the round's first pushes", lambda: hub.pushes >= 4, 10)
    started = time.monotonic()
    pusher.close()
    closing = time.monotonic() - started
    pushing.join(10)
    assert hub.pushes < 40
    assert closing < 1.0, f"close took {closing:.1f} s"  # a round: 12 journals x 8 chunks x 0.05 s / 2
