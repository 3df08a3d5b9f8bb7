"""Uvicorn's httptools protocol with a limit on the request head.

httptools keeps a header line that has not ended in memory however long it grows (a 13 MB header
line was taken whole), and uvicorn sets no limit on it (only its h11 protocol has one,
``h11_max_incomplete_event_size``). This protocol answers 431 and closes the connection once a
request's head (request line and headers) passes the limit that uvicorn gives its h11 protocol
(``h11_max_incomplete_event_size``), so that both protocols take the same heads.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_MAX_HEAD = 16 * 1024
"""The limit when uvicorn's configuration gives none (h11's default)."""


class HeadLimitedHttpToolsProtocol(HttpToolsProtocol):
    """Counts the bytes of each request's head as they arrive and refuses it past the limit.

    The parser's callbacks do not say where in a chunk a head began, so only chunks that fall
    whole inside one head are counted: a head is refused at most one chunk (one socket read)
    past the limit, and never before it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._heads_begun = 0
        self._head_bytes = 0
        self.max_head: int = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_HEAD

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._heads_begun += 1
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        begun = self._heads_begun
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if begun == self._heads_begun:  # this whole chunk is part of the head under way
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._refuse_head()

    def _refuse_head(self) -> None:
        message = f"the request head (request line and headers) is over {self.max_head} bytes".encode()
        self.logger.warning("request refused: its head is over %d bytes", self.max_head)
        parts = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        for name, value in self.server_state.default_headers:
            parts += [name, b": ", value, b"\r\n"]
        parts += [
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(message)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            message,
        ]
        self.transport.write(b"".join(parts))
        self.transport.close()


__all__ = ["DEFAULT_MAX_HEAD", "HeadLimitedHttpToolsProtocol"]
