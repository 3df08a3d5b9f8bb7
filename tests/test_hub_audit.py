"""The hub audit: the pusher's backoff, hub URLs, refusals in follow mode, a lost copy, and
storage failures of the hub's store."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.hub.client import Backoff


def test_backoff_stays_at_its_maximum_however_long_the_hub_is_down() -> None:
    """A hub down for an hour (well over a thousand attempts at two seconds) is still waited
    for: the delay stays at its maximum instead of overflowing a float."""
    backoff = Backoff(initial=0.05, maximum=2.0)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert all(1.5 <= d <= 2.0 for d in delays[-100:])
    backoff = Backoff(initial=0.0, maximum=1.0)  # no wait at all, however many attempts
    assert [backoff.next_delay() for _ in range(5000)][-1] == 0.0
