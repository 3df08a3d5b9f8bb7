"""``Queue``: a topic with one channel, the common case (SQS's queue).

Apart from ``broker`` so that the stores built on the broker (``sharded``, ``zookeeper``) can
reuse its methods without importing the broker, which imports them.
"""

from __future__ import annotations

from typing import Any

from journalq.errors import QueueNotFoundError
from journalq.queue.channel import Channel
from journalq.queue.settings import QueueSettings
from journalq.queue.envelope import resend

__all__ = ["DEFAULT_CHANNEL", "Queue"]

DEFAULT_CHANNEL = "default"


class Queue(Channel):
    """A topic with one channel, the common case (SQS's queue): send, receive, delete."""

    def send(self, body: bytes, **options: Any) -> str:
        """Send one message; see ``Topic.send`` for the options."""
        return self.topic.send(body, **options)

    def send_many(self, items: Any) -> list[str]:
        return self.topic.send_many(items)

    def configure(self, **changes: Any) -> QueueSettings:
        """Change settings (visibility_timeout, delay, max_receive_count, ...); returns them all."""
        return self.topic.broker.configure(self.topic.name, **changes)

    def redrive(self, destination: str | None = None, max_messages: int | None = None) -> int:
        """Move dead letters back to the queue each came from (or to ``destination``), oldest
        first (SQS's StartMessageMoveTask); returns how many were moved."""
        broker = self.topic.broker
        if destination is not None:
            broker.queue(destination, create=False)  # refuse a destination that does not exist
        moved = 0
        while max_messages is None or moved < max_messages:
            size = 100 if max_messages is None else min(100, max_messages - moved)
            batch = self.receive(size, visibility_timeout=60)
            if not batch:
                return moved
            by_target: dict[str, list[Any]] = {}
            for message in batch:
                target = destination or (message.source or {}).get("queue")
                if target is None:
                    self.release(message.receipt)
                    continue
                by_target.setdefault(target, []).append(message)
            for target, messages in list(by_target.items()):
                try:
                    # Never make a queue that was deleted since: its dead letters stay here.
                    queue = broker.queue(target, create=False)
                except QueueNotFoundError:
                    for message in messages:
                        self.release(message.receipt, delay=60)
                    del by_target[target]
                    continue
                queue.send_many([resend(m) for m in messages])
                self.delete_many([m.receipt for m in messages])
                moved += len(messages)
            if not by_target:
                return moved
        return moved
