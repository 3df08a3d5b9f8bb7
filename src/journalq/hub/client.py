"""The hub's client: push local journals to a hub and keep them copied.

``HubClient`` speaks the hub's HTTP API, one attempt per call: a refusal comes back as the
``HubError`` the hub named; a connection error, a 5xx answer or a 408 (the request stopped
arriving) as ``HubUnavailableError``, which ``Pusher`` waits out with a growing delay
(``Backoff``) before it asks the hub what it holds and resumes from there. So either side can
die at any moment: nothing is sent twice into the copy (the hub skips what it holds) and nothing
is left out (the hub refuses a gap).

``Pusher`` follows journals, plain or sharded (a shard root pushes each of its shards, and shards
that appear later), reading their raw segment bytes in bounded chunks (``RawReader``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import httpx

from journalq.closing import Closing
from journalq.errors import (
    DamagedCopyError,
    DamagedPushError,
    Error,
    HubConflictError,
    HubError,
    HubGapError,
    HubUnavailableError,
    InvalidClientIdError,
    InvalidJournalPathError,
    JournalError,
    OffsetOutOfRangeError,
)
from journalq.hub.protocol import API_PREFIX, Held, Push, PushResult, check_client_id, journal_url
from journalq.hub.source import RawReader, RawRun
from journalq.journal.codec import Message, decode
from journalq.journal.offsets import end_offset, first_offset
from journalq.journal.watch import DirectoryWatch
from journalq.shard.layout import journals_at

__all__ = [
    "DEFAULT_CHECK_INTERVAL", "DEFAULT_CHUNK", "Backoff", "Hub", "HubClient", "JournalCopy", "Pusher", "Reporter",
    "check_hub_url", "sources_at",
]

DEFAULT_CHUNK = 1 << 20
DEFAULT_CHECK_INTERVAL = 30.0
"""Seconds between the questions a pusher asks the hub about a journal it has nothing to push of."""
_ERRORS: dict[str, type[HubError]] = {
    cls.kind: cls for cls in (InvalidClientIdError, InvalidJournalPathError, DamagedPushError, HubConflictError)
}


@dataclass
class Backoff:
    """Delays between attempts: doubling from ``initial`` up to ``maximum`` seconds, each with
    up to a quarter of random jitter (so that many clients of a hub that comes back do not all
    call at once). Pure: ``next_delay`` only computes."""

    initial: float = 0.05
    maximum: float = 2.0
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float:
        # The exponent is capped: a hub down long enough would make 2**attempts overflow a float.
        delay = min(self.maximum, self.initial * 2.0 ** min(self.attempts, 64))
        self.attempts += 1
        return delay * (1 - self.rng.random() / 4)

    def reset(self) -> None:
        self.attempts = 0


def check_hub_url(url: str) -> str:
    """``url`` when it is ``http(s)://HOST[:PORT]``; ``HubError`` naming it otherwise (httpx
    would refuse it at every request as a connection error, which a pusher retries for ever)."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
        good = parsed.scheme in ("http", "https") and bool(parsed.host) and (port is None or 0 < port < 65536)
    except (httpx.InvalidURL, TypeError, ValueError):
        good = False
    if not good:
        raise HubError(f"hub URL {url!r} is not http://HOST:PORT")
    return url


class Hub(Protocol):
    """What a pusher needs of a hub: ``HubClient`` over HTTP, or a ``HubStore`` in the process."""

    def held(self, client_id: str, journal: str) -> Held: ...

    def push(self, push: Push) -> PushResult: ...


