"""The hub, third audit: the status of a damaged copy says it is damaged and where (not 0/0);
the hub answers an error of its store that is not journalq's (a full disk, a bug) clearly."""

from __future__ import annotations

import errno
import time
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.errors import HubUnavailableError
from journalq.hub import HubStore, Push
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.hub.protocol import Held, PushResult
from journalq.journal import Scanner, Writer
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app

URL = "/hub/v1/journals"
FIRST = encode_batch(0, 1, [b"a" * 40, b"b" * 40, b"c" * 40])[0]
SECOND = encode_batch(3, 1, [b"d" * 40])[0]


def segment(root: Path, copy: str, base: int) -> Path:
    return root / copy / "jnl" / f"{base:016x}.jnl"


def flip(file: Path, position: int) -> None:
    data = bytearray(file.read_bytes())
    data[position] ^= 0xFF
    file.write_bytes(bytes(data))


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


# -- errors of the store that are not journalq's --------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "says"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), 503, "No space left on device"),
        (OSError(errno.EIO, "Input/output error"), 503, "Input/output error"),
        (PermissionError(errno.EACCES, "Permission denied", "/secret/hub/c1.j"), 500, "Permission denied"),
        (ValueError("a bug"), 500, "ValueError"),
    ],
)
def test_an_unexpected_error_of_the_store_is_a_clear_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, status: int, says: str
) -> None:
    def fail(self: HubStore, *args: object) -> None:
        raise error

    for method in ("status", "held", "push", "read_raw"):
        monkeypatch.setattr(HubStore, method, fail)
    with TestClient(create_hub_app(tmp_path / "hub"), raise_server_exceptions=False) as http:
        answers = [
            http.get("/hub/v1/status"),
            http.get(f"{URL}/c1/j"),
            http.post(f"{URL}/c1/j", params={"first": 0, "segment": 0}, content=FIRST),
            http.get(f"{URL}/c1/j/messages", params={"offset": 0}),
        ]
        for answer in answers:
            assert answer.status_code == status, answer.text
            assert says in answer.json()["error"] and answer.json()["kind"], answer.text
            assert ("Retry-After" in answer.headers) == (status == 503)
            assert "/secret" not in answer.text
        client = HubClient("http://hub", http=http)
        with pytest.raises(HubUnavailableError, match=f"answered {status}: .*{says}"):
            client.held("c1", "j")


def test_a_hub_root_that_cannot_be_made_is_a_clear_answer(tmp_path: Path) -> None:
    root = tmp_path / "hub"
    root.write_text("a file where the hub's root should be")
    with TestClient(create_hub_app(root), raise_server_exceptions=False) as http:
        answer = http.get("/hub/v1/status")
    assert answer.status_code == 500, answer.text
    assert "File exists" in answer.json()["error"] and str(tmp_path) not in answer.text


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


class _TwoProcesses:
    """Two hub processes serving one root (as several may): what it holds asked of the one,
    pushes sent to the other."""

    def __init__(self, asked: HubStore, pushed: HubStore) -> None:
        self.asked, self.pushed = asked, pushed

    def held(self, client_id: str, journal: str) -> Held:
        return self.asked.held(client_id, journal)

    def push(self, push: Push) -> PushResult:
        return self.pushed.push(push)


def test_a_copy_damaged_under_another_hub_process_s_open_writer_is_recovered_by_its_next_push(tmp_path: Path) -> None:
    source, root = tmp_path / "j", tmp_path / "hub"
    with Writer(source, segment_size=200) as writer:
        writer.append_many([b"value-%d" % i for i in range(12)])
    with HubStore(root) as asked, HubStore(root) as pushed:
        hub = _TwoProcesses(asked, pushed)
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


def test_a_pusher_told_two_ends_by_the_hub_retries_and_gives_up_instead_of_spinning(tmp_path: Path) -> None:
    """Two hubs of separate roots behind one address (or any hub whose answers disagree): the
    pusher went back and forth between them at full speed, for ever, saying nothing."""
    source = tmp_path / "j"
    with Writer(source, segment_size=200) as writer:
        writer.append_many([b"value-%d" % i for i in range(12)])
    with HubStore(tmp_path / "one") as one, HubStore(tmp_path / "other") as other:
        deadline = time.monotonic() + 20
        pusher = Pusher(_TwoProcesses(one, other), "c1", [source], parallel=1, give_up_after=0.3,
                        backoff=Backoff(initial=0.01, maximum=0.05))
        with pytest.raises(HubUnavailableError, match=r"gave up after 0\.3 s: the hub said it holds c1\.j up to "
                                                      r"offset 7 .* then up to 0 .*disagree"):
            pusher.run(stop=lambda: time.monotonic() > deadline)
        assert time.monotonic() < deadline
