"""Uvicorn's h11 protocol, which ``journalq serve`` runs when httptools is missing, telling the
application when the server begins to stop, as journalq's httptools protocol does: long polls
(REST's ``wait``, SQS's ``WaitTimeSeconds``) end within a second with no message, instead of
holding the stop for the rest of their wait (up to an hour) and then being cut off by uvicorn's
graceful-shutdown timeout."""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

from journalq.server.polling import stop_long_polls


class StoppingH11Protocol(H11Protocol):
    def shutdown(self) -> None:
        # uvicorn calls this on every connection once the server begins to stop, then waits for
        # the requests under way (see ``DirectHttpToolsProtocol.shutdown``).
        stop_long_polls(self.app)
        super().shutdown()


__all__ = ["StoppingH11Protocol"]
