"""Disk space reserved ahead of appends, so that a full disk fails an append before it writes.

A writer whose write runs out of space takes back the whole messages it wrote (appends are all or
nothing), but a reader in another thread or process may have read them meanwhile: messages never
stored, whose offsets the next append reuses. With the blocks allocated first, the full disk is
found before the first byte is written, and there is nothing to take back (the segments that a
batch starts are reserved before it writes too, in spare files: ``segment.spare_path``). Linux's ``fallocate``
with ``FALLOC_FL_KEEP_SIZE`` allocates them without changing the file's size: readers, recovery
and sej's own code see the same file as before, and ``ftruncate`` to that size gives them back.

Where the platform or the file system cannot reserve (not Linux, or ``EOPNOTSUPP``), appends go
unreserved, and a full disk mid-write is met by the take-back alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable

_FALLOC_FL_KEEP_SIZE = 1
# The file system or the platform has no fallocate: not a failure, no reservation.
_CANNOT_RESERVE = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.ENODEV})
RELEASE_SLACK = 64 * 1024
"""Blocks past a file's end that ``release`` leaves alone: fewer than this are not worth a
truncation (a file system's own preallocation, an extent tree's blocks)."""


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        library = ctypes.CDLL(None, use_errno=True)
        # ``fallocate64``: plain ``fallocate`` takes a 32-bit ``off_t`` on 32-bit systems, which
        # the 64-bit arguments below would garble (on 64-bit ones the two are the same).
        function = getattr(library, "fallocate64", None) or library.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_fallocate = _load_fallocate()


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate the blocks of ``length`` bytes from ``offset`` of the open file ``fd``, leaving its
    size as it is. True once they are allocated; False where this platform or file system cannot
    reserve. Raises ``OSError`` when the room is not there (``ENOSPC``, ``EDQUOT``) or the
    device fails."""
    if _fallocate is None:
        return False
    while length > 0 and _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        if code in _CANNOT_RESERVE:
            return False
        if code != errno.EINTR:
            raise OSError(code, os.strerror(code))
    return True


def allocated(stat: os.stat_result) -> int:
    """How many bytes of blocks a file holds: past its size, what was reserved and not yet
    written (a segment is written from its start with no holes, so all of it is data below)."""
    return stat.st_blocks * 512


def release(fd: int) -> None:
    """Give back the blocks reserved past the end of the open file ``fd``. Truncating to the size
    the file has changes nothing a reader sees, but it must be the end: call it only where no
    one appends to the file meanwhile (under the journal's lock). Best effort: a failure keeps
    the blocks, which the file's next release or its deletion gives back."""
    try:
        stat = os.fstat(fd)
        if allocated(stat) - stat.st_size > RELEASE_SLACK:
            os.ftruncate(fd, stat.st_size)
    except OSError:
        pass
