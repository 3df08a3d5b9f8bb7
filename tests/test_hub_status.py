"""The hub's status with a copy it cannot read: that copy named, the others reported."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.cli.main import cli
from journalq.hub import HubStore, Push
from journalq.hub.client import HubClient
from journalq.hub.protocol import Held
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app


def three(store: HubStore, client_id: str, journal: str) -> None:
    store.push(Push(client_id, journal, 0, 0, encode_batch(0, 1, [b"x" * 40] * 3)[0]))


def break_segment(root: Path, copy: str, how: str) -> None:
    segment = root / copy / "jnl" / "0000000000000000.jnl"
    segment.unlink()
    if how == "dangling":
        segment.symlink_to(root / "nowhere")
    elif how == "loop":  # a file no open can read: the hub's own error, naming it
        segment.symlink_to(segment.name)
    else:
        segment.mkdir()


@pytest.mark.parametrize(("how", "reason"), [
    ("dangling", "segment is listed but cannot be opened (jnl/0000000000000000.jnl)"),
    ("directory", "not a segment: a directory has a segment's name (jnl/0000000000000000.jnl)"),
    ("loop", "cannot read the copy's files: Too many levels of symbolic links (jnl/0000000000000000.jnl)"),
])
def test_status_names_a_copy_it_cannot_read_and_reports_the_others(tmp_path: Path, how: str, reason: str) -> None:
    root = tmp_path / "hub"
    with HubStore(root) as store:
        for journal in ("a", "b"):
            three(store, "c1", journal)
        three(store, "c2", "a")
        break_segment(root, "c1.a", how)
        status = store.status()
    assert status["c1"]["b"] == Held(0, 3, 0) and status["c2"]["a"] == Held(0, 3, 0)
    assert status["c1"]["a"] == Held(unreadable=reason)  # not where the hub keeps its copies


def test_status_over_http_and_hub_status_show_the_unreadable_copy(tmp_path: Path, monkeypatch) -> None:
    import journalq.cli.hub as cli_hub

    root = tmp_path / "hub"
    with HubStore(root) as store:
        three(store, "c1", "a")
        three(store, "c1", "b")
    break_segment(root, "c1.a", "dangling")
    with TestClient(create_hub_app(root)) as http:
        answer = http.get("/hub/v1/status")
        assert answer.status_code == 200, answer.text
        assert answer.json()["clients"]["c1"]["b"] == {"first": 0, "next": 3, "segment": 0}
        assert answer.json()["clients"]["c1"]["a"]["unreadable"]
        client = HubClient("http://hub", http=http)
        got = client.status()["c1"]
        assert got["b"] == Held(0, 3, 0) and got["a"].unreadable
        monkeypatch.setattr(cli_hub, "HubClient", lambda url, token=None, **kw: HubClient(url, http=http))
        result = CliRunner().invoke(cli, ["hub", "status", "--hub", "http://hub:1", "--format", "jsonl"])
    assert result.exit_code == 0, result.output
    rows = {r["journal"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert rows["b"] == {"client_id": "c1", "journal": "b", "hub_first": 0, "hub_next": 3, "local_next": None,
                         "lag": None}
    assert rows["a"]["hub_next"] is None and "segment" in rows["a"]["unreadable"]
    assert "c1.a" in result.stderr


def test_held_from_json_refuses_an_unreadable_reason_that_is_not_text() -> None:
    with pytest.raises(ValueError):
        Held.from_json({"first": 0, "next": 0, "segment": 0, "unreadable": 5})
