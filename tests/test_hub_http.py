"""The hub's HTTP endpoints (``journalq hub serve``'s app, and ``journalq serve``'s, which mounts
them at DATA/.hub), and the client over them."""

from __future__ import annotations

import asyncio
import errno
import select
import socket
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.errors import (
    DamagedPushError,
    HubConflictError,
    HubGapError,
    HubUnavailableError,
    InvalidClientIdError,
    InvalidJournalPathError,
)
from journalq.hub import HubStore, Push, RawReader
from journalq.hub.client import HubClient, Pusher
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.hub import create_hub_app

from hub_processes import free_port, kill, start_hub, wait_until
from test_hub_damaged_copies import FIRST
from test_server_harness import read_all

URL = "/hub/v1/journals"


def write(path: Path, count: int) -> None:
    with Writer(path, segment_size=2500) as writer:
        writer.append_many([b"value-%d" % i for i in range(count)])


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def http(tmp_path: Path):
    with TestClient(create_hub_app(tmp_path / "hub", max_push=100_000)) as client:
        yield client


def push_run(http: TestClient, client_id: str, journal: str, first: int, segment: int, data: bytes):
    return http.post(f"{URL}/{client_id}/{journal}", params={"first": first, "segment": segment}, content=data)


def test_push_status_held_and_read_back(tmp_path: Path, http: TestClient) -> None:
    write(tmp_path / "j", 200)
    with RawReader(tmp_path / "j") as reader:
        run = reader.read(0, 1500)
    answer = push_run(http, "c1", "j", 0, 0, run.data)
    assert answer.status_code == 200
    assert answer.json() == {"client_id": "c1", "journal": "j", "first": 0, "next": run.count, "segment": 0,
                             "appended": run.count, "skipped": 0}
    assert http.get(f"{URL}/c1/j").json()["next"] == run.count
    assert http.get(f"{URL}/c1/unknown").json() == {
        "client_id": "c1", "journal": "unknown", "first": 0, "next": 0, "segment": 0
    }
    assert http.get("/hub/v1/status").json()["clients"] == {"c1": {"j": {"first": 0, "next": run.count, "segment": 0}}}
    got = http.get(f"{URL}/c1/j/messages", params={"offset": 3, "max_bytes": 1})
    assert got.headers["x-journalq-first"] == "3" and got.headers["x-journalq-count"] == "1"
    assert got.content == RawReader(tmp_path / "j").read(3, 1).data
    assert http.get(f"{URL}/c1/j/messages", params={"offset": 10_000}).status_code == 416
    assert http.get(f"{URL}/c1/nothing/messages", params={"offset": 0}).status_code == 404


@pytest.mark.parametrize("copy_started", [False, True], ids=["new-copy", "started-copy"])
def test_a_copy_held_by_an_exclusive_writer_is_answered_503_not_waited_for(
    tmp_path: Path, http: TestClient, copy_started: bool
) -> None:
    """Another program's exclusive writer on a copy (``journalq write``, say) holds its lock for
    as long as it runs: a push is answered 503 with Retry-After (the pusher comes back), not
    refused for good (400) nor left waiting for the lock, a push that creates the copy included."""
    write(tmp_path / "j", 50)
    with RawReader(tmp_path / "j") as reader:
        run = reader.read(0, 1500)
    copy = tmp_path / "hub" / "c1.j"
    with Writer(copy) as exclusive:
        if copy_started:
            exclusive.append(b"not from the source")
        answers: list[httpx.Response] = []
        pushing = threading.Thread(
            target=lambda: answers.append(push_run(http, "c1", "j", 0, 0, run.data)), daemon=True
        )
        pushing.start()
        pushing.join(timeout=10)
        assert not pushing.is_alive(), "the push waited for the exclusive writer's lock"
    assert answers[0].status_code == 503 and answers[0].headers["retry-after"] == "1"
    assert answers[0].json()["kind"] == "locked" and "exclusive writer" in answers[0].json()["error"]
    if not copy_started:
        assert push_run(http, "c1", "j", 0, 0, run.data).status_code == 200  # once it is gone


