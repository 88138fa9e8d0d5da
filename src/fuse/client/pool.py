"""client.pool: the elastic pool and prewarm (seed 001), with the seed's method names.

Every method answers at once with the records below; on ``AsyncClient`` each
returns an awaitable. Errors are ``fuse.ApiError`` (``budget_exceeded``,
``fleet_full``, ``cloud_error``, ``invalid_argument``...).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

from ..models.pool import (ElasticBudget, ElasticBudgetUpdate, ElasticDecision, ElasticHost, ElasticPlan,
                           ElasticPlanRequest, ElasticRemoved, Prewarm, PrewarmOptions)
from ._core import Call, model, model_list, none, path, record, record_list

# Every pool call waits on the pool (a cloud's API, a plan's solve, a controller busy
# buying): as long as its work may take, not the client's timeout (README)
POOL_TIMEOUT = 600.0


class PoolAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = lambda call: send(replace(call, timeout=POOL_TIMEOUT))  # (every pool call: above)

    def cloud_plan(self, request: ElasticPlanRequest) -> ElasticPlan:
        """Where VMs would go (own hosts first, then running cloud hosts with
        room, then new machines at least cost) and what it costs. With
        ``apply``, it adds the machines (create the VMs with on auto)."""
        return self._send(Call("POST", "/v1/pool/plan", body=request, parse=model(ElasticPlan)))

    def cloud_hosts(self, include_gone: bool = False) -> list[ElasticHost]:
        """The hosts the elastic pool added in the linked clouds, with their cost
        (``include_gone``: the terminated ones too)."""
        return self._send(Call("GET", "/v1/pool/hosts", params={"all": "true"} if include_gone else None,
                               parse=model_list(ElasticHost, "hosts")))

    def cloud_add_host(self, provider: str, instance_type: str, region: Optional[str] = None,
                       count: Optional[int] = None, ttl_hours: Optional[int] = None) -> list[ElasticHost]:
        """Add ``count`` hosts of ``instance_type`` by hand (the scaler never removes
        them); each ends at its TTL (default 24 h)."""
        body = {"provider": provider, "instance_type": instance_type, "region": region, "count": count,
                "ttl_hours": ttl_hours}
        return self._send(Call("POST", "/v1/pool/hosts", body={k: v for k, v in body.items() if v is not None},
                               parse=model_list(ElasticHost, "hosts")))

    def cloud_remove_host(self, names: list[str]) -> ElasticRemoved:
        """Remove hosts this pool added (a host with VMs is refused, in ``failed``).
        One name alone is taken as a list of one."""
        names = [names] if isinstance(names, str) else list(names)
        return self._send(Call("POST", "/v1/pool/hosts/remove", body={"names": names},
                               parse=model(ElasticRemoved)))

    def cloud_budget(self, update: Optional[ElasticBudgetUpdate | dict] = None) -> ElasticBudget:
        """The budget and autoscale switch, after setting the fields ``update`` gives
        (a record, or a dict of its fields, which the controller checks)."""
        if update is None or not (update if isinstance(update, dict) else update.model_dump(exclude_none=True)):
            return self._send(Call("GET", "/v1/pool/budget", parse=model(ElasticBudget)))
        return self._send(Call("PATCH", "/v1/pool/budget", body=update, parse=model(ElasticBudget)))

    def cloud_reconcile(self) -> list[ElasticDecision]:
        """One scale-in pass now: idle hosts go at the end of their paid time, the
        least-used one is cordoned when the others have room."""
        return self._send(Call("POST", "/v1/pool/reconcile", parse=model_list(ElasticDecision, "decisions")))

    def prewarm(self, image: str, options: Optional[PrewarmOptions | dict] = None) -> Prewarm:
        """Keep VMs of ``image`` ready where the elastic pool puts them, so the next
        creates of that shape start in a fraction of a second. Refused (and
        nothing bought) when the budget or pins cannot fit it. ``options``: a
        record, or a dict of its fields, which the controller checks."""
        if isinstance(options, dict):
            body = dict(options) | {"image": image}
        else:
            body = (options or PrewarmOptions()).model_dump(mode="json", exclude_none=True) | {"image": image}
        return self._send(Call("POST", "/v1/prewarms", body=body, parse=model(Prewarm)))

    def prewarms(self) -> list[Prewarm]:
        """The prewarms, with how many each keeps ready now."""
        return self._send(Call("GET", "/v1/prewarms", parse=model_list(Prewarm, "prewarms")))

    def remove_prewarm(self, id: str) -> bool:
        """End prewarm ``id`` (its ready VMs go). False: no such prewarm."""
        return self._send(Call("DELETE", path("/v1/prewarms", id), parse=lambda r: none(r) or True, not_found=False))

    # ---- linked clouds (not in the seed: how a cloud gets linked is fuse's own) ----
    def clouds(self) -> list[dict]:
        """The linked clouds: name, kind, options (secrets left out) and machine types."""
        return self._send(Call("GET", "/v1/pool/clouds", parse=record_list("clouds", "name", "kind")))

    def link_cloud(self, name: str, kind: str, options: Optional[dict] = None) -> dict:
        """Link (or re-link) cloud ``name`` of ``kind`` (``aws`` or ``local``) with ``options``."""
        return self._send(Call("PUT", path("/v1/pool/clouds", name), body={"kind": kind, "options": options or {}},
                               parse=record("name", "kind")))

    def unlink_cloud(self, name: str) -> None:
        """Forget cloud ``name`` (refused while it has hosts)."""
        return self._send(Call("DELETE", path("/v1/pool/clouds", name), parse=none))
