"""Reading the data source's options (all strings, names case-insensitive) into values.

Every bad option raises a ``journalq.Error`` that names the option and says what it takes.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from journalq.errors import Error

EARLIEST = -2  # as Kafka's JSON offsets: -2 is the earliest offset still stored, -1 the latest
LATEST = -1

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?|m|min|minutes?|h|hours?|d|days?)?\s*$", re.I)
# The fraction of an ISO time's seconds: fromisoformat would cut it to microseconds.
_FRACTION = re.compile(r"(?:(?<=\d\d:\d\d:\d\d)|(?<=T\d{6}))[.,](\d+)")  # extended or basic format
_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
          "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


class OptionError(Error, ValueError):
    """An option of the journalq data source that cannot be used."""


# What Spark itself passes along (DataStreamWriter.queryName() is an option too).
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName", "asyncProgressTrackingEnabled",
                 "asyncProgressTrackingCheckpointIntervalMs")


def check_names(options: Mapping[str, str], known: Iterable[str], what: str) -> None:
    """Refuse an option ``what`` does not take: a misspelt name would be ignored, silently."""
    names = {name.lower(): name for name in (*known, *SPARK_OPTIONS)}
    for key in options:
        if key.lower() in names:
            continue
        close = difflib.get_close_matches(key.lower(), list(names), n=1)
        hint = f" (did you mean {names[close[0]]}?)" if close else ""
        taken = ", ".join(name for name in names.values() if name not in SPARK_OPTIONS)
        raise OptionError(f"{what} take no option {key}{hint}; they take {taken}")


def get(options: Mapping[str, str], name: str) -> str | None:
    """The option ``name`` (case-insensitively), or None."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = get(options, name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, not {raw!r}")


def integer(options: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = get(options, name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be at least {minimum}, not {value}")
    return value


def size(options: Mapping[str, str], name: str, default: int) -> int:
    """A number of bytes: ``1048576``, ``64k``, ``32m``, ``1g``."""
    raw = get(options, name)
    if raw is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?)i?b?\s*", str(raw), re.I)
    if not match:
        raise OptionError(f"option {name} must be a size in bytes such as 33554432 or 32m, not {raw!r}")
    value = int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match.group(2).lower()]
    if value <= 0:
        raise OptionError(f"option {name} must be positive")
    return value


def duration(options: Mapping[str, str], name: str, default: float) -> float:
    """Seconds, from ``15m``, ``30s``, ``500ms``, ``2 minutes``, or a bare number of seconds."""
    raw = get(options, name)
    if raw is None:
        return default
    match = _DURATION.match(str(raw))
    if not match:
        raise OptionError(f"option {name} must be a duration such as 30s, 15m or 500ms, not {raw!r}")
    return float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]


def timestamp_ns(options: Mapping[str, str], name: str) -> int | None:
    """A point in time: milliseconds since the Unix epoch (as Kafka's ``startingTimestamp``) or an
    ISO 8601 / RFC 3339 string (UTC when it has no offset). Returns nanoseconds."""
    raw = get(options, name)
    if raw is None or str(raw).strip() == "":
        return None
    text = str(raw).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text) * 1_000_000
    bad = OptionError(
        f"option {name} must be milliseconds since the epoch or an ISO 8601 time (to the "
        f"nanosecond at most), not {raw!r}"
    )
    nanos = 0
    fraction = _FRACTION.search(text)
    if fraction:  # taken apart, so that a journal's nanoseconds are compared exactly
        if len(fraction.group(1)) > 9:
            raise bad
        nanos = int(fraction.group(1).ljust(9, "0"))
        text = text[: fraction.start()] + text[fraction.end() :]
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise bad from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000 + nanos


def offsets(options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str | dict[str, int]:
    """``earliest``, ``latest`` (those of ``allowed``) or JSON per shard: ``{"events.2.000": 10,
    "events.2.001": -2}`` (-2: earliest, -1: latest); a plain journal's one shard is ``""``."""
    raw = get(options, name)
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip()
    if text.lower() in allowed:
        return text.lower()
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise OptionError(
            f"option {name} must be {' or '.join(allowed)} or a JSON object of offsets per shard "
            f'(e.g. {{"events.2.000": 10}}; {{"": 10}} for a plain journal), not {raw!r}'
        )
    out: dict[str, int] = {}
    for shard, value in parsed.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < LATEST - 1:
            raise OptionError(
                f"option {name}: the offset of shard {shard!r} must be an integer >= 0, "
                f"or -2 (earliest) or -1 (latest), not {value!r}"
            )
        if name.lower().startswith("ending") and value == EARLIEST:
            raise OptionError(f"option {name}: -2 (earliest) cannot be an ending offset")
        out[str(shard)] = value
    return out
