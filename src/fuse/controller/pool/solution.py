"""A placement, its cost, its feasibility, and its rendering as an ``ElasticPlan``.

One ``Solution`` type is shared by the exact planner, the greedy baseline and
the tests, so "cost" and "feasible" mean the same thing everywhere:

    cost = Σ new machines  usd_per_hour × billed_secs(offer, D_m) / 3600
         + Σ running hosts usd_per_hour × extra_secs(host, D_h) / 3600

where ``D`` is the longest duration of the work placed on that machine.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from fuse.controller.pool.model import (
    Constraints,
    Offer,
    PlanModel,
    billed_secs,
    extra_secs,
    host_reject,
    host_slots,
    host_vcpus,
    offer_reject,
    offer_vcpus,
)
from fuse.models.pool import ElasticAssignment, ElasticNewHost, ElasticPlan, ElasticUnplaced


@dataclass
class Machine:
    """A new machine of ``model.offers[offer]`` holding ``counts[g]`` VMs of group g."""

    offer: int
    counts: dict[int, int] = field(default_factory=dict)


@dataclass
class Solution:
    """VM counts per (group, existing host) and per new machine."""

    on_hosts: dict[tuple[int, int], int] = field(default_factory=dict)
    machines: list[Machine] = field(default_factory=list)

    def placed(self, n_groups: int) -> list[int]:
        out = [0] * n_groups
        for (g, _), k in self.on_hosts.items():
            out[g] += k
        for m in self.machines:
            for g, k in m.counts.items():
                out[g] += k
        return out


def _duration(model: PlanModel, counts: dict[int, int]) -> int:
    return max((model.groups[g].duration_secs for g, k in counts.items() if k > 0), default=0)


def machine_billed_secs(model: PlanModel, m: Machine) -> int:
    return billed_secs(model.offers[m.offer], _duration(model, m.counts))


def host_durations(model: PlanModel, sol: Solution) -> dict[int, int]:
    dur: dict[int, int] = {}
    for (g, h), k in sol.on_hosts.items():
        if k > 0:
            dur[h] = max(dur.get(h, 0), model.groups[g].duration_secs)
    return dur


def cost_usd(model: PlanModel, sol: Solution) -> float:
    """What the plan costs: new machines billed, plus running hosts' extra billed time."""
    dur = [grp.duration_secs for grp in model.groups]
    each: dict[tuple[int, int], float] = {}  # (offer, duration) -> USD·s/h of one machine
    total = 0.0
    for m in sol.machines:
        key = (m.offer, max((dur[g] for g, k in m.counts.items() if k > 0), default=0))
        if key not in each:
            o = model.offers[m.offer]
            each[key] = o.usd_per_hour * billed_secs(o, key[1])
        total += each[key]
    for h, d in host_durations(model, sol).items():
        total += model.hosts[h].usd_per_hour * extra_secs(model.hosts[h], d)
    return total / 3600.0


def added_usd_per_hour(model: PlanModel, sol: Solution) -> float:
    return sum(model.offers[m.offer].usd_per_hour for m in sol.machines)


def ready_in_secs(model: PlanModel, sol: Solution) -> int:
    return max((model.offers[m.offer].boot_secs for m in sol.machines), default=0)


