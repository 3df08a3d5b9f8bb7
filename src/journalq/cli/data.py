"""``--data``: a data directory, or a ZooKeeper store given as ``zk://host:port[,host:port]/path``."""

from __future__ import annotations

from pathlib import Path

import click

from journalq.errors import InvalidSettingError
from journalq.queue.zookeeper import is_zookeeper_url, parse_url


class DataLocation(click.ParamType):
    """A ``Path``, or the ``zk://`` URL as it was given (a Path would fold its ``//``)."""

    name = "data"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if isinstance(value, Path):
            return value
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
