"""Host registry records (seed 000), wire-compatible with folsom-fuse."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Optional, get_args

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from .base import Asked, Record

HostState = Literal["active", "cordoned", "draining"]
BACKENDS = ("firecracker", "qemu")


class GPUDevice(Record):
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    memory_mb: int = 0
    driver_version: str = ""
    cuda_version: str = ""
    compute_cap: str = ""
    mig_capable: bool = False
    mig_mode: str = ""
    iommu_group: str = ""


class MIGInstance(Record):
    uuid: str = ""
    profile: str = ""
    kind: str = ""
    parent_gpu_uuid: str = ""


MAX_AMOUNT = 2**53  # the largest capacity figure a host may declare


class HostCapacity(Asked):
    """A host's resource envelope. On `capacity`, cpus/ram_mb/storage_gb left
    at 0 are probed; vm_count is policy and always declared."""

    # (at most 2^53: a JSON number any client reads exactly; a 20-digit ram_mb was stored
    # and then overflowed placement's 64-bit arrays, a 500 on every create in the fleet)
    cpus: int = Field(default=0, le=MAX_AMOUNT)
    ram_mb: int = Field(default=0, le=MAX_AMOUNT)
    storage_gb: int = Field(default=0, le=MAX_AMOUNT)
    vm_count: int = Field(default=0, le=MAX_AMOUNT)
    arch: str = ""
    gpus: int = Field(default=0, le=MAX_AMOUNT)
    gpu_kind: str = ""
    mig_profiles: Optional[dict[str, int]] = None
    mig_instances: list[MIGInstance] = Field(default_factory=list)
    mig_instance_uuids: list[str] = Field(default_factory=list)
    gpu_devices: list[GPUDevice] = Field(default_factory=list)
    # Probed at registration only; a declared value is ignored.
    firecracker: str = ""
    firecracker_pinned: str = ""

    @field_validator("cpus", "ram_mb", "storage_gb", "vm_count", "gpus", mode="before")
    @classmethod
    def _a_number(cls, v):
        """A figure is a whole number: `True`, "3" or 2.0 is refused where the record is made
        (the SDK's, before anything is sent), as the REST API refuses them, never read as 1, 3
        or 2."""
        if isinstance(v, (bool, str, float)):
            raise PydanticCustomError("int_type", "Input should be a valid integer")  # (the REST API's words)
        return v

    @field_validator("mig_profiles", mode="before")
    @classmethod
    def _counts(cls, v):
        """Each MIG profile's count is a whole number too (``True`` or ``"2"`` was read as 1 or
        2 by the SDK and sent, where the REST API refuses them)."""
        if isinstance(v, dict):
            for count in v.values():
                if isinstance(count, (bool, str, float)):
                    raise PydanticCustomError("int_type", "Input should be a valid integer")
        return v


# (said, not checked here: the registry refuses an empty one in its own words, naming the
# field as the caller spelt it, and the SDK builds requests with this record)
NOT_EMPTY = {"minLength": 1}


class RegisterHostRequest(Asked):
    id: str = Field(json_schema_extra=NOT_EMPTY)
    url: str = Field(json_schema_extra=NOT_EMPTY)
    token: Optional[str] = None
    region: Optional[str] = None
    backend: Optional[str] = None
    labels: Optional[dict[str, str]] = None
    capacity: HostCapacity = Field(default_factory=HostCapacity)


class Host(Record):
    """The controller's view of a registered host. The agent token is stored
    but never part of this record."""

    id: str = ""
    url: str = ""
    region: str = ""
    # (one of HostState's in the document, read as any string: an SDK parses a newer
    # controller's host in a state this release does not know)
    state: str = Field("active", json_schema_extra={"enum": list(get_args(HostState))})
    backend: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    capacity: HostCapacity = Field(default_factory=HostCapacity)
    allocated: HostCapacity = Field(default_factory=HostCapacity)
    last_seen: Optional[datetime] = None
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    # Only ever populated on the response to register.
    warnings: list[str] = Field(default_factory=list)
    # Live view from the controller's poller (fuse extension; ignored by
    # folsom-fuse): whether the host answers, and its free room.
    connected: bool = False
    free_vcpus: int = 0
    free_mem_mib: int = 0
    # VMs placement would still start there: its vm_count policy less the VMs of the whole
    # machine (every name it is registered under), and within its agent's own --max-vms;
    # below 0 when the machine holds more than that (a limit lowered since). None: a
    # controller older than the field did not say
    free_vm_slots: Optional[int] = None
    memory_pressure: bool = False
    platform: str = ""
    bundles: list[dict] = Field(default_factory=list)
    agent_id: str = ""


class HostPage(Record):
    hosts: list[Host] = Field(default_factory=list)
    next_cursor: Optional[str] = None
