"""The ``journalq`` command: write, scan, info, offset, check and demo, after sej's cmd/sej and kcat.

Output is for machines unless it goes to a terminal: ``scan`` prints JSON lines in the format of
the sej test vectors; ``info`` and ``check`` print JSON lines when stdout is not a terminal and a
readable table when it is. Every failure is one line, ``journalq: error: ...``, on stderr with a
non-zero exit, never a traceback.

The commands are thin: what they know about journals comes from ``journalq.journal`` (reading,
writing, ``inspect``) and ``journalq.shard`` (shard names); this module parses arguments, turns
input lines into messages and renders results.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import errno
import io
import json
import logging
import math
import os
import re
import select
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import click

from journalq import __version__
from journalq.cli.data import DirectoryPath
from journalq.errors import (
    ZERO_TIMESTAMP,
    CorruptionError,
    Error,
    InvalidMessageError,
    LockedError,
    OffsetOutOfRangeError,
    format_timestamp,
)
from journalq.journal import codec
from journalq.journal.codec import MAX_KEY_SIZE, Message
from journalq.journal.inspect import CheckReport, JournalInfo, check, describe, first_offset_since
from journalq.journal.offsets import end_offset, first_offset, read_offset, set_offset
from journalq.journal.scanner import Scanner
from journalq.journal.segment import journal_dir
from journalq.journal.sync import POLICY_FORMS
from journalq.journal.writer import DEFAULT_SEGMENT_SIZE, Writer
from journalq.shard import ShardedScanner
from journalq.shard.layout import describe_groups, journals_at, shard_groups
from journalq.shard.naming import list_shards

__all__ = ["SECONDS", "cli", "main", "message_json", "parse_time"]

_LINES_PER_BATCH = 4096
_BYTES_PER_BATCH = 4 << 20
_SIGINT_STATUS = 128 + 2  # what a shell reports for a command that SIGINT ended


# -- errors -----------------------------------------------------------------------------------


class CommandError(click.ClickException):
    """A failure shown as the single line ``journalq: error: ...``, exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"journalq: error: {self.format_message()}", err=True)


class Interrupted(CommandError):
    """Ctrl-C part way through a command's input, saying what was stored; the status of SIGINT."""

    exit_code = _SIGINT_STATUS


def _error_message(exc: BaseException) -> str:
    """One line naming the problem; OSError's ``[Errno 2] ...: 'x'`` made readable."""
    if isinstance(exc, FileExistsError) and exc.filename and os.path.lexists(exc.filename):
        if not os.path.isdir(exc.filename):  # a file where a directory was to be made
            return f"not a directory ({os.fsdecode(exc.filename)})"  # as JournalError says it
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    message = str(exc) or type(exc).__name__
    if isinstance(exc, CorruptionError):
        message += "; `journalq check` lists every problem"
    return message


def _silence_stdout() -> None:
    """After the reader of our stdout went away (``journalq scan d | head``), point stdout at
    /dev/null so that flushing at exit does not print a BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # not a real file descriptor (a test runner's buffer): nothing will be flushed there
    finally:
        os.close(devnull)


class OneLineUsageError(click.UsageError):
    """A usage error shown as the one line ``journalq: error: ...`` (exit status 2), as every
    other failure is, rather than click's usage block."""

    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"journalq: error: {self.format_message()}{hint}", err=True)


def _one_line_usage(exc: click.UsageError) -> click.UsageError:
    """``exc`` as a ``OneLineUsageError``; a bare group's call, which shows its help, stays."""
    if isinstance(exc, (OneLineUsageError, click.exceptions.NoArgsIsHelpError)):
        return exc
    return OneLineUsageError(exc.format_message(), exc.ctx)


