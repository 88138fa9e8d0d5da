"""/v1/events: the merged event stream as a cursor-based long poll."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from ...models.errors import STORE_ROUTES, responses
from ...models.events import EventPage

router = APIRouter(tags=["events"], responses=STORE_ROUTES)


@router.get("/v1/events", response_model=EventPage,
            responses=responses(s400="invalid_argument: since or wait_s below 0, wait_s NaN or infinite, "
                                     "limit outside 1..500, or a query parameter it does not take"),
            summary="listEvents: events after `since`; waits up to `wait_s` when there are none.")
async def list_events(request: Request,
                      since: int = Query(0, description="next_cursor of the previous page; 0: from the start. One "
                                                    "beyond the newest event is read as the newest."),
                      wait_s: float = Query(0, description="Seconds to wait when nothing is newer (at most 60)."),
                      limit: int = Query(100, description="Events per page, 1 to 500.")) -> JSONResponse:
    return JSONResponse(await request.app.state.ctl.events.list(since, wait_s, limit))
