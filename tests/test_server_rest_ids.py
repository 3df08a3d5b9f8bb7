"""mq's message ids on the REST API: ``DELETE /{queue}/messages/{id}`` takes an id only as the
server gave it, and its errors name the id as the client sent it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from journalq.queue import Broker
from journalq.server.app import create_app
from journalq.server.config import ServerConfig

T = TypeVar("T")


def served(data: Path, talk: Callable[[httpx.AsyncClient], Awaitable[T]], **config: object) -> T:
    """``talk(client)`` against an app over ``data``, in process (its lifespan run around it)."""

    async def run() -> T:
        app = create_app(ServerConfig(data=data, **config))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            async with app.router.lifespan_context(app):
                return await talk(client)

    return asyncio.run(run())


@pytest.mark.parametrize("spelling", ["007", "07", "00"])
def test_an_id_with_leading_zeros_is_refused_and_deletes_nothing(tmp_path: Path, spelling: str) -> None:
    """``int()`` reads "007" as 7: the DELETE deleted message 7, an id the server never gave
    (as "+7", "7.0" or " 7" are refused). Now 400, naming the id; every message stays."""

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/q")
        ids = [(await client.post("/q/messages", content=b"m%d" % i)).headers["x-message-id"] for i in range(8)]
        token = ids[7].rpartition(".")[2]
        return [await client.delete(f"/q/messages/{spelling}.{token}"), await client.get("/q")]

    refused, info = served(tmp_path, talk)
    assert refused.status_code == 400, refused.text
    assert repr(spelling) in refused.json()["error"] or f"'{spelling}." in refused.json()["error"]
    assert info.json()["available"] == 8


def test_a_sharded_queue_id_with_leading_zeros_is_refused(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/s", params={"shards": 2})
        ids = [(await client.post("/s/messages", content=b"m%d" % i)).headers["x-message-id"] for i in range(4)]
        shard, offset, token = ids[0].split(".")
        return [await client.delete(f"/s/messages/{shard}.0{offset}.{token}"), await client.get("/s")]

    refused, info = served(tmp_path, talk)
    assert refused.status_code == 400, refused.text
    assert info.json()["available"] == 4


@pytest.mark.parametrize("shards", [1, 2])
def test_an_id_of_a_queue_deleted_and_made_again_deletes_nothing_of_the_new_one(tmp_path: Path, shards: int) -> None:
    """A queue made again starts its offsets at 0 again: a consumer's late DELETE of an id of the
    queue before (its message gone with it) deleted the new queue's message of the same offset.
    The ids carry the queue's token: such an id is not found (404), and the new message stays;
    the ids of the new queue, on both APIs, delete."""

    async def talk(client: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, str]]:
        await client.put("/q", params={"shards": shards})
        old = (await client.post("/q/messages", content=b"old")).headers["x-message-id"]
        await client.delete("/q")
        await client.put("/q", params={"shards": shards})
        new = (await client.post("/q/messages", content=b"new")).headers["x-message-id"]
        sqs = await client.post("/", headers={"X-Amz-Target": "AmazonSQS.SendMessage"},
                                content=b'{"QueueUrl": "http://testserver/000000000000/q", "MessageBody": "sqs"}')
        ids = {"old": old, "new": new, "sqs": sqs.json()["MessageId"]}
        stale = await client.delete(f"/q/messages/{old}")
        before = await client.get("/q")
        return [stale, before, await client.delete(f"/q/messages/{new}"),
                await client.delete(f"/q/messages/{ids['sqs']}"), await client.get("/q")], ids

    (stale, before, new, sqs, after), ids = served(tmp_path, talk)
    assert ids["old"].rpartition(".")[0] == ids["new"].rpartition(".")[0]  # the same offset, in the same shard
    assert ids["old"] != ids["new"]
    assert stale.status_code == 404, stale.text
    assert repr(ids["old"]) in stale.json()["error"] and "earlier queue" in stale.json()["error"]
    assert before.json()["available"] == 2
    assert (new.status_code, sqs.status_code) == (204, 204), (new.text, sqs.text)
    assert after.json()["available"] == 0


def test_an_id_without_the_queue_token_is_refused(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/q")
        given = (await client.post("/q/messages", content=b"m")).headers["x-message-id"]
        inner = given.rpartition(".")[0]
        return [await client.delete(f"/q/messages/{inner}"), await client.delete(f"/q/messages/{inner}.XYZ"),
                await client.get("/q")]

    plain, bad_token, info = served(tmp_path, talk)
    assert (plain.status_code, bad_token.status_code) == (400, 400), (plain.text, bad_token.text)
    assert info.json()["available"] == 1


def test_a_missing_message_of_a_sharded_queue_is_named_as_the_client_sent_it(tmp_path: Path) -> None:
    """The 404 named the shard's own id ('5') and channel, not the id sent ('1.5')."""

    async def talk(client: httpx.AsyncClient) -> tuple[httpx.Response, str]:
        await client.put("/s", params={"shards": 2})
        token = (await client.post("/s/messages", content=b"m")).headers["x-message-id"].rpartition(".")[2]
        return await client.delete(f"/s/messages/1.5.{token}"), token

    missing, token = served(tmp_path, talk)
    assert missing.status_code == 404, missing.text
    error = missing.json()["error"]
    assert f"'1.5.{token}'" in error and "'s'" in error and "'5'" not in error, error


