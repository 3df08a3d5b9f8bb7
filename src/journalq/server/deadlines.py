"""Time limits on awaits, watched by one task instead of a timer per request.

``asyncio.timeout`` arms and cancels a timer for every request that reads a body, about 4 µs of
CPU each time; nearly every body is there already when it is read. Here a request notes its task
and deadline in a dict (well under a µs), and one watchdog task looks at the dict a few times a
second and cancels the tasks past their deadline: a limit of T seconds is enforced within T plus
the watchdog's period.
"""

from __future__ import annotations

import asyncio

from journalq.queue.settings import check_number

MIN_SECONDS = 0.001
"""The shortest limit taken (the watchdog looks every tenth of it)."""


class Deadlines:
    """``task = deadlines.start()`` before the awaits to limit, ``deadlines.stop(task)`` after
    (in a ``finally``); a task that the watchdog cancelled gets ``CancelledError`` in its await,
    and ``deadlines.expired(task)`` tells that cancellation from any other (and takes it back).
    ``run()`` is the watchdog: a task for the application's life."""

    def __init__(self, seconds: float) -> None:
        # 0 or less made the watchdog's period 0 (the loop spun for good), NaN never expired:
        # refused, as is infinity (no limit is no watchdog).
        self.seconds = check_number("the body timeout", seconds, MIN_SECONDS)
        self.period = min(1.0, self.seconds / 10)
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()

    def start(self) -> asyncio.Task[object]:
        task = asyncio.current_task()
        assert task is not None, "Deadlines.start() outside a task"
        self._due[task] = task.get_loop().time() + self.seconds
        return task

    def stop(self, task: asyncio.Task[object]) -> None:
        self._due.pop(task, None)
        self._expired.discard(task)

    def expired(self, task: asyncio.Task[object]) -> bool:
        """Whether the watchdog cancelled ``task``; if so, the cancellation is taken back (the
        task goes on, to answer that it took too long)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period)
            now = loop.time()
            late = [task for task, due in self._due.items() if due <= now]
            for task in late:
                # Still in the dict: still suspended in an await between start() and stop(),
                # for the watchdog runs on the same loop.
                del self._due[task]
                self._expired.add(task)
                task.cancel()
