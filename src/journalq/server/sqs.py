"""The Amazon SQS JSON 1.0 protocol over a ``Broker``, as request -> response functions.

Sans-I/O: ``SqsProtocol.handle(action, request, base_url)`` takes the action (the part of
``X-Amz-Target: AmazonSQS.<Action>`` after the dot) and the decoded JSON body, and returns the
JSON answer as a dict, or raises ``SqsError`` (an SQS error: the app answers it with
``{"__type": error.type, "message": error.message}``, ``error.status`` and the header
``x-amzn-query-error: error.query_error``). Storage failures (``journalq.errors.StorageError``:
a full disk, an I/O error) propagate: the app answers them 503 with ``Retry-After``. It blocks
(``ReceiveMessage`` long-polls up to 20 seconds): call it from a worker thread. It is thread-safe.
SQS's older Query protocol reaches the same functions: ``sqs_query`` turns its form into the
request a JSON body gives, and the answer into XML.

How SQS maps onto journalq:

* A queue is a journalq queue (a topic and its ``default`` channel); its URL is
  ``{base_url}/{account_id}/{name}`` and any URL whose last path segment is the name reaches it.
  Queues made through the REST API or the CLI are listed and usable too.
* Queue attributes are ``QueueSettings`` where journalq has the setting (VisibilityTimeout,
  DelaySeconds, MessageRetentionPeriod, ReceiveMessageWaitTimeSeconds, RedrivePolicy, FifoQueue,
  ContentBasedDeduplication). What journalq has no setting for (MaximumMessageSize, tags, Policy,
  RedriveAllowPolicy, the KMS/SSE attributes, DeduplicationScope, FifoThroughputLimit, the
  creation time, the message move tasks run, the time of the last PurgeQueue, which SQS takes
  once a minute) is kept in ``sqs.json`` in the queue's directory, so it is shared by every
  process and deleted with the queue. Policy and the KMS/SSE attributes are stored and echoed,
  never enforced; a RedriveAllowPolicy is checked and enforced when a queue names its queue in a
  RedrivePolicy (set before, it does not undo a RedrivePolicy that names it already).
* ``ReceiveRequestAttemptId`` (FIFO queues): a receive retried with the same id within 5 minutes
  gets the same messages and receipts again, hidden anew, while they are all still in flight
  under those receipts (otherwise it receives anew). The attempts are kept in the memory of the
  process that answered: with ``--workers N``, a retry that reaches another worker receives anew.
* Message ids are journalq's (the offset, in decimal) with the queue's token
  (``journalq.server.ids``); FIFO sequence numbers are the offset, zero-padded to 20 digits (a
  sharded queue's: the shard's index in 4 digits, then the offset in 16).
  Receipt handles are journalq's receipts. A topic whose channels are its own (made through the
  library, none named ``default``) is sent to without being given a channel (``sending_to``: its
  ids are then the topic's own, without a token); its receipts are none of SQS's, and PurgeQueue
  purges every channel of it.
* Bodies travel as UTF-8. A body that is not valid UTF-8 (sent through the REST API, which takes
  any bytes) is delivered decoded with ``errors="replace"`` (U+FFFD for each bad byte), and its
  ``MD5OfBody`` is that of the text delivered, so that SDKs that check it accept it.
* ``AWSTraceHeader`` (the one message system attribute) is stored as the message attribute
  ``AWS.TraceHeader``, a name SQS reserves (no SQS client can send it), and is delivered as the
  system attribute, never among ``MessageAttributes``. So is the ``MessageGroupId`` of a message
  sent to a standard queue (SQS's fair queues), as ``AWS.MessageGroupId``: on a standard queue it
  names a tenant and its messages go out in parallel, while a FIFO queue's is journalq's group
  (none of it goes out while some is in flight; a receive takes its messages in order).
  journalq does not reorder for fairness: every tenant's messages go out oldest first. A FIFO
  queue whose DeduplicationScope is messageGroup deduplicates by a hash of the group and the
  deduplication id, and keeps the client's id as
  ``AWS.MessageDeduplicationId`` to deliver it. FifoThroughputLimit is stored and echoed (its
  perMessageGroupId only with DeduplicationScope messageGroup, as SQS takes it).
* ``DeleteMessage`` with the receipt of a delivery that is over (the message was deleted, or
  received again since) succeeds without deleting anything, as on SQS (``ChangeMessageVisibility``
  with one is ``InvalidParameterValue``, as on SQS); a receipt that is not one of the queue's is
  ``ReceiptHandleIsInvalid``.
* ``StartMessageMoveTask`` runs the move at once (``Queue.redrive``) and answers when it is done;
  ``MaxNumberOfMessagesPerSecond`` is accepted and ignored.
* ``ApproximateFirstReceiveTimestamp`` is remembered in memory by the process that made the first
  delivery (journalq does not store it); elsewhere, or after a restart, it is the time of the
  current receive. ``SenderId`` is the account id.
* A dead letter (moved by a RedrivePolicy) keeps its SentTimestamp, ApproximateReceiveCount (going
  on from the receives in its queue) and ApproximateFirstReceiveTimestamp, as on SQS, but has a new
  MessageId: journalq sends it to the dead-letter queue as a new message (whose retention counts
  from the move, where SQS counts a standard queue's from the first send).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from journalq.errors import (
    InvalidMessageError,
    InvalidNameError,
    InvalidSettingError,
    JournalError,
    PartialSendError,
    QueueNotFoundError,
    ReceiptError,
    StaleReceiptError,
    VisibilityLimitError,
    raise_storage_failure,
)
from journalq.journal.lock import directory_locked
from journalq.journal.recovery import replace_file
from journalq.queue import settings as settings_file
from journalq.queue.broker import DEFAULT_CHANNEL, Broker, Queue
from journalq.queue.sharded import ShardedQueue, ShardedTopic
from journalq.queue.topic import Topic
from journalq.queue.channel import ReceivedMessage
from journalq.queue.envelope import NOT_A_NUMBER, Attribute, first_sent_ns, number_problem, whole_number
from journalq.queue.settings import QueueSettings, check_dead_letter_kind, check_name
from journalq.server.digests import (
    md5_of_body,
    md5_of_message_attributes,
    md5_of_message_system_attributes,
    md5_of_utf8,
)
from journalq.server.ids import given_id, given_ids
from journalq.server.polling import poll_slices
from journalq.server.reading import queue_to_read, received_in_turn

# -- errors -----------------------------------------------------------------------------------

_QUERY_ERRORS: dict[str, tuple[str, int]] = {
    # modeled error shape -> (the code of the former Query protocol, HTTP status), as SQS answers
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404),  # (as AWS: the SDKs report "Status Code: 404")
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "InvalidIdFormat": ("InvalidIdFormat", 400),
    "OverLimit": ("OverLimit", 403),
    "RequestThrottled": ("RequestThrottled", 403),
    "InvalidAddress": ("InvalidAddress", 404),
    "InvalidSecurity": ("InvalidSecurity", 403),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
}
_ALIASES = {query: shape for shape, (query, _) in _QUERY_ERRORS.items() if query != shape}


class SqsError(Exception):
    """An error as SQS answers it. ``code`` is the error's shape name (``QueueDoesNotExist``,
    ``QueueNameExists``, ...) or, for SQS's common errors, the code itself
    (``InvalidParameterValue``, ``MissingParameter``, ``InvalidAction``, ...); the Query codes
    (``QueueAlreadyExists``, ``AWS.SimpleQueueService.NonExistentQueue``) are accepted too.
    ``status`` defaults to the one SQS uses for the code (400 for most)."""

    def __init__(self, code: str, message: str, status: int | None = None, sender: bool = True) -> None:
        code = _ALIASES.get(code, code)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        query_code, default_status = _QUERY_ERRORS.get(code, (code, 400))
        self.query_code = query_code
        self.status = default_status if status is None else status
        self.sender = sender

    @property
    def type(self) -> str:
        """The ``__type`` of the JSON answer."""
        return f"com.amazonaws.sqs#{self.code}"

    @property
    def query_error(self) -> str:
        """The ``x-amzn-query-error`` header: the Query code and who is at fault."""
        return f"{self.query_code};{'Sender' if self.sender else 'Receiver'}"

    def entry(self, entry_id: str) -> dict[str, Any]:
        """This error as a ``Failed`` entry of a batch answer."""
        return {"Id": entry_id, "SenderFault": self.sender, "Code": self.query_code, "Message": self.message}


def _invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def _invalid_value(parameter: str, value: Any, reason: str) -> SqsError:
    """SQS's ``InvalidParameterValue`` for a parameter: ``reason`` says what the value must be."""
    return _invalid(f"Value {value} for parameter {parameter} is invalid. Reason: {reason}")


def _missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def _no_queue() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


# -- limits and formats -------------------------------------------------------------------------

MAX_BATCH = 10
SQS_MAX_MESSAGE_SIZE = 1024 * 1024
"""SQS's largest message, and largest batch (1 MiB since August 2025; 256 KiB before)."""
MAX_ATTRIBUTES = 10
MAX_TAGS = 50
MAX_REDRIVE_SOURCES = 10
MAX_VISIBILITY = 12 * 3600
PURGE_SECONDS = 60
"""How long after a PurgeQueue the next one is refused (PurgeQueueInProgress), as on SQS."""
TRACE_ATTRIBUTE = "AWS.TraceHeader"
"""The message attribute that carries ``AWSTraceHeader`` (a name SQS reserves for itself)."""
TENANT_ATTRIBUTE = "AWS.MessageGroupId"
"""The message attribute that carries the ``MessageGroupId`` of a message sent to a standard
queue (SQS's fair queues: a tenant, not an ordered group), delivered as the system attribute."""
DEDUP_ATTRIBUTE = "AWS.MessageDeduplicationId"
"""The message attribute that carries the ``MessageDeduplicationId`` of a message sent to a FIFO
queue whose DeduplicationScope is messageGroup (the queue deduplicates by a hash of the group
and that id), delivered as the system attribute."""
_RESERVED_ATTRIBUTES = frozenset((TRACE_ATTRIBUTE, TENANT_ATTRIBUTE, DEDUP_ATTRIBUTE))

