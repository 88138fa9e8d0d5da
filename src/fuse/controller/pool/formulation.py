"""The CP-SAT model of the planner (notation and objective: ``planner`` docstring).

Split from ``planner`` so the orchestration (stages, packing, fallback) reads
apart from the algebra. OR-Tools is imported inside the functions that use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fuse.controller.pool.model import (
    PlanModel,
    billed_secs,
    extra_secs,
    fits_per_machine,
    host_fits,
    host_reject,
    host_vcpus,
    offer_reject,
    offer_vcpus,
)
from fuse.controller.pool.solution import Solution

MICRO = 1_000_000
# CP-SAT's integers are int64, and it refuses a model whose rows could sum past them: the
# costs any plan can reach, in micro-USD, must stay below this for the exact models (``too_large``)
LIMIT = 2**62


@dataclass
class Formulation:
    m: Any  # cp_model.CpModel
    x: dict[tuple[int, int], Any] = field(default_factory=dict)  # (g, h) -> VMs (expr)
    n: dict[tuple[int, int], Any] = field(default_factory=dict)  # (t, k) -> machines
    z: dict[tuple[int, int, int], Any] = field(default_factory=dict)  # (g, t, k) -> VMs (expr)
    groups_on: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    classes: dict[int, list[int]] = field(default_factory=dict)  # t -> [δ_k]
    placed: list[Any] = field(default_factory=list)
    cost: Any = 0
    tie: Any = 0
    tie_max: int = 0
    _hint_vars: dict[Any, int] = field(default_factory=dict)

    def hint(self, model: PlanModel, sol: Solution) -> None:
        """Start the search from ``sol`` (the first-fit plan): a feasible incumbent at once."""
        want: dict[tuple, int] = {}
        for (g, h), k in sol.on_hosts.items():
            want["x", g, h] = want.get(("x", g, h), 0) + k
        for mach in sol.machines:
            d = max(model.groups[g].duration_secs for g, k in mach.counts.items() if k > 0)
            ks = self.classes.get(mach.offer, [])
            if d not in ks:
                return  # the machine's type was pruned as dominated: no exact hint
            k = ks.index(d)
            want["n", mach.offer, k] = want.get(("n", mach.offer, k), 0) + 1
            for g, c in mach.counts.items():
                want["z", g, mach.offer, k] = want.get(("z", g, mach.offer, k), 0) + c
        for key, var in self._hint_vars.items():
            self.m.add_hint(var, want.get(key, 0) if key[0] != "w" else int(want.get(key[1:], 0) > 0))


    def hint_from(self, other: "Formulation", solver: Any) -> None:
        """Start from another formulation's solution (same model, same variable keys)."""
        for key, var in self._hint_vars.items():
            src = other._hint_vars.get(key)
            if src is not None:
                self.m.add_hint(var, solver.value(src))


def dominators(model: PlanModel) -> dict[int, int]:
    """Offer t -> an offer u that dominates it (resolved to one that is itself kept).

    u dominates t when every group admitted to t (rules and size) is admitted
    to u, u is at least as big (vCPUs and memory), no dearer per hour (the
    hourly cap), no dearer billed for any duration of those groups, has no
    limit, no capped quota family and is not a one-VM sandbox, and either boots
    no slower or is strictly cheaper for every such duration. Then any plan can
    swap each t machine for a u machine at no more cost (strictly less in the
    second case, so t is in no optimal plan) and no cap breaks: dropping t keeps
    the optimum and the bound. Arch only matters through the groups: with no
    arch pin amd64 and arm64 types compete. Of two equal offers the first stays.
    Offers pinned by a group's instance_type and one-VM sandboxes are never dropped.
    """
    c, offers, groups = model.constraints, model.offers, model.groups
    pinned = {g.instance_type for g in groups if g.instance_type}
    admits = [frozenset(g for g, grp in enumerate(groups) if offer_reject(grp, o, c) is None) for o in offers]
    dom: dict[int, int] = {}
    for t, o in enumerate(offers):
        if o.one_space or o.type_name in pinned or not admits[t]:
            continue  # an offer no group may use has no variables anyway
        durs = sorted({groups[g].duration_secs for g in admits[t]})
        cost_t = [o.usd_per_hour * billed_secs(o, d) for d in durs]
        for u, p in enumerate(offers):
            if u == t or p.one_space or p.limit is not None or p.quota_family in c.quotas:
                continue
            if p.vcpus < o.vcpus or p.mem_mib < o.mem_mib or p.usd_per_hour > o.usd_per_hour:
                continue
            if not admits[t] <= admits[u]:
                continue
            cost_u = [p.usd_per_hour * billed_secs(p, d) for d in durs]
            if any(a > b + 1e-12 for a, b in zip(cost_u, cost_t)):
                continue
            strict = all(a < b - 1e-12 for a, b in zip(cost_u, cost_t))
            if p.boot_secs > o.boot_secs and not strict:
                continue
            same = (p.vcpus, p.mem_mib, p.usd_per_hour, p.boot_secs, admits[u], cost_u) == \
                   (o.vcpus, o.mem_mib, o.usd_per_hour, o.boot_secs, admits[t], cost_t)
            if not same or u < t:  # of two equal offers keep the first
                dom[t] = u
                break
    for t in list(dom):  # follow chains to a kept offer (dominance is transitive)
        u, seen = dom[t], {t}
        while u in dom and u not in seen:  # no cycles (a strict order), guarded all the same
            seen.add(u)
            u = dom[u]
        dom[t] = u
    return dom


