"""Pricing for the pattern model (``patterns``): the best new pattern of each machine type.

At row prices π (cover rows) and μ_tk (the caps'), the reduced cost of a pattern of
type t and class k is κ_tk + μ_tk − Σ_g π_g a_g. The best one per type is a bounded
knapsack over vCPUs × memory (× VMs on a host whose VM-count limit binds), solved as
one numpy dynamic programme per type (``_price``), or one per set of types whose rules
admit the same groups (``_price_shared``); a fractional screen (``_frac_bound``) skips
the classes that cannot price out and gives their bound. Kept apart from the master
(``pattern_master``) since it is the planner's hot loop and needs neither HiGHS nor
the LP's rows; the Benders cuts (``benders``) reuse its knapsack pieces.
"""

from __future__ import annotations

import math

import numpy as np

from fuse.controller.pool import knapsack
from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.patterns import MachineType

MAX_CELLS = 2_000_000  # DP table cells per type; beyond it the pattern model is not used
EPS = 1e-9


class TooBig(Exception):
    pass


def _frac_bound(vals: list[tuple[float, int, int, int, int]], cap_cpu: int, cap_mem: int,
                cap_vms: int | None = None) -> float:
    """An upper bound on Σ π a: the least of the one-resource fractional knapsacks
    (vCPUs, memory, and VMs by count when ``cap_vms`` is given).
    ``vals``: (value, vCPUs, MiB, units available, VMs per unit)."""
    best = math.inf
    dims = [(1, cap_cpu), (2, cap_mem)] + ([(4, cap_vms)] if cap_vms is not None else [])
    for dim, cap in dims:
        left, v = float(cap), 0.0
        for it in sorted(vals, key=lambda it: -it[0] / (it[dim] or 1e-12)):
            val, u, w = it[0], it[3], it[dim]
            take = min(u, left / w) if w else u
            v += take * val
            left -= take * w
            if left <= 0:
                break
        best = min(best, v)
    return best


