"""A copy damaged on the hub, or that the hub cannot read: what its status says (damaged, and
where), how the hub answers a push or read of it (500 in JSON, ``damaged: true``, logged with its
file), how a pusher takes it (one not following stops that journal at once, one following waits
it out), and its recovery under a hub process's open writer."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.cli.main import cli
from journalq.errors import HubUnavailableError, JournalError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.hub.protocol import Held, PushResult
from journalq.journal import Scanner, Writer
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app

from test_hub_client import TwoProcesses

URL = "/hub/v1/journals"
FIRST = encode_batch(0, 1, [b"a" * 40, b"b" * 40, b"c" * 40])[0]
SECOND = encode_batch(3, 1, [b"d" * 40])[0]


def segment(root: Path, copy: str, base: int) -> Path:
    return root / copy / "jnl" / f"{base:016x}.jnl"


def flip(file: Path, position: int) -> None:
    data = bytearray(file.read_bytes())
    data[position] ^= 0xFF
    file.write_bytes(bytes(data))


def damage_first_message(segment: Path) -> None:
    damaged = bytearray(segment.read_bytes())
    damaged[3] ^= 0xFF  # the first message's offset
    segment.write_bytes(bytes(damaged))


def test_a_damaged_copy_on_the_hub_is_a_5xx_that_the_pusher_retries_not_a_refusal(tmp_path: Path) -> None:
    """Damage in the hub's own copy is the hub's problem, not the request's: 500 (logged), which
    the client takes as a hub to wait out and push to again, never a 400 that would end the
    journal's copying for good."""
    root = tmp_path / "hub"
    first = encode_batch(0, 1, [b"a" * 40, b"b" * 40, b"c" * 40])[0]
    second = encode_batch(3, 1, [b"d" * 40])[0]
    with TestClient(create_hub_app(root), raise_server_exceptions=False) as http:
        assert http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=first).status_code == 200
        assert http.post(f"{URL}/c1/j", params={"first": 3, "segment": 3}, content=second).status_code == 200
        damage_first_message(root / "c1.j" / "jnl" / "0000000000000000.jnl")  # not the last segment
        read = http.get(f"{URL}/c1/j/messages", params={"offset": 0})
        compared = http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=first)
        for answer in (read, compared):
            assert answer.status_code == 500 and answer.json()["kind"] == "journal", answer.text
            assert "hub" not in answer.json()["error"]  # the reason, not where the hub keeps it
        client = HubClient("http://hub", http=http)
        with pytest.raises(HubUnavailableError, match="500"):
            client.push(Push("c1", "j", 0, 0, first))
        with pytest.raises(HubUnavailableError, match="500"):
            client.read("c1", "j", 0)


def test_a_copy_the_hub_cannot_read_is_a_journal_error_answered_500_in_json(tmp_path: Path, caplog) -> None:
    root = tmp_path / "hub"
    with HubStore(root) as store:
        store.push(Push("c1", "a", 0, 0, encode_batch(0, 1, [b"x" * 40] * 3)[0]))
        segment = root / "c1.a" / "jnl" / "0000000000000000.jnl"
        segment.unlink()
        segment.symlink_to(segment.name)  # a file no open can read (a loop of links)
        for read in (lambda: store.held("c1", "a"), lambda: store.read_raw("c1", "a", 0, 100),
                     lambda: store.get("c1", "a", 0)):
            with pytest.raises(JournalError, match="cannot read the copy's files: Too many levels of symbolic links"):
                read()
    caplog.set_level(logging.ERROR, "journalq.server")
    with TestClient(create_hub_app(root), raise_server_exceptions=False) as http:
        for url in ("/hub/v1/journals/c1/a", "/hub/v1/journals/c1/a/messages?offset=0"):
            answer = http.get(url)
            assert answer.status_code == 500, answer.text
            assert answer.json() == {
                "error": "cannot read the copy's files: Too many levels of symbolic links", "kind": "journal",
            }
    assert str(root / "c1.a") in caplog.text  # logged with where the copy is


# -- status of a damaged copy -------------------------------------------------------------------