def violations(model: PlanModel, sol: Solution) -> list[str]:
    """Every way ``sol`` breaks the model (empty: feasible). Used by tests and as a guard."""
    c, out = model.constraints, []
    placed = sol.placed(len(model.groups))
    for g, grp in enumerate(model.groups):
        if placed[g] > grp.count:
            out.append(f"{grp.name}: {placed[g]} placed of {grp.count}")
    bins: dict[tuple[str, int], dict[int, int]] = {}
    for (g, h), k in sol.on_hosts.items():
        if k > 0:
            bins.setdefault(("host", h), {})[g] = k
    for i, m in enumerate(sol.machines):
        if not any(k > 0 for k in m.counts.values()):
            out.append(f"new machine {i} is empty")
        bins[("new", i)] = {g: k for g, k in m.counts.items() if k > 0}
    for (kind, i), counts in bins.items():
        if kind == "host":
            h = model.hosts[i]
            cap_cpu, cap_mem, label, one = host_vcpus(h, c), h.mem_mib, h.name, False
            if sum(counts.values()) > host_slots(h):
                out.append(f"{label}: {sum(counts.values())} VMs > vm_count limit {h.max_vms}")
        else:
            o = model.offers[sol.machines[i].offer]
            cap_cpu, cap_mem, label, one = offer_vcpus(o, c), o.mem_mib, f"new {i} {o.key}", o.one_space
        if sum(model.groups[g].cpus * k for g, k in counts.items()) > cap_cpu:
            out.append(f"{label}: vCPUs over capacity")
        if sum(model.groups[g].mem_mib * k for g, k in counts.items()) > cap_mem:
            out.append(f"{label}: memory over capacity")
        if one and sum(counts.values()) > 1:
            out.append(f"{label}: one_space holds one VM")
        for g, k in counts.items():
            grp = model.groups[g]
            # size was checked above on the whole bin; here only the rules
            why = (host_reject(grp, model.hosts[i], c, size=False) if kind == "host"
                   else offer_reject(grp, model.offers[sol.machines[i].offer], c, size=False))
            if why:
                out.append(f"{label}: {grp.name} not allowed ({why})")
            if grp.together and k != grp.count:
                out.append(f"{label}: together group {grp.name} split")
    hosts_new = [m for m in sol.machines if not model.offers[m.offer].one_space]
    if c.max_new_hosts is not None and len(hosts_new) > c.max_new_hosts:
        out.append(f"{len(hosts_new)} new hosts > max_new_hosts {c.max_new_hosts}")
    # the hosts pin: exactly N new hosts, or a refused plan that places nothing
    if c.exact_new_hosts is not None and len(hosts_new) != c.exact_new_hosts and sum(placed) > 0:
        out.append(f"{len(hosts_new)} new hosts != hosts pin {c.exact_new_hosts}")
    if c.max_usd_per_hour is not None and added_usd_per_hour(model, sol) > c.max_usd_per_hour + 1e-9:
        out.append("max_usd_per_hour exceeded")
    if c.monthly_usd_left is not None and cost_usd(model, sol) > c.monthly_usd_left + 1e-6:
        out.append("monthly budget exceeded")
    per_type = Counter(m.offer for m in sol.machines)
    for t, n in per_type.items():
        if model.offers[t].limit is not None and n > model.offers[t].limit:
            out.append(f"{model.offers[t].key}: {n} > limit {model.offers[t].limit}")
    fam: Counter[str] = Counter()
    for m in sol.machines:
        fam[model.offers[m.offer].quota_family] += model.offers[m.offer].vcpus
    for f, v in fam.items():
        if f in c.quotas and v > c.quotas[f]:
            out.append(f"quota {f}: {v} vCPUs > {c.quotas[f]}")
    return out


def better(model: PlanModel, a: Solution, b: Solution) -> bool:
    """Is ``a`` strictly better than ``b``: more VMs placed, then cheaper."""
    pa, pb = sum(a.placed(len(model.groups))), sum(b.placed(len(model.groups)))
    if pa != pb:
        return pa > pb
    return cost_usd(model, a) < cost_usd(model, b) - 1e-9


def _caps(model: PlanModel) -> list[str]:
    """The model's caps on new machines, as an operator reads them. A cap of the budget is
    what it leaves after the hosts running (``ElasticPool.constraints``): 0 left reads
    "reached", never ``=0`` (which the budget's API reads as no cap); ``max_usd_per_hour`` is
    said as set, with the $/h running (``_usd_cap_said``)."""
    return [said for said, _ in _cap_checks(model, None, None)]


