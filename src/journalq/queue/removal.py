"""Removing the directories of deleted queues, topics and shards, and what a crash left of them.

A directory is first renamed to ``ROOT/.deleted-NAME-PID-RANDOM`` (so that the queue disappears
at once even when the removal is slow), then removed. A process that dies between the two leaves
the renamed directory behind; ``remove_leftovers`` (run when a ``Broker`` opens and after each
delete) removes such leftovers once it is safe.

When is it safe? The deleter holds a ``flock`` on ``.deleting.lck`` inside the directory from
before the rename until the directory is gone, and removes that file last. The kernel lets go of
a lock when its process dies, whatever its pid, so a leftover whose lock can be taken has no live
deleter: it is removed; one whose lock is held is being removed right now by its deleter, and is
left to it. (The pid in the name is for people only: pids are reused, and processes in other pid
namespaces share a directory with pids that mean nothing here.) Two removals of one doomed
directory at once would still do no harm (nothing reads a renamed directory, and both ignore what
the other removed first); the lock keeps them from racing all the same.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from journalq.journal.lock import FileLock

__all__ = ["DELETED_PREFIX", "remove_directory", "remove_leftovers"]

DELETED_PREFIX = ".deleted-"
"""The names of directories being removed start with this (``Broker.names`` skips dot names)."""
_LOCK = ".deleting.lck"


def remove_directory(root: Path, directory: str) -> bool:
    """Remove ``root/directory``: under its deletion lock, rename it out of the way, then remove
    it. False when there is nothing to remove: it is missing, or another process is removing it."""
    path = root / directory
    lock = FileLock(path / _LOCK)
    try:
        try:
            if not lock.try_acquire(wait=False):
                return False  # another deleter is at it
        except (FileNotFoundError, NotADirectoryError):
            return False
        # A unique name: a leftover of a dead process that had this pid may still hold the plain one.
        doomed = root / f"{DELETED_PREFIX}{directory}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.replace(path, doomed)
        except FileNotFoundError:
            return False
        _remove(doomed)
        return True
    finally:
        lock.close()


def remove_leftovers(root: Path) -> list[str]:
    """Remove the renamed directories under ``root`` whose deleter died (see the module's
    docstring); returns their names. Failures are left for a later try."""
    removed = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(DELETED_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            lock = FileLock(Path(entry.path) / _LOCK)
            try:
                if not lock.try_acquire(wait=False):
                    continue  # its deleter is alive and removing it
                _remove(Path(entry.path))
            finally:
                lock.close()
        except OSError:
            continue  # gone meanwhile (its deleter finished), or not ours to remove
        if not os.path.lexists(entry.path):
            removed.append(entry.name)
    return removed


def _remove(doomed: Path) -> None:
    """Everything in ``doomed`` but its lock, then the lock, then the directory: as long as the
    lock file is there, whoever removes the directory holds it."""
    try:
        entries = list(os.scandir(doomed))
    except OSError:
        entries = []
    for entry in entries:
        if entry.name == _LOCK:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    for last in (lambda: os.unlink(doomed / _LOCK), lambda: os.rmdir(doomed)):
        try:
            last()
        except OSError:
            pass  # a later remove_leftovers tries again