class HubClient(Closing):
    """The hub at ``base_url`` (``http://host:port``), one attempt per call."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        http: httpx.Client | None = None,
    ) -> None:
        """``token``: the hub's bearer token, when it requires one. ``http``: an ``httpx.Client``
        to send with (one bound to an app in tests, say); it is closed with this client."""
        self.base_url = check_hub_url(base_url).rstrip("/")
        self._http = http or httpx.Client(
            base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=connect_timeout), follow_redirects=False
        )
        if token is not None:
            self._http.headers["authorization"] = f"Bearer {token}"

    def held(self, client_id: str, journal: str) -> Held:
        """What the hub holds of the journal."""
        return _held(self._call("GET", journal_url(client_id, journal)))

    def push(self, push: Push) -> PushResult:
        """Send a push; the hub answers once it is synced."""
        answer = self._call(
            "POST",
            journal_url(push.client_id, push.journal),
            params=push.params(),
            content=push.data,
            headers={"content-type": "application/octet-stream"},
        )
        try:
            body = answer.json()
            return PushResult(Held.from_json(body), int(body["appended"]), int(body["skipped"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise HubUnavailableError(f"{self.base_url} answered a push with {answer.text[:200]!r}: {exc}") from None

    def status(self) -> dict[str, dict[str, Held]]:
        """Every copy the hub holds: client id -> journal -> offsets."""
        answer = self._call("GET", f"{API_PREFIX}/status")
        try:
            body = answer.json()
            return {c: {j: Held.from_json(h) for j, h in js.items()} for c, js in body["clients"].items()}
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise HubUnavailableError(
                f"{self.base_url} answered the status with {answer.text[:200]!r}: {exc}"
            ) from None

    def read(self, client_id: str, journal: str, offset: int, max_bytes: int = DEFAULT_CHUNK) -> RawRun:
        """The copy's own bytes from ``offset`` (whole messages, from one segment)."""
        answer = self._call(
            "GET", f"{journal_url(client_id, journal)}/messages", params={"offset": offset, "max_bytes": max_bytes}
        )
        try:
            first, count = int(answer.headers["x-journalq-first"]), int(answer.headers["x-journalq-count"])
            return RawRun(first, int(answer.headers["x-journalq-segment"]), answer.content, count)
        except (KeyError, ValueError) as exc:
            raise HubUnavailableError(f"{self.base_url} answered a read without its headers: {exc}") from None

    def get(self, client_id: str, journal: str, offset: int, max_messages: int = 1) -> list[Message]:
        """Up to ``max_messages`` messages of the copy from ``offset`` (sej's ``Get``)."""
        out: list[Message] = []
        while len(out) < max_messages:
            run = self.read(client_id, journal, offset)
            if not run.count:
                break
            messages, _ = decode(run.data, 0, None, offset, max_messages - len(out))
            out.extend(messages)
            offset = run.next
        return out

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            answer = self._http.request(method, url, **kwargs)
        except httpx.TransportError as exc:  # refused, reset, timed out, cut mid-answer
            raise HubUnavailableError(f"hub {self.base_url} unreachable: {type(exc).__name__}: {exc}") from None
        if answer.status_code < 300:
            return answer
        body: Any = None
        try:
            body = answer.json()
            message, kind = str(body["error"]), str(body.get("kind", ""))
        except (ValueError, KeyError, TypeError):
            message, kind = answer.text[:200] or answer.reason_phrase, ""
        if answer.status_code >= 500 or answer.status_code == 408:
            # 408: the request stopped arriving (a stalled network), which a retry may not meet.
            damaged = answer.status_code == 500 and isinstance(body, dict) and body.get("damaged") is True
            raise (DamagedCopyError if damaged else HubUnavailableError)(
                f"hub {self.base_url} answered {answer.status_code}: {message}"
            )
        if kind == HubGapError.kind and isinstance(body.get("next"), int):
            raise HubGapError(message, held=body["next"])
        if answer.status_code == 416:
            raise OffsetOutOfRangeError(f"hub {self.base_url}: {message}")
        raise _ERRORS.get(kind, HubError)(f"hub {self.base_url} refused: {message}")


def _held(answer: httpx.Response) -> Held:
    try:
        return Held.from_json(answer.json())
    except ValueError as exc:
        raise HubUnavailableError(f"hub answered what it holds with {answer.text[:200]!r}: {exc}") from None