def _cap_checks(model: PlanModel, sol: Solution | None, g: int | None) -> list[tuple[str, bool]]:
    """Each cap as ``_caps`` words it, and whether ``sol`` has reached it for group ``g``:
    one more machine of a type that could take g would break it (a limit or quota only
    over those types). Reached figures are said with what the plan uses of them."""
    c = model.constraints
    fits = [] if g is None else [o for o in model.offers
                                 if offer_reject(model.groups[g], o, c) is None]
    # (a type whose limit is used up is no longer one that fits: that limit is what stops it)
    limited = [] if g is None else [o for o in model.offers if offer_reject(
                   model.groups[g], o if o.limit != 0 else o.model_copy(update={"limit": None}), c) is None]
    bought = [] if sol is None else [model.offers[m.offer] for m in sol.machines]
    hosts_new = sum(not o.one_space for o in bought)
    usd_h = sum(o.usd_per_hour for o in bought)
    out: list[tuple[str, bool]] = []
    if c.max_new_hosts is not None:
        n = c.max_new_hosts
        out.append(("max_new_hosts reached: no more new hosts (the hosts running count against it)" if n == 0 else
                    f"max_new_hosts: at most {n} new host{'s' if n > 1 else ''}" + (f" (all {n} used)" if hosts_new >= n else ""),
                    hosts_new >= n and any(not o.one_space for o in fits)))
    if c.exact_new_hosts is not None:
        n = c.exact_new_hosts
        said = ("hosts=0: the request adds no machine" if n == 0 else
                f"hosts={n}: the request adds exactly {n} machine{'s' if n > 1 else ''}")
        if n > 0 and hosts_new != n:
            said += _pin_blocked(model, fits, n)
        out.append((said, True))
    if c.max_usd_per_hour is not None:
        least = min((o.usd_per_hour for o in fits), default=0.0)
        reached = usd_h + least > c.max_usd_per_hour + 1e-9
        out.append((_usd_cap_said(c, usd_h if reached else None), reached))
    if c.monthly_usd_left is not None:
        spent = 0.0 if sol is None else cost_usd(model, sol)
        grp = None if g is None else model.groups[g]
        least = min((o.usd_per_hour * billed_secs(o, grp.duration_secs) / 3600 for o in fits), default=0.0)
        reached = spent + least > c.monthly_usd_left + 1e-9
        out.append(("monthly_usd reached: nothing left this month" if c.monthly_usd_left <= 0
                    else f"monthly_usd_left={round(c.monthly_usd_left, 6)}" + (f" (${spent:.4f} planned)" if reached else ""),
                    reached))
    for f, v in sorted(c.quotas.items()):
        used = sum(o.vcpus for o in bought if o.quota_family == f)
        least = min((o.vcpus for o in fits if o.quota_family == f), default=None)
        reached = least is not None and used + least > v
        out.append((_running_cap_said(f"quota {f}", v, c.quota_running.get(f, 0), used if reached else None,
                                      " vCPUs"), reached))
    for o in model.offers:
        if o.limit is not None:
            n = sum(b is o for b in bought)
            run = c.limit_running.get(f"{o.provider}/{o.type_name}", 0)
            out.append((_limit_said(o, run, n), n >= o.limit and o in limited))
    return out


def _running_cap_said(cap: str, left: int, run: int, used: int | None, unit: str) -> str:
    """A cloud's quota as the operator set it (``left``, what the machines running leave, and
    ``run``, what they take), worded as ``_usd_cap_said`` words the $/h cap; with what the plan
    uses of it when ``used`` is given."""
    if not run:
        return f"{cap}={left}" + (f" ({used}{unit} used)" if used is not None else "")
    if left <= 0:
        return f"{cap}={run} reached: the machines running leave none for new machines"
    if used is None:
        return f"{cap}={left + run} ({run}{unit} running)"
    return f"{cap}={left + run} ({run + used}{unit} used: {run} running, {used} this plan)"


def _limit_said(o: Offer, run: int, n: int | None) -> str:
    """A type's limit as set (``o.limit``, what the machines running leave, and ``run``, what
    they take), with "(all used)" when the plan's ``n`` machines of it use the rest."""
    if run and not o.limit:
        return _running_cap_said(f"limit {o.type_name}", 0, run, None, "")
    said = f"limit {o.type_name}={o.limit + run}"
    if n is not None and n >= o.limit:
        return said + (f" (all used: {run} running, {n} this plan)" if run else " (all used)")
    return said + (f" ({run} running)" if run else "")


def _usd_cap_said(c: Constraints, usd_h: float | None) -> str:
    """``max_usd_per_hour`` as the operator set it, with the $/h it counts when ``usd_h`` (what
    the plan adds) is given: the budget's cap counts the machines running already too
    (``running_usd_per_hour``; the model's cap is what they leave of it, 0 when they fill it)."""
    run = c.running_usd_per_hour or 0.0
    if c.max_usd_per_hour <= 0:
        return (f"max_usd_per_hour reached: the ${run:.4f}/h running leaves no $/h for new machines" if run
                else "max_usd_per_hour reached: no $/h left for new machines")
    said = f"max_usd_per_hour={round(c.max_usd_per_hour + run, 6)}"
    if usd_h is None:
        return said + (f" (${run:.4f}/h running)" if run else "")
    if not run:
        return said + f" (${usd_h:.4f}/h used)"
    return said + f" (${run + usd_h:.4f}/h used: ${run:.4f}/h running, ${usd_h:.4f}/h this plan)"


