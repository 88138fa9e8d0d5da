"""/v1/events: the merged event stream as a cursor-based long poll."""

from __future__ import annotations

from fastapi import APIRouter, Request

router = APIRouter(tags=["events"])


@router.get("/v1/events", summary="listEvents: events after `since`; waits up to `wait_s` when there are none.")
async def list_events(request: Request, since: int = 0, wait_s: float = 0, limit: int = 100) -> dict:
    return await request.app.state.ctl.events.list(since, wait_s, limit)
