"""The per-machine model: small plans solved exactly, every new machine named.

The aggregate model (``formulation.build``) counts the machines of each (type,
billing class) cell and sums their room: a relaxation, whose answer may not
split onto whole machines; the pattern model (``search``) packs by construction
but does not take the ``hosts`` pin. When the planner's answer is not proven
and time is left, a small model is solved once more with each new machine a
slot of its own (notation: ``planner``):

  s_ji ∈ {0,1}   slot j is a machine of cell i = (t, k);  Σ_i s_ji ≤ 1
  v_gj ∈ ℕ      VMs of g on slot j (together: n_g·w_gj)
  v_gj ≤ Σ_{i ∋ g} q_gt s_ji,  Σ_g c_g v_gj ≤ Σ_i C_t s_ji,  Σ_g m_g v_gj ≤ Σ_i M_t s_ji,
  Σ_g v_gj ≥ Σ_i s_ji (no empty machine), ≤ 1 on a one-VM sandbox;
  N_tk = Σ_j s_ji joins the existing hosts' rows, the caps, quotas, limits, the
  hosts pin and the budget exactly as in the aggregate model.

So every answer packs, and the model is exact: stage 1 (the most VMs placed)
and stage 2 (the least cost for that many) proven here prove the plan. When a
relaxation has proven the most placeable, stage 2 is tried at that count first:
whole machines mostly hold it, and then one solve proves both.
Slots are ordered by their cell (a used slot's index above every unused one's
0), so each plan is searched in one order of its machines, not J! of them.
J, the slots, is the most machines a plan can use: each holds a VM, so at most
the VMs; fewer under the caps. Only models of at most ``MAX_SLOTS`` slots and
``MAX_CELLS`` (slot, cell) pairs are tried: past that the aggregate and pattern
models are the better tools.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from fuse.controller.pool import formulation as F
from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.solution import Machine, Solution

MAX_SLOTS, MAX_CELLS = 100, 4000
MIN_SECS = 0.05  # less time left than this: not started
BUILD_SECS = 25e-6  # per (slot, cell) pair: building the model (0.1 s at MAX_CELLS, measured)


@dataclass
class SlotModel:
    f: F.Formulation
    cells: list[F.Cell]
    s: list[list[Any]] = field(default_factory=list)  # [j][i] -> slot j is a machine of cell i
    v: list[dict[int, Any]] = field(default_factory=list)  # [j] -> {g: VMs of g on slot j}


@dataclass
class Answer:
    sol: Solution
    most_proven: bool  # no plan places more VMs
    cost_proven: bool  # no plan placing as many costs less
    bound_usd: float  # a lower bound on plans placing at least ``sum(sol.placed)`` VMs


def slots_needed(model: PlanModel, cells: list[F.Cell]) -> int:
    """The most new machines any plan can use (each holds at least one VM)."""
    c, total = model.constraints, sum(g.count for g in model.groups)
    j = total
    hosts_cap = min((x for x in (c.max_new_hosts, c.exact_new_hosts) if x is not None), default=None)
    if hosts_cap is not None:
        sandboxes = sum(cell.ub for cell in cells if model.offers[cell.t].one_space)
        j = min(j, hosts_cap + sandboxes)
    by_type: dict[int, int] = {}
    for cell in cells:  # a cell's ub holds its type's limit and the $/h cap
        by_type[cell.t] = max(by_type.get(cell.t, 0), cell.ub)
    j = min(j, sum(by_type.values()))
    prices = [model.offers[cell.t].usd_per_hour for cell in cells]
    if c.max_usd_per_hour is not None and prices and min(prices) > 0:
        j = min(j, int(min(j, c.max_usd_per_hour / min(prices) + 1e-9)))  # (in floats first: it may be infinite)
    return max(j, 0)


def build(model: PlanModel, kept: list[int], n_slots: int) -> SlotModel:
    from ortools.sat.python import cp_model

    groups = model.groups
    f = F.Formulation(m=cp_model.CpModel())
    m = f.m
    terms = F.Terms(placed=[[] for _ in groups])
    F.existing_hosts(f, model, terms)
    f.classes, all_cells = F.cells(model, kept)
    sm = SlotModel(f=f, cells=all_cells)
    total = sum(g.count for g in groups)
    offers = [model.offers[cell.t] for cell in all_cells]
    allowed = {g: [(i, cell.q[g]) for i, cell in enumerate(all_cells) if g in cell.q] for g in range(len(groups))}
    prev_index = None
    for j in range(n_slots):
        s = [m.new_bool_var(f"s{j}_{i}") for i in range(len(all_cells))]
        used = sum(s)
        m.add(used <= 1)
        v: dict[int, Any] = {}
        for g, where in allowed.items():
            if not where:
                continue
            grp = groups[g]
            if grp.together:
                w = m.new_bool_var(f"w{g}_{j}")
                m.add(w <= sum(s[i] for i, _ in where))
                v[g] = grp.count * w
            else:
                v[g] = m.new_int_var(0, min(grp.count, max(q for _, q in where)), f"v{g}_{j}")
                m.add(v[g] <= sum(q * s[i] for i, q in where))
            terms.placed[g].append(v[g])
        vms = sum(v.values())
        m.add(sum(groups[g].cpus * e for g, e in v.items()) <= sum(cell.cap_cpu * s[i] for i, cell in enumerate(all_cells)))
        m.add(sum(groups[g].mem_mib * e for g, e in v.items()) <= sum(o.mem_mib * s[i] for i, o in enumerate(offers)))
        m.add(vms >= used)  # no empty machine
        m.add(vms <= sum((1 if o.one_space else total) * s[i] for i, o in enumerate(offers)))
        index = sum((i + 1) * s[i] for i in range(len(all_cells)))  # 0: no machine
        if prev_index is not None:
            m.add(prev_index >= index)
        prev_index = index
        sm.s.append(s)
        sm.v.append(v)
    by_type: dict[int, list[Any]] = {}
    for i, cell in enumerate(all_cells):
        n = sum(s[i] for s in sm.s)  # N_tk (0 with no slots)
        if sm.s:
            m.add(n <= cell.ub)
        by_type.setdefault(cell.t, []).append(n)
        F.machines_of(model, cell, n, terms)
    for t, n_type in by_type.items():
        if model.offers[t].limit is not None:
            m.add(sum(n_type) <= model.offers[t].limit)
    F.close_rows(f, model, terms)
    return sm


def hint(sm: SlotModel, model: PlanModel, sol: Solution) -> None:
    """Start from ``sol``: its hosts' counts, its machines in the slots' order."""
    m, groups = sm.f.m, model.groups
    for (g, h), expr in sm.f.x.items():
        k = sol.on_hosts.get((g, h), 0)
        if groups[g].together:
            m.add_hint(sm.f._hint_vars["w", "x", g, h], int(k > 0))
        else:
            m.add_hint(expr, k)
    cell_of = {(cell.t, cell.k): i for i, cell in enumerate(sm.cells)}
    slots = []
    for mach in sol.machines:
        d = max(groups[g].duration_secs for g, k in mach.counts.items() if k > 0)
        ks = sm.f.classes.get(mach.offer, [])
        i = cell_of.get((mach.offer, ks.index(d))) if d in ks else None
        if i is None:
            return  # a type pruned as dominated, or out of the caps: no hint for the machines
        slots.append((i, mach.counts))
    slots.sort(key=lambda x: -x[0])
    for j, s in enumerate(sm.s):
        i_j, counts = slots[j] if j < len(slots) else (None, {})
        for i, var in enumerate(s):
            m.add_hint(var, int(i == i_j))
        for g, e in sm.v[j].items():
            if groups[g].together:
                continue  # (an expression n_g·w: its w takes the hint from the counts' solve)
            m.add_hint(e, counts.get(g, 0))


def realise(sm: SlotModel, solver: Any) -> Solution:
    sol = Solution()
    for (g, h), expr in sm.f.x.items():
        k = int(solver.value(expr))
        if k:
            sol.on_hosts[g, h] = k
    for s, v in zip(sm.s, sm.v):
        i = next((i for i, var in enumerate(s) if solver.value(var)), None)
        if i is None:
            continue
        counts = {g: int(solver.value(e)) for g, e in v.items() if solver.value(e)}
        sol.machines.append(Machine(offer=sm.cells[i].t, counts=counts))
    return sol


def solve(model: PlanModel, kept: list[int], start: Solution, most_known: int | None,
          deadline: float) -> Answer | None:
    """The per-machine model's best plan by ``deadline``, or None (too big, out of time,
    nothing found). ``most_known``: the most VMs any plan may place, when proven (by a
    relaxation: whole machines may hold fewer)."""
    _, all_cells = F.cells(model, kept)
    n_slots = slots_needed(model, all_cells)
    size = n_slots * len(all_cells)
    if n_slots > MAX_SLOTS or size > MAX_CELLS or deadline - time.monotonic() < MIN_SECS + BUILD_SECS * size:
        return None
    total = sum(g.count for g in model.groups)
    placed = sum(start.placed(len(model.groups)))
    if placed >= total or (most_known is not None and placed >= most_known):
        return _least_cost(model, kept, n_slots, start, placed, True, deadline)
    if most_known is not None:
        # the relaxation's most, tried at once: whole machines mostly hold it, and then
        # this one solve proves both the count and the cost
        got = _least_cost(model, kept, n_slots, start, most_known, True, deadline, or_infeasible=True)
        if got != "infeasible":
            return got
    # stage 1: the most VMs placeable
    sm = build(model, kept, n_slots)
    sm.f.m.maximize(sum(sm.f.placed))
    hint(sm, model, start)
    st, solver = F.run(sm.f, model, 0.5 * (deadline - time.monotonic()))
    if st == "infeasible" or (st == "optimal" and round(solver.objective_value) == 0):
        return Answer(Solution(), True, True, 0.0)  # (no plan places a VM: the pins admit none)
    if st not in ("optimal", "feasible"):
        return None
    most = int(round(solver.objective_value))
    if most <= placed and st != "optimal":
        return None  # (nothing more found, nothing proven)
    best = realise(sm, solver) if most > placed else start
    got = _least_cost(model, kept, n_slots, best, max(most, placed), st == "optimal", deadline)
    if got is None and best is not start:
        return Answer(best, st == "optimal", False, 0.0)
    return got


def _least_cost(model: PlanModel, kept: list[int], n_slots: int, start: Solution, at_least: int,
                most_proven: bool, deadline: float, or_infeasible: bool = False) -> Answer | str | None:
    """Stage 2: the least cost placing ``at_least`` VMs, from ``start``; "infeasible" (when
    ``or_infeasible``) if no plan places that many."""
    if deadline - time.monotonic() < MIN_SECS:
        return None
    sm = build(model, kept, n_slots)
    sm.f.m.add(sum(sm.f.placed) >= at_least)
    sm.f.m.minimize(sm.f.cost)
    hint(sm, model, start)
    st, solver = F.run(sm.f, model, deadline - time.monotonic())
    if st == "infeasible" and or_infeasible:
        return "infeasible"
    if st not in ("optimal", "feasible"):
        return None
    bound = max(0, math.ceil(solver.best_objective_bound - 1e-6)) / F.MICRO
    return Answer(realise(sm, solver), most_proven, st == "optimal", bound)