@pytest.mark.parametrize(
    "client_id, journal, first, data, status, kind",
    [
        ("c.1", "j", 5, None, 400, "client-id"),
        ("c1", "..", 5, None, 400, "journal-path"),  # quoted, so the URL is not normalised
        ("c1", ".hidden", 5, None, 400, "journal-path"),
        ("c1", "j", 5, b"\x00" * 40, 400, "damaged"),
        ("c1", "j", 7, "gap", 409, "gap"),
        ("c1", "j", 3, "conflict", 409, "conflict"),
    ],
)
def test_bad_pushes_are_refused_with_a_clear_answer_and_change_nothing(
    tmp_path: Path, http: TestClient, client_id: str, journal: str, first: int, data: object, status: int, kind: str
) -> None:
    held = encode_batch(0, 1, [b"a", b"b", b"c", b"d", b"e"])[0]
    assert push_run(http, "c1", "j", 0, 0, held).status_code == 200
    if data is None:
        data = encode_batch(first, 1, [b"f"])[0]
    elif data == "gap":
        data = encode_batch(first, 1, [b"h"])[0]
    elif data == "conflict":
        data = encode_batch(first, 1, [b"D", b"E", b"f"])[0]
    before = snapshot(tmp_path / "hub")
    quoted = journal.replace(".", "%2E") if journal.startswith(".") else journal
    answer = push_run(http, client_id, quoted, first, 0, data)  # type: ignore[arg-type]
    assert (answer.status_code, answer.json()["kind"]) == (status, kind), answer.text
    assert answer.json()["error"]
    if kind == "gap":
        assert answer.json()["next"] == 5
    assert snapshot(tmp_path / "hub") == before


def test_a_push_over_the_size_limit_is_413(http: TestClient) -> None:
    answer = push_run(http, "c1", "j", 0, 0, encode_batch(0, 1, [b"x" * 200_000])[0])
    assert answer.status_code == 413 and answer.json()["kind"] == "size"


def test_the_client_maps_refusals_to_errors(tmp_path: Path, http: TestClient) -> None:
    client = HubClient("http://testserver", http=http)
    client.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a", b"b"])[0]))
    with pytest.raises(HubGapError) as gap:
        client.push(Push("c1", "j", 5, 5, encode_batch(5, 1, [b"x"])[0]))
    assert gap.value.held == 2
    with pytest.raises(HubConflictError):
        client.push(Push("c1", "j", 1, 0, encode_batch(1, 1, [b"B"])[0]))
    with pytest.raises(DamagedPushError):
        client.push(Push("c1", "j", 2, 0, b"\x00" * 30))
    assert [m.value for m in client.get("c1", "j", 0, 5)] == [b"a", b"b"]
    assert client.status()["c1"]["j"].next == 2
    with pytest.raises(InvalidClientIdError):
        client.held("c.1", "j")
    with pytest.raises(InvalidJournalPathError):
        client.held("c1", "../j")


def test_a_push_whose_body_stops_arriving_is_answered_408(tmp_path: Path) -> None:
    """A push whose body stops coming is cut off (408, the connection closed) after the body
    timeout without bytes, as ``journalq serve`` cuts off slow bodies: it holds no connection
    (and no buffered body) for ever, and stores nothing."""
    app = create_hub_app(tmp_path / "hub", body_timeout=0.2)
    sent: list[dict] = []

    async def exchange() -> None:
        parts = [{"type": "http.request", "body": b"x" * 10, "more_body": True}]
        never = asyncio.Event()

        async def receive() -> dict:
            if parts:
                return parts.pop(0)
            await never.wait()  # the rest of the body never comes
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": f"{URL}/c1/j", "raw_path": f"{URL}/c1/j".encode(),
            "query_string": b"first=0&segment=0", "root_path": "",
            "headers": [(b"host", b"hub"), (b"content-length", b"1000")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8090),
        }
        await asyncio.wait_for(app(scope, receive, send), 20)  # no answer at all: fails, not hangs

    asyncio.run(exchange())
    start = sent[0]
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    assert b'"kind":"timeout"' in sent[1]["body"]
    assert not list((tmp_path / "hub").rglob("*.jnl"))


def test_a_pusher_over_http_copies_byte_for_byte(tmp_path: Path, http: TestClient) -> None:
    write(tmp_path / "j", 500)
    with Pusher(HubClient("http://testserver", http=http), "c1", [tmp_path / "j"], chunk=700) as pusher:
        (copy,) = pusher.run()
    assert copy.failed is None and copy.hub_next == 500
    source = sorted((tmp_path / "j" / "jnl").glob("*.jnl"))
    assert len(source) > 3
    assert all(p.read_bytes() == (tmp_path / "hub" / "c1.j" / "jnl" / p.name).read_bytes() for p in source)


