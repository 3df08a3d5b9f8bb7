"""The MD5 digests that Amazon SQS answers with, so that SDKs that check them (the Java and .NET
SDKs do, among others) accept our answers: ``MD5OfMessageBody`` / ``MD5OfBody``,
``MD5OfMessageAttributes`` and ``MD5OfMessageSystemAttributes``.

Pure functions, no I/O. The attribute digest is the MD5 of, for each attribute in order of name
(sorted by the names' code points, which for UTF-8 is also the order of their bytes)::

    uint32 big-endian length of the name,      the name as UTF-8
    uint32 big-endian length of the data type, the data type as UTF-8 (with any custom suffix:
                                               "Number.float", "Binary.gif", ...)
    one transport byte: 1 for String and Number types, 2 for Binary
    uint32 big-endian length of the value,     the value: UTF-8 for String and Number, raw bytes
                                               for Binary

The system-attribute digest (``AWSTraceHeader``) is the same computation over the system
attributes sent.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Mapping

from journalq.queue.envelope import Attribute

_LENGTH = struct.Struct(">I")
STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


def md5_of_body(body: str) -> str:
    """Hex MD5 of the UTF-8 body, as SQS computes ``MD5OfMessageBody``."""
    return md5_of_utf8(body.encode("utf-8"))


try:  # CPython's own MD5: for short input it skips OpenSSL's setup of a digest (0.23 against 0.34 µs for 100 bytes)
    from _md5 import md5 as _builtin_md5  # (called without usedforsecurity, which it ignores: parsing it cost ~0.1 µs)
except ImportError:  # a Python built without it
    _builtin_md5 = functools.partial(hashlib.md5, usedforsecurity=False)

_SHORT = 2048
"""Up to this many bytes CPython's MD5 is the faster; above, OpenSSL's (~10 % from 4 KiB on)."""


def md5_of_utf8(encoded: bytes) -> str:
    """``md5_of_body`` of the body that ``encoded`` is in UTF-8 (for a sender that has it encoded already)."""
    if len(encoded) <= _SHORT:
        return _builtin_md5(encoded).hexdigest()
    return hashlib.md5(encoded, usedforsecurity=False).hexdigest()


def _encoded(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def attributes_digest_input(attributes: Mapping[str, Attribute]) -> bytes:
    """The bytes whose MD5 is ``MD5OfMessageAttributes`` (exposed for tests and debugging)."""
    parts = []
    for name in sorted(attributes):
        attribute = attributes[name]
        parts.append(_encoded(name.encode("utf-8")))
        parts.append(_encoded(attribute.data_type.encode("utf-8")))
        if isinstance(attribute.value, bytes):
            parts.append(bytes((BINARY_TRANSPORT,)))
            parts.append(_encoded(attribute.value))
        else:
            parts.append(bytes((STRING_TRANSPORT,)))
            parts.append(_encoded(attribute.value.encode("utf-8")))
    return b"".join(parts)


def md5_of_message_attributes(attributes: Mapping[str, Attribute]) -> str:
    """Hex ``MD5OfMessageAttributes`` of ``attributes`` (name -> Attribute)."""
    return hashlib.md5(attributes_digest_input(attributes), usedforsecurity=False).hexdigest()


def md5_of_message_system_attributes(attributes: Mapping[str, Attribute]) -> str:
    """Hex ``MD5OfMessageSystemAttributes`` (SQS's only one is ``AWSTraceHeader``, a String)."""
    return md5_of_message_attributes(attributes)


__all__ = [
    "attributes_digest_input",
    "md5_of_body",
    "md5_of_message_attributes",
    "md5_of_message_system_attributes",
    "md5_of_utf8",
]
