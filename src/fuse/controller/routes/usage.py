"""/v1/usage: metering summed across the fleet."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Query, Request, Response

from ...agent.metering import exact_json
from ...models.errors import STORE_ROUTES, responses
from ...models.usage import UsageReport

router = APIRouter(tags=["usage"], responses=STORE_ROUTES)

@router.get("/v1/usage", response_model=UsageReport,
            responses=responses(s400="invalid_argument: from or to is neither unix seconds nor an ISO 8601 time, "
                                     "is outside the years 1 to 9999, or to is before from"),
            summary="getUsage: per-VM rows tagged with host, exact totals, unreachable hosts.")
async def get_usage(request: Request,
                    from_: Optional[str] = Query(None, alias="from",
                                                 description="Unix seconds or ISO 8601; default 0."),
                    to: Optional[str] = Query(None, description="Unix seconds or ISO 8601; default now.")
                    ) -> Response:
    # Exact decimals, which JSONResponse would not take (see fuse.agent.metering).
    return Response(exact_json(await request.app.state.ctl.usage.usage(from_, to)), media_type="application/json")