def test_status_of_a_copy_whose_first_message_is_damaged_says_damaged_and_where(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    with HubStore(root) as store:
        store.push(Push("c1", "j", 0, 0, FIRST))
        store.push(Push("c1", "k", 0, 0, FIRST))
        flip(segment(root, "c1.j", 0), 7)  # the first message's offset: its only segment
        status = store.status()
    assert status["c1"]["k"] == Held(0, 3, 0)
    damaged = status["c1"]["j"]
    assert damaged.unreadable == "damaged: offset 255 where 0 was due (jnl/0000000000000000.jnl, byte 0, offset 0)"
    assert (damaged.first, damaged.next) == (0, 0)  # unknown, as the field says


def test_status_of_a_copy_damaged_in_a_segment_before_its_last(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    with HubStore(root) as store:
        store.push(Push("c1", "j", 0, 0, FIRST))
        store.push(Push("c1", "j", 3, 3, SECOND))
        assert store.status()["c1"]["j"] == Held(0, 4, 3)
        flip(segment(root, "c1.j", 0), 7)
        unreadable = store.status()["c1"]["j"].unreadable
    assert unreadable is not None and unreadable.startswith("damaged: ") and "jnl/0000000000000000.jnl" in unreadable


def test_status_of_a_copy_with_a_torn_tail_is_what_it_holds_whole(tmp_path: Path) -> None:
    """An incomplete last message is a push being written (or torn, which the next push's
    recovery cuts): not damage."""
    root = tmp_path / "hub"
    with HubStore(root) as store:
        store.push(Push("c1", "j", 0, 0, FIRST))
        with open(segment(root, "c1.j", 0), "ab") as f:
            f.write(SECOND[:20])
        assert store.status()["c1"]["j"] == Held(0, 3, 0)


def test_status_over_http_shows_the_damaged_copy(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    with TestClient(create_hub_app(root)) as http:
        assert http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=FIRST).status_code == 200
        flip(segment(root, "c1.j", 0), 7)
        answer = http.get("/hub/v1/status")
    assert answer.status_code == 200, answer.text
    copy = answer.json()["clients"]["c1"]["j"]
    assert copy["unreadable"].startswith("damaged: offset 255 where 0 was due"), copy
    assert str(root) not in answer.text  # where the hub keeps its copies is not said


# -- a copy damaged under the writer the hub holds open ------------------------------------------


@pytest.mark.parametrize("segment_size", [200, 1 << 20], ids=["last-of-two-segments", "only-segment"])
def test_a_copy_damaged_under_the_hubs_open_writer_is_recovered_not_pushed_for_ever(
    tmp_path: Path, segment_size: int
) -> None:
    """The hub's answer to "what do you hold" read the damaged copy (up to the damage), its
    pushes went through the writer it held open (past it): the pusher resumed from the one,
    was answered the other, asked again, and so on for ever, spinning, with no retry to give up."""
    source, root = tmp_path / "j", tmp_path / "hub"
    with Writer(source, segment_size=segment_size) as writer:
        writer.append_many([b"value-%d" % i for i in range(12)])
    with HubStore(root) as store:
        Pusher(store, "c1", [source], parallel=1).run()
        last = sorted((root / "c1.j" / "jnl").glob("*.jnl"))[-1]
        flip(last, 7)  # the first message of the copy's last segment: its offset
        with Writer(source, segment_size=segment_size) as writer:
            writer.append_many([b"more-%d" % i for i in range(3)])
        deadline = time.monotonic() + 20
        copies = Pusher(store, "c1", [source], parallel=1, give_up_after=10).run(
            stop=lambda: time.monotonic() > deadline
        )
        assert time.monotonic() < deadline, "the pusher went round and round"
        assert copies[0].caught_up and copies[0].failed is None
        assert store.held("c1", "j").next == 15
        with Scanner(source) as scanner, Scanner(root / "c1.j") as copy:
            assert list(copy) == list(scanner)
        assert store.status()["c1"]["j"].unreadable is None
    assert list((root / "c1.j" / "cut").iterdir())  # the damaged bytes, kept


def test_a_copy_damaged_under_another_hub_process_s_open_writer_is_recovered_by_its_next_push(tmp_path: Path) -> None:
    source, root = tmp_path / "j", tmp_path / "hub"
    with Writer(source, segment_size=200) as writer:
        writer.append_many([b"value-%d" % i for i in range(12)])
    with HubStore(root) as asked, HubStore(root) as pushed:
        hub = TwoProcesses(asked, pushed)
        Pusher(hub, "c1", [source], parallel=1).run()
        flip(sorted((root / "c1.j" / "jnl").glob("*.jnl"))[-1], 7)  # under ``pushed``'s writer
        with Writer(source, segment_size=200) as writer:
            writer.append_many([b"more-%d" % i for i in range(3)])
        deadline = time.monotonic() + 20
        copies = Pusher(hub, "c1", [source], parallel=1, give_up_after=10).run(stop=lambda: time.monotonic() > deadline)
        assert time.monotonic() < deadline, "the pusher went round and round"
        assert copies[0].caught_up and copies[0].failed is None
        assert asked.held("c1", "j").next == pushed.held("c1", "j").next == 15
    with Scanner(source) as scanner, Scanner(root / "c1.j") as copy:
        assert list(copy) == list(scanner)


# -- what a pusher is told of a damaged copy ---------------------------------------------------------


def test_a_push_or_read_meeting_a_damaged_copy_is_told_the_copy_is_damaged_and_where(tmp_path: Path) -> None:
    """``hub push`` retries a copy the hub cannot read (documented): what it shows meanwhile says
    that the hub's copy is damaged, and where, not only the codec's reason (which reads as if
    the pusher's own journal were damaged)."""
    root = tmp_path / "hub"
    with TestClient(create_hub_app(root), raise_server_exceptions=False) as http:
        assert http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=FIRST).status_code == 200
        assert http.post(f"{URL}/c1/j", params={"first": 3, "segment": 3}, content=SECOND).status_code == 200
        flip(segment(root, "c1.j", 0), 7)  # not the last segment: no recovery cuts it
        client = HubClient("http://hub", http=http)
        where = r"\(c1\.j/jnl/0000000000000000\.jnl, byte 0, offset 0\)"
        damaged = rf"answered 500: the copy is damaged: offset 255 where 0 was due {where}"
        with pytest.raises(HubUnavailableError, match=damaged):
            client.push(Push("c1", "j", 0, 0, FIRST))
        with pytest.raises(HubUnavailableError, match=rf"answered 500: the copy is damaged: .* {where}"):
            client.read("c1", "j", 0)
        answer = http.get(f"{URL}/c1/j/messages", params={"offset": 0})
    assert answer.json()["kind"] == "journal" and str(tmp_path) not in answer.text


# -- a pusher that is not following, against a damaged copy ------------------------------------


class _Counting(HubClient):
    """A ``HubClient`` counting its pushes."""

    pushes = 0

    def push(self, push: Push) -> PushResult:
        self.pushes += 1
        return super().push(push)


class _Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def progress(self, *args: Any) -> None:
        pass

    def event(self, kind: str, copy: Any, **fields: Any) -> None:
        self.kinds.append(kind)


def _damaged_copy(tmp_path: Path, http: TestClient) -> Path:
    """A journal ``j`` copied as c1.j, whose copy's message 2 (in its first segment, which no
    recovery cuts: an empty segment 3 follows it, as a hub killed as it started it leaves) is
    damaged; the journal has one message more, which a pusher resuming compares with it."""
    source = tmp_path / "j"
    with Writer(source, segment_size=150) as writer:
        writer.append_many([b"a" * 40, b"b" * 40, b"c" * 40])  # 66 bytes each: offsets 0-2
    Pusher(HubClient("http://hub", http=http), "c1", [source], parallel=1).run()
    copy = tmp_path / "hub" / "c1.j" / "jnl"
    (copy / "0000000000000003.jnl").touch()
    damaged = bytearray((copy / "0000000000000000.jnl").read_bytes())
    damaged[2 * 66 + 7] ^= 0xFF  # message 2's offset
    (copy / "0000000000000000.jnl").write_bytes(bytes(damaged))
    with Writer(source, segment_size=150) as writer:
        writer.append(b"d" * 40)
    return source


def test_a_pusher_not_following_stops_a_journal_whose_copy_is_damaged_at_once(tmp_path: Path) -> None:
    """It retried until ``give_up_after`` (``hub push --once --give-up-after``), or for ever
    without it: a retry cannot mend the hub's copy. It now fails that journal at once, saying the
    copy is damaged and where."""
    with TestClient(create_hub_app(tmp_path / "hub"), raise_server_exceptions=False) as http:
        source = _damaged_copy(tmp_path, http)
        client, events = _Counting("http://hub", http=http), _Events()
        pusher = Pusher(client, "c1", [source], parallel=1, give_up_after=30, reporter=events,
                        backoff=Backoff(initial=0.001, maximum=0.001))
        [copy] = pusher.run(follow=False)
        assert client.pushes == 1 and "retry" not in events.kinds and "error" in events.kinds
        assert isinstance(copy.failed, HubUnavailableError)
        assert "the copy is damaged: offset 253 where 2 was due (c1.j/jnl/0000000000000000.jnl" in str(copy.failed)


def test_a_following_pusher_still_waits_out_a_damaged_copy(tmp_path: Path) -> None:
    """Following, a copy repaired on the hub meanwhile is copied on: the damage is retried, as
    before, until ``give_up_after``."""
    with TestClient(create_hub_app(tmp_path / "hub"), raise_server_exceptions=False) as http:
        source = _damaged_copy(tmp_path, http)
        client, events = _Counting("http://hub", http=http), _Events()
        pusher = Pusher(client, "c1", [source], parallel=1, give_up_after=0.2, reporter=events,
                        backoff=Backoff(initial=0.001, maximum=0.001))
        with pytest.raises(HubUnavailableError, match="gave up after 0.2 s: .* the copy is damaged"):
            pusher.run(follow=True)
        assert client.pushes > 1 and "retry" in events.kinds


def test_hub_push_once_says_at_once_that_the_copy_is_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import journalq.cli.hub as cli_hub

    with TestClient(create_hub_app(tmp_path / "hub"), raise_server_exceptions=False) as http:
        source = _damaged_copy(tmp_path, http)
        monkeypatch.setattr(cli_hub, "HubClient", lambda url, token=None, **kw: HubClient(url, http=http))
        result = CliRunner().invoke(cli, ["hub", "push", "--to", "http://hub:8090", "--client-id", "c1", "--once",
                                          "--give-up-after", "30", "--progress", "jsonl", str(source)])
    assert result.exit_code == 1, result.output
    assert '"event":"retry"' not in result.output.replace(" ", "")
    assert "1 journal(s) not copied: j: hub http://hub:8090 answered 500: the copy is damaged" in result.output
