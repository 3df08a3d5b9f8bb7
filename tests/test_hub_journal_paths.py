"""One journal given to the pusher by several paths is one journal, pushed once."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import HubError
from journalq.hub import HubStore
from journalq.hub.client import Pusher, sources_at
from journalq.hub.protocol import Held
from journalq.journal import Writer


def write(path: Path, count: int) -> None:
    with Writer(path) as writer:
        writer.append_many([b"v%d" % i for i in range(count)])


def test_one_journal_given_as_a_relative_and_an_absolute_path_is_one_journal(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "orders", 5)
    monkeypatch.chdir(tmp_path)
    assert sources_at([Path("orders"), tmp_path / "orders", Path("./orders/")]) == [("orders", Path("orders"))]
    (tmp_path / "link").symlink_to(tmp_path / "orders")
    with pytest.raises(HubError, match="one journal would have two names on the hub, 'orders' and 'link'"):
        sources_at([Path("orders"), tmp_path / "link"])  # two copies of one journal, pushed apart
    with HubStore(tmp_path / "hub") as store:
        with Pusher(store, "c1", [Path("orders"), tmp_path / "orders"]) as pusher:
            copies = pusher.run()
        assert [c.name for c in copies] == ["orders"] and not copies[0].failed
        assert store.held("c1", "orders") == Held(0, 5, 0)


def test_two_journals_of_one_name_are_still_refused(tmp_path: Path) -> None:
    write(tmp_path / "x" / "orders", 1)
    write(tmp_path / "y" / "orders", 1)
    with pytest.raises(HubError, match="two journals would have one name"):
        sources_at([tmp_path / "x" / "orders", tmp_path / "y" / "orders"])
