"""Wire records of the elastic pool and prewarm (seed 001, ``Elastic*`` / ``Prewarm*``).

Field names are the seed's, in snake_case; the seed's camelCase spellings
(``memoryMb``, ``newHosts``...) are accepted on input. The camelCase names are
validation aliases only, so records serialise and are documented (OpenAPI) in
snake_case, like the rest of the REST API, whatever ``by_alias`` says.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any

from pydantic import AliasChoices, AliasGenerator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

from .vm import MEM_BASE_MIB, MEM_PER_VCPU_MIB, MIN_MEM_MIB

__all__ = [
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
    "Prewarm",
    "PrewarmOptions",
    "PrewarmPlacement",
]


def _either(name: str) -> AliasChoices:
    return AliasChoices(name, to_camel(name))


class _Record(BaseModel):
    model_config = ConfigDict(populate_by_name=True, alias_generator=AliasGenerator(validation_alias=_either))

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        """As input (a request body), each field under its camelCase name too, as it is
        accepted: a schema with only the snake_case names (and no other property
        allowed) had a generated client or a validating gateway refuse ``memoryMb``."""
        schema = handler(core_schema)
        if handler.mode == "validation":
            target = handler.resolve_ref_schema(schema)
            props = target.get("properties", {})
            required = target.get("required", [])
            for name in list(props):
                camel = to_camel(name)
                if camel != name and camel not in props:
                    props[camel] = {k: v for k, v in props[name].items() if k != "title"} | {
                        "description": f"{name}, as seed 001 spells it (give one of the two, not both)"}
                    if name in required:  # (either spelling meets it)
                        required.remove(name)
                        target.setdefault("allOf", []).append({"anyOf": [{"required": [name]},
                                                                          {"required": [camel]}]})
            if "required" in target and not required:
                del target["required"]
        return schema


SeedRecord = _Record  # for request bodies of the pool's API beyond the seed's records (both spellings)


def one_spelling(cls: type[BaseModel], data: Any) -> Any:
    """Refuse a field given in both spellings (``ttl_hours`` and ``ttlHours``): which one
    counts would be pydantic's choice, not the caller's."""
    if not isinstance(data, dict):
        return data
    twice = sorted(n for n in cls.model_fields if n != to_camel(n) and n in data and to_camel(n) in data)
    if twice:
        raise PydanticCustomError("extra_forbidden", "{names} given in both spellings", {
            "names": ", ".join(f"{n} ({to_camel(n)})" for n in twice)})
    return data


U32 = 2**32 - 1  # the seed types counts, hours and shapes as u32
U64 = 2**64 - 1  # ... and some durations and sizes as u64 (a prewarm's ttl_secs and memory_mb)
MAX_PLAN_VMS = 100_000  # VMs in one plan: a plan's answer lists every machine, so it is bounded


class ElasticPlanRequest(_Record):
    """What to plan for. Pins are constraints of the same solve; unset lets the pool decide.

    Unknown fields are refused (a misspelt ``memory`` would otherwise plan with
    the default shape): a 400 ``invalid_argument`` naming the field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # Numbers and switches are JSON numbers and booleans, as the seed types them: "2", true for a
    # count or 1 for a switch are 400 naming the field, never read as 2, 1 or true (strict=True).

    count: int | None = Field(default=None, strict=True, ge=0, le=MAX_PLAN_VMS,
                              description="How many VMs (default 1; at most 100,000 in one plan).")
    image: str | None = Field(default=None, description="Image (default linux).")
    kind: str | None = Field(default=None, description=(
        "`container`, `vm` or `microvm` (default: from the image: windows*/macos* are vm, an OCI reference "
        "or container* is container, anything else microvm)."))
    cpus: int | None = Field(default=None, strict=True, ge=1, le=U32, description=(
        "vCPUs each (default: learned from earlier VMs of the image, their most common shape; else 1)."))
    memory_mb: int | None = Field(default=None, strict=True, ge=1, le=U32, description=(
        "MiB each (default: learned with cpus from earlier VMs of the image; else 1024)."))
    together: bool | None = Field(default=None, strict=True, description="Keep them on one machine (forks of one checkpoint).")
    caller: str | None = Field(default=None, description=(
        "`interactive`, `batch`, `compat` or `persistent_agent`: sets the default duration_secs."))
    duration_secs: int | None = Field(default=None, strict=True, ge=0, le=U32, description=(
        "Expected lifetime, seconds (default by caller: interactive 3600, batch 14400, compat 3600, "
        "persistent_agent 86400; no caller 3600)."))
    provider: str | None = Field(default=None, description="Only this cloud (your own devices are in none).")
    region: str | None = Field(default=None, description=(
        "Only this region (new machines, running cloud hosts, and your own devices registered in it)."))
    instance_type: str | None = Field(default=None, description=(
        "Only this machine type (new machines and running cloud hosts of it; your own devices are of none)."))
    hosts: int | None = Field(default=None, strict=True, ge=0, le=MAX_PLAN_VMS, description=(
        "Exactly this many new machines (hosts; a Modal sandbox holds one VM and is not a host: not counted)."))
    no_scale: bool | None = Field(default=None, strict=True, description="Add no machines.")
    devices_only: bool | None = Field(default=None, strict=True, description="Only your own devices.")
    max_usd_per_hour: float | None = Field(default=None, strict=True, ge=0, description=(
        "A $/hour cap for this plan (the lower of it and the pool budget's cap applies)."))
    apply: bool = Field(default=False, strict=True, description=(
        "Add the machines the plan needs in the linked clouds (they show in `added`; create the VMs with on auto)."))

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """Name every unknown field, with the field it likely meant (pydantic's own
        ``extra_forbidden`` error names one field and no remedy)."""
        if not isinstance(data, dict):
            return data
        known = {name: name for name in cls.model_fields} | {to_camel(name): name for name in cls.model_fields}
        unknown = sorted(k for k in data if k not in known)
        twice = sorted({known[k] for k in data if k in known and k != known[k] and known[k] in data})
        if twice:
            raise PydanticCustomError("extra_forbidden", "{names} given in both spellings", {
                "names": ", ".join(f"{n} ({to_camel(n)})" for n in twice)})
        if not unknown:
            return data
        parts = []
        for k in unknown:
            near = difflib.get_close_matches(str(k).lower(), list(known), n=1, cutoff=0.6)
            parts.append(f"{k} (did you mean {known[near[0]]}?)" if near else str(k))
        raise PydanticCustomError("extra_forbidden", "unknown field{s} {names}; a plan request takes {fields}", {
            "s": "s" if len(unknown) > 1 else "", "names": ", ".join(parts), "fields": ", ".join(cls.model_fields)})


