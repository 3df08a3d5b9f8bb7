"""A copy whose files the hub cannot read (a segment that is a directory) is answered as other
damage of the hub's own copies: 500 with JSON ``error`` and ``kind`` journal, logged with its
file; it was an error unknown to the hub, a bare 'Internal Server Error'."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.errors import JournalError
from journalq.hub import HubStore, Push
from journalq.journal.codec import encode_batch
from journalq.server.hub import create_hub_app


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
