"""The columns of a journal in Spark, and how their Arrow batches are laid out.

    offset        BIGINT NOT NULL       the message's offset (per shard)
    timestamp     TIMESTAMP             UTC, microseconds; NULL for Go's zero time
    timestamp_ns  BIGINT NOT NULL       the stored nanoseconds, exact (the zero time: -2**63)
    type          SMALLINT NOT NULL     0..255
    key           BINARY NOT NULL       empty when the message has no key
    value         BINARY NOT NULL       the raw sej value, always (queue envelopes included)
    shard         STRING NOT NULL       the shard directory name; "" for a plain journal or topic
    attributes    MAP<STRING,STRING>    a queue message's attributes; NULL for other messages
    body          BINARY NOT NULL       a queue message's body: the envelope's body for envelope
                                        messages (type 0xE0), the value itself for all others
"""

from __future__ import annotations

from collections import Counter

from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

COLUMNS = ("offset", "timestamp", "timestamp_ns", "type", "key", "value", "shard", "attributes", "body")

SCHEMA = StructType(
    [
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", TimestampType(), nullable=True),
        StructField("timestamp_ns", LongType(), nullable=False),
        StructField("type", ShortType(), nullable=False),
        StructField("key", BinaryType(), nullable=False),
        StructField("value", BinaryType(), nullable=False),
        StructField("shard", StringType(), nullable=False),
        StructField("attributes", MapType(StringType(), StringType(), valueContainsNull=False), nullable=True),
        StructField("body", BinaryType(), nullable=False),
    ]
)

_BY_NAME = {field.name: field for field in SCHEMA.fields}


def check_read_schema(schema: StructType) -> StructType:
    """A schema given with ``spark.read.schema(...)``: any subset of the columns, in any order, of
    the same types. A column may be declared nullable where it is not, never the reverse."""
    from journalq.errors import Error

    if schema is None or not schema.fields:
        return SCHEMA
    twice = repeated_columns(schema)
    if twice:  # (else a column read twice failed in the read's tasks, with pyarrow's KeyError)
        raise Error(f"column(s) {', '.join(twice)} appear more than once in the schema; name each column once")
    for field in schema.fields:
        ours = _BY_NAME.get(field.name)
        if ours is None:
            raise Error(
                f"journalq has no column {field.name!r}; its columns are {', '.join(COLUMNS)}"
            )
        if not _same_type(field.dataType, ours.dataType):
            raise Error(
                f"column {field.name!r} is {ours.dataType.simpleString()} in journalq, "
                f"not {field.dataType.simpleString()}"
            )
        if ours.nullable and not field.nullable:
            raise Error(f"column {field.name!r} may be NULL; it cannot be declared NOT NULL")
    return schema


def repeated_columns(schema: StructType) -> list[str]:
    """The names that ``schema`` gives more than one column, in name order."""
    return sorted(name for name, count in Counter(schema.fieldNames()).items() if count > 1)


def _same_type(a: DataType, b: DataType) -> bool:
    if isinstance(a, MapType) and isinstance(b, MapType):
        return a.keyType == b.keyType and a.valueType == b.valueType
    return a == b


def arrow_schema(schema: StructType):
    """The Arrow schema Spark expects for ``schema`` (exactly, nullability included)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
