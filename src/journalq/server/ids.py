"""The message ids the server gives, on both APIs (``X-Message-Id``, SQS's ``MessageId``): the
queue's own id of the message, a dot and the queue's token (``"5.1a2b3c4d"``; a sharded queue's
``"1.5.1a2b3c4d"``). A queue deleted and made again starts its offsets again at 0: with the
queue's id alone, a ``DELETE /{queue}/messages/0`` that came late (a consumer still holding an id
of the queue before) deleted a message of the new queue. The token is the one its receipts carry
(its channel's, random, made with the queue), so such an id is refused (404), as its receipts are.

A send to a topic whose channels are its own (made through the library, none named ``default``)
answers the topic's own id, untagged: the ``id`` its channels' consumers see (it has no channel
``default`` to take a token of; ``journalq.server.sqs.sending_to``).

A ZooKeeper store's ids are not tagged: they are made of the time and a random part, never again."""

from __future__ import annotations

import re
from collections.abc import Iterable

from journalq.errors import InvalidMessageError, TaskNotFoundError
from journalq.queue import Queue, ShardedQueue
from journalq.queue.broker import DEFAULT_CHANNEL

_TOKEN = re.compile(r"[0-9a-f]{8}")  # what the channel's token is (``journalq.queue.channel``)


def given_id(message_id: str, token: str) -> str:
    """The id the server gives for the queue's ``message_id``, of the queue of ``token``."""
    return f"{message_id}.{token}"


def given_ids(message_ids: Iterable[str], token: str) -> list[str]:
    """``given_id`` of each of a batch's ids: the suffix made once, not a call per message."""
    suffix = f".{token}"
    return [message_id + suffix for message_id in message_ids]


def _untagged(queue: Queue | ShardedQueue, given: str) -> bool:
    """Whether ``given`` is spelled as the queue's own ids are (an offset; a sharded queue's
    ``SHARD.OFFSET``), with no token: what a send to a topic without the channel ``default``
    answers (``journalq.server.sqs.answered_id``)."""
    parts = given.split(".")
    return len(parts) == (2 if isinstance(queue, ShardedQueue) else 1) and all(
        part.isascii() and part.isdigit() for part in parts
    )


def queue_id(queue: Queue | ShardedQueue, given: str, queue_name: str) -> str:
    """The queue's own id of ``given``, an id the server gave: ``InvalidMessageError`` for a text
    with no token (the queue refuses the spelling of another id itself: "007", a sharded queue's
    "1.05"), saying why and what to do when it is one of the queue's ids untagged (given by a send
    before the topic had its channel ``default``: it cannot be told from an id of an earlier topic
    of the name, the hole the token closes), ``TaskNotFoundError`` for an id of an earlier queue
    of the name (deleted since: its message with it)."""
    inner, dot, token = given.rpartition(".")
    if _untagged(queue, given):
        raise InvalidMessageError(
            f"message id {given!r} carries no token of queue {queue_name!r} (the ids the server gives end in a "
            "dot and the queue's token): an id without one is a topic's own, as a send answers it while the "
            f"topic has no channel {DEFAULT_CHANNEL!r} (its channels its own, made through the library), and it "
            "cannot tell this queue's message from one of an earlier queue or topic of this name (deleted "
            f"since), so it is not taken: fetch the message (GET /{queue_name}/messages) and delete it by the "
            "X-Message-Id that the fetch answers"
        )
    if not dot or not inner or not _TOKEN.fullmatch(token):
        raise InvalidMessageError(f"message id {given!r} is not one of this queue's ids")
    if token != queue.token:
        raise TaskNotFoundError(f"no message {given!r} in queue {queue_name!r}: the id is of an earlier queue "
                                "of this name (deleted since, with its messages)")
    return inner

