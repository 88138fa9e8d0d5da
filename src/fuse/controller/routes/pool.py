"""``POST /v1/pool/plan``: what the elastic pool would do for some VMs (seed 001 cloud_plan).

The route parses, snapshots the pool and calls the pure planner; it buys
nothing (``apply`` arrives with the provider issue). The snapshot comes from
``app.state.pool_snapshot()`` when the app provides one, else the pool is empty;
the VMs the controller records (``app.state.ctl.vms``) teach the default shape
of an image. Only the request can make a 400: a malformed snapshot is the
controller's bug and answers 500 ``internal``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from fuse.controller.pool.planner import plan
from fuse.controller.pool.request import history_from_vms, model_from_request
from fuse.errors import InvalidArgument
from fuse.models.errors import ErrorBody
from fuse.models.pool import ElasticPlan, ElasticPlanRequest

router = APIRouter(tags=["pool"])


def _history(request: Request) -> list[dict[str, Any]]:
    ctl = getattr(request.app.state, "ctl", None)
    return history_from_vms(ctl.vms.list()) if ctl is not None else []


@router.post("/v1/pool/plan", response_model=ElasticPlan, response_model_by_alias=False, operation_id="planPool",
             summary="Plan where VMs go and what it costs (nothing is bought)",
             responses={400: {"model": ErrorBody, "description": (
                 "invalid_argument: a bad request (an unknown field, a value out of range, an unknown "
                 "kind, caller, provider, region or instance_type, or apply)")}})
async def plan_pool(body: ElasticPlanRequest, request: Request) -> ElasticPlan:
    if body.apply:
        # TODO(the pool follow-up issue of issue 6): apply adds machines through providers
        raise InvalidArgument("apply is not supported yet: plan only")
    snapshot_fn = getattr(request.app.state, "pool_snapshot", None)
    snapshot = snapshot_fn() if snapshot_fn is not None else []
    if hasattr(snapshot, "__await__"):
        snapshot = await snapshot
    model = model_from_request(body, snapshot, history=_history(request))
    # the solve is CPU-bound for up to the time limit: keep the event loop free
    return await run_in_threadpool(plan, model)
