"""client.pool: the elastic pool (seed 001). `cloud_plan` today; the
machine-adding, budget and prewarm methods come with the pool issue."""

from __future__ import annotations

from typing import Any, Callable

from ..models.pool import ElasticPlan, ElasticPlanRequest
from ._core import Call, model


class PoolAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def cloud_plan(self, request: ElasticPlanRequest) -> ElasticPlan:
        """Where VMs would go (own hosts first, then running cloud hosts with
        room, then new machines at least cost) and what it costs. Buys nothing."""
        return self._send(Call("POST", "/v1/pool/plan", body=request, parse=model(ElasticPlan), timeout=120))
