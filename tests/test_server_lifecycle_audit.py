"""Audit of the server's life cycle and waiting parts: body deadlines, group commit, long polls."""

from __future__ import annotations

import asyncio
import math

import pytest

from journalq.errors import InvalidSettingError
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.deadlines import Deadlines


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf])
def test_a_body_timeout_that_is_no_time_limit_is_refused(seconds: float) -> None:
    """A timeout of 0 (or less) made the watchdog's period 0: it spun the event loop at full CPU
    for the server's life; NaN never expired. Refused at once, naming the setting."""
    with pytest.raises(InvalidSettingError, match="body timeout"):
        Deadlines(seconds)
    with pytest.raises(InvalidSettingError, match="body timeout"):
        create_app(ServerConfig(body_timeout=seconds))

