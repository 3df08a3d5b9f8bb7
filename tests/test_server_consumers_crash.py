"""Consumers through HTTP across SIGKILLs: producers send (REST POST, SQS SendMessage and
SendMessageBatch) while consumers receive and delete through both APIs (mq's ``GET`` + ``DELETE
/{queue}/messages/{id}``, SQS ReceiveMessage + DeleteMessage/DeleteMessageBatch), and the server,
on one data directory with ``--sync always``, is SIGKILLed at random moments and started again.
Consumers hold some messages across a kill and delete them after it, let others go, and keep the
receipts of short deliveries to delete with them once the message went out again (stale receipts:
SQS answers success and deletes nothing). With ``--workers 2`` (on a queue of two shards) some
kills take one worker only (uvicorn starts another), the others the whole server.

What the README promises, and what is checked at the end (after the last visibility timeout ran
out, a drain of the queue hidden for 10 minutes):

- a send answered as stored is there: deleted or drained; nothing is stored twice (one id per
  body, one body per id);
- a delete answered as done (REST's 204; SQS's 200 for a delivery still hidden) is never undone:
  the message is not received after it, nor drained;
- every message is deleted or drained exactly once (where a delete's fate is unknown, at most
  once): a stale receipt deletes nothing;
- a received message comes back only once its visibility timeout ran out. The README says a
  delivery is not synced by itself and a *power cut* may lose one (the message then comes back
  early, at least once); a SIGKILL leaves the page cache, and every answered delivery was written
  before its answer, so here none may come back early, and delivery numbers never repeat.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from test_server_durability import drain, sqs_call
from test_server_harness import ServerProcess

QUEUE = "crashq"
HIDDEN = 5  # seconds: the visibility timeout of the receives whose messages are deleted
SHORT = 1  # seconds: that of receives whose receipts are kept to be used stale
NO_ANSWER = (httpx.NetworkError, httpx.RemoteProtocolError)  # the server is down, or died under the request
REST_MARGIN = 1.0  # a REST delete (by id, whatever the state) is sent this long before the end


@dataclass
class Delivery:
    id: str
    body: str
    receipt: str
    seq: int  # the delivery number (X-Receive-Count, ApproximateReceiveCount)
    hidden: float
    start: float  # time.time() when the receive was sent, and when its answer came
    end: float
    api: str


@dataclass
class Delete:
    delivery: Delivery
    api: str
    start: float
    end: float
    outcome: str  # "done" (204/200), "unknown" (no answer, 503), or the error answered


@dataclass
class Record:
    """What the clients did and were answered (appended under ``lock`` by every thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    attempted: set[str] = field(default_factory=set)
    sent: dict[str, str] = field(default_factory=dict)  # body -> id, as the send's answer gave it
    deliveries: list[Delivery] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    failed_requests: int = 0
    kills: list[float] = field(default_factory=list)  # time.time() of each SIGKILL
    # When every delivery made so far is visible again: the server counts a visibility timeout
    # from when it recorded the delivery, before its answer came (or did not: unanswered receives).
    hidden_until: float = 0.0

    def received(self, deliveries: list[Delivery]) -> None:
        with self.lock:
            self.deliveries.extend(deliveries)

    def hidden(self, seconds: float) -> None:
        """Note a receive just answered, or one that had no answer."""
        with self.lock:
            self.hidden_until = max(self.hidden_until, time.time() + seconds)

    def across_a_kill(self, deletes: list[Delete]) -> list[Delete]:
        """Those of ``deletes`` whose receipt was had before a kill and used after it."""
        return [d for d in deletes if any(d.delivery.end < k < d.start for k in self.kills)]


class Clients:
    """The client threads, against ``url`` (set anew when the server restarts on another port)."""

    def __init__(self, url: str, record: Record, seed: int) -> None:
        self.url = url
        self.record = record
        self.seed = seed
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> None:
        roles: list[Callable[[httpx.Client, random.Random, int], None]] = [
            self.rest_producer, self.rest_producer, self.sqs_producer,
            self.rest_consumer, self.rest_consumer, self.sqs_consumer, self.sqs_consumer,
        ]
        for n, role in enumerate(roles):
            thread = threading.Thread(target=self._run, args=(role, n), name=f"{role.__name__}-{n}")
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} did not finish"
        if self.errors:
            raise self.errors[0]

    def _run(self, role: Callable[[httpx.Client, random.Random, int], None], n: int) -> None:
        rng = random.Random(self.seed * 100 + n)
        try:
            with httpx.Client(timeout=httpx.Timeout(10, connect=2)) as client:
                role(client, rng, n)
        except BaseException as exc:  # failed checks of a thread fail the test
            self.errors.append(exc)
            self.stop.set()

    def _failed(self) -> None:
        """A request without an answer (the server is down, or died under it): wait a little."""
        with self.record.lock:
            self.record.failed_requests += 1
        time.sleep(0.05)

    def _sqs(self, client: httpx.Client, action: str, payload: dict) -> httpx.Response:
        client.base_url = self.url
        return sqs_call(client, action, {"QueueUrl": f"{self.url}/000000000000/{QUEUE}", **payload})

    # -- producers ------------------------------------------------------------------------------

    def rest_producer(self, client: httpx.Client, rng: random.Random, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"rest{n}-{i}"
            i += 1
            with self.record.lock:
                self.record.attempted.add(body)
            try:
                answer = client.post(f"{self.url}/{QUEUE}/messages", content=body.encode())
            except NO_ANSWER:
                self._failed()
                continue
            if answer.status_code == 201:
                with self.record.lock:
                    self.record.sent[body] = answer.headers["x-message-id"]
            else:
                assert answer.status_code == 503, answer.text
            time.sleep(rng.uniform(0, 0.03))

    def sqs_producer(self, client: httpx.Client, rng: random.Random, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            bodies = [f"sqs{n}-{i}-{j}" for j in range(rng.choice([1, 1, 3, 10]))]
            i += 1
            with self.record.lock:
                self.record.attempted.update(bodies)
            try:
                if len(bodies) == 1:
                    answer = self._sqs(client, "SendMessage", {"MessageBody": bodies[0]})
                else:
                    entries = [{"Id": f"e{j}", "MessageBody": b} for j, b in enumerate(bodies)]
                    answer = self._sqs(client, "SendMessageBatch", {"Entries": entries})
            except NO_ANSWER:
                self._failed()
                continue
            if answer.status_code != 200:
                assert answer.status_code == 503, answer.text
                continue
            result = answer.json()
            if len(bodies) == 1:
                stored = {bodies[0]: result["MessageId"]}
            else:
                assert all(f["Code"] == "ServiceUnavailable" for f in result["Failed"]), result
                stored = {bodies[int(s["Id"][1:])]: s["MessageId"] for s in result["Successful"]}
            with self.record.lock:
                self.record.sent.update(stored)
            time.sleep(rng.uniform(0, 0.08))

    # -- consumers ------------------------------------------------------------------------------

    def _receive(
        self, request: Callable[[], httpx.Response], hidden: float
    ) -> tuple[httpx.Response | None, float, float]:
        """A receive's answer (None for none, or a 503), and when it was sent and answered."""
        start = time.time()
        try:
            answer: httpx.Response | None = request()
        except NO_ANSWER:
            answer = None
            self._failed()
        end = time.time()
        self.record.hidden(hidden)  # whether it delivered anything or not: it may have
        if answer is not None and answer.status_code == 503:
            return None, start, end
        return answer, start, end

    def rest_consumer(self, client: httpx.Client, rng: random.Random, n: int) -> None:
        held: list[tuple[float, Delivery]] = []  # (when to delete, delivery)
        while not self.stop.is_set():
            now = time.time()
            for due, delivery in [h for h in held if h[0] <= now]:
                held.remove((due, delivery))
                # mq deletes by id, whatever the message's state: only while this delivery holds it
                if time.time() < delivery.start + delivery.hidden - REST_MARGIN:
                    self._rest_delete(client, delivery)
            answer, start, end = self._receive(lambda: client.get(
                f"{self.url}/{QUEUE}/messages", params={"visibility_timeout": HIDDEN, "wait": rng.choice([0, 0, 0.5])}),
                HIDDEN)
            if answer is None:
                continue
            if answer.status_code == 204:
                time.sleep(0.05)
                continue
            assert answer.status_code == 200, answer.text
            delivery = Delivery(answer.headers["x-message-id"], answer.content.decode(), answer.headers["x-receipt"],
                                int(answer.headers["x-receive-count"]), HIDDEN, start, end, "rest")
            self.record.received([delivery])
            fate = rng.random()
            if fate < 0.65:
                self._rest_delete(client, delivery)
            elif fate < 0.9:  # held a while: across a kill, sometimes
                held.append((time.time() + rng.uniform(0.2, 3.0), delivery))
            # else let go: it must come back once its visibility timeout ran out

    def _rest_delete(self, client: httpx.Client, delivery: Delivery) -> None:
        start = time.time()
        try:
            answer = client.delete(f"{self.url}/{QUEUE}/messages/{delivery.id}")
            outcome = {204: "done", 503: "unknown"}.get(answer.status_code, f"{answer.status_code} {answer.text}")
        except NO_ANSWER:
            self._failed()
            outcome = "unknown"
        with self.record.lock:
            self.record.deletes.append(Delete(delivery, "rest", start, time.time(), outcome))

    def sqs_consumer(self, client: httpx.Client, rng: random.Random, n: int) -> None:
        held: list[tuple[float, Delivery]] = []  # (when to delete, delivery), stale ones too
        while not self.stop.is_set():
            now = time.time()
            due = [h for h in held if h[0] <= now]
            if due:
                for h in due:
                    held.remove(h)
                for first in range(0, len(due), 10):  # at most 10 entries to a batch
                    self._sqs_delete(client, rng, [d for _, d in due[first : first + 10]])
            short = rng.random() < 0.15
            hidden = SHORT if short else HIDDEN
            answer, start, end = self._receive(lambda: self._sqs(client, "ReceiveMessage", {
                "MaxNumberOfMessages": rng.randint(1, 10), "VisibilityTimeout": hidden,
                "WaitTimeSeconds": rng.choice([0, 0, 1]), "AttributeNames": ["ApproximateReceiveCount"]}), hidden)
            if answer is None:
                continue
            assert answer.status_code == 200, answer.text
            messages = answer.json().get("Messages", [])
            if not messages:
                time.sleep(0.05)
                continue
            got = [Delivery(m["MessageId"], m["Body"], m["ReceiptHandle"],
                            int(m["Attributes"]["ApproximateReceiveCount"]), hidden, start, end, "sqs")
                   for m in messages]
            self.record.received(got)
            now_delete = []
            for delivery in got:
                fate = rng.random()
                if short:  # deleted once the message went out again, most likely: a stale receipt
                    held.append((time.time() + rng.uniform(SHORT + 0.5, 4.0), delivery))
                elif fate < 0.65:
                    now_delete.append(delivery)
                elif fate < 0.9:
                    held.append((time.time() + rng.uniform(0.2, 3.0), delivery))
            if now_delete:
                self._sqs_delete(client, rng, now_delete)

    def _sqs_delete(self, client: httpx.Client, rng: random.Random, deliveries: list[Delivery]) -> None:
        start = time.time()
        try:
            if len(deliveries) == 1 and rng.random() < 0.5:
                answer = self._sqs(client, "DeleteMessage", {"ReceiptHandle": deliveries[0].receipt})
                outcomes = ["done" if answer.status_code == 200 else
                            "unknown" if answer.status_code == 503 else f"{answer.status_code} {answer.text}"]
            else:
                entries = [{"Id": f"d{i}", "ReceiptHandle": d.receipt} for i, d in enumerate(deliveries)]
                answer = self._sqs(client, "DeleteMessageBatch", {"Entries": entries})
                if answer.status_code == 200:
                    result = answer.json()
                    outcomes = ["done"] * len(deliveries)
                    for failure in result["Failed"]:
                        code = failure["Code"]
                        outcomes[int(failure["Id"][1:])] = "unknown" if code == "ServiceUnavailable" else code
                else:
                    outcome = "unknown" if answer.status_code == 503 else f"{answer.status_code} {answer.text}"
                    outcomes = [outcome] * len(deliveries)
        except NO_ANSWER:
            self._failed()
            outcomes = ["unknown"] * len(deliveries)
        end = time.time()
        with self.record.lock:
            self.record.deletes.extend(Delete(d, "sqs", start, end, o) for d, o in zip(deliveries, outcomes))


@dataclass
class Verdict:
    """Each delete as the record shows it: ``done`` (answered done while its delivery was the
    current one), ``stale`` (sent after the message was seen delivered again: must do nothing),
    ``maybe`` (fate unknown: no answer, or a receipt used after its visibility ran out)."""

    done: dict[str, list[Delete]] = field(default_factory=lambda: defaultdict(list))
    stale: list[Delete] = field(default_factory=list)
    maybe: set[str] = field(default_factory=set)


def judge(record: Record) -> Verdict:
    by_body: dict[str, list[Delivery]] = defaultdict(list)
    for d in record.deliveries:
        by_body[d.body].append(d)
    verdict = Verdict()
    for delete in record.deletes:
        d = delivery = delete.delivery
        assert delete.outcome in ("done", "unknown"), f"a delete refused: {delete}"
        later = [o for o in by_body[d.body] if o.seq > d.seq and o.end < delete.start]
        if later:
            verdict.stale.append(delete)  # answered done, as SQS does, and must delete nothing
        elif delete.outcome == "done" and (delete.api == "rest" or delete.end < delivery.start + delivery.hidden):
            verdict.done[d.body].append(delete)
        else:
            verdict.maybe.add(d.body)
    return verdict


def check(record: Record, drained: Counter[str], drained_at: float) -> Verdict:
    verdict = judge(record)
    # One id per body, one body per id: nothing stored twice.
    ids: dict[str, set[str]] = defaultdict(set)
    for body, message_id in record.sent.items():
        ids[body].add(message_id)
    for d in record.deliveries:
        ids[d.body].add(d.id)
    twice = {body: i for body, i in ids.items() if len(i) > 1}
    assert not twice, f"stored twice: {list(twice.items())[:5]}"
    bodies_of: dict[str, set[str]] = defaultdict(set)
    for body, i in ids.items():
        bodies_of[next(iter(i))].add(body)
    assert all(len(b) == 1 for b in bodies_of.values()), [b for b in bodies_of.values() if len(b) > 1][:5]
    unknown = (set(drained) | {d.body for d in record.deliveries}) - record.attempted
    assert not unknown, f"messages nobody sent: {list(unknown)[:5]}"
    assert max(drained.values(), default=1) == 1, f"drained twice: {[b for b, n in drained.items() if n > 1][:5]}"

    # A delete answered done is never undone.
    by_body: dict[str, list[Delivery]] = defaultdict(list)
    for d in record.deliveries:
        by_body[d.body].append(d)
    for body, deletes in verdict.done.items():
        assert len(deletes) == 1, f"{body} deleted twice while hidden: {deletes}"
        after = [d for d in by_body[body] if d.start > deletes[0].end]
        assert not after, f"{body} received after its delete was answered: {deletes[0]} then {after}"
        assert body not in drained, f"{body} is back after its delete was answered: {deletes[0]}"

    # Deleted or drained, exactly once; at most once where a delete's fate is unknown.
    stored = set(record.sent) | set(by_body) | set(drained)
    for body in stored:
        times = len(verdict.done.get(body, ())) + drained[body]
        if body in verdict.maybe:
            assert times <= 1, body
        else:
            assert times == 1, (
                f"{body} ({'acknowledged' if body in record.sent else 'not acknowledged'}) deleted "
                f"{len(verdict.done.get(body, ()))} times and drained {drained[body]} times; deliveries "
                f"{by_body[body]}; deletes {[x for x in record.deletes if x.delivery.body == body]}")

    # Back only once the visibility timeout ran out; delivery numbers never repeat.
    for body, deliveries in by_body.items():
        deliveries.sort(key=lambda d: d.seq)
        seqs = [d.seq for d in deliveries]
        assert len(set(seqs)) == len(seqs), f"{body}: a delivery number given twice: {deliveries}"
        for first, again in zip(deliveries, deliveries[1:]):
            assert again.end >= first.start + first.hidden, f"{body} came back early: {first} then {again}"
        last = deliveries[-1]
        assert drained_at >= last.start + last.hidden  # (the drain waited for it)
    return verdict


def run(tmp_path: Path, workers: int, seed: int, rounds: int, shards: int | None = None) -> None:
    rng = random.Random(seed)
    args = ("--workers", str(workers)) if workers > 1 else ()
    server = ServerProcess(tmp_path / "data", *args, log_dir=tmp_path)
    record = Record()
    kills = worker_kills = 0
    try:
        server.start()
        httpx.put(f"{server.url}/{QUEUE}", params={} if shards is None else {"shards": shards}).raise_for_status()
        clients = Clients(server.url, record, seed)
        clients.start()
        try:
            for _round in range(rounds):
                time.sleep(rng.uniform(0.1, 2.5))  # early on: just after a recovery
                workers_now = server.worker_pids() if workers > 1 else []
                if workers_now and rng.random() < 0.5:
                    # One worker dies; uvicorn starts another; the other one goes on serving.
                    os.kill(rng.choice(workers_now), signal.SIGKILL)
                    record.kills.append(time.time())
                    worker_kills += 1
                    continue
                server.kill()
                record.kills.append(time.time())
                kills += 1
                time.sleep(rng.uniform(0, 0.3))  # clients fail meanwhile
                server.start()  # on the same data directory: recovery
                clients.url = server.url
            time.sleep(1.0)
        finally:
            clients.finish()
        # Everything received is visible again, unless deleted: drain it.
        time.sleep(max(0.0, record.hidden_until - time.time()) + 0.1)
        drained_at = time.time()
        drained = drain(server.url, QUEUE)
        verdict = check(record, drained, drained_at)
        done = [d for deletes in verdict.done.values() for d in deletes]
        print(f"seed {seed}, workers {workers}, shards {shards}: {kills} kills, {worker_kills} worker kills; "
              f"{len(record.sent)} sends acknowledged of {len(record.attempted)}; "
              f"{len(record.deliveries)} deliveries; {len(record.deletes)} deletes "
              f"({len(done)} done, {len(verdict.stale)} stale, "
              f"{len(verdict.maybe)} unknown; {len(record.across_a_kill(record.deletes))} across a kill: "
              f"{len(record.across_a_kill(done))} done, {len(record.across_a_kill(verdict.stale))} stale); "
              f"{len(drained)} drained; {record.failed_requests} requests unanswered")
        assert kills + worker_kills == rounds
        assert len(done) > 100 and verdict.stale, "too little was tested"
        assert record.across_a_kill(done) and record.across_a_kill(verdict.stale), "no receipt used across a kill"
        server.check_clean_stop()
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "shards"), [(1, None), (2, 2)])
def test_sigkill_under_sends_receives_and_deletes(tmp_path: Path, workers: int, shards: int | None) -> None:
    """One server on a plain queue; two workers (killed alone or together) on a sharded one."""
    seed = int(os.environ.get("JOURNALQ_STRESS_SEED", "20261122")) + workers
    run(tmp_path, workers, seed, int(os.environ.get("JOURNALQ_STRESS_ROUNDS", "5")), shards)
