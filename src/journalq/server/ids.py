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

from journalq.errors import InvalidMessageError, TaskNotFoundError
from journalq.queue import Queue, ShardedQueue

_TOKEN = re.compile(r"[0-9a-f]{8}")  # what the channel's token is (``journalq.queue.channel``)


def given_id(message_id: str, token: str) -> str:
    """The id the server gives for the queue's ``message_id``, of the queue of ``token``."""
    return f"{message_id}.{token}"


def queue_id(queue: Queue | ShardedQueue, given: str, queue_name: str) -> str:
    """The queue's own id of ``given``, an id the server gave: ``InvalidMessageError`` for a text
    with no token (the queue refuses the spelling of another id itself: "007", a sharded queue's
    "1.05"), ``TaskNotFoundError`` for an id of an earlier queue of the name (deleted since: its
    message with it)."""
    inner, dot, token = given.rpartition(".")
    if not dot or not inner or not _TOKEN.fullmatch(token):
        raise InvalidMessageError(f"message id {given!r} is not one of this queue's ids")
    if token != queue.token:
        raise TaskNotFoundError(f"no message {given!r} in queue {queue_name!r}: the id is of an earlier queue "
                                "of this name (deleted since, with its messages)")
    return inner

