"""Advisory file locks, the way sej takes them: ``flock`` on a ``.lck`` file.

Unlike sej, journalq never deletes a lock file: deleting it lets a process that opened the old file
and a process that created a new one both believe they hold the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from journalq.errors import JournalError, LockedError
from journalq.journal.segment import open_journal_file


class FileLock:
    """An exclusive ``flock`` on ``path``, which is created when missing.

    ``acquire(wait=False)`` raises ``LockedError`` when another process holds the lock;
    ``acquire(wait=True)`` blocks until it is free. The lock file stays open between acquisitions,
    so taking the lock again costs one system call.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.held = False

    def _open(self) -> int:
        if self._fd is None:
            # (Refusing by name what is no file: a directory, a named pipe, on which flock fails
            # with a bare EINVAL and a plain open to read waits for ever.)
            self._fd = open_journal_file(self.path, os.O_RDWR | os.O_CREAT, "a lock file")
        return self._fd

    def acquire(self, wait: bool = False) -> None:
        if not self.try_acquire(wait):
            holder = self.read_note()
            raise LockedError(
                "another writer holds the lock" + (f" ({holder})" if holder else ""),
                file=self.path,
            )

    def try_acquire(self, wait: bool = False) -> bool:
        """``acquire``, returning False instead of raising when another process holds the lock
        (``wait=False``): the cheap way for a caller that will wait for it anyway."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            # The file may have been deleted (sej's writer deletes it on close) or replaced: a
            # lock on an unlinked file guards nothing, so take the lock again on the file the
            # path names now. (One fstat: cheaper than comparing with a stat of the path.)
            status = os.fstat(fd)
            if status.st_nlink > 0:
                if status.st_size:
                    # A note is its holder's, and the holder is gone (or we could not hold the
                    # lock): one left by a killed writer would name it to every process refused
                    # later, and once its pid is reused, an exclusive writer that is not there.
                    # (One that cannot be cleared, an append-only file's, is no reason to refuse.)
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, 0)
                self.held = True
                return True
            self._close_fd()

    def release(self) -> None:
        if self._fd is not None and self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.held = False

    def write_note(self, note: str) -> None:
        """Say in the lock file who holds it, for the error that a refused process prints. The
        next process to take the lock clears it (see ``try_acquire``)."""
        fd = self._open()
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)

    def read_note(self) -> str:
        try:
            if self._fd is not None:  # one system call, not three: shared writers read it often
                return os.pread(self._fd, 200, 0).decode("utf-8", "replace").strip()
            with os.fdopen(open_journal_file(self.path, os.O_RDONLY, "a lock file"), "rb") as f:
                return f.read(200).decode("utf-8", "replace").strip()
        except (OSError, JournalError):
            return ""

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.held = False

    def close(self) -> None:
        self.release()
        self._close_fd()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def directory_locked(directory: str | os.PathLike[str], *, shared: bool = False) -> Iterator[None]:
    """A ``flock`` of ``directory`` itself, exclusive or ``shared``, for the block: for changes
    that span several files of it. Opened anew each time: a lock is its open file's, so threads
    of one process exclude each other too (on one descriptor, a thread's shared lock would turn
    another's exclusive one into a shared one). ``FileNotFoundError`` when it is missing."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's is taken for alive). A pid no
    process can have (0 or less: ``kill`` would signal a process group; past a C ``pid_t``) is
    not alive: names read from files (a note, a temporary file's) can hold anything."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:
        return True  # there, but not ours to signal
    return True