def sources_at(directories: Iterable[Path]) -> list[tuple[str, Path]]:
    """The journals that the directories stand for, each named as the hub will name it: a
    journal by its directory's name, each shard of a root by its shard directory's name. One
    directory given by several paths (relative and absolute, say) is one journal. ``JournalError``
    for what is neither, ``HubError`` for two journals of one name or one journal of two names."""
    found: dict[str, Path] = {}
    names: dict[str, str] = {}  # real path -> name: the directory, however it was given
    for directory in directories:
        for shard, path in journals_at(directory):
            name = shard if shard is not None else Path(os.path.abspath(path)).name
            real = os.path.realpath(path)
            if name in found and os.path.realpath(found[name]) != real:
                raise HubError(f"two journals would have one name on the hub, {name!r}: {found[name]} and {path}")
            if names.setdefault(real, name) != name:
                # Two copies of one journal on the hub, each pushed apart.
                raise HubError(
                    f"one journal would have two names on the hub, {names[real]!r} and {name!r}: "
                    f"{found[names[real]]} and {path} are the same directory; give it once"
                )
            found.setdefault(name, path)
    return sorted(found.items())


@dataclass
class JournalCopy:
    """One journal being pushed: where the hub is with it, and what was sent."""

    name: str
    path: Path
    hub_next: int | None = None  # None: ask the hub
    hub_empty: bool = False
    local_end: int = 0
    caught_up: bool = False
    failed: Error | None = None
    sent_messages: int = 0
    sent_bytes: int = 0
    reader: RawReader | None = None
    # Its own backoff: a journal the hub turns away (503 for its copy) holds back no other.
    backoff: Backoff = field(default_factory=Backoff)
    retry_at: float | None = None  # the pusher's clock: not pushed before then
    failing_since: float | None = None
    checked_at: float = float("-inf")  # when the hub last said what it holds (the pusher's clock)
    disagreement: tuple[int, int] | None = None  # the ends a push and ``held`` gave, resumed from

    @property
    def lag(self) -> int:
        return max(0, self.local_end - (self.hub_next or 0))


class Reporter(Protocol):
    """Where a push reports: its progress, at most every ``interval`` seconds, and events."""

    def progress(self, copies: list[JournalCopy], messages_per_s: float, bytes_per_s: float) -> None: ...

    def event(self, kind: str, copy: JournalCopy | None, **fields: Any) -> None: ...


