"""The vsqs design, a baseline of the receive benchmark: one file per message in a directory,
moved between states by renames, shared by any number of processes with no daemon.

States, as vsqs names them (each a file name in the queue's directory):

* ``TS.new``: being written (``O_CREAT | O_EXCL``); renamed to ``TS`` once its payload is in;
* ``TS``: ready (no extension); consumers take the oldest, numerically;
* ``TS.EXPIRY``: received, hidden until ``EXPIRY`` (milliseconds since the epoch); deleting the
  message unlinks it, and once ``EXPIRY`` passes a consumer renames it back to ``TS``.

Receiving renames the oldest ready file ``TS`` to ``TS.EXPIRY``; the rename is atomic, so when
several consumers race for one file exactly one wins and the others get ``ENOENT`` and try the
next one: every message goes to one consumer at a time. With ``sync``, every change is made
durable before the call returns: the file and the directory are fsynced (a batch of changes in one
call shares the directory's fsync).

Faithful to vsqs, with two liberties that only make it faster (it is the baseline):

* the directory listing (sorted oldest first) is kept between receives and taken again only when
  it runs out or is a second old, instead of listing the directory for every receive (an
  O(messages) step per receive, which would make the baseline quadratic). Requeuing of expired
  files happens at each listing, as in vsqs. Names another consumer took since the listing just
  fail with ``ENOENT`` and the next is tried, exactly as vsqs handles a race.
* timestamps are nanoseconds rather than milliseconds, so that a fast producer needs no retry
  loop, and the producer skips vsqs's listing for same-timestamp files in other states (a single
  producer with strictly increasing timestamps cannot clash; publishing is not what is timed).
"""

from __future__ import annotations

import os
import time

_READ = 1 << 16
RELIST_AFTER = 1.0  # seconds a listing is used before the directory is listed again


class VsqsQueue:
    def __init__(self, path: str | os.PathLike[str], *, sync: bool, visibility_timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.sync = sync
        self.visibility_ms = int(visibility_timeout * 1000)
        self.dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._ready: list[str] = []  # the listing's ready names, newest first (pop() takes the oldest)
        self._listed_at = float("-inf")
        self._last_ts = 0

    # -- publishing -------------------------------------------------------------------------

    def publish(self, body: bytes) -> str:
        """Write ``TS.new``, then rename it to ``TS``; returns the message id ``TS``."""
        dfd = self.dir_fd
        while True:
            ts = max(time.time_ns(), self._last_ts + 1)
            self._last_ts = ts
            name = str(ts)
            try:
                fd = os.open(name + ".new", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            except FileExistsError:
                continue  # another producer took this timestamp: take the next
            break
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            if self.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(name + ".new", name, src_dir_fd=dfd, dst_dir_fd=dfd)
        if self.sync:
            os.fsync(dfd)
        return name

    # -- receiving --------------------------------------------------------------------------

    def _list(self) -> None:
        """List the directory: requeue expired deliveries, then keep the ready names sorted."""
        while True:
            now_ms = time.time_ns() // 1_000_000
            ready = []
            requeued = False
            for name in os.listdir(self.path):
                base, dot, extension = name.partition(".")
                if not dot:
                    ready.append(name)
                elif extension.isdigit() and int(extension) < now_ms:
                    try:
                        os.rename(name, base, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                        requeued = True
                    except FileNotFoundError:
                        pass  # deleted or requeued by another consumer meanwhile
            if not requeued:
                break
            if self.sync:
                os.fsync(self.dir_fd)
            # vsqs loops back and lists again until nothing has expired
        ready.sort(key=int, reverse=True)
        self._ready = ready
        self._listed_at = time.monotonic()

    def receive(self, max_messages: int = 1) -> list[tuple[str, bytes]]:
        """Take up to ``max_messages``, oldest first: ``(receipt, body)`` each; the receipt is the
        file's new name, ``TS.EXPIRY``."""
        dfd = self.dir_fd
        ready = self._ready
        got: list[tuple[str, bytes]] = []
        listed = False
        while len(got) < max_messages:
            if not ready or time.monotonic() - self._listed_at > RELIST_AFTER:
                if listed and not ready:
                    break  # listed during this call and nothing is left: the queue is empty
                self._list()
                ready = self._ready
                listed = True
                if not ready:
                    break
            name = ready.pop()
            receipt = f"{name}.{time.time_ns() // 1_000_000 + self.visibility_ms}"
            try:
                os.rename(name, receipt, src_dir_fd=dfd, dst_dir_fd=dfd)
            except FileNotFoundError:
                continue  # another consumer took it: try the next
            try:
                fd = os.open(receipt, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                continue  # expired and requeued (or deleted) already
            try:
                body = os.read(fd, _READ)
                if len(body) == _READ:
                    chunks = [body]
                    while chunk := os.read(fd, _READ):
                        chunks.append(chunk)
                    body = b"".join(chunks)
                if self.sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            got.append((receipt, body))
        if got and self.sync:
            os.fsync(dfd)
        return got

    # -- deleting ---------------------------------------------------------------------------

    def delete(self, receipt: str) -> bool:
        return self.delete_many([receipt])[0]

    def delete_many(self, receipts: list[str]) -> list[bool]:
        """Unlink each delivery's file; False where it was gone (expired and requeued, or deleted)."""
        outcomes = []
        for receipt in receipts:
            try:
                os.unlink(receipt, dir_fd=self.dir_fd)
                outcomes.append(True)
            except FileNotFoundError:
                outcomes.append(False)
        if self.sync and any(outcomes):
            os.fsync(self.dir_fd)
        return outcomes

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1