class _Group(click.Group):
    """Turns journalq's errors, the operating system's and click's usage errors into one-line
    errors at one place: the command's own options here, every subcommand's in ``invoke``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _one_line_usage(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _silence_stdout()
            raise click.exceptions.Exit(1) from None
        except KeyboardInterrupt:
            # Ctrl-C is how ``scan --follow`` and a long ``receive --wait`` are ended: no click
            # "Aborted!", and the shell's status for SIGINT (as ``pipeline`` already exits).
            raise click.exceptions.Exit(_SIGINT_STATUS) from None
        except (Error, OSError) as exc:
            raise CommandError(_error_message(exc)) from exc
        except click.UsageError as exc:
            raise _one_line_usage(exc) from exc


# -- parameters -------------------------------------------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_ISO_PARTS = re.compile(r"(?P<main>[^.,]*\d)(?:[.,](?P<fraction>\d+))?(?P<zone>[Zz]|[+-]\d\d(?::?\d\d)?)?")


def parse_time(text: str) -> int:
    """Nanoseconds since the epoch from an integer of nanoseconds or an RFC 3339 / ISO 8601 time.

    A time without a zone is UTC; fractions keep nanosecond precision (``datetime`` alone keeps
    microseconds). Raises ValueError for anything else.
    """
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    match = _ISO_PARTS.fullmatch(text)
    if match is None:
        raise ValueError(f"not a time: {text!r}")
    moment = dt.datetime.fromisoformat(match["main"] + (match["zone"] or ""))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    seconds = (moment - _EPOCH) // dt.timedelta(seconds=1)
    nanos = int((match["fraction"] or "0").ljust(9, "0")[:9])
    return seconds * 1_000_000_000 + nanos


class _TimeType(click.ParamType):
    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time(value)
        except ValueError:
            self.fail(
                f"{value!r} is not a time: give RFC 3339 (2026-01-02T03:04:05Z; no zone means UTC) "
                "or nanoseconds since the Unix epoch",
                param,
                ctx,
            )


TIME = _TimeType()


class _SecondsType(click.ParamType):
    """A number of seconds: a finite float, at least ``minimum`` when one is given (the queue's
    ranges are the queue layer's to check). NaN would pass every range check, and be stored as a
    setting that no receive accepts; infinity overflows a wait."""

    name = "SECONDS"

    def __init__(self, minimum: float | None = None) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if self.minimum is not None and seconds < self.minimum:
            self.fail(f"{value!r} is not a number of seconds from {self.minimum:g} on", param, ctx)
        return seconds


SECONDS = _SecondsType()


class _TextType(click.ParamType):
    """Text that must be UTF-8: what goes into JSON or is encoded as UTF-8 (ids, receipts,
    attributes, filters, settings). Python keeps an argument's bytes that are not UTF-8 as lone
    surrogates, which JSON writes as escapes no reader takes for text (and UTF-8 refuses: a
    traceback); refused here, naming the option."""

    name = "TEXT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                at = len(value[: exc.start].encode("utf-8")) + 1
                byte = ord(value[exc.start]) - 0xDC00  # surrogateescape: U+DC80-U+DCFF stand for 0x80-0xff
                what = f"byte {at} is {byte:#04x}" if 0x80 <= byte <= 0xFF else f"character {exc.start + 1}"
                self.fail(f"not UTF-8: {what}", param, ctx)
        return value


TEXT = _TextType()
_FORMAT_AUTO = click.Choice(["auto", "table", "jsonl"])


def _tabular(fmt: str) -> bool:
    """Whether to print for people: asked for, or ``auto`` and stdout is a terminal."""
    return fmt == "table" or (fmt == "auto" and sys.stdout.isatty())


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _timestamp_json(timestamp_ns: int | None) -> int | None:
    """A timestamp as the vectors write it: null for Go's zero time (and for none)."""
    return None if timestamp_ns is None or timestamp_ns == ZERO_TIMESTAMP else timestamp_ns


# -- where the journals are -------------------------------------------------------------------


def _journals_at(path: Path) -> list[tuple[str | None, Path]]:
    """The journals that DIR stands for: DIR itself when it is a journal, else the shards of a
    root in name order, each with its directory name (``journalq.shard.journals_at``)."""
    return journals_at(path)


def _unfinished_shard(name: str | None, path: Path) -> bool:
    """A shard directory of a root without its jnl/ yet: what a writer killed while it made the
    shard leaves. It holds no message (the scanners read it as empty); a writer finishes it."""
    return name is not None and not os.path.lexists(journal_dir(path))  # a file there is damage


def _describe(name: str | None, path: Path) -> JournalInfo:
    if _unfinished_shard(name, path):
        return JournalInfo(path=path, segments=[], first_offset=0, end_offset=0, size_bytes=0, messages=0)
    return describe(path)


def _check(name: str | None, path: Path, repair: bool) -> CheckReport:
    # Nothing to check in an unfinished shard, nor to repair: check makes no journal.
    return CheckReport(path) if _unfinished_shard(name, path) else check(path, repair=repair)


def _one_journal(path: Path, what: str) -> Path:
    """DIR as one journal; a root of shards is refused, naming ``what`` cannot span shards."""
    journals = _journals_at(path)
    if journals[0][0] is not None:
        raise CommandError(f"{path} is a root of {len(journals)} shards; {what} one shard directory")
    return journals[0][1]


# -- the command group ------------------------------------------------------------------------


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="journalq")
def cli() -> None:
    """A durable message queue that lives in a directory (sej-compatible journals).

    DIR is a journal directory (one holding jnl/), or for scan, info and check also a root of
    shard directories named [prefix].[bit].[index].
    """