def undominated_offers(model: PlanModel) -> list[int]:
    """Offer indices worth modelling: those no other offer dominates (see ``dominators``)."""
    dom = dominators(model)
    return [t for t in range(len(model.offers)) if t not in dom]


@dataclass
class Cell:
    """New machines of one offer in one billing class: who may go there and what one costs."""

    t: int  # the offer
    k: int  # its billing class: the groups' durations allowed on t, sorted
    delta: int  # the class's duration δ_k (its machines are billed for it)
    on: list[int]  # groups allowed on t with duration ≤ δ_k
    q: dict[int, int]  # VMs of each of those groups one machine holds
    ub: int  # the most machines of the cell any plan may have (caps applied)
    kappa: int  # micro-USD one machine costs (κ_tk)
    cap_cpu: int  # sellable vCPUs of one machine


def cells(model: PlanModel, kept: list[int]) -> tuple[dict[int, list[int]], list[Cell]]:
    """The billing classes of each kept offer (t -> [δ_k]) and their cells, by (t, k)."""
    c, groups = model.constraints, model.groups
    classes: dict[int, list[int]] = {}
    out: list[Cell] = []
    for t in kept:
        o = model.offers[t]
        ok = [g for g, grp in enumerate(groups) if offer_reject(grp, o, c) is None]
        if not ok:
            continue
        deltas = sorted({groups[g].duration_secs for g in ok})
        classes[t] = deltas
        cap_cpu = offer_vcpus(o, c)
        for k, delta in enumerate(deltas):
            on = [g for g in ok if groups[g].duration_secs <= delta]
            ub = sum(groups[g].count for g in on)
            for lim in (o.limit, c.max_new_hosts if not o.one_space else None, c.exact_new_hosts if not o.one_space else None):
                if lim is not None:
                    ub = min(ub, lim)
            if c.max_usd_per_hour is not None and o.usd_per_hour > 0:
                # (in floats first: a cap of 1e300 over a price of 1e-10 is infinite)
                ub = min(ub, int(min(ub, c.max_usd_per_hour / o.usd_per_hour + 1e-9)))
            if ub <= 0:
                continue
            q = {g: 1 if o.one_space else fits_per_machine(groups[g], cap_cpu, o.mem_mib) for g in on}
            kappa = micro_cost(o.usd_per_hour, billed_secs(o, delta))
            out.append(Cell(t=t, k=k, delta=delta, on=on, q=q, ub=ub, kappa=kappa, cap_cpu=cap_cpu))
    return classes, out


@dataclass
class Terms:
    """What the rows over the whole plan sum: built by the machines' part, closed by ``close_rows``."""

    placed: list[list[Any]]
    cost: list[Any] = field(default_factory=list)
    tie: list[Any] = field(default_factory=list)
    usd: list[Any] = field(default_factory=list)  # micro-USD/h of new machines
    hosts: list[Any] = field(default_factory=list)  # new machines that are hosts (not sandboxes)
    family: dict[str, list[Any]] = field(default_factory=dict)  # quota family -> vCPUs
    tie_max: int = 0
    # the most ``cost`` and ``usd`` can sum to under the cells' bounds: a cap at or above it
    # binds nothing, so it is no row (a budget's $1e13 was past int64 in micro-USD: a TypeError)
    cost_hi: int = 0
    usd_hi: int = 0


