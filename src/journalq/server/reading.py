"""What the server's reads (``GET /{queue}``, a ``/metrics`` scrape) open of a queue: nothing
that a read would make."""

from __future__ import annotations

from journalq.queue import Broker, Queue, ShardedQueue


def queue_to_read(broker: Broker, name: str) -> Queue | ShardedQueue | None:
    """The queue ``name``, to read its counts; None for a topic whose channels are its own (none
    named ``default``: one made through the library), to which ``broker.queue`` would give a
    channel ``default``, which would take every message of the topic again and hold its gc back
    for a consumer that never comes (``Broker.queue_if_made``). ``QueueNotFoundError`` when
    nothing has the name."""
    found = broker.queue_if_made(name)
    if found is None:
        # No channel found: also what a topic whose directory was removed from outside shows.
        broker.topic(name, create=False).check_present()
    return found
