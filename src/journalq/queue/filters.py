"""zkmq's filters: a message says what it needs, a consumer says what it offers (pure).

A message carries filters such as ``{"performance_class": "standard"}``. A consumer receives with
its own filters, each with a method:

- ``absolute``: it takes a message only when its value equals the message's;
- ``at_least``: its value must be at or above the message's in the filter's ordered enum, which
  is declared per filter name (``low < standard < performance < high_performance``).

A message's filter that the consumer does not offer keeps the message from it; a consumer's filter
that the message does not mention does not matter. A consumer that gives no filters at all
(``None``) ignores them and takes every message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from journalq.errors import InvalidMessageError

Method = Literal["absolute", "at_least"]
METHODS: tuple[Method, ...] = ("absolute", "at_least")
ConsumerFilters = Mapping[str, "str | tuple[str, Method]"]


def normalize(
    filters: ConsumerFilters | None, enums: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, Method]] | None:
    """A consumer's filters as {name: (value, method)}, checked; a bare value means ``absolute``."""
    if filters is None:
        return None
    if not isinstance(filters, Mapping):
        raise InvalidMessageError(
            f"consumer filters map names to a value or (value, method), not {type(filters).__name__}"
        )
    out: dict[str, tuple[str, Method]] = {}
    for name, spec in filters.items():
        if not isinstance(name, str):
            raise InvalidMessageError(f"filter names are strings, not {name!r}")
        if isinstance(spec, str):
            value, method = spec, "absolute"
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            value, method = spec
        else:
            raise InvalidMessageError(f"filter {name!r}: give a value or (value, method), not {spec!r}")
        if method not in METHODS:
            raise InvalidMessageError(f"filter {name!r}: method must be absolute or at_least, not {method!r}")
        if not isinstance(value, str):
            raise InvalidMessageError(f"filter {name!r}: value must be a string, not {type(value).__name__}")
        if method == "at_least" and name not in enums:
            raise InvalidMessageError(f"filter {name!r} has no ordered enum declared, so at_least cannot compare")
        if name in enums and value not in enums[name]:  # no message can carry it: a typo
            raise InvalidMessageError(f"filter {name!r}: {value!r} is not one of {list(enums[name])}")
        out[name] = (value, method)
    return out


def check_message_filters(filters: Mapping[str, str] | None, enums: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """A message's filters, checked against the declared enums."""
    if filters is None:
        return {}
    if not isinstance(filters, Mapping):  # "" or [] too: a mistake, not "no filters"
        raise InvalidMessageError(f"message filters map names to values, not {type(filters).__name__}")
    out = {}
    for name, value in filters.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(f"message filters map strings to strings, not {name!r}: {value!r}")
        if name in enums and value not in enums[name]:
            raise InvalidMessageError(f"filter {name!r}: {value!r} is not one of {list(enums[name])}")
        out[name] = value
    return out


def matches(
    message_filters: Mapping[str, str],
    consumer: Mapping[str, tuple[str, Method]] | None,
    enums: Mapping[str, tuple[str, ...]],
) -> bool:
    """Whether a consumer with ``consumer`` filters may take a message with ``message_filters``."""
    if consumer is None:
        return True
    for name, needed in message_filters.items():
        offered = consumer.get(name)
        if offered is None:
            return False
        value, method = offered
        if method == "absolute":
            if value != needed:
                return False
        else:
            order = enums.get(name, ())
            if needed not in order or value not in order or order.index(value) < order.index(needed):
                return False
    return True