def test_a_message_larger_than_a_chunk_is_pushed_alone(tmp_path: Path, http: TestClient) -> None:
    """A message over ``chunk`` bytes goes alone (the reader reads more to find its end, and
    sends no more than it): one the hub takes (80 kB, under its 100 kB limit) is never sent
    with the messages after it in a push over the limit."""
    with Writer(tmp_path / "j") as writer:
        writer.append_many([b"a", b"B" * 80_000] + [b"c" * 1000] * 100)
    with Pusher(HubClient("http://testserver", http=http), "c1", [tmp_path / "j"], chunk=600) as pusher:
        (copy,) = pusher.run()
    assert copy.failed is None and copy.hub_next == 102
    with RawReader(tmp_path / "j") as reader:
        assert reader.read(1, 600).count == 1


def test_journalq_serve_mounts_the_hub_beside_its_queues(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with TestClient(create_app(ServerConfig(data=data))) as http:
        assert push_run(http, "c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]).status_code == 200
        assert http.put("/orders").status_code == 201
        assert http.post("/orders/messages", content=b"hello").status_code == 201
        assert http.get("/hub/v1/status").json()["clients"] == {"c1": {"j": {"first": 0, "next": 1, "segment": 0}}}
        assert http.get("/readyz").json()["queues"] == 1  # the hub's directory is not a queue
    assert (data / ".hub" / "c1.j" / "jnl").is_dir()


def test_a_token_guards_every_hub_endpoint(tmp_path: Path) -> None:
    with TestClient(create_hub_app(tmp_path / "hub", token="s3cret")) as http:
        refused = http.get("/hub/v1/status")
        assert refused.status_code == 401 and refused.json()["kind"] == "auth"
        assert push_run(http, "c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]).status_code == 401
        assert not (tmp_path / "hub" / "c1.j").exists()
        client = HubClient("http://testserver", token="s3cret", http=http)
        assert client.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0])).held.next == 1
        assert http.get("/healthz").status_code == 200
        # The scheme's name is case-insensitive (RFC 9110); the token is not.
        assert http.get("/hub/v1/status", headers={"authorization": "bearer s3cret"}).status_code == 200
        assert http.get("/hub/v1/status", headers={"authorization": "Bearer S3CRET"}).status_code == 401
        assert http.get("/hub/v1/status", headers={"authorization": "Basic s3cret"}).status_code == 401
    # journalq serve's token guards its hub endpoints as it guards the REST API.
    with TestClient(create_app(ServerConfig(data=tmp_path / "data", rest_token="t"))) as http:
        assert http.get("/hub/v1/status").status_code == 401
        assert http.get("/hub/v1/status", headers={"authorization": "Bearer t"}).status_code == 200


def test_an_answer_that_is_not_the_hub_s_is_an_unavailable_hub() -> None:
    # A proxy or another service answering 200 with a page: the pusher waits it out and asks
    # the hub again, as for any failure, instead of crashing on the body.
    page = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>maintenance</html>"))
    with HubClient("http://hub", http=httpx.Client(base_url="http://hub", transport=page)) as client:
        with pytest.raises(HubUnavailableError, match="maintenance"):
            client.push(Push("c1", "j", 0, 0, encode_batch(0, 1, [b"a"])[0]))
        with pytest.raises(HubUnavailableError, match="maintenance"):
            client.status()
        with pytest.raises(HubUnavailableError, match="maintenance"):
            client.held("c1", "j")


def test_the_hub_server_refuses_heads_too_large_or_too_slow(tmp_path: Path) -> None:
    """``journalq hub serve`` runs journalq's HTTP protocol, as ``journalq serve`` does: a request
    head over 64 KiB is answered 431, and one that stops half-way 408 (after 10 s), each with the
    connection closed; the hub goes on serving."""
    port = free_port()
    hub = start_hub(tmp_path / "hub", "127.0.0.1", port, tmp_path)
    try:
        wait_until("the hub", lambda: _answers(port), 20)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as huge, \
                socket.create_connection(("127.0.0.1", port), timeout=20) as stalled:
            stalled.sendall(b"GET /hub/v1/status HTTP/1.1\r\nHost: hub\r\n")
            began = time.monotonic()
            huge.sendall(b"GET /hub/v1/status HTTP/1.1\r\nX-Big: ")
            try:
                for _ in range(40):  # a header line that never ends, sent in parts, until answered
                    if select.select([huge], [], [], 0.01)[0]:
                        break
                    huge.sendall(b"b" * 4096)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused already
            assert read_all(huge).startswith(b"HTTP/1.1 431 ")
            assert read_all(stalled).startswith(b"HTTP/1.1 408 ")
            assert 9.5 <= time.monotonic() - began <= 13
        assert httpx.get(f"http://127.0.0.1:{port}/hub/v1/status").status_code == 200
    finally:
        kill(hub)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


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
