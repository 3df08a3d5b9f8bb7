"""How ``journalq serve``'s server stops: every stop signal asks for the same graceful stop."""

from __future__ import annotations

from types import FrameType

import uvicorn


class GracefulServer(uvicorn.Server):
    """Uvicorn's server, except that a SIGINT sent again while it stops (Ctrl-C pressed twice) is
    not a forced exit. That cut off the requests under way (answered 500, each with a
    traceback), skipped the app's shutdown (journals neither synced nor closed) and cancelled
    its lifespan (one more traceback). Nothing needs forcing: long polls end within a second of
    the stop, slow bodies within the body timeout, and the graceful-shutdown timeout bounds the
    rest; a repeated signal, as SIGTERM's always were, asks for the stop under way."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            super().handle_exit(sig, frame)


__all__ = ["GracefulServer"]
