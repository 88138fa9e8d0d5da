"""VM records on the wire: the host API's body and replies (the controller
reuses ``CreateVmRequest`` and adds an optional ``host``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional

from pydantic import Field

from .base import Record

VmState = Literal["creating", "running", "sleeping", "exited", "failed", "deleted", "incoming"]
# DNS-label-like: names become directory names and QEMU -name values.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


class VmShape(Record):
    """What a VM asks for. Memory is the hard limit on a host; vCPUs are
    time-shared and only rank hosts."""

    vcpus: int = Field(ge=1, le=64)
    mem_mib: int = Field(ge=64, le=1_048_576)


class CreateVmRequest(Record):
    """``POST /v1/host/vms``. A missing name gets a generated one."""

    name: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    shape: VmShape
    entry: str = Field(min_length=1)
    bundle: Optional[str] = "linux"


class StateFile(Record):
    """One file of a sleeping VM's saved state."""

    name: str
    size: int
    sha256: str


class Vm(Record):
    """A VM on one host."""

    name: str
    state: VmState
    shape: VmShape
    entry: str
    bundle: str
    bundle_fingerprint: str
    created_at: datetime
    updated_at: Optional[datetime] = None
    exit_status: Optional[int] = None
    reason: Optional[str] = None  # why it failed, when it did
    move_id: Optional[str] = None  # set while a move owns this copy
    move_role: Optional[Literal["source", "target"]] = None  # which end of that move
    # Memory a sleeping copy keeps: ``reserved`` on a copy that arrived by a
    # move (so the wake completing it cannot be refused), ``return_room`` on
    # the source copy of a VM that was running (so a failed move can always
    # wake it back home).
    reserved: bool = False
    return_room: bool = False
    pid: Optional[int] = None
    platform: dict[str, Any] = Field(default_factory=dict)
    files: list[StateFile] = Field(default_factory=list)
    history: list[dict[str, Any]] = Field(default_factory=list)


class SleepRequest(Record):
    """``POST /v1/host/vms/{name}/sleep``: a move marks the copy it sleeps."""

    move_id: Optional[str] = None


class WakeRequest(Record):
    """``POST /v1/host/vms/{name}/wake``. A marked VM wakes only for its own
    move; ``clear_mark`` drops the mark (same move id) without waking;
    ``if_marked`` acts only on a VM this move holds (else replies with the VM
    as it is), after any sleep or wake under way on it has finished."""

    move_id: Optional[str] = None
    clear_mark: bool = False
    if_marked: bool = False


class IncomingVm(Record):
    name: str = Field(pattern=NAME_PATTERN)
    shape: VmShape
    entry: str
    bundle: str = "linux"
    bundle_fingerprint: str
    created_at: Optional[datetime] = None


class IncomingRequest(Record):
    """``POST /v1/host/incoming``: the receiving side of a move."""

    move_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    vm: IncomingVm
    platform: dict[str, Any]
    files: list[StateFile] = Field(min_length=1)


class Incoming(Record):
    move_id: str
    name: str
    state: Literal["receiving", "installed"]
    files: list[StateFile]
    received_bytes: int
    total_bytes: int
    created_at: datetime


class ConsoleChunk(Record):
    text: str
    offset: int
    next_offset: int


class PlacedVm(Vm):
    """A VM through the controller: the host's record, tagged with the host it is on."""

    host: str


class PlacedVmList(Record):
    vms: list[PlacedVm]
