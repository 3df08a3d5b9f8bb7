"""``journalq queue ...``: work queues from the shell, over ``journalq.queue``.

Every subcommand takes ``--data DIR`` (the broker's data directory: ``./data``, or
``$JOURNALQ_DATA``) and ``--sync POLICY`` (``always`` by default), and prints JSON lines; ``stats``
and ``list`` print a table when stdout is a terminal. Failures are the one line
``journalq: error: ...`` of the rest of the command, usage errors included.

Only ``send`` (unless ``--no-create``) and ``create`` make a queue or the data directory; every
other subcommand refuses a queue that does not exist rather than creating it.

The commands are thin: what they know about queues comes from ``journalq.queue``; this module
parses arguments and renders results.
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import click

from journalq.cli.data import DATA
from journalq.cli.main import (
    _FORMAT_AUTO,
    SECONDS,
    TEXT,
    CommandError,
    Interrupted,
    _error_message,
    _Group,
    _json,
    _line_batches,
    _silence_stdout,
    _tabular,
)
from journalq.errors import (
    Error,
    InvalidMessageError,
    InvalidNameError,
    PartialSendError,
    QueueError,
    QueueNotFoundError,
    SettingsFileError,
    _ranges,
    format_timestamp,
)
from journalq.journal.sync import POLICY_FORMS
from journalq.queue import DEFAULT_CHANNEL, Attribute, Broker, Queue, QueueSettings, ReceivedMessage
from journalq.queue.channel import MAX_RECEIVE
from journalq.queue.settings import check_dead_letter_kinds, check_name
from journalq.queue.sharded import ShardedChannel, check_topic_name
from journalq.queue.topic import make_envelope
from journalq.queue.zookeeper.layout import CLIENT_LOG

__all__ = ["queue", "received_json"]


# -- the broker and its queues ----------------------------------------------------------------


def _broker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--data`` and ``--sync``, which every subcommand takes."""
    command = click.option(
        "--sync", default="always", show_default=True, metavar="POLICY",
        help=f"{POLICY_FORMS}: when writes reach stable storage.",
    )(command)
    return click.option(
        "--data", type=DATA, default=Path("data"), show_default=True,
        envvar="JOURNALQ_DATA", show_envvar=True, metavar="DIR",
        help="The broker's data directory, or a ZooKeeper store: zk://host:port[,host:port]/path.",
    )(command)


def producer_gc_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--zk-producer-gc/--no-zk-producer-gc``, of the commands that send (``producer_gc``)."""
    return click.option(
        "--zk-producer-gc/--no-zk-producer-gc", "producer_gc", default=None,
        help="With --data zk://...: whether sends also collect the queue's finished tasks "
             "every task_gc_interval, as zkmq's producers do (else consumers and gc do).  [default: yes]",
    )(command)


def producer_gc_options(data: Path | str, producer_gc: bool | None) -> dict[str, bool]:
    """What ``Broker(data, ...)`` takes of ``producer_gc_option`` (nothing when not given);
    ``CommandError`` when given with a data directory, whose store has no such option."""
    if producer_gc is None:
        return {}
    if isinstance(data, Path):
        flag = "--zk-producer-gc" if producer_gc else "--no-zk-producer-gc"
        raise CommandError(f"{flag} is an option of the ZooKeeper store (--data zk://...), and {data} is a directory")
    return {"producer_gc": producer_gc}


@contextmanager
def _broker(data: Path | str, sync: str, *, create: bool = False, producer_gc: bool | None = None) -> Iterator[Broker]:
    """The broker of ``data``; the directory is made only when ``create``. ``producer_gc``: the
    ZooKeeper store's ``Broker(..., producer_gc=)`` (None: its default), refused with a directory."""
    options = producer_gc_options(data, producer_gc)
    if not create and isinstance(data, Path) and not data.is_dir():
        if data.exists():
            raise CommandError(f"not a directory ({data})")  # as the commands that make one say it
        raise CommandError(f"no data directory {data} (give --data DIR or set JOURNALQ_DATA)")
    with Broker(data, sync=sync, **options) as broker:
        yield broker


