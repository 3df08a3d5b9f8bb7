"""/metrics of ``journalq serve --workers 2``: every scrape, whichever worker answers it, adds up
the counters and histograms of both workers (and of a worker that died), shows the queue gauges
once, and one process keeps its values in memory. Methods a client makes up share one latency
label, a scrape while the queues cannot be listed still gives the counters, and the receives
waiting are counted while they wait."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from test_server_harness import (  # noqa: F401 - start_server: a fixture of these tests
    ServerProcess,
    await_waiting_receives,
    metric_families,
    metric_sample,
    sqs_client,
    start_server,
)

QUEUE = "counted"
SENDERS = 8
SENT = 160  # by SENDERS threads, a new connection per request: both workers take some
RECEIVED = 30
DELETED = 20
SCRAPES = 10
POST = {"api": "rest", "operation": "POST /{queue}/messages", "status": "201"}
ANSWERED = {("PUT /{queue}", 201): 1, ("POST /{queue}/messages", 201): SENT, ("GET /{queue}/messages", 200): RECEIVED,
            ("DELETE /{queue}/messages/{message_id}", 204): DELETED}


def scrape(server: ServerProcess) -> dict[str, Any]:
    """The metrics, over a new connection (either worker takes it)."""
    answer = httpx.get(f"{server.url}/metrics", timeout=30)
    assert answer.status_code == 200
    return metric_families(answer.text)


def value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float | None:
    return metric_sample(families, family, sample or family, **labels)


def multiprocess_directory(server: ServerProcess) -> Path:
    """The metrics directory ``journalq serve`` gave its workers (in their environment)."""
    directories = set()
    for pid in server.worker_pids():
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        directories |= {entry.partition(b"=")[2].decode() for entry in environ
                        if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR=")}
    assert len(directories) == 1, f"the workers' metrics directories: {directories}"
    return Path(directories.pop())


def requests_of(directory: Path, pid: int) -> float:
    """The POSTs one worker answered 201, from its own file alone."""
    (histogram,) = MultiProcessCollector.merge([str(directory / f"histogram_{pid}.db")])
    return sum(s.value for s in histogram.samples if s.name.endswith("_count")
               and all(s.labels.get(k) == v for k, v in POST.items()))


def syncs_of(directory: Path, pid: int) -> float:
    """The syncs one worker published, from its own file alone."""
    (counter,) = [m for m in MultiProcessCollector.merge([str(directory / f"counter_{pid}.db")])
                  if m.name == "journalq_syncs"]
    return sum(s.value for s in counter.samples if s.name == "journalq_syncs_total")


def in_threads(count: int, work: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def send(server: ServerProcess, total: int, first: int = 0) -> None:
    """``total`` POSTs to ``QUEUE`` from ``SENDERS`` threads, each request on a new connection."""
    def sender(n: int) -> None:
        for i in range(first + n, first + total, SENDERS):
            assert httpx.post(f"{server.url}/{QUEUE}/messages", content=b"m%d" % i, timeout=30).status_code == 201

    in_threads(SENDERS, sender)


def requests_counted(families: dict[str, Any], operation: str, status: int) -> float | None:
    return value(families, "journalq_request_seconds", "journalq_request_seconds_count",
                 operation=operation, status=str(status))


def settled(server: ServerProcess, answered: dict[tuple[str, int], int], workers: int = 1) -> dict[str, Any]:
    """A scrape once the requests ``answered`` (operation, status: how many) are all noted (a
    worker notes a request's latency just after it wrote the answer, so the client may scrape the
    other worker a moment before), and once ``workers`` processes have started (on a loaded
    machine, one worker may answer every request before the other has made its app)."""
    deadline = time.monotonic() + 10
    seen: list[dict[tuple[str, int], float | None]] = []
    while time.monotonic() < deadline:
        families = scrape(server)
        counted = {key: requests_counted(families, *key) for key in answered}
        running = value(families, "journalq_workers") or 0
        if counted == answered and running >= workers:
            return families
        if counted not in seen:
            seen.append(counted)
        time.sleep(0.1)
    raise AssertionError(f"requests answered: {answered}, by {workers} worker(s); the scrapes counted (each "
                         f"different count once): {seen}; workers running at the last: {running}")


def test_every_scrape_adds_up_both_workers(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server("--workers", "2")
    assert httpx.put(f"{server.url}/{QUEUE}").status_code == 201
    send(server, SENT)

    def consumer(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:  # a connection each
            for i in range(n, RECEIVED, 3):
                got = client.get(f"/{QUEUE}/messages", params={"visibility_timeout": 600})
                assert got.status_code == 200
                if i < DELETED:
                    assert client.delete(f"/{QUEUE}/messages/{got.headers['x-message-id']}").status_code == 204

    in_threads(3, consumer)
    settled(server, ANSWERED, workers=2)
    scrapes = [scrape(server) for _ in range(SCRAPES)]
    for n, families in enumerate(scrapes):
        assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue=QUEUE) == SENT, n
        assert value(families, "journalq_messages_out", "journalq_messages_out_total", queue=QUEUE) == RECEIVED
        assert value(families, "journalq_messages_deleted", "journalq_messages_deleted_total", queue=QUEUE) == DELETED
        assert {key: requests_counted(families, *key) for key in ANSWERED} == ANSWERED
        bucket = "journalq_request_seconds_bucket"
        assert value(families, "journalq_request_seconds", bucket, le="+Inf", **POST) == SENT
        assert value(families, "journalq_workers") == 2
        # The queue's gauges, read from the data directory by the worker scraped: once, not summed.
        depths = {s.name: s.value for name, family in families.items() if name.startswith("journalq_queue_")
                  for s in family.samples if s.labels["queue"] == QUEUE}
        assert depths == {"journalq_queue_available": SENT - RECEIVED, "journalq_queue_in_flight": RECEIVED - DELETED,
                          "journalq_queue_delayed": 0, "journalq_queue_dead": 0, "journalq_queue_damaged": 0,
                          "journalq_queue_oldest_age_seconds": depths["journalq_queue_oldest_age_seconds"]}
    # sync=always: each batch of POSTs and each DELETE synced, by one worker or the other; the sum
    # is the same from either (nothing was written between the scrapes).
    syncs = {value(families, "journalq_syncs", "journalq_syncs_total") for families in scrapes}
    assert len(syncs) == 1, syncs
    (total,) = syncs
    # Every DELETE is synced, a POST at most once (group commit), and the channel's own
    # bookkeeping (its collection, a snapshot) now and then: the exact count depends on the load.
    assert DELETED < total <= SENT + DELETED + 10, total
    # Both workers took a share (each one's file alone), in a directory outside the data's, and
    # the scrapes' sums are the sums of the workers' own values.
    directory = multiprocess_directory(server)
    assert not directory.resolve().is_relative_to(server.data.resolve())
    per_worker = {pid: requests_of(directory, pid) for pid in server.worker_pids()}
    assert len(per_worker) == 2 and all(per_worker.values()), f"POSTs each worker answered: {per_worker}"
    assert sum(syncs_of(directory, pid) for pid in per_worker) == total
    server.check_clean_stop()
    assert not directory.exists(), "the metrics directory outlived the server"


def test_a_dead_workers_counters_still_count_and_its_gauges_do_not(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server("--workers", "2")
    assert httpx.put(f"{server.url}/{QUEUE}").status_code == 201
    send(server, SENT)
    settled(server, {("POST /{queue}/messages", 201): SENT})
    dead = server.worker_pids()[0]
    os.kill(dead, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (dead in (pids := server.worker_pids()) or len(pids) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)  # until uvicorn's supervisor has started another
    assert dead not in pids and len(pids) == 2, f"worker {dead} killed; the workers now: {pids}"
    for _ in range(SCRAPES):
        families = scrape(server)
        assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue=QUEUE) == SENT
        assert requests_counted(families, "POST /{queue}/messages", 201) == SENT
    directory = multiprocess_directory(server)
    live = [directory / f"gauge_livesum_{pid}.db" for pid in pids]
    while not all(path.exists() for path in live) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the new worker is up
    for _ in range(SCRAPES):
        assert value(scrape(server), "journalq_workers") == 2  # not 3: the dead one's 1 left the sum
    assert not (directory / f"gauge_livesum_{dead}.db").exists()
    assert requests_of(directory, dead) > 0  # what it counted is still there, and counted above
    send(server, SENT, first=SENT)  # the new worker counts on top
    families = settled(server, {("POST /{queue}/messages", 201): 2 * SENT})
    assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue=QUEUE) == 2 * SENT
    assert value(families, "journalq_queue_available", queue=QUEUE) == 2 * SENT


def test_receives_waiting_are_counted_in_every_worker_while_they_wait(
    start_server: Callable[..., ServerProcess],
) -> None:
    """``journalq_receives_waiting``: the long polls of a queue waiting now, REST's and SQS's,
    summed over the workers; each leaves it once it ends, with a message or its wait over."""
    server = start_server("--workers", "2")
    sqs = sqs_client(server.url, read_timeout=60)
    queue_url = sqs.create_queue(QueueName=QUEUE)["QueueUrl"]
    got: list[bytes] = []

    def rest_poll() -> None:  # a connection each: either worker takes it
        got.append(httpx.get(f"{server.url}/{QUEUE}/messages", params={"wait": 30}, timeout=60).content)

    def sqs_poll() -> None:
        answer = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=20)
        got.extend(m["Body"].encode() for m in answer.get("Messages", ()))

    polls = [threading.Thread(target=rest_poll) for _ in range(3)] + [threading.Thread(target=sqs_poll)]
    for poll in polls:
        poll.start()
    await_waiting_receives(server.url, QUEUE, 4)
    assert not got
    sent = [b"m%d" % i for i in range(4)]
    for body in sent:
        assert httpx.post(f"{server.url}/{QUEUE}/messages", content=body).status_code == 201
    for poll in polls:
        poll.join(60)
    assert sorted(got) == sent
    await_waiting_receives(server.url, QUEUE, 0)
    # A poll whose wait runs out leaves it too; one that finds a message at once never waited.
    assert httpx.get(f"{server.url}/{QUEUE}/messages", params={"wait": 0.2}).status_code == 204
    httpx.post(f"{server.url}/{QUEUE}/messages", content=b"there").raise_for_status()
    assert httpx.get(f"{server.url}/{QUEUE}/messages", params={"wait": 30}).content == b"there"
    await_waiting_receives(server.url, QUEUE, 0)
    server.check_clean_stop()


def test_syncs_after_the_last_request_are_added_within_a_second(start_server: Callable[..., ServerProcess]) -> None:
    """``--sync group``: the syncs come from the writers' flusher thread after the answers; each
    worker adds its own to the sum within a second, not only at its next request."""
    server = start_server("--workers", "2", "--sync", "group:5ms")
    assert httpx.put(f"{server.url}/{QUEUE}").status_code == 201
    send(server, SENT)
    time.sleep(1.5)  # the last flushes, and a second
    syncs = {value(scrape(server), "journalq_syncs", "journalq_syncs_total") for _ in range(SCRAPES)}
    assert len(syncs) == 1 and syncs.pop() > 0, syncs


def test_the_directory_of_a_killed_server_is_removed_by_the_next(start_server: Callable[..., ServerProcess],
                                                                  tmp_path: Path) -> None:
    """A server killed with SIGKILL cannot remove its metrics directory: the next server started
    does, and leaves alone those of servers still running (and anything not a server's)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    (temporary / "journalq-metrics-of-someone-else").mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    killed = start_server("--workers", "2", data=tmp_path / "killed", env=env)
    left = multiprocess_directory(killed)
    assert left.parent == temporary
    running = start_server("--workers", "2", data=tmp_path / "running", env=env)
    kept = multiprocess_directory(running)
    assert left.exists()  # in use when the other started
    killed.kill()
    assert left.exists()
    start_server("--workers", "2", data=tmp_path / "next", env=env)
    assert not left.exists()
    assert kept.exists() and (temporary / "journalq-metrics-of-someone-else").exists()
    assert value(scrape(running), "journalq_workers") == 2


def test_one_process_keeps_its_values_in_memory(start_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """A PROMETHEUS_MULTIPROC_DIR of the caller's is not used: not by one process (whose metrics
    stay in memory), nor by workers (which get a fresh directory, no older run's files)."""
    callers = tmp_path / "callers-metrics"
    callers.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(callers)}
    for args in ((), ("--workers", "2")):
        server = start_server(*args, data=tmp_path / f"data{len(args)}", env=env)
        assert httpx.put(f"{server.url}/{QUEUE}").status_code == 201
        send(server, SENDERS)
        families = settled(server, {("POST /{queue}/messages", 201): SENDERS}, workers=2 if args else 1)
        assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue=QUEUE) == SENDERS
        assert value(families, "journalq_workers") == (2 if args else 1)
        assert value(families, "journalq_syncs", "journalq_syncs_total") >= 1
        if args:
            assert multiprocess_directory(server) != callers
        server.check_clean_stop()
    assert not list(callers.iterdir())