class _ClosedStream(io.TextIOBase):
    """Stands for a standard stream that the caller closed (``journalq scan DIR >&-``), where
    Python leaves None: using it fails as a closed file does, so the command stops with one line
    (with None, click's echo prints nothing, silently, and the rest fails with a traceback)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def _fail(self, *args: object) -> Any:
        raise OSError(errno.EBADF, f"standard {self._name} is closed")

    read = readline = write = fileno = _fail

    def __iter__(self) -> Iterator[str]:
        return self._fail()

    @property
    def buffer(self) -> BinaryIO:
        return self._fail()  # type: ignore[no-any-return]

    def isatty(self) -> bool:
        return False


def _whole_writes(stream: Any) -> Any:
    """``stream`` (stdout, stderr) over a ``BufferedWriter`` when it writes to the raw file
    (PYTHONUNBUFFERED, ``python -u``): a TextIOWrapper straight over it drops, silently, what a
    partial write left (a reader gone mid-write, a full disk), so ``receive --delete | head``
    deleted messages it never printed. A BufferedWriter writes the rest, or raises. (Each line
    is flushed as it comes, as unbuffered output would show it.)"""
    if not isinstance(getattr(stream, "buffer", None), io.RawIOBase):
        return stream
    raw = io.FileIO(stream.fileno(), "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors,
                            line_buffering=True, write_through=True)


def main(argv: Sequence[str] | None = None) -> None:
    """The console-script entry point."""
    if sys.stdin is None:
        sys.stdin = _ClosedStream("input")
    sys.stdout = _ClosedStream("output") if sys.stdout is None else _whole_writes(sys.stdout)
    sys.stderr = _whole_writes(sys.stderr)
    logging.basicConfig(format="journalq: warning: %(message)s", level=logging.WARNING)
    try:
        cli.main(args=argv, prog_name="journalq")
    except OSError as exc:  # before a command runs: --help or --version with stdout closed, say
        CommandError(_error_message(exc)).show()
        sys.exit(1)


# -- write ------------------------------------------------------------------------------------


class _BadLine(ValueError):
    """An input line that does not make a message; the caller adds the line number."""


def _text_parser(key: bytes, type_: int) -> Callable[[bytes], bytes | Message | None]:
    """Each line's bytes, without the newline, are the value."""
    plain = not key and not type_

    def parse(line: bytes) -> bytes | Message:
        value = line[:-1] if line.endswith(b"\n") else line
        return value if plain else Message(type=type_, key=key, value=value)

    return parse


_JSON_FIELDS = frozenset({"value", "value_b64", "key", "key_b64", "type", "timestamp_ns", "offset", "dir"})


def _json_bytes(obj: dict[str, Any], name: str) -> bytes | None:
    """Field ``name`` (a UTF-8 string) or ``name_b64`` (base64) as bytes; None when neither."""
    b64 = f"{name}_b64"
    if name in obj and b64 in obj:
        raise _BadLine(f"give {name!r} or {b64!r}, not both")
    if name in obj:
        if not isinstance(obj[name], str):
            raise _BadLine(f"{name!r} must be a string (use {b64!r} for bytes)")
        try:
            return obj[name].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _BadLine(f"{name!r} is not encodable as UTF-8: {exc.reason}") from None
    if b64 in obj:
        if not isinstance(obj[b64], str):
            raise _BadLine(f"{b64!r} must be a base64 string")
        try:
            return base64.b64decode(obj[b64], validate=True)
        except binascii.Error as exc:
            raise _BadLine(f"{b64!r} is not valid base64: {exc}") from None
    return None


