"""VM records on the wire: the host API's body and replies (the controller
reuses ``CreateVmRequest`` and adds an optional ``host``).

Two shapes: ``Shape`` is what a record holds (strict integers, the hard
bounds), ``VmShape`` is what a new VM may ask for: a ``Shape`` with the memory
floor the shipped guest kernel boots in. Records keep the looser type so a VM
an older agent admitted still loads, moves and wakes.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .base import Record

VmState = Literal["creating", "running", "sleeping", "exited", "failed", "deleted", "incoming"]
# DNS-label-like: VM and bundle names become directory names and QEMU -name values.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"


# The memory floor of a new VM, from booting the shipped bundle (Debian's 6.1
# kernel, busybox initramfs) through the agent under TCG: with 1 vCPU it panics
# ("System is deadlocked on memory") at 80 MiB and boots at 88; with 32 vCPUs
# at 104 and 112; with 64 vCPUs at 128 and 160 (at 64 MiB it never prints a
# line and stays "running"). The kernel's need grows ~0.8 MiB per vCPU (per-CPU
# areas), so the floor is a base plus a per-vCPU term at over twice that rate:
# it stays 30+ MiB above the boot limit at every count and leaves the entry
# 45+ MiB of MemAvailable (1 vCPU at 128 MiB: 60 MiB; 16 at 128: 47; 32 at 160: 59).
MIN_MEM_MIB = 128
# The entry travels base64-encoded on the kernel command line (x86
# COMMAND_LINE_SIZE is 2048; base64 grows it by 4/3; fixed arguments ~150).
# A standby VM's entry comes as one base64 line, well inside a tty's 4095.
MAX_ENTRY_BYTES = 1300
MEM_BASE_MIB = 96
MEM_PER_VCPU_MIB = 2


def min_mem_mib(vcpus: int) -> int:
    """The least memory a new VM with ``vcpus`` vCPUs may ask for."""
    return max(MIN_MEM_MIB, MEM_BASE_MIB + MEM_PER_VCPU_MIB * vcpus)


class Shape(Record):
    """A VM's vCPUs and memory as its record holds them. JSON integers only:
    ``true``, ``"2"`` and ``128.0`` are refused, never read as numbers."""

    vcpus: int = Field(strict=True, ge=1, le=64)
    mem_mib: int = Field(strict=True, ge=64, le=1_048_576)


class VmShape(Shape):
    """What a new VM asks for. Memory is the hard limit on a host; vCPUs are
    time-shared and only rank hosts. ``mem_mib`` must be at least the floor
    the guest kernel boots in: 128 MiB, or 96 + 2 per vCPU when that is more
    (160 MiB for 32 vCPUs, 224 for 64); less is 400 ``invalid_argument``
    rather than a VM that hangs or panics after a 201."""

    mem_mib: int = Field(strict=True, ge=MIN_MEM_MIB, le=1_048_576, description=(
        f"MiB, at least {MIN_MEM_MIB} and at least {MEM_BASE_MIB} + {MEM_PER_VCPU_MIB} per vCPU"))

    @model_validator(mode="after")
    def _boots(self) -> "VmShape":
        floor = min_mem_mib(self.vcpus)
        if self.mem_mib < floor:
            raise PydanticCustomError(
                "mem_below_floor",
                "mem_mib {mem_mib} is below the floor of {floor} MiB for vcpus {vcpus}: the guest kernel "
                "needs at least {min} MiB, and {base} + {per} MiB per vCPU when that is more",
                {"mem_mib": self.mem_mib, "floor": floor, "vcpus": self.vcpus, "min": MIN_MEM_MIB,
                 "base": MEM_BASE_MIB, "per": MEM_PER_VCPU_MIB})
        return self


def _utc_if_naive(value: Optional[datetime]) -> Optional[datetime]:
    """A stored time without an offset read as UTC (every time the agent writes has one): a VM
    list sorts by ``created_at``, and one naive time among aware ones made it a 500 for everyone."""
    return value if value is None or value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _aware(value: Optional[datetime]) -> Optional[datetime]:
    if value is not None and value.tzinfo is None:
        raise PydanticCustomError("timezone_required", "has no timezone offset: give it one (Z or +00:00)")
    return value


def _no_nul(entry: Optional[str]) -> Optional[str]:
    if entry is not None and "\x00" in entry:
        raise PydanticCustomError("nul_character", "holds a NUL character, which no command line can")
    return entry


class CreateVmRequest(Record):
    """``POST /v1/host/vms``. A missing name gets a generated one. A
    ``standby`` VM boots without its entry and waits for a claim to give it
    one (``ClaimRequest``): prewarmed VMs."""

    name: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    shape: VmShape
    # (no NUL: no command line holds one; the fake backend failed on it with a 500 and a
    # record stuck creating on every host placement tried)
    entry: Optional[str] = Field(default=None, min_length=1)
    bundle: Optional[str] = Field(default="linux", pattern=NAME_PATTERN)
    standby: bool = Field(default=False, strict=True)  # (true or false: "no", 0 and "off" are 400, as elsewhere)

    _entry_without_nul = field_validator("entry")(lambda v: _no_nul(v))

    @model_validator(mode="after")
    def _entry_unless_standby(self) -> "CreateVmRequest":
        if self.standby and self.entry is not None:
            raise ValueError("a standby vm gets its entry when it is claimed, not at create")
        if not self.standby and self.entry is None:
            raise ValueError("entry is required (unless standby)")
        return self


class ClaimRequest(Record):
    """``POST /v1/host/vms/{name}/claim``: give a standby VM its entry, and
    its new name (default: it keeps its own). The host holds the entry to
    the same ``MAX_ENTRY_BYTES`` as at create."""

    name: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    entry: str = Field(min_length=1)

    _entry_without_nul = field_validator("entry")(lambda v: _no_nul(v))


class StateFile(Record):
    """One file of a sleeping VM's saved state."""

    name: str
    size: int
    sha256: str


