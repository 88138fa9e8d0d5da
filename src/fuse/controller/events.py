"""The merged event stream: every host's events tagged with the host, plus
the controller's own (host_added, host_removed, host_connected,
host_disconnected, placed, moves), under one cursor — the store's event id.
A page is ``{"events": [...], "next_cursor": id, "next": id}``: pass either
as the next ``since``. A ``since`` beyond the newest event (one no page gave:
another store's, or made up) is read as the newest: the poll waits as any
other for events after it, and the cursor handed back is a real one.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ..errors import InvalidArgument

MAX_LIMIT = 500
MAX_WAIT_S = 60.0


def wire(row: dict) -> dict[str, Any]:
    out = {"id": row["id"], "time": row["ts"], "type": row["type"], "host": row["host"]}
    if row.get("host_event_id") is not None:
        out["host_event_id"] = row["host_event_id"]
    out.update(row["data"] or {})
    out["id"], out["type"], out["host"] = row["id"], row["type"], row["host"]
    return out


class EventService:
    def __init__(self, ctl):
        self.ctl = ctl
        self._stopping = False

    def stop_waiting(self) -> None:
        """The controller is stopping: long polls answer with what they have now (a follower
        carries on from its cursor at the next controller) instead of holding the stop up for
        up to their wait_s (a `fuse controller events` open kept a stopping controller, its
        state dir locked, for 29 s)."""
        self._stopping = True

    async def list(self, since: int = 0, wait_s: float = 0, limit: int = 100) -> dict[str, Any]:
        if since < 0:
            raise InvalidArgument("since must be >= 0")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        if not math.isfinite(wait_s) or wait_s < 0:
            # (a NaN deadline is never reached: the poll would spin on the store forever)
            raise InvalidArgument("wait_s must be a number of seconds >= 0")
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        store = self.ctl.store
        newest = store.last_event_id()
        if since > newest:
            # A cursor no page ever gave: waiting for ids to reach it would skip
            # every event until then. Wait from the newest instead (issue 4: no
            # newer events, so it waits), and hand back a real cursor either way.
            since = newest
        while True:
            rows = store.events_after(since, limit)
            if rows or time.monotonic() >= deadline or self._stopping:
                break
            changed = self.ctl.fleet.changed if self.ctl.fleet else asyncio.Event()
            changed.clear()
            # Wake on our own news at once; poll the store too, for other replicas.
            try:
                await asyncio.wait_for(changed.wait(), timeout=min(0.25, max(0.0, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
        events = [wire(r) for r in rows]
        cursor = events[-1]["id"] if events else since
        # `next_cursor` is the name every listing cursor has (GET /v1/hosts);
        # `next` is the same value, kept for the clients written against it.
        return {"events": events, "next_cursor": cursor, "next": cursor}