def existing_hosts(f: Formulation, model: PlanModel, terms: Terms) -> None:
    """The existing hosts: explicit machines, so exact."""
    c, groups, m = model.constraints, model.groups, f.m
    for h, host in enumerate(model.hosts):
        on_h = []
        extra = []
        for g, grp in enumerate(groups):
            if host_reject(grp, host, c) is not None:
                continue
            if grp.together:
                w = m.new_bool_var(f"wh{g}_{h}")
                f._hint_vars["w", "x", g, h] = w
                expr = grp.count * w
            else:
                cap = min(grp.count, host_fits(grp, host, c))
                expr = m.new_int_var(0, cap, f"x{g}_{h}")
                f._hint_vars["x", g, h] = expr
            f.x[g, h] = expr
            terms.placed[g].append(expr)
            on_h.append((grp, expr))
            kappa = micro_cost(host.usd_per_hour, extra_secs(host, grp.duration_secs))
            if kappa > 0:
                extra.append((kappa, expr, grp.count))
            if not host.own:
                terms.tie.append(expr)
                terms.tie_max += grp.count
        if not on_h:
            continue
        m.add(sum(gr.cpus * e for gr, e in on_h) <= host_vcpus(host, c))
        m.add(sum(gr.mem_mib * e for gr, e in on_h) <= host.mem_mib)
        if host.max_vms is not None:
            m.add(sum(e for _, e in on_h) <= host.max_vms)  # its vm_count policy
        if extra:
            e_h = m.new_int_var(0, max(k for k, _, _ in extra), f"e{h}")
            for kappa, expr, n in extra:
                y = m.new_bool_var("")
                m.add(expr <= n * y)
                m.add(e_h >= kappa * y)
            terms.cost.append(e_h)
            terms.cost_hi += max(k for k, _, _ in extra)


def machines_of(model: PlanModel, cell: Cell, n: Any, terms: Terms) -> None:
    """What ``n`` machines of ``cell`` add to the rows over the whole plan."""
    o = model.offers[cell.t]
    terms.cost.append(cell.kappa * n)
    terms.usd.append(round(o.usd_per_hour * MICRO) * n)
    terms.cost_hi += cell.kappa * cell.ub
    terms.usd_hi += round(o.usd_per_hour * MICRO) * cell.ub
    if not o.one_space:
        terms.hosts.append(n)
    terms.family.setdefault(o.quota_family, []).append(o.vcpus * n)


def close_rows(f: Formulation, model: PlanModel, terms: Terms) -> None:
    """The caps, quotas, hosts pin and budget over the whole plan; placed counts and cost."""
    c, groups, m = model.constraints, model.groups, f.m
    for fam, fam_terms in terms.family.items():
        if fam in c.quotas:
            m.add(sum(fam_terms) <= c.quotas[fam])
    if c.max_usd_per_hour is not None and (cap := c.max_usd_per_hour * MICRO + 1e-6) < terms.usd_hi:
        m.add(sum(terms.usd) <= int(cap))
    if c.max_new_hosts is not None:
        m.add(sum(terms.hosts) <= c.max_new_hosts)
    if c.exact_new_hosts is not None:
        m.add(sum(terms.hosts) == c.exact_new_hosts)
    for g, placed in enumerate(terms.placed):
        expr = sum(placed) if placed else 0
        if placed:
            # for a together group this is Σ n_g·w ≤ n_g, i.e. at most one machine
            m.add(expr <= groups[g].count)
        f.placed.append(expr)
    f.cost = sum(terms.cost) if terms.cost else 0
    if c.monthly_usd_left is not None and (cap := c.monthly_usd_left * MICRO) < terms.cost_hi:
        m.add(f.cost <= int(cap))


