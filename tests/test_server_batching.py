"""The request-level group commit: concurrent sends to a queue share one store call; a batch whose
store fails part way answers each send as it fared (and /metrics counts the stored), and an answer
that cannot be given keeps no other request of its batch waiting."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server_metrics import value
from test_server_harness import metric_families

import journalq.server.batching as batching_mod
from journalq.errors import LockedError, StorageError, TaskNotFoundError
from journalq.journal.sync import syncs_done
from journalq.queue.sharded import ShardedChannel
from journalq.server.app import create_app
from journalq.server.batching import Batcher, SyncPlacement
from journalq.server.config import ServerConfig


def test_concurrent_sends_share_store_calls_and_keep_their_ids() -> None:
    calls: list[tuple[str, list[bytes]]] = []
    stored: dict[str, list[bytes]] = {}

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        calls.append((queue, list(bodies)))
        await asyncio.sleep(0.01)  # a slow sync: sends pile up behind it
        log = stored.setdefault(queue, [])
        first = len(log)
        log.extend(bodies)
        return [f"{queue}:{first + i}" for i in range(len(bodies))]

    async def main() -> list[str]:
        batcher = Batcher(store)
        return await asyncio.gather(*(batcher.call("q" if i % 2 else "r", b"%d" % i) for i in range(200)))

    ids = asyncio.run(main())
    assert len(calls) < 20  # 200 sends, a few batches per queue
    assert all(len({q for q, _ in calls if q == name}) == 1 for name in ("q", "r"))
    for i, message_id in enumerate(ids):
        queue, offset = message_id.split(":")
        assert stored[queue][int(offset)] == b"%d" % i  # every id names its own body


def _syncs_until_threads(placement: SyncPlacement, seconds: float, now: float = 0.0, most: int = 100) -> int:
    """How many syncs of ``seconds`` on the loop, from ``now``, until the syncs go to threads."""
    for count in range(1, most + 1):
        placement.took(seconds, now)
        if not placement.on_loop(now):
            return count
    return 0


def test_an_outlier_among_quick_syncs_keeps_them_on_the_loop() -> None:
    placement = SyncPlacement(quick=0.002, backoff=1.0)
    assert placement.on_loop(0.0)  # no sync yet: quick until shown otherwise
    assert _syncs_until_threads(placement, 0.0003, most=50) == 0
    placement.took(0.012, 0.0)  # the disk busy for a moment
    assert placement.on_loop(0.0)
    assert _syncs_until_threads(placement, 0.0003, most=50) == 0


def test_syncs_that_stay_slow_go_to_threads_after_a_few_and_a_very_slow_one_at_once() -> None:
    slow_disk = SyncPlacement(quick=0.002, backoff=1.0)
    assert _syncs_until_threads(slow_disk, 0.008) == 3  # 8 ms each: a spinning disk
    assert not slow_disk.on_loop(0.999) and slow_disk.on_loop(1.0)
    stuck = SyncPlacement(quick=0.002, backoff=1.0)
    assert _syncs_until_threads(stuck, 0.0003, most=50) == 0
    assert _syncs_until_threads(stuck, 0.5) == 1


def test_a_disk_that_stays_slow_is_tried_on_the_loop_ever_less_often() -> None:
    placement = SyncPlacement(quick=0.002, backoff=1.0, longest=8.0)
    now = 0.0
    waits = []
    for _ in range(6):  # each time the syncs are tried on the loop, the first is slow
        assert placement.on_loop(now)
        assert _syncs_until_threads(placement, 0.5, now) == 1
        wait = 0.0
        while not placement.on_loop(now + wait):
            wait += 0.25
        waits.append(wait)
        now += wait
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    placement.took(0.0005, now)  # quick when tried: they stay on the loop, the streak ended
    assert placement.on_loop(now)
    assert _syncs_until_threads(placement, 0.5, now) == 1
    assert not placement.on_loop(now + 0.75) and placement.on_loop(now + 1.0)


def test_the_thresholds_default_to_the_module_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching_mod, "QUICK_SYNC", 0.5)
    monkeypatch.setattr(batching_mod, "SLOW_SYNC_BACKOFF", 7.0)
    monkeypatch.setattr(batching_mod, "SLOW_SYNC_BACKOFF_MAX", 10.0)
    monkeypatch.setattr(batching_mod, "SYNC_WEIGHT", 1.0)  # each sync judged alone
    placement = SyncPlacement()
    assert (placement.quick, placement.first_backoff, placement.longest) == (0.5, 7.0, 10.0)
    placement.took(0.4, 0.0)
    assert placement.on_loop(0.0)
    placement.took(0.6, 1.0)
    assert not placement.on_loop(7.9) and placement.on_loop(8.0)
    placement.took(0.6, 8.0)
    assert not placement.on_loop(17.9) and placement.on_loop(18.0)  # 14 s, but at most 10


def test_a_failed_batch_fails_each_of_its_sends_and_the_next_batch_goes_on() -> None:
    attempts = 0

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.01)
        if attempts == 1:
            raise StorageError("disk full")
        return [str(i) for i in range(len(bodies))]

    async def main() -> tuple[list[object], str]:
        batcher = Batcher(store)
        first = await asyncio.gather(*(batcher.call("q", b"x") for _ in range(5)), return_exceptions=True)
        return first, await batcher.call("q", b"y")

    first, later = asyncio.run(main())
    assert all(isinstance(result, StorageError) for result in first)
    assert later == "0"


def test_batches_are_bounded() -> None:
    sizes: list[int] = []

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        sizes.append(len(bodies))
        await asyncio.sleep(0)
        return ["i"] * len(bodies)

    async def main() -> None:
        batcher = Batcher(store, max_batch=10)
        await asyncio.gather(*(batcher.call("q", b"x") for _ in range(35)))

    asyncio.run(main())
    assert sum(sizes) == 35 and max(sizes) <= 10


def test_a_send_refused_by_itself_fails_alone() -> None:
    async def store(queue: str, items: Sequence[bytes]) -> list[str | Exception]:
        await asyncio.sleep(0)
        return [TaskNotFoundError("refused") if item == b"bad" else item.decode() for item in items]

    async def main() -> list[object]:
        batcher: Batcher[bytes, str] = Batcher(store)
        return await asyncio.gather(*(batcher.call("q", b) for b in (b"a", b"bad", b"c")), return_exceptions=True)

    a, bad, c = asyncio.run(main())
    assert (a, c) == ("a", "c") and isinstance(bad, TaskNotFoundError)


def test_a_store_giving_too_few_results_fails_its_batch_not_hangs() -> None:
    async def store(queue: str, items: Sequence[bytes]) -> list[str]:
        return ["only one"]

    async def main() -> list[object]:
        batcher: Batcher[bytes, str] = Batcher(store)
        return await asyncio.gather(*(batcher.call("q", b"x") for _ in range(3)), return_exceptions=True)

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(main()))


SQS = {"Content-Type": "application/x-amz-json-1.0"}


def test_concurrent_sqs_and_rest_sends_share_syncs(tmp_path: Path) -> None:
    """Through the app (sync always): 40 concurrent SendMessage and 40 REST POSTs take far
    fewer syncs than 80, and every one is answered with its own message, stored once."""

    async def scenario() -> tuple[int, list[httpx.Response], list[httpx.Response]]:
        app = create_app(ServerConfig(data=tmp_path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.put("/q")).status_code == 201
                url = "http://testserver/000000000000/q"
                before = syncs_done()
                sqs = [client.post("/", headers={**SQS, "X-Amz-Target": "AmazonSQS.SendMessage"},
                                   content=json.dumps({"QueueUrl": url, "MessageBody": f"sqs {i}"}))
                       for i in range(40)]
                rest = [client.post("/q/messages", content=b"rest %d" % i) for i in range(40)]
                answers = await asyncio.gather(*sqs, *rest)
                syncs = syncs_done() - before
                received = []
                while (got := await client.get("/q/messages")).status_code == 200:
                    received.append(got)
        return syncs, answers, received

    syncs, answers, received = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 40 + [201] * 40
    ids = [a.json()["MessageId"] for a in answers[:40]] + [a.headers["X-Message-Id"] for a in answers[40:]]
    assert len(set(ids)) == 80
    assert sorted(r.content for r in received) == sorted(
        [b"sqs %d" % i for i in range(40)] + [b"rest %d" % i for i in range(40)]
    )
    # One per batch: a few. (Sent one request per thread, the SQS sends took about 24: the
    # journal's own group commit shares syncs only between threads that overlap.)
    assert 0 < syncs <= 10, syncs


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])


# -- a batch whose store fails part way, an answer that cannot be given ----------------------------


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
    families = metric_families(metrics)
    assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue="q") == len(stored)


def test_a_fetch_opens_a_shards_channel_in_a_thread_not_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a shard's channel replays its state journal (hundreds of ms at a deep backlog):
    the fetches that open one run in a thread, so that the event loop, which answers every other
    request meanwhile, does not wait for it. (It was opened on the loop, inside the receive.)"""
    opened_in: list[threading.Thread] = []
    shard_channel = ShardedChannel._shard_channel

    def noted(self: ShardedChannel, index: int) -> Any:
        opened_in.append(threading.current_thread())
        return shard_channel(self, index)

    monkeypatch.setattr(ShardedChannel, "_shard_channel", noted)

    async def scenario() -> list[bytes]:
        app = create_app(ServerConfig(data=tmp_path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.put("/q", params={"shards": 2})).status_code == 201
                for i in range(4):
                    assert (await client.post("/q/messages", content=b"m%d" % i)).status_code == 201
                received = []
                while (got := await client.get("/q/messages")).status_code == 200:
                    received.append(got.content)
                    assert (await client.delete(f"/q/messages/{got.headers['X-Message-Id']}")).status_code == 204
        return received

    assert sorted(asyncio.run(scenario())) == [b"m0", b"m1", b"m2", b"m3"]
    assert len(opened_in) == 2 and threading.main_thread() not in opened_in, opened_in


@pytest.mark.parametrize("fails", [False, True], ids=["stored", "store failed"])
def test_an_answer_that_cannot_be_given_keeps_no_other_request_of_its_batch_waiting(fails: bool) -> None:
    """The direct path answers from the batch's callbacks; writing to a connection whose client
    went away raises (uvloop: "the handler is closed", for a request pipelined before another
    whose cycle took the disconnection). Before, that exception left ``_drain``: the requests
    after it in the batch, and those that came meanwhile, were never answered."""
    from journalq.server.batching import Batcher

    async def store(queue: str, bodies: Sequence[bytes]) -> list[str]:
        await asyncio.sleep(0)
        if fails:
            raise StorageError("disk full")
        return [body.decode() for body in bodies]

    async def main() -> dict[str, object]:
        batcher: Batcher[bytes, str] = Batcher(store)
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


@pytest.mark.parametrize("shards", [1, 2])
def test_fetches_taken_together_never_share_out_one_fifo_group(tmp_path: Path, shards: int) -> None:
    """The fetches of a queue under way together are one receive, shared out in turn: it takes one
    message of a group, so that no two requests' consumers hold one group at once (a single
    receive takes a group's next ones too)."""
    from journalq.queue import Broker
    from journalq.server.reading import received_in_turn

    with Broker(tmp_path, sync="none") as broker:
        q = broker.queue("orders", shards=shards)
        q.send_many([{"body": b"g%d" % i, "group_id": "g"} for i in range(3)] + [b"plain 0", b"plain 1"])
        first, second, third = received_in_turn(q, [(None, 1), (None, 2), (None, 1)])
        taken = first + second + third
        assert [m.body for m in taken if m.group_id == "g"] == [b"g0"]
        assert sorted(m.body for m in taken if m.group_id is None) == [b"plain 0", b"plain 1"]
        assert received_in_turn(q, [(None, 1), (None, 1)]) == [[], []]  # g is in flight
        q.delete_many([m.receipt for m in taken])
        (alone,) = received_in_turn(q, [(None, 10)])  # one request: a receive of its own
        assert [m.body for m in alone] == [b"g1", b"g2"]
