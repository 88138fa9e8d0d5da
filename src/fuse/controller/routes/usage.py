"""/v1/usage: metering summed across the fleet."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Query, Request, Response

from ...agent.metering import exact_json, instant
from ...errors import InvalidArgument
from ...models.errors import responses
from ...models.usage import UsageReport

router = APIRouter(tags=["usage"])

# The times ISO 8601 can write (years 1 to 9999), as unix seconds [EARLIEST, END): the
# window is echoed as given, and a time far beyond them would come back rounded through a float.
EARLIEST, END = -62135596800, 253402300800


def _within_years(value: Optional[str], what: str) -> None:
    t = instant(value, what)
    if t is not None and not EARLIEST <= t < END:
        raise InvalidArgument(f"{what} must be a time in the years 1 to 9999 (unix seconds from {EARLIEST}, "
                              f"before {END})")


@router.get("/v1/usage", response_model=UsageReport,
            responses=responses(s400="invalid_argument: from or to is neither unix seconds nor an ISO 8601 time, "
                                     "is outside the years 1 to 9999, or to is before from"),
            summary="getUsage: per-VM rows tagged with host, exact totals, unreachable hosts.")
async def get_usage(request: Request,
                    from_: Optional[str] = Query(None, alias="from",
                                                 description="Unix seconds or ISO 8601; default 0."),
                    to: Optional[str] = Query(None, description="Unix seconds or ISO 8601; default now.")
                    ) -> Response:
    _within_years(from_, "from")
    _within_years(to, "to")
    # Exact decimals, which JSONResponse would not take (see fuse.agent.metering).
    return Response(exact_json(await request.app.state.ctl.usage.usage(from_, to)), media_type="application/json")
