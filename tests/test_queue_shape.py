"""The broker's handles and the shape of what it makes: queues, topics, their settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalq.errors import QueueNotFoundError
from journalq.queue import Broker


@pytest.mark.parametrize("shards", [1, 2])
def test_queue_if_made_finds_queues_and_makes_no_channel_on_a_topic(tmp_path: Path, shards: int) -> None:
    with Broker(tmp_path, sync="none") as broker:
        queue = broker.queue("q", shards=shards)
        assert broker.queue_if_made("q") is queue
        topic = broker.topic("t", shards=shards)
        assert broker.queue_if_made("t") is None  # no channel at all
        topic.channel("a")
        assert broker.queue_if_made("t") is None
        assert topic.channel_names() == ["a"]
        with pytest.raises(QueueNotFoundError):
            broker.queue_if_made("missing")
    with Broker(tmp_path, sync="none") as broker:  # a queue this process has not opened yet
        found = broker.queue_if_made("q")
        assert found is not None and found is broker.queue("q")
