"""Audit of the import pipeline on a real local Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from journalq.journal import Scanner  # noqa: E402
from journalq.spark import pipelines  # noqa: E402
from journalq.spark.testing import local_session  # noqa: E402

pytestmark = pytest.mark.usefixtures("vectors_untouched")


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_import_takes_file_names_literally_not_as_globs(tmp_path: Path, fmt: str) -> None:
    # Spark expanded "x[1].jsonl" as a Hadoop glob, which matches x1.jsonl: that file was
    # imported twice and x[1].jsonl never.
    spark = local_session()
    inputs = tmp_path / "in"
    inputs.mkdir()
    if fmt == "jsonl":
        (inputs / "x[1].jsonl").write_text('{"n": "bracket"}\n')
        (inputs / "x1.jsonl").write_text('{"n": "plain"}\n')
    else:
        (inputs / "x[1].csv").write_text("n\nbracket\n")
        (inputs / "x1.csv").write_text("n\nplain\n")
    result = pipelines.import_files(spark, [str(inputs)], fmt, journal=str(tmp_path / "j"))
    with Scanner(tmp_path / "j") as scanner:
        values = sorted(m.value for m in scanner)
    assert (result.files, result.messages) == (2, 2)
    bracket, plain = (b'{"n":"bracket"}', b'{"n":"plain"}') if fmt == "csv" else (
        b'{"n": "bracket"}', b'{"n": "plain"}')
    assert values == [bracket, plain]
