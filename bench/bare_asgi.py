"""The ceiling of the server benchmark: an ASGI app that answers every request at once (201,
no body, nothing read or stored), under uvicorn with the settings ``journalq serve`` uses
(httptools with journalq's head limit, uvloop, no access log). What it serves per second under
the benchmark's load is the most any ASGI app under this uvicorn can serve on this machine
(journalq's direct path for sends skips the ASGI layer, so it is not bound by it).

    python bench/bare_asgi.py PORT
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from journalq.server.protocol import HeadLimitedHttpToolsProtocol


async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
              send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                http=HeadLimitedHttpToolsProtocol, timeout_keep_alive=5, h11_max_incomplete_event_size=64 * 1024)
