"""mq's REST endpoints refuse a query parameter they do not take (400, naming it): a typo such
as ``?wiat=5`` or ``?visibility_timout=600`` was ignored, so the fetch did not wait, or hid the
message for the queue's timeout instead (and it came back to another consumer early)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from test_server_rest_ids import served

from journalq.queue import Broker


@pytest.mark.parametrize(
    "method, path, parameter",
    [
        ("GET", "/q/messages", "wiat"),
        ("GET", "/q/messages", "visibility_timout"),
        ("PUT", "/q", "shard"),
        ("GET", "/q", "x"),
        ("DELETE", "/q", "force"),
        ("POST", "/q/messages", "delay"),
        ("DELETE", "/q/messages/0", "receipt"),
    ],
)
def test_an_unknown_parameter_is_refused_naming_it(tmp_path: Path, method: str, path: str, parameter: str) -> None:
    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q")
        await client.post("/q/messages", content=b"kept")
        return await client.request(
            method, path, params={parameter: "5"}, content=b"body" if method == "POST" else None
        )

    refused = served(tmp_path, talk)
    assert refused.status_code == 400, refused.text
    assert repr(parameter) in refused.json()["error"]
    with Broker(tmp_path) as broker:  # nothing done: the message neither taken, added nor deleted
        stats = broker.queue("q").stats()
        assert (stats.available, stats.in_flight) == (1, 0)


def test_the_parameters_taken_still_work(tmp_path: Path) -> None:
    async def talk(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.put("/q", params={"shards": 2}),
                await client.post("/q/messages", content=b"m"),
                await client.get("/q/messages", params={"wait": 0, "visibility_timeout": 30})]

    answers = served(tmp_path, talk)
    assert [a.status_code for a in answers] == [201, 201, 200]


@pytest.mark.parametrize(
    "method, path, query", [("GET", "/q/messages", "wait=0&wait=5"), ("PUT", "/p", "shards=2&shards=4")]
)
def test_a_parameter_given_twice_is_refused(tmp_path: Path, method: str, path: str, query: str) -> None:
    """One of the two was taken (the last), silently: ``PUT /p?shards=2&shards=4`` made 4 shards."""

    async def talk(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/q")
        await client.post("/q/messages", content=b"kept")
        return await client.request(method, f"{path}?{query}")

    refused = served(tmp_path, talk)
    assert refused.status_code == 400, refused.text
    assert query.split("=")[0] in refused.json()["error"] and "more than once" in refused.json()["error"]
    with Broker(tmp_path) as broker:
        assert broker.queue("q").stats().available == 1
        assert not broker.exists("p")
