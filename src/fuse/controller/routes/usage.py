"""/v1/usage: metering summed across the fleet."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Query, Request

router = APIRouter(tags=["usage"])


@router.get("/v1/usage", summary="getUsage: per-VM rows tagged with host, exact totals, unreachable hosts.")
async def get_usage(request: Request, from_: Optional[str] = Query(None, alias="from"), to: Optional[str] = None) -> dict:
    return await request.app.state.ctl.usage.usage(from_, to)
