"""``journalq serve``: the HTTP server (mq's REST API and the Amazon SQS protocol) on a data directory."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import click

from journalq.cli.data import DATA
from journalq.cli.main import CommandError
from journalq.journal.sync import SyncPolicy


def _credentials(pairs: tuple[str, ...]) -> dict[str, str]:
    credentials = {}
    for pair in pairs:
        key, sep, secret = pair.partition(":")
        if not sep or not key or not secret:
            raise CommandError(f"--aws-key takes ACCESS_KEY_ID:SECRET, not {pair!r}")
        credentials[key] = secret
    return credentials


@click.command()
@click.option("--data", type=DATA, default=Path("data"), show_default=True, envvar="JOURNALQ_DATA",
              help="The data directory (created when missing), or zk://host:port[,host:port]/path.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the data directory.")
@click.option("--sync", default="always", show_default=True,
              help="none, always or group:Nms: 'always' answers only once data is on stable storage.")
@click.option("--token", envvar="JOURNALQ_TOKEN", default=None,
              help="Bearer token the REST API requires (env JOURNALQ_TOKEN).")
@click.option("--aws-key", "aws_keys", multiple=True, envvar="JOURNALQ_AWS_KEYS",
              help="ACCESS_KEY_ID:SECRET that SigV4 signatures of the SQS API must match (repeatable).")
@click.option("--max-message-size", type=click.IntRange(1, 64 * 1024 * 1024), default=1024 * 1024, show_default=True,
              help="Largest message body of the REST API, in bytes.")
def serve(data: Path | str, host: str, port: int, workers: int, sync: str, token: str | None,
          aws_keys: tuple[str, ...], max_message_size: int) -> None:
    """Serve mq's REST API and the Amazon SQS JSON protocol (POST /) over DIR's queues.

    Shuts down cleanly on SIGTERM and SIGINT: requests under way finish, journals are synced and
    closed.
    """
    import uvicorn

    from journalq.server.app import create_app
    from journalq.server.config import ENVIRONMENT_VARIABLE, ServerConfig

    SyncPolicy.parse(sync)  # a bad policy fails here, in one line
    config = ServerConfig(
        data=data, host=host, port=port, workers=workers, sync=sync, rest_token=token,
        aws_credentials=_credentials(aws_keys), max_message_size=max_message_size,
        max_request_size=max(2 * 1024 * 1024, 2 * max_message_size),
    )
    if isinstance(data, Path):
        data.mkdir(parents=True, exist_ok=True)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    server_log = logging.getLogger("journalq.server")
    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    server_log.propagate = False
    options = dict(
        host=host,
        port=port,
        log_level="warning",
        timeout_keep_alive=5,  # idle connections do not hold the server
        limit_concurrency=4096,
        h11_max_incomplete_event_size=64 * 1024,  # headers that never end are cut off
        timeout_graceful_shutdown=30,
    )
    # Uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler it
    # found: with the default one the process would die of it (exit status 143) after a clean
    # shutdown. Exit 0 instead, as on SIGINT.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    if workers == 1:
        uvicorn.run(create_app(config), **options)
    else:
        # The worker processes log nothing at INFO (this handler is not theirs): the start line
        # comes from here, once.
        from journalq import __version__

        server_log.info("journalq %s serving %s on http://%s:%d (sync=%s, workers=%d)",
                        __version__, data, host, port, sync, workers)
        os.environ[ENVIRONMENT_VARIABLE] = config.to_environment()
        uvicorn.run("journalq.server.app:app_from_environment", factory=True, workers=workers, **options)


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)
