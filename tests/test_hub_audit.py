"""The hub audit: the pusher's backoff, hub URLs, refusals in follow mode, a lost copy, and
storage failures of the hub's store."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from journalq.cli.main import cli
from journalq.errors import HubError, HubUnavailableError
from journalq.hub.client import Backoff, HubClient
from journalq.journal import Writer


def test_backoff_stays_at_its_maximum_however_long_the_hub_is_down() -> None:
    """A hub down for an hour (well over a thousand attempts at two seconds) is still waited
    for: the delay stays at its maximum instead of overflowing a float."""
    backoff = Backoff(initial=0.05, maximum=2.0)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert all(1.5 <= d <= 2.0 for d in delays[-100:])
    backoff = Backoff(initial=0.0, maximum=1.0)  # no wait at all, however many attempts
    assert [backoff.next_delay() for _ in range(5000)][-1] == 0.0


@pytest.mark.parametrize("url", ["localhost:8090", "hub", "ftp://hub:8090", "http://", "http://hub:99999"])
def test_a_hub_url_that_is_not_http_host_port_is_refused_at_once(url: str) -> None:
    """Not retried for ever as an unreachable hub: the URL itself is wrong, and said so."""
    with pytest.raises(HubError, match="hub URL") as caught:
        HubClient(url)
    assert not isinstance(caught.value, HubUnavailableError)


@pytest.mark.parametrize("command", [
    ["push", "--to", "localhost:8090", "--client-id", "c", "--once", "--give-up-after", "0"],
    ["status", "--hub", "localhost:8090"],
    ["get", "--hub", "localhost:8090", "--client-id", "c", "j", "0"],
])
def test_the_hub_commands_refuse_a_url_without_http_as_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    with Writer(tmp_path / "j") as writer:
        writer.append(b"x")
    args = ["hub", *command] + ([str(tmp_path / "j")] if command[0] == "push" else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "localhost:8090" in result.output and "http://HOST:PORT" in result.output
