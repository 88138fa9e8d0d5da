"""Turn an ``ElasticPlanRequest`` and a pool snapshot into a ``PlanModel``.

Defaults (the seed leaves them to the pool; these are ours, documented):

=============  ==============================================================
count          1
image          ``linux``
kind           from the image: ``windows*``/``macos*`` -> ``vm``; an OCI
               reference (contains ``/`` or ``:``) or ``container*`` ->
               ``container``; anything else (``linux``, distros) -> ``microvm``
cpus, memory   the most common shape of earlier VMs of the image when
               ``history`` is given (the route passes the VMs the controller
               records, ``history_from_vms``); else 1 vCPU and 1024 MiB
duration_secs  by caller class: interactive 3600, batch 14400, compat 3600,
               persistent_agent 86400, none given 3600
caps           the pool budget's (``Constraints``), narrowed by the request:
               ``max_usd_per_hour`` takes the lower of the two, ``no_scale``
               sets max new hosts to 0, ``hosts`` pins the exact count
=============  ==============================================================

The group is named ``request-0`` (the seed's example). Bad input raises
``fuse.errors.InvalidArgument``: it crosses the API as a 400. A malformed pool
snapshot is the controller's own fault, not the caller's: it raises a plain
``FuseError`` (500 ``internal``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from fuse.controller.pool.catalogue import default_catalogue
from fuse.controller.pool.model import ARCHES, KINDS, U32, Constraints, DemandGroup, Offer, PlanModel, PoolHost
from fuse.errors import FuseError, InvalidArgument
from fuse.models.pool import ElasticPlanRequest

DEFAULT_CPUS, DEFAULT_MEM_MIB, DEFAULT_IMAGE = 1, 1024, "linux"
DURATION_BY_CALLER = {"interactive": 3600, "batch": 14400, "compat": 3600, "persistent_agent": 86400}
DEFAULT_DURATION = 3600
# hosts in these states take no new work (the registry's and the elastic host's states)
# ("unavailable" is what ``Controller.pool_snapshot`` says of a host placement may not use now)
UNUSABLE_STATES = frozenset({"cordoned", "draining", "offline", "gone", "unreachable", "deregistering",
                             "unavailable"})


def kind_of_image(image: str) -> str:
    """The default kind for an image name (see the module table)."""
    name = image.lower()
    if name.startswith(("windows", "macos")):
        return "vm"
    if "/" in name or ":" in name or name.startswith("container"):
        return "container"
    return "microvm"


def learned_shape(image: str, history: Iterable[Mapping[str, Any]] | None) -> tuple[int, int] | None:
    """The most common (cpus, memory_mb) of earlier VMs of ``image``, or None."""
    shapes = Counter((int(v["cpus"]), int(v["memory_mb"])) for v in (history or ())
                     if v.get("image") == image and int(v.get("cpus") or 0) > 0 and int(v.get("memory_mb") or 0) > 0)
    # most_common breaks ties by first seen; sort first so the answer is stable
    return max(sorted(shapes), key=lambda s: shapes[s]) if shapes else None


def history_from_vms(vms: Iterable[Mapping[str, Any]],
                     placed: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """``history`` rows (image, cpus, memory_mb) from VM records as the controller keeps
    them (``VmService.list``): a VM's image is its ``bundle``, its shape ``shape``; and
    from the data of ``placed`` events (vm, id: its host, bundle, vcpus, mem_mib), one row
    per VM the controller placed that is not listed under that name and host now (a VM
    deleted since; a listed one counts once, as listed). Records without a bundle or a
    shape teach nothing and are skipped."""
    out, listed = [], set()
    for v in vms:
        listed.add((v.get("name"), v.get("host")))
        shape = v.get("shape") or {}
        if v.get("bundle") and shape.get("vcpus") and shape.get("mem_mib"):
            out.append({"image": v["bundle"], "cpus": shape["vcpus"], "memory_mb": shape["mem_mib"]})
    for e in placed:
        if (e.get("vm"), e.get("id")) not in listed and e.get("bundle") and e.get("vcpus") and e.get("mem_mib"):
            listed.add((e.get("vm"), e.get("id")))  # a name reused on a host: its last placement
            out.append({"image": e["bundle"], "cpus": e["vcpus"], "memory_mb": e["mem_mib"]})
    return out


def host_from_snapshot(d: Mapping[str, Any]) -> PoolHost | None:
    """A ``PoolHost`` from one snapshot dict, or None when the host takes no new work
    (or none the planner plans: a machine of an architecture it has no offers or
    requests of, riscv64 say, is left out of the plan, not the reason it fails)."""
    if str(d.get("state", "")).lower() in UNUSABLE_STATES:
        return None
    if str(d.get("arch") or "amd64") not in ARCHES:
        return None
    return PoolHost(
        name=str(d["name"]), vcpus=max(0, int(d.get("free_vcpus", d.get("cpus", 0)))),
        mem_mib=max(0, int(d.get("free_mem_mib", d.get("mem_mib", 0)))),
        arch=str(d.get("arch") or "amd64"), kvm=bool(d.get("kvm", True)), own=bool(d.get("own", True)),
        provider=str(d.get("provider", "")), region=str(d.get("region", "")), type_name=str(d.get("type_name", "")),
        usd_per_hour=float(d.get("usd_per_hour", 0.0)),
        # (a machine paid past u32 seconds, added by hand with a TTL of centuries, is paid past any
        # work's duration, which u32 bounds: it is paid "for good", not a malformed snapshot)
        paid_secs_left=min(U32, int(d.get("paid_secs_left", 0))),
        billing_step_secs=int(d.get("billing_step_secs", 1)), scaler_cordoned=bool(d.get("scaler_cordoned", False)),
        max_vms=None if d.get("free_vm_slots") is None else max(0, int(d["free_vm_slots"])))


def hosts_from_snapshot(snapshot: Iterable[Mapping[str, Any]]) -> list[PoolHost]:
    """The hosts of a pool snapshot that take new work. The snapshot is the
    controller's own data: a malformed one is a bug here (500), never a 400."""
    try:
        hosts = [h for h in (host_from_snapshot(d) for d in snapshot) if h is not None]
    except (KeyError, TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise FuseError(f"pool snapshot is malformed: {e!r}") from e
    if len({h.name for h in hosts}) != len(hosts):
        raise FuseError("pool snapshot names a host twice")
    return hosts


def model_from_request(req: ElasticPlanRequest, snapshot: Iterable[Mapping[str, Any]] = (), *,
                       offers: Iterable[Offer] | None = None, constraints: Constraints | None = None,
                       history: Iterable[Mapping[str, Any]] | None = None,
                       time_limit_secs: float = 5.0) -> PlanModel:
    """The planning model for one request against the pool ``snapshot``."""
    image = req.image or DEFAULT_IMAGE
    kind = (req.kind or kind_of_image(image)).lower()
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {sorted(KINDS)}, not {req.kind!r}")
    if req.caller is not None and req.caller not in DURATION_BY_CALLER:
        raise InvalidArgument(f"caller must be one of {sorted(DURATION_BY_CALLER)}, not {req.caller!r}")
    shape = learned_shape(image, history)
    cpus = req.cpus or (shape[0] if shape else DEFAULT_CPUS)
    mem = req.memory_mb or (shape[1] if shape else DEFAULT_MEM_MIB)
    duration = req.duration_secs if req.duration_secs is not None else DURATION_BY_CALLER.get(req.caller or "", DEFAULT_DURATION)
    group = DemandGroup(
        name="request-0", count=1 if req.count is None else req.count, cpus=cpus, mem_mib=mem, kind=kind,
        image=image, together=bool(req.together), duration_secs=duration, provider=req.provider,
        region=req.region, instance_type=req.instance_type, devices_only=bool(req.devices_only),
        no_scale=bool(req.no_scale))
    offer_list = list(default_catalogue() if offers is None else offers)
    # a host whose agent lists its guest bundles runs only those images (a VM of another
    # image is refused there: "host has no bundle"); one that does not say is not ruled out
    hosts = hosts_from_snapshot(d for d in snapshot if d.get("bundles") is None or image in d["bundles"])
    # on a host already in the pool memory is the hard limit and CPU only ranks (time-shared),
    # as placement does (``cpu_binds`` False: the planner gives it the vCPUs its memory admits),
    # so a plan never buys a machine for work a host with room would have taken
    hosts = [h.model_copy(update={"cpu_binds": False}) for h in hosts]
    # a pin must name something the pool knows: an offer or a host (an own device's region)
    clouds = [(o.provider, o.region, o.type_name) for o in offer_list]
    clouds += [(h.provider, h.region, h.type_name) for h in hosts]
    if req.instance_type and not any(t == req.instance_type for _, _, t in clouds):
        raise InvalidArgument(f"unknown instance_type {req.instance_type!r}")
    if req.region and not any(r == req.region for _, r, _ in clouds):
        raise InvalidArgument(f"unknown region {req.region!r}")
    if req.provider and not any(p == req.provider for p, _, _ in clouds) and not req.devices_only:
        raise InvalidArgument(f"no linked cloud {req.provider!r}")
    c = constraints or Constraints()
    update: dict[str, Any] = {}
    if req.max_usd_per_hour is not None:
        # None is "no cap"; a cap of 0 is a cap (nothing may be added)
        if c.max_usd_per_hour is None or req.max_usd_per_hour < c.max_usd_per_hour:
            # (the request's cap, on what the plan adds: said as given, no $/h running beside it)
            update |= {"max_usd_per_hour": req.max_usd_per_hour, "running_usd_per_hour": None}
    if req.no_scale or req.devices_only:
        update["max_new_hosts"] = 0
    if req.hosts is not None:
        if req.no_scale or req.devices_only:
            raise InvalidArgument("hosts pins new machines; no_scale/devices_only forbid them")
        update["exact_new_hosts"] = req.hosts
    return PlanModel(groups=[group], hosts=hosts, offers=offer_list, constraints=c.model_copy(update=update),
                     time_limit_secs=time_limit_secs)
