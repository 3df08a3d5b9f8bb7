"""``journalq queue send|redrive --data zk://... --zk-producer-gc/--no-zk-producer-gc``: the
ZooKeeper store's ``Broker(url, producer_gc=...)``, which the command line could not reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from journalq.cli.main import cli
from journalq.queue import Broker
from test_queue_zookeeper import url  # noqa: F401 (fixture)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def run(data: Path | str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["queue", *args, "--data", str(data), "--sync", "none"], catch_exceptions=False)


@pytest.mark.parametrize("command", [["send", "jobs", "x"], ["redrive", "dead"]])
def test_the_commands_that_send_give_their_broker_the_option(
    url: str, command: list[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """(That such a broker's sends leave the collection to others: test_queue_zookeeper_collection.)"""
    import journalq.cli.queue as queue_cli

    with Broker(url, sync="none") as broker:
        broker.queue("jobs")
        broker.queue("dead")
    made: list[Any] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        made.append(Broker(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(queue_cli, "Broker", recorded)
    for flag, producer_gc in (("--no-zk-producer-gc", False), ("--zk-producer-gc", True), (None, True)):
        result = run(url, *command, *([flag] if flag else []))
        assert result.exit_code == 0, result.output
        assert made.pop().producer_gc is producer_gc


@pytest.mark.parametrize("command", [["send", "jobs", "x"], ["redrive", "jobs"]])
@pytest.mark.parametrize("flag", ["--zk-producer-gc", "--no-zk-producer-gc"])
def test_the_option_is_refused_with_a_data_directory(tmp_path: Path, command: list[str], flag: str) -> None:
    result = CliRunner().invoke(cli, ["queue", *command, flag, "--data", str(tmp_path / "data")])
    assert result.exit_code == 1
    assert f"{flag} is an option of the ZooKeeper store (--data zk://...), and {tmp_path / 'data'} is a directory" in (
        result.output
    )
    assert not (tmp_path / "data").exists()  # refused before anything was made
