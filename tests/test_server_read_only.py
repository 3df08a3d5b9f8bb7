"""Reads of the server change nothing stored: ``GET /{queue}`` and a ``/metrics`` scrape of a
topic whose channels are its own (made through the library, none named "default") give it no
channel "default", which would take every message again and hold the topic's gc back."""

from __future__ import annotations

from pathlib import Path

import httpx
from test_server_rest_ids import served

from journalq.queue import Broker


def make_topic(data: Path) -> None:
    with Broker(data) as broker:
        topic = broker.topic("t")
        topic.channel("billing")
        topic.channel("audit")
        topic.send_many([b"a", b"b"])
        topic.channel("audit").receive(1)


def test_get_of_a_topic_without_a_default_channel_makes_none_and_counts_its_channels(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get("/t")

    info = served(tmp_path, talk)
    assert info.status_code == 200, info.text
    assert sorted(p.name for p in (tmp_path / "t" / "channels").iterdir()) == ["audit", "billing"]
    body = info.json()
    assert body["name"] == "t"
    assert body["channels"]["billing"]["available"] == 2
    assert body["channels"]["audit"]["available"] == 1 and body["channels"]["audit"]["in_flight"] == 1


def test_a_scrape_makes_no_default_channel_and_still_counts_queues(tmp_path: Path) -> None:
    make_topic(tmp_path)

    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q")
        await client.post("/q/messages", content=b"m")
        return await client.get("/metrics")

    scrape = served(tmp_path, talk)
    assert scrape.status_code == 200
    assert sorted(p.name for p in (tmp_path / "t" / "channels").iterdir()) == ["audit", "billing"]
    assert 'journalq_queue_available{queue="q"} 1.0' in scrape.text
    assert 'queue="t"' not in scrape.text


def test_get_of_a_queue_still_gives_its_counts(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q", params={"shards": 2})
        await client.post("/q/messages", content=b"m")
        return await client.get("/q")

    info = served(tmp_path, talk)
    assert info.status_code == 200 and info.json()["available"] == 1, info.text


def test_get_of_a_queue_whose_directory_was_removed_from_outside_is_404(tmp_path: Path) -> None:
    """A queue the server had open, its directory then removed by hand: not found (a topic of no
    channels, answered 200, until the read above opened none)."""
    import shutil

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/r")
        await client.post("/r/messages", content=b"m")
        await client.get("/r")
        shutil.rmtree(tmp_path / "r")
        return [await client.get("/r"), await client.get("/r")]

    for answer in served(tmp_path, talk):
        assert answer.status_code == 404, answer.text
        assert "'r'" in answer.json()["error"]
    assert not (tmp_path / "r").exists()
