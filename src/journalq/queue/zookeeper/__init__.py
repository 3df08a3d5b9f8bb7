"""The ZooKeeper store: zkmq's queue on a ZooKeeper ensemble, behind the queue interface.

``Broker("zk://host:port[,host:port]/path")`` gives a ``ZooKeeperBroker`` (``open_broker``). Only
this package's pure part (``layout``) is imported until such a URL is used; the store needs
``kazoo``.
"""

from __future__ import annotations

from typing import Any

from journalq.errors import QueueError
from journalq.queue.zookeeper.layout import check_session_timeout, is_zookeeper_url, parse_url

__all__ = ["check_session_timeout", "is_zookeeper_url", "open_broker", "parse_url"]


def open_broker(url: str, **options: Any) -> Any:
    """The ``ZooKeeperBroker`` of ``url`` (``zk://host:port[,host:port]/path``)."""
    parse_url(url)  # a bad URL is an error even without kazoo
    try:
        from journalq.queue.zookeeper.store import ZooKeeperBroker
    except ImportError as exc:
        raise QueueError(
            f"the ZooKeeper store needs kazoo ({exc}): pip install 'journalq[zookeeper]'"
        ) from None
    return ZooKeeperBroker(url, **options)
