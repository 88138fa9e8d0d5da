"""Wire records of the elastic pool and prewarm (seed 001, ``Elastic*`` / ``Prewarm*``).

Field names are the seed's, in snake_case; the seed's camelCase spellings
(``memoryMb``, ``newHosts``...) are accepted on input. Records serialise by
field name (snake_case) unless the caller asks ``by_alias=True``.
"""

from __future__ import annotations

import warnings

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

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


class _Record(BaseModel):
    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel)


class ElasticPlanRequest(_Record):
    """What to plan for. Pins are constraints of the same solve; unset lets the pool decide."""

    count: int | None = Field(default=None, ge=0)
    image: str | None = None
    kind: str | None = None
    cpus: int | None = Field(default=None, ge=1)
    memory_mb: int | None = Field(default=None, ge=1)
    together: bool | None = None
    caller: str | None = None
    duration_secs: int | None = Field(default=None, ge=0)
    provider: str | None = None
    region: str | None = None
    instance_type: str | None = None
    hosts: int | None = Field(default=None, ge=0)
    no_scale: bool | None = None
    devices_only: bool | None = None
    max_usd_per_hour: float | None = Field(default=None, ge=0)
    apply: bool = False


class ElasticAssignment(_Record):
    """Some VMs of one group on one machine (``host`` empty: ``new_hosts[new_index]``)."""

    group: str
    host: str = ""
    new_index: int | None = None
    count: int
    sync: bool = False


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
    expires: int = 0
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
        solver: str = "exact"
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
    """The caps and switches to set (fields left None are unchanged)."""

    max_usd_per_hour: float | None = None
    monthly_usd: float | None = None
    autoscale: bool | None = None
    max_new_hosts: int | None = None
    warm: bool | None = None
    allow_metal: bool | None = None


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

    host: str
    machine: str = "local"
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


class PrewarmOptions(_Record):
    """What to keep ready (prewarm)."""

    count: int | None = Field(default=None, ge=1, le=256)
    on: str | None = None
    kind: str | None = None
    cpus: int | None = Field(default=None, ge=1)
    memory_mb: int | None = Field(default=None, ge=1)
    ttl_secs: int | None = Field(default=None, ge=0)
    instance_type: str | None = None
    region: str | None = None
