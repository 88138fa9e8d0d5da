"""The elastic pool (seed 001): plans, linked clouds, elastic hosts, budget, scale-in.

``POST /v1/pool/plan`` plans (and with ``apply`` buys); ``/v1/pool/clouds``
links clouds; ``/v1/pool/hosts`` lists, adds and removes the machines the pool
bought; ``/v1/pool/budget`` reads and sets the caps; ``/v1/pool/reconcile``
runs one scale-in pass. Routes parse and call ``ctl.pool``; a malformed pool
snapshot is the controller's bug and answers 500 ``internal``.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from fuse.models.base import Record
from fuse.models.errors import STORE_ROUTES, responses
from fuse.errors import NotFound
from fuse.models.pool import (U32, ElasticBudget, ElasticBudgetUpdate, ElasticDecision, ElasticHost, ElasticPlan,
                              ElasticPlanRequest, ElasticRemoved, Prewarm, PrewarmOptions, SeedRecord, one_spelling)

router = APIRouter(tags=["pool"], responses=STORE_ROUTES)

NO_CLOUD = ("invalid_argument: no such linked cloud, machine type or region, a bad count or ttl_hours, or a "
            "field given in both spellings")
BUDGET = ("budget_exceeded: the machines would pass a cap of the budget, or a quota or type limit of their cloud "
          "(the message names it)")
CLOUD = "cloud_error: the cloud refused or failed (its message is given)"


def _pool(request: Request):
    return request.app.state.ctl.pool


class AddHostsRequest(SeedRecord):
    """cloud_add_host: machines of one type added by hand. The seed's parameters, in either
    spelling like its records (``instance_type``/``instanceType``, ``ttl_hours``/``ttlHours``)."""
    provider: str
    instance_type: str
    region: Optional[str] = None
    # integers only (``true`` or ``"2"`` is 400 naming the field, never 1 or 2), as a plan's count
    count: Optional[int] = Field(default=None, strict=True, description="1 to 20 (default 1).")
    ttl_hours: Optional[int] = Field(default=None, strict=True, le=U32,
                                     description="Hours until it ends on its own (default 24).")

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        return one_spelling(cls, data)


class RemoveHostsRequest(Record):
    names: list[str]


class LinkCloudRequest(Record):
    kind: str = Field(description="`aws` (EC2 through boto3) or `local` (host agents started on this machine).")
    options: dict[str, Any] = Field(default_factory=dict, description=(
        "aws: region, image_id (required), endpoint_url, access_key_id, secret_access_key, key_name, "
        "security_group_ids, subnet_id, agent_port, types. local: types, region, backend, bundle_dir, vm_count. "
        "Both: quotas ({quota family: vCPUs}: aws standard, g, p...; local: its types' quota_family, default "
        "standard) and limits ({machine type: machines}), non-negative integers, counted against the "
        "machines the cloud runs already; only these two may change while the cloud has hosts."))


class Cloud(Record):
    name: str
    kind: str
    options: dict[str, Any]
    types: list[str]


class CloudList(Record):
    clouds: list[Cloud]


class ElasticHostList(Record):
    hosts: list[ElasticHost]


class DecisionList(Record):
    decisions: list[ElasticDecision]


@router.post("/v1/pool/plan", response_model=ElasticPlan, response_model_by_alias=False, operation_id="planPool",
             summary="Plan where VMs go and what it costs; with apply, add the machines it needs",
             responses=responses(
                 s400="invalid_argument: a bad request (an unknown field, a value out of range, an unknown "
                      "kind, caller, provider, region or instance_type), a pin to a linked cloud whose "
                      "machines do not get the image, or apply with no linked cloud",
                 s409=BUDGET, s502=CLOUD))
async def plan_pool(body: ElasticPlanRequest, request: Request) -> ElasticPlan:
    snapshot = request.app.state.pool_snapshot()  # the app's seam: tests give the planner a pool
    if hasattr(snapshot, "__await__"):
        snapshot = await snapshot
    return await _pool(request).plan(body, snapshot, history=request.app.state.ctl.vms.shape_history())


@router.get("/v1/pool/clouds", response_model=CloudList, summary="listClouds: the linked clouds (no secrets).")
async def list_clouds(request: Request) -> CloudList:
    return CloudList(clouds=_pool(request).clouds())


@router.put("/v1/pool/clouds/{name}", response_model=Cloud,
            responses=responses(s400="invalid_argument: a bad name, kind or option (named)",
                                s409="conflict: the cloud has hosts (their ids mean something only to the cloud "
                                     "as it was linked); remove them before re-linking it",
                                s502="cloud_error: the cloud's endpoint did not answer or refused the link "
                                     "(its reason is given)"),
            summary="linkCloud: link (or re-link) a cloud; its machine types join the plans.")
async def link_cloud(name: str, body: LinkCloudRequest, request: Request) -> Cloud:
    return Cloud(**await _pool(request).link(name, body.kind, body.options))


@router.delete("/v1/pool/clouds/{name}", status_code=204,
               responses=responses(s404="not_found: no such linked cloud",
                                   s409="conflict: the cloud still has hosts; remove them first"),
               summary="unlinkCloud: forget a cloud with no hosts left.")
async def unlink_cloud(name: str, request: Request) -> None:
    await _pool(request).unlink(name)


@router.get("/v1/pool/hosts", response_model=ElasticHostList,
            summary="listElasticHosts: the hosts the pool added, with their cost (all=true: gone ones too).")
async def list_elastic_hosts(request: Request, all: bool = False) -> ElasticHostList:
    return ElasticHostList(hosts=_pool(request).hosts(include_gone=all))


@router.post("/v1/pool/hosts", status_code=201, response_model=ElasticHostList,
             responses=responses(s400=NO_CLOUD, s409=BUDGET, s502=CLOUD),
             summary="addElasticHosts: add hosts by hand (never removed by the scaler; each ends at its TTL).")
async def add_elastic_hosts(body: AddHostsRequest, request: Request) -> ElasticHostList:
    return ElasticHostList(hosts=await _pool(request).add_hosts(
        body.provider, body.instance_type, body.region, body.count, body.ttl_hours))


@router.post("/v1/pool/hosts/remove", response_model=ElasticRemoved,
             summary="removeElasticHosts: terminate hosts the pool added (a host with VMs is refused, in failed).")
async def remove_elastic_hosts(body: RemoveHostsRequest, request: Request) -> ElasticRemoved:
    return await _pool(request).remove_hosts(body.names)


@router.get("/v1/pool/budget", response_model=ElasticBudget, summary="getBudget: the caps and what the clouds cost now.")
async def get_budget(request: Request) -> ElasticBudget:
    return _pool(request).budget()


@router.patch("/v1/pool/budget", response_model=ElasticBudget,
              responses=responses(s400="invalid_argument: a negative cap"),
              summary="updateBudget: set the fields given (0 = no cap); answers the whole budget.")
async def update_budget(body: ElasticBudgetUpdate, request: Request) -> ElasticBudget:
    return _pool(request).update_budget(body)


@router.post("/v1/pool/reconcile", response_model=DecisionList,
             summary="reconcile: one scale-in pass now (idle hosts go at the end of their paid time).")
async def reconcile(request: Request) -> DecisionList:
    return DecisionList(decisions=await _pool(request).reconcile())


class PrewarmRequest(PrewarmOptions):
    """prewarm(image, options): the options, with the image beside them."""
    image: str = Field(min_length=1, description="Image (bundle) of the VMs kept ready.")


class PrewarmList(Record):
    prewarms: list[Prewarm]


@router.post("/v1/prewarms", status_code=201, response_model=Prewarm,
             responses=responses(s400="invalid_argument: a bad option (kind other than container, vm or "
                                      "microvm; count outside 1..256; ttl_secs below 1; cpus and memory_mb, given or "
                                      "learned, not a shape a VM create takes: integers, 1..64 vCPUs, at least "
                                      "the memory floor), on host: with no machine, "
                                      "no such linked cloud, or an image no host or linked cloud has (or the "
                                      "host pinned to lacks)",
                                 s404="not_found: on host:<machine> names no registered host",
                                 s409="fleet_full: the hosts and pins cannot fit them; budget_exceeded: only the "
                                      "budget stands in the way (nothing is bought either way)",
                                 s502=CLOUD),
             summary="prewarm: keep VMs of one shape ready where the elastic pool puts them.")
async def prewarm(body: PrewarmRequest, request: Request) -> Prewarm:
    return await request.app.state.ctl.prewarm.prewarm(body.image, PrewarmOptions(**body.model_dump(exclude={"image"})))


@router.get("/v1/prewarms", response_model=PrewarmList, summary="listPrewarms: the prewarms, with how many each keeps ready.")
async def list_prewarms(request: Request) -> PrewarmList:
    return PrewarmList(prewarms=request.app.state.ctl.prewarm.list())


@router.delete("/v1/prewarms/{pw_id}", status_code=204, responses=responses(s404="not_found: no such prewarm"),
               summary="removePrewarm: end a prewarm (its ready VMs go).")
async def remove_prewarm(pw_id: str, request: Request) -> None:
    if not await request.app.state.ctl.prewarm.remove(pw_id):
        raise NotFound(f"no prewarm {pw_id}")