def test_the_multiprocess_variable_must_come_before_prometheus_client(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """Set after prometheus_client was imported (as here: this process keeps values in memory),
    the variable would give scrapes of nothing but the files: refused, not served wrong."""
    from journalq.errors import Error
    from journalq.server.metrics import Metrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(Error, match="PROMETHEUS_MULTIPROC_DIR"):
        Metrics()


def test_latencies_taken_together_expose_what_one_by_one_would() -> None:
    """``LatencyHistogram.observe_all`` adds to prometheus_client's own values: the exposition is
    the one of as many ``observe`` calls, bounds included (an observation on a bound is in its
    bucket)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from journalq.server.metrics import LatencyHistogram

    latencies = [0.0, 0.0005, 0.0007, 0.001, 0.0011, 0.3, 7.5, 25.0, 1e9, 0.0001, -1.0]
    buckets = (0.0005, 0.001, 0.5, 10)
    texts = []
    for kind in (Histogram, LatencyHistogram):
        registry = CollectorRegistry()
        child = kind("latency", "Latency.", ["op"], buckets=buckets, registry=registry).labels("x")
        if kind is Histogram:
            for seconds in latencies:
                child.observe(seconds)
        else:
            child.observe_all(latencies[:4])
            child.observe_all(latencies[4:])
        texts.append([line for line in generate_latest(registry).decode().splitlines() if "_created" not in line])
    assert texts[0] == texts[1]
    assert 'latency_bucket{le="0.001",op="x"} 6.0' in texts[1]  # cumulative: 4 at or under 0.0005


def test_latencies_noted_reach_the_histogram_in_the_next_turn_of_the_loop_or_before_a_scrape() -> None:
    import asyncio

    from journalq.server.metrics import Metrics

    metrics = Metrics()

    def count() -> float | None:
        families = metric_families(metrics.render().decode())
        return value(families, "journalq_request_seconds", "journalq_request_seconds_count", **POST)

    async def main() -> None:
        for _ in range(3):
            metrics.note("rest", POST["operation"], 201, 0.002)
        assert count() is None  # not yet: taken in the loop's next turn
        await asyncio.sleep(0)
        assert count() == 3
        metrics.note("rest", POST["operation"], 201, 0.002)
        metrics.observe_noted()  # what the scrape's endpoint does first
        assert count() == 4

    asyncio.run(main())
    metrics.note("rest", POST["operation"], 201, 0.002)  # with no event loop: at once
    assert count() == 5


def test_sqs_sends_are_counted_once_a_batch_by_their_answers() -> None:
    from journalq.server.metrics import Metrics
    from journalq.server.sqs import SqsError

    metrics = Metrics()

    def sent(queue: str) -> float | None:
        return value(metric_families(metrics.render().decode()), "journalq_messages_in", "journalq_messages_in_total",
                     queue=queue)

    refused = SqsError("MissingParameter", "no body")
    metrics.count_sqs_sends("q", ["SendMessage", "SendMessageBatch", "SendMessage", "SendMessageBatch"], [
        {"MessageId": "1", "MD5OfMessageBody": "0" * 32},
        {"Successful": [{"Id": "a"}, {"Id": "b"}], "Failed": [{"Id": "c"}]},
        refused,
        {"Successful": [{"Id": "d"}], "Failed": []},
    ])
    assert sent("q") == 4
    metrics.count_sqs_sends("q", ["SendMessage"], [{"MessageId": "2", "MD5OfMessageBody": "0" * 32}])
    assert sent("q") == 5
    # A plain SendMessage is answered as the server makes its whole answer (_plain_sent_answer).
    plain = (200, [(b"content-type", b"application/x-amz-json-1.0")], b'{"MessageId": "3"}')
    metrics.count_sqs_sends("q", ["SendMessage", "SendMessage", "SendMessage"], [plain, refused, plain])
    assert sent("q") == 7
    metrics.count_sqs_sends("plain", ["SendMessage"], [plain])
    assert sent("plain") == 1
    metrics.count_sqs_sends("failed", ["SendMessageBatch"], [{"Successful": [], "Failed": [{"Id": "a"}]}])
    assert sent("failed") == 0  # answered: the queue shows, with nothing stored
    metrics.count_sqs_sends("refused", ["SendMessage", "SendMessageBatch"], [refused, refused])
    assert sent("refused") is None


def test_an_sqs_request_is_timed_under_the_action_the_app_acts_on() -> None:
    """A request with two ``X-Amz-Target`` headers is answered for the last one (as a dict of the
    headers keeps): its latency is noted under that action too. (Before, the metrics took the
    first.)"""
    from journalq.server.metrics import Metrics

    metrics = Metrics()
    scope = {"headers": [(b"x-amz-target", b"AmazonSQS.DeleteMessage"), (b"host", b"h"),
                         (b"x-amz-target", b"AmazonSQS.ReceiveMessage")]}
    metrics.note_request(scope, 200, time.perf_counter())
    families = metric_families(metrics.render().decode())
    labels = {"api": "sqs", "status": "200"}
    count = "journalq_request_seconds_count"
    assert value(families, "journalq_request_seconds", count, operation="ReceiveMessage", **labels) == 1
    assert value(families, "journalq_request_seconds", count, operation="DeleteMessage", **labels) is None


# -- labels a client chooses, a scrape of what cannot be listed ------------------------------------


def test_an_unknown_http_method_is_not_a_latency_label_of_its_own() -> None:
    """The method is a token of the client's choice (h11 takes any): each new one made a new
    series of the latency histogram. Methods outside HTTP's own are labelled ``OTHER``."""
    from journalq.server.metrics import Metrics

    metrics = Metrics()
    for method in ("FOO1", "FOO2", "BREW"):
        metrics.note_request({"headers": [], "method": method}, 404, time.perf_counter())
    metrics.note_request({"headers": [], "method": "GET"}, 404, time.perf_counter())
    families = metric_families(metrics.render().decode())
    count = "journalq_request_seconds_count"
    operations = {s.labels["operation"] for s in families["journalq_request_seconds"].samples if s.name == count}
    assert operations == {"OTHER unrouted", "GET unrouted"}
    assert value(families, "journalq_request_seconds", count, api="service", operation="OTHER unrouted",
                 status="404") == 3


def test_a_scrape_while_the_queues_cannot_be_listed_still_gives_the_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue gauges are read at the scrape from the data directory. Before, a directory that
    refused to be listed (EACCES, a storage gone) failed the whole scrape: the counters, latencies
    and syncs went missing with the gauges. Now the scrape leaves the gauges out (as it does a
    queue that cannot be read) and gives the rest."""
    from journalq.queue import Broker
    from journalq.server.metrics import Metrics

    metrics = Metrics()
    metrics.watch(Broker(tmp_path))
    metrics.counted(metrics.messages_in, "q").inc(3)

    def refused(self: Broker) -> list[str]:
        raise PermissionError(13, "Permission denied", str(self.root))

    monkeypatch.setattr(Broker, "names", refused)
    families = metric_families(metrics.render().decode())
    assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue="q") == 3
    assert families["journalq_queue_available"].samples == []
