"""fuse: a self-hosted control plane for fleets of microVM hosts.

    import fuse
    client = fuse.Client("unix:///run/fuse-controller.sock")
    host = client.hosts.register(fuse.RegisterHostRequest(
        id="prod-east-1", url="http://10.0.0.5:8090", token=agent_token,
        capacity=fuse.HostCapacity(vm_count=20)))
"""

from .client import ApiError, AsyncClient, Client, is_conflict, is_invalid_argument, is_not_found
from .models.hosts import GPUDevice, Host, HostCapacity, HostPage, MIGInstance, RegisterHostRequest

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "GPUDevice",
    "Host",
    "HostCapacity",
    "HostPage",
    "MIGInstance",
    "RegisterHostRequest",
    "is_conflict",
    "is_invalid_argument",
    "is_not_found",
]
