"""fuse: a self-hosted control plane for fleets of microVM hosts.

    import fuse
    client = fuse.Client("unix:///run/fuse-controller.sock")
    host = client.hosts.register(fuse.RegisterHostRequest(
        id="prod-east-1", url="http://10.0.0.5:8090", token=agent_token,
        capacity=fuse.HostCapacity(vm_count=20)))
"""

import importlib
import warnings
from typing import TYPE_CHECKING

# asyncssh (the SSH transport) still names DSA keys, which cryptography 51 deprecates with a
# warning at import: five lines on stderr before every CLI command's one-line answer. fuse
# never uses DSA; the warning is not ours to show.
warnings.filterwarnings("ignore", message=r"DSA is deprecated", module=r"asyncssh(\.|$)")

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .client import ApiError, AsyncClient, Client, is_conflict, is_invalid_argument, is_not_found
    from .models.hosts import GPUDevice, Host, HostCapacity, HostPage, MIGInstance, RegisterHostRequest
    from .models.pool import (ElasticAssignment, ElasticBudget, ElasticBudgetUpdate, ElasticDecision,
                              ElasticHost, ElasticNewHost, ElasticPlan, ElasticPlanRequest, ElasticRemoved,
                              ElasticUnplaced, Prewarm, PrewarmOptions, PrewarmPlacement)

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

# Lazy exports: `fuse host relay` runs once per SSH channel and must start
# fast, so importing the package does not pull in httpx and pydantic.
_HOMES = {"fuse.client": ("ApiError", "AsyncClient", "Client", "is_conflict", "is_invalid_argument", "is_not_found"),
          "fuse.models.hosts": ("GPUDevice", "Host", "HostCapacity", "HostPage", "MIGInstance", "RegisterHostRequest")}
_HOME = {name: mod for mod, names in _HOMES.items() for name in names}


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'fuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME.get(name, "fuse.models.pool")), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