def _channels(broker: Broker, name: str) -> list[str]:
    return broker.channel_names(name)  # opening nothing: a read-only data directory is listed too


def _is_queue(broker: Broker, name: str) -> bool:
    """A topic is a queue unless it has channels and none is the queue's: opening it as a queue
    would add a channel that holds back its garbage collection and gets every old message."""
    channels = _channels(broker, name)
    return not channels or DEFAULT_CHANNEL in channels


def _require(broker: Broker, name: str) -> None:
    """Refuse a name that is not an existing queue (checking the name itself first)."""
    if not broker.exists(name):
        raise QueueNotFoundError(f"no queue {name!r} in {broker.root}")
    if not _is_queue(broker, name):
        channels = ", ".join(_channels(broker, name))
        raise QueueError(f"{name!r} in {broker.root} is a topic with the channels {channels}, not a queue")


def _queue(broker: Broker, name: str) -> Queue:
    """An existing queue; never creates one."""
    _require(broker, name)
    return broker.queue(name, create=False)


def _queue_names(broker: Broker, *, damaged: bool = False) -> list[str]:
    """The queues of the data directory (not the topics with channels of their own). One whose
    settings file is damaged cannot be told from a topic, nor opened: a warning names it, and it
    is listed only when ``damaged`` (to be found, and deleted), not left to stop the others."""
    names = []
    for name in broker.names():
        try:
            check_name(name)
        except InvalidNameError:
            continue  # a directory made by hand under a name no queue can have: not one to show
        try:
            if _is_queue(broker, name):
                names.append(name)
        except SettingsFileError as exc:
            logging.getLogger("journalq.cli").warning("queue %r: %s", name, exc)
            if damaged:
                names.append(name)
    return names


