"""The hub, third audit: the status of a damaged copy says it is damaged and where (not 0/0)."""

from __future__ import annotations

import warnings
from pathlib import Path

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from journalq.hub import HubStore, Push
from journalq.hub.protocol import Held
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
