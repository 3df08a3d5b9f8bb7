"""Amazon SQS's Query protocol: form-encoded requests (``Action=SendMessage&QueueUrl=...``) and
XML answers, as SDKs from before SQS's JSON protocol speak it (the AWS SDK for Java 1.x, boto3
before 1.34, the AWS CLI before 2.15). Pure functions, no I/O, in the style of the rest of the
SQS layer: ``request_of`` turns a request's parameters into the same action and payload that a
JSON request gives ``SqsProtocol``, and ``answer_xml`` and ``error_xml`` turn its result or its
``SqsError`` into the XML that those SDKs parse.

Lists and maps are flattened with numbered members, from 1, as SQS's 2012-11-05 Query API names
them (``AttributeName.1``, ``Attribute.1.Name`` / ``Attribute.1.Value``,
``MessageAttribute.1.Value.StringValue``, ``SendMessageBatchRequestEntry.1.Id``, ...); their
JSON names are in the tables below, and a request's other parameters keep their names. Numbers
arrive as text and are given to the checks as integers when they are integers (the checks refuse
the rest by name, as for JSON). ``Version`` and the SigV4 parameters of a presigned request are
not part of the payload.

XML 1.0 cannot carry every character a message may hold (one sent through the REST API may
carry any byte): a body's characters outside XML's are delivered as U+FFFD, and its
``MD5OfBody`` is that of the text delivered, so that SDKs that check it accept it (as a body
that is not UTF-8 already is, see ``sqs``). A carriage return is sent as ``&#xD;``, which XML
parsers keep (a bare one they would turn into a line feed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from xml.sax.saxutils import escape

from journalq.server.digests import md5_of_body
from journalq.server.sqs import BAD_CHARACTER, SqsError

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
CONTENT_TYPE = "text/xml"

_BATCH_ENTRIES = {
    "SendMessageBatch": "SendMessageBatchRequestEntry",
    "DeleteMessageBatch": "DeleteMessageBatchRequestEntry",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchRequestEntry",
}
"""The numbered name of a batch request's ``Entries``."""

_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
    "StringListValue": "StringListValues",
    "BinaryListValue": "BinaryListValues",
}
"""Numbered request parameters that are lists: their JSON names."""
_LIST_NAMES = frozenset(_LISTS.values())

