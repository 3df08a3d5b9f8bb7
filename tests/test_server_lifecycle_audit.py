"""Audit of the server's life cycle and waiting parts: body deadlines, group commit, long polls."""

from __future__ import annotations

import math

import pytest

from journalq.errors import InvalidSettingError
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.deadlines import Deadlines


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf])
def test_a_body_timeout_that_is_no_time_limit_is_refused(seconds: float) -> None:
    """A timeout of 0 (or less) made the watchdog's period 0: it spun the event loop at full CPU
    for the server's life; NaN never expired. Refused at once, naming the setting."""
    with pytest.raises(InvalidSettingError, match="body timeout"):
        Deadlines(seconds)
    with pytest.raises(InvalidSettingError, match="body timeout"):
        create_app(ServerConfig(body_timeout=seconds))



def test_a_send_that_comes_after_the_stores_stopped_is_503(tmp_path) -> None:
    """A request still open when the server stops (uvicorn's graceful wait over) reaches a store
    pool that is shut down: a 503 with Retry-After, nothing stored (it was a 500 and a traceback)."""
    import asyncio

    import httpx

    from journalq.queue import Broker
    from journalq.server.app import create_app
    from journalq.server.config import ServerConfig

    async def run() -> list[httpx.Response]:
        app = create_app(ServerConfig(data=tmp_path, retry_after=3))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            async with app.router.lifespan_context(app):
                assert (await client.put("/q")).status_code == 201
            return [await client.post("/q/messages", content=b"late"),
                    await client.post("/", content=b'{"QueueUrl": "http://testserver/000000000000/q",'
                                      b' "MessageBody": "late"}',
                                      headers={"X-Amz-Target": "AmazonSQS.SendMessage",
                                               "Content-Type": "application/x-amz-json-1.0"})]

    answers = asyncio.run(run())
    assert [a.status_code for a in answers] == [503, 503]
    assert all(a.headers["retry-after"] == "3" for a in answers)
    with Broker(tmp_path) as broker:
        assert broker.queue("q").stats().available == 0
