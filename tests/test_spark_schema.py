"""The schemas given to the data source (no Spark session): a column named twice is refused,
naming it, on the read side and the write side; each column named once is taken."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType  # noqa: E402

from journalq.errors import Error  # noqa: E402
from journalq.spark.schema import SCHEMA, check_read_schema  # noqa: E402
from journalq.spark.writing import WriteError, check_schema  # noqa: E402

_TYPES = {"binary": BinaryType(), "string": StringType(), "bigint": LongType()}


def schema_of(ddl: str) -> StructType:
    """``StructType.fromDDL(ddl)`` for these tests' few types, without a Spark session."""
    return StructType([StructField(name, _TYPES[kind]) for name, kind in (c.split() for c in ddl.split(","))])


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        ("value binary, value string", "value"),  # was: "column 'value' is binary in journalq, not string"
        ("value binary, value binary", "value"),  # was: taken, for Spark to fail on later
        ("offset bigint, value binary, key binary, offset bigint, key binary", "key, offset"),
    ],
)
def test_a_read_schema_naming_a_column_twice_is_refused_naming_it(ddl: str, named: str) -> None:
    with pytest.raises(Error) as info:
        check_read_schema(schema_of(ddl))
    assert str(info.value) == (
        f"column(s) {named} appear more than once in the schema; name each column once"
    )


def test_a_read_schema_naming_each_column_once_is_taken() -> None:
    assert check_read_schema(schema_of("value binary, offset bigint")).fieldNames() == ["value", "offset"]
    assert check_read_schema(SCHEMA) == SCHEMA


def test_a_write_schema_naming_a_column_twice_is_still_refused_the_same_way() -> None:
    """(The write side's check, which the read side's shares: columns that are not written may
    come twice, as a join's.)"""
    with pytest.raises(WriteError, match=r"^column\(s\) key appear more than once \(a join's\?\)"):
        check_schema(schema_of("value binary, key binary, key string, shard string, shard string"))
    assert check_schema(schema_of("value binary, shard string, shard string")).columns == ("value",)


def test_a_column_named_twice_is_refused() -> None:
    # A join's two "key" (or "value") columns: the write silently took the first one.
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from journalq.spark.writing import WriteError, check_schema

    schema = StructType([StructField("value", BinaryType()), StructField("key", StringType()),
                         StructField("key", BinaryType())])
    with pytest.raises(WriteError, match="key .*more than once"):
        check_schema(schema)
