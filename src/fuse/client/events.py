"""client.events: the merged event stream (cursor-based long poll)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Iterator

from ._core import Call


def _cursor(page: dict, since: int) -> int:
    """The page's cursor: `next_cursor`, or `next` from a controller that
    predates it."""
    return page.get("next_cursor", page.get("next", since))


class EventsAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def list(self, since: int = 0, wait_s: float = 0, limit: int = 100) -> dict:
        """`{"events": [...], "next_cursor": cursor, "next": cursor}` (the same
        cursor under both names); waits up to `wait_s` for news."""
        return self._send(Call("GET", "/v1/events", params={"since": since, "wait_s": wait_s, "limit": limit},
                               timeout=wait_s + 30))

    def follow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None) -> Iterator[dict]:
        """Yield events as they come, resuming from the cursor (sync client)."""
        n = 0
        while max_events is None or n < max_events:
            page = self.list(since, wait_s)
            for e in page["events"]:
                yield e
                n += 1
                if max_events is not None and n >= max_events:
                    return
            since = _cursor(page, since)

    async def afollow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None) -> AsyncIterator[dict]:
        """`follow` for the async client."""
        n = 0
        while max_events is None or n < max_events:
            page = await self.list(since, wait_s)
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
