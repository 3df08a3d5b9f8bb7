"""``journalq hub ...``: copy journals of many machines into one place (sej's hub).

``hub serve`` keeps the copies; ``hub push`` follows local journals (plain, or every shard of a
root) and copies them, showing a progress bar with rate and lag on a terminal and JSON lines
otherwise; ``hub status`` prints, per client and journal, the offsets on both sides; ``hub get``
reads messages back from the hub.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from journalq.cli.data import DirectoryPath
from journalq.cli.main import _FORMAT_AUTO, CommandError, _Group, _json, _SecondsType, _tabular, message_json
from journalq.cli.queue import _table
from journalq.cli.serve import (
    CONNECTION_LIMIT,
    _exit_cleanly,
    bind,
    checked_token,
    exit_cleanly_on_stop_signals,
    http_protocol,
    ignore_stop_signals,
    ready_directory,
)
from journalq.closing import raise_open_files_limit
from journalq.errors import HubError
from journalq.hub.client import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_CHUNK,
    HubClient,
    JournalCopy,
    Pusher,
    check_hub_url,
    sources_at,
)
from journalq.hub.protocol import check_client_id
from journalq.journal.offsets import end_offset
from journalq.journal.sync import SyncPolicy

__all__ = ["hub"]


@click.group(cls=_Group)
def hub() -> None:
    """Copy journals of many machines into one place, each under [client-id].[journal-dir]/.

    The copies are byte-identical to their sources; pushing resumes from what the hub holds, so
    either side may be stopped (or killed) at any moment.
    """


def _client_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A usage error for a client id the hub would refuse (as for any bad option)."""
    try:
        return None if value is None else check_client_id(value)
    except HubError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _hub_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A usage error for a hub URL that is not http://HOST:PORT (as for any bad option)."""
    try:
        return check_hub_url(value)
    except HubError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


# -- serve ------------------------------------------------------------------------------------


