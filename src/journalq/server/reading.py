"""The server's reads of queues: what ``GET /{queue}`` and a ``/metrics`` scrape open of a queue
(nothing that a read would make), and the first looks of fetches that came together."""

from __future__ import annotations

from collections.abc import Sequence

from journalq.queue import Broker, Queue, ReceivedMessage, ShardedQueue


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


def received_in_turn(
    queue: Queue | ShardedQueue, asked: Sequence[tuple[float | None, int]]
) -> list[list[ReceivedMessage]]:
    """Receives of ``queue`` that came together (mq's fetches, SQS's ReceiveMessages), each asking
    (visibility timeout, count), made as one receive with no wait for each timeout asked, the
    oldest messages to the earliest: each one's messages (fewer than it asked, or none, when the
    queue had fewer). A receive shared out so takes one message of a FIFO group: two requests'
    consumers must not hold one group at once."""
    by_timeout: dict[float | None, list[int]] = {}
    for position, (timeout, _) in enumerate(asked):
        by_timeout.setdefault(timeout, []).append(position)
    received: list[list[ReceivedMessage]] = [[] for _ in asked]
    for timeout, positions in by_timeout.items():
        got = queue.receive(sum(asked[p][1] for p in positions), wait=0, visibility_timeout=timeout,
                            one_per_group=len(positions) > 1)
        taken = 0
        for position in positions:
            count = asked[position][1]
            received[position], taken = got[taken : taken + count], taken + count
    return received
