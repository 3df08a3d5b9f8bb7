"""Threads asking a topic for a channel at once: one channel is made, the one the topic keeps
(and closes). Two used to be made, each with a writer of the same state journal, and only the
kept one was ever closed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journalq.queue import Broker
from journalq.queue import channel as channel_module
from journalq.queue import sharded as sharded_module


@pytest.mark.parametrize("shards", [1, 4])
def test_threads_asking_for_a_new_channel_at_once_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: int
) -> None:
    made: list[object] = []
    slow_class = channel_module.Channel if shards == 1 else sharded_module.ShardedChannel
    real_init = slow_class.__init__

    def slow_init(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        time.sleep(0.2)  # long enough for the other thread to ask meanwhile
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(slow_class, "__init__", slow_init)
    with Broker(tmp_path, sync="none") as broker:
        topic = broker.topic("t", shards=shards) if shards > 1 else broker.topic("t")
        got: list[object] = []
        threads = [threading.Thread(target=lambda: got.append(topic.channel("c"))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(made) == 1 and got == [made[0], made[0]]
