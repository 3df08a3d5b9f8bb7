"""The hub protocol, as pure logic: what a push carries and what the hub checks before it stores.

A client copies a journal to the hub by pushing runs of the journal's own bytes: whole messages,
exactly as its segment files hold them, never re-encoded. A ``Push`` names the client, the
journal (one directory name: the hub keeps the copy in ``ROOT/[client-id].[journal-dir]/``, as
sej's hub lays it out), the offset of the first message, and the base offset of the source
segment the bytes come from (so that the copy starts a new segment where the source did, and is
byte-identical to it segment file by segment file).

``plan_push`` is the hub's decision, free of I/O: every message is decoded and checked (whole,
well-formed, offsets dense from the push's first offset); what the hub holds already is skipped
(and compared with what it stored: ``check_overlap``); a push that starts past what the hub holds
is refused as a gap. The store (``journalq.hub.store``) does the reading and writing around it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from journalq.errors import (
    CorruptionError,
    DamagedPushError,
    HubConflictError,
    HubGapError,
    InvalidClientIdError,
    InvalidJournalPathError,
)
from journalq.journal.codec import frame_sizes

__all__ = [
    "API_PREFIX",
    "Held",
    "Plan",
    "Push",
    "PushResult",
    "check_client_id",
    "check_journal_name",
    "check_overlap",
    "copy_dir_name",
    "journal_url",
    "parse_copy_dir_name",
    "plan_push",
]

API_PREFIX = "/hub/v1"
_CLIENT_ID = re.compile(r"[a-zA-Z0-9_-]+")
MAX_CLIENT_ID = 64
MAX_JOURNAL_NAME = 190  # with the client id and the dot, within a file name's 255 bytes
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters; a backslash reads as a separator elsewhere


def check_client_id(client_id: object) -> str:
    """``client_id`` when it matches ``[a-zA-Z0-9_-]+`` (so ``[client-id].`` splits at its dot)."""
    if not isinstance(client_id, str) or not _CLIENT_ID.fullmatch(client_id):
        raise InvalidClientIdError(
            f"client id {client_id!r} must be one or more letters, digits, '_' or '-'"
        )
    if len(client_id) > MAX_CLIENT_ID:
        raise InvalidClientIdError(
            f"client id {client_id[:20]!r}... is {len(client_id)} characters; at most {MAX_CLIENT_ID}"
        )
    return client_id


def check_journal_name(journal: object) -> str:
    """``journal`` when it is one directory name that stays in the hub's root.

    Refused: an absolute path, ``.``, ``..``, more than one path component, a name starting with a
    dot (the hub's own files), control characters, names that are not UTF-8 text, and names too
    long for a file name.
    """
    if not isinstance(journal, str) or not journal:
        raise InvalidJournalPathError(f"journal path must be a directory name, not {journal!r}")
    if journal.startswith("/"):
        raise InvalidJournalPathError(f"journal path {journal!r} is absolute; the hub takes a directory name")
    parts = journal.split("/")
    if ".." in parts:
        raise InvalidJournalPathError(f"journal path {journal!r} leaves the hub's root ('..')")
    if len(parts) > 1:
        raise InvalidJournalPathError(
            f"journal path {journal!r} has more than one directory; the hub keeps each journal as "
            "[client-id].[journal-dir], so it takes one directory name (a shard: its shard directory)"
        )
    if journal.startswith("."):
        raise InvalidJournalPathError(f"journal path {journal!r} starts with a dot")
    if _UNSAFE.search(journal):
        raise InvalidJournalPathError(f"journal path {journal!r} holds a control character or a backslash")
    try:
        encoded = journal.encode()
    except UnicodeEncodeError:  # a directory name of bytes that are not UTF-8: no URL names it
        raise InvalidJournalPathError(f"journal path {journal!r} is not UTF-8 text") from None
    if len(encoded) > MAX_JOURNAL_NAME:
        raise InvalidJournalPathError(f"journal path {journal[:20]!r}... is over {MAX_JOURNAL_NAME} bytes")
    return journal


def copy_dir_name(client_id: str, journal: str) -> str:
    """The directory of a client's journal in the hub's root: ``[client-id].[journal-dir]``."""
    return f"{check_client_id(client_id)}.{check_journal_name(journal)}"


def parse_copy_dir_name(name: str) -> tuple[str, str] | None:
    """``(client_id, journal)`` of a directory in the hub's root; None for anything else."""
    client_id, dot, journal = name.partition(".")
    if not dot:
        return None
    try:
        return check_client_id(client_id), check_journal_name(journal)
    except (InvalidClientIdError, InvalidJournalPathError):
        return None


def journal_url(client_id: str, journal: str) -> str:
    """The path of a journal's copy in the hub's HTTP API."""
    client_part = quote(check_client_id(client_id), safe="")
    return f"{API_PREFIX}/journals/{client_part}/{quote(check_journal_name(journal), safe='')}"


def _offset(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise DamagedPushError(f"{name} must be an unsigned 64-bit integer, not {value!r}")
    return value


@dataclass(frozen=True)
class Held:
    """What the hub holds of one journal: offsets ``first`` to ``next - 1`` (none when they are
    equal), the last of its segments starting at ``segment``. ``unreadable``: why the hub could
    not read its copy (the hub's status names it so; its offsets are then 0, unknown)."""

    first: int = 0
    next: int = 0
    segment: int = 0
    unreadable: str | None = None

    @property
    def empty(self) -> bool:
        return self.next == self.first

    def to_json(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {"first": self.first, "next": self.next, "segment": self.segment}
        if self.unreadable is not None:  # only then: a client that knows no such key reads the rest
            out["unreadable"] = self.unreadable
        return out

    @classmethod
    def from_json(cls, data: Any) -> Held:
        """From a hub's answer; ``ValueError`` for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object with first, next and segment, not {data!r}")
        values = [data.get(k) for k in ("first", "next", "segment")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"first, next and segment must be offsets: {data!r}")
        first, next_, segment = values
        if not first <= next_ or segment > max(first, next_):
            raise ValueError(f"offsets out of order: {data!r}")
        unreadable = data.get("unreadable")
        if unreadable is not None and not isinstance(unreadable, str):
            raise ValueError(f"unreadable must be a reason (text): {data!r}")
        return cls(first, next_, segment, unreadable)


@dataclass(frozen=True)
class Push:
    """A run of whole messages of a client's journal: its bytes as the journal holds them, from
    offset ``first``, all from the source segment that starts at offset ``segment``."""

    client_id: str
    journal: str
    first: int
    segment: int
    data: bytes

    def __post_init__(self) -> None:
        check_client_id(self.client_id)
        check_journal_name(self.journal)
        _offset("first", self.first)
        _offset("segment", self.segment)
        if self.segment > self.first:
            raise DamagedPushError(f"the segment's base offset {self.segment} is past the first offset {self.first}")
        if not isinstance(self.data, bytes):
            raise DamagedPushError(f"the pushed data must be bytes, not {type(self.data).__name__}")

    def params(self) -> dict[str, int]:
        """The query parameters that carry ``first`` and ``segment`` over HTTP."""
        return {"first": self.first, "segment": self.segment}


@dataclass(frozen=True)
class Plan:
    """What the hub does with a push.

    ``start_at``: the copy holds nothing yet and starts at this offset (where a source segment
    starts). ``overlap``: the pushed bytes from offset ``overlap_first`` that the hub holds
    already, to compare with its own (``skipped`` messages are skipped in all, some maybe older
    than the oldest the hub still holds); then ``append``, ``count`` messages, to store, starting
    a new segment when ``new_segment``.
    """

    start_at: int | None
    overlap_first: int
    overlap: bytes
    append: bytes
    count: int
    skipped: int
    new_segment: bool


@dataclass(frozen=True)
class PushResult:
    """The hub's answer to a push: what it holds now, and what it did with the push."""

    held: Held
    appended: int = 0
    skipped: int = 0

    def to_json(self) -> dict[str, int | str]:
        return {**self.held.to_json(), "appended": self.appended, "skipped": self.skipped}


def _messages(push: Push) -> list[int]:
    """The size in bytes of each pushed message, after checking that they are whole, well formed
    and at dense offsets from ``push.first``."""
    try:
        sizes, used = frame_sizes(push.data, push.first)
    except CorruptionError as exc:
        raise DamagedPushError(
            f"pushed message is damaged: {exc.reason}", position=exc.position, offset=exc.offset
        ) from None
    if used != len(push.data):
        raise DamagedPushError(
            f"the push ends with {len(push.data) - used} bytes that are not a whole message",
            position=used,
            offset=push.first + len(sizes),
        )
    if sizes and push.first + len(sizes) > 2**64:
        raise DamagedPushError("offsets run past 2**64")
    return sizes


def plan_push(push: Push, held: Held) -> Plan:
    """Check ``push`` against what the hub holds (``held``) and decide what to store.

    Raises ``DamagedPushError`` for bytes that are not whole, well-formed messages at dense
    offsets from ``push.first``, ``HubGapError`` for a push that would leave offsets missing.
    """
    sizes = _messages(push)
    if not sizes:
        return Plan(None, push.first, b"", b"", 0, 0, False)
    start_at = None
    if held.empty and push.first != held.next:
        # A copy that holds nothing may start anywhere the source has a segment start (a source
        # whose oldest segments were deleted starts past 0); elsewhere it would not mirror it.
        if push.first != push.segment:
            raise HubGapError(
                f"the hub holds nothing of {push.client_id}.{push.journal} and the push starts at offset "
                f"{push.first}, inside the segment starting at {push.segment}: push from a segment start",
                held=held.next,
            )
        start_at = push.first
        held = Held(push.first, push.first, push.first)
    if push.first > held.next:
        raise HubGapError(
            f"the push starts at offset {push.first} but the hub holds {push.client_id}.{push.journal} "
            f"up to offset {held.next}: offsets {held.next} to {push.first - 1} would be missing",
            held=held.next,
        )
    skipped = min(len(sizes), held.next - push.first)
    unheld = min(skipped, max(0, held.first - push.first))  # skipped, but no longer held to compare
    overlap_start, split = sum(sizes[:unheld]), sum(sizes[:skipped])
    first_appended = push.first + skipped
    return Plan(
        start_at=start_at,
        overlap_first=push.first + unheld,
        overlap=push.data[overlap_start:split],
        append=push.data[split:],
        count=len(sizes) - skipped,
        skipped=skipped,
        new_segment=skipped < len(sizes) and push.segment == first_appended and held.segment != first_appended,
    )


def check_overlap(push: Push, plan: Plan, stored: bytes) -> None:
    """Refuse a push whose messages differ from the ones the hub stored at the same offsets
    (``stored``: the hub's bytes from ``plan.overlap_first``, as long as ``plan.overlap``)."""
    if plan.overlap != stored:
        raise HubConflictError(
            f"the pushed messages from offset {plan.overlap_first} differ from the ones the hub holds "
            f"of {push.client_id}.{push.journal}: the journal is not the one the hub copied "
            "(recreated, or another journal of the same name); push it under another name or client id"
        )