_MAPS = {
    "Attribute": ("Attributes", "Name"),
    "Tag": ("Tags", "Key"),
    "MessageAttribute": ("MessageAttributes", "Name"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name"),
}
"""Numbered request parameters that are maps: their JSON names and the name of their keys (the
value is ``.Value``). CreateQueue's tags are ``tags`` in JSON (``_TAGS_AS``)."""

_TAGS_AS = {"CreateQueue": "tags"}

_INTEGERS = frozenset((
    "DelaySeconds", "MaxNumberOfMessages", "VisibilityTimeout", "WaitTimeSeconds", "MaxResults",
    "MaxNumberOfMessagesPerSecond",
))
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_NOT_PAYLOAD = frozenset(("Action", "Version"))
_PRESIGNED = "X-Amz-"  # a presigned request's parameters (X-Amz-Signature, ...): no payload of the action's


def request_of(parameters: Iterable[tuple[str, str]], queue_url: str | None = None) -> tuple[str, dict[str, Any]]:
    """The action and JSON-shaped payload of a Query request's ``parameters`` (name, value: the
    form body's and the query string's, decoded). ``queue_url``: the URL the request was posted
    to, when it names a queue (``/ACCOUNT/QUEUE``), taken as its ``QueueUrl`` when it gives none
    (the Java SDK posts to the queue's URL and leaves the parameter out). ``SqsError`` when no
    action is named or a numbered parameter is malformed."""
    tree: dict[str, Any] = {}
    action = None
    for name, value in parameters:
        if name == "Action":
            action = value
        if name in _NOT_PAYLOAD or name.startswith(_PRESIGNED):
            continue
        node = tree
        *path, last = name.split(".")
        for part in path:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _malformed(name, "a value is given for one of its parents too")
            node = child
        if isinstance(node.get(last), dict):
            raise _malformed(name, "it is also the parent of other parameters")
        node[last] = value
    if not action:
        raise SqsError(
            "MissingAction", "the request names no action: a Query request has an Action parameter, a JSON "
            "request an X-Amz-Target header (AmazonSQS.<Action>)",
        )
    entries = _BATCH_ENTRIES.get(action)
    payload = {}
    for name, value in tree.items():
        if name in (entries, "Entries") and value == "":
            payload["Entries"] = []  # an empty list, as the SDKs send one (refused by the checks)
        elif name == entries:
            payload["Entries"] = [_structure(entry, f"{name}.{n}") for n, entry in _numbered(value, name)]
        elif name == "Tag" and action in _TAGS_AS:
            payload[_TAGS_AS[action]] = _map(value, name)
        else:
            key, converted = _member(name, value, name)
            payload[key] = converted
    if queue_url is not None and "QueueUrl" not in payload:
        payload["QueueUrl"] = queue_url
    return action, payload


def _member(name: str, value: Any, where: str) -> tuple[str, Any]:
    """A parameter of a structure as its JSON member: (name, value)."""
    if value == "" and (name in _LISTS or name in _LIST_NAMES):
        # An empty list: the SDKs send its name with no value (the Java SDK its members' name,
        # botocore the list's), for there is no numbered member to send.
        return _LISTS.get(name, name), []
    if name in _LISTS:
        return _LISTS[name], [_scalar(item, f"{where}.{n}") for n, item in _numbered(value, where)]
    if name in _MAPS:
        return _MAPS[name][0], _map(value, where)
    if isinstance(value, dict):
        return name, _structure(value, where)
    return name, _integer(value) if name in _INTEGERS else value


def _structure(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise _malformed(where, "it takes members (such as its .Id), not a value of its own")
    return dict(_member(name, value, f"{where}.{name}") for name, value in node.items())


def _map(node: Any, where: str) -> dict[str, Any]:
    """``Name.N.Key`` / ``Name.N.Value`` pairs (``Key`` is ``Name`` for most maps)."""
    key_name = _MAPS[where.rpartition(".")[2]][1]
    mapped: dict[str, Any] = {}
    for n, entry in _numbered(node, where):
        if not isinstance(entry, dict) or key_name not in entry:
            raise _malformed(f"{where}.{n}", f"it has no .{key_name}")
        value = entry.get("Value")
        mapped[_scalar(entry[key_name], f"{where}.{n}.{key_name}")] = (
            _structure(value, f"{where}.{n}.Value") if isinstance(value, dict) else value
        )
    return mapped


def _numbered(node: Any, where: str) -> list[tuple[int, Any]]:
    """The members of a numbered parameter, in order of their numbers (from 1)."""
    if not isinstance(node, dict):
        raise _malformed(where, "it takes numbered members (.1, .2, ...), not a value of its own")
    members = []
    for number, value in node.items():
        if not (number.isascii() and number.isdigit()) or number.startswith("0"):  # (not "²", a digit to isdigit)
            raise _malformed(f"{where}.{number}", "its members are numbered from 1")
        members.append((int(number), value))
    return sorted(members, key=lambda member: member[0])


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, dict):
        raise _malformed(where, "it takes a value, not members")
    return value


def _integer(text: str) -> int | str:
    """An integer parameter as JSON gives it; text that is no integer is left for the checks to refuse."""
    return int(text) if _INTEGER.fullmatch(text) else text


def _malformed(name: str, reason: str) -> SqsError:
    return SqsError("InvalidParameterValue", f"The parameter {name} is malformed: {reason}.")


# -- answers --------------------------------------------------------------------------------------

_NO_RESULT = frozenset((
    "AddPermission", "ChangeMessageVisibility", "DeleteMessage", "DeleteQueue", "PurgeQueue",
    "RemovePermission", "SetQueueAttributes", "TagQueue", "UntagQueue",
))
"""Actions whose answer has no ``<ActionResult>``."""

_ITEMS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
    "StringListValues": "StringListValue",
    "BinaryListValues": "BinaryListValue",
}
"""Result members that are lists: the element of each item (flattened: no element around them).
A batch's ``Successful`` items are ``<ActionResultEntry>``."""

