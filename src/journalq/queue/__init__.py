"""Work queues on the journal: topics, channels, visibility timeouts, dead letters, delays,
filters and task states, shared by many processes with no daemon.

    with Broker("data") as broker:
        jobs = broker.queue("jobs", visibility_timeout=30)
        jobs.send(b"resize 1.jpg", attributes={"size": 1024})
        for message in jobs.receive(10, wait=5):
            ...
            jobs.delete(message.receipt)
"""

from journalq.queue.broker import DEFAULT_CHANNEL, Broker, Queue
from journalq.queue.channel import Channel, ChannelStats, ReceivedMessage, Task
from journalq.queue.envelope import ENVELOPE_TYPE, Attribute, Envelope
from journalq.queue.settings import QueueSettings
from journalq.queue.sharded import ShardedChannel, ShardedQueue, ShardedTopic
from journalq.queue.topic import Topic

__all__ = [
    "DEFAULT_CHANNEL",
    "ENVELOPE_TYPE",
    "Attribute",
    "Broker",
    "Channel",
    "ChannelStats",
    "Envelope",
    "QueueSettings",
    "Queue",
    "ReceivedMessage",
    "ShardedChannel",
    "ShardedQueue",
    "ShardedTopic",
    "Task",
    "Topic",
]
