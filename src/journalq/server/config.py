"""The server's settings: one frozen object, from the command line or the environment.

Uvicorn's worker processes (``--workers N``) import the app anew, so the settings travel to them
as JSON in the ``JOURNALQ_SERVER`` environment variable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journalq.errors import InvalidSettingError
from journalq.queue.zookeeper import check_session_timeout, is_zookeeper_url

ENVIRONMENT_VARIABLE = "JOURNALQ_SERVER"


@dataclass(frozen=True)
class ServerConfig:
    data: Path | str = Path("data")
    """A data directory, or a ZooKeeper store's ``zk://`` URL."""
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    sync: str = "always"
    """Answer only once the data is on stable storage (mq's promise); ``none`` for speed."""
    rest_token: str | None = None
    """A bearer token the REST API requires (None: the REST API is open)."""
    aws_credentials: dict[str, str] = field(default_factory=dict)
    """Access key id -> secret key: SigV4 signatures the SQS API requires (empty: open)."""
    account_id: str = "000000000000"
    region: str = "us-east-1"
    max_message_size: int = 1024 * 1024
    """Largest message the REST API and the SQS protocol take (for SQS its body and attributes,
    and a batch's total; 1 MiB, Amazon's own limit since 2025)."""
    max_request_size: int = 2 * 1024 * 1024
    """Largest request body the SQS protocol reads (``serve`` makes it twice ``max_message_size``,
    at least 2 MiB: a message's JSON escapes can make its request longer than it)."""
    body_timeout: float = 10.0
    """Seconds a client may take to send a request body before it is answered 408."""
    retry_after: int = 1
    """Seconds a 503 (storage full or failing) tells clients to wait before trying again."""
    session_timeout: float | None = None
    """The ZooKeeper store's session timeout in seconds (None: the store's default, 10)."""
    producer_gc: bool | None = None
    """Whether the ZooKeeper store's sends also collect finished tasks (None: its default, yes)."""

    def __post_init__(self) -> None:
        if self.session_timeout is not None:
            if not is_zookeeper_url(str(self.data)):
                raise InvalidSettingError(f"a session timeout is the ZooKeeper store's, and {self.data} is a directory")
            check_session_timeout(self.session_timeout, "the session timeout")
        if self.producer_gc is not None and not is_zookeeper_url(str(self.data)):
            raise InvalidSettingError(f"producer_gc is the ZooKeeper store's, and {self.data} is a directory")

    def store_options(self) -> dict[str, Any]:
        """What ``Broker(data, ...)`` takes besides ``sync``: a ZooKeeper store's session timeout
        and producer gc, when given."""
        options: dict[str, Any] = {"session_timeout": self.session_timeout, "producer_gc": self.producer_gc}
        return {name: value for name, value in options.items() if value is not None}

    @property
    def address(self) -> str:
        return address(self.host, self.port)

    def to_environment(self) -> str:
        data = dataclasses.asdict(self)
        data["data"] = str(self.data)
        return json.dumps(data)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> ServerConfig:
        raw = (os.environ if environ is None else environ).get(ENVIRONMENT_VARIABLE)
        if not raw:
            return cls()
        data: dict[str, Any] = json.loads(raw)
        data["data"] = data["data"] if is_zookeeper_url(data["data"]) else Path(data["data"])
        return cls(**data)


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (as in a URL)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
