"""Waiting for a journal to change, by file-system notification rather than busy polling.

On Linux a follower sleeps in inotify until a file in the segment directory is written, created or
moved in, so it sees an append within a fraction of a millisecond. Where inotify is missing (other
systems, or the per-user watch limit reached), it falls back to polling with a backoff.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from journalq.closing import Closing

try:
    from inotify_simple import INotify, flags
except ImportError:  # not Linux
    INotify = None  # type: ignore[assignment,misc]

_POLL_MIN, _POLL_MAX = 0.001, 0.05
# The longest one wait sleeps; callers with a longer timeout (or none) loop until their own
# deadline. A signal that comes as the wait begins, after Python last looked for one and before
# the system call, interrupts nothing: its handler (Ctrl-C's KeyboardInterrupt) runs only once the
# call returns. An endless wait then ignored Ctrl-C for good (``scan --follow``, 1 time in 10-20
# when the signal came right after an append it printed); now for at most this long.
_MAX_WAIT = 1.0


class DirectoryWatch(Closing):
    """Wakes up when a file in ``directory`` (or in any of ``more``) changes."""

    def __init__(self, directory: str | os.PathLike[str], *more: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._inotify = None
        self._poll_delay = _POLL_MIN
        if INotify is not None:
            try:
                inotify = INotify()
            except OSError:
                return
            try:
                # DELETE too: a follower whose segment is taken back (a failed append) or
                # collected must learn it now, not at the next append or its timeout.
                events = (
                    flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.CLOSE_WRITE
                    | flags.DELETE | flags.DELETE_SELF
                )
                for watched in (self.directory, *more):
                    inotify.add_watch(watched, events)
            except OSError:
                inotify.close()
                return
            self._inotify = inotify

    @property
    def notified(self) -> bool:
        """True when changes are reported by the system; False when this watch polls."""
        return self._inotify is not None

    def wait(self, timeout: float | None) -> bool:
        """Sleep until something changes or ``timeout`` seconds pass; False on timeout.

        A True may be a change that the caller has already seen: it only means "look again". So
        is a wait cut short at ``_MAX_WAIT`` (a second).
        """
        cut = timeout is None or timeout > _MAX_WAIT
        if self._inotify is not None:
            seconds = _MAX_WAIT if cut else timeout
            return bool(self._inotify.read(timeout=max(0, int(seconds * 1000 + 0.999)))) or cut
        delay = self._poll_delay if timeout is None else min(self._poll_delay, timeout)
        time.sleep(delay)
        self._poll_delay = min(self._poll_delay * 2, _POLL_MAX)
        return timeout is None or delay < timeout

    def changed(self) -> None:
        """Tell a polling watch that the caller found news, so it polls quickly again."""
        self._poll_delay = _POLL_MIN

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
