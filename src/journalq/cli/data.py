"""``--data``: a data directory, or a ZooKeeper store given as ``zk://host:port[,host:port]/path``;
and the directory paths of the other commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from journalq.errors import InvalidSettingError
from journalq.queue.zookeeper import is_zookeeper_url, parse_url


def _refuse_empty(
    kind: click.ParamType, value: object, param: click.Parameter | None, ctx: click.Context | None
) -> None:
    """An empty path (``--data "$UNSET"``) would be the current directory: refused instead."""
    if isinstance(value, str) and not value:
        kind.fail("the path is empty (give '.' for the current directory)", param, ctx)


class DirectoryPath(click.Path):
    """``click.Path`` (as a ``Path``) that refuses an empty path."""

    def __init__(self, *, file_okay: bool = True) -> None:
        super().__init__(file_okay=file_okay, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _refuse_empty(self, value, param, ctx)
        return super().convert(value, param, ctx)


class DataLocation(click.ParamType):
    """A ``Path``, or the ``zk://`` URL as it was given (a Path would fold its ``//``)."""

    name = "data"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if isinstance(value, Path):
            return value
        _refuse_empty(self, value, param, ctx)
        text = str(value)
        if is_zookeeper_url(text):
            try:
                parse_url(text)
            except InvalidSettingError as exc:
                self.fail(str(exc), param, ctx)
            return text
        if text.startswith("zk:"):
            self.fail(f"{text!r}: a ZooKeeper store is given as zk://host:port[,host:port]/path", param, ctx)
        return Path(text)


DATA = DataLocation()