FIFO_SUFFIX = ".fifo"
"""How the names of FIFO queues end, and only theirs."""
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_FIFO_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}\.fifo")
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\..+)?", re.DOTALL)
"""A message attribute's DataType: the base type, then any custom label (SQS's rule for the label
is the message body's: any character ``_check_characters`` allows, "Binary.image/png" too)."""
MAX_DATA_TYPE = 256
_BASE_TYPES = frozenset(("String", "Number", "Binary"))
_GROUP_OR_DEDUP_ID = re.compile(r"[\x21-\x7e]{1,128}")
BAD_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""A character that SQS refuses in a message (and that XML 1.0 cannot carry)."""
_VALID_CHARACTERS = "#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF"

_DYNAMIC_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)
_CHOICES = {
    # the FIFO attributes kept in sqs.json whose values are one of a few words
    "DeduplicationScope": ("queue", "messageGroup"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
_STORED_ATTRIBUTES = (
    "Policy",
    "RedriveAllowPolicy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "FifoThroughputLimit",
)
_QUEUE_ATTRIBUTES = frozenset(
    (
        "VisibilityTimeout",
        "DelaySeconds",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "RedrivePolicy",
        "FifoQueue",
        "ContentBasedDeduplication",
        "DeduplicationScope",
        "MaximumMessageSize",
        "Shards",  # journalq's own (CreateQueue's Shards), which "All" lists too
        *_STORED_ATTRIBUTES,
        *_DYNAMIC_ATTRIBUTES,
    )
)
_SYSTEM_ATTRIBUTES = frozenset(
    (
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageDeduplicationId",
        "MessageGroupId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    )
)


def _check_characters(text: str, what: str, code: str = "InvalidMessageContents") -> None:
    if text.isascii() and text.isprintable():  # two C scans, where the regex costs ~0.4 µs: all allowed
        return
    bad = BAD_CHARACTER.search(text)
    if bad is not None:
        raise SqsError(
            code,
            f"Invalid binary character '#x{ord(bad.group()):X}' was found in {what}, the set of "
            f"allowed characters is {_VALID_CHARACTERS}",
        )


_ALLOWED_ASCII_AS_LETTERS = bytes(0x61 if byte in (0x09, 0x0A, 0x0D) or 0x20 <= byte < 0x80 else 0x30
                                  for byte in range(256))
"""A ``bytes.translate`` table: each ASCII character that SQS allows (tab, LF, CR, 0x20-0x7F) to a
letter, any other byte to a digit."""


def _encoded_body(body: str) -> bytes:
    """A message body in UTF-8, its characters checked as ``_check_characters`` does (the same
    ``SqsError``). An ASCII body is checked in its bytes by two C passes (a translation, then
    ``isalpha``): ``isprintable`` costs ~3x as much, and sends tab, LF, CR and DEL to the regex."""
    if body.isascii():
        encoded = body.encode()
        if encoded.translate(_ALLOWED_ASCII_AS_LETTERS).isalpha():
            return encoded
    _check_characters(body, "the message body")  # first: it refuses the surrogates that encode() would raise on
    return body.encode()


def _integer(
    request: Mapping[str, Any], name: str, low: int, high: int, reason: str | None = None
) -> int | None:
    """The integer parameter ``name`` (None when absent), from ``low`` to ``high``."""
    value = request.get(name)
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,12}", value.strip()):
        number = int(value)
    if number is None or not low <= number <= high:
        raise _invalid_value(name, value, f"{reason or f'Must be between {low} and {high}'}.")
    return number


_NOT_FOR_THIS_QUEUE_TYPE = "The request include parameter that is not valid for this queue type."


def _check_token(parameter: str, value: str | None) -> str | None:
    """A MessageGroupId, MessageDeduplicationId or ReceiveRequestAttemptId (None when absent)."""
    if value is not None and not _GROUP_OR_DEDUP_ID.fullmatch(value):
        raise _invalid_value(parameter, value, "1 to 128 alphanumeric or punctuation characters.")
    return value


def _string(request: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = request.get(name)
    if value is None or (required and value == ""):
        if required:
            raise _missing(name)
        return None
    if not isinstance(value, str):
        raise _invalid(f"Value {value!r} for parameter {name} is invalid. Reason: it must be a string.")
    return value


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise SqsError(
        "InvalidAttributeValue", f"Invalid value for the parameter {name}: {value!r} (true or false)."
    )


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _check_number_value(name: str, value: str) -> None:
    """SQS's Number (``envelope.number_problem``), with SQS's error messages."""
    problem = number_problem(value)
    if problem == NOT_A_NUMBER:
        raise _invalid(f"Can't cast the value of message (user) attribute '{name}' to a number.")
    if problem is not None:
        raise _invalid(
            f"Value of message (user) attribute '{name}' is out of range: numbers have up to 38 digits "
            "of precision, from -10^128 to 10^126."
        )


def _json_object(parameter: str, value: Any, what: str) -> dict[str, Any]:
    """The JSON object of a policy attribute (given as a string of JSON, or as the object)."""
    try:
        policy = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        policy = None
    if not isinstance(policy, dict):
        raise _invalid_value(parameter, value, f"{what} is not a JSON object.")
    return policy


def _check_throughput_limit(attributes: Mapping[str, Any]) -> None:
    """A FIFO queue's FifoThroughputLimit perMessageGroupId needs DeduplicationScope messageGroup
    (each absent is its default, perQueue and queue), as SQS's CreateQueue and SetQueueAttributes say."""
    if (
        attributes.get("FifoThroughputLimit") == "perMessageGroupId"
        and attributes.get("DeduplicationScope", "queue") != "messageGroup"
    ):
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoThroughputLimit: perMessageGroupId is allowed only when "
            "DeduplicationScope is messageGroup.",
        )


def _entries(request: Mapping[str, Any], *, send: bool = False) -> list[dict[str, Any]]:
    """The ``Entries`` of a batch action, with its request-wide rules checked."""
    entries = request.get("Entries")
    if not entries:
        raise SqsError(
            "EmptyBatchRequest",
            "There should be at least one SendMessageBatchRequestEntry in the request."
            if send
            else "There should be at least one entry in the request.",
        )
    if not isinstance(entries, list):
        raise _invalid("Entries must be a list.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id") if isinstance(entry, dict) else None
        if not isinstance(entry_id, str) or not _BATCH_ID.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _delivered_body(raw: bytes) -> tuple[str, str]:
    """A stored body as ReceiveMessage delivers it, and its MD5OfBody: the text (a body that is
    not UTF-8, sent through REST, decoded with U+FFFD for each bad byte) and the MD5 of the text
    delivered. A body that is UTF-8 is that text's encoding already: its MD5 is taken of it, not
    of the text encoded again (a copy of the body, ~20 µs for 256 KiB)."""
    try:
        return raw.decode("utf-8"), md5_of_utf8(raw)
    except UnicodeDecodeError:
        body = raw.decode("utf-8", errors="replace")
        return body, md5_of_body(body)


# -- dead letters: what they keep of the message they were -------------------------------------


def _origin(
    message: ReceivedMessage, own_key: tuple[str, str]
) -> tuple[int, int, tuple[str, str], str | None]:
    """What dead letter ``message`` shows of the message it was, as SQS keeps it across a redrive
    policy's move: its first send time, its receive count going on from the receives there, and
    the key of its first receive there (through SQS); and the name of the queue it came from. A
    field that its ``source`` lacks (a dead letter of an older journalq has no ``sent_at_ns``) or
    that is not one of ours (``source`` is whatever the sender gave) leaves the message's own."""
    source = message.source
    if not isinstance(source, dict):
        return message.sent_at_ns, message.receive_count, own_key, None
    name, first_id = source.get("queue"), source.get("id")
    name = name if isinstance(name, str) else None
    before = source.get("count")
    # (Not bounded by the dead letter's own send time: on ZooKeeper, each sender's clock stamps.)
    sent_at_ns = first_sent_ns(source, message.sent_at_ns)
    if not whole_number(before):
        return sent_at_ns, message.receive_count, own_key, name
    # Its first receive is known only from its queue's SQS receives: the topic's channel default.
    known = isinstance(first_id, str) and source.get("channel") == DEFAULT_CHANNEL
    key = (name, first_id) if name is not None and known else own_key
    return sent_at_ns, before + message.receive_count, key, name


# -- ReceiveRequestAttemptId: the answers of recent FIFO receives, to give again on a retry ------

ATTEMPT_SECONDS = 300
"""How long a FIFO receive's ``ReceiveRequestAttemptId`` can be retried (SQS's 5 minutes)."""


class _ReceiveAttempts:
    """The messages each recent FIFO receive (queue, ``ReceiveRequestAttemptId``) delivered, for
    ``ATTEMPT_SECONDS``, in this process's memory: at most ``limit`` of them, the oldest
    forgotten first. Sans-I/O: the caller gives the time."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._mutex = threading.Lock()
        self._attempts: OrderedDict[tuple[str, str], tuple[float, list[ReceivedMessage]]] = OrderedDict()

    def remember(self, queue: str, attempt: str, messages: list[ReceivedMessage], now: float) -> None:
        with self._mutex:
            self._attempts.pop((queue, attempt), None)
            self._attempts[(queue, attempt)] = (now, list(messages))
            while len(self._attempts) > self.limit:
                self._attempts.popitem(last=False)

    def recall(self, queue: str, attempt: str, now: float) -> list[ReceivedMessage] | None:
        """The messages of the receive ``attempt`` made at most ``ATTEMPT_SECONDS`` ago, or None."""
        with self._mutex:
            while self._attempts:  # in the order they were made: expired ones are at the front
                made, _ = next(iter(self._attempts.values()))
                if now - made <= ATTEMPT_SECONDS:
                    break
                self._attempts.popitem(last=False)
            found = self._attempts.get((queue, attempt))
        return None if found is None else found[1]

    def forget(self, queue: str) -> None:
        """Drop the queue's attempts (it is deleted: a new queue of that name has none)."""
        with self._mutex:
            for key in [k for k in self._attempts if k[0] == queue]:
                del self._attempts[key]


# -- the state SQS has that journalq does not: sqs.json beside the queue -----------------------

SIDECAR = "sqs.json"


@contextlib.contextmanager
def _directory_locked(
    directory: Path, mutex: threading.Lock, missing: Callable[[], Exception] | None = None
) -> Iterator[None]:
    """Held by one thread of this process (``mutex``) and one process (a ``flock`` of
    ``directory``) at a time. ``missing``: the error for a directory that is not there."""
    with mutex, contextlib.ExitStack() as stack:
        try:
            stack.enter_context(directory_locked(directory))
        except FileNotFoundError:
            if missing is None:
                raise
            raise missing() from None
        yield


