"""The hub's leftovers checked again by the fifth pass: each test here failed before its fix."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.cli.main import cli
from journalq.errors import HubUnavailableError
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.hub.protocol import Push, PushResult
from journalq.journal import Writer
from journalq.server.hub import create_hub_app

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
