"""/v1/events: the merged event stream as a cursor-based long poll."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from ...models.errors import STORE_ROUTES, responses
from ...models.events import EventPage
from ..events import MAX_LIMIT, MAX_WAIT_S

router = APIRouter(tags=["events"], responses=STORE_ROUTES)

# The limits below are the service's (``EventService.list``), which refuses a value past them in
# its own words: the document states them (json_schema_extra), and does not check them first.


@router.get("/v1/events", response_model=EventPage,
            responses=responses(s400="invalid_argument: since or wait_s below 0, wait_s NaN or infinite, "
                                     "limit outside 1..500, or a query parameter it does not take"),
            summary="listEvents: events after `since`; waits up to `wait_s` when there are none.")
async def list_events(request: Request,
                      since: int = Query(0, json_schema_extra={"minimum": 0},
                                         description="next_cursor of the previous page; 0: from the start. One "
                                                     "beyond the newest event is read as the newest."),
                      wait_s: float = Query(0, json_schema_extra={"minimum": 0},
                                            description=f"Seconds to wait when nothing is newer; more than "
                                                        f"{MAX_WAIT_S:g} is read as {MAX_WAIT_S:g}."),
                      limit: int = Query(100, json_schema_extra={"minimum": 1, "maximum": MAX_LIMIT},
                                         description=f"Events per page, 1 to {MAX_LIMIT}.")) -> JSONResponse:
    return JSONResponse(await request.app.state.ctl.events.list(since, wait_s, limit))
