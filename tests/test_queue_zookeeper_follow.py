"""The ZooKeeper store doing as the file store does since its second audit (``test_queue_left2``):
a dead letter moved on keeps its running receive count; a redrive's receives move nothing on by
the dead-letter queue's own policy; a dead-letter queue that cannot take its letters does not
block its source. Where the file store's test reads the same on this store, it is run here as
it is, on a ZooKeeper broker."""

from __future__ import annotations

import pytest

import test_queue_left2 as on_files
from test_queue_zookeeper import broker, url  # noqa: F401 (fixtures)

pytest.importorskip("kazoo", reason="kazoo is not installed (pip install -e '.[zookeeper]')")


def test_a_dead_letter_moved_on_keeps_its_running_receive_count(broker) -> None:  # noqa: F811
    on_files.test_a_dead_letter_moved_on_keeps_its_running_receive_count(broker)


def test_a_redrive_does_not_move_dead_letters_on_by_the_dead_letter_queue_s_own_policy(broker) -> None:  # noqa: F811
    # (this store has no shards: the file store's test is run with one)
    on_files.test_a_redrive_does_not_move_dead_letters_on_by_the_dead_letter_queue_s_own_policy(broker, shards=1)