class DeclaredFile(StateFile):
    """A state file an incoming move declares. Its size is a JSON integer only: ``5.0``,
    ``true`` and ``"5"`` are refused, as a shape's are (``StateFile`` keeps the looser type
    for records already written)."""

    size: int = Field(strict=True)


class Vm(Record):
    """A VM on one host."""

    name: str
    state: VmState
    shape: Shape
    entry: str  # "" while standby
    bundle: str
    bundle_fingerprint: str
    created_at: datetime
    standby: bool = False  # booted, the guest waiting for a claim to give it its entry
    ready: bool = False  # standby and its guest said it waits (FUSE-STANDBY): a claim starts it at once
    # The directory under ``vms/`` when it is not the name: a VM created
    # standby boots in ``_sb-<hex>`` (no name can take it), and its process's
    # command line names that dir, so a claim renaming the VM never moves it.
    dir: Optional[str] = None
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

    _times_in_utc = field_validator("created_at", "updated_at")(lambda v: _utc_if_naive(v))


# A move's id, as the agent's incoming side has taken it since its first release: every
# controller's (``mv-<12 hex>``) is one, and so are the ids other callers and the tests give.
# Not "." or ".." (a URL path resolves those away, so DELETE .../incoming/.. could not abort it);
# no control or non-ASCII character (review 38: a mark of any string held its VM for good, the
# raw characters quoted in every 409).
MOVE_ID_PATTERN = r"^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
MOVE_ID_MAX = 128


class SleepRequest(Record):
    """``POST /v1/host/vms/{name}/sleep``: a move marks the copy it sleeps."""

    # ("" is no move's: never read as none)
    move_id: Optional[str] = Field(None, min_length=1, max_length=MOVE_ID_MAX, pattern=MOVE_ID_PATTERN)


class WakeRequest(Record):
    """``POST /v1/host/vms/{name}/wake``. A marked VM wakes only for its own
    move; ``clear_mark`` drops the mark (same move id) without waking;
    ``if_marked`` acts only on a VM this move holds (else replies with the VM
    as it is), after any sleep or wake under way on it has finished."""

    # (any string: a mark an older agent took must stay wakeable by its own id; the route
    # refuses one not of `MOVE_ID_PATTERN` that is not the VM's mark)
    move_id: Optional[str] = Field(None, min_length=1)
    clear_mark: bool = False
    if_marked: bool = False


class IncomingVm(Record):
    name: str = Field(pattern=NAME_PATTERN)
    shape: Shape
    entry: str
    bundle: str = "linux"
    bundle_fingerprint: str
    created_at: Optional[datetime] = None  # (the source's: it keeps its place in a host's list)

    _created_at_aware = field_validator("created_at")(lambda v: _aware(v))


class IncomingRequest(Record):
    """``POST /v1/host/incoming``: the receiving side of a move."""

    move_id: str = Field(min_length=1, max_length=MOVE_ID_MAX, pattern=MOVE_ID_PATTERN)
    vm: IncomingVm
    platform: dict[str, Any]
    files: list[DeclaredFile] = Field(min_length=1)


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