# -- parameters -------------------------------------------------------------------------------


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict (the value may hold '='; a later NAME wins)."""
    out: dict[str, str] = {}
    for item in values:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise CommandError(f"{option} {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def _consumer_filters(values: tuple[str, ...]) -> dict[str, str | tuple[str, str]] | None:
    """``--filter NAME=VALUE[:at_least|:absolute]`` as the consumer filters of ``receive``."""
    if not values:
        return None
    out: dict[str, str | tuple[str, str]] = {}
    for name, value in _pairs(values, "--filter").items():
        head, colon, method = value.rpartition(":")
        if colon and method in ("at_least", "absolute"):
            out[name] = (head, method)
        else:
            out[name] = value
    return out


def _enums(values: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for name, listed in _pairs(values, "--enum").items():
        levels = listed.split(",")
        if not all(levels):
            raise CommandError(f"--enum {name}={listed}: give the values lowest first, as v1,v2,v3")
        out[name] = levels
    return out


def _json_option(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None


def _retention(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None | str:
    """``--retention-seconds``: seconds, or ``none`` to keep messages until consumed."""
    if value is None:
        return "unset"
    if value.strip().lower() == "none":
        return None
    return SECONDS.convert(value, param, ctx)


# -- output -----------------------------------------------------------------------------------


def _attribute_json(attribute: Attribute) -> dict[str, str]:
    if isinstance(attribute.value, bytes):
        return {"type": attribute.data_type, "value_b64": base64.b64encode(attribute.value).decode("ascii")}
    return {"type": attribute.data_type, "value": attribute.value}


def _attributes_of_json(text: str | None) -> dict[str, Attribute]:
    """``--attributes``: what ``receive`` prints as a message's attributes (``_attribute_json``
    of each), as attributes to send."""
    given = _json_option(text, "--attributes")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise CommandError('--attributes is a JSON object: {"NAME": {"type": TYPE, "value": TEXT}, ...} '
                           '(or "value_b64" for a Binary)')
    attributes = {}
    for name, spec in given.items():
        fields = set(spec) if isinstance(spec, dict) else set()
        if fields not in ({"type", "value"}, {"type", "value_b64"}) or not all(
            isinstance(v, str) for v in spec.values()
        ):
            raise CommandError(f'--attributes: {name!r} must be {{"type": TYPE, "value": TEXT}} or '
                               f'{{"type": TYPE, "value_b64": BASE64}}, not {json.dumps(spec)}')
        value: str | bytes = spec.get("value", "")
        if "value_b64" in spec:
            try:
                value = base64.b64decode(spec["value_b64"], validate=True)
            except ValueError:
                raise CommandError(f"--attributes: {name!r} has a value_b64 that is not base64") from None
        try:
            attributes[name] = Attribute(spec["type"], value)
        except InvalidMessageError as exc:
            raise CommandError(f"--attributes: {name!r}: {exc}") from None
    return attributes


def received_json(message: ReceivedMessage) -> dict[str, Any]:
    """A received message as ``receive`` prints it: the body as text when it is UTF-8, else as
    ``body_b64``; ``sent_at`` in RFC 3339 (UTC, nanoseconds) beside ``sent_at_ns``."""
    obj: dict[str, Any] = {"id": message.id, "receipt": message.receipt}
    try:
        obj["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        obj["body_b64"] = base64.b64encode(message.body).decode("ascii")
    obj.update(
        attributes={name: _attribute_json(a) for name, a in message.attributes.items()},
        receive_count=message.receive_count,
        sent_at=format_timestamp(message.sent_at_ns),
        sent_at_ns=message.sent_at_ns,
        group_id=message.group_id,
        dedup_id=message.dedup_id,
        filters=message.filters,
        metadata=message.metadata,
        source=message.source,
    )
    return obj


def _echo_jsonl(objects: list[dict[str, Any]]) -> None:
    if objects:
        click.echo("\n".join(_json(obj) for obj in objects))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> Iterator[str]:
    """Rows for people: the first column left-aligned, the others right-aligned; None as '-'."""
    cells = [[("-" if row[c] is None else str(row[c])) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        rest = "".join(f"  {v.rjust(w)}" for v, w in zip(values[1:], widths[1:]))
        return (first + rest).rstrip()

    yield line(columns)
    for row in cells:
        yield line(row)


def _outcomes(receipts: list[str], errors: list[Any], done: str) -> None:
    """One line per receipt, then an error when any failed."""
    _echo_jsonl([
        {"receipt": r, done: e is None} | ({"error": str(e)} if e is not None else {})
        for r, e in zip(receipts, errors)
    ])
    failed = [e for e in errors if e is not None]
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise CommandError(f"{len(failed)} of {len(receipts)} not {done}: {failed[0]}{more}")


# -- the group --------------------------------------------------------------------------------


@click.group(cls=_Group)
def queue() -> None:
    """Work queues in the data directory (--data DIR, default ./data or $JOURNALQ_DATA).

    Output is JSON lines. A receive hides each message for its visibility timeout; delete it by
    its receipt once done, or it comes back (and after --max-receive-count deliveries goes to
    the dead-letter queue).
    """
    # kazoo's note on each reconnection attempt to a ZooKeeper store (a warning of the logger the
    # store gives it) would print around the command's one-line error; errors still show, and the
    # store's own warnings.
    logging.getLogger(CLIENT_LOG).setLevel(logging.ERROR)


# -- send -------------------------------------------------------------------------------------


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.argument("body", required=False)
@click.option("--attribute", "attributes", type=TEXT, multiple=True, metavar="NAME=VALUE",
              help="A String attribute (repeatable).")
@click.option("--attributes", "typed_attributes", type=TEXT, metavar="JSON",
              help='Attributes of any type, as receive prints them: {"NAME": {"type": "Number", "value": "42"}, '
                   '"NAME2": {"type": "Binary", "value_b64": "AAE="}}.')
@click.option("--delay", type=SECONDS, metavar="SECONDS",
              help="Hide the message this long (0 to 900; default: the queue's delay).")
@click.option("--filter", "filters", type=TEXT, multiple=True, metavar="NAME=VALUE",
              help="What a consumer must offer to take the message (repeatable).")
@click.option("--dedup-id", type=TEXT, help="Deduplication id: a second send within the queue's window is dropped.")
@click.option("--group-id", type=TEXT, help="Group id: in order, none of a group out while some is in flight.")
@click.option("--metadata", type=TEXT, metavar="JSON", help="Task metadata, any JSON value.")
@click.option("--key", type=TEXT, help="Sharded queues: the key that picks the message's shard (a group id wins).")
@click.option("--no-create", is_flag=True, help="Fail when the queue does not exist (default: create it).")
@click.option("--file", "body_file", type=click.File("rb"), metavar="PATH",
              help="Send the whole of PATH (- for standard input) as one message: any bytes, newlines too.")
@producer_gc_option
@_broker_options
def send(
    name: str, body: str | None, attributes: tuple[str, ...], typed_attributes: str | None,
    delay: float | None, filters: tuple[str, ...], dedup_id: str | None, group_id: str | None,
    metadata: str | None, key: str | None, no_create: bool, body_file: BinaryIO | None, data: Path,
    sync: str, producer_gc: bool | None,
) -> None:
    """Send BODY to QUEUE; or the whole of a file as one message (--file PATH); or one message
    per line of standard input (without its newline) when neither is given. Prints {"id": ...}
    per message, in order."""
    if body is not None and body_file is not None:
        raise CommandError("give BODY or --file, not both")
    strings = _pairs(attributes, "--attribute")
    typed = _attributes_of_json(typed_attributes)
    if both := sorted(strings.keys() & typed.keys()):
        raise CommandError(f"attribute {both[0]!r} given by both --attribute and --attributes")
    options = {
        "attributes": {**typed, **strings} or None,
        "delay": delay,
        "filters": _pairs(filters, "--filter") or None,
        "dedup_id": dedup_id,
        "group_id": group_id,
        "metadata": _json_option(metadata, "--metadata"),
    }
    # Refused here what every queue refuses (a delay past 900 s, say), before the queue and the
    # data directory are made: a refused send makes neither.
    make_envelope({"body": b"", **options}, QueueSettings())
    with _broker(data, sync, create=not no_create, producer_gc=producer_gc) as broker:
        exists = broker.exists(name)
        if not exists and no_create:
            raise QueueNotFoundError(f"no queue {name!r} in {broker.root} (and --no-create)")
        if key is not None:
            # Checked before a missing queue is made (unsharded), so that a refused send makes none.
            if not exists or broker.topic(name, create=False).settings.shards == 1:
                raise CommandError(f"--key picks a shard: queue {name!r} is not sharded")
            options["key"] = key
        if not exists:
            broker.queue(name)
        topic = broker.topic(name, create=False)
        if body is not None or body_file is not None:
            whole = os.fsencode(body) if body is not None else body_file.read()  # type: ignore[union-attr]
            ids = topic.send_many([{"body": whole, **options}])
            _echo_jsonl([{"id": i} for i in ids])
            return
        unsent = 1  # the first line not sent yet
        try:
            for first, lines in _line_batches(sys.stdin.buffer):
                items = [{"body": line[:-1] if line.endswith(b"\n") else line, **options} for line in lines]
                try:
                    ids = topic.send_many(items)
                except PartialSendError as exc:  # a sharded queue, or the ZooKeeper store: part stored
                    _echo_jsonl([{"id": i} for i in exc.ids if i is not None])
                    stored = [*range(1, first), *(first + p for p, i in enumerate(exc.ids) if i is not None)]
                    raise CommandError(
                        f"{exc.cause}: lines {_ranges([first + p for p in exc.unsent])} were not sent, nor any "
                        f"from line {first + len(lines)} on (lines {_ranges(stored)} were: their ids are printed)"
                    ) from exc
                except (Error, OSError) as exc:
                    raise _not_sent(_error_message(exc), first) from exc
                unsent = first + len(lines)
                try:
                    _echo_jsonl([{"id": i} for i in ids])
                    sys.stdout.flush()
                except BrokenPipeError:  # ``| head -1``: the rest of the input is not sent, which must be said
                    _silence_stdout()
                    raise _not_sent("standard output was closed", unsent) from None
        except KeyboardInterrupt:  # Ctrl-C at a terminal: the lines typed since the last batch are not sent
            raise _not_sent("interrupted", unsent, Interrupted) from None


def _not_sent(problem: str, first: int, error: type[CommandError] = CommandError) -> CommandError:
    sent = "; the lines before it were sent" if first > 1 else ""
    return error(f"{problem}; nothing from line {first} on was sent{sent}")


# -- receive and receipts -----------------------------------------------------------------------


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.option("-n", "--max-messages", "count", type=click.IntRange(1, MAX_RECEIVE), default=1, show_default=True,
              help="Receive up to N messages.")
@click.option("--visibility-timeout", type=SECONDS, metavar="SECONDS",
              help="Hide the messages this long unless deleted (default: the queue's).")
@click.option("--wait", type=SECONDS, metavar="SECONDS",
              help="With nothing available, wait up to this long for a message (default: the queue's).")
@click.option("--filter", "filters", type=TEXT, multiple=True, metavar="NAME=VALUE[:at_least]",
              help="What this consumer offers (repeatable): a message whose filters it does not "
              "meet is left for others. at_least compares in the queue's --enum order.")
@click.option("--delete", is_flag=True, help="Delete the messages once printed (at most once delivery).")
@_broker_options
def receive(
    name: str, count: int, visibility_timeout: float | None, wait: float | None, filters: tuple[str, ...],
    delete: bool, data: Path, sync: str,
) -> None:
    """Receive messages from QUEUE: one JSON object per message with id, receipt, body (or
    body_b64 when it is not UTF-8), attributes, receive_count, sent_at, sent_at_ns, group_id,
    dedup_id, filters, metadata and source (where a dead letter came from). Prints nothing when
    no message is available."""
    wanted = _consumer_filters(filters)
    with _broker(data, sync) as broker:
        q = _queue(broker, name)
        messages = q.receive(count, visibility_timeout=visibility_timeout, wait=wait, filters=wanted)
        _echo_jsonl([received_json(m) for m in messages])
        if delete and messages:
            sys.stdout.flush()
            errors = q.delete_many([m.receipt for m in messages])
            failed = [e for e in errors if e is not None]
            if failed:
                raise CommandError(f"received {len(messages)}, but {len(failed)} could not be deleted: {failed[0]}")


@queue.command("delete")
@click.argument("name", metavar="QUEUE")
@click.argument("receipts", metavar="RECEIPT...", type=TEXT, nargs=-1, required=True)
@_broker_options
def delete_command(name: str, receipts: tuple[str, ...], data: Path, sync: str) -> None:
    """Delete the messages of these deliveries: {"receipt": ..., "deleted": true} per receipt
    (false with an error, and exit status 1, for a receipt that no longer holds its message)."""
    with _broker(data, sync) as broker:
        q = _queue(broker, name)
        _outcomes(list(receipts), q.delete_many(list(receipts)), "deleted")


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.argument("receipt", type=TEXT)
@click.option("--delay", type=SECONDS, default=0.0, show_default=True, metavar="SECONDS",
              help="Available again after this long.")
@_broker_options
def release(name: str, receipt: str, delay: float, data: Path, sync: str) -> None:
    """Give the message of this delivery back to QUEUE without finishing it."""
    with _broker(data, sync) as broker:
        _queue(broker, name).release(receipt, delay)
        _echo_jsonl([{"receipt": receipt, "released": True, "delay": delay}])


@queue.command("change-visibility")
@click.argument("name", metavar="QUEUE")
@click.argument("receipt", type=TEXT)
@click.argument("seconds", type=SECONDS)
@_broker_options
def change_visibility(name: str, receipt: str, seconds: float, data: Path, sync: str) -> None:
    """Hide the message of this delivery for SECONDS from now (0: available at once)."""
    with _broker(data, sync) as broker:
        _queue(broker, name).change_visibility(receipt, seconds)
        _echo_jsonl([{"receipt": receipt, "visibility_timeout": seconds}])


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.argument("message_id", metavar="ID", type=TEXT)
@_broker_options
def task(name: str, message_id: str, data: Path, sync: str) -> None:
    """The task state of message ID (inserted, claimed, finished or dead), with its metadata,
    receive_count, consumer (while claimed) and filters."""
    with _broker(data, sync) as broker:
        t = _queue(broker, name).task(message_id)
        _echo_jsonl([{
            "id": t.id, "state": t.state, "metadata": t.metadata, "receive_count": t.receive_count,
            "consumer": t.consumer, "filters": t.filters,
        }])


# -- queues -----------------------------------------------------------------------------------

_STATS_COLUMNS = ["name", "available", "in_flight", "delayed", "dead", "oldest_age"]


@queue.command()
@click.argument("names", metavar="[QUEUE]...", nargs=-1)
@click.option("--format", "fmt", type=_FORMAT_AUTO, default="auto", show_default=True,
              help="table for people, jsonl for programs; auto: table on a terminal, else jsonl.")
@_broker_options
def stats(names: tuple[str, ...], fmt: str, data: Path, sync: str) -> None:
    """Counts of each QUEUE (every queue when none is named): name, available, in_flight,
    delayed, dead (moved to the dead-letter queue so far), oldest_age (seconds since the
    oldest unfinished message was sent; null when none) and damage (where damage in the
    queue's journal stops its receives; null when none: `journalq check` and `queue skip` get
    past it). A table says each damage on a line of its own under it, on stderr."""
    with _broker(data, sync) as broker:
        for name in names:
            _require(broker, name)  # every name before any output
        rows = []
        for name in names or _queue_names(broker):
            try:
                s = broker.queue(name, create=False).stats()
            except OSError as exc:
                if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
                # A channel's counts are its state journal's, read under its lock, which runs the
                # maintenance due (gc, dead-letter moves): they cannot be had without writing.
                raise CommandError(
                    f"queue stats must write in {os.path.join(broker.root, name)} (it reads the queue's state "
                    f"under its locks, and runs the maintenance due), and cannot: {exc.strerror}: {exc.filename}"
                ) from None
            rows.append({
                "name": name, "available": s.available, "in_flight": s.in_flight, "delayed": s.delayed,
                "dead": s.dead, "oldest_age": None if s.oldest_age is None else round(s.oldest_age, 3),
                "damage": s.damage,
            })
    if _tabular(fmt):
        for line in _table(rows, _STATS_COLUMNS):
            click.echo(line)
        for row in rows:
            if row["damage"] is not None:
                click.echo(f"{row['name']}: stopped at damage: {row['damage']}", err=True)
    else:
        _echo_jsonl(rows)


@queue.command("list")
@click.option("--format", "fmt", type=_FORMAT_AUTO, default="auto", show_default=True,
              help="table for people, jsonl for programs; auto: table on a terminal, else jsonl.")
@_broker_options
def list_command(fmt: str, data: Path, sync: str) -> None:
    """The queues of the data directory: {"name": ...} per queue, in name order (with a warning
    for each whose queue.json is damaged, listed all the same: delete-queue removes it)."""
    with _broker(data, sync) as broker:
        names = _queue_names(broker, damaged=True)
    if _tabular(fmt):
        for name in names:
            click.echo(name)
    else:
        _echo_jsonl([{"name": n} for n in names])


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.option("--visibility-timeout", type=SECONDS, metavar="SECONDS",
              help="How long a received message stays hidden (0 to 43200; default 30).")
@click.option("--delay", type=SECONDS, metavar="SECONDS", help="Delay of every new message (0 to 900).")
@click.option("--max-receive-count", type=int, metavar="N",
              help="Deliveries after which a message goes to --dead-letter-queue (1 to 1000).")
@click.option("--dead-letter-queue", metavar="QUEUE", help="Where dead letters go (created when missing).")
@click.option("--retention-seconds", callback=_retention, metavar="SECONDS|none",
              help="Delete messages older than this, consumed or not (default 4 days; none: keep).")
@click.option("--fifo", is_flag=True, default=None, help="A FIFO queue.")
@click.option("--content-based-dedup", is_flag=True, default=None,
              help="Deduplicate by the SHA-256 of the body when no --dedup-id is given.")
@click.option("--enum", "enums", type=TEXT, multiple=True, metavar="NAME=v1,v2,v3",
              help="Ordered values of filter NAME, lowest first, for receive's at_least (repeatable).")
@click.option("--shards", type=int, metavar="N",
              help="Spread the queue over N shards (a power of two up to 1024; default 1: not sharded). "
              "Fixed at creation; the name may then hold only letters, digits, '_' and '-'.")
@_broker_options
def create(
    name: str, visibility_timeout: float | None, delay: float | None, max_receive_count: int | None,
    dead_letter_queue: str | None, retention_seconds: Any, fifo: bool | None, content_based_dedup: bool | None,
    enums: tuple[str, ...], shards: int | None, data: Path, sync: str,
) -> None:
    """Create QUEUE with these settings; prints {"name", "created", "settings"}.

    For a queue that exists already with the same settings, nothing changes ("created": false);
    with other settings, it is an error.
    """
    given: dict[str, Any] = {
        key: value for key, value in (
            ("visibility_timeout", visibility_timeout), ("delay", delay),
            ("max_receive_count", max_receive_count), ("dead_letter_queue", dead_letter_queue),
            ("fifo", fifo), ("content_based_dedup", content_based_dedup), ("shards", shards),
        ) if value is not None
    }
    if retention_seconds != "unset":
        given["retention_seconds"] = retention_seconds
    if enums:
        given["enums"] = _enums(enums)
    check_name(name)
    if dead_letter_queue == name:
        raise CommandError(f"queue {name!r} cannot be its own dead-letter queue")
    if not isinstance(data, Path) or not data.is_dir():
        # A bad setting fails before the data directory is made, and so does a FIFO queue naming
        # a dead-letter queue, which a data directory not made yet cannot hold.
        wanted = QueueSettings().replace(**given)
        check_dead_letter_kinds(name, None, wanted, lambda target: None, lambda target: [])
    with _broker(data, sync, create=True) as broker:
        if broker.exists(name):
            _require(broker, name)
            current = broker.topic(name, create=False).settings
            wanted = current.replace(**given)
            if wanted != current:
                before, after = current.to_json(), wanted.to_json()
                described = "; ".join(
                    f"{key} is {json.dumps(before[key])}, not {json.dumps(after[key])}"
                    for key in sorted(before) if before[key] != after[key]
                )
                raise QueueError(f"queue {name!r} exists already with other settings: {described}")
            created = False
        else:
            QueueSettings().replace(**given)  # a bad setting fails before anything is made
            if dead_letter_queue is not None:
                check_topic_name(dead_letter_queue)
            # The queue first: a queue refused as it is made (its name, the store) leaves no
            # dead-letter queue behind. Until that is made, dead letters would make it.
            wanted = broker.queue(name, **given).settings
            if dead_letter_queue is not None and not broker.exists(dead_letter_queue):
                broker.queue(dead_letter_queue)
            created = True
        _echo_jsonl([{"name": name, "created": created, "settings": wanted.to_json()}])


@queue.command("delete-queue")
@click.argument("name", metavar="QUEUE")
@_broker_options
def delete_queue(name: str, data: Path, sync: str) -> None:
    """Delete QUEUE and all its messages (also one whose queue.json is damaged)."""
    with _broker(data, sync) as broker:
        try:
            _require(broker, name)
        except SettingsFileError:
            pass  # it cannot be told from a topic without its settings; deleting is the way out
        broker.delete(name)
        _echo_jsonl([{"name": name, "deleted": True}])


@queue.command()
@click.argument("name", metavar="QUEUE")
@_broker_options
def purge(name: str, data: Path, sync: str) -> None:
    """Finish every message sent to QUEUE so far, in flight or not."""
    with _broker(data, sync) as broker:
        _queue(broker, name).purge()
        _echo_jsonl([{"name": name, "purged": True}])


@queue.command()
@click.argument("name", metavar="QUEUE")
@click.option("--to", "offset", type=click.IntRange(min=0), required=True, metavar="OFFSET",
              help="The first offset to keep: `journalq check` names it as resume, after damage.")
@click.option("--shard", metavar="SHARD",
              help="For a sharded queue, the shard's directory (as `check` names it): offsets are a shard's own.")
@click.option("--channel", type=TEXT, metavar="NAME",
              help="A channel of a topic with channels of its own (each skips alone; default: the queue's).")
@_broker_options
def skip(name: str, offset: int, shard: str | None, channel: str | None, data: Path, sync: str) -> None:
    """Finish every message of QUEUE below OFFSET, in flight or not; the way past damage in the
    queue's journal, which receives report once every message before it went out. Prints
    {"name", "channel", "shard", "to", "skipped"}: skipped is how many messages it finished (0
    when the queue is past OFFSET already)."""
    with _broker(data, sync) as broker:
        target = _queue(broker, name) if channel is None else _channel(broker, name, channel)
        if not hasattr(target, "skip_to"):  # (ZooKeeper's store: no journal, no offsets)
            raise CommandError(f"{name!r} is stored in ZooKeeper: it has no journal offsets to skip")
        if isinstance(target, ShardedChannel) and shard is None:
            raise CommandError(f"{name!r} is sharded: name the shard with --shard (offsets are a shard's own)")
        if not isinstance(target, ShardedChannel) and shard is not None:
            raise CommandError(f"{name!r} is not sharded: it has no shard {shard!r}")
        skipped = target.skip_to(offset) if shard is None else target.skip_to(offset, shard=shard)
        _echo_jsonl([{"name": name, "channel": target.name, "shard": shard, "to": offset, "skipped": skipped}])


def _channel(broker: Broker, name: str, channel: str) -> Any:
    """An existing channel of topic ``name`` (of a queue: ``default``); never creates one (a new
    channel would get every message of the topic)."""
    channels = _channels(broker, name)
    if channel not in channels:
        listed = ", ".join(channels) or "none yet"
        raise QueueError(f"{name!r} in {broker.root} has no channel {channel!r}: its channels are {listed}")
    if channel == DEFAULT_CHANNEL:
        return broker.queue(name, create=False)
    return broker.topic(name, create=False).channel(channel)


@queue.command()
@click.argument("name", metavar="DLQ")
@click.option("--to", "destination", metavar="QUEUE",
              help="Move every message here (default: back to the queue each came from).")
@click.option("--max", "max_messages", type=click.IntRange(min=1), metavar="N", help="Move at most N messages.")
@producer_gc_option
@_broker_options
def redrive(
    name: str, destination: str | None, max_messages: int | None, data: Path, sync: str, producer_gc: bool | None
) -> None:
    """Move the dead letters of DLQ back, oldest first; prints {"name", "to", "moved"}."""
    with _broker(data, sync, producer_gc=producer_gc) as broker:
        dlq = _queue(broker, name)
        if destination is not None:
            if destination == name:
                raise CommandError(f"--to {destination} is the dead-letter queue itself")
            _require(broker, destination)
        moved = dlq.redrive(destination, max_messages)
        _echo_jsonl([{"name": name, "to": destination, "moved": moved}])


@queue.command()
@_broker_options
def gc(data: Path, sync: str) -> None:
    """Delete the journal segments that every channel is done with, or that retention lets go,
    in every queue and topic: {"name", "deleted_files"} per queue."""
    with _broker(data, sync) as broker:
        _echo_jsonl([{"name": name, "deleted_files": count} for name, count in broker.gc().items()])
