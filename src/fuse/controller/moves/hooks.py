"""Test hooks in a move's path, each switched on by an environment variable.

End-to-end tests run a real controller process; these let them crash it, lose a
host's reply or hold the move at a named point of a move (``sleeping``,
``slept``, ``copied``, ``chunk:N``, ``installed``, ``woke``, ``removed``), so every
step's recovery is exercised against real hosts. Unset, each is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os

from ...errors import HostUnreachable

log = logging.getLogger("fuse.controller.hooks")


def crash_point(point: str) -> None:
    """Test hook: FUSE_TEST_CRASH_AT=<point> kills the controller right there
    (no clean-up), so tests can restart it at every step of a move."""
    if os.environ.get("FUSE_TEST_CRASH_AT") == point:
        os._exit(137)


def fail_point(point: str) -> None:
    """Test hook: FUSE_TEST_FAIL_AT=<point> makes the step right there fail as
    if a host's reply were lost (the host did the work; the controller does
    not know it)."""
    if os.environ.get("FUSE_TEST_FAIL_AT") == point:
        raise HostUnreachable(f"test hook: the reply at {point} was lost")


async def pause_point(point: str) -> None:
    """Test hook: FUSE_TEST_PAUSE_AT=<point>:<seconds> holds the move there
    while the rest of the controller (pollers, API) carries on; the log says when it
    holds (a test acts then, not a guessed while after)."""
    where, _, secs = os.environ.get("FUSE_TEST_PAUSE_AT", "").partition(":")
    if where == point:
        log.warning("test hook: held at %s for %g s", point, float(secs or 1))
        await asyncio.sleep(float(secs or 1))