def _price(model: PlanModel, ty: MachineType, pi: np.ndarray, mu: list[float],
           floor: list[float] | None = None) -> list[tuple[float, int, dict[int, int]]]:
    """(reduced cost, class, pattern) of the best pattern of each class of ``ty`` that prices out.
    ``floor[k]`` is set to a lower bound on the reduced cost of every pattern of class k
    (exact where the DP ran, the fractional bound where the screen stopped it)."""
    groups = model.groups
    out = []
    floor = floor if floor is not None else [0.0] * len(ty.deltas)
    if ty.one_space(model):
        for k, delta in enumerate(ty.deltas):
            cand = [(pi[g], g) for g in ty.groups if ty.cls[g] <= k and ty.q[g] >= 1
                    and (not groups[g].together or groups[g].count == 1)]
            floor[k] = math.inf
            if cand:
                v, g = max(cand)
                rc = ty.kappa[k] + mu[k] - v
                floor[k] = rc
                if rc < -1e-7:
                    out.append((rc, k, {g: 1}))
        return out
    # cheap screen: can any class price out?
    items = knapsack_items(groups, ty.groups, pi, ty.q)
    promising = []
    for k, delta in enumerate(ty.deltas):
        vals = [(v, wc, wm, u, mult) for g, v, wc, wm, u, mult in items if ty.cls[g] <= k]
        floor[k] = ty.kappa[k] + mu[k] - (_frac_bound(vals, ty.cap_cpu, ty.cap_mem, ty.slots) if vals else 0.0)
        if vals and floor[k] < -1e-7:
            promising.append(k)
    if not promising:
        return out
    unit = 0
    for _, _, _, wm, _, _ in items:
        unit = math.gcd(unit, wm)
    unit = math.gcd(unit, ty.cap_mem) or 1
    # S: the VM-count dimension, of size 1 (always 0 VMs counted) when no limit binds
    C, M, S = ty.cap_cpu, ty.cap_mem // unit, ty.slots or 0
    if (C + 1) * (M + 1) * (S + 1) > MAX_CELLS:
        raise TooBig
    f = np.zeros((C + 1, M + 1, S + 1))
    copies: list[tuple[int, int, int, int, int, float]] = []  # (g, VMs, wc, wm, ws, value)
    stage_end = {}
    last_k = max(promising)
    for k, delta in enumerate(ty.deltas):
        if k > last_k:
            break
        for g, v, wc, wm, u, mult in items:
            if ty.cls[g] != k:
                continue
            for n, cw, mw, sw in split(u, wc, wm // unit, mult if ty.slots is not None else 0, C, M, S):
                copies.append((g, n * mult, cw, mw, sw, v * n))
        stage_end[k] = len(copies)
    lims = knapsack.row_limits(f, [c[2:] for c in copies])
    masks = knapsack.run(f, [c[2:] for c in copies], record=True, lims=lims)
    for k in promising:
        counts = _backtrack(copies[:stage_end[k]], masks, C, M, S, lims)
        val = sum(pi[g] * n for g, n in counts.items())
        rc = ty.kappa[k] + mu[k] - val
        floor[k] = max(floor[k], rc)  # the DP's optimum: exact
        if rc < -1e-7 and counts:
            out.append((rc, k, counts))
    return out


def price_all(model: PlanModel, types: list[MachineType], pi: np.ndarray, mus: dict[tuple, list[float]],
              floors: dict | None = None) -> list[tuple[MachineType, float, int, dict[int, int]]]:
    """Price every type of ``types`` at prices π, with μ_t = ``mus[t.key]`` (per class):
    [(type, reduced cost, class, pattern)] of the best pattern of each class that prices
    out. Types admitting the same groups share one DP (``_price_shared``); a VM-count
    dimension or a one-VM sandbox is priced alone (``_price``). ``floors`` gets each
    class's lower bound on the reduced cost of its patterns."""
    shared: dict[tuple, list] = {}
    found: list[tuple] = []
    kept: list[tuple[MachineType, list[float]]] = []
    for ty in types:
        floor = [0.0] * len(ty.deltas)
        kept.append((ty, floor))
        if ty.slots is None and not ty.one_space(model):
            shared.setdefault(ty.ruled, []).append((ty, mus[ty.key], floor))
        else:
            found.extend((ty, rc, k, counts) for rc, k, counts in _price(model, ty, pi, mus[ty.key], floor))
    for ruled, tys in shared.items():
        found.extend(_price_shared(model, ruled, tys, pi))
    if floors is not None:
        for ty, floor in kept:
            for k, v in enumerate(floor):
                floors[ty.key, k] = v
    return found


def _price_shared(model: PlanModel, ruled: tuple[int, ...], tys: list[tuple[MachineType, list[float], list[float]]],
                  pi: np.ndarray) -> list[tuple[MachineType, float, int, dict[int, int]]]:
    """``_price`` for several types whose rules admit the same groups ``ruled`` (no VM-count
    dimension, not one-VM sandboxes), by one DP: ``tys`` holds (type, μ, floor) as
    ``_price`` takes them. Each type's fractional screen runs first; one DP over the
    largest machine among the classes that pass it then serves them all, since a
    table's cell (C_t, M_t) is type t's own optimum (a group too big for t fits in
    none of its cells) and groups enter by duration, so the table after the groups of
    duration ≤ δ_k is class k's. [(type, reduced cost, class, pattern)] that price out."""
    groups = model.groups
    promising = []
    for ty, mu, floor in tys:
        items = knapsack_items(groups, ty.groups, pi, ty.q)
        for k in range(len(ty.deltas)):
            vals = [(v, wc, wm, u, mult) for g, v, wc, wm, u, mult in items if ty.cls[g] <= k]
            floor[k] = ty.kappa[k] + mu[k] - (_frac_bound(vals, ty.cap_cpu, ty.cap_mem) if vals else 0.0)
            if vals and floor[k] < -1e-7:
                promising.append((ty, mu, floor, k))
    if not promising:
        return []
    items = knapsack_items(groups, ruled, pi)  # by duration (``ruled``'s order), bounded by counts
    unit = 0
    for it in items:
        unit = math.gcd(unit, it[3])
    C = max(ty.cap_cpu for ty, *_ in promising)
    M = max(ty.cap_mem for ty, *_ in promising) // unit
    if (C + 1) * (M + 1) > MAX_CELLS:
        raise TooBig
    last = max(ty.deltas[k] for ty, _, _, k in promising)
    f = np.zeros((C + 1, M + 1, 1))
    copies: list[tuple[int, int, int, int, float]] = []  # (g, VMs, wc, wm, value)
    ends: dict[int, int] = {}  # duration -> copies after its groups
    for g, v, wc, wm, u, mult in items:
        d = groups[g].duration_secs
        if d > last:
            break
        for n, cw, mw, _ in split(u, wc, wm // unit, 0, C, M, 0):
            copies.append((g, n * mult, cw, mw, v * n))
        ends[d] = len(copies)
    lims = knapsack.row_limits(f, [(cw, mw) for _, _, cw, mw, _ in copies])
    masks = knapsack.run(f, [(cw, mw, 0, v) for _, _, cw, mw, v in copies], record=True, lims=lims)
    out = []
    for ty, mu, floor, k in promising:
        stage = max((n for d, n in ends.items() if d <= ty.deltas[k]), default=0)
        c, m, counts = ty.cap_cpu, knapsack.at(lims, ty.cap_cpu, ty.cap_mem // unit), {}
        for p in range(stage - 1, -1, -1):
            g, n, cw, mw, _ = copies[p]
            if masks[p, c, m, 0]:  # (false below the copy's weight)
                counts[g] = counts.get(g, 0) + n
                c -= cw
                m = knapsack.at(lims, c, m - mw)
        rc = ty.kappa[k] + mu[k] - sum(pi[g] * n for g, n in counts.items())
        floor[k] = max(floor[k], rc)  # the DP's optimum: exact
        if rc < -1e-7 and counts:
            out.append((ty, rc, k, counts))
    return out


def knapsack_items(groups, gs, pi: np.ndarray, q: dict[int, int] | None = None) -> list[tuple]:
    """The items of the pricing knapsack over groups ``gs`` at prices π: (group, value,
    vCPUs, MiB, copies, VMs per copy); a together group is one item of its whole size,
    a group priced at 0 is left out. Copies are bounded by the group's count, and by
    ``q[g]`` (VMs one machine holds) when given."""
    items = []
    for g in gs:
        grp = groups[g]
        if pi[g] <= EPS:
            continue
        if grp.together:
            items.append((g, pi[g] * grp.count, grp.cpus * grp.count, grp.mem_mib * grp.count, 1, grp.count))
        else:
            u = grp.count if q is None else min(q[g], grp.count)
            if u > 0:
                items.append((g, pi[g], grp.cpus, grp.mem_mib, u, 1))
    return items


def split(u: int, wc: int, wm: int, ws: int, C: int, M: int, S: int):
    """The binary split of an item bounded by ``u`` copies into 1, 2, 4, … (the rest
    last), each as (copies, vCPUs, memory units, VMs), while it fits the (C, M, S) table:
    any count up to u is a sum of some of them, so a 0/1 DP over them is the bounded one."""
    m = 1
    while u > 0:
        n = min(m, u)
        u -= n
        m *= 2
        if wc * n > C or wm * n > M or ws * n > S:
            return
        yield n, wc * n, wm * n, ws * n


def _backtrack(copies, masks: np.ndarray, C: int, M: int, S: int, lims: np.ndarray) -> dict[int, int]:
    """The pattern the DP took at (C, M, S) using the first ``len(copies)`` item copies.

    masks[i] marks the states where copy i improved the table at its stage; walking
    the copies backwards from the full machine replays those choices (through the
    table's row limits, ``knapsack.at``)."""
    c, m, s, counts = C, knapsack.at(lims, C, M), S, {}
    for p in range(len(copies) - 1, -1, -1):
        g, n, cw, mw, sw, _ = copies[p]
        if masks[p, c, m, s]:
            counts[g] = counts.get(g, 0) + n
            c -= cw
            m = knapsack.at(lims, c, m - mw)
            s -= sw
    return counts
