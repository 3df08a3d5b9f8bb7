"""``journalq serve``: the HTTP server (mq's REST API and the Amazon SQS protocol) on a data directory."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from journalq.cli.data import DATA
from journalq.cli.main import TEXT, CommandError
from journalq.cli.queue import producer_gc_option, producer_gc_options
from journalq.closing import raise_open_files_limit
from journalq.errors import InvalidSettingError
from journalq.journal.sync import SyncPolicy

if TYPE_CHECKING:
    from journalq.server.config import ServerConfig

BACKLOG = 2048
"""Connections the system holds for the server until it accepts them (uvicorn's default)."""

CONNECTION_LIMIT = 4096
"""Requests (and connections) the server takes at once; past it, 503 with Retry-After (``polling.busy``)."""


def _credentials(pairs: tuple[str, ...]) -> dict[str, str]:
    credentials = {}
    for pair in pairs:
        key, sep, secret = pair.partition(":")
        if not sep or not key or not secret:
            raise CommandError(f"--aws-key takes ACCESS_KEY_ID:SECRET, not {pair!r}")
        credentials[key] = secret
    return credentials


def checked_token(token: str | None, guarded: str = "REST API") -> str | None:
    """``--token`` as given, refused when it is empty or holds a space or control character: an
    empty ``$TOKEN`` would guard the API with the token ``Bearer `` (anyone's), and the others
    cannot be sent as they are in an ``Authorization`` header. ``guarded``: what the token guards,
    for the error."""
    if token is not None and (not token or any(c.isspace() or not c.isprintable() for c in token)):
        raise CommandError("--token is empty or holds a space or control character: give a token, "
                           f"or leave --token out for an open {guarded}")
    return token


@click.command()
@click.option("--data", type=DATA, default=Path("data"), show_default=True, envvar="JOURNALQ_DATA",
              help="The data directory (created when missing), or zk://host:port[,host:port]/path.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the data directory; /metrics adds up all of theirs.")
@click.option("--sync", default="always", show_default=True,
              help="none, always or group:Nms: 'always' answers only once data is on stable storage.")
@click.option("--token", envvar="JOURNALQ_TOKEN", default=None,
              help="Bearer token the REST API requires (env JOURNALQ_TOKEN).")
@click.option("--aws-key", "aws_keys", type=TEXT, multiple=True, envvar="JOURNALQ_AWS_KEYS",
              help="ACCESS_KEY_ID:SECRET that SigV4 signatures of the SQS API must match (repeatable).")
@click.option("--max-message-size", type=click.IntRange(1, 64 * 1024 * 1024), default=1024 * 1024, show_default=True,
              help="Largest message of the REST API and of the SQS protocol (its body and attributes), in bytes.")
@click.option("--zk-session-timeout", "session_timeout", type=float, default=None,
              metavar="SECONDS",
              help="With --data zk://...: the ZooKeeper session timeout, how long a request waits for an ensemble "
                   "out of reach before its 503 (and how soon a dead consumer's tasks come back).  [default: 10]")
@producer_gc_option
def serve(data: Path | str, host: str, port: int, workers: int, sync: str, token: str | None,
          aws_keys: tuple[str, ...], max_message_size: int, session_timeout: float | None,
          producer_gc: bool | None) -> None:
    """Serve mq's REST API and the Amazon SQS JSON protocol (POST /) over DIR's queues.

    Shuts down cleanly on SIGTERM and SIGINT: requests under way finish, journals are synced and
    closed.
    """
    # prometheus_client picks its mode from the environment once, when it is imported (just
    # below): a PROMETHEUS_MULTIPROC_DIR of the caller's would turn one process's metrics into
    # files, or mix another run's files into this one's (--workers makes a directory of its own).
    for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        os.environ.pop(name, None)
    import uvicorn

    from journalq.server.app import create_app, settle_heap
    from journalq.server.config import ENVIRONMENT_VARIABLE, ServerConfig
    from journalq.server.metrics import WorkerSupervisor, worker_metrics_directory
    from journalq.server.stopping import GracefulServer

    SyncPolicy.parse(sync)  # a bad policy fails here, in one line
    producer_gc_options(data, producer_gc)  # refused with a directory, in the flag's words
    try:
        config = ServerConfig(
            data=data, host=host, port=port, workers=workers, sync=sync, rest_token=checked_token(token),
            aws_credentials=_credentials(aws_keys), max_message_size=max_message_size,
            max_request_size=max(2 * 1024 * 1024, 2 * max_message_size), session_timeout=session_timeout,
            producer_gc=producer_gc,
        )
    except InvalidSettingError as exc:  # (the one setting ServerConfig checks itself)
        raise CommandError(f"--zk-session-timeout {session_timeout:g}: {exc}") from None
    if isinstance(data, Path):
        ready_directory(data, "--data")
    else:
        reach_store(config)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    server_log = logging.getLogger("journalq.server")
    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    server_log.propagate = False
    options: dict[str, Any] = dict(
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,  # idle connections do not hold the server
        limit_concurrency=CONNECTION_LIMIT,
        # Request heads (request line and headers) that never end are cut off: h11 takes this
        # limit itself, journalq's httptools protocol takes it from here too (431).
        h11_max_incomplete_event_size=64 * 1024,
        timeout_graceful_shutdown=30,
        http=http_protocol(),
    )
    exit_cleanly_on_stop_signals()
    # Under the usual soft limit, 1024, a few hundred idle connections, which anyone can open,
    # took every descriptor well before the concurrency limit: the next clients' connections
    # were dropped unanswered. (The worker processes of --workers inherit it.)
    raise_open_files_limit()
    # Bound here, before anything starts: the start line names the port bound (with --port 0,
    # the one the system chose), and the worker processes all accept on this one socket.
    uvicorn_config = uvicorn.Config(
        "journalq.server.app:app_from_environment", factory=True, host=host, port=port, workers=workers, **options
    )
    sock = bind(host, port)
    config = dataclasses.replace(config, port=sock.getsockname()[1])
    # The server stops cleanly on SIGTERM or SIGINT, then raises the signal again with the handler
    # it found, ``_exit_cleanly``'s (exit 0); it returns by itself only when it did not start.
    if workers == 1:
        server = GracefulServer(uvicorn.Config(create_app(config), host=host, port=config.port, **options))
        settle_heap()
        server.run(sockets=[sock])
        ignore_stop_signals()
        if not server.started:
            raise SystemExit(3)  # uvicorn's startup failure status; it logged why
    else:
        # The workers' metrics add up in this directory (see journalq.server.metrics).
        with worker_metrics_directory() as metrics_directory:
            if isinstance(data, Path) and metrics_directory.resolve().is_relative_to(data.resolve()):
                raise CommandError(f"the temporary directory {metrics_directory.parent} is inside --data {data}: "
                                   "set TMPDIR to another one")
            # The worker processes log nothing at INFO (this handler is not theirs): the start
            # line comes from here, once.
            from journalq import __version__

            server_log.info("journalq %s serving %s on http://%s (sync=%s, workers=%d)",
                            __version__, data, config.address, sync, workers)
            os.environ[ENVIRONMENT_VARIABLE] = config.to_environment()
            # (It handles the stop signals itself, from when it is made: it returns once its
            # workers have stopped.)
            WorkerSupervisor(uvicorn_config, [sock], metrics_directory).run()
            ignore_stop_signals()


def ready_directory(path: Path, option: str) -> None:
    """Make the directory a server keeps its data in if it is missing, and refuse one it could
    not write to: found at the start, in one line, not at the first request that stores
    something (a 500)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # what exist_ok raises for a file
        raise CommandError(f"{option} {path} is not a directory") from None
    except OSError as exc:
        raise CommandError(f"{option} {path}: cannot make the directory: {exc.strerror or exc}") from None
    # access(2) answers for the real user, and with EROFS on a read-only file system (root too).
    if not os.access(path, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path} is not writable")


def reach_store(config: ServerConfig) -> None:
    """Open the ZooKeeper store of ``config`` once, before serving: an ensemble out of reach is
    then the one line of any command's error, where the app's start failed with uvicorn's
    traceback after kazoo's note on each reconnection attempt (quieted here, as in ``queue``)."""
    from journalq.queue import Broker
    from journalq.queue.zookeeper.layout import CLIENT_LOG

    client_log = logging.getLogger(CLIENT_LOG)
    level = client_log.level
    client_log.setLevel(logging.ERROR)
    try:
        with Broker(config.data, sync=config.sync, **config.store_options()):
            pass
    finally:
        client_log.setLevel(level)  # a server's own reconnections are worth a note


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound as uvicorn binds it; a failure is one line naming the address
    (uvicorn logs only the error, ``[Errno 98] Address already in use``, and exits 3)."""
    from journalq.server.config import address

    sock = socket.socket(family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # gaierror (an unknown host name) included
        sock.close()
        raise CommandError(f"cannot listen on {address(host, port)}: {exc.strerror or exc}") from None
    # Listening from now on: a client that comes as soon as the start line is out waits in the
    # backlog while the server (or, with --workers, each worker process) starts, not refused.
    sock.listen(BACKLOG)
    sock.set_inheritable(True)  # the worker processes of --workers accept on it
    return sock


def http_protocol() -> Any:
    """httptools (fast) with a limit on request heads, a deadline for them, idle connections
    closed, and the direct path for ``POST /{queue}/messages`` (for journalq's app); or h11 when
    httptools is missing. Either ends long polls as soon as the server begins to stop."""
    try:
        from journalq.server.protocol import DirectHttpToolsProtocol
    except ImportError:
        from journalq.server.h11_protocol import StoppingH11Protocol

        return StoppingH11Protocol
    return DirectHttpToolsProtocol


def exit_cleanly_on_stop_signals() -> None:
    """Uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again with the
    handler it found: with SIGTERM's default one the process would die of it (exit status 143)
    after a clean shutdown, and SIGINT's (KeyboardInterrupt) could come out of asyncio's own
    teardown when the signal was sent again (a stop that then hung). Exit 0 for both instead."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _exit_cleanly)


def _exit_cleanly(signum: int, frame: Any) -> None:
    ignore_stop_signals()
    raise SystemExit(0)


def ignore_stop_signals() -> None:
    """Once the server has stopped (its journals synced and closed), a SIGTERM or SIGINT sent
    again (a supervisor repeating it, say) must not turn the clean exit into death by that
    signal: at its finalization Python puts back the default action of the signals it handled."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)
