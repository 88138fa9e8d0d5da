"""An event loop whose clock does not count the time this process did not run.

Every limit a controller or agent puts on a peer (an agent's answer, a QMP greeting, a
move's copy step, a keep-alive) is a timer on its event loop's clock, the monotonic clock,
which goes on while the process is stopped (SIGSTOP, its VM paused or live-migrated, a
debugger, a machine starved). A process that resumes after a limit's time finds the peer's
answer and the limit's timer due in the same turn of the loop: the answer is read, and the
timer's cancel lands on it (review 36: a controller stopped ~10 s with a registration's probe,
a move's start or a copy step out failed them as "did not answer within 10 s" though the
agent had answered in a second, and an agent's sleep was ``sleep_failed``: "no greeting"
from a QEMU that had greeted).

So the loop's clock (``loop.time()``) is the monotonic clock less the time the loop lost:
a gap of more than ``STALL_S`` between two looks at the clock with no wait in ``select``
between them (the loop looks before each wait, to time it), or a wait that overran its
timeout by more than ``STALL_S``, is counted whole as lost (the process did not run, or a
callback held the loop that long: either way nothing that came could be read). Each timer
then comes due that much later: a limit is time this process ran. A peer that really does
not answer is still cut, after its limit of run time. Code outside the loop (threads,
``time.monotonic()`` deadlines) is not affected; the loop's own time is what ``asyncio``
uses for every ``call_later``, ``wait_for`` and ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

STALL_S = 1.0  # a wait overran its timeout, or a turn of the loop took, this long: the process did not run

T = TypeVar("T")


class _Clock:
    """The monotonic clock less the time lost to stalls. A stall is seen at the first look at
    the clock after it (the loop reads its clock before each wait, to time the wait): a gap
    of more than ``STALL_S`` since the last look with no wait in between, or a wait that
    overran its timeout by more than ``STALL_S``, is counted whole as lost."""

    def __init__(self):
        self.lost = 0.0  # seconds the loop did not run, summed
        self.stalls = 0
        self._seen = time.monotonic()  # the last look at the clock, or the end of the last wait
        self._last = 0.0  # the latest time told (never told going back)

    def now(self) -> float:
        self._look(time.monotonic())
        return self._told()

    def _told(self) -> float:
        self._last = max(self._last, time.monotonic() - self.lost)
        return self._last

    def _look(self, raw: float) -> None:
        if raw - self._seen > STALL_S:
            self._lose(raw - self._seen)
        self._seen = raw

    def waiting(self) -> float:
        """A wait begins: its start (monotonic)."""
        start = time.monotonic()
        self._look(start)
        return start

    def waited(self, start: float, timeout: float | None) -> None:
        """A wait that began at ``start`` with ``timeout`` returned."""
        end = time.monotonic()
        if timeout is not None and end - start > timeout + STALL_S:
            self._lose(end - start)
        self._seen = end

    def _lose(self, took: float) -> None:
        self.lost += took
        self.stalls += 1


class _Selector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    def __init__(self, clock: _Clock):
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None):
        start = self.clock.waiting()
        try:
            return super().select(timeout)
        finally:
            self.clock.waited(start, timeout)


class StallAwareLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` leaves out the time the process did not run."""

    def __init__(self):
        self.clock = _Clock()
        super().__init__(_Selector(self.clock))

    def time(self) -> float:
        return self.clock.now()


def ran() -> float:
    """The running loop's clock: on a ``StallAwareLoop``, the time this process ran (a
    deadline set and checked by it counts no stall); on another loop, the monotonic clock."""
    return asyncio.get_running_loop().time()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a ``StallAwareLoop``: how a controller and an agent serve."""
    def loop() -> StallAwareLoop:
        made = StallAwareLoop()
        asyncio.set_event_loop(made)  # (as asyncio.run does: code asking for the thread's loop finds it)
        return made

    try:
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(main)
    finally:
        asyncio.set_event_loop(None)
