"""Audit of /metrics: label values that a client chooses must not grow the series without bound, and
what the scrape reads from the data directory must not fail the rest of it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from test_server_metrics import value
from test_server_rest import _families


def test_an_unknown_http_method_is_not_a_latency_label_of_its_own() -> None:
    """The method is a token of the client's choice (h11 takes any): each new one made a new
    series of the latency histogram. Methods outside HTTP's own are labelled ``OTHER``."""
    from journalq.server.metrics import Metrics

    metrics = Metrics()
    for method in ("FOO1", "FOO2", "BREW"):
        metrics.note_request({"headers": [], "method": method}, 404, time.perf_counter())
    metrics.note_request({"headers": [], "method": "GET"}, 404, time.perf_counter())
    families = _families(metrics.render().decode())
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
    families = _families(metrics.render().decode())
    assert value(families, "journalq_messages_in", "journalq_messages_in_total", queue="q") == 3
    assert families["journalq_queue_available"].samples == []