def _pin_blocked(model: PlanModel, fits: list, n: int) -> str:
    """What keeps ``n`` new machines (the hosts pin) from being bought at all, in words
    (" (...)"), or "": the new-host cap, the clouds' quotas, the types' limits, the $/h cap."""
    c = model.constraints
    hosts = sorted((o for o in fits if not o.one_space), key=lambda o: o.usd_per_hour)
    if c.max_new_hosts is not None and c.max_new_hosts < n:
        return f" (max_new_hosts={c.max_new_hosts} allows fewer)"
    # the most machines the quotas let in: the fewest vCPUs first (a limit is said below)
    left, most, cut = dict(c.quotas), 0, set()
    for o in sorted(hosts, key=lambda o: (o.vcpus, o.usd_per_hour)):
        k = n - most if o.limit is None else min(n - most, o.limit)
        if o.quota_family in left and left[o.quota_family] // o.vcpus < k:
            k = left[o.quota_family] // o.vcpus
            cut.add(o.quota_family)
        if o.quota_family in left:
            left[o.quota_family] -= k * o.vcpus
        most += k
        if most >= n:
            break
    if most < n and cut:
        quotas = ", ".join(_running_cap_said(f"quota {f}", c.quotas[f], c.quota_running.get(f, 0), None, " vCPUs")
                           for f in sorted(cut))
        return f" (the quotas let {most} of them in: {quotas})"
    cheapest: list[float] = []
    for o in hosts:  # the n cheapest machines the types' limits allow
        cheapest += [o.usd_per_hour] * min(n - len(cheapest), n if o.limit is None else o.limit)
        if len(cheapest) >= n:
            break
    if len(cheapest) < n:
        limits = ", ".join(_limit_said(o, run, None) for o in hosts if o.limit is not None and
                           (run := c.limit_running.get(f"{o.provider}/{o.type_name}", 0)))
        return (f" (the machine types that can take it allow {len(cheapest)} in all"
                + (f": {limits})" if limits else ")")) if hosts else ""
    if c.max_usd_per_hour is not None and sum(cheapest) > c.max_usd_per_hour + 1e-9:
        run = c.running_usd_per_hour or 0.0
        return (f" (the cheapest {n} cost ${sum(cheapest):.4f}/h, over " + (
            f"the ${c.max_usd_per_hour:.4f}/h that max_usd_per_hour={round(c.max_usd_per_hour + run, 6)} leaves "
            f"beside the ${run:.4f}/h running)" if run else f"max_usd_per_hour={round(c.max_usd_per_hour, 6)})"))
    return ""


def unplaced_reason(model: PlanModel, g: int, sol: Solution | None = None) -> str:
    """Why group g (partly) has no place: no machine can hold it at all, or the caps (those
    ``sol`` has reached, when it has reached some: else every cap, as packing may be why)."""
    grp, c = model.groups[g], model.constraints
    on_hosts = Counter(host_reject(grp, h, c) for h in model.hosts)
    on_offers = Counter(offer_reject(grp, o, c) for o in model.offers)
    host_names: dict[str, list[str]] = {}
    for h in model.hosts:
        if (why := host_reject(grp, h, c)) is not None:
            host_names.setdefault(why, []).append(h.name)

    def said_hosts(why: Counter) -> str:
        def named(r: str) -> str:
            names = host_names.get(r, [])
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return f"{r} ({', '.join(names[:3])}{more})" if names else r
        return "; ".join(named(r) for r, _ in why.most_common(4) if r is not None)

    def said_offers(why: Counter) -> str:
        return "; ".join(f"{r} ({n} machine types)" if n > 1 else r for r, n in why.most_common(4) if r is not None)

    if on_hosts[None] == 0 and on_offers[None] == 0:
        if not on_hosts and not on_offers:  # (what the pool ruled out before the model: said by the caller)
            return "no host or cloud machine type can take it"
        parts = [x for x in (said_hosts(on_hosts) if on_hosts else "", said_offers(on_offers) if on_offers else "") if x]
        return "no machine can hold it: " + "; ".join(parts)
    # why the hosts take none of it, when none does (a full host's vm_count, its room...)
    hosts = f"no host can take it: {said_hosts(on_hosts)}" if on_hosts and not on_hosts[None] else ""
    if on_offers[None] == 0:  # (a request's no_scale or devices_only, allow_metal, pins: not the caps)
        if c.exact_new_hosts:  # (the hosts may have room: the pin's machines are what cannot be)
            n = c.exact_new_hosts
            return (f"hosts={n}: the request adds exactly {n} machine{'s' if n > 1 else ''}, and no new "
                    "machine may take it: " + (said_offers(on_offers) if on_offers else "no offers"))
        return ("no room left on the hosts that can hold it, and no new machine may: " + said_offers(on_offers)
                if on_offers else "no room left on the hosts that can hold it, and no offers")
    checks = _cap_checks(model, sol, g)
    if not checks:
        return hosts or "no room left in the pool"
    reached = [said for said, hit in checks if hit]
    caps = reached or [said for said, _ in checks]
    caps = [x for x in caps if not any(x != y and x in y for y in caps)]  # (said once: a pin's words name it)
    lead = f"{hosts}; and no new machine within the caps: " if hosts else "no room within the caps: "
    return lead + ", ".join(caps)