def test_an_id_as_given_is_still_deleted(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        await client.put("/q")
        await client.put("/s", params={"shards": 2})
        ids = [(await client.post(f"/{q}/messages", content=b"m")).headers["x-message-id"] for q in ("q", "q", "s")]
        return [await client.delete(f"/q/messages/{ids[1]}"), await client.delete(f"/s/messages/{ids[2]}"),
                await client.delete(f"/q/messages/{ids[1]}")]

    first, sharded, again = served(tmp_path, talk)
    assert (first.status_code, sharded.status_code, again.status_code) == (204, 204, 404)
    with Broker(tmp_path) as broker:
        assert broker.queue("q").stats().available == 1


# -- ids given before a library topic had its channel ``default`` ----------------------------------


def test_an_untagged_id_of_a_topic_that_got_its_default_channel_since_is_refused_saying_why(tmp_path: Path) -> None:
    """A send to a topic whose channels are its own answers the topic's own id, with no token (no
    channel ``default`` to take one of); a fetch then gives the topic that channel. A DELETE of
    the untagged id cannot tell this topic's message from one of an earlier topic of the name
    (the token is what tells them apart), so it is refused: the 400 says why and what to do,
    and doing it (fetch, then delete by the id the fetch answers) deletes the message."""
    data = tmp_path / "data"
    with Broker(data, sync="none") as broker:
        broker.topic("t").channel("audit")  # a library topic: its channels are its own

    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        sent = await client.post("/t/messages", content=b"m")
        fetched = await client.get("/t/messages")  # makes the channel default: a REST consumer
        refused = await client.delete(f"/t/messages/{sent.headers['x-message-id']}")
        deleted = await client.delete(f"/t/messages/{fetched.headers['x-message-id']}")
        return [sent, fetched, refused, deleted, await client.get("/t")]

    sent, fetched, refused, deleted, info = served(data, talk)
    untagged = sent.headers["x-message-id"]
    assert "." not in untagged  # the topic's own id, as its channels' consumers see it
    assert fetched.status_code == 200 and fetched.headers["x-message-id"].startswith(f"{untagged}.")
    assert refused.status_code == 400, refused.text
    detail = refused.json()["error"]
    assert f"message id {untagged!r} carries no token of queue 't'" in detail
    assert "no channel 'default'" in detail  # why it has none
    assert "earlier queue or topic of this name" in detail  # why it is not taken
    assert "GET /t/messages" in detail and "X-Message-Id" in detail  # what to do
    assert deleted.status_code == 204, deleted.text
    assert info.json()["available"] == 0 and info.json()["in_flight"] == 0


def test_an_id_with_a_malformed_token_keeps_its_plain_refusal(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q")
        given = (await client.post("/q/messages", content=b"m")).headers["x-message-id"]
        return await client.delete(f"/q/messages/{given.rpartition('.')[0]}.XYZ")

    refused = served(tmp_path / "data", talk)
    assert refused.status_code == 400
    assert "is not one of this queue's ids" in refused.json()["error"]


def test_a_batch_of_ids_is_given_as_each_alone() -> None:
    """``given_ids`` (a batch's sends, both APIs) spells each id as ``given_id`` (``queue_id`` reads)."""
    from journalq.server.ids import given_id, given_ids

    ids = ["0", "17", "3.5", "12345678901234"]
    assert given_ids(iter(ids), "1a2b3c4d") == [given_id(message_id, "1a2b3c4d") for message_id in ids]
    assert given_ids([], "1a2b3c4d") == []
