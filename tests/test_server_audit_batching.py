"""Audit of the group commit through the app: what each request of a batch is answered, and what
the metrics count, when its store fails part-way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server_metrics import value
from test_server_rest import _families

from journalq.errors import LockedError, StorageError
from journalq.server.app import create_app
from journalq.server.config import ServerConfig


def test_a_rest_batch_stored_in_part_answers_the_stored_201_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded queue whose shard written second refuses its part with an error that is not the disk's
    (its journal locked): the messages of the first shard are stored. Before, every POST of the batch was
    answered 400 (the ``PartialSendError`` as a bad request) and none was counted, so a client
    sent the stored ones again; now the stored ones get their ids and the others an error of the
    server's, as the SQS sends already were."""

    async def scenario() -> tuple[list[httpx.Response], list[bytes], str]:
        app = create_app(ServerConfig(data=tmp_path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.put("/q", params={"shards": 2})).status_code == 201
                queue: Any = app.metrics.broker.queue("q", create=False)  # type: ignore[union-attr]
                calls: list[int] = []
                for shard in queue.topic.shards:

                    def second_refuses(items: Any, send_many: Any = shard.send_many) -> Any:
                        calls.append(len(items))
                        if len(calls) == 2:
                            raise LockedError("another writer holds the journal's lock")
                        return send_many(items)

                    monkeypatch.setattr(shard, "send_many", second_refuses)
                answers = await asyncio.gather(*(client.post("/q/messages", content=b"m%d" % i) for i in range(6)))
                monkeypatch.undo()
                assert len(calls) == 2, calls  # one batch, over both shards
                received = []
                while (got := await client.get("/q/messages")).status_code == 200:
                    received.append(got.content)
                metrics = (await client.get("/metrics")).text
        return answers, received, metrics

    answers, received, metrics = asyncio.run(scenario())
    stored = [a for a in answers if a.status_code == 201]
    assert stored, [a.status_code for a in answers]
    assert all(a.status_code >= 500 for a in answers if a.status_code != 201), [a.status_code for a in answers]
    assert sorted(received) == sorted(a.request.content for a in stored)
    assert value(_families(metrics), "journalq_messages_in", "journalq_messages_in_total", queue="q") == len(stored)


@pytest.mark.parametrize("fails", [False, True], ids=["stored", "store failed"])
def test_an_answer_that_cannot_be_given_keeps_no_other_request_of_its_batch_waiting(fails: bool) -> None:
    """The direct path answers from the batch's callbacks; writing to a connection whose client
    went away raises (uvloop: "the handler is closed", for a request pipelined before another
    whose cycle took the disconnection). Before, that exception left ``_drain``: the requests
    after it in the batch, and those that came meanwhile, were never answered."""
    from journalq.server.batching import SendBatcher

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        await asyncio.sleep(0)
        if fails:
            raise StorageError("disk full")
        return [body.decode() for body in bodies]

    async def main() -> dict[str, object]:
        batcher: SendBatcher[bytes, str] = SendBatcher(store)
        answered: dict[str, object] = {}
        every = asyncio.Event()

        def answer(name: str) -> Callable[[object], None]:
            def done(outcome: object) -> None:
                if name == "gone":
                    raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
                answered[name] = outcome
                if len(answered) == 3:
                    every.set()
            return done

        for name in ("first", "gone", "after"):
            batcher.submit("q", name.encode(), answer(name))
        await asyncio.sleep(0)  # the store begins
        batcher.submit("q", b"meanwhile", answer("meanwhile"))
        await asyncio.wait_for(every.wait(), 5)
        return answered

    answered = asyncio.run(main())
    if fails:
        assert sorted(answered) == ["after", "first", "meanwhile"]
        assert all(isinstance(outcome, StorageError) for outcome in answered.values())
    else:
        assert answered == {"first": "first", "after": "after", "meanwhile": "meanwhile"}