class ElasticAssignment(_Record):
    """Some VMs of one group on one machine (``host`` empty: ``new_hosts[new_index]``)."""

    group: str
    host: str = ""
    new_index: int | None = None
    count: int
    sync: bool = Field(default=False, description=(
        "The checkpoint is copied there first: true on a new machine (nothing of the group is on it "
        "yet: the image, and a together group's checkpoint, is put there before its VMs start); false "
        "on a host already in the pool, which has the image (hosts without it are left out of the plan)."))


class ElasticNewHost(_Record):
    """A machine the plan adds."""

    provider: str
    type_name: str
    region: str
    usd_per_hour: float
    boot_secs: int
    billed_secs: int
    one_space: bool = False
    rtt_ms: int = 0


class ElasticUnplaced(_Record):
    """VMs with no place, and why."""

    group: str
    count: int
    reason: str


class ElasticHost(_Record):
    """A host the elastic pool added in one of the linked clouds."""

    name: str
    provider: str
    type_name: str
    region: str
    id: str = ""
    machine: str = ""
    state: str = "creating"
    started: int = 0
    expires: int = Field(default=0, description=(
        "Unix seconds it ends on its own: a host added by hand at its TTL; a machine a plan or autoscale "
        "bought when scale-in removes it once idle, at the end of its paid time after the work it was "
        "planned for (it moves on with the billed time while VMs keep the host busy)."))
    usd_per_hour: float = 0.0
    billing_step_secs: int = 1
    billing_min_secs: int = 0
    pinned: bool = False


# The seed names a field ``json``, which shadows the deprecated BaseModel.json
# method; the field wins (``plan.json`` is the string) and the warning is noise.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "json"')

    class ElasticPlan(_Record):
        """The elastic pool's decision (cloud_plan)."""

        assignments: list[ElasticAssignment] = Field(default_factory=list)
        new_hosts: list[ElasticNewHost] = Field(default_factory=list)
        unplaced: list[ElasticUnplaced] = Field(default_factory=list)
        added_usd_per_hour: float = 0.0
        projected_usd: float = 0.0
        lower_bound_usd: float = 0.0
        solver: str = Field(default="exact", description=(
            "`exact`: proven optimal (lower_bound_usd equals projected_usd). `exact-incumbent`: the best plan "
            "found but not proven optimal: the time limit ended the search (also when it ended the count of "
            "how many VMs can be placed at all), or the exact model's answer did not pack onto whole "
            "machines and first fit completed it; never worse than first fit. `greedy`: first-fit "
            "decreasing answered (the exact solver found no better plan in time)."))
        ready_in_secs: int = 0
        explain: list[str] = Field(default_factory=list)
        added: list[ElasticHost] = Field(default_factory=list)
        json: str = ""


