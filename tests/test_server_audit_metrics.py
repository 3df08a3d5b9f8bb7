"""Audit of /metrics: label values that a client chooses must not grow the series without bound."""

from __future__ import annotations

import time

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
