"""Filters Spark pushes down, as plain conditions the reader applies to columns.

A condition is ``(column, op, value)`` with column one of ``offset``, ``timestamp_ns``, ``type``,
``shard`` (values as Python ints and strings) or ``timestamp`` (microseconds since the epoch),
op one of ``= < <= > >= in isnull isnotnull``, possibly negated: ``("not", condition)``. A list
of conditions means their AND. From them the reader takes:

* an offset range per shard, so that it seeks (through the sparse index) instead of reading;
* the shards that can match at all, so that the others are not read;
* a row mask for what is left (types, timestamps, scattered offsets).

SQL's NULL logic is kept: only ``timestamp`` can be NULL (the zero time), and a comparison with
NULL is not true, negated or not. Pure: numpy only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from journalq.errors import ZERO_TIMESTAMP

Condition = tuple  # (column, op, value) or ("not", Condition)

INT_COLUMNS = ("offset", "timestamp_ns", "type")
COLUMNS = (*INT_COLUMNS, "shard", "timestamp")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_OPS = {
    "EqualTo": "=",
    "EqualNullSafe": "=",
    "GreaterThan": ">",
    "GreaterThanOrEqual": ">=",
    "LessThan": "<",
    "LessThanOrEqual": "<=",
    "In": "in",
    "IsNull": "isnull",
    "IsNotNull": "isnotnull",
}


def micros(moment: dt.datetime) -> int:
    """Microseconds since the epoch of a datetime (naive ones are taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _value(column: str, value: Any) -> Any:
    """The filter's literal in the column's terms, or raise ValueError when it is not one."""
    if column == "timestamp":
        if isinstance(value, dt.datetime):
            return micros(value)
        raise ValueError(value)
    if column == "shard":
        if isinstance(value, str):
            return value
        raise ValueError(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(value)
    return value


def translate(spark_filter: Any) -> Condition | None:
    """A pyspark ``Filter`` as a condition, or None when the reader cannot apply it exactly."""
    name = type(spark_filter).__name__
    if name == "Not":
        inner = translate(spark_filter.child)
        if inner is None or inner[0] == "not":
            return None
        if type(spark_filter.child).__name__ == "EqualNullSafe" and inner[0] == "timestamp":
            return None  # NOT (NULL <=> x) is true: a negated "=" would drop the NULL rows
        return ("not", inner)
    op = _OPS.get(name)
    attribute = getattr(spark_filter, "attribute", None)
    if op is None or not attribute or len(attribute) != 1 or attribute[0] not in COLUMNS:
        return None
    column = attribute[0]
    if op in ("isnull", "isnotnull"):
        return (column, op, None)
    value = getattr(spark_filter, "value", None)
    try:
        if op == "in":
            values = tuple(_value(column, v) for v in value)
            if not values:
                return None
            return (column, "in", values)
        if column == "shard" and op != "=":
            return None
        return (column, op, _value(column, value))
    except (ValueError, TypeError):
        return None


# -- what conditions say about offsets and shards -----------------------------------------------


def offset_bounds(conditions: Iterable[Condition]) -> tuple[int, int | None]:
    """The smallest offset range ``[low, high)`` (high None: unbounded) the conditions allow."""
    low, high = 0, None
    for cond in conditions:
        if cond[0] != "offset":
            continue
        _, op, value = cond
        if op == "=":
            low, high = max(low, value), _min(high, value + 1)
        elif op == ">":
            low = max(low, value + 1)
        elif op == ">=":
            low = max(low, value)
        elif op == "<":
            high = _min(high, value)
        elif op == "<=":
            high = _min(high, value + 1)
        elif op == "in":
            low, high = max(low, min(value)), _min(high, max(value) + 1)
    return low, high


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def shard_allowed(conditions: Iterable[Condition], shard: str) -> bool:
    """Whether rows of ``shard`` can satisfy the conditions."""
    for cond in conditions:
        negated = cond[0] == "not"
        column, op, value = cond[1] if negated else cond
        if column != "shard" or op in ("isnull", "isnotnull"):
            if column == "shard" and (op == "isnull") != negated:
                return False  # shard is never NULL
            continue
        hit = shard == value if op == "=" else shard in value
        if hit == negated:
            return False
    return True


def needs_rows(conditions: Sequence[Condition]) -> bool:
    """Whether a row mask is needed beyond offset ranges and shard choice."""
    for cond in conditions:
        column = cond[1][0] if cond[0] == "not" else cond[0]
        op = cond[1][1] if cond[0] == "not" else cond[1]
        if column == "shard":
            continue
        if column == "offset" and cond[0] != "not" and op != "in":
            continue  # done by the range
        return True
    return False


# -- row masks ----------------------------------------------------------------------------------


_INT64 = (-(2**63), 2**63 - 1)


def _compare(values: np.ndarray, op: str, value: Any) -> np.ndarray:
    """``values op value`` for an int64 array, exactly. A literal beyond int64 is decided here:
    clipped to int64's ends, ``= -2**64`` would match them, and numpy before 2 compares it as a
    float (2**63 - 1 >= 2**63)."""
    if op != "in" and not _INT64[0] <= value <= _INT64[1]:
        above = value > 0
        return np.full(len(values), {"=": False, "<": above, "<=": above, ">": not above, ">=": not above}[op])
    if op == "=":
        return values == value
    if op == "<":
        return values < value
    if op == "<=":
        return values <= value
    if op == ">":
        return values > value
    if op == ">=":
        return values >= value
    if op == "in":  # a literal no int64 equals matches nothing (and would not fit the array)
        fitting = [v for v in value if _INT64[0] <= v <= _INT64[1]]
        return np.isin(values, np.array(fitting, dtype=values.dtype))
    raise ValueError(op)


def row_mask(
    conditions: Sequence[Condition], offset: np.ndarray, timestamp_ns: np.ndarray, type_: np.ndarray
) -> np.ndarray | None:
    """The rows that satisfy every condition (shard conditions are for ``shard_allowed``); None
    when all do."""
    mask: np.ndarray | None = None
    ts_valid: np.ndarray | None = None
    ts_us: np.ndarray | None = None
    for cond in conditions:
        negated = cond[0] == "not"
        column, op, value = cond[1] if negated else cond
        if column == "shard":
            continue
        if column == "timestamp":
            if ts_valid is None:
                ts_valid = timestamp_ns != ZERO_TIMESTAMP
                ts_us = np.floor_divide(timestamp_ns, 1000)
            if op == "isnull":
                hit = ~ts_valid if not negated else ts_valid
            elif op == "isnotnull":
                hit = ts_valid if not negated else ~ts_valid
            else:
                assert ts_us is not None
                compared = _compare(ts_us, op, value)
                hit = ts_valid & (~compared if negated else compared)
        else:
            values = {"offset": offset, "timestamp_ns": timestamp_ns, "type": type_}[column]
            if op == "isnull":
                hit = np.full(len(values), negated)
            elif op == "isnotnull":
                hit = np.full(len(values), not negated)
            else:
                if column == "type":
                    values = values.astype(np.int64)
                compared = _compare(values, op, value)
                hit = ~compared if negated else compared
        mask = hit if mask is None else mask & hit
    return mask