_MAP_ELEMENTS = {"Attributes": ("Attribute", "Name"), "MessageAttributes": ("MessageAttribute", "Name"),
                 "Tags": ("Tag", "Key")}
"""Result members that are maps: the element of each entry, and the element of its key."""


def answer_xml(action: str, result: Mapping[str, Any], request_id: str) -> bytes:
    """The XML answer to a Query request, given the result that ``SqsProtocol`` gave it."""
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NAMESPACE}">']
    if action not in _NO_RESULT:
        parts.append(f"<{action}Result>")
        _members(parts, result, f"{action}ResultEntry")
        parts.append(f"</{action}Result>")
    parts.append(f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>")
    return "".join(parts).encode("utf-8")


def error_xml(error: SqsError, request_id: str) -> bytes:
    """SQS's Query error answer: ``<ErrorResponse>`` with its Query code (SDKs read ``Code``)."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse xmlns="{NAMESPACE}"><Error>'
        f"<Type>{'Sender' if error.sender else 'Receiver'}</Type><Code>{_text(error.query_code)}</Code>"
        f"<Message>{_text(error.message)}</Message><Detail/></Error><RequestId>{request_id}</RequestId>"
        "</ErrorResponse>"
    ).encode("utf-8")


def _members(parts: list[str], structure: Mapping[str, Any], successful: str) -> None:
    """The elements of a structure's members into ``parts``; ``successful``: the element of a
    batch's ``Successful`` items."""
    if "Body" in structure and "MD5OfBody" in structure:  # a received message
        structure = _deliverable(structure)
    for name, value in structure.items():
        if value is None:
            continue
        if name in _MAP_ELEMENTS and isinstance(value, Mapping):
            element, key = _MAP_ELEMENTS[name]
            for entry_key, entry_value in value.items():
                parts.append(f"<{element}><{key}>{_text(entry_key)}</{key}><Value>")
                _value(parts, entry_value, successful)
                parts.append(f"</Value></{element}>")
        elif isinstance(value, list):
            element = successful if name == "Successful" else _ITEMS.get(name, name)
            for item in value:
                parts.append(f"<{element}>")
                _value(parts, item, successful)
                parts.append(f"</{element}>")
        else:
            parts.append(f"<{name}>")
            _value(parts, value, successful)
            parts.append(f"</{name}>")


def _value(parts: list[str], value: Any, successful: str) -> None:
    if isinstance(value, Mapping):
        _members(parts, value, successful)
    elif isinstance(value, bool):
        parts.append("true" if value else "false")
    else:
        parts.append(_text(str(value)))


def _deliverable(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """A received message as XML can carry it: the characters of its body that XML 1.0 has not
    as U+FFFD, and then ``MD5OfBody`` the digest of the body that goes out."""
    body = message["Body"]
    delivered = _carried(body)
    if delivered is body:
        return message
    return {**message, "Body": delivered, "MD5OfBody": md5_of_body(delivered)}


_XML_ENTITIES = {"\r": "&#xD;"}


def _carried(text: str) -> str:
    """``text`` as XML 1.0 can carry it: each character it cannot as U+FFFD (``text`` itself when
    there is none)."""
    if text.isascii() and text.isprintable() or BAD_CHARACTER.search(text) is None:
        return text
    return BAD_CHARACTER.sub("\ufffd", text)


def _text(value: str) -> str:
    """Text as XML character data: ``&``, ``<`` and ``>`` escaped, a carriage return as ``&#xD;``
    (which a parser would otherwise read as a line feed), and characters XML 1.0 cannot carry
    (a message attribute's value holds none: SQS's checks refuse them) as U+FFFD."""
    return escape(_carried(value), _XML_ENTITIES)


__all__ = ["CONTENT_TYPE", "NAMESPACE", "answer_xml", "error_xml", "request_of"]