@hub.command()
@click.option("--root", type=DirectoryPath(file_okay=False), required=True,
              help="Where the copies are kept (created when missing).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8090, show_default=True)
@click.option("--sync", default="always", show_default=True,
              help="Sync policy of the copies: 'always' acknowledges a push only once it is on stable storage.")
@click.option("--max-push", type=click.IntRange(1, 1 << 31), default=64 << 20, show_default=True,
              help="Largest push body taken, in bytes.")
# 64: the app's DEFAULT_MAX_REQUESTS, written out as --max-push's default is (FastAPI is imported
# only to serve).
@click.option("--max-requests", type=click.IntRange(1, CONNECTION_LIMIT), default=64, show_default=True,
              help="Requests handled at once (each may hold a push); past it, 503 with Retry-After.")
@click.option("--token", envvar="JOURNALQ_TOKEN", default=None,
              help="Bearer token every request must carry (env JOURNALQ_TOKEN).")
def serve(root: Path, host: str, port: int, sync: str, max_push: int, max_requests: int, token: str | None) -> None:
    """Serve only the hub's endpoints (/hub/v1/...) over the copies in ROOT."""
    import uvicorn

    from journalq.server.config import address
    from journalq.server.hub import create_hub_app
    from journalq.server.stopping import GracefulServer

    SyncPolicy.parse(sync)
    token = checked_token(token, "hub")
    ready_directory(root, "--root")
    raise_open_files_limit()  # idle connections must not take every descriptor (as ``serve``)
    sock = bind(host, port)  # a port in use is one line naming it; --port 0 names the one bound
    config = uvicorn.Config(
        create_hub_app(root, sync=sync, max_push=max_push, token=token, max_requests=max_requests),
        host=host,
        port=sock.getsockname()[1],
        log_level="warning",
        timeout_keep_alive=5,
        # Connections (idle ones too: each a descriptor) are bounded as journalq serve's; past
        # it uvicorn answers 503 and closes. Requests are bounded lower, by the app (--max-requests).
        limit_concurrency=CONNECTION_LIMIT,
        timeout_graceful_shutdown=10,
        # As journalq serve: heads over 64 KiB are refused (431), slow ones too (408, after the
        # hub app's default head timeout), and idle connections are closed.
        h11_max_incomplete_event_size=64 * 1024,
        http=http_protocol(),
    )
    click.echo(f"journalq hub serving {root} on http://{address(host, config.port)} (sync={sync})", err=True)
    exit_cleanly_on_stop_signals()
    server = GracefulServer(config)  # a stop signal sent again is no forced exit
    server.run(sockets=[sock])  # a stop signal ends in _exit_cleanly's exit 0 (see journalq serve)
    ignore_stop_signals()
    if not server.started:
        raise SystemExit(3)  # uvicorn's startup failure status; it logged why


# -- push -------------------------------------------------------------------------------------

_token = click.option("--token", envvar="JOURNALQ_TOKEN", default=None,
                      help="The hub's bearer token, when it requires one (env JOURNALQ_TOKEN).")


class JsonLinesReport:
    """Events, and per journal its offsets whenever they changed, as JSON lines on stdout."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._shown: dict[str, tuple[int | None, int]] = {}

    def event(self, kind: str, copy: JournalCopy | None, **fields: Any) -> None:
        where = {"client_id": self.client_id, "journal": copy.name} if copy is not None else {}
        click.echo(_json({"event": kind, **where, **fields}))

    def progress(self, copies: list[JournalCopy], messages_per_s: float, bytes_per_s: float) -> None:
        for copy in copies:
            state = (copy.hub_next, copy.local_end)
            if self._shown.get(copy.name) == state:
                continue
            self._shown[copy.name] = state
            click.echo(_json({
                "event": "progress", "client_id": self.client_id, "journal": copy.name,
                "hub": copy.hub_next, "local": copy.local_end, "lag": copy.lag,
                "messages_per_s": round(messages_per_s, 1), "mb_per_s": round(bytes_per_s / 1e6, 3),
            }))


class BarReport:
    """A progress bar over all journals: messages the hub holds of those there are, the rate,
    and the lag (messages not copied yet). Events are printed above it."""

    def __init__(self, client_id: str, hub_url: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.client_id = client_id
        self.hub_url = hub_url
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("lag {task.fields[lag]}"),
        )
        self._task = self._progress.add_task(f"{client_id} -> {hub_url}", total=None, rate="", lag="-")
        self._progress.start()

    def event(self, kind: str, copy: JournalCopy | None, **fields: Any) -> None:
        if kind in ("error", "retry"):
            where = f"{copy.name}: " if copy is not None else ""
            self._progress.console.print(f"[{kind}] {where}{fields.get('error', '')}", markup=False)

    def progress(self, copies: list[JournalCopy], messages_per_s: float, bytes_per_s: float) -> None:
        held = sum(c.hub_next or 0 for c in copies)
        total = sum(max(c.local_end, c.hub_next or 0) for c in copies)
        lag = sum(c.lag for c in copies)
        failed = sum(1 for c in copies if c.failed is not None)
        self._progress.update(
            self._task,
            completed=held,
            total=total or None,
            description=f"{self.client_id} -> {self.hub_url} "
            f"({len(copies)} journals{f', {failed} failed' if failed else ''})",
            rate=f"{messages_per_s:,.0f} msg/s {bytes_per_s / 1e6:,.2f} MB/s",
            lag=f"{lag:,}",
        )

    def close(self) -> None:
        self._progress.stop()


@hub.command()
@click.argument("directories", metavar="DIR...", nargs=-1, required=True, type=DirectoryPath())
@click.option("--to", "url", required=True, metavar="URL", help="The hub, http://HOST:PORT.", callback=_hub_url)
@click.option("--client-id", required=True, metavar="ID", callback=_client_id,
              help="This client's id ([a-zA-Z0-9_-]+).")
@click.option("--once", is_flag=True, help="Stop once the hub holds everything (default: keep following).")
@click.option("--chunk", type=click.IntRange(64, 64 << 20), default=DEFAULT_CHUNK, show_default=True,
              help="Bytes per push (a larger message goes alone).")
@click.option("--give-up-after", type=_SecondsType(minimum=0), metavar="SECONDS",
              help="Fail once a journal's pushes have failed this long, the hub unreachable say "
                   "(default: keep retrying).")
@click.option("--parallel", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Journals pushed at a time (a root of shards has many).")
@click.option("--timeout", type=_SecondsType(minimum=0.1), default=30.0, show_default=True, metavar="SECONDS",
              help="How long to wait for an answer of the hub before retrying.")
@click.option("--check-interval", type=_SecondsType(minimum=0.1), default=DEFAULT_CHECK_INTERVAL, show_default=True,
              metavar="SECONDS",
              help="How often to ask the hub about a journal with nothing new to push (a copy it lost is copied anew).")
@click.option("--progress", "shown", type=click.Choice(["auto", "bar", "jsonl"]), default="auto", show_default=True,
              help="bar for people, jsonl for programs; auto: bar on a terminal.")
@_token
def push(directories: tuple[Path, ...], url: str, client_id: str, once: bool, chunk: int,
         give_up_after: float | None, parallel: int, timeout: float, check_interval: float, shown: str,
         token: str | None) -> None:
    """Copy the journals at DIR... to the hub and keep copying what is appended.

    DIR is a journal (copied as [client-id].[its directory name]) or a root of shards (each shard
    copied as [client-id].[shard directory name], new shards included). Connection errors and
    5xx and 408 answers are retried with backoff, resuming from what the hub holds (with --once,
    not a copy the hub says is damaged). Exit status 1 when a journal was refused (its messages
    differ from the ones the hub holds, say) or, with --once, its copy is damaged.
    """
    signal.signal(signal.SIGTERM, _exit_cleanly)
    raise_open_files_limit()  # a descriptor per journal followed: a root has up to 1024 shards
    bar = shown == "bar" or (shown == "auto" and sys.stdout.isatty())
    report: JsonLinesReport | BarReport = BarReport(client_id, url) if bar else JsonLinesReport(client_id)
    try:
        with HubClient(url, token=token, timeout=timeout) as client, Pusher(
            client, client_id, directories, chunk=chunk, reporter=report, give_up_after=give_up_after,
            parallel=parallel, check_interval=check_interval,
        ) as pusher:
            try:
                copies = pusher.run(follow=not once)
            except KeyboardInterrupt:
                copies = list(pusher.copies.values())
    finally:
        if isinstance(report, BarReport):
            report.close()
    failed = [c for c in copies if c.failed is not None]
    if failed:
        reasons = "; ".join(f"{c.name}: {c.failed}" for c in failed)
        raise CommandError(f"{len(failed)} journal(s) not copied: {reasons}")


# -- status and get -------------------------------------------------------------------------------


@hub.command()
@click.argument("directories", metavar="[DIR...]", nargs=-1, type=DirectoryPath())
@click.option("--hub", "url", required=True, metavar="URL", help="The hub, http://HOST:PORT.", callback=_hub_url)
@click.option("--client-id", metavar="ID", callback=_client_id,
              help="Only this client's journals (needed with DIR...: the client they are copied as).")
@click.option("--format", "fmt", type=_FORMAT_AUTO, default="auto", show_default=True,
              help="table for people, jsonl for programs; auto: table on a terminal, else jsonl.")
@_token
def status(directories: tuple[Path, ...], url: str, client_id: str | None, fmt: str, token: str | None) -> None:
    """Print, per client and journal, the offsets the hub holds and, for the journals at DIR...,
    the local end and the lag (messages not copied yet). A copy the hub cannot read is listed
    with the reason (``unreadable``) and named on stderr."""
    if directories and client_id is None:
        # Local journals are one client's; the hub may hold journals of their names of many.
        raise click.UsageError("DIR... are compared with the copies of one client: give its --client-id")
    local = {name: end_offset(path) for name, path in sources_at(directories)} if directories else {}
    with HubClient(url, token=token) as client:
        copies = client.status()
    if client_id is not None:
        copies = {client_id: copies.get(client_id, {})}
        if not copies[client_id]:
            click.echo(f"the hub holds no journal of client {client_id!r}", err=True)
    elif not copies:
        click.echo("the hub holds no journal", err=True)
    rows: list[dict[str, Any]] = []
    unreadable: list[str] = []
    for cid, journals in copies.items():
        for name, held in journals.items():
            end = local.get(name) if directories else None
            if held.unreadable is not None:  # its offsets are unknown, not 0
                unreadable.append(f"{cid}.{name}: {held.unreadable}")
                rows.append({"client_id": cid, "journal": name, "hub_first": None, "hub_next": None,
                             "local_next": end, "lag": None, "unreadable": held.unreadable})
                continue
            rows.append({"client_id": cid, "journal": name, "hub_first": held.first, "hub_next": held.next,
                         "local_next": end, "lag": None if end is None else max(0, end - held.next)})
    if unreadable:
        click.echo(f"the hub cannot read {len(unreadable)} copy(ies): {'; '.join(unreadable)}", err=True)
    seen = {r["journal"] for r in rows}
    for name, end in local.items():  # local journals the hub holds nothing of yet
        if name not in seen:
            rows.append({"client_id": client_id, "journal": name, "hub_first": None, "hub_next": None,
                         "local_next": end, "lag": end})
    if _tabular(fmt):
        columns = ["client_id", "journal", "hub_first", "hub_next", "local_next", "lag"]
        if unreadable:
            columns.append("unreadable")
            rows = [{"unreadable": None, **row} for row in rows]
        for line in _table(rows, columns):
            click.echo(line)
    else:
        for row in rows:
            click.echo(_json(row))


@hub.command()
@click.argument("journal")
@click.argument("offset", type=click.IntRange(0, 2**64 - 1))  # the hub's range: past it, its 422 as raw JSON
@click.option("--hub", "url", required=True, metavar="URL", help="The hub, http://HOST:PORT.", callback=_hub_url)
@click.option("--client-id", required=True, metavar="ID", callback=_client_id)
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True, help="How many messages.")
@_token
def get(journal: str, offset: int, url: str, client_id: str, count: int, token: str | None) -> None:
    """Print the messages of a client's JOURNAL on the hub from OFFSET, as JSON lines (as
    ``journalq scan`` prints them)."""
    with HubClient(url, token=token) as client:
        for message in client.get(client_id, journal, offset, count):
            click.echo(message_json(message))