def micro_cost(usd_per_hour: float, secs: int) -> int:
    """Micro-USD ``secs`` seconds cost at ``usd_per_hour`` (floored: κ)."""
    return int(usd_per_hour * secs * MICRO // 3600)


def too_large(model: PlanModel, kept: list[int]) -> str | None:
    """Why the exact models cannot count this model's costs in int64 micro-USD, or None: the
    most every plan could cost (each cell's machines at their bound, each running host's extra
    time) must stay below ``LIMIT``, and so must the $/h of those machines when a cap binds them.
    (A price is at most ``MAX_USD_PER_HOUR``, u32 $/h, and a year of one machine at $4e9/h is
    past it: first fit, in floats, answers such a model.)"""
    c = model.constraints
    _, all_cells = cells(model, kept)
    parts = [(cell.kappa * cell.ub, f"{cell.ub} × {model.offers[cell.t].key} at ${model.offers[cell.t].usd_per_hour:g}/h "
              f"for {billed_secs(model.offers[cell.t], cell.delta)} s") for cell in all_cells]
    parts += [(max((micro_cost(h.usd_per_hour, extra_secs(h, g.duration_secs)) for g in model.groups), default=0),
               f"{h.name} at ${h.usd_per_hour:g}/h") for h in model.hosts]
    cost_hi = sum(p for p, _ in parts)
    usd_hi = sum(round(model.offers[cell.t].usd_per_hour * MICRO) * cell.ub for cell in all_cells)
    if c.max_usd_per_hour is None or c.max_usd_per_hour * MICRO + 1e-6 >= usd_hi:
        usd_hi = 0  # (no $/h row)
    if cost_hi < LIMIT and usd_hi < LIMIT:
        return None
    _, dearest = max(parts)
    return (f"a plan here could cost up to ${max(cost_hi, usd_hi) / MICRO:.4g} (most of it {dearest}), past what the "
            "exact models count in micro-dollars: first-fit decreasing answered, with no bound")


def build(model: PlanModel, kept: list[int]) -> Formulation:
    """The aggregate model over existing hosts and the kept offers (no objective yet)."""
    from ortools.sat.python import cp_model

    groups = model.groups
    f = Formulation(m=cp_model.CpModel())
    m = f.m
    terms = Terms(placed=[[] for _ in groups])
    existing_hosts(f, model, terms)

    # new machines: counts per (type, billing class)
    ready = m.new_int_var(0, max((model.offers[t].boot_secs for t in kept), default=0), "ready")
    total = sum(g.count for g in groups)
    f.classes, all_cells = cells(model, kept)
    by_type: dict[int, list[Any]] = {}
    for cell in all_cells:
        t, k, o = cell.t, cell.k, model.offers[cell.t]
        n = m.new_int_var(0, cell.ub, f"n{t}_{k}")
        f.n[t, k] = n
        f._hint_vars["n", t, k] = n
        f.groups_on[t, k] = cell.on
        by_type.setdefault(t, []).append(n)
        vms = []
        for g in cell.on:
            grp = groups[g]
            if grp.together:
                w = m.new_bool_var(f"wn{g}_{t}_{k}")
                f._hint_vars["w", "z", g, t, k] = w
                expr = grp.count * w
                m.add(w <= n)
            else:
                expr = m.new_int_var(0, min(grp.count, cell.q[g] * cell.ub), f"z{g}_{t}_{k}")
                f._hint_vars["z", g, t, k] = expr
                m.add(expr <= cell.q[g] * n)
            f.z[g, t, k] = expr
            terms.placed[g].append(expr)
            vms.append((grp, expr))
            terms.tie.extend([expr, expr])
        m.add(sum(gr.cpus * e for gr, e in vms) <= cell.cap_cpu * n)
        m.add(sum(gr.mem_mib * e for gr, e in vms) <= o.mem_mib * n)
        m.add(sum(e for _, e in vms) >= n)  # no empty machine
        if o.one_space:
            m.add(sum(e for _, e in vms) <= n)
        machines_of(model, cell, n, terms)
    for t, n_type in by_type.items():
        o = model.offers[t]
        used = m.new_bool_var(f"u{t}")
        m.add(sum(n_type) <= (o.limit if o.limit is not None else total) * used)
        m.add(ready >= o.boot_secs * used)
        if o.limit is not None:
            m.add(sum(n_type) <= o.limit)
    terms.tie_max += 2 * total + max((model.offers[t].boot_secs for t in kept), default=0)
    close_rows(f, model, terms)
    f.tie = sum(terms.tie) + ready
    f.tie_max = terms.tie_max
    return f


def run(f: Formulation, model: PlanModel, time_limit: float) -> tuple[str, Any]:
    """Solve on one core with the model's seed; returns (status name, solver)."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 0.05)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = model.seed
    st = solver.solve(f.m)
    names = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}
    return names.get(st, "unknown"), solver
