"""client.events: the merged event stream (cursor-based long poll)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, AsyncIterator, Callable, Iterator

from ._core import UNREACHABLE, ApiError, Call

RECONNECT_S = 30.0  # how long `follow` keeps trying a controller that does not answer
FIRST_PAUSE_S, LAST_PAUSE_S = 0.25, 2.0  # its pauses between tries double from the first to the last
GRACE_S = 10.0  # how long past its wait_s `follow` waits for a long poll's answer
# A controller answers a long poll within this many seconds whatever wait_s asks (it waits at
# most 60 s), so no wait is longer: a wait_s of 1e10 was a timeout no socket takes
# (OverflowError), and a controller that hung was waited on for wait_s + 30 s.
SERVER_MAX_WAIT_S = 60.0
# what a follow tries again: no controller answering, or one that cannot reach its database
# for now (503: it serves again once the database is back)
RETRIED = (UNREACHABLE, "db_unavailable")
# A follow polls at most this often while nothing comes: after an empty page it waits out the
# rest of this since its poll began (none after a long poll, which took its wait_s). With a
# wait_s of 0 it asked again at once, a tight loop taking a third of a core from the
# controller for one idle follower (review 35).
MIN_POLL_S = 1.0


def _waited(wait_s: float) -> float:
    """How long a long poll asking for ``wait_s`` may wait at the controller: 0 to 60 s
    (a wait_s that is no number, NaN say, is the controller's to refuse, with its 400)."""
    return min(max(wait_s, 0), SERVER_MAX_WAIT_S) if math.isfinite(wait_s) else 0


def _idle_pause(began: float) -> float:
    """How long a follow whose poll, begun at ``began``, brought nothing waits before the next."""
    return max(MIN_POLL_S - (time.monotonic() - began), 0)


def _cursor(page: dict, since: int) -> int:
    """The page's cursor: `next_cursor`, or `next` from a controller that
    predates it."""
    return page.get("next_cursor", page.get("next", since))


# The fields the controller writes in every event (models.events.Event) and their JSON types: an
# item without them is no event (a proxy's, or no controller's), which `fuse controller events`
# met as a KeyError traceback, and printed under --json as if it were one (review 35).
EVENT_FIELDS = {"id": int, "time": (int, float), "type": str, "host": str}
MAX_SECONDS = 2.0 ** 53  # an event's time (unix seconds) past this is none a controller wrote


def _event_problem(e: Any) -> str | None:
    """What makes ``e`` no event of the API's, or None."""
    if not isinstance(e, dict):
        return f"a JSON {type(e).__name__} in the list of events, where an object goes"
    bad = [k for k, kind in EVENT_FIELDS.items()
           if not isinstance(e.get(k), kind) or isinstance(e.get(k), bool)]
    if not bad and not -MAX_SECONDS <= e["time"] <= MAX_SECONDS:  # (NaN, Infinity, 1e400: no time at all)
        bad = ["time"]
    if not bad:
        return None
    return f"an event whose {', '.join(bad)} {'field is' if len(bad) == 1 else 'fields are'} missing or no " \
           "value of the API's"


def _page(r) -> dict:
    """A page of the stream: a dict with its list of events, each one (else the answer is not the API's)."""
    page = r.json()
    if not isinstance(page, dict) or not isinstance(page.get("events"), list):
        raise ValueError("no list of events")
    for e in page["events"]:
        if why := _event_problem(e):
            raise ValueError(why)
    cursor = page.get("next_cursor", page.get("next"))  # (the next poll's since; `next` from an older controller)
    if not isinstance(cursor, int) or isinstance(cursor, bool):
        raise ValueError("no next_cursor" if cursor is None
                         else f"a JSON {type(cursor).__name__} where the next_cursor goes")
    return page


class _Reconnect:
    """When a follow that lost the controller tries again: after pauses that
    double, for as long as the failures in a row last under `limit_s`
    (`follow`, which `fuse controller events` uses)."""

    def __init__(self, limit_s: float):
        if isinstance(limit_s, bool) or not isinstance(limit_s, (int, float)) or not (
                math.isfinite(limit_s) and limit_s >= 0):
            # (nan compared false with every time gone by: a dead controller was retried for good)
            raise ValueError(f"reconnect_s must be a number of seconds, 0 or more, not {limit_s!r}")
        self.limit_s = limit_s
        self.failing_since: float | None = None
        self.pause_s = FIRST_PAUSE_S

    def pause(self, err: ApiError, due: float) -> float | None:
        """Seconds to wait before the next try, or None: give `err` up. `due`: when the
        failed try's answer was due (a long poll's start plus its wait_s): a controller
        that stopped answering has failed since then, not since the try timed out."""
        if err.code not in RETRIED:
            return None
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = min(due, now)
        left = self.limit_s - (now - self.failing_since)
        if left <= 0:
            return None
        pause, self.pause_s = min(self.pause_s, left), min(self.pause_s * 2, LAST_PAUSE_S)
        return pause

    def next_try(self, wait_s: float) -> tuple[float, float]:
        """(wait_s, timeout) for the next try: the long poll while the controller answers;
        while it does not, a short one bounded by what is left of `limit_s`."""
        if self.failing_since is None:
            return wait_s, _waited(wait_s) + GRACE_S
        left = self.limit_s - (time.monotonic() - self.failing_since)
        return 0, max(min(GRACE_S, left), 0.5)

    def answered(self) -> None:
        self.failing_since, self.pause_s = None, FIRST_PAUSE_S


class EventsAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def list(self, since: int = 0, wait_s: float = 0, limit: int = 100, timeout: float | None = None) -> dict:
        """`{"events": [...], "next_cursor": cursor, "next": cursor}` (the same
        cursor under both names); waits up to `wait_s` for news, and for the answer
        up to `timeout` seconds (default: wait_s + 30, the wait taken as at most the
        controller's 60 s)."""
        # (a wait_s that is no number must not become a timeout that is no number either)
        return self._send(Call("GET", "/v1/events", params={"since": since, "wait_s": wait_s, "limit": limit},
                               timeout=_waited(wait_s) + 30 if timeout is None else timeout, parse=_page))

    def follow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None,
               reconnect_s: float = RECONNECT_S) -> Iterator[dict]:
        """Yield events as they come, resuming from the cursor (sync client).
        A controller that stops answering (restarted, or hung) is tried again,
        from the last cursor, until it has failed for `reconnect_s` seconds
        in a row, counted from when an answer was due (a long poll's wait_s
        past its start; it is given `GRACE_S` more to answer); then its
        `ApiError` (code "unreachable") is raised. While nothing comes it
        asks at most once every `MIN_POLL_S` (1 s), whatever `wait_s`."""
        n, retry = 0, _Reconnect(reconnect_s)
        while max_events is None or n < max_events:
            wait, limit = retry.next_try(wait_s)
            began = time.monotonic()
            due = began + _waited(wait)
            try:
                page = self.list(since, wait, timeout=limit)
            except ApiError as err:
                if (pause := retry.pause(err, due)) is None:
                    raise
                time.sleep(pause)
                continue
            retry.answered()
            if not page["events"]:
                time.sleep(_idle_pause(began))
            for e in page["events"]:
                yield e
                n += 1
                if max_events is not None and n >= max_events:
                    return
            since = _cursor(page, since)


class AsyncEventsAPI(EventsAPI):
    """The async client's events: `list` returns an awaitable, so `follow`
    is the async iterator (`async for e in client.events.follow(...)`);
    `afollow` is the same thing under its older name. (Only here: the sync
    client's `list` answers at once, and it has `follow`.)"""

    async def afollow(self, since: int = 0, wait_s: float = 30, max_events: int | None = None,
                      reconnect_s: float = RECONNECT_S) -> AsyncIterator[dict]:
        """`follow` for the async client."""
        n, retry = 0, _Reconnect(reconnect_s)
        while max_events is None or n < max_events:
            wait, limit = retry.next_try(wait_s)
            began = time.monotonic()
            due = began + _waited(wait)
            try:
                page = await self.list(since, wait, timeout=limit)
            except ApiError as err:
                if (pause := retry.pause(err, due)) is None:
                    raise
                await asyncio.sleep(pause)
                continue
            retry.answered()
            if not page["events"]:
                await asyncio.sleep(_idle_pause(began))
            for e in page["events"]:
                yield e
                n += 1
                if max_events is not None and n >= max_events:
                    return
            since = _cursor(page, since)

    follow = afollow  # type: ignore[assignment]
