"""``Queue``: a topic with one channel, the common case (SQS's queue).

Apart from ``broker`` so that the stores built on the broker (``sharded``, ``zookeeper``) can
reuse its methods without importing the broker, which imports them.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from journalq.errors import InvalidSettingError, QueueNotFoundError, raise_storage_failure
from journalq.queue.channel import REDRIVING, Channel
from journalq.queue.settings import QueueSettings
from journalq.queue.envelope import resend, source_queue

__all__ = ["DEFAULT_CHANNEL", "Queue"]

log = logging.getLogger("journalq.queue")

DEFAULT_CHANNEL = "default"
_REDRIVE_VISIBILITY = 60.0  # seconds a redrive hides what it moves: back after that if it dies


class Queue(Channel):
    """A topic with one channel, the common case (SQS's queue): send, receive, delete."""

    def send(self, body: bytes, **options: Any) -> str:
        """Send one message; see ``Topic.send`` for the options."""
        self.maintain_when_due()
        return self.topic.send(body, **options)

    def send_many(self, items: Any) -> list[str]:
        self.maintain_when_due()  # (zkmq: producers collect finished tasks too)
        return self.topic.send_many(items)

    def configure(self, **changes: Any) -> QueueSettings:
        """Change settings (visibility_timeout, delay, max_receive_count, ...); returns them all."""
        return self.topic.broker.configure(self.topic.name, **changes)

    def redrive(self, destination: str | None = None, max_messages: int | None = None) -> int:
        """Move dead letters back to the queue each came from (or to ``destination``), oldest
        first (SQS's StartMessageMoveTask); returns how many were moved. A dead letter of a
        topic's channel goes back to that channel alone: the topic's other channels had it.

        What cannot move (a message that names no source queue, or one that was deleted since) is
        received like the rest, so its receive count grows by one, and it is given back when the
        redrive ends: it stays hidden until then, so that the redrive goes on past it. A source
        that is malformed (stored by a version that did not check it) names no queue: the message
        stays, with a warning that names it, rather than stopping the redrive of the others. The
        redrive's receives never move a dead letter on by this queue's own max_receive_count (a
        move is no receive in SQS either): it goes back, however often it was looked at here."""
        if max_messages is not None and (
            isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 0
        ):
            raise InvalidSettingError(
                f"max_messages must be a whole number from 0 (or None: all), not {max_messages!r}"
            )
        broker = self.topic.broker
        if destination is not None:
            if destination == self.topic.name:  # would move each message again, round and round
                raise InvalidSettingError(f"queue {destination!r} cannot be redriven to itself")
            # Refuse a destination that does not exist (its topic: ``broker.queue`` would give a
            # topic a channel ``default``, which takes every message of it again).
            broker.topic(destination, create=False)
        moved = 0
        kept: dict[str, str] = {}  # id -> receipt of each message that cannot move
        redriving = REDRIVING.set(True)  # its receives move nothing on (this queue's own policy)
        try:
            while max_messages is None or moved < max_messages:
                size = 100 if max_messages is None else min(100, max_messages - moved)
                # wait=0: the queue's receive_wait would hold the last, empty receive that long.
                batch = self.receive(size, visibility_timeout=_REDRIVE_VISIBILITY, wait=0)
                if any(m.id in kept for m in batch):
                    # What was kept came back (this redrive outlasted its hiding): all looked at.
                    kept.update((m.id, m.receipt) for m in batch)
                    break
                if not batch:
                    break
                # Back where they came from: to the channel each came from alone (a topic's other
                # channels had it), or to ``destination`` as any message.
                by_target: dict[tuple[str, str | None], list[Any]] = {}
                for message in batch:
                    named = source_queue(message.source)
                    if named is None and destination is None and message.source is not None:
                        log.warning(
                            "%s: message %s is not redriven: its malformed source %.200r names no queue",
                            self.topic.name, message.id, message.source,
                        )
                    target = destination or (named[0] if named is not None else None)
                    channel = None if destination or named is None else named[1]
                    if target is None or target == self.topic.name:
                        kept[message.id] = message.receipt
                    else:
                        by_target.setdefault((target, channel), []).append(message)
                for (target, channel), messages in by_target.items():
                    try:
                        # Never make a queue that was deleted since: its dead letters stay here.
                        # Nor a channel ``default`` of a topic (``broker.queue``): it would take
                        # every message of the topic again. (A queue's own comes from its queue.)
                        if channel == DEFAULT_CHANNEL:
                            sink = broker.queue(target, create=False)
                        else:
                            sink = broker.topic(target, create=False)
                    except QueueNotFoundError:
                        kept.update((m.id, m.receipt) for m in messages)
                        continue
                    addressed = {} if channel is None else {"channel": channel}
                    sink.send_many(
                        [resend(m, dedup_id=_redrive_id(self.topic.name, m), **addressed) for m in messages]
                    )
                    raise_storage_failure(self.delete_many([m.receipt for m in messages]))
                    moved += len(messages)
        finally:
            REDRIVING.reset(redriving)
            if kept:
                self.change_visibility_many([(receipt, 0) for receipt in kept.values()])
        return moved


def _redrive_id(queue_name: str, message: Any) -> str:
    """The deduplication id of dead letter ``message`` of queue ``queue_name`` sent back by a
    redrive: one of its own, so that it is never dropped as a duplicate of the message first sent
    (a queue's content-based dedup, within its window, would take it for one); and the same for
    every redrive of it, so that a redrive killed after it sent the message, before it deleted it
    from the dead-letter queue, leaves a copy that the destination drops when the next redrive
    sends it again. (A function: the other stores' queues take ``redrive`` alone.)"""
    identity = f"{queue_name}/{message.id}/{message.sent_at_ns}"
    return "redrive:" + hashlib.sha256(identity.encode()).hexdigest()[:32]
