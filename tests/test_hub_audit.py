"""The hub audit: the pusher's backoff, hub URLs, following and closing, a lost copy, journal
names, storage failures and shutdowns of the hub's store, and what the hub's answers say."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import subprocess
import threading
import time
import warnings
from concurrent.futures import CancelledError
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
import journalq.hub.store as store_module
from journalq.errors import HubConflictError, HubError, HubUnavailableError, InvalidJournalPathError, StorageError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.hub.protocol import Held, PushResult, check_journal_name
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.hub import create_hub_app
from journalq.shard import ShardedWriter

from hub_processes import JOURNALQ, child_env, free_port, kill, start_hub, wait_until
from test_hub_client import no_wait, segments, store, write  # noqa: F401 (store: a fixture)
from test_hub_crash import hub_answers

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

URL = "/hub/v1/journals"


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


@pytest.mark.parametrize("command", [
    ["push", "--to", "localhost:8090", "--client-id", "c", "--once", "--give-up-after", "0"],
    ["status", "--hub", "localhost:8090"],
    ["get", "--hub", "localhost:8090", "--client-id", "c", "j", "0"],
])
def test_the_hub_commands_refuse_a_url_without_http_as_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    with Writer(tmp_path / "j") as writer:
        writer.append(b"x")
    args = ["hub", *command] + ([str(tmp_path / "j")] if command[0] == "push" else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "localhost:8090" in result.output and "http://HOST:PORT" in result.output


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


def test_a_full_disk_when_a_copy_starts_is_answered_503_and_the_copy_starts_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting a copy (its directory and first segment) on a full disk is a storage failure as
    any other of a push: ``StorageError``, answered 503 naming the problem, which the pusher
    waits out. It was an ``OSError`` out of the store: a bare 500 'Internal Server Error'."""
    real = store_module.fsync_dir
    full = [True]

    def fsync_dir(path: Path) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path)

    monkeypatch.setattr(store_module, "fsync_dir", fsync_dir)
    data = encode_batch(0, 1, [b"a", b"b"])[0]
    with HubStore(tmp_path / "hub") as store:
        with pytest.raises(StorageError, match="No space left"):
            store.push(Push("c1", "j", 0, 0, data))
    with TestClient(create_hub_app(tmp_path / "hub2"), raise_server_exceptions=False) as http:
        answer = http.post("/hub/v1/journals/c1/j", params={"first": 0, "segment": 0}, content=data)
        assert answer.status_code == 503 and answer.json()["kind"] == "storage"
        assert "No space left" in answer.json()["error"] and answer.headers["retry-after"] == "1"
        full[0] = False
        answer = http.post("/hub/v1/journals/c1/j", params={"first": 0, "segment": 0}, content=data)
        assert answer.status_code == 200 and answer.json()["next"] == 2


def test_a_copy_started_again_after_a_failed_start_syncs_its_entry_in_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first push that made the copy's directory but failed (or died) before syncing the
    root: the push that starts the copy later syncs the root, or a power cut could take the
    copy's directory, with every push acknowledged into it, away."""
    real = store_module.fsync_dir
    synced: list[Path] = []
    fail = [True]

    def fsync_dir(path: Path) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(store_module, "fsync_dir", fsync_dir)
    data = encode_batch(0, 1, [b"a", b"b"])[0]
    with HubStore(tmp_path / "hub") as store:
        with pytest.raises(StorageError):
            store.push(Push("c1", "j", 0, 0, data))
        assert store.push(Push("c1", "j", 0, 0, data)).held.next == 2
    assert store.root in synced and store.root / "c1.j" in synced


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


def test_a_push_whose_writer_the_closing_store_closed_is_answered_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub shutting down (``close``) just as a push takes the copy's open writer: the push is
    'unavailable' (503: push again), not the writer's 'is closed' error, which the hub answered
    400 and the pusher took for a refusal of the journal."""
    store = HubStore(tmp_path / "hub")
    store.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]))
    real_hold = Writer.hold

    def hold_after_close(writer: Writer):
        store.close()
        return real_hold(writer)

    monkeypatch.setattr(Writer, "hold", hold_after_close)
    with pytest.raises(HubUnavailableError, match="shutting down"):
        store.push(Push("c1", "j", 1, 0, encode_batch(1, 1, [b"b"])[0]))


def test_hub_push_of_a_root_of_many_shards_is_not_held_back_by_the_soft_open_files_limit(tmp_path: Path) -> None:
    """The pusher keeps a descriptor open per journal it follows, and a root of shards has up
    to 1024 (shard bit 'a'): as ``hub serve``, ``hub push`` raises its soft limit on open files
    to the hard one. Under the usual soft limit of 1024 it died 'Too many open files' part way
    through such a root; here, a root of 128 shards under a soft limit of 100."""
    with ShardedWriter(tmp_path / "events", prefix="events", bit=7) as sharded:
        for i in range(2000):
            sharded.append(b"e%d" % i, key=b"k%d" % i)
    assert len(list((tmp_path / "events").iterdir())) == 128
    port = free_port()
    hub = start_hub(tmp_path / "hub", "127.0.0.1", port, tmp_path)
    try:
        wait_until("the hub", lambda: hub_answers(f"http://127.0.0.1:{port}"), 30)

        def low_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        pushed = subprocess.run(
            [*JOURNALQ, "hub", "push", "--to", f"http://127.0.0.1:{port}", "--client-id", "c1", "--once",
             "--give-up-after", "10", str(tmp_path / "events")],
            capture_output=True, text=True, env=child_env(), preexec_fn=low_limit, timeout=120,
        )
    finally:
        kill(hub)
    assert pushed.returncode == 0, pushed.stderr[-500:]
    with HubStore(tmp_path / "hub") as store:
        assert sum(held.next for held in store.status()["c1"].values()) == 2000


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


def test_hub_answers_do_not_name_the_data_directory(tmp_path: Path) -> None:
    """As the rest of journalq serve's answers: a refusal about a copy's files (an offset not
    held, a damaged copy) says what is wrong, not where the server keeps its data."""
    data = tmp_path / "secret-place"
    with TestClient(create_app(ServerConfig(data=data)), raise_server_exceptions=False) as http:
        answer = http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0},
                           content=encode_batch(0, 1, [b"a" * 40, b"b" * 40, b"c" * 40])[0])
        assert answer.status_code == 200
        past = http.get(f"{URL}/c1/j/messages", params={"offset": 7})
        assert past.status_code == 416 and "offset 7" in past.json()["error"]
        segment = data / ".hub" / "c1.j" / "jnl" / "0000000000000000.jnl"
        damaged = bytearray(segment.read_bytes())
        damaged[3] ^= 0xFF  # the first message's offset
        segment.write_bytes(bytes(damaged))
        broken = http.get(f"{URL}/c1/j/messages", params={"offset": 0})
        assert broken.status_code >= 400 and broken.json()["error"]
        for refused in (past, broken):
            assert "secret-place" not in refused.text, refused.text