def to_plan(model: PlanModel, sol: Solution, *, solver: str, lower_bound_usd: float,
            notes: list[str] | None = None) -> ElasticPlan:
    """Render ``sol`` as the seed's ``ElasticPlan``, with one explain line per decision."""
    groups, hosts, offers = model.groups, model.hosts, model.offers
    assignments, explain = [], []
    durs = host_durations(model, sol)
    for (g, h), k in sorted(sol.on_hosts.items()):
        if k <= 0:
            continue
        host = hosts[h]
        # a host in the pool has the group's image (those without it are left out of the
        # model; one whose agent does not list its images is taken to have it, as placement does)
        assignments.append(ElasticAssignment(group=groups[g].name, host=host.name, count=k, sync=False))
        if host.own:
            why = "own device, free"
        else:
            extra = host.usd_per_hour * extra_secs(host, durs[h]) / 3600
            why = f"running cloud host, ${extra:.4f} extra billed" if extra else "running cloud host, within paid time"
            if host.scaler_cordoned:
                why += "; the scaler had cordoned it: its VMs uncordon it"
        explain.append(f"{k} × {groups[g].name} on {host.name} ({why})")
    new_hosts = []
    for i, m in enumerate(sol.machines):
        o = offers[m.offer]
        billed = machine_billed_secs(model, m)
        new_hosts.append(ElasticNewHost(provider=o.provider, type_name=o.type_name, region=o.region,
                                        usd_per_hour=o.usd_per_hour, boot_secs=o.boot_secs,
                                        billed_secs=billed, one_space=o.one_space))
        what = []
        for g, k in sorted(m.counts.items()):
            if k > 0:
                # a new machine holds nothing yet: the image is put there before its VMs start
                assignments.append(ElasticAssignment(group=groups[g].name, host="", new_index=i, count=k, sync=True))
                what.append(f"{k} × {groups[g].name}")
        explain.append(f"new #{i} {o.key} (${o.usd_per_hour}/h, {billed} s billed = "
                       f"${o.usd_per_hour * billed / 3600:.4f}, boots in {o.boot_secs} s): {', '.join(what)}")
    unplaced = []
    for g, p in enumerate(sol.placed(len(groups))):
        if p < groups[g].count:
            reason = unplaced_reason(model, g, sol)
            unplaced.append(ElasticUnplaced(group=groups[g].name, count=groups[g].count - p, reason=reason))
            explain.append(f"{groups[g].count - p} × {groups[g].name} unplaced: {reason}")
    projected = cost_usd(model, sol)
    explain.append(f"solver {solver}: ${projected:.4f} projected, lower bound ${lower_bound_usd:.4f}")
    explain.extend(notes or [])
    plan = ElasticPlan(assignments=assignments, new_hosts=new_hosts, unplaced=unplaced,
                       added_usd_per_hour=round(added_usd_per_hour(model, sol), 6),
                       projected_usd=round(projected, 6), lower_bound_usd=round(min(lower_bound_usd, projected), 6),
                       solver=solver, ready_in_secs=ready_in_secs(model, sol), explain=explain)
    body = {"model": model.model_dump(mode="json"), "plan": plan.model_dump(mode="json", exclude={"json"})}
    return plan.model_copy(update={"json": json.dumps(body, sort_keys=True)})


def rejson(plan: ElasticPlan) -> ElasticPlan:
    """``plan`` with its ``json`` saying the plan as it is now (the model it saw kept): what the
    controller added to the answer after the solve (machines an apply bought, hosts joining,
    the image's reasons) is part of the whole answer an agent keeps."""
    body = json.loads(plan.json) if plan.json else {}
    body["plan"] = plan.model_dump(mode="json", exclude={"json"})
    return plan.model_copy(update={"json": json.dumps(body, sort_keys=True)})
