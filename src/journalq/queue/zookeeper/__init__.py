"""The ZooKeeper store: zkmq's queue on a ZooKeeper ensemble, behind the queue interface.

``Broker("zk://host:port[,host:port]/path")`` gives a ``ZooKeeperBroker``. Only this package's
pure part (``layout``) is imported until such a URL is used; the store needs ``kazoo``.
"""

from journalq.queue.zookeeper.layout import is_zookeeper_url, parse_url

__all__ = ["is_zookeeper_url", "parse_url"]
