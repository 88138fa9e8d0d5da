"""An event loop whose clock does not count the time this process did not run.

Every limit a controller or agent puts on a peer (an agent's answer, a QMP greeting, a
move's copy step, a keep-alive) is a timer on its event loop's clock, the monotonic clock,
which goes on while the process is stopped (SIGSTOP, a debugger, its VM paused, a machine
starved). A process that resumes after a limit's time finds the peer's answer and the
limit's timer due in the same turn of the loop: the answer is read, and the timer's cancel
lands on it (review 36: a controller stopped ~10 s with a registration's probe, a move's
start or a copy step out failed them as "did not answer within 10 s" though the agent had
answered in a second, and an agent's sleep was ``sleep_failed``: "no greeting" from a QEMU
that had greeted).

So the loop's clock (``loop.time()``) is the monotonic clock less the time the process lost:
- a stop: the process is sent SIGCONT as it resumes, and its handler counts the time since
  the loop was last seen running (its last look at the clock, or the start of the wait it
  was in) as lost;
- a wait in ``select`` that overran its timeout by more than ``STALL_S`` (the process was not
  run though it had nothing else to do: its VM paused, a machine starved) is counted whole.
A callback that holds the loop is not a stall: the process ran, and timers are as late as
its turn made them (counting such turns as lost kept every timer from coming due while they
followed each other: the diff review). Each timer comes due that much later: a limit is time
this process ran. A peer that really does not answer is still cut, after its limit of run
time. Code outside the loop (threads, ``time.monotonic()`` deadlines) is not affected; the
loop's own time is what ``asyncio`` uses for every ``call_later``, ``wait_for`` and
``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import selectors
import signal
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

STALL_S = 1.0  # a wait that overran its timeout this long: the process was not run

T = TypeVar("T")


class _Clock:
    """The monotonic clock less the time lost to stops and stalls (see the module doc)."""

    def __init__(self):
        self.lost = 0.0  # seconds the loop did not run, summed
        self.stalls = 0
        self._seen = time.monotonic()  # the loop last seen running: a look at the clock, a wait's end
        self._wait: float | None = None  # the start of the wait in select the loop is in, if any
        self._stopped_in_wait = False  # a SIGCONT came during that wait (counted already)
        self._last = 0.0  # the latest time told (never told going back)

    def now(self) -> float:
        raw = time.monotonic()
        self._seen = raw
        self._last = max(self._last, raw - self.lost)
        return self._last

    def resumed(self) -> None:
        """SIGCONT: the process was stopped since the loop was last seen running."""
        raw = time.monotonic()
        since = self._wait if self._wait is not None else self._seen
        self._lose(raw - since)
        self._seen = raw
        if self._wait is not None:
            self._stopped_in_wait = True

    def waiting(self) -> float:
        """A wait begins: its start (monotonic)."""
        self._wait = start = time.monotonic()
        self._stopped_in_wait = False
        return start

    def waited(self, start: float, timeout: float | None) -> None:
        """A wait that began at ``start`` with ``timeout`` returned."""
        end = time.monotonic()
        if not self._stopped_in_wait and timeout is not None and end - start > timeout + STALL_S:
            self._lose(end - start)
        self._wait, self._seen = None, end

    def _lose(self, took: float) -> None:
        if took > 0:
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
    """``asyncio.run(main)`` on a ``StallAwareLoop``: how a controller and an agent serve.
    In the main thread it takes SIGCONT (a stopped process resuming) for the loop's clock."""
    made: list[StallAwareLoop] = []

    def loop() -> StallAwareLoop:
        made.append(StallAwareLoop())
        asyncio.set_event_loop(made[0])  # (as asyncio.run does: code asking for the thread's loop finds it)
        return made[0]

    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGCONT) if main_thread else None
    if main_thread:  # (a Python handler runs in the main thread as it resumes, before the loop goes on)
        signal.signal(signal.SIGCONT, lambda *_: made and made[0].clock.resumed())
    try:
        with asyncio.Runner(loop_factory=loop) as runner:
            return runner.run(main)
    finally:
        asyncio.set_event_loop(None)
        if main_thread:
            signal.signal(signal.SIGCONT, before if before is not None else signal.SIG_DFL)
