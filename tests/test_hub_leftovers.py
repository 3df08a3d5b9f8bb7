"""Leftovers of the hub's last audit: how the hub answers damage on its own side, what ``hub
status`` says, a copy lost while its source is idle, backoff per journal, and the hub server's
bound on requests at once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.errors import HubUnavailableError
from journalq.hub import Push
from journalq.hub.client import Backoff, HubClient, Pusher
from journalq.journal import Writer
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app

URL = "/hub/v1/journals"


def write(path: Path, count: int, segment_size: int = 2500) -> None:
    with Writer(path, segment_size=segment_size) as writer:
        writer.append_many([b"value-%d" % i for i in range(count)])


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
