"""``POST /v1/pool/plan``: what the elastic pool would do for some VMs (seed 001 cloud_plan).

The route parses, snapshots the pool and calls the pure planner; it buys
nothing (``apply`` arrives with the provider issue). The snapshot comes from
``app.state.pool_snapshot()`` when the app provides one, else the pool is empty.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from fuse.controller.pool.planner import plan
from fuse.controller.pool.request import model_from_request
from fuse.errors import InvalidArgument
from fuse.models.pool import ElasticPlan, ElasticPlanRequest

router = APIRouter(tags=["pool"])


@router.post("/v1/pool/plan", response_model=ElasticPlan, operation_id="planPool",
             summary="Plan where VMs go and what it costs (nothing is bought)")
async def plan_pool(body: ElasticPlanRequest, request: Request) -> ElasticPlan:
    if body.apply:
        # TODO(the pool follow-up issue of issue 6): apply adds machines through providers
        raise InvalidArgument("apply is not supported yet: plan only")
    snapshot_fn = getattr(request.app.state, "pool_snapshot", None)
    snapshot = snapshot_fn() if snapshot_fn is not None else []
    if hasattr(snapshot, "__await__"):
        snapshot = await snapshot
    try:
        model = model_from_request(body, snapshot)
    except (ValidationError, KeyError, TypeError, ValueError) as e:
        raise InvalidArgument(f"bad plan request or pool snapshot: {e}") from e
    # the solve is CPU-bound for up to the time limit: keep the event loop free
    return await run_in_threadpool(plan, model)