def _jsonl_parser(key: bytes, type_: int) -> Callable[[bytes], bytes | Message | None]:
    """Each line is an object as ``scan`` prints it, so scan output can be written back:
    ``value`` or ``value_b64``; optional ``key``/``key_b64``, ``type`` and ``timestamp_ns`` (null
    is the zero time, as scan prints it; absent is now). ``offset`` and ``dir`` are ignored: the
    writer assigns offsets. Blank lines are skipped."""

    def parse(line: bytes) -> Message | None:
        if not line.strip():
            return None
        try:
            # Decoded here: json.loads would take bytes in UTF-16 or UTF-32 too. A leading byte
            # order mark is let through, as json.loads lets it.
            text = line.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            at = len(line) - len(exc.object) + exc.start  # the error counts from after a byte order mark
            raise _BadLine(f"not UTF-8: byte {at + 1} is {line[at]:#04x}") from None
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise _BadLine(f"not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise _BadLine(f"expected a JSON object, not {type(obj).__name__}")
        unknown = sorted(obj.keys() - _JSON_FIELDS)
        if unknown:
            raise _BadLine(
                f"unknown field {unknown[0]!r}; the fields are value or value_b64, key or key_b64, "
                "type, timestamp_ns"
            )
        value = _json_bytes(obj, "value")
        if value is None:
            raise _BadLine("no 'value' or 'value_b64'")
        line_key = _json_bytes(obj, "key")
        for name in ("type", "timestamp_ns"):
            if isinstance(obj.get(name), bool):  # Python's bool is an int: the codec takes it as 0 or 1
                raise _BadLine(f"{name!r} must be an integer, not {json.dumps(obj[name])}")
        timestamp_ns = obj.get("timestamp_ns", None)
        if "timestamp_ns" in obj and timestamp_ns is None:
            timestamp_ns = ZERO_TIMESTAMP
        return Message(
            timestamp_ns=timestamp_ns,
            type=obj.get("type", type_),
            key=key if line_key is None else line_key,
            value=value,
        )

    return parse


def _line_batches(stream: BinaryIO) -> Iterator[tuple[int, list[bytes]]]:
    """Lines in batches, each with its first line's number: a batch ends at a few thousand lines
    (or a few MiB), and also whenever the input pauses (nothing more to read at once), so that a
    slow producer's lines (``tail -f log | journalq write``) are stored as they come, not when a
    batch fills. A file or a fast pipe still gives full batches."""
    batch: list[bytes] = []
    size = 0
    number = first = 1
    partial = b""  # a line whose end has not been read yet
    for chunk, more_ready in _chunks(stream):
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            line += b"\n"
            batch.append(line)
            size += len(line)
            number += 1
            if len(batch) >= _LINES_PER_BATCH or size >= _BYTES_PER_BATCH:
                yield first, batch
                batch, size, first = [], 0, number
        if batch and not more_ready:
            yield first, batch
            batch, size, first = [], 0, number
    if partial:
        batch.append(partial)  # the last line, with no newline
    if batch:
        yield first, batch


def _chunks(stream: BinaryIO, size: int = 1 << 16) -> Iterator[tuple[bytes, bool]]:
    """What ``stream`` holds, as it can be read at once (never waiting for a chunk to fill), each
    with whether more can be read at once after it. A stream with no descriptor (in memory) is
    always ready."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        fd = -1
    if fd < 0:
        while chunk := stream.read(size):
            yield chunk, True
        return
    # Read from the descriptor, not through the stream's buffer (which would wait to fill it):
    # nothing has read the stream before (standard input, at the command's start).
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    while chunk := os.read(fd, size):
        yield chunk, bool(poll.poll(0))


def _invalid_item(items: Sequence[bytes | Message]) -> tuple[int, str] | None:
    """The index of the first item that the codec refuses, and why (only after a batch failed,
    so that validation stays the codec's alone)."""
    for i, item in enumerate(items):
        message = item if isinstance(item, Message) else Message(value=item)
        timestamp_ns = 0 if message.timestamp_ns is None else message.timestamp_ns
        try:
            codec.encode(0, timestamp_ns, message.type, message.key, message.value)
        except InvalidMessageError as exc:
            return i, str(exc)
    return None


def _append_lines(
    writer: Writer, stream: BinaryIO, parse: Callable[[bytes], bytes | Message | None]
) -> int | None:
    """Append one message per line, a batch at a time; returns the last offset (None if none).

    A bad line fails its whole batch, which is not stored at all; the earlier batches are.
    """
    last: int | None = None
    unstored = 1  # the first line not stored yet
    try:
        for first, lines in _line_batches(stream):
            items: list[bytes | Message] = []
            numbers: list[int] = []
            for number, line in enumerate(lines, first):
                try:
                    item = parse(line)
                except _BadLine as exc:
                    raise _not_stored(f"line {number}: {exc}", first, last) from None
                if item is not None:
                    items.append(item)
                    numbers.append(number)
            try:
                last = writer.append_many(items) if items else last
            except InvalidMessageError as exc:
                bad = _invalid_item(items)
                number, reason = (numbers[bad[0]], bad[1]) if bad else (first, str(exc))
                raise _not_stored(f"line {number}: {reason}", first, last) from None
            except (Error, OSError) as exc:  # a full disk, say: the batch is not stored, the earlier ones are
                raise _not_stored(_error_message(exc), first, last) from exc
            unstored = first + len(lines)
    except KeyboardInterrupt:  # Ctrl-C at a terminal: the lines typed since the last batch are not stored
        raise _not_stored("interrupted", unstored, last, Interrupted) from None
    return last


def _not_stored(
    problem: str, first: int, last: int | None, error: type[CommandError] = CommandError
) -> CommandError:
    stored = f"; lines before {first} were stored, up to offset {last}" if last is not None else ""
    return error(f"{problem}; nothing from line {first} on was stored{stored}")


@cli.command()
@click.argument("directory", metavar="DIR", type=DirectoryPath())
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text", show_default=True,
              help="text: each line (without its newline) is a value; jsonl: each line is an object "
              "as scan prints it: value (UTF-8 text) or value_b64, and optional key or key_b64, type, "
              "timestamp_ns (null is the zero time; absent is now).")
@click.option("--key", help="Key of every message (jsonl lines may give their own); at most 127 bytes.")
@click.option("--type", "type_", type=click.IntRange(0, 255), default=0, show_default=True,
              help="Type byte of every message (jsonl lines may give their own).")
@click.option("--sync", default="none", show_default=True, metavar="POLICY",
              help=f"{POLICY_FORMS}.")
@click.option("--segment-size", type=click.IntRange(min=1), default=DEFAULT_SEGMENT_SIZE, show_default=True,
              metavar="BYTES", help="Start a new segment once one reaches this size.")
@click.option("--shared", is_flag=True, help="Take the lock per batch, so other processes can append too.")
@click.option("-v", "--verbose", is_flag=True, help="Print the offset of the last message written.")
def write(
    directory: Path, fmt: str, key: str | None, type_: int, sync: str, segment_size: int, shared: bool,
    verbose: bool,
) -> None:
    """Append one message per line of standard input to the journal at DIR (created if missing).

    Lines are appended in batches: of a few thousand, or of what came before the input paused (a
    slow producer's lines are stored as they come). A bad line stops the command with its line
    number, and nothing of its batch is stored (earlier batches are).
    """
    key_bytes = os.fsencode(key) if key is not None else b""
    if len(key_bytes) > MAX_KEY_SIZE:
        raise InvalidMessageError(f"--key is {len(key_bytes)} bytes; the format allows at most {MAX_KEY_SIZE}")
    if directory.is_dir() and not journal_dir(directory).is_dir() and list_shards(directory):
        raise CommandError(f"{directory} is a root of shards; write to one shard directory")
    parse = (_text_parser if fmt == "text" else _jsonl_parser)(key_bytes, type_)
    with Writer(directory, segment_size=segment_size, sync=sync, shared=shared) as writer:
        last = _append_lines(writer, sys.stdin.buffer, parse)
    if verbose and last is not None:
        click.echo(last)


# -- scan -------------------------------------------------------------------------------------


def message_json(message: Message, directory: str | None = None) -> str:
    """One message as a line of the vectors' ``.expected.jsonl`` (without the newline).

    Written by hand rather than with ``json.dumps``: the fields are numbers, null, base64 and
    shard names, none of which needs escaping, and this is the hot loop of ``scan``.
    """
    timestamp = _timestamp_json(message.timestamp_ns)
    head = f'{{"dir":"{directory}",' if directory is not None else "{"
    return (
        f'{head}"offset":{message.offset},"timestamp_ns":{"null" if timestamp is None else timestamp},'
        f'"type":{message.type},"key_b64":"{base64.b64encode(message.key).decode("ascii")}",'
        f'"value_b64":"{base64.b64encode(message.value).decode("ascii")}"}}'
    )


def _render_jsonl(messages: list[Message], directory: str | None) -> bytes:
    return "".join([message_json(m, directory) + "\n" for m in messages]).encode("ascii")


def _render_text(messages: list[Message], directory: str | None) -> bytes:
    return "".join([m.value.decode("utf-8", "replace") + "\n" for m in messages]).encode("utf-8")


def _render_raw(messages: list[Message], directory: str | None) -> bytes:
    return b"".join([m.value for m in messages])


_RENDERERS = {"jsonl": _render_jsonl, "text": _render_text, "raw": _render_raw}


def _message_filter(
    since: int | None, until: int | None, type_: int | None
) -> Callable[[Message], bool] | None:
    """The scan's filters as one predicate; None when there is nothing to filter."""
    tests: list[Callable[[Message], bool]] = []
    if since is not None:
        tests.append(lambda m: m.timestamp_ns >= since)
    if until is not None:
        tests.append(lambda m: m.timestamp_ns < until)
    if type_ is not None:
        tests.append(lambda m: m.type == type_)
    if len(tests) <= 1:
        return tests[0] if tests else None
    return lambda m: all(test(m) for test in tests)


def _batches(path: Path, start: int | None, follow: bool, timeout: float | None) -> Iterator[list[Message]]:
    """The journal's messages from ``start`` (default: its first stored one), a batch at a time."""
    # None (the oldest) is the scanner's to find: it looks again if gc deletes that segment meanwhile.
    with Scanner(path, start, timeout, follow=follow) as scanner:
        while batch := scanner.read_batch():
            yield batch


def _named_batches(
    directory: Path, journals: list[tuple[str | None, Path]], start: int | None, follow: bool, timeout: float | None
) -> Iterator[tuple[str | None, list[Message]]]:
    """(shard name or None, messages): a journal, or each shard of a root in name order; a root
    followed is read by a ``ShardedScanner``, which also takes in shards created meanwhile."""
    if follow and journals[0][0] is not None:
        with ShardedScanner(directory, follow=True, timeout=timeout) as scanner:
            while (got := scanner.read_batch()) is not None:
                yield got
        return
    for name, path in journals:
        for batch in _batches(path, start, follow, timeout):
            yield name, batch


@cli.command()
@click.argument("directory", metavar="DIR", type=DirectoryPath())
@click.option("--from", "start", type=click.IntRange(min=0), metavar="OFFSET",
              help="Start at this offset; default: the first one stored.")
@click.option("--since", type=TIME, help="Only messages with timestamp >= TIME.")
@click.option("--until", type=TIME, help="Only messages with timestamp < TIME.")
@click.option("--type", "type_", type=click.IntRange(0, 255), help="Only messages of this type.")
@click.option("--count", is_flag=True, help="Print only the number of matching messages (following: the "
              "number so far, each time it grows).")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new messages (in every shard of a root).")
@click.option("--timeout", type=_SecondsType(minimum=0), metavar="SECONDS",
              help="Follow, and stop after SECONDS with no new message (--follow: never stop).")
@click.option("--format", "fmt", type=click.Choice(list(_RENDERERS)), default="jsonl", show_default=True,
              help="jsonl: offset, timestamp_ns, type, key_b64, value_b64 (and first dir, for a "
              "root); text: the value as UTF-8, one per line; raw: the value bytes back to back.")
def scan(
    directory: Path, start: int | None, since: int | None, until: int | None, type_: int | None,
    count: bool, follow: bool, timeout: float | None, fmt: str,
) -> None:
    """Print the messages of the journal at DIR, or of every shard of a root in name order
    (followed, a root's shards are read in turn as messages come: in order within each shard).

    TIME is RFC 3339 (2026-01-02T03:04:05.5Z; without a zone, UTC) or nanoseconds since the epoch.
    Timestamps need not rise in a journal, so --since and --until filter a scan rather than seek.
    """
    journals = _journals_at(directory)
    follow = follow or timeout is not None
    if journals[0][0] is not None and start is not None:
        raise click.UsageError(
            "--from names an offset of one journal, and offsets count per shard: give one shard directory"
        )
    if journals[0][0] is not None and follow and len(groups := shard_groups(list_shards(directory))) > 1:
        # A ShardedScanner follows one sharded journal, and would ask for a prefix, which scan has no way to give.
        raise CommandError(
            f"{directory} holds the shards of more than one sharded journal ({describe_groups(groups)}): "
            "--follow follows one; follow one shard directory, or scan the root without --follow"
        )
    keep = _message_filter(since, until, type_)
    render = _RENDERERS[fmt]
    out = sys.stdout.buffer
    matched = 0
    shown = None  # the count printed last
    for name, batch in _named_batches(directory, journals, start, follow, timeout):
        selected = batch if keep is None else [m for m in batch if keep(m)]
        matched += len(selected)
        if not selected:
            continue
        if not count:
            out.write(render(selected, name))
        elif follow:  # the count so far: a scan that follows may end only with Ctrl-C
            out.write(f"{matched}\n".encode())
            shown = matched
        if follow:
            out.flush()
    if count and matched != shown:
        out.write(f"{matched}\n".encode())
    out.flush()


# -- info -------------------------------------------------------------------------------------


def counted(n: int, noun: str) -> str:
    """``1 segment``, ``2 segments``: for people."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _size(n: int) -> str:
    """A byte count for people: 512 B, 64.1 KiB, 1.8 MiB."""
    if n < 1024:
        return f"{n} B"
    amount = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            break
        amount /= 1024
    return f"{amount:.1f} {unit}"


def _info_lines(journal: JournalInfo, directory: str | None) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``info``: one per segment, then the journal's summary."""
    head = {"dir": directory} if directory is not None else {}
    for s in journal.segments:
        yield head | {
            "segment": s.path.name,
            "base": s.base,
            "size_bytes": s.size_bytes,
            "first_offset": s.first_offset,
            "end_offset": s.end_offset,
            "messages": s.messages,
            "first_timestamp_ns": _timestamp_json(s.first_timestamp_ns),
            "last_timestamp_ns": _timestamp_json(s.last_timestamp_ns),
        }
    yield head | {
        "journal": str(journal.path),
        "segments": len(journal.segments),
        "size_bytes": journal.size_bytes,
        "first_offset": journal.first_offset,
        "end_offset": journal.end_offset,
        "messages": journal.messages,
        "first_timestamp_ns": _timestamp_json(journal.first_timestamp_ns),
        "last_timestamp_ns": _timestamp_json(journal.last_timestamp_ns),
    }


def _info_table(journal: JournalInfo) -> Iterator[str]:
    offsets = f"offsets {journal.first_offset}-{journal.end_offset - 1}; " if journal.messages else ""
    yield (
        f"{journal.path}: {counted(len(journal.segments), 'segment')}, {counted(journal.messages, 'message')} "
        f"({offsets}next {journal.end_offset}), {_size(journal.size_bytes)}"
    )
    if journal.messages:
        yield (
            f"  first message {format_timestamp(journal.first_timestamp_ns)}, "
            f"last {format_timestamp(journal.last_timestamp_ns)}"
        )
    yield (
        f"  {'segment':<22}{'first':>12}{'end':>12}{'messages':>10}{'size':>12}  "
        f"{'first timestamp':<32}last timestamp"
    )
    for s in journal.segments:
        first_ts = format_timestamp(s.first_timestamp_ns) if s.messages else "-"
        last_ts = format_timestamp(s.last_timestamp_ns) if s.messages else "-"
        yield (
            f"  {s.path.name:<22}{s.first_offset:>12}{s.end_offset:>12}{s.messages:>10}"
            f"{_size(s.size_bytes):>12}  {first_ts:<32}{last_ts}"
        )


@cli.command()
@click.argument("directory", metavar="DIR", type=DirectoryPath())
@click.option("--format", "fmt", type=_FORMAT_AUTO, default="auto", show_default=True,
              help="table for people, jsonl for programs; auto: table on a terminal, else jsonl.")
def info(directory: Path, fmt: str) -> None:
    """Segments, offsets, timestamps and sizes of the journal at DIR (or of each shard of a root).

    As JSON lines: one object per segment (segment, base, size_bytes, first_offset, end_offset,
    messages, first_timestamp_ns, last_timestamp_ns), then one summary object for the journal
    (journal, segments, size_bytes, first_offset, end_offset, messages, first_timestamp_ns,
    last_timestamp_ns). end_offset is the next offset to be written; a timestamp is null for the
    zero time or when there is no message. For a root, every object starts with dir, the shard.
    """
    for name, path in _journals_at(directory):
        journal = _describe(name, path)
        if _tabular(fmt):
            if name is not None:
                click.echo(f"[{name}]")
            for line in _info_table(journal):
                click.echo(line)
        else:
            for obj in _info_lines(journal, name):
                click.echo(_json(obj))


# -- offset -----------------------------------------------------------------------------------


def _require_stored(path: Path, offset: int) -> None:
    """A reader offset must be a stored message or the end (caught up); anything else would make
    the reader fail when it resumes."""
    first, end = first_offset(path), end_offset(path)
    if offset > end:
        raise OffsetOutOfRangeError(
            f"offset {offset} is past the end of the journal (the next offset is {end})", file=path
        )
    if offset < first:
        raise OffsetOutOfRangeError(f"offset {offset} is no longer stored: the journal starts at {first}", file=path)


@cli.command()
@click.argument("directory", metavar="DIR", type=DirectoryPath())
@click.argument("name")
@click.option("--set", "set_to", type=click.IntRange(min=0), metavar="N", help="Commit N as the offset.")
@click.option("--reset-to", type=TIME, metavar="TIME",
              help="Commit the offset of the first message with timestamp >= TIME (the end if none).")
def offset(directory: Path, name: str, set_to: int | None, reset_to: int | None) -> None:
    """Print the reader offset NAME of the journal at DIR (ofs/NAME.ofs: the next offset that
    reader reads; 0 when never committed), or commit a new one and print it."""
    path = _one_journal(directory, "reader offsets belong to")
    if set_to is not None and reset_to is not None:
        raise click.UsageError("give --set or --reset-to, not both")
    if set_to is None and reset_to is None:
        click.echo(read_offset(path, name))
        return
    target = set_to if set_to is not None else first_offset_since(path, reset_to)  # type: ignore[arg-type]
    _require_stored(path, target)
    try:
        set_offset(path, name, target)  # over a damaged file too: the way to mend it
    except LockedError as exc:  # whose own words are of a journal's writer
        raise CommandError(
            f"reader {name!r} is in use: another process holds {exc.file}; stop that reader first"
        ) from exc
    click.echo(target)


# -- check ------------------------------------------------------------------------------------


def _report_lines(report: CheckReport, directory: str | None, tabular: bool) -> Iterator[str]:
    for problem in report.problems:
        if tabular:
            yield str(problem)
        else:
            head = {"dir": directory} if directory is not None else {}
            yield _json(
                head | {
                    "kind": problem.kind,
                    "file": str(problem.file),
                    "position": problem.position,
                    "offset": problem.offset,
                    "reason": problem.reason,
                    "fixed": problem.fixed,
                    "resume": problem.resume,
                }
            )
    if tabular:
        verdict = "ok" if report.ok else f"{counted(len(report.remaining), 'problem')} left"
        checked = f"{counted(report.segments, 'segment')}, {counted(report.messages, 'message')}"
        yield f"{report.path}: {verdict}; {checked} checked"


@cli.command("check")
@click.argument("directory", metavar="DIR", type=DirectoryPath())
@click.option("--repair", is_flag=True,
              help="Cut a torn or damaged tail of the last segment as a writer would (the bytes are "
              "kept under DIR/cut/), rebuild stale or missing indexes, and remove indexes of deleted segments "
              "and the temporary files of killed processes. Damage elsewhere is only reported.")
@click.option("--format", "fmt", type=_FORMAT_AUTO, default="auto", show_default=True,
              help="table for people, jsonl for programs; auto: table on a terminal, else jsonl.")
@click.pass_context
def check_command(ctx: click.Context, directory: Path, repair: bool, fmt: str) -> None:
    """Read every message and sparse index of the journal at DIR (or of each shard of a root).

    Prints one problem per line (as JSON lines: kind, file, position, offset, reason, fixed, and
    resume: where whole messages start again after damage that stays, which a queue can skip to
    with `queue skip`).
    Exit status 0 when no problem is left, 1 otherwise. Kinds: segment (damage inside a segment,
    never cut), tail (the end of the last segment, where a writer would cut), index (a missing or
    stale sparse index, sej writes none, so a journal written by sej has them missing until
    repaired; or one left after its segment was deleted, or a killed rebuild's temporary file),
    journal (segments whose offsets do not follow on), offset (a reader offset file that cannot
    be read, which `offset --set` mends; or a killed commit's temporary file). While a writer
    appends, the message being written may show as an incomplete tail.
    """
    tabular = _tabular(fmt)
    ok = True
    for name, path in _journals_at(directory):
        report = _check(name, path, repair)
        ok = ok and report.ok
        for line in _report_lines(report, name, tabular):
            click.echo(line)
    ctx.exit(0 if ok else 1)


# -- demo -------------------------------------------------------------------------------------


@cli.command()
@click.option("--data", "data", type=DirectoryPath(), default=Path("data"), show_default=True,
              help="Data directory; the demo's journal is DATA/demo.")
@click.option("--messages", type=click.IntRange(min=1, max=1_000_000), default=5000, show_default=True,
              help="How many messages to write.")
def demo(data: Path, messages: int) -> None:
    """Write a journal, follow it from a second reader, seek into it and commit a reader offset.

    Runs in a few seconds; running it again appends to the same journal.
    """
    from journalq.cli.demo import run_demo

    for line in run_demo(data / "demo", messages):
        click.echo(line)


from journalq.cli.hub import hub  # noqa: E402
from journalq.cli.pipeline import pipeline  # noqa: E402
from journalq.cli.queue import queue  # noqa: E402
from journalq.cli.serve import serve  # noqa: E402 - last: it imports this module's helpers

cli.add_command(hub)
cli.add_command(pipeline)
cli.add_command(queue)
cli.add_command(serve)

if __name__ == "__main__":  # pragma: no cover
    main()