class _Rate:
    """Messages and bytes per second over the last few seconds."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, int, int]] = deque()

    def add(self, messages: int, nbytes: int, now: float) -> None:
        self._samples.append((now, messages, nbytes))

    def rates(self, now: float) -> tuple[float, float]:
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()
        if not self._samples:
            return 0.0, 0.0
        span = max(now - self._samples[0][0], 0.5)
        return sum(s[1] for s in self._samples) / span, sum(s[2] for s in self._samples) / span


class Pusher(Closing):
    """Pushes the journals that ``directories`` stand for to the hub, as ``client_id``.

    ``run()`` copies until every journal is caught up (``follow=False``) or forever, following
    appends and new shards (``follow=True``; it ends when every journal was refused and none can
    be added, no root of shards being among ``directories``). A connection error or a hub
    answering 5xx (or 408) is waited out, journal by journal (each with a copy of ``backoff``: the
    other journals go on meanwhile), after which the pusher asks the hub what it holds and resumes
    from there; a journal failing for ``give_up_after`` seconds in a row ends the run with
    ``HubUnavailableError``. A journal the hub refuses (its messages differ from the ones held,
    say) is reported and left, and so, when not following, is one whose copy the hub says is
    damaged (``DamagedCopyError``: no retry mends it); ``run()`` returns the copies, whose
    ``failed`` says which.
    ``parallel`` journals are pushed at a time (each by one thread, never one journal by two).
    A journal with nothing to push is checked every ``check_interval`` seconds (one question,
    none of its bytes): a copy the hub lost meanwhile is copied anew, not only at the next append.
    """

    def __init__(
        self,
        hub: Hub,
        client_id: str,
        directories: Iterable[str | os.PathLike[str]],
        *,
        chunk: int = DEFAULT_CHUNK,
        reporter: Reporter | None = None,
        report_interval: float = 1.0,
        backoff: Backoff | None = None,
        give_up_after: float | None = None,
        parallel: int = 4,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        self.client_id = check_client_id(client_id)
        self.directories = [Path(d) for d in directories]
        self.chunk = chunk
        self.reporter = reporter
        self.report_interval = report_interval
        self.backoff = backoff or Backoff()
        self.give_up_after = give_up_after
        self.check_interval = check_interval
        self._clock = clock
        self._rate = _Rate()
        self._last_report = float("-inf")
        self._events = threading.Lock()  # reports come from the pool's threads
        # Journals are pushed side by side: the hub syncs each push, and copies sync apart.
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="journalq-push") if parallel > 1 else None
        self._closing = False
        self._following = True  # (``run`` says; a damaged copy is waited out unless it says not)
        self.copies: dict[str, JournalCopy] = {}
        self._refresh(strict=True)

    # -- the loop -------------------------------------------------------------------------------

    def run(self, *, follow: bool = False, stop: Callable[[], bool] = lambda: False) -> list[JournalCopy]:
        watch: DirectoryWatch | None = None
        self._following = follow
        try:
            while not stop():
                if self.round():
                    continue  # more to send
                if not follow and all(c.caught_up or c.failed for c in self.copies.values()):
                    break
                if all(c.failed for c in self.copies.values()) and not self._shard_roots():
                    break  # every journal was refused and no new one can come: nothing to follow
                due = self._retry_due()
                if due is not None and not follow:
                    time.sleep(due)  # only journals waiting out the hub are left
                    continue
                if watch is None or self._refresh():
                    if watch is not None:
                        watch.close()
                    watch = DirectoryWatch(*self._watched())
                    continue  # look once more: appends may have come before the watch began
                watch.wait(self.report_interval if due is None else min(due, self.report_interval))
            self._report(force=True)
        finally:
            if watch is not None:
                watch.close()
        return list(self.copies.values())

    def round(self) -> bool:
        """Push up to a few chunks of every journal not waiting out a failure (``parallel``
        journals at a time); True when something was sent. A journal the hub failed is given its
        time to wait (``retry_at``); the others are not held back by it."""
        now = self._clock()
        active = [c for c in self.copies.values() if c.failed is None and (c.retry_at is None or c.retry_at <= now)]
        if self._pool is None or len(active) < 2:
            outcomes = [self._drive(c) for c in active]
        else:
            outcomes = list(self._pool.map(self._drive, active))
        failed: list[tuple[JournalCopy, HubUnavailableError]] = []
        for copy, (_, exc) in zip(active, outcomes):
            if exc is None:
                copy.retry_at = copy.failing_since = None
                copy.backoff.reset()
            else:
                failed.append((copy, exc))
        if failed:
            self._wait_out(failed)
        self._report()
        return any(sent for sent, _ in outcomes)

    def _drive(self, copy: JournalCopy) -> tuple[bool, HubUnavailableError | None]:
        """A few chunks of one journal (then the next: one busy journal does not starve the
        rest): whether something was sent, and the hub's unavailability if met."""
        sent = False
        try:
            for _ in range(8):
                if self._closing or not self._step(copy):
                    break
                sent = True
        except HubUnavailableError as exc:
            if not isinstance(exc, DamagedCopyError) or self._following:
                return sent, exc
            # Not following: nothing would repair the copy before the run gives up (if ever).
            copy.failed = exc
            self._event("error", copy, error=str(exc))
        except (HubError, JournalError) as exc:
            copy.failed = exc
            self._event("error", copy, error=str(exc))
        return sent, None

    def close(self) -> None:
        # Closed part way through a round (Ctrl-C): journals not begun are left, and those being
        # pushed stop after their current chunk, rather than the whole round being pushed first.
        self._closing = True
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        for copy in self.copies.values():
            if copy.reader is not None:
                copy.reader.close()
                copy.reader = None

    # -- one journal ----------------------------------------------------------------------------

    def _step(self, copy: JournalCopy) -> bool:
        """Send the next chunk of ``copy``; False when the hub has everything there is now."""
        if copy.reader is None:
            copy.reader = RawReader(copy.path)
        if copy.caught_up and copy.hub_next is not None and self._clock() - copy.checked_at >= self.check_interval:
            # Nothing was pushed for a while, so nothing said what the hub holds: a copy it lost
            # (removed, or not synced before it died) is noticed here, not at the next append.
            held = self.hub.held(self.client_id, copy.name)
            copy.checked_at = self._clock()
            if (held.next, held.empty) != (copy.hub_next, copy.hub_empty):
                self._event("changed", copy, hub=held.next, expected=copy.hub_next)
                copy.hub_next = None  # resume from what it holds, as after a failure
        start = copy.hub_next
        if start is None:
            held = self.hub.held(self.client_id, copy.name)
            copy.hub_next, copy.hub_empty, copy.checked_at = held.next, held.empty, self._clock()
            # Resuming: send the last message the hub holds again, for the hub to compare with
            # its own (and refuse a journal that is not the one it copied).
            start = held.next - 1 if held.next > held.first else held.next
        try:
            run = copy.reader.read(start, self.chunk)
            if not run.count and start < copy.hub_next:
                raise OffsetOutOfRangeError("the journal ends before what the hub holds")
        except OffsetOutOfRangeError:
            run = self._read_elsewhere(copy)
        if not run.count:
            copy.local_end = max(copy.local_end, run.next)
            if not copy.caught_up:
                copy.caught_up = True
                self._event("caught-up", copy, offset=copy.hub_next)
            return False
        copy.caught_up = False
        if run.first == run.segment == copy.hub_next and run.first and not copy.hub_empty:
            # The hub takes a push at a segment start as the start of a copy when it holds none:
            # one it lost meanwhile (deleted, or not synced) would lack every message before.
            # So it is asked first (once a source segment); anything unexpected: resume anew.
            held = self.hub.held(self.client_id, copy.name)
            if held.empty or held.next != run.first:
                told, copy.hub_next = (copy.hub_next, held.next), None
                if copy.disagreement == told:
                    # Resumed from what it holds, pushed, told the same two ends again: going
                    # on would go back and forth for ever, at full speed. A failure instead,
                    # waited out (and given up, after ``give_up_after``) as the hub's.
                    raise HubUnavailableError(
                        f"the hub said it holds {self.client_id}.{copy.name} up to offset {told[0]} (answering a "
                        f"push), then up to {told[1]} (asked), twice: its answers disagree (two hubs of different "
                        "roots at one address, or a copy it cannot read)"
                    )
                copy.disagreement = told
                return True
        try:
            result = self.hub.push(Push(self.client_id, copy.name, run.first, run.segment, run.data))
        except HubGapError:
            # The hub holds less than we thought (it lost the copy, say): ask it what it holds,
            # empty or not, as after any failure (a gap's offset alone cannot tell).
            copy.hub_next = None
            return True
        except HubUnavailableError:
            copy.hub_next = None  # after any failure, resume from what the hub says it holds
            raise
        copy.hub_next, copy.hub_empty, copy.checked_at = result.held.next, result.held.empty, self._clock()
        if result.appended:
            copy.disagreement = None  # the copy moved on: whatever the hub said before is past
        copy.local_end = max(copy.local_end, run.next)
        copy.sent_messages += result.appended
        copy.sent_bytes += len(run.data)
        with self._events:
            self._rate.add(result.appended, len(run.data), self._clock())
        return True

    def _read_elsewhere(self, copy: JournalCopy) -> RawRun:
        """The journal does not hold the offset asked for: it is older than its oldest segment
        (deleted, copied or not), or past its end (a journal recreated since it was copied)."""
        assert copy.reader is not None and copy.hub_next is not None
        first, end = first_offset(copy.path), end_offset(copy.path)
        if copy.hub_next > end:
            raise HubConflictError(
                f"the hub holds {self.client_id}.{copy.name} up to offset {copy.hub_next}, past the end of "
                f"{copy.path} ({end}): the journal is not the one the hub copied"
            )
        if first <= copy.hub_next:
            return copy.reader.read(copy.hub_next, self.chunk)  # only the message to compare is gone
        if not copy.hub_empty:
            raise HubGapError(
                f"{copy.path} starts at offset {first} but the hub holds {self.client_id}.{copy.name} only up to "
                f"{copy.hub_next}: the messages between were deleted before they were copied",
                held=copy.hub_next,
            )
        return copy.reader.read(first, self.chunk)  # a new copy starts at the oldest segment

    # -- waiting, journals, reporting -------------------------------------------------------------

    def _wait_out(self, failed: list[tuple[JournalCopy, HubUnavailableError]]) -> None:
        """Give each journal the hub failed its time to wait (its own backoff), and report it:
        one event for them all (a hub that is down fails every journal at once)."""
        now = self._clock()
        delays = []
        for copy, exc in failed:
            if copy.failing_since is None:
                copy.failing_since = now
            elif self.give_up_after is not None and now - copy.failing_since > self.give_up_after:
                raise HubUnavailableError(f"gave up after {self.give_up_after:g} s: {exc}") from None
            delays.append(copy.backoff.next_delay())
            copy.retry_at = now + delays[-1]
        copy, exc = failed[0]
        fields: dict[str, Any] = {} if len(failed) == 1 else {"journals": len(failed)}
        self._event("retry", copy if len(failed) == 1 else None, error=str(exc), delay=round(min(delays), 3), **fields)

    def _retry_due(self) -> float | None:
        """Seconds until the first journal waiting out a failure is due again; None when none waits."""
        waiting = [c.retry_at for c in self.copies.values() if c.failed is None and c.retry_at is not None]
        return max(0.0, min(waiting) - self._clock()) if waiting else None

    def _refresh(self, strict: bool = False) -> bool:
        """Look for journals (new shards of a root); True when some were added."""
        try:
            found = sources_at(self.directories)
        except (JournalError, HubError):
            if strict:
                raise
            return False
        added = False
        for name, path in found:
            if name not in self.copies:
                self.copies[name] = JournalCopy(name, path, backoff=replace(self.backoff, attempts=0))
                added = True
        return added

    def _watched(self) -> list[Path]:
        """What to watch: each journal's segments, and each root (for new shards)."""
        dirs = [c.path / "jnl" for c in self.copies.values() if (c.path / "jnl").is_dir()]
        return dirs + self._shard_roots()

    def _shard_roots(self) -> list[Path]:
        """The directories that are roots of shards, where new journals may appear."""
        return [d for d in self.directories if d.is_dir() and not (d / "jnl").is_dir()]

    def _event(self, kind: str, copy: JournalCopy | None, **fields: Any) -> None:
        if self.reporter is not None:
            with self._events:
                self.reporter.event(kind, copy, **fields)

    def _report(self, force: bool = False) -> None:
        now = self._clock()
        if self.reporter is None or (not force and now - self._last_report < self.report_interval):
            return
        self._last_report = now
        for copy in self.copies.values():
            try:
                copy.local_end = end_offset(copy.path)
            except (OSError, Error):
                pass  # a journal being replaced: its next round says what it is
        messages_per_s, bytes_per_s = self._rate.rates(now)
        self.reporter.progress(list(self.copies.values()), messages_per_s, bytes_per_s)
