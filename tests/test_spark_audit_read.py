"""The audit of the read side of the ``journalq`` data source: options, planning and reading
without a Spark session (the classes Spark drives are called directly)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Message, Writer  # noqa: E402
from journalq.spark import options as opts  # noqa: E402
from journalq.spark import reading  # noqa: E402
from journalq.spark.source import plan_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")

SECOND = 1_000_000_000


def offsets_read(path: Path, start: int, end: int) -> list[int]:
    return [int(o) for cols in reading.iter_columns(str(path), start, end) for o in cols.offset]


# -- timestamps given as ISO 8601 ---------------------------------------------------------------


def test_iso_timestamps_keep_their_nanoseconds(tmp_path):
    """A journal's timestamps are nanoseconds: an ISO time with 7 to 9 fraction digits must not be
    cut to microseconds (Python's fromisoformat drops the rest), or a read starting at .000000500
    takes in the message stored at .000000100."""
    base = 1_704_067_200 * SECOND  # 2024-01-01T00:00:00Z
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.000000500Z"}, "t") == base + 500
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.123456789+01:00"}, "t") == base - 3600 * SECOND + 123_456_789
    assert opts.timestamp_ns({"t": "2024-01-01 00:00:00.1234567"}, "t") == base + 123_456_700
    assert opts.timestamp_ns({"t": "1969-12-31T23:59:59.999999999Z"}, "t") == -1
    assert opts.timestamp_ns({"t": "2024-01-01T00:00:00.5Z"}, "t") == base + SECOND // 2
    with pytest.raises(opts.OptionError, match="option t must be"):
        opts.timestamp_ns({"t": "2024-01-01T00:00:00.1234567890Z"}, "t")  # past nanoseconds

    path = tmp_path / "j"
    with Writer(path) as w:
        w.append_many([Message(value=b"v%d" % i, timestamp_ns=base + t) for i, t in enumerate((100, 500, 900))])
    ranges = plan_batch({"path": str(path), "startingTimestamp": "2024-01-01T00:00:00.000000500Z",
                         "endingTimestamp": "2024-01-01T00:00:00.000000900Z"})
    assert [(r.start, r.end) for r in ranges] == [(1, 2)]
