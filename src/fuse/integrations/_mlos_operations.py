"""The operations `FuseVMService` runs, and the one thread that runs them.

A provision, deprovision or deallocate is an `Operation`: a function of the
controller calls it makes, with a deadline (pollTimeout after the call that
started it) that bounds all of it. A service runs its operations one at a
time, in call order, on its `_Worker`, so a provision issued after one that
timed out never races it. mlos_bench's calls return at once with a handle (or
block on the operation's future up to its deadline), which is why the work
runs off the caller's thread at all. Nothing here knows mlos_bench or the
controller: the service hands each operation its steps.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Callable


class OperationFailed(Exception):
    """An operation reached an expected dead end (fleet_full, refused, ...)."""


class OperationTimedOut(Exception):
    """An operation passed its deadline (pollTimeout after the call that
    started it) or was abandoned by the service's exit."""


class Operation:
    """One provision, deprovision or deallocate, run on the service's worker.

    Its deadline, pollTimeout after the call that started it, bounds the whole
    of it: queued behind another, polling a VM, moving it, however many steps.
    `check` stops it between steps once the deadline has passed or the
    operation was abandoned; a controller call already sent runs to its end at
    the controller, which is why `sent` is recorded."""

    def __init__(self, kind: str, vm: str, run: Callable[["Operation"], dict], timeout: float,
                 started: float | None = None):
        self.id = uuid.uuid4().hex[:12]
        self.kind, self.vm, self.run, self.timeout = kind, vm, run, timeout
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + timeout
        self.future: Future = Future()
        self.step = "queued"
        self.sent = False  # a call that changes the VM has gone to the controller
        self.host: str | None = None  # the host the VM was last seen on
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        """A queued operation never starts; a running one stops before its next step."""
        self.future.cancel()
        self._abandoned.set()

    def check(self, step: str) -> None:
        """Before each step: stop here once abandoned or past the deadline."""
        if self._abandoned.is_set():
            raise OperationTimedOut(f"{self.kind} of vm {self.vm} was abandoned while {self.step}")
        if time.monotonic() >= self.deadline:
            raise OperationTimedOut(f"{self.kind} of vm {self.vm} did not finish within pollTimeout "
                                    f"({self.timeout:g} s); it was {self.step}")
        self.step = step

    def pause(self, interval: float) -> None:
        """Sleep between polls, never past the deadline; an abandon wakes it."""
        self._abandoned.wait(max(0.0, min(interval, self.deadline - time.monotonic())))


class _Worker:
    """One thread running operations in call order, so a provision issued
    after one that timed out never races it. A daemon thread: a controller
    call that hangs must not hold the interpreter's exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Operation | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._thread = threading.Thread(target=self._loop, name="fuse-mlos", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """An operation is queued or running (abandoned ones included: a call
        of theirs may still land)."""
        with self._lock:
            return self._outstanding > 0

    def submit(self, op: Operation) -> None:
        with self._lock:
            self._outstanding += 1
        self._queue.put(op)

    def _loop(self) -> None:
        while (op := self._queue.get()) is not None:
            try:
                if op.future.set_running_or_notify_cancel():
                    try:
                        op.check("starting")  # it may have waited past its deadline behind another
                        op.future.set_result(op.run(op))
                    except Exception as exc:  # for whoever waits on it
                        op.future.set_exception(exc)
            finally:
                with self._lock:
                    self._outstanding -= 1

    def stop(self, timeout: float) -> bool:
        """Let the current operation end and the thread exit, waiting at most
        `timeout` s; True when it did."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