class ElasticBudget(_Record):
    """The budget, and what the clouds cost now."""

    autoscale: bool = False
    max_usd_per_hour: float = 0.0
    monthly_usd: float = 0.0
    max_new_hosts: int = 0
    warm: bool = False
    allow_metal: bool = False
    month_usd: float = 0.0
    running_usd_per_hour: float = 0.0
    hosts: int = 0


class ElasticBudgetUpdate(_Record):
    """The caps and switches to set (fields left None are unchanged; a cap of 0 is no cap).
    Unknown fields are refused (a misspelt cap would otherwise set nothing)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Numbers and switches as such (``true`` for a cap, ``"yes"`` or 1 for a switch are 400
    # naming the field, never read as 1 or true), as in a plan (strict=True).
    max_usd_per_hour: float | None = Field(default=None, strict=True, ge=0)
    monthly_usd: float | None = Field(default=None, strict=True, ge=0)
    autoscale: bool | None = Field(default=None, strict=True)
    max_new_hosts: int | None = Field(default=None, strict=True, ge=0, le=U32)
    warm: bool | None = Field(default=None, strict=True)
    allow_metal: bool | None = Field(default=None, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        return one_spelling(cls, data)


class ElasticDecision(_Record):
    """One scale-in decision (``keep``, ``cordon`` or ``remove``)."""

    host: str
    action: str
    reason: str = ""
    until: int = 0
    saves_usd: float = 0.0


class ElasticRemoved(_Record):
    """What cloud_remove_host did; ``failed`` holds ``name: error`` lines."""

    removed: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)


class PrewarmPlacement(_Record):
    """Where a prewarm keeps VMs ready."""

    host: str = Field(description="The host's id (its name in the pool).")
    machine: str = Field(default="local", description=(
        "`local` for the host agent on the controller's own machine (a unix socket or loopback address, "
        "as `fuse up` registers it), else the host's id (a machine the elastic pool bought: its relay "
        "machine, as in ElasticHost.machine)."))
    count: int = 0
    ready: int = 0


class Prewarm(_Record):
    """VMs of one shape kept ready so the next creates of it start at once."""

    id: str
    image: str
    kind: str
    cpus: int
    memory_mb: int
    count: int
    ready: int = 0
    placements: list[PrewarmPlacement] = Field(default_factory=list)
    expires_at: int = 0
    new_hosts: list[str] = Field(default_factory=list)
    backoff_until: int = Field(default=0, description=(
        "Unix seconds until which its refill buys no machine (0: none): the cloud ended (or refused) the "
        "machines bought for it, several in a row, soon after they were bought. Hosts with room still take "
        "its VMs meanwhile."))
    backoff_reason: str = Field(default="", description="Why its refill buys no machine until backoff_until.")


class PrewarmOptions(_Record):
    """What to keep ready (prewarm). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    # Integers only (``true``, ``"2"``, ``2.0`` are refused, never read as 1 or 2), as a plan's count.
    count: int | None = Field(default=None, strict=True, ge=1, le=256, description="How many, 1 to 256 (default 1).")
    on: str | None = Field(default=None, description=(
        "`auto` (default), `local`, a linked cloud or `host:<machine>`."))
    kind: str | None = Field(default=None, description=(
        "`container`, `vm` or `microvm` (default: the image's). Every kind runs as a VM here: "
        "`microvm` and `vm` need a KVM host (a bought machine: metal), `container` goes anywhere, as in a plan."))
    # Integers only (``true``, ``"2"``, ``128.0`` are refused), as a VM create's shape. The shape itself
    # (with the one left out learned from earlier VMs of the image) is checked by the controller against
    # the create shape (``VmShape``: its bounds and memory floor), not here: one source of that rule.
    cpus: int | None = Field(default=None, strict=True, ge=1, le=U32, description=(
        "vCPUs each, as a VM create takes them: 1 to 64 (default: learned from earlier VMs of the image; else 1)."))
    # u64 as the seed types them; the create shape's bounds (``VmShape``) refuse what no VM takes,
    # naming memory_mb, and a TTL past the end of u64 time keeps them for good (expires_at saturates)
    memory_mb: int | None = Field(default=None, strict=True, ge=1, le=U64, description=(
        f"MiB each, as a VM create takes them: at least {MIN_MEM_MIB}, and {MEM_BASE_MIB} + {MEM_PER_VCPU_MIB} per "
        "vCPU when that is more, at most a VM's maximum; else 400 invalid_argument (default: learned with cpus; "
        "else 1024)."))
    ttl_secs: int | None = Field(default=None, strict=True, ge=1, le=U64, description=(
        "Seconds to keep them (default 3600); its end (expires_at) is at most 2^64-1 unix seconds."))
    instance_type: str | None = None
    region: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        return one_spelling(cls, data)
