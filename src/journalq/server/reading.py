"""What the server's reads (``GET /{queue}``, a ``/metrics`` scrape) open of a queue: nothing
that a read would make."""

from __future__ import annotations

from journalq.queue import DEFAULT_CHANNEL, Broker, Queue


def queue_to_read(broker: Broker, name: str) -> Queue | None:
    """The queue ``name``, to read its counts; None for a topic whose channels are its own (none
    named ``default``: one made through the library), to which ``broker.queue`` would give a
    channel ``default``, which would take every message of the topic again and hold its gc back
    for a consumer that never comes. ``QueueNotFoundError`` when nothing has the name."""
    topic = broker.topic(name, create=False)
    if DEFAULT_CHANNEL in topic.channel_names():
        return broker.queue(name, create=False)
    # No channel listed: also what a topic whose directory was removed from outside shows.
    topic.check_present()
    return None
