"""Ending background tasks for sure.

A service's loops (the pool's passes, the fleet's pollers, the agent's monitor)
run until their service closes and cancels them. One cancel is not always
enough on Python 3.11: ``asyncio.wait_for`` drops a cancellation that arrives in
the same turn of the event loop as the result it waits for (CPython gh-86296,
fixed in 3.12), and the loop then goes on with its next pass, its ``close``
waiting for it for good (a controller's stop hung, a CI run timed out on it).
``cancel_and_wait`` cancels again until the task has ended; ``wait_event`` is
the waits' own form that never drops one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

RECANCEL_S = 0.5  # how long a cancelled task has to end before it is cancelled again


async def cancel_and_wait(tasks: Iterable[asyncio.Future], limit: float | None = None) -> set[asyncio.Future]:
    """Cancel ``tasks`` and wait until each has ended, cancelling those still
    running every RECANCEL_S; ``limit`` seconds at most when given. The tasks
    still running then (none without a limit)."""
    tasks = list(tasks)  # (read twice: an iterator given would be spent by the first)
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    while pending:
        for t in pending:
            t.cancel()
        wait = RECANCEL_S if deadline is None else min(RECANCEL_S, deadline - loop.time())
        if wait <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=wait)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # (retrieved: an error a closing loop ended with is not logged as never read)
    return pending


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds have passed: True when
    it was set. A cancellation always goes through (``asyncio.timeout`` counts
    cancellations; ``wait_for`` on 3.11 may drop one)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    return event.is_set()
