"""The watchdog of body deadlines: late awaits are cancelled and told apart from other cancellations;
a body timeout that is no time limit is refused."""

from __future__ import annotations

import asyncio
import math

import pytest

from journalq.errors import InvalidSettingError
from journalq.server.app import create_app
from journalq.server.config import ServerConfig
from journalq.server.deadlines import Deadlines


def test_a_late_await_is_cancelled_and_told_apart() -> None:
    async def main() -> tuple[str, str, str]:
        deadlines = Deadlines(0.05)
        watchdog = asyncio.get_running_loop().create_task(deadlines.run())

        async def wait(seconds: float) -> str:
            task = deadlines.start()
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                if deadlines.expired(task):
                    await asyncio.sleep(0)  # uncancelled: the task goes on
                    return "late"
                raise
            finally:
                deadlines.stop(task)
            await asyncio.sleep(0.1)  # past the deadline, but stopped: not cancelled
            return "in time"

        slow = asyncio.ensure_future(wait(5))
        quick = asyncio.ensure_future(wait(0))
        other = asyncio.ensure_future(wait(5))
        await asyncio.sleep(0.01)
        other.cancel()  # a cancellation of another kind goes through
        results = await asyncio.gather(slow, quick, other, return_exceptions=True)
        watchdog.cancel()
        return tuple("cancelled" if isinstance(r, asyncio.CancelledError) else r for r in results)  # type: ignore[return-value]

    assert asyncio.run(main()) == ("late", "in time", "cancelled")


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf])
def test_a_body_timeout_that_is_no_time_limit_is_refused(seconds: float) -> None:
    """A timeout of 0 (or less) made the watchdog's period 0: it spun the event loop at full CPU
    for the server's life; NaN never expired. Refused at once, naming the setting."""
    with pytest.raises(InvalidSettingError, match="body timeout"):
        Deadlines(seconds)
    with pytest.raises(InvalidSettingError, match="body timeout"):
        create_app(ServerConfig(body_timeout=seconds))
