"""client.events: the merged event stream (cursor-based long poll)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, AsyncIterator, Callable, Iterator

from ._core import UNREACHABLE, ApiError, Call

RECONNECT_S = 30.0  # how long `follow` keeps trying a controller that does not answer
FIRST_PAUSE_S, LAST_PAUSE_S = 0.25, 2.0  # its pauses between tries double from the first to the last


def _cursor(page: dict, since: int) -> int:
    """The page's cursor: `next_cursor`, or `next` from a controller that
    predates it."""
    return page.get("next_cursor", page.get("next", since))


class _Reconnect:
    """When a follow that lost the controller tries again: after pauses that
    double, for as long as the failures in a row last under `limit_s`
    (`follow`, which `fuse controller events` uses)."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.failing_since: float | None = None
        self.pause_s = FIRST_PAUSE_S

    def pause(self, err: ApiError) -> float | None:
        """Seconds to wait before the next try, or None: give `err` up."""
        if err.code != UNREACHABLE:
            return None
        now = time.monotonic()
        self.failing_since = self.failing_since if self.failing_since is not None else now
        left = self.limit_s - (now - self.failing_since)
        if left <= 0:
            return None
        pause, self.pause_s = min(self.pause_s, left), min(self.pause_s * 2, LAST_PAUSE_S)
        return pause

    def answered(self) -> None:
        self.failing_since, self.pause_s = None, FIRST_PAUSE_S


class EventsAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def list(self, since: int = 0, wait_s: float = 0, limit: int = 100) -> dict:
        """`{"events": [...], "next_cursor": cursor, "next": cursor}` (the same
        cursor under both names); waits up to `wait_s` for news."""
        # (a wait_s that is no number, NaN say, is the controller's to refuse, with its 400:
        # it must not become a timeout that is no number either)
        wait = wait_s if math.isfinite(wait_s) else 0
        return self._send(Call("GET", "/v1/events", params={"since": since, "wait_s": wait_s, "limit": limit},
                               timeout=max(wait, 0) + 30))

    def follow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None,
               reconnect_s: float = RECONNECT_S) -> Iterator[dict]:
        """Yield events as they come, resuming from the cursor (sync client).
        A controller that stops answering (restarted, say) is tried again,
        from the last cursor, until it has failed for `reconnect_s` seconds
        in a row; then its `ApiError` (code "unreachable") is raised."""
        n, retry = 0, _Reconnect(reconnect_s)
        while max_events is None or n < max_events:
            try:
                page = self.list(since, wait_s)
            except ApiError as err:
                if (pause := retry.pause(err)) is None:
                    raise
                time.sleep(pause)
                continue
            retry.answered()
            for e in page["events"]:
                yield e
                n += 1
                if max_events is not None and n >= max_events:
                    return
            since = _cursor(page, since)

    async def afollow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None,
                      reconnect_s: float = RECONNECT_S) -> AsyncIterator[dict]:
        """`follow` for the async client."""
        n, retry = 0, _Reconnect(reconnect_s)
        while max_events is None or n < max_events:
            try:
                page = await self.list(since, wait_s)
            except ApiError as err:
                if (pause := retry.pause(err)) is None:
                    raise
                await asyncio.sleep(pause)
                continue
            retry.answered()
            for e in page["events"]:
                yield e
                n += 1
                if max_events is not None and n >= max_events:
                    return
            since = _cursor(page, since)


class AsyncEventsAPI(EventsAPI):
    """The async client's events: `list` returns an awaitable, so `follow`
    is the async iterator (`async for e in client.events.follow(...)`);
    `afollow` stays as the same thing under its older name."""

    follow = EventsAPI.afollow  # type: ignore[assignment]
