"""The one context-manager protocol of journalq's objects that hold files, locks or watches."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``with obj:`` closes ``obj`` when the block ends, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
