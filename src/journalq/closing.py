"""The one context-manager protocol of journalq's objects that hold files, locks or watches, and
the limit on how many files a process may hold."""

from __future__ import annotations

import contextlib
import resource
from types import TracebackType
from typing import Self

MAX_OPEN_FILES = 1 << 20
"""The most open files ``raise_open_files_limit`` asks for (the kernel's usual ``fs.nr_open``)."""

FILES_PER_SHARD = 16
"""What a process may hold for one shard of a sharded queue: 5 files for its writer (segment,
index, lock and two directories), ~11 for a consumer's channel of it (the state journal's writer
and the scanners)."""


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


def raise_open_files_limit(wanted: int = MAX_OPEN_FILES) -> None:
    """Raise the soft limit on open files to ``wanted``, or to the hard limit when that is lower
    (as Go's runtime raises it at start; child processes inherit it). Left as it is when it is
    that high already, or cannot be raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        wanted = min(hard, wanted)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # a ceiling lower than the hard limit (fs.nr_open)
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def make_room_for_shards(count: int) -> None:
    """Before a sharded journal or queue of ``count`` shards is opened: raise the soft limit on
    open files to what its shards may take (``FILES_PER_SHARD`` each) beside the usual 1,024.
    Under that usual limit, one consumer draining a queue of 128 shards ran out of descriptors
    (EMFILE) midway."""
    raise_open_files_limit(1024 + FILES_PER_SHARD * count)
