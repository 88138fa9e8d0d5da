"""The host's event log: every VM transition and host action, with
increasing ids, persisted as JSON lines so ids keep increasing across agent
restarts and a controller can resume with ``since``.

A page (``GET /v1/host/events``) is ``{"events": [...], "next": id,
"last_id": id}``; pass ``next`` as the next ``since``. As in the
controller's merged stream (``fuse.controller.events``), a ``since`` beyond
the newest id (one no page gave: another agent's log, or made up) is read as
the newest: the poll waits as any other for events after it, and the cursor
handed back is a real one.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from ..paths import private_dir, private_opener

MAX_LIMIT = 500
MAX_WAIT_S = 60.0  # a long poll's wait, at most (a longer one is cut to this, a negative one is none)
# The in-memory window; older events stay on disk but are not served (a
# controller polls every second, far behind this).
KEEP = 20_000


class EventLog:
    """Append-only events ``{id, time, type, vm?, ...}``; ``list(since)``
    returns those with a larger id."""

    def __init__(self, path: Path):
        self.path = path
        self._events: list[dict[str, Any]] = []
        self._next = 1
        # Python >= 3.10 events bind to a loop only when awaited.
        self._changed = asyncio.Event()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    self._events.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line from a crash
            if self._events:
                self._next = self._events[-1]["id"] + 1
            self._events = self._events[-KEEP:]
        private_dir(path.parent)
        self._file = open(path, "a", buffering=1, opener=private_opener)  # 0600 whatever the umask

    @property
    def last_id(self) -> int:
        return self._next - 1

    def emit(self, type: str, vm: str | None = None, **data: Any) -> dict[str, Any]:
        """Record an event now and wake long-pollers."""
        event = {"id": self._next, "time": round(time.time(), 6), "type": type}
        if vm is not None:
            event["vm"] = vm
        event.update(data)
        self._next += 1
        self._events.append(event)
        if len(self._events) > 2 * KEEP:
            del self._events[:-KEEP]
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._changed.set()
        self._changed = asyncio.Event()
        return event

    def list(self, since: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Events with ``id > since``, oldest first, at most ``limit`` (≤ 500)."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        if since < 0:
            raise InvalidArgument("since must be >= 0")
        # ids are dense and increasing: find the start by offset, not a scan.
        first = self._events[0]["id"] if self._events else self._next
        start = max(0, since + 1 - first)
        return self._events[start:start + limit]

    async def wait(self, since: int, timeout: float) -> None:
        """Return when an event newer than ``since`` exists, or after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.last_id <= since and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return

    async def page(self, since: int = 0, limit: int = 100, wait_s: float = 0) -> dict[str, Any]:
        """Events after ``since`` (waiting up to ``wait_s`` seconds for one
        when there are none, at most MAX_WAIT_S) and the cursor to pass next;
        see the module doc. A wait that is no number of seconds (NaN,
        infinity) is refused, as the controller's merged stream refuses it."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        if since < 0:
            raise InvalidArgument("since must be >= 0")
        if not math.isfinite(wait_s):
            raise InvalidArgument("wait_s must be a number of seconds")
        wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
        since = min(since, self.last_id)  # a cursor from beyond: the newest
        await self.wait(since, wait_s)
        items = self.list(since, limit)
        return {"events": items, "next": items[-1]["id"] if items else since, "last_id": self.last_id}

    def close(self) -> None:
        self._file.close()