class _Sidecar:
    """``ROOT/NAME/sqs.json``: a small JSON object per queue, changed under a lock (a ``flock``
    on the queue's directory, and a mutex for this process's threads). ``durable``: a change is
    on stable storage, rename included, when it is answered (as queue.json's, ``Broker.durable``)."""

    def __init__(self, root: Path, durable: bool) -> None:
        self.root = root
        self._root_text = os.fspath(root)  # for read's path: os.path.join of a Path costs ~10,000 instructions
        self.durable = durable
        self._mutex = threading.Lock()
        # Per queue, its file's (inode, mtime, size) and data; (None, {}) when it had none.
        self._cache: dict[str, tuple[tuple[int, int, int] | None, dict[str, Any]]] = {}

    def read(self, name: str) -> dict[str, Any]:
        """The queue's data, read-only (cached while the file stays the same: every change
        replaces the file, so its inode tells)."""
        path = f"{self._root_text}/{name}/{SIDECAR}"  # a str: a Path built per read cost ~2 µs (no separator)
        cached = self._cache.get(name)
        # A queue made through REST or the library has none, and a failing os.stat raises and
        # catches an OSError (~0.9 µs more). Found missing last time: asked with os.access, which
        # answers False instead (the file system still, so one made since is seen).
        if cached is not None and cached[0] is None and not os.access(path, os.F_OK):
            return {}
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            self._remember(name, None, {})
            return {}
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = self._load(name)
        self._remember(name, key, data)
        return data

    def _remember(self, name: str, key: tuple[int, int, int] | None, data: dict[str, Any]) -> None:
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[name] = (key, data)

    def _load(self, name: str) -> dict[str, Any]:
        try:
            data = json.loads((self.root / name / SIDECAR).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {}  # damaged: treat as empty rather than make the queue unusable
        return data if isinstance(data, dict) else {}

    @contextlib.contextmanager
    def change(self, name: str) -> Iterator[dict[str, Any]]:
        """``with sidecar.change(name) as data:`` change ``data``; written when the block ends."""
        directory = self.root / name
        with _directory_locked(directory, self._mutex, missing=_no_queue):
            data = self._load(name)
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                self._write(directory, data)

    def _write(self, directory: Path, data: dict[str, Any]) -> None:
        # Unsynced, a power cut could leave an empty file: no attributes.
        encoded = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
        try:
            replace_file(directory / SIDECAR, encoded, durable=self.durable)
        except FileNotFoundError:
            raise _no_queue() from None  # deleted meanwhile


# -- the protocol -------------------------------------------------------------------------------


def _as_sqs_error(exc: Exception) -> SqsError | None:
    """An error of the layers below as SQS's (``exc`` itself when it is one); None for the others."""
    if isinstance(exc, SqsError):
        return exc
    if isinstance(exc, QueueNotFoundError):
        return _no_queue()
    if isinstance(exc, ReceiptError):
        return SqsError("ReceiptHandleIsInvalid", str(exc))
    if isinstance(exc, JournalError):
        return None  # stored data that cannot be read (a damaged queue.json too): the server's 500
    if isinstance(exc, (InvalidNameError, InvalidSettingError, InvalidMessageError)):
        return _invalid(str(exc))
    return None


class _SqsErrors:
    """``with _sqs_errors:`` errors of the layers below raised in the block raise as SQS's. A
    class, not a ``contextlib.contextmanager``: entering and leaving that generator cost ~1 µs,
    and a send batch goes through three (a receive or a delete through one)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if not isinstance(exc, Exception):
            return False  # none, or not an error (KeyboardInterrupt, a cancellation): as it is
        error = _as_sqs_error(exc)
        if error is None or error is exc:
            return False
        raise error from None


_sqs_errors = _SqsErrors()


class _ReceiveAsked(NamedTuple):
    """What a ReceiveMessage request asks, checked (``of``)."""

    count: int
    hide: int | None  # VisibilityTimeout (None: the queue's)
    wait: int | None  # WaitTimeSeconds (None: the queue's)
    system: set[str]  # the system attributes to answer
    selectors: list[Any]  # MessageAttributeNames
    attempt: str | None  # ReceiveRequestAttemptId (FIFO)

    @classmethod
    def of(cls, request: Mapping[str, Any]) -> _ReceiveAsked:
        count = _integer(request, "MaxNumberOfMessages", 1, 10, "Must be between 1 and 10, if provided")
        hide = _integer(request, "VisibilityTimeout", 0, MAX_VISIBILITY)
        wait = _integer(request, "WaitTimeSeconds", 0, 20, "Must be >= 0 and <= 20, if provided")
        system: set[str] = set()
        for parameter in ("AttributeNames", "MessageSystemAttributeNames"):
            names = request.get(parameter) or []
            if not isinstance(names, list):
                raise _invalid(f"{parameter} must be a list.")
            system.update(n for n in names if isinstance(n, str))
        if "All" in system:
            system = set(_SYSTEM_ATTRIBUTES)
        selectors = request.get("MessageAttributeNames") or []
        if not isinstance(selectors, list):
            raise _invalid("MessageAttributeNames must be a list.")
        attempt = _check_token("ReceiveRequestAttemptId", _string(request, "ReceiveRequestAttemptId"))
        return cls(count or 1, hide, wait, system, selectors, attempt)


@dataclass(slots=True)  # not frozen: a frozen one took 0.25 µs more to make, once a message
class _Outgoing:
    """A message to send, checked: what ``send_many`` takes and what the answer needs."""

    item: dict[str, Any] | bytes
    answer: dict[str, Any]
    size: int


_SEND_OPTIONS = frozenset(
    ("DelaySeconds", "MessageAttributes", "MessageSystemAttributes", "MessageGroupId", "MessageDeduplicationId")
)
"""The parameters of a message to send besides its body (and a batch entry's Id, a request's
QueueUrl): those that ``_checked_outgoing`` reads."""


def _plain_body(entry: Mapping[str, Any], settings: QueueSettings, rules: SendRules) -> bytes | None:
    """The common message, a body alone (none of ``_SEND_OPTIONS``) to a standard queue, within
    the queue's size limit: its body encoded, all that ``_checked_outgoing`` stores of it (or the
    ``SqsError`` it raises for the body's characters), without its walk through the options; None
    for any other message, which ``_checked_outgoing`` then checks."""
    body = entry.get("MessageBody")
    if settings.fifo or not isinstance(body, str) or not body or not _SEND_OPTIONS.isdisjoint(entry):
        return None
    encoded = _encoded_body(body)  # the full path's first check of a non-empty string body
    return encoded if len(encoded) <= rules.limit else None


def _plain_outgoing(entry: Mapping[str, Any], settings: QueueSettings, rules: SendRules) -> _Outgoing | None:
    """``_plain_body``'s message as ``_checked_outgoing`` makes it (a batch entry's); None for any other."""
    encoded = _plain_body(entry, settings, rules)
    if encoded is None:
        return None
    return _Outgoing(encoded, {"MD5OfMessageBody": md5_of_utf8(encoded)}, len(encoded))


def plain_answer(message_id: str, md5: str) -> dict[str, Any]:
    """The answer to a SendMessage of a body alone to a standard queue (``_plain_body``'s): what
    ``SqsProtocol._answer`` makes of its ``_Outgoing``."""
    return {"MessageId": message_id, "MD5OfMessageBody": md5}


@dataclass(frozen=True)
class SendRules:
    """What a queue's SQS attributes (in sqs.json) say about the messages sent to it: their
    largest size, and whether a FIFO queue deduplicates per message group."""

    limit: int
    dedup_per_group: bool


@dataclass(slots=True)  # not frozen, as _Outgoing: made once a request
class _Sending:
    """A SendMessage (``failed`` None, one entry) or SendMessageBatch, checked: the messages to
    store, each with its entry id, and the batch entries refused already."""

    fifo: bool
    entries: list[tuple[str | None, _Outgoing]]
    failed: list[dict[str, Any]] | None


_Checked = bytes | _Sending
"""A send checked, ready to store: a plain SendMessage's body (``_plain_body``), or any other's ``_Sending``."""


_URLS_KEPT = 1024


_Target = Queue | ShardedQueue | Topic | ShardedTopic
"""What a send goes through (``sending_to``)."""


def sending_to(broker: Broker, name: str) -> tuple[_Target, str | None]:
    """What a send to ``name`` goes through, and the token that the ids it answers carry
    (``journalq.server.ids``): the queue and its token; for a topic whose channels are its own
    (made through the library, none named ``default``), or that has none, the topic and None: a
    send gives it no channel (one would take every message again and hold the topic's gc back
    for ever), and its ids are the topic's own, as its channels' consumers see them."""
    found = broker.queue_if_made(name)
    if found is None:
        return broker.topic(name, create=False), None
    return found, found.token


def answered_id(message_id: str, token: str | None) -> str:
    """The id a send answers for ``message_id``, with ``sending_to``'s ``token``."""
    return message_id if token is None else given_id(message_id, token)


def _sequence_number(message_id: str) -> str:
    """A FIFO message's SequenceNumber, 20 digits, of its id: the offset; a sharded queue's id
    "SHARD.OFFSET" (each shard's offsets start at 0) as the shard's 4 digits, then 16 of the offset."""
    shard, _, offset = message_id.rpartition(".")
    return f"{int(shard or 0):04d}{int(offset):016d}"


def _name_in_url(url: str) -> str:
    """The queue a QueueUrl names (its path's last part; the URL may be the path, or the name)."""
    path = urlsplit(url).path if "://" in url else url
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        check_name(name)
    except InvalidNameError:
        raise _no_queue() from None
    return name


class SqsProtocol:
    """Amazon SQS actions over ``broker``. ``max_message_size``: the largest message (body and
    attributes) and the largest batch this endpoint takes, and the highest MaximumMessageSize a
    queue may have (SQS's, 1 MiB, by default; the server gives its ``--max-message-size``)."""

    def __init__(
        self,
        broker: Broker,
        *,
        account_id: str = "000000000000",
        region: str = "us-east-1",
        max_message_size: int = SQS_MAX_MESSAGE_SIZE,
        stopping: Callable[[], bool] = lambda: False,
        waiting: Callable[[str], contextlib.AbstractContextManager[object]] = lambda name: contextlib.nullcontext(),
    ) -> None:
        self.broker = broker
        self.stopping = stopping  # true once the server stops: long polls end (empty) at once
        self.waiting = waiting  # held by a receive of the queue named while it waits (the server's metrics)
        self.account_id = account_id
        self.region = region
        self.max_message_size = max_message_size
        self._sidecar = _Sidecar(broker.root, broker.durable)
        self._default_rules = SendRules(max_message_size, False)  # a queue's without the attributes that change it
        self._first_receive: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._first_receive_lock = threading.Lock()
        self._attempts = _ReceiveAttempts()
        self._create_mutex = threading.Lock()
        # QueueUrl -> the queue it names: clients send the same few URLs again and again, and
        # urlsplit and the name's check cost ~1 µs a request. Cleared when full (any text may come).
        self._names_of_urls: dict[str, str] = {}
        self._actions: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
            "CreateQueue": self.create_queue,
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes,
            "PurgeQueue": self.purge_queue,
            "DeleteQueue": self.delete_queue,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "StartMessageMoveTask": self.start_message_move_task,
            "ListMessageMoveTasks": self.list_message_move_tasks,
            "CancelMessageMoveTask": self.cancel_message_move_task,
            "TagQueue": self.tag_queue,
            "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "AddPermission": self._unsupported,
            "RemovePermission": self._unsupported,
        }

    @property
    def actions(self) -> list[str]:
        return sorted(self._actions)

    def handle(
        self, action: str, request: dict[str, Any], base_url: str, gone: Callable[[], bool] | None = None
    ) -> dict[str, Any]:
        """Run ``action`` with the JSON ``request``; returns the JSON answer or raises ``SqsError``.
        ``gone``: whether the client went away (a long poll then ends, its messages given back)."""
        method = self._actions.get(action)
        if method is None:
            raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
        if not isinstance(request, dict):
            raise SqsError("InvalidParameterValue", "The request body must be a JSON object.")
        with _sqs_errors:
            if gone is not None and action == "ReceiveMessage":
                return self.receive_message(request, base_url.rstrip("/"), gone)
            return method(request, base_url.rstrip("/"))

    SEND_ACTIONS = frozenset(("SendMessage", "SendMessageBatch"))

    def queue_of(self, request: Mapping[str, Any]) -> str:
        """The queue name a request's ``QueueUrl`` names (``SqsError`` when it names none)."""
        return self._name_of_url(request)

    def send_rules(self, name: str) -> SendRules:
        """What ``send_together`` looks up of queue ``name`` once a batch, the queue's existence
        checked (``SqsError`` when it has none): for a caller that looks it up on a thread of its
        own first (``send_together``'s ``rules``)."""
        with _sqs_errors:
            self._existing(name)
            return self._send_rules(name)

    def send_together(
        self,
        name: str,
        requests: Sequence[tuple[str, dict[str, Any]]],
        *,
        partly_stored: Callable[[PartialSendError], Exception] | None = None,
        plain: Callable[[str, str], Any] = plain_answer,
        rules: SendRules | None = None,
    ) -> list[Any]:
        """Several SendMessage and SendMessageBatch requests (action, request) to queue ``name``,
        stored in one write (and so one sync): one answer per request, or the ``SqsError`` that
        refused it. A failure of the store itself (a full disk) raises, for all of them.

        The most common send, a SendMessage of a body alone to a standard queue, is answered
        ``plain(message_id, md5_of_body)``: ``plain_answer``'s dict by default (the server gives
        its whole HTTP answer, that dict's JSON text made without the encoder). Such a send is
        checked and stored as its body alone, with no object of its own on the way (~1 µs a
        message less than a ``_Sending``, its ``_Outgoing`` and answer dicts).

        A sharded queue stores each shard's part on its own, so a failure may leave part of the
        messages stored (``PartialSendError``). With ``partly_stored``, the stored ones are then
        answered as sent, so that clients do not send them again: a SendMessageBatch lists the
        others under ``Failed`` (``ServiceUnavailable``, not the sender's fault), and a
        SendMessage not stored gets the exception that ``partly_stored(error)`` returns (called
        once). Without it, the ``PartialSendError`` raises, for all of them.

        ``rules``: ``send_rules(name)`` as the caller looked it up just before, the queue's
        existence checked with it, rather than here. The server looks it up on its event loop,
        which has the GIL to itself then: each of its two ``stat``s lets the GIL go, and in the
        thread that stores batches, the busy event loop takes it each time and the thread waits
        to get it back (with 64 clients, the server took ~5 % more SQS sends a second)."""
        with _sqs_errors:  # the queue and its limit: looked up once for all of them
            if rules is None:
                rules = self._send_rules(self._existing(name))
            queue, token = sending_to(self.broker, name)
        settings = queue.settings
        checked: list[_Checked | SqsError] = []
        bodies_only = True  # every request a plain SendMessage (the common batch): see _store
        for action, request in requests:
            try:  # not _sqs_errors: even its __exit__ per request costs ~0.15 µs
                body = _plain_body(request, settings, rules) if action == "SendMessage" else None
                if body is not None:
                    checked.append(body)
                    continue
                bodies_only = False
                checked.append(self._check_send(action, request, queue, rules))
            except Exception as exc:
                error = _as_sqs_error(exc)
                if error is None:
                    raise
                bodies_only = False
                checked.append(error)
        sends = cast("list[_Checked]", checked) if bodies_only else [c for c in checked if not isinstance(c, SqsError)]
        with _sqs_errors:
            try:
                answers = self._store(queue, token, sends, plain, bodies_only=bodies_only)
            except (InvalidMessageError, InvalidSettingError):
                # Refused by the queue, not the checks above: find which request it was by
                # storing each alone, so that one bad request does not fail the others.
                answers = [self._store_alone(queue, token, send, plain) for send in sends]
            except PartialSendError as exc:
                if partly_stored is None:
                    raise
                answers = self._answers(token, sends, exc.ids, plain, exc, partly_stored(exc))
        if bodies_only:
            return answers
        stored = iter(answers)
        return [c if isinstance(c, SqsError) else next(stored) for c in checked]

    def _store_alone(
        self, queue: _Target, token: str | None, send: _Checked, plain: Callable[[str, str], Any]
    ) -> Any:
        try:
            with _sqs_errors:
                return self._store(queue, token, [send], plain)[0]
        except SqsError as exc:
            return exc

    # -- names, URLs, ARNs ------------------------------------------------------------------------

    def queue_url(self, base_url: str, name: str) -> str:
        return f"{base_url.rstrip('/')}/{self.account_id}/{name}"

    def queue_arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account_id}:{name}"

    @staticmethod
    def name_of_arn(arn: Any, parameter: str) -> str:
        """The queue name of ``arn:aws:sqs:REGION:ACCOUNT:NAME`` (any region and account)."""
        parts = arn.split(":", 5) if isinstance(arn, str) else []
        if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs" or not parts[5]:
            raise _invalid_value(parameter, arn, "it is not an Amazon SQS queue ARN.")
        return parts[5]

    def _name_of_url(self, request: Mapping[str, Any]) -> str:
        url = request.get("QueueUrl")
        name = self._names_of_urls.get(url) if type(url) is str else None  # a URL met before: checked then
        if name is None:
            url = _string(request, "QueueUrl", required=True)
            assert url is not None
            name = _name_in_url(url)
            if len(self._names_of_urls) >= _URLS_KEPT:
                self._names_of_urls.clear()
            self._names_of_urls[url] = name
        return name

    def _existing(self, name: str) -> str:
        try:
            if self.broker.exists(name):
                return name
        except InvalidNameError:
            pass
        raise _no_queue()

    def _queue(self, name: str) -> Queue:
        self._existing(name)
        return self.broker.queue(name, create=False)

    def _settings(self, name: str) -> QueueSettings:
        """The queue's settings as stored (what another process may have changed too)."""
        settings = settings_file.load(self.broker.root / name)
        if settings is None:
            raise _no_queue()
        return settings

    # -- queue attributes ---------------------------------------------------------------------------

    def _parse_attributes(
        self, attributes: Any, queue: str, *, fifo: bool, creating: bool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Queue ``queue``'s SQS attributes -> (QueueSettings changes, attributes kept in sqs.json)."""
        if attributes is None:
            return {}, {}
        if not isinstance(attributes, dict):
            raise SqsError("InvalidAttributeValue", "Attributes must be a map of attribute names to values.")
        changes: dict[str, Any] = {}
        stored: dict[str, Any] = {}

        def integer(name: str, value: Any, low: int, high: int) -> int:
            text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
            if not re.fullmatch(r"\d{1,12}", text) or not low <= int(text) <= high:
                raise SqsError(
                    "InvalidAttributeValue",
                    f"Invalid value for the parameter {name}: {value!r} (an integer from {low} to {high}).",
                )
            return int(text)

        for name, value in attributes.items():
            if name == "VisibilityTimeout":
                changes["visibility_timeout"] = integer(name, value, 0, MAX_VISIBILITY)
            elif name == "DelaySeconds":
                changes["delay"] = integer(name, value, 0, 900)
            elif name == "MessageRetentionPeriod":
                changes["retention_seconds"] = integer(name, value, 60, 1209600)
            elif name == "ReceiveMessageWaitTimeSeconds":
                changes["receive_wait"] = integer(name, value, 0, 20)
            elif name == "MaximumMessageSize":
                stored[name] = integer(name, value, 1024, self.max_message_size)
            elif name == "RedrivePolicy":
                changes.update(self._parse_redrive_policy(value, queue, fifo))
            elif name == "Shards":  # journalq's own: spread the queue over 2..1024 shards
                if not creating:
                    raise SqsError("InvalidAttributeName", "Shards can only be set when the queue is created.")
                changes["shards"] = integer(name, value, 1, 1024)
            elif name == "FifoQueue":
                if not creating:
                    raise SqsError(
                        "InvalidAttributeName", "FifoQueue can only be set when the queue is created."
                    )
                changes["fifo"] = _boolean(name, value)
            elif (
                name in ("ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
                and not fifo
            ):
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
            elif name == "ContentBasedDeduplication":
                changes["content_based_dedup"] = _boolean(name, value)
            elif name in _CHOICES:
                if value not in _CHOICES[name]:
                    raise SqsError(
                        "InvalidAttributeValue",
                        f"Invalid value for the parameter {name}: {value!r} ({' or '.join(_CHOICES[name])}).",
                    )
                stored[name] = value
            elif name == "RedriveAllowPolicy":
                if value != "":  # "" removes it
                    self._redrive_sources(value)
                stored[name] = value
            elif name == "Policy":
                if not isinstance(value, str):
                    raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
                if value:
                    try:
                        json.loads(value)
                    except ValueError:
                        raise SqsError(
                            "InvalidAttributeValue", f"Invalid value for the parameter {name}: not JSON."
                        ) from None
                stored[name] = value
            elif name == "KmsMasterKeyId":
                if not isinstance(value, str):
                    raise SqsError("InvalidAttributeValue", "Invalid value for the parameter KmsMasterKeyId.")
                stored[name] = value
            elif name == "KmsDataKeyReusePeriodSeconds":
                stored[name] = integer(name, value, 60, 86400)
            elif name == "SqsManagedSseEnabled":
                stored[name] = "true" if _boolean(name, value) else "false"
            else:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        return changes, stored

    def _parse_redrive_policy(self, value: Any, source: str, fifo: bool) -> dict[str, Any]:
        """The RedrivePolicy of queue ``source``: its target must exist, be of the same kind and
        allow ``source`` (its RedriveAllowPolicy), as on SQS."""
        if value in ("", None, {}):
            return {"dead_letter_queue": None, "max_receive_count": None}

        def refused(reason: str) -> SqsError:
            return _invalid_value("RedrivePolicy", value, reason)

        policy = _json_object("RedrivePolicy", value, "Redrive policy")
        for mandatory in ("deadLetterTargetArn", "maxReceiveCount"):
            if mandatory not in policy:
                raise refused(f"Redrive policy does not contain mandatory attribute: {mandatory}.")
        count = policy["maxReceiveCount"]
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise refused(
                f"Invalid value for maxReceiveCount: {policy['maxReceiveCount']}, valid values are from 1 to 1000 "
                "both inclusive."
            )
        target = self.name_of_arn(policy["deadLetterTargetArn"], "RedrivePolicy")
        if target == source:
            # Refused here, in the shape AWS gives every RedrivePolicy it refuses, not left to the
            # queue's settings (check_for_queue), whose error answered InvalidAttributeValue.
            raise refused("Dead-letter target can't be the source queue itself.")
        try:
            target_settings = settings_file.load(self.broker.root / target) if check_name(target) else None
        except InvalidNameError:
            target_settings = None
        if target_settings is None:
            raise refused("Dead letter target does not exist.")
        if target_settings.fifo != fifo:
            raise refused(
                "Dead-letter target owner queue and the dead-letter queue must both be FIFO queues or both be "
                "standard queues."
            )
        allowed = self._sidecar.read(target).get("attributes", {}).get("RedriveAllowPolicy")
        if allowed and not self._allows(allowed, source):
            raise refused(
                f"Queue {self.queue_arn(source)} is not allowed to use {self.queue_arn(target)} as its dead-letter "
                "queue: the target's RedriveAllowPolicy does not permit it."
            )
        return {"dead_letter_queue": target, "max_receive_count": count}

    def _redrive_sources(self, value: Any) -> frozenset[str] | None:
        """The queues (by name) that a RedriveAllowPolicy lets use its queue as dead-letter queue:
        None for all of them (allowAll), none for denyAll. Checked: ``redrivePermission``
        allowAll, denyAll or byQueue, and with byQueue (only), ``sourceQueueArns``: 1 to 10 queue
        ARNs, which name queues by their name, whatever their region and account, as URLs do."""

        def refused(reason: str) -> SqsError:
            return _invalid_value("RedriveAllowPolicy", value, reason)

        if not isinstance(value, str):
            raise refused("Redrive allow policy is not a string of JSON.")
        policy = _json_object("RedriveAllowPolicy", value, "Redrive allow policy")
        unknown = set(policy) - {"redrivePermission", "sourceQueueArns"}
        if unknown:
            raise refused(f"Unknown attribute {sorted(unknown)[0]}: only redrivePermission and sourceQueueArns.")
        permission = policy.get("redrivePermission")
        if permission not in ("allowAll", "denyAll", "byQueue"):
            raise refused(f"Invalid value for redrivePermission: {permission} (allowAll, denyAll or byQueue).")
        sources = policy.get("sourceQueueArns")
        if permission != "byQueue":
            if sources is not None:
                raise refused("sourceQueueArns can be given only when redrivePermission is byQueue.")
            return None if permission == "allowAll" else frozenset()
        if not isinstance(sources, list) or not 1 <= len(sources) <= MAX_REDRIVE_SOURCES:
            raise refused(
                f"With redrivePermission byQueue, sourceQueueArns must list 1 to {MAX_REDRIVE_SOURCES} queue ARNs."
            )
        return frozenset(self.name_of_arn(arn, "RedriveAllowPolicy") for arn in sources)

    def _allows(self, allow_policy: str, source: str) -> bool:
        """Whether a stored RedriveAllowPolicy lets queue ``source`` use its queue as dead-letter
        queue. (A policy stored before policies were checked, and not valid, allows all, as it
        did then.)"""
        try:
            sources = self._redrive_sources(allow_policy)
        except SqsError:
            return True
        return sources is None or source in sources

    def _static_attributes(self, settings: QueueSettings, stored: Mapping[str, Any]) -> dict[str, str]:
        """The attributes that settings and sqs.json give (all but counts, times and the ARN)."""
        out = {
            "VisibilityTimeout": _number_text(settings.visibility_timeout),
            "DelaySeconds": _number_text(settings.delay),
            "ReceiveMessageWaitTimeSeconds": _number_text(settings.receive_wait),
            "MaximumMessageSize": str(stored.get("MaximumMessageSize", self.max_message_size)),
            "SqsManagedSseEnabled": str(stored.get("SqsManagedSseEnabled", "false")),
        }
        if settings.retention_seconds is not None:  # None: kept until consumed, which SQS cannot say
            out["MessageRetentionPeriod"] = _number_text(settings.retention_seconds)
        if settings.dead_letter_queue is not None and settings.max_receive_count is not None:
            out["RedrivePolicy"] = json.dumps(
                {
                    "deadLetterTargetArn": self.queue_arn(settings.dead_letter_queue),
                    "maxReceiveCount": settings.max_receive_count,
                },
                separators=(",", ":"),
            )
        if settings.shards != 1:
            out["Shards"] = str(settings.shards)
        if settings.fifo:
            out["FifoQueue"] = "true"
            out["ContentBasedDeduplication"] = "true" if settings.content_based_dedup else "false"
            out["DeduplicationScope"] = str(stored.get("DeduplicationScope", "queue"))
            out["FifoThroughputLimit"] = str(stored.get("FifoThroughputLimit", "perQueue"))
        for name in ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"):
            if stored.get(name) not in (None, ""):  # "" removed it: the queue has none, as on SQS
                out[name] = str(stored[name])
        return out

    def _times(self, name: str, sidecar: Mapping[str, Any]) -> tuple[int, int]:
        """(created, last modified) in seconds since the epoch."""
        path = self.broker.root / name
        try:
            settings_mtime = (path / settings_file.SETTINGS_FILE).stat().st_mtime
        except FileNotFoundError:
            raise _no_queue() from None
        created = sidecar.get("created")
        if not isinstance(created, (int, float)):
            try:  # made once, with the queue's channel, and never changed
                created = (path / "channels" / "default" / "channel.id").stat().st_mtime
            except FileNotFoundError:
                created = settings_mtime
        modified = max(settings_mtime, float(sidecar.get("modified", 0)))
        return int(created), int(modified)

    # -- actions: queues ------------------------------------------------------------------------------

    def create_queue(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = _string(request, "QueueName", required=True)
        assert name is not None
        attributes = request.get("Attributes") or {}
        if not isinstance(attributes, dict):
            raise SqsError("InvalidAttributeValue", "Attributes must be a map of attribute names to values.")
        fifo = _boolean("FifoQueue", attributes["FifoQueue"]) if "FifoQueue" in attributes else False
        if name.endswith(FIFO_SUFFIX) or fifo:
            if not (fifo and _FIFO_QUEUE_NAME.fullmatch(name)):
                raise _invalid(
                    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, "
                    "must end with .fifo suffix and be 1 to 80 in length."
                )
        elif not _QUEUE_NAME.fullmatch(name):
            raise _invalid(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
            )
        tags = request.get("tags", request.get("Tags")) or {}
        self._check_tags(tags)
        changes, stored = self._parse_attributes(attributes, name, fifo=fifo, creating=True)
        _check_throughput_limit(stored)
        with self._creating():
            current = settings_file.load(self.broker.root / name)
            if current is not None:
                self._check_same(name, current, changes, stored, attributes)
                return {"QueueUrl": self.queue_url(base_url, name)}
            if fifo:  # a queue made elsewhere may name it in its RedrivePolicy: InvalidParameterValue, as any
                with _sqs_errors:
                    for source, settings in self.broker.dead_letter_sources(name):
                        check_dead_letter_kind(source, settings, name, QueueSettings(fifo=True))
            try:
                self.broker.queue(name, create=True, **changes)
            except InvalidSettingError as exc:
                raise SqsError("InvalidAttributeValue", str(exc)) from None
            now = time.time()
            with self._sidecar.change(name) as sidecar:
                sidecar.setdefault("created", now)
                sidecar["modified"] = now
                sidecar.setdefault("attributes", {}).update(stored)
                if tags:
                    sidecar["tags"] = dict(tags)
        return {"QueueUrl": self.queue_url(base_url, name)}

    @contextlib.contextmanager
    def _creating(self) -> Iterator[None]:
        """Held by CreateQueue while it looks for the queue and makes it (a mutex for this
        process's threads, a ``flock`` on the data directory for other processes): two creates
        of one name at once would each find no queue, and the second, making it "again", would
        change the attributes the first had set instead of answering QueueNameExists."""
        with _directory_locked(self.broker.root, self._create_mutex):
            yield

    def _check_same(
        self,
        name: str,
        current: QueueSettings,
        changes: dict[str, Any],
        stored: dict[str, Any],
        given: Mapping[str, Any],
    ) -> None:
        """CreateQueue of an existing queue: fine when the attributes given are the queue's."""
        current_stored = self._sidecar.read(name).get("attributes", {})
        try:
            wanted = current.replace(**changes)
        except InvalidSettingError as exc:
            raise SqsError("InvalidAttributeValue", str(exc)) from None
        before = self._static_attributes(current, current_stored)
        after = self._static_attributes(wanted, {**current_stored, **stored})
        before.setdefault("FifoQueue", "false")
        after.setdefault("FifoQueue", "false")
        before.setdefault("Shards", "1")
        after.setdefault("Shards", "1")
        for attribute in given:
            if before.get(attribute) != after.get(attribute):
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and a different value for attribute {attribute}",
                )

    def get_queue_url(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = _string(request, "QueueName", required=True)
        assert name is not None
        return {"QueueUrl": self.queue_url(base_url, self._existing(name))}

    def list_queues(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        prefix = _string(request, "QueueNamePrefix") or ""
        names = [n for n in self.broker.names() if n.startswith(prefix)]
        return self._page(request, names, "QueueUrls", base_url)

    def _page(
        self, request: Mapping[str, Any], names: list[str], key: str, base_url: str, always: bool = False
    ) -> dict[str, Any]:
        """A page of queue URLs: up to MaxResults (1 to 1000) after NextToken, or the first 1000."""
        limit = _integer(request, "MaxResults", 1, 1000)
        token = _string(request, "NextToken")
        if token:
            try:
                after = json.loads(base64.urlsafe_b64decode(token.encode()))["after"]
                if not isinstance(after, str):  # a token of ours holds a queue name
                    raise TypeError(after)
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise _invalid("Invalid NextToken value.") from None
            names = [n for n in names if n > after]
        answer: dict[str, Any] = {}
        page = names[: limit or 1000]
        if page or always:
            answer[key] = [self.queue_url(base_url, n) for n in page]
        if limit is not None and len(names) > limit:
            answer["NextToken"] = base64.urlsafe_b64encode(json.dumps({"after": page[-1]}).encode()).decode()
        return answer

    def get_queue_attributes(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._name_of_url(request)
        wanted = request.get("AttributeNames") or []
        if not isinstance(wanted, list) or not all(isinstance(a, str) for a in wanted):
            raise _invalid("AttributeNames must be a list of strings.")
        for attribute in wanted:
            if attribute != "All" and attribute not in _QUEUE_ATTRIBUTES:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute}.")
        if not wanted:
            self._existing(name)
            return {}
        every = "All" in wanted
        settings = self._settings(name)
        sidecar = self._sidecar.read(name)
        values = self._static_attributes(settings, sidecar.get("attributes", {}))
        if every or {"CreatedTimestamp", "LastModifiedTimestamp"} & set(wanted):
            created, modified = self._times(name, sidecar)
            values["CreatedTimestamp"] = str(created)
            values["LastModifiedTimestamp"] = str(modified)
        values["QueueArn"] = self.queue_arn(name)
        # A topic whose channels are its own (made through the library) has no SQS consumer to
        # count for: its counts are left out, since a read must not make one (see queue_to_read).
        if every or any(a.startswith("ApproximateNumberOfMessages") for a in wanted):
            found = queue_to_read(self.broker, name)
            if found is not None:
                stats = found.stats()
                values["ApproximateNumberOfMessages"] = str(stats.available)
                values["ApproximateNumberOfMessagesNotVisible"] = str(stats.in_flight)
                values["ApproximateNumberOfMessagesDelayed"] = str(stats.delayed)
        if not every:
            values = {k: v for k, v in values.items() if k in wanted}
        return {"Attributes": values} if values else {}

    def set_queue_attributes(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._name_of_url(request)
        attributes = request.get("Attributes")
        if attributes is None:
            raise _missing("Attributes")
        current = self._settings(name)
        changes, stored = self._parse_attributes(attributes, name, fifo=current.fifo, creating=False)
        if stored:  # before any change is made: the pair as it would be, what is set over what is
            _check_throughput_limit({**self._sidecar.read(name).get("attributes", {}), **stored})
        if changes:
            try:
                self.broker.configure(name, **changes)
            except InvalidSettingError as exc:
                raise SqsError("InvalidAttributeValue", str(exc)) from None
        with self._sidecar.change(name) as sidecar:
            sidecar.setdefault("attributes", {}).update(stored)
            if changes or stored:
                sidecar["modified"] = time.time()
        return {}

    def purge_queue(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        """Finish every message sent so far: the queue's; a topic's whose channels are its own
        (none named ``default``: the name names the topic), every channel's, none made."""
        name = self._existing(self._name_of_url(request))
        found = self.broker.queue_if_made(name)
        if found is None:
            topic = self.broker.topic(name, create=False)
            channels: list[Any] = [topic.channel(channel) for channel in topic.channel_names()]
        else:
            channels = [found]
        # The time of the last purge is in sqs.json, so that every worker refuses the next one;
        # checked and purged under its lock, so that two at once are one purge and one refusal.
        with self._sidecar.change(name) as sidecar:
            now = time.time()
            last = sidecar.get("purged")
            if isinstance(last, (int, float)) and 0 <= now - last < PURGE_SECONDS:
                raise SqsError(
                    "PurgeQueueInProgress",
                    f"Only one PurgeQueue operation on {name} is allowed every {PURGE_SECONDS} seconds.",
                )
            for channel in channels:
                channel.purge()
            sidecar["purged"] = now
        return {}

    def delete_queue(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        self.broker.delete(name)
        with self._first_receive_lock:
            for key in [k for k in self._first_receive if k[0] == name]:
                del self._first_receive[key]
        self._attempts.forget(name)
        return {}

    def list_dead_letter_source_queues(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        return self._page(request, self._sources_of(name), "queueUrls", base_url, always=True)

    def _sources_of(self, name: str) -> list[str]:
        """The queues whose RedrivePolicy names ``name``."""
        return [source for source, _ in self.broker.dead_letter_sources(name)]

    # -- actions: tags ----------------------------------------------------------------------------------

    @staticmethod
    def _check_tags(tags: Any) -> None:
        if not isinstance(tags, dict):
            raise _invalid("Tags must be a map of tag keys to values.")
        for key, value in tags.items():
            if not isinstance(key, str) or not 1 <= len(key) <= 128:
                raise _invalid(f"Tag key {key!r} is invalid: 1 to 128 characters.")
            if not isinstance(value, str) or len(value) > 256:
                raise _invalid(f"Tag value for key {key!r} is invalid: a string of at most 256 characters.")
        if len(tags) > MAX_TAGS:
            raise _invalid(f"Too many tags: a queue has at most {MAX_TAGS}.")

    def tag_queue(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        tags = request.get("Tags")
        if tags is None:
            raise _missing("Tags")
        self._check_tags(tags)
        with self._sidecar.change(name) as sidecar:
            merged = {**sidecar.get("tags", {}), **tags}
            if len(merged) > MAX_TAGS:
                raise _invalid(f"Too many tags added for queue {name}: a queue has at most {MAX_TAGS}.")
            sidecar["tags"] = merged
        return {}

    def untag_queue(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        keys = request.get("TagKeys")
        if keys is None:
            raise _missing("TagKeys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _invalid("TagKeys must be a list of strings.")
        with self._sidecar.change(name) as sidecar:
            tags = sidecar.get("tags", {})
            for key in keys:
                tags.pop(key, None)
            sidecar["tags"] = tags
        return {}

    def list_queue_tags(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        tags = self._sidecar.read(name).get("tags") or {}
        return {"Tags": dict(tags)} if tags else {}

    # -- actions: sending ---------------------------------------------------------------------------------

    def _outgoing(self, entry: Mapping[str, Any], settings: QueueSettings, rules: SendRules) -> _Outgoing:
        """Check one message to send (SendMessage's parameters, or a batch entry)."""
        return _plain_outgoing(entry, settings, rules) or self._checked_outgoing(entry, settings, rules)

    def _checked_outgoing(self, entry: Mapping[str, Any], settings: QueueSettings, rules: SendRules) -> _Outgoing:
        """``_outgoing`` for any message: every parameter checked in turn."""
        body = entry.get("MessageBody")
        if body is None or body == "":
            raise _missing("MessageBody")
        if not isinstance(body, str):
            raise _invalid("MessageBody must be a string.")
        encoded = _encoded_body(body)
        size = len(encoded)

        delay = _integer(entry, "DelaySeconds", 0, 900)
        if settings.fifo:
            if delay:
                raise _invalid_value("DelaySeconds", delay, _NOT_FOR_THIS_QUEUE_TYPE)
            delay = None  # a FIFO queue has no per-message delay: 0 leaves the queue's own

        attributes: dict[str, Attribute] = {}
        raw_attributes = entry.get("MessageAttributes") or {}
        if not isinstance(raw_attributes, dict):
            raise _invalid("MessageAttributes must be a map of attribute names to values.")
        if len(raw_attributes) > MAX_ATTRIBUTES:
            raise _invalid(
                f"Number of message attributes [{len(raw_attributes)}] exceeds the allowed maximum [{MAX_ATTRIBUTES}]."
            )
        for name, value in raw_attributes.items():
            self._check_attribute_name(name)
            attributes[name] = self._attribute(name, value, "message (user) attribute")
            size += (
                len(name.encode())
                + len(attributes[name].data_type.encode())
                + len(
                    attributes[name].value
                    if isinstance(attributes[name].value, bytes)
                    else attributes[name].value.encode()
                )
            )

        system: dict[str, Attribute] = {}
        raw_system = entry.get("MessageSystemAttributes") or {}
        if not isinstance(raw_system, dict):
            raise _invalid("MessageSystemAttributes must be a map of attribute names to values.")
        for name, value in raw_system.items():
            if name != "AWSTraceHeader":
                raise _invalid(f"Message system attribute name '{name}' is invalid.")
            trace = self._attribute(name, value, "message system attribute")
            if trace.data_type != "String":
                raise _invalid("Message system attribute 'AWSTraceHeader' must be of type String.")
            system[name] = trace

        group = _string(entry, "MessageGroupId")
        dedup = _string(entry, "MessageDeduplicationId")
        if settings.fifo:
            if group is None:
                raise _missing("MessageGroupId")
            if dedup is None and not settings.content_based_dedup:
                raise _invalid(
                    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
                    "provided explicitly"
                )
        elif dedup is not None:
            raise _invalid_value("MessageDeduplicationId", dedup, _NOT_FOR_THIS_QUEUE_TYPE)
        for parameter, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
            _check_token(parameter, value)

        if size > rules.limit:
            raise _invalid(
                f"One or more parameters are invalid. Reason: Message must be shorter than {rules.limit} bytes."
            )

        stored = dict(attributes)
        if system:
            stored[TRACE_ATTRIBUTE] = system["AWSTraceHeader"]
        if settings.fifo and rules.dedup_per_group:
            # DeduplicationScope messageGroup: the queue deduplicates by an id made of the group
            # and the message's id (the client's, or the body's hash as the queue would make it),
            # and the client's id travels beside, to be delivered as it was given.
            if dedup is None:
                dedup = hashlib.sha256(encoded).hexdigest()
            stored[DEDUP_ATTRIBUTE] = Attribute("String", dedup)
            dedup = hashlib.sha256(f"{group}\n{dedup}".encode()).hexdigest()
        if group is not None and not settings.fifo:
            # A standard queue's MessageGroupId (SQS's fair queues) names a tenant: its messages
            # still go out in parallel, so it is no journalq group (which delivers one at a time).
            stored[TENANT_ATTRIBUTE] = Attribute("String", group)
            group = None
        item: dict[str, Any] | bytes
        if stored or delay is not None or group is not None or dedup is not None:
            item = {"body": encoded, "attributes": stored or None, "delay": delay}
            if group is not None:
                item["group_id"] = group
            if dedup is not None:
                item["dedup_id"] = dedup
        else:  # the body alone: what send_many stores fastest (a plain message, unless the queue adds to it)
            item = encoded
        answer = {"MD5OfMessageBody": md5_of_utf8(encoded)}
        if attributes:
            answer["MD5OfMessageAttributes"] = md5_of_message_attributes(attributes)
        if system:
            answer["MD5OfMessageSystemAttributes"] = md5_of_message_system_attributes(system)
        return _Outgoing(item, answer, size)

    @staticmethod
    def _check_attribute_name(name: Any) -> None:
        if not isinstance(name, str) or not _ATTRIBUTE_NAME.fullmatch(name):
            raise _invalid(
                f"Message (user) attribute name '{name}' is invalid: up to 256 letters, digits, '_', '-' and '.'."
            )
        if name.startswith(".") or name.endswith(".") or ".." in name:
            raise _invalid(
                f"Message (user) attribute name '{name}' is invalid: no leading, trailing or repeated '.'."
            )
        if name.lower().startswith(("aws.", "amazon.")):
            raise _invalid(
                f"Message (user) attribute name '{name}' is invalid: the prefixes AWS. and Amazon. are reserved."
            )

    @staticmethod
    def _attribute(name: str, value: Any, what: str) -> Attribute:
        if not isinstance(value, dict):
            raise _invalid(f"The {what} '{name}' must be an object with DataType and a value.")
        data_type = value.get("DataType")
        if not data_type:
            raise _invalid(f"The {what} '{name}' must contain a non-empty attribute type.")
        if type(data_type) is not str or data_type not in _BASE_TYPES:  # (the common ones: no label to check)
            if not isinstance(data_type, str) or len(data_type) > MAX_DATA_TYPE or not _DATA_TYPE.fullmatch(data_type):
                raise _invalid(
                    f"The type of {what} '{name}' is invalid: String, Number or Binary, with an optional custom "
                    f"label ('.' and the label), {MAX_DATA_TYPE} characters at most."
                )
            _check_characters(data_type, f"the type of {what} '{name}'", code="InvalidParameterValue")
        if value.get("StringListValues") or value.get("BinaryListValues"):
            raise _invalid(f"The {what} '{name}': StringListValues and BinaryListValues are not supported.")
        base = data_type.split(".", 1)[0]
        if base == "Binary":
            raw = value.get("BinaryValue")
            if isinstance(raw, (bytes, bytearray)):
                data = bytes(raw)
            elif isinstance(raw, str):
                try:
                    data = base64.b64decode(raw, validate=True)
                except (binascii.Error, ValueError):
                    raise _invalid(f"The {what} '{name}' has a BinaryValue that is not base64.") from None
            else:
                data = b""
            if not data:
                raise _invalid(f"The {what} '{name}' must contain a non-empty value of type 'Binary'.")
            return Attribute(data_type, data)
        text = value.get("StringValue")
        if not isinstance(text, str) or text == "":
            raise _invalid(f"The {what} '{name}' must contain a non-empty value of type '{base}'.")
        _check_characters(text, f"the {what} '{name}'", code="InvalidParameterValue")
        if base == "Number":
            _check_number_value(name, text)
        return Attribute(data_type, text)

    def _send_rules(self, name: str) -> SendRules:
        stored = self._sidecar.read(name).get("attributes", {})
        if "MaximumMessageSize" not in stored and "DeduplicationScope" not in stored:
            return self._default_rules  # (most queues: made once, where a frozen dataclass costs ~3 µs to make)
        return SendRules(
            min(int(stored.get("MaximumMessageSize", self.max_message_size)), self.max_message_size),
            stored.get("DeduplicationScope") == "messageGroup",
        )

    def _answer(self, message_id: str, token: str | None, outgoing: _Outgoing, fifo: bool) -> dict[str, Any]:
        """``message_id``: the queue's; ``token``: ``sending_to``'s, which the id answered carries."""
        answer = {"MessageId": answered_id(message_id, token), **outgoing.answer}
        if fifo:
            answer["SequenceNumber"] = _sequence_number(message_id)
        return answer

    def send_message(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        return self._send_one("SendMessage", request)

    def send_message_batch(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        return self._send_one("SendMessageBatch", request)

    def _send_one(self, action: str, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.send_together(self._name_of_url(request), [(action, request)])[0]
        if isinstance(answer, SqsError):
            raise answer
        return answer

    def _check_send(self, action: str, request: dict[str, Any], queue: Queue, rules: SendRules) -> _Sending:
        """A SendMessage or SendMessageBatch request to ``queue`` (whose messages follow
        ``rules``), checked, ready to store. (``send_together`` tried a SendMessage as a plain
        one, ``_plain_body``, already: here it has every parameter checked.)"""
        settings = queue.settings
        if action == "SendMessage":
            outgoing = self._checked_outgoing(request, settings, rules)
            return _Sending(settings.fifo, [(None, outgoing)], None)
        entries = _entries(request, send=True)
        total = sum(
            len(e["MessageBody"].encode("utf-8", "surrogatepass"))
            for e in entries
            if isinstance(e.get("MessageBody"), str)
        )
        if total > self.max_message_size:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {self.max_message_size} bytes. You have sent {total} bytes.",
            )
        checked: list[tuple[str, _Outgoing]] = []
        failed: list[dict[str, Any]] = []
        for entry in entries:
            try:
                checked.append((entry["Id"], self._outgoing(entry, settings, rules)))
            except SqsError as exc:
                failed.append(exc.entry(entry["Id"]))
        if sum(o.size for _, o in checked) > self.max_message_size:
            raise SqsError(
                "BatchRequestTooLong", f"Batch requests cannot be longer than {self.max_message_size} bytes."
            )
        return _Sending(settings.fifo, checked, failed)

    def _store(
        self, queue: _Target, token: str | None, sends: Sequence[_Checked], plain: Callable[[str, str], Any], *,
        bodies_only: bool = False,
    ) -> list[Any]:
        """Store the messages of checked sends to ``queue`` (of ``token``) in one write; their
        answers. ``bodies_only``: every send is a plain SendMessage's body (``_answers``' answers,
        without its walk: ~0.2 µs a message)."""
        if bodies_only:
            bodies = cast("list[bytes]", sends)
            message_ids = queue.send_many(bodies)
            answered = message_ids if token is None else given_ids(message_ids, token)
            return [plain(message_id, md5_of_utf8(body)) for message_id, body in zip(answered, bodies)]
        items: list[dict[str, Any] | bytes] = []
        for send in sends:
            if isinstance(send, bytes):  # a plain SendMessage: its body
                items.append(send)
            else:
                items += [o.item for _, o in send.entries]
        return self._answers(token, sends, queue.send_many(items) if items else [], plain)

    def _answers(
        self,
        token: str | None,
        sends: Sequence[_Checked],
        message_ids: Sequence[str | None],
        plain: Callable[[str, str], Any],
        failure: Exception | None = None,
        unsent: Exception | None = None,
    ) -> list[Any]:
        """The answers to stored sends, given each message's id in order: None for one that
        ``failure`` kept from being stored (a SendMessage's answer is then ``unsent``)."""
        ids = iter(message_ids)
        answers: list[Any] = []
        for sending in sends:
            if isinstance(sending, bytes):  # a plain SendMessage: its body
                message_id = next(ids)
                answers.append(
                    unsent if message_id is None else plain(answered_id(message_id, token), md5_of_utf8(sending))
                )
                continue
            if sending.failed is None:  # SendMessage: one message, its answer alone
                message_id = next(ids)
                answers.append(
                    unsent if message_id is None
                    else self._answer(message_id, token, sending.entries[0][1], sending.fifo)
                )
                continue
            stored, failed = [], list(sending.failed)
            for entry_id, outgoing in sending.entries:
                message_id = next(ids)
                if message_id is not None:
                    stored.append((entry_id, self._answer(message_id, token, outgoing, sending.fifo)))
                else:
                    failed.append({"Id": entry_id, "SenderFault": False, "Code": "ServiceUnavailable",
                                   "Message": f"not stored: {failure}"})
            answers.append({"Successful": [{"Id": entry_id, **answer} for entry_id, answer in stored],
                            "Failed": failed})
        return answers

    # -- actions: receiving ------------------------------------------------------------------------------

    def receive_message(
        self, request: dict[str, Any], base_url: str, gone: Callable[[], bool] = lambda: False
    ) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        asked = _ReceiveAsked.of(request)
        # Opened once the request is checked: of a topic whose channels are its own, this makes
        # the SQS queue's channel ``default``, which a refused request must not.
        queue = self.broker.queue(name, create=False)
        fifo, attempt = queue.settings.fifo, asked.attempt
        received = self._again(name, queue, attempt, asked.hide) if fifo and attempt is not None else None
        if received is None:
            # In slices: a poll ends within one once the server begins to stop, or its client
            # goes away (a poll left to take messages for no one would hide them for nothing).
            wait = queue.settings.receive_wait if asked.wait is None else asked.wait
            with self.waiting(name) if wait else contextlib.nullcontext():
                for seconds in poll_slices(wait):
                    received = queue.receive(asked.count, visibility_timeout=asked.hide, wait=seconds)
                    if received or self.stopping() or gone():
                        break
            if received and gone():  # taken in the slice the client went away in: given back
                queue.change_visibility_many([(m.receipt, 0) for m in received])
                return {}
            if fifo and attempt is not None and received:
                self._attempts.remember(name, attempt, received, time.monotonic())
        return self._received(name, queue, asked, received)

    def receive_together(
        self, name: str, requests: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any] | SqsError | None]:
        """The first looks (no wait) of several ReceiveMessage requests to queue ``name``, one
        receive for each visibility timeout asked, the oldest messages to the earliest requests:
        for each, its answer, the ``SqsError`` that refused it, or None for a request to be made
        whole by ``receive_message``: one that got nothing and is to wait (its WaitTimeSeconds, or
        the queue's own), and every one of a FIFO queue's (whose retried receives give the same
        messages again). A queue that is not there refuses them all: raised."""
        with _sqs_errors:
            self._existing(name)
            answers: list[dict[str, Any] | SqsError | None] = [None] * len(requests)
            checked: list[tuple[int, _ReceiveAsked]] = []
            for position, request in enumerate(requests):
                try:
                    checked.append((position, _ReceiveAsked.of(request)))
                except SqsError as exc:
                    answers[position] = exc
            if not checked:
                return answers
            queue = self.broker.queue(name, create=False)  # (as receive_message: once they are checked)
            if queue.settings.fifo:
                return answers
            received = received_in_turn(queue, [(asked.hide, asked.count) for _, asked in checked])
            for (position, asked), mine in zip(checked, received):
                waits = queue.settings.receive_wait if asked.wait is None else asked.wait
                if mine or not waits:
                    answers[position] = self._received(name, queue, asked, mine)
            return answers

    def _received(
        self, name: str, queue: Queue, asked: _ReceiveAsked, received: list[ReceivedMessage]
    ) -> dict[str, Any]:
        """A ReceiveMessage's answer, with the messages it ``received`` (none: ``{}``)."""
        if not received:
            return {}
        now_ms = time.time_ns() // 1_000_000
        fifo, token = queue.settings.fifo, queue.token
        return {"Messages": [
            self._message(name, m, asked.system, asked.selectors, fifo, now_ms, token) for m in received
        ]}

    def _again(self, name: str, queue: Queue, attempt: str, hide: int | None) -> list[ReceivedMessage] | None:
        """A retried FIFO receive (the same ``ReceiveRequestAttemptId`` within 5 minutes): the
        messages and receipts the first try delivered, hidden for the visibility timeout anew,
        as SQS does. None (receive anew) when there was no such try or when one of its messages
        is no longer in flight under its receipt (deleted, or delivered again since)."""
        messages = self._attempts.recall(name, attempt, time.monotonic())
        if not messages:
            return None
        seconds = queue.settings.visibility_timeout if hide is None else hide
        errors = queue.change_visibility_many([(m.receipt, seconds) for m in messages])
        if any(error is not None for error in errors):
            # The first try's deliveries are partly over: those still held stay with their
            # receipts (the first try's caller may yet delete them), and this is a new receive.
            return None
        return messages

    def _first_receive_ms(self, key: tuple[str, str], receive_count: int, now_ms: int) -> int:
        """The first receive of message ``key`` (queue name, message id), remembered in memory."""
        with self._first_receive_lock:
            if receive_count <= 1:
                self._first_receive[key] = now_ms
            first = self._first_receive.setdefault(key, now_ms)
            self._first_receive.move_to_end(key)
            while len(self._first_receive) > 100_000:
                self._first_receive.popitem(last=False)
        return first

    @staticmethod
    def _selected(name: str, selectors: list[Any]) -> bool:
        for selector in selectors:
            if selector in ("All", ".*") or selector == name:
                return True
            if isinstance(selector, str) and selector.endswith(".*") and name.startswith(selector[:-1]):
                return True
        return False

    def _message(
        self,
        queue: str,
        message: ReceivedMessage,
        system: set[str],
        selectors: list[Any],
        fifo: bool,
        now_ms: int,
        token: str,
    ) -> dict[str, Any]:
        """``token``: the queue's (``journalq.server.ids``), which its message ids carry."""
        body, md5 = _delivered_body(message.body)
        out: dict[str, Any] = {
            "MessageId": given_id(message.id, token),
            "ReceiptHandle": message.receipt,
            "MD5OfBody": md5,
            "Body": body,
        }
        trace = message.attributes.get(TRACE_ATTRIBUTE)
        attributes: dict[str, str] = {}
        wanted = system.__contains__
        if wanted("SenderId"):
            attributes["SenderId"] = self.account_id
        sent_at_ns, count, source = message.sent_at_ns, message.receive_count, None
        first_key = (queue, message.id)
        if message.source is not None:  # a dead letter (the one check that a message not one pays)
            sent_at_ns, count, first_key, source = _origin(message, first_key)
        if wanted("SentTimestamp"):
            attributes["SentTimestamp"] = str(sent_at_ns // 1_000_000)
        if wanted("ApproximateReceiveCount"):
            attributes["ApproximateReceiveCount"] = str(count)
        if wanted("ApproximateFirstReceiveTimestamp"):
            first = self._first_receive_ms(first_key, count, now_ms)
            attributes["ApproximateFirstReceiveTimestamp"] = str(first)
        else:
            self._first_receive_ms(first_key, count, now_ms)
        if fifo and wanted("SequenceNumber"):
            attributes["SequenceNumber"] = _sequence_number(message.id)
        scoped = message.attributes.get(DEDUP_ATTRIBUTE)
        dedup = message.dedup_id if scoped is None else scoped.value
        if fifo and wanted("MessageDeduplicationId") and isinstance(dedup, str):
            attributes["MessageDeduplicationId"] = dedup
        tenant = message.attributes.get(TENANT_ATTRIBUTE)
        group = message.group_id if message.group_id is not None or tenant is None else tenant.value
        if wanted("MessageGroupId") and isinstance(group, str):
            attributes["MessageGroupId"] = group
        if wanted("AWSTraceHeader") and trace is not None and isinstance(trace.value, str):
            attributes["AWSTraceHeader"] = trace.value
        if wanted("DeadLetterQueueSourceArn") and source is not None:
            attributes["DeadLetterQueueSourceArn"] = self.queue_arn(source)
        if attributes:
            out["Attributes"] = attributes
        chosen = {
            n: a
            for n, a in message.attributes.items()
            if n not in _RESERVED_ATTRIBUTES and self._selected(n, selectors)
        }
        if chosen:
            out["MD5OfMessageAttributes"] = md5_of_message_attributes(chosen)
            out["MessageAttributes"] = {
                n: (
                    {"DataType": a.data_type, "BinaryValue": base64.b64encode(a.value).decode("ascii")}
                    if isinstance(a.value, bytes)
                    else {"DataType": a.data_type, "StringValue": a.value}
                )
                for n, a in sorted(chosen.items())
            }
        return out

    # -- actions: receipts ---------------------------------------------------------------------------------

    @staticmethod
    def _receipt_error(
        receipt: str, error: ReceiptError, *, deleting: bool, seconds: int | None = None
    ) -> SqsError | None:
        """SQS's answer to a receipt that journalq refused: an error, or None (success) for a
        delete whose delivery is over, as on SQS. ``seconds``: the visibility timeout asked for."""
        if isinstance(error, VisibilityLimitError):
            return _invalid_value(
                "VisibilityTimeout", seconds,
                f"Total VisibilityTimeout for the message is beyond the limit [{MAX_VISIBILITY} seconds]",
            )
        if not isinstance(error, StaleReceiptError):  # malformed, or not one of the queue's
            return SqsError(
                "ReceiptHandleIsInvalid",
                f'The input receipt handle "{receipt}" is not a valid receipt handle.',
            )
        if deleting:
            return None  # a delivery that is over: SQS answers success (the message may come again)
        return _invalid_value(
            "ReceiptHandle", receipt, "Message does not exist or is not available for visibility timeout change."
        )

    def _on_receipts(self, name: str, items: list[Any], *, delete: bool) -> list[ReceiptError | None]:
        """``delete_many(items)`` (or ``change_visibility_many``) of queue ``name``. A topic whose
        channels are its own (none named ``default``) has no receipt of SQS's, and is given no
        channel: every receipt is refused. A change may not hide a message past 12 hours after
        its receive (SQS's limit on its total visibility).

        A sharded queue's shard that failed for the storage, the others' changes stored, fails
        the whole request (503), as an unsharded queue's failure does: made again, those stored
        succeed again (a delete of a delivery that is over is SQS's success; a change is made
        anew)."""
        found = self.broker.queue_if_made(name)
        if found is None:
            refused = ReceiptError(f"queue {name!r} is a topic whose channels are its own: its receipts are theirs")
            return [refused] * len(items)
        outcomes = found.delete_many(items) if delete else found.change_visibility_many(items, within=MAX_VISIBILITY)
        raise_storage_failure(outcomes)
        return outcomes  # type: ignore[return-value]  # (no StorageError left)

    def delete_message(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        (answer,) = self.delete_together(self._name_of_url(request), [request])
        if isinstance(answer, SqsError):
            raise answer
        return answer

    def delete_together(
        self, name: str, requests: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any] | SqsError]:
        """Several DeleteMessage requests to queue ``name`` in one step (one lock, one append and
        one sync): for each, its answer or the ``SqsError`` that refused it (a receipt given twice
        is deleted once, and both are answered success, as two DeleteMessages one after the other
        are). A queue that is not there refuses them all: raised."""
        with _sqs_errors:
            self._existing(name)
            answers: list[dict[str, Any] | SqsError] = []
            receipts: list[tuple[int, str]] = []  # (position, receipt)
            for request in requests:
                try:
                    receipt = _string(request, "ReceiptHandle", required=True)
                except SqsError as exc:
                    answers.append(exc)
                    continue
                assert receipt is not None
                receipts.append((len(answers), receipt))
                answers.append({})
            if receipts:
                errors = self._on_receipts(name, [receipt for _, receipt in receipts], delete=True)
                for (position, receipt), error in zip(receipts, errors):
                    if error is not None and (problem := self._receipt_error(receipt, error, deleting=True)):
                        answers[position] = problem
            return answers

    def delete_message_batch(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        entries = _entries(request)
        failed: list[dict[str, Any]] = []
        todo: list[tuple[str, str]] = []
        for entry in entries:
            receipt = entry.get("ReceiptHandle")
            if not isinstance(receipt, str) or not receipt:
                failed.append(_missing("ReceiptHandle").entry(entry["Id"]))
            else:
                todo.append((entry["Id"], receipt))
        successful = []
        if todo:
            errors = self._on_receipts(name, [receipt for _, receipt in todo], delete=True)
            for (entry_id, receipt), error in zip(todo, errors):
                problem = error and self._receipt_error(receipt, error, deleting=True)
                if problem:
                    failed.append(problem.entry(entry_id))
                else:
                    successful.append({"Id": entry_id})
        return {"Successful": successful, "Failed": failed}

    def change_message_visibility(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        receipt = _string(request, "ReceiptHandle", required=True)
        assert receipt is not None
        if request.get("VisibilityTimeout") is None:
            raise _missing("VisibilityTimeout")
        seconds = _integer(request, "VisibilityTimeout", 0, MAX_VISIBILITY)
        (error,) = self._on_receipts(name, [(receipt, seconds)], delete=False)
        if error is not None and (problem := self._receipt_error(receipt, error, deleting=False, seconds=seconds)):
            raise problem
        return {}

    def change_message_visibility_batch(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        name = self._existing(self._name_of_url(request))
        entries = _entries(request)
        failed: list[dict[str, Any]] = []
        todo: list[tuple[str, str, int]] = []
        for number, entry in enumerate(entries, 1):
            try:
                receipt = _string(entry, "ReceiptHandle", required=True)
                assert receipt is not None
                seconds = _integer(entry, "VisibilityTimeout", 0, MAX_VISIBILITY)
                if seconds is None:  # required, though the SDKs' model says not: SQS refuses the entry
                    raise _missing(f"ChangeMessageVisibilityBatchRequestEntry.{number}.VisibilityTimeout")
                todo.append((entry["Id"], receipt, seconds))
            except SqsError as exc:
                failed.append(exc.entry(entry["Id"]))
        successful = []
        if todo:
            errors = self._on_receipts(name, [(receipt, seconds) for _, receipt, seconds in todo], delete=False)
            for (entry_id, receipt, seconds), error in zip(todo, errors):
                problem = error and self._receipt_error(receipt, error, deleting=False, seconds=seconds)
                if problem:
                    failed.append(problem.entry(entry_id))
                else:
                    successful.append({"Id": entry_id})
        return {"Successful": successful, "Failed": failed}

    # -- actions: message move tasks (dead-letter redrive) -------------------------------------------------

    def _resource(self, arn: Any, parameter: str) -> str:
        name = self.name_of_arn(arn, parameter)
        try:
            if check_name(name) and self.broker.exists(name):
                return name
        except InvalidNameError:
            pass
        raise SqsError(
            "ResourceNotFoundException",
            f"The resource that you specified for the {parameter} parameter doesn't exist.",
        )

    def start_message_move_task(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        source_arn = _string(request, "SourceArn", required=True)
        source = self._resource(source_arn, "SourceArn")
        destination_arn = _string(request, "DestinationArn")
        destination = self._resource(destination_arn, "DestinationArn") if destination_arn else None
        rate = _integer(request, "MaxNumberOfMessagesPerSecond", 1, 500)
        if not self._sources_of(source):
            raise _invalid("Source queue must be configured as a Dead Letter Queue.")
        if self.broker.queue_if_made(source) is None:
            # A move reads through the SQS queue's channel ``default``. Made now, it takes every
            # message of the topic from the first: of a topic that has channels of its own, the
            # dead letters they handled already too, which it would send back. (One with no
            # channel, made by a first move, is read from its first message, as it should be.)
            channels = self.broker.topic(source, create=False).channel_names()
            if channels:
                raise _invalid(
                    f"Source queue {source} is a topic whose channels are its own ({', '.join(channels)}): "
                    "a move through a new channel would send back every dead letter, those they handled too."
                )
        queue = self._queue(source)
        to_move = queue.stats().available
        handle = base64.urlsafe_b64encode(
            json.dumps({"task": str(uuid.uuid4()), "source": source}).encode()
        ).decode()
        task: dict[str, Any] = {
            "TaskHandle": handle,
            "Status": "RUNNING",
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": 0,
            "ApproximateNumberOfMessagesToMove": to_move,
            "StartedTimestamp": time.time_ns() // 1_000_000,
        }
        if destination_arn:
            task["DestinationArn"] = destination_arn
        if rate is not None:
            task["MaxNumberOfMessagesPerSecond"] = rate
        try:
            task["ApproximateNumberOfMessagesMoved"] = queue.redrive(destination)
            task["Status"] = "COMPLETED"
        except Exception as exc:
            task["Status"] = "FAILED"
            task["FailureReason"] = str(exc) or type(exc).__name__
            raise
        finally:
            with contextlib.suppress(SqsError, OSError):
                with self._sidecar.change(source) as sidecar:
                    sidecar["move_tasks"] = [task, *sidecar.get("move_tasks", [])][:10]
        return {"TaskHandle": handle}

    def list_message_move_tasks(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        source = self._resource(_string(request, "SourceArn", required=True), "SourceArn")
        limit = _integer(request, "MaxResults", 1, 10) or 1
        results = []
        for task in self._sidecar.read(source).get("move_tasks", [])[:limit]:
            task = dict(task)
            if task.get("Status") != "RUNNING":
                task.pop("TaskHandle", None)  # as SQS: only running tasks have a handle to cancel
            results.append(task)
        return {"Results": results}

    def cancel_message_move_task(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        handle = _string(request, "TaskHandle", required=True)
        assert handle is not None
        try:
            source = json.loads(base64.urlsafe_b64decode(handle.encode()))["source"]
            check_name(source)
        except (ValueError, KeyError, TypeError, binascii.Error, InvalidNameError):
            raise SqsError("ResourceNotFoundException", "The task handle is not valid.") from None
        tasks = self._sidecar.read(source).get("move_tasks", []) if self.broker.exists(source) else []
        for task in tasks:
            if task.get("TaskHandle") == handle:
                raise SqsError(
                    "UnsupportedOperation",
                    f"The message move task is {task.get('Status', 'COMPLETED')}: only a running task can be "
                    "cancelled (this endpoint runs each task to its end before answering).",
                )
        raise SqsError("ResourceNotFoundException", "The task handle does not name a message move task.")

    def _unsupported(self, request: dict[str, Any], base_url: str) -> dict[str, Any]:
        raise SqsError(
            "UnsupportedOperation",
            "Permissions are not supported by this endpoint: use a queue Policy elsewhere.",
        )


__all__ = ["DEDUP_ATTRIBUTE", "SendRules", "SqsError", "SqsProtocol", "TENANT_ATTRIBUTE", "TRACE_ATTRIBUTE"]
