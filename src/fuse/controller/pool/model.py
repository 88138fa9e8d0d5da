"""The planning model: what the elastic planner sees.

A model is plain data (pydantic, so it round-trips through the ``json`` field
of a plan and ``fuse pool plan --model FILE.json``):

    PlanModel
     ├── groups       DemandGroup   identical VMs: count × (cpus, mem_mib), kind,
     │                              duration, together, pins
     ├── hosts        PoolHost      machines already in the pool with free room:
     │                              own devices (free) or running cloud hosts
     │                              (paid for ``paid_secs_left`` more seconds)
     ├── offers       Offer         machine types a linked cloud can add
     └── constraints  Constraints   budget caps, quotas, exact new-host count

Everything the solver needs to decide "may group g use machine m" lives in
``host_reject`` / ``offer_reject``, which return a reason (a string) or None,
so every rejection can be explained to the operator.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

KVM_KINDS = frozenset({"vm", "microvm"})
KINDS = frozenset({"container", "vm", "microvm"})
ARCHES = ("amd64", "arm64")
U32 = 2**32 - 1
MAX_OVERCOMMIT = 1000.0  # vCPUs sold per vCPU in an edited model: beyond it no what-if means anything
MAX_FIGURE = 2**53  # a host's declared capacity figures go this high (fuse.models.hosts.MAX_AMOUNT)
INT32 = 2**31  # the solvers' random seed is a C int32 (CP-SAT's random_seed)
# a machine's $/h goes this high (a linked local type's price is held to u32): an edited model's
# 1e308 made a plan's cost infinite (no JSON) and its micro-dollars NaN
MAX_USD_PER_HOUR = float(U32)


class _Data(BaseModel):
    # (a NaN or infinite price or capacity in an edited model would make every comparison false)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class DemandGroup(_Data):
    """``count`` identical VMs. Pins restrict where they may go."""

    name: str
    count: int = Field(ge=0)
    cpus: int = Field(ge=1, le=U32)  # (u32 as a request types them: an edited model is held to it)
    mem_mib: int = Field(ge=1, le=U32)
    kind: str = "microvm"
    image: str = "linux"
    arch: str | None = None  # None: any architecture
    together: bool = False  # all on one machine (forks of one checkpoint)
    duration_secs: int = Field(default=3600, ge=0, le=U32)
    provider: str | None = None
    region: str | None = None
    instance_type: str | None = None
    devices_only: bool = False  # only the operator's own devices
    no_scale: bool = False  # no new machines

    @model_validator(mode="after")
    def _known_kind(self) -> "DemandGroup":
        # (an edited model's "banana" was planned as a container: no rule matched it)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, not {self.kind!r}")
        if self.arch not in (None, *ARCHES):
            raise ValueError(f"arch must be one of {list(ARCHES)} (or left out: any), not {self.arch!r}")
        return self

    @property
    def needs_kvm(self) -> bool:
        return self.kind in KVM_KINDS


class PoolHost(_Data):
    """A machine already in the pool, with the room it has free now."""

    name: str
    # (at most a host's declared figures: 2^53; an edited model's 2^70 overflowed first fit's arrays)
    vcpus: int = Field(ge=0, le=MAX_FIGURE)  # free vCPUs
    mem_mib: int = Field(ge=0, le=MAX_FIGURE)  # free MiB
    arch: str = "amd64"
    kvm: bool = True
    own: bool = True  # an operator's device: free to use
    provider: str = ""
    region: str = ""
    type_name: str = ""  # a cloud host's machine type ("" on own devices)
    usd_per_hour: float = Field(default=0.0, ge=0, le=MAX_USD_PER_HOUR)
    paid_secs_left: int = Field(default=0, ge=0, le=U32)  # already-billed time still ahead
    billing_step_secs: int = Field(default=1, ge=1, le=U32)
    # VMs it may still take: its vm_count policy less the VMs on it (None: no limit)
    max_vms: int | None = Field(default=None, ge=0, le=MAX_FIGURE)
    # a cloud host scale-in cordoned: running and paid, so counted; the VMs placed uncordon it
    scaler_cordoned: bool = False
    # False: CPU only ranks here (time-shared, as placement has it on every host in the pool;
    # memory is the hard limit): ``PlanModel.sorted`` gives it the vCPUs its memory admits
    # for the model's groups, so an edited model's shapes get that room too
    cpu_binds: bool = True

    @model_validator(mode="after")
    def _known_arch(self) -> "PoolHost":
        if self.arch not in ARCHES:
            raise ValueError(f"arch must be one of {list(ARCHES)}, not {self.arch!r}")
        return self


class Offer(_Data):
    """A machine type a linked cloud can add, in one region."""

    provider: str
    type_name: str
    region: str
    arch: str
    vcpus: int = Field(ge=1, le=U32)  # (u32: a linked type's 2^63 MiB broke every plan)
    mem_mib: int = Field(ge=1, le=U32)  # usable: RAM less what the agent and OS keep
    disk_gb: int = Field(default=0, ge=0, le=U32)
    gpu: str = ""
    kvm: bool = False
    metal: bool = False
    usd_per_hour: float = Field(ge=0, le=MAX_USD_PER_HOUR)
    billing_step_secs: int = Field(default=1, ge=1, le=U32)
    billing_min_secs: int = Field(default=0, ge=0, le=U32)
    boot_secs: int = Field(default=90, ge=0, le=U32)
    limit: int | None = Field(default=None, ge=0, le=U32)  # at most this many of the type
    quota_family: str = ""
    one_space: bool = False  # a one-VM supplier's sandbox (Modal), not a host

    @model_validator(mode="after")
    def _known_arch(self) -> "Offer":
        if self.arch not in ARCHES:
            raise ValueError(f"arch must be one of {list(ARCHES)}, not {self.arch!r}")
        return self

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.type_name}/{self.region}"


class Constraints(_Data):
    """Caps on what the plan may add. None: no cap."""

    max_usd_per_hour: float | None = Field(default=None, ge=0)  # added by new machines
    max_new_hosts: int | None = Field(default=None, ge=0)  # one_space sandboxes not counted
    exact_new_hosts: int | None = Field(default=None, ge=0)  # the request's ``hosts`` pin
    allow_metal: bool = True
    monthly_usd_left: float | None = Field(default=None, ge=0)  # caps projected_usd
    quotas: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)  # quota family -> vCPUs
    cpu_overcommit: float = Field(default=1.0, gt=0, le=MAX_OVERCOMMIT)  # vCPUs sold per vCPU
    # (words only, never the solve: when max_usd_per_hour is the budget's cap, the $/h of the
    # machines running already, which count against it: max_usd_per_hour is what they leave, and
    # an answer quotes the cap as the operator set it, the two summed. None: the cap, if any, is
    # on what the plan adds alone: a request's own)
    running_usd_per_hour: float | None = Field(default=None, ge=0)
    # (words only too: what the machines running take of each cloud's caps, at most all of each:
    # vCPUs of a quota family, machines of a type ("provider/type_name"); ``quotas`` and an
    # offer's ``limit`` are what they leave, and an answer says the cap as set, the two summed)
    quota_running: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    limit_running: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)


class PlanModel(_Data):
    """The whole input of ``plan``. ``sorted()`` gives the canonical order."""

    groups: list[DemandGroup] = Field(default_factory=list)
    hosts: list[PoolHost] = Field(default_factory=list)
    offers: list[Offer] = Field(default_factory=list)
    constraints: Constraints = Field(default_factory=Constraints)
    time_limit_secs: float = Field(default=5.0, gt=0)
    # (an edited model's 2^31 reached CP-SAT's int32 random_seed: a TypeError traceback)
    seed: int = Field(default=0, ge=-INT32, le=INT32 - 1)

    @model_validator(mode="after")
    def _one_meaning(self) -> PlanModel:
        """A model as a request would build it (an edited ``--model`` file is checked here):
        each group and host named once (an answer names them: two of one name could not be
        told apart) and at most 100,000 VMs in all (a plan lists every machine; a request
        is refused past that too)."""
        from fuse.models.pool import MAX_PLAN_VMS

        for what, names in (("group", [g.name for g in self.groups]), ("host", [h.name for h in self.hosts]),
                            ("offer", [o.key for o in self.offers])):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                # (an offer twice would double its type's limit: each copy had its own)
                raise ValueError(f"{what} names must be unique: {', '.join(twice)} given twice")
        if (vms := sum(g.count for g in self.groups)) > MAX_PLAN_VMS:
            raise ValueError(f"{vms} VMs in all: a plan takes at most {MAX_PLAN_VMS}")
        return self

    def sorted(self) -> PlanModel:
        """The same model with inputs in canonical order, so plans are reproducible, and each
        host where CPU only ranks given the vCPUs its memory admits: the most vCPUs per MiB
        of any group times its memory, so no mix of the groups that fits its memory is
        short of CPU there."""
        per_mib = max((g.cpus / g.mem_mib for g in self.groups), default=0.0)
        hosts = [h if h.cpu_binds else h.model_copy(update={
                     "vcpus": max(h.vcpus, min(MAX_FIGURE, math.ceil(per_mib * h.mem_mib - 1e-9)))})
                 for h in sorted(self.hosts, key=lambda h: h.name)]
        return self.model_copy(update={
            "groups": sorted(self.groups, key=lambda g: g.name),
            "hosts": hosts,
            "offers": sorted(self.offers, key=lambda o: (o.usd_per_hour, o.key)),
        })


def ceil_to(secs: float, step: int) -> int:
    """``secs`` rounded up to a whole number of ``step``-second billing steps (in
    integers: ``secs / step`` in floats rounded 60 s on a 2^52 s step down to none)."""
    whole = max(math.ceil(secs - 1e-9), 0)
    return -(-whole // step) * step


def billed_secs(offer: Offer, duration_secs: int) -> int:
    """Seconds a new machine is billed for work lasting ``duration_secs``: boot + work,
    rounded up to the billing step, at least the minimum."""
    return max(offer.billing_min_secs, ceil_to(duration_secs + offer.boot_secs, offer.billing_step_secs))


def extra_secs(host: PoolHost, duration_secs: int) -> int:
    """Billed seconds a running cloud host adds to keep going for ``duration_secs``
    beyond what is already paid (0 on own devices and within the paid time)."""
    if host.own or host.usd_per_hour == 0:
        return 0
    return ceil_to(duration_secs - host.paid_secs_left, host.billing_step_secs)


def fits_per_machine(group: DemandGroup, vcpus: float, mem_mib: int) -> int:
    """How many VMs of ``group`` fit in (vcpus, mem_mib)."""
    return int(min(vcpus // group.cpus, mem_mib // group.mem_mib))


def host_reject(group: DemandGroup, host: PoolHost, c: Constraints, size: bool = True) -> str | None:
    """Why ``group`` may not use existing ``host`` at all, or None (``size=False``: rules only)."""
    if group.needs_kvm and not host.kvm:
        return f"kind {group.kind} needs KVM"
    if group.arch and host.arch != group.arch:
        return f"arch {host.arch} is not {group.arch}"
    if group.devices_only and not host.own:
        return "devices_only"
    # pins hold for every host: an own device is in no cloud and of no machine type, and
    # its region is the one it was registered with (none: not in the pinned one)
    if group.provider and host.provider != group.provider:
        return f"provider is not {group.provider}" if host.provider else f"not in cloud {group.provider}"
    if group.region and host.region != group.region:
        return f"region is not {group.region}" if host.region else f"no region (pinned to {group.region})"
    if group.instance_type and host.type_name != group.instance_type:
        return f"type is not {group.instance_type}" if host.type_name else f"not a {group.instance_type} machine"
    if not size:
        return None
    need = max(group.count if group.together else 1, 1)
    if host.max_vms is not None and host.max_vms < need:
        return "vm_count limit reached" if host.max_vms == 0 else f"vm_count limit: {host.max_vms} more VMs"
    if fits_per_machine(group, host.vcpus * c.cpu_overcommit, host.mem_mib) < need:
        return "no room" if need <= 1 else f"no room for all {need} together"
    return None


def offer_reject(group: DemandGroup, offer: Offer, c: Constraints, size: bool = True) -> str | None:
    """Why ``group`` may not go on a new ``offer`` machine at all, or None (``size=False``: rules only)."""
    if group.devices_only or group.no_scale:
        return "devices_only" if group.devices_only else "no_scale"
    if group.needs_kvm and not offer.kvm:
        return f"kind {group.kind} needs KVM (metal types only)"
    if offer.metal and not c.allow_metal:
        return "allow_metal is off"
    if group.arch and offer.arch != group.arch:
        return f"arch {offer.arch} is not {group.arch}"
    if group.provider and offer.provider != group.provider:
        return f"provider is not {group.provider}"
    if group.region and offer.region != group.region:
        return f"region is not {group.region}"
    if group.instance_type and offer.type_name != group.instance_type:
        return f"type is not {group.instance_type}"
    if offer.limit == 0:
        # (the limit as set: a type whose limit the machines running use up is not one limited to 0)
        run = c.limit_running.get(f"{offer.provider}/{offer.type_name}", 0)
        return f"type limit {run} reached (the machines running count against it)" if run else "type limit 0"
    if not size:
        return None
    need = group.count if group.together else 1
    if offer.one_space and need > 1:
        return "one_space holds one VM"
    if fits_per_machine(group, offer.vcpus * c.cpu_overcommit, offer.mem_mib) < max(need, 1):
        return "too small" if need <= 1 else f"too small for all {need} together"
    return None


def offer_vcpus(offer: Offer, c: Constraints) -> int:
    """Sellable vCPUs of one machine of ``offer`` (overcommit applied)."""
    return min(MAX_FIGURE, int(offer.vcpus * c.cpu_overcommit))


def host_vcpus(host: PoolHost, c: Constraints) -> int:
    """Sellable vCPUs of ``host``, at most ``MAX_FIGURE`` (first fit's figures are int64)."""
    return min(MAX_FIGURE, int(host.vcpus * c.cpu_overcommit))


NO_LIMIT = 1 << 40  # VM slots of a machine with no VM-count limit


def host_slots(host: PoolHost) -> int:
    """VMs ``host`` may still take by count (its ``max_vms``; ``NO_LIMIT`` when it has none)."""
    return NO_LIMIT if host.max_vms is None else host.max_vms


def host_fits(group: DemandGroup, host: PoolHost, c: Constraints) -> int:
    """How many VMs of ``group`` ``host`` can take alone: its room and its VM slots."""
    return min(fits_per_machine(group, host_vcpus(host, c), host.mem_mib), host_slots(host))
