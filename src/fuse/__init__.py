"""fuse: a self-hosted control plane for fleets of microVM hosts.

    import fuse
    client = fuse.Client("unix:///run/fuse-controller.sock")
    host = client.hosts.register(fuse.RegisterHostRequest(
        id="prod-east-1", url="http://10.0.0.5:8090", token=agent_token,
        capacity=fuse.HostCapacity(vm_count=20)))
"""

from .client import ApiError, AsyncClient, Client, is_conflict, is_invalid_argument, is_not_found
from .models.hosts import GPUDevice, Host, HostCapacity, HostPage, MIGInstance, RegisterHostRequest
from .models.pool import (ElasticAssignment, ElasticBudget, ElasticBudgetUpdate, ElasticDecision, ElasticHost,
                          ElasticNewHost, ElasticPlan, ElasticPlanRequest, ElasticRemoved, ElasticUnplaced, Prewarm,
                          PrewarmOptions, PrewarmPlacement)

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ElasticAssignment",
    "ElasticBudget",
    "ElasticBudgetUpdate",
    "ElasticDecision",
    "ElasticHost",
    "ElasticNewHost",
    "ElasticPlan",
    "ElasticPlanRequest",
    "ElasticRemoved",
    "ElasticUnplaced",
    "GPUDevice",
    "Host",
    "HostCapacity",
    "HostPage",
    "MIGInstance",
    "Prewarm",
    "PrewarmOptions",
    "PrewarmPlacement",
    "RegisterHostRequest",
    "is_conflict",
    "is_invalid_argument",
    "is_not_found",
]
