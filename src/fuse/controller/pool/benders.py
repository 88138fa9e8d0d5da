"""Proofs on whole machine counts: Benders cuts over the pattern model (``patterns``).

Branch-and-price closes the last 0.1–1.5 % between the LP bound and the best
plan slowly: each node is a column generation. But the counts relaxation —
whole machine counts N_tk, fractional patterns λ — is nearly always tight at
this scale, and its feasible counts are cut out by linear inequalities on N:

  for any prices π ≥ 0 on the groups, a plan placing p_g VMs of each group g on
  N_tk machines of each type t and class k has  Σ_g π_g p_g ≤ Σ_tk V_tk(π) N_tk,
  V_tk(π) = max over the patterns of (t, k) of Σ_g π_g a_g

(every VM placed sits in a pattern, and a machine holds at most V of π-value).
So the *master* — min Σ_tk κ_tk N_tk over integer N and placed counts p with
the caps (limits, hosts, budget, quotas, the target) and every cut found so far
— is a relaxation of the planner's problem, with ≤ a few hundred variables.
HiGHS solves it; its answer N* is checked by the *feasibility LP* (column
generation over λ with Σ_{j∈(t,k)} λ_j ≤ N*_tk; minimise the VMs left over):
  - some VMs left over: the LP's row prices π give a cut that N* violates
    (Farkas), which joins the master; the LP's whole machines and first fit
    for the rest make a plan near N*, kept when it is cheaper (``_round``);
  - none: N* holds the work fractionally; ``search._fill`` places it on exactly
    those machines (whole patterns, then an exact CP-SAT placement of the rest).
    A plan found costs at most Σ κ N* and becomes the plan in hand.
With a plan costing U in hand, the master is cut off at U − ε/2 (HiGHS's objective
bound: no node whose bound reaches it is explored): when HiGHS finds no counts below
it, no plan is cheaper than U − ε and U is proven optimal. Each master is first cut off just
above the last one's optimum instead (``_guessed``): the same optimum when it lies below the
guess, in a third of the time; a guess with nothing below it raises the bound to it.

The master starts with the cut at the root LP's prices and with cuts that need
no DP (``capacity_cuts``: vCPUs and memory of the work of duration ≥ δ, of its
KVM part, and each group's VMs per machine), which spare it most of the answers
that cost exactly the LP bound but hold nothing like the work; so do up to
``KELLEY_ROUNDS`` proposals of the master's LP relaxation (cheap: an LP, not a
branch and bound) checked the same way before the integer master (cuts only:
first fit on fractional counts never beat the plan in hand; they stop when the
LP answers the same counts again). Reduced-cost fixing (``column_generation.class_limits``)
bounds each N_tk, and a type fixed at 0 machines drops out of the cuts' DPs.
The master is solved to a 0.01 % gap while it only proposes counts, to none once
its bound is that close to the plan; one solve may take half the time left, so a
master grown hard proposes what it found and hands the rest of the time to
branch-and-price.

Each master is HiGHS without its sub-MIP heuristics (the cutoff prunes; they took most of
its time), and saves the points it passed on the way to N*: the cheapest ``EXTRA_POINTS``
of them are checked like N* at once (the next masters would propose them). From the third
round the capacity cuts' sets join again as value cuts, their V by the DP (whole VMs: a
machine of 15 GiB holds 12 GiB of 4 GiB VMs, not 15). Counts a rough master proposed that
hold the work but do not pack give way to the exact master's at once (its least counts need
not be those); the exact master's are filled again with more of the work free (``LOOSEN``:
1, 2, 4 machines of each LP pattern, then all of them; a fill of counts asks CP-SAT only for a
packing of everything, which it finds or refutes in milliseconds where optimising the rest's
cost took seconds), and when they still do not pack they end the proof unproven. A point beside a
master's answer that holds the work is filled once (later masters pass it again). The rounds go on however
far the plan in hand is from the bound (handing over to branch-and-price there, which proves
these models far more slowly, ran a 1,000-VM model's 3-s proof out of its 10 s); while it is
far, cut proposals are repaired by a fill, which gives better plans than first fit.

Every cut is valid for every plan, whatever N* it was found at, so the master's
optimum (HiGHS's dual bound on it) is a lower bound at every iteration. V_tk is
exact (one dynamic programme per set of allowed groups, ``class_values``), and
rounded up; the proof trusts HiGHS's branch and bound on the small master.
"""

from __future__ import annotations

import math
import time

import highspy
import numpy as np

from fuse.controller.pool import knapsack
from fuse.controller.pool.column_generation import class_limits
from fuse.controller.pool.highs import _new_highs, highs_mip
from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.pattern_master import Master
from fuse.controller.pool.pattern_pricing import MAX_CELLS, TooBig, knapsack_items, price_all, split
from fuse.controller.pool.patterns import MachineType, take_pattern
from fuse.controller.pool.solution import Solution, cost_usd

EPS_USD = 1e-6  # plans within this of each other cost the same (the answer's exactness)
PROVEN_GAP = 0.9 * EPS_USD  # what a proof leaves between the plan and its bound
MASTER_GAP = 1e-4  # relative, while the master proposes counts; the proof step solves to 0
MASTER_SHARE = 0.5  # of the time left, for one solve of the master
LOOSEN = (1, 2, 4)  # retries of a fill that did not pack: machines per pattern freed for CP-SAT
ALL_FREE = 10 ** 9  # the last retry: no machine's pattern kept, all of the work placed by CP-SAT
FILL_RETRY = 0.1  # of the time left, for packing a proposal's machines once more
RETRY_SECS = 0.1  # ... and at least this (half the time left at most): a 1 s limit left ~20 ms, and
# the first retry of a 1,000-VM model's counts, which packs in ~70 ms, gave up
FILL_LAST = 0.5  # of the time left, for packing the exact master's counts, which no cut removes
# while the plan in hand is this far (relative) above the bound, a proposal the cuts remove is
# repaired by a fill of its feasibility LP's machines (~35 ms: a plan ~1 % above the optimum on
# the 1,000-VM models, where first fit on the whole machines, ~3 ms, gives 5–9 %)
FAR_GAP = 0.01
DP_CAPS_ROUND = 3  # the master round from which the capacity cuts join with their V from the DP
EXTRA_POINTS = 6  # of the points a master passed on the way to its answer, checked beside it
# (2 before: 6 proves one more of the 24 bench 1,000-VM models at 1 s, 19, with closer plans on
# those it does not; 4 to 10 prove the same)
KELLEY_ROUNDS, KELLEY_SHARE = 60, 0.5  # proposals of the LP master before the integer one, and their time
# (15 and 0.3 while the DPs were numpy: rounds of ~16 ms now; 60 took the 1,000-VM models proven
# at 1 s from 17 to 19 of 24, 100 no further: from the first round the LP sits at the root LP
# bound and the rounds only cut off the points of its optimal face that do not hold the work)
REPAIR_SECS = 0.03  # CP-SAT's time for the rest of a cut proposal's repair (``_fill``) while the plan is far
GUESS_GROW = 4
GUESS = 5e-4  # relative: a master is first cut off this far above the last one's optimum (``_guessed``)


def class_values(model: PlanModel, types: list[MachineType], pi: np.ndarray) -> dict[tuple, float]:
    """{(type key, class): V_tk(π), the most π-value one machine of the class holds}, exact.

    One bounded-knapsack DP (vCPUs × memory in the groups' common memory unit)
    per set of types that admit the same groups, over the largest machine of the
    set: the table's cell (C_t, M_t) is type t's optimum, since a smaller machine's
    patterns are the bigger one's that fit in (C_t, M_t). Groups enter by
    duration; the table after the groups of duration ≤ δ_k is class k's. A host
    with a VM-count limit has a DP of its own (a third dimension, VMs)."""
    groups = model.groups
    out: dict[tuple, float] = {}
    sets: dict[tuple, list[MachineType]] = {}
    for ty in types:
        if ty.one_space(model):  # one VM per machine: the best single VM of the class
            for k in range(len(ty.deltas)):
                out[ty.key, k] = max([pi[g] for g in ty.groups if ty.cls[g] <= k and ty.q[g] >= 1
                                      and (not groups[g].together or groups[g].count == 1)] + [0.0])
            continue
        own = ty.key if ty.slots is not None else None
        sets.setdefault((tuple(ty.groups), own), []).append(ty)
    for (gs, own), tys in sets.items():
        items = knapsack_items(groups, gs, pi)  # bounded by counts: the capacity bounds the rest
        if not items:
            out.update({(ty.key, k): 0.0 for ty in tys for k in range(len(ty.deltas))})
            continue
        unit = 0
        for it in items:
            unit = math.gcd(unit, it[3])
        C, M = max(ty.cap_cpu for ty in tys), max(ty.cap_mem for ty in tys) // unit
        S = tys[0].slots if own is not None else 0
        if (C + 1) * (M + 1) * (S + 1) > MAX_CELLS:
            raise TooBig
        f = np.zeros((C + 1, M + 1, S + 1))
        stages = {d: [(cw, mw, sw, v * n) for g, v, wc, wm, u, per in items if groups[g].duration_secs == d
                      for n, cw, mw, sw in split(u, wc, wm // unit, per if own is not None else 0, C, M, S)]
                  for d in sorted({groups[g].duration_secs for g in gs})}
        lims = knapsack.row_limits(f, [c for copies in stages.values() for c in copies])
        after: dict[int, np.ndarray] = {}  # duration -> the table's last VM layer after its groups
        for d, copies in stages.items():
            knapsack.run(f, copies, lims=lims)
            after[d] = f[:, :, S].copy()
        durations = sorted(after)
        for ty in tys:
            for k, delta in enumerate(ty.deltas):
                d = max((d for d in durations if d <= delta), default=None)
                cell = ty.cap_cpu, knapsack.at(lims, ty.cap_cpu, ty.cap_mem // unit)
                out[ty.key, k] = 0.0 if d is None else float(after[d][cell])
    return out


def prove(model: PlanModel, types: list[MachineType], target: int, pool: list, root: Master, y: np.ndarray,
          best: Solution, best_cost: float, deadline: float) -> tuple[Solution, float, float, bool]:
    """(plan, its cost, a valid lower bound, proven optimal) by Benders cuts on machine
    counts (module docstring), starting from ``root``'s rows (the caps) and one cut at
    the root LP's row prices ``y``; ``pool`` holds every pattern priced so far (new ones
    join it). Stops at ``deadline``, or when a count the LP holds does not pack."""
    from fuse.controller.pool.search import _fill

    groups = model.groups
    G = len(groups)
    keys = [(ty.key, k) for ty in types for k in range(len(ty.deltas))]
    at = {key: i for i, key in enumerate(keys)}
    nk, nv = len(keys), len(keys) + G
    unit = np.array([g.count if g.together else 1 for g in groups], dtype=float)  # VMs per placed unit u_g
    cost = np.concatenate([[ty.kappa[k] for ty in types for k in range(len(ty.deltas))], np.zeros(G)])
    lo = np.zeros(nv)
    hi = np.concatenate([[ty.ub for ty in types for k in range(len(ty.deltas))],
                         [1 if g.together else g.count for g in groups]]).astype(float)
    # the caps, on the counts: every row of the root master but the cover rows
    rows, rlo, rhi = [], [], []
    for r, coef in root.caps:
        row = np.zeros(nv)
        for key, v in coef.items():
            if key in at:
                row[at[key]] = v
        rows.append(row)
        rlo.append(-np.inf)
        rhi.append(root.b[r])
    if root.monthly is not None:
        rows.append(cost.copy())
        rlo.append(-np.inf)
        rhi.append(root.b[root.monthly])
    rows.append(np.concatenate([np.zeros(nk), unit]))
    rlo.append(float(target))
    rhi.append(np.inf)

    def machines(n: np.ndarray) -> dict[tuple, int]:  # the master's counts N_tk, as _feasible takes them
        return {key: int(n[i]) for i, key in enumerate(keys) if n[i] > 0}

    def fix() -> None:
        """Reduced-cost fixing: counts no plan cheaper than the one in hand exceeds."""
        for key, most in class_limits(root, best_cost + EPS_USD).items():
            hi[at[key]] = min(hi[at[key]], most)

    def cut(pi: np.ndarray) -> None:
        # a type fixed at 0 machines has no term: its V is not needed, and the DP's table
        # (the largest machine of a set) shrinks when the big expensive types are out
        live = [ty for ty in types if any(hi[at[ty.key, k]] > 0 for k in range(len(ty.deltas)))]
        rows.append(value_cut(model, live, at, pi))
        rlo.append(0.0)
        rhi.append(np.inf)

    for row in capacity_cuts(model, types, at):
        rows.append(row)
        rlo.append(0.0)
        rhi.append(np.inf)
    lb = -math.inf
    try:
        fix()
        cut(np.array([-y[r] for r in root.cover]))
        # the LP master first (Kelley): a proposal costs an LP of ~5 ms instead of a
        # branch and bound, and its cuts spare the integer master most of its rounds
        lp_until = time.monotonic() + KELLEY_SHARE * (deadline - time.monotonic())
        last = None
        level = -math.inf  # the last master's optimum: the next one's is seldom much above it
        lp = _LpMaster(cost, lo, hi)
        for _ in range(KELLEY_ROUNDS):
            if time.monotonic() >= lp_until:
                break
            got = lp.solve(rows, rlo, rhi)
            if got is None or (last is not None and np.allclose(got[0], last, rtol=0, atol=1e-7)):
                break  # (the same answer again: the last cut, within tolerances, did not cut it off)
            last, fun = got
            level = max(level, fun)
            n = {key: float(last[i]) for i, key in enumerate(keys) if last[i] > 1e-9}
            found = _feasible(model, types, pool, n, last[nk:] * unit, deadline)
            if found is None or found[0] is None:
                break  # the LP's counts hold the work: its cuts are all in
            cut(found[0])  # (no plan from fractional counts: first fit on them never beat the one in hand)
        timed_out = False  # a master out of its share of the time: its counts are the last proposal
        exact_next, unpacked = False, set()  # (counts that held the work but did not pack)
        filled = set()  # points beside a master's answer that held the work, filled once
        dp_caps = False
        rounds = 0
        points: list[np.ndarray] = []
        while time.monotonic() < deadline and not timed_out:
            rounds += 1
            if lb >= best_cost - EPS_USD:  # a master's bound already meets the plan a proposal gave
                return best, best_cost, best_cost - PROVEN_GAP, True
            if rounds >= DP_CAPS_ROUND and not dp_caps:
                dp_caps = True
                for pi in capacity_prices(model):
                    cut(pi)
            fix()
            # near the plan in hand a rough answer would only return it: solve to 0 at once
            gap = 0.0 if exact_next or lb >= best_cost * (1 - MASTER_GAP) else MASTER_GAP
            res, lb = _guessed(cost, lo, hi, rows, rlo, rhi, best_cost, gap, deadline, points, level, lb)
            if res is None:
                break
            timed_out = res.status == 1
            if res.x is not None:  # the next master may start from one of them
                points = [np.round(res.x)] + [np.round(other) for _, other in getattr(res, "saved", [])]
            if res.status == 2:  # no counts cheaper than the plan in hand: it is optimal
                return best, best_cost, best_cost - PROVEN_GAP, True
            x = np.round(res.x)
            again = tuple(int(v) for v in x) in unpacked  # (the exact master's least counts: these)
            if float(cost @ x) >= best_cost - EPS_USD:  # only the plan in hand, within HiGHS's tolerance
                if gap:  # prove it
                    res = _master(cost, lo, hi, rows, rlo, rhi, best_cost, 0.0, deadline)
                    if res is None:
                        break
                    if res.status == 2:
                        return best, best_cost, best_cost - PROVEN_GAP, True
                    x = np.round(res.x)
                bound = getattr(res, "mip_dual_bound", -math.inf)
                if float(cost @ x) >= best_cost - EPS_USD:
                    if bound >= best_cost - EPS_USD:
                        return best, best_cost, best_cost - PROVEN_GAP, True
                    return best, best_cost, max(lb, bound), False
            lb = max(lb, min(getattr(res, "mip_dual_bound", -math.inf), best_cost - EPS_USD))
            level = max(level, float(cost @ x))
            # the points HiGHS passed on the way to x cost little more: the masters to come
            # would propose them next, so each is checked now (a feasibility LP, ~10 ms,
            # against ~0.3 s a master) and cut off, or, when it holds the work, filled
            for obj, other in sorted(getattr(res, "saved", []), key=lambda s: s[0])[:EXTRA_POINTS]:
                other = np.round(other)
                if (obj >= best_cost - EPS_USD or np.array_equal(other, x) or time.monotonic() >= deadline
                        or tuple(other) in filled):
                    continue
                on, ou = other[:nk].astype(int), other[nk:].astype(int)
                got = _feasible(model, types, pool, machines(on), ou * unit, deadline)
                if got is None:
                    break
                if got[0] is not None:
                    cut(got[0])
                    continue
                filled.add(tuple(other))  # (no cut removes it: the next masters may pass it again)
                sol = _fill(model, types, [("p", g) for g in range(G)] + got[1],
                            np.concatenate([ou.astype(float), got[2]]), target, deadline, any_full=True)
                if sol is not None and cost_usd(model, sol) < best_cost - EPS_USD:
                    best, best_cost = sol, cost_usd(model, sol)
            n, u = x[:nk].astype(int), x[nk:].astype(int)
            found = _feasible(model, types, pool, machines(n), u * unit, deadline)
            if found is None:
                break
            pi, kinds, lam = found
            if pi is not None:
                cut(pi)
                # a plan near N*, when one is cheaper: the LP's machines filled while the plan in
                # hand is far from the bound, else (cheaper) its whole machines and first fit
                if best_cost - lb > FAR_GAP * best_cost:
                    sol = _fill(model, types, [("p", g) for g in range(G)] + kinds,
                                np.concatenate([u.astype(float), lam]), target, deadline, secs=REPAIR_SECS)
                else:
                    sol = _round(model, kinds, lam, u * unit, target)
                if sol is not None and cost_usd(model, sol) < best_cost - EPS_USD:
                    best, best_cost = sol, cost_usd(model, sol)
                continue
            kinds, x = [("p", g) for g in range(G)] + kinds, np.concatenate([u.astype(float), lam])
            sol = None
            if not again:
                sol = _fill(model, types, kinds, x, target, deadline, any_full=True)
            # a rough master's counts go to the exact master at once (its least counts may
            # pack where these did not: retrying these took 1.2 s of a 1,000-VM proof). The
            # exact master's least counts, which no cut removes, end the proof unless they
            # pack: when the LP's whole patterns leave a rest that does not (CP-SAT proves
            # that in milliseconds), again with more of the work free, at last all of it
            for loosen in LOOSEN + (ALL_FREE,) if gap == 0.0 else ():
                if sol is not None and cost_usd(model, sol) < best_cost - EPS_USD:
                    break
                left = deadline - time.monotonic()
                secs = FILL_LAST * left if loosen == ALL_FREE else max(FILL_RETRY * left, min(RETRY_SECS, left / 2))
                sol = _fill(model, types, kinds, x, target, deadline, loosen=loosen, secs=secs, any_full=True)
            if sol is None or cost_usd(model, sol) >= best_cost - EPS_USD:
                if gap == 0.0:
                    break  # the exact master's counts hold the work fractionally but do not pack
                # a rough master's: they need not be its least, so the exact master goes on
                unpacked.add(tuple(int(v) for v in np.concatenate([n, u])))
                exact_next = True
                continue
            best, best_cost = sol, cost_usd(model, sol)
    except TooBig:
        pass
    return best, best_cost, lb, False


class _LpMaster:
    """The master's LP relaxation in one HiGHS instance: the cuts join as rows, and each
    solve starts from the last one's basis (a rebuilt LP took ~3 ms a round, ~60 rounds)."""

    def __init__(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        n = len(cost)
        self.h = _new_highs()
        inf = highspy.kHighsInf
        self.h.addVars(n, np.asarray(lo, dtype=float), np.where(np.isinf(hi), inf, hi).astype(float))
        self.h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(cost, dtype=float))
        self.rows = 0

    def solve(self, rows: list, rlo: list, rhi: list) -> tuple[np.ndarray, float] | None:
        """(x, objective) with every row of ``rows`` in, or None when the LP has no optimum."""
        inf = highspy.kHighsInf
        for row, a, b in zip(rows[self.rows:], rlo[self.rows:], rhi[self.rows:]):
            idx = np.flatnonzero(row)
            self.h.addRow(-inf if np.isinf(a) else float(a), inf if np.isinf(b) else float(b), len(idx),
                          idx.astype(np.int32), np.asarray(row, dtype=float)[idx])
        self.rows = len(rows)
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return np.array(self.h.getSolution().col_value), float(self.h.getInfo().objective_function_value)


def value_cut(model: PlanModel, types: list[MachineType], at: dict[tuple, int], pi: np.ndarray) -> np.ndarray:
    """The cut at prices π as a row over (N_tk in ``at``'s order, then u_g):
    Σ_tk V_tk(π) N_tk − Σ_g π_g p_g ≥ 0 with p_g = u_g (n_g·u_g for a together group),
    V rounded up so float error only weakens it."""
    groups = model.groups
    row = np.zeros(len(at) + len(groups))
    for key, v in class_values(model, types, pi).items():
        row[at[key]] = v * (1 + 1e-9) + 1e-9 if v > 0 else 0.0  # (a machine holding no value: exactly 0)
    row[len(at):] = -pi * np.array([g.count if g.together else 1 for g in groups])
    return row


def capacity_cuts(model: PlanModel, types: list[MachineType], at: dict[tuple, int]) -> list[np.ndarray]:
    """Cuts whose V needs no DP (rows as ``value_cut``'s): for a set S of groups and a
    resource (vCPUs, MiB), a machine of (t, k) holds at most its capacity of S's work
    when some group of S may use it, else none; S: the groups of duration ≥ δ (a class
    below δ holds none of them), and those of them that need KVM. And per group g: a
    machine holds at most min(q_gt, n_g) of its VMs (a together group: all or none)."""
    groups = model.groups
    nk, nv = len(at), len(at) + len(groups)
    unit = np.array([g.count if g.together else 1 for g in groups], dtype=float)
    out = []
    durations = sorted({g.duration_secs for g in groups})
    sets = []
    for d in durations:
        sets.append([g for g, grp in enumerate(groups) if grp.duration_secs >= d])
        sets.append([g for g, grp in enumerate(groups) if grp.duration_secs >= d and grp.needs_kvm])
    for S in sets:
        if not S:
            continue
        for res in ("cpus", "mem_mib"):
            row = np.zeros(nv)
            for ty in types:
                cap = ty.cap_cpu if res == "cpus" else ty.cap_mem
                for k in range(len(ty.deltas)):
                    if any(g in ty.cls and ty.cls[g] <= k for g in S):
                        row[at[ty.key, k]] = cap
            for g in S:
                row[nk + g] = -getattr(groups[g], res) * unit[g]
            out.append(row)
    for g, grp in enumerate(groups):  # VMs of g: min(q_gt, n_g) a machine, all of a together group or none
        row = np.zeros(nv)
        for ty in types:
            if g in ty.cls:
                most = (grp.count if ty.q[g] >= grp.count else 0) if grp.together else min(ty.q[g], grp.count)
                row[[at[ty.key, k] for k in range(ty.cls[g], len(ty.deltas))]] = most
        row[nk + g] = -unit[g]
        out.append(row)
    return out


def capacity_prices(model: PlanModel) -> list[np.ndarray]:
    """The capacity cuts' sets of groups priced by their vCPUs and by their memory: as value
    cuts (exact V by the DP) they say what whole VMs of the set a machine holds, not its raw
    capacity (a machine of 15 GiB holds 12 GiB of 4 GiB VMs): the cuts the feasibility LP
    would otherwise return one master at a time."""
    groups = model.groups
    out = []
    for d in sorted({g.duration_secs for g in groups}):
        for kvm in (False, True):
            S = [g for g, grp in enumerate(groups) if grp.duration_secs >= d and (grp.needs_kvm or not kvm)]
            if not S or (kvm and len(S) == sum(1 for g in groups if g.duration_secs >= d)):
                continue
            for res in ("cpus", "mem_mib"):
                pi = np.zeros(len(groups))
                pi[S] = [float(getattr(groups[g], res)) for g in S]
                out.append(pi / pi.max())
    return out


def _round(model: PlanModel, kinds: list[tuple], lam: np.ndarray, p: np.ndarray, target: int) -> Solution | None:
    """A plan from counts that do not hold the work: the feasibility LP's whole machines
    (⌊λ_j⌋ of each pattern, existing hosts first), the rest by first fit. Cheap (no
    CP-SAT), so every proposal of the master may give the plan in hand a rival."""
    from fuse.controller.pool.greedy import greedy

    left = [int(round(v)) for v in p]
    sol = Solution()
    for j in sorted(range(len(kinds)), key=lambda j: kinds[j][0] != "host"):
        for _ in range(int(math.floor(lam[j] + 1e-9))):
            take_pattern(model, sol, kinds[j], left)
    sol = greedy(model, start=sol)  # whose answer keeps every constraint (it checks)
    return sol if sum(sol.placed(len(model.groups))) >= target else None


def _guessed(cost, lo, hi, rows, rlo, rhi, best_cost: float, gap: float, deadline: float, points, level: float,
             lb: float):
    """(``_master``'s answer, the lower bound) with the master first cut off just above
    ``level``, the last master's optimum, instead of at the plan in hand: HiGHS then
    explores only nodes whose bound is below the guess, and its optimum, when below
    the guess, is the same. A master with no counts below the guess proves every plan
    costs at least that much (the master is a relaxation): the bound rises to it and the
    guess moves up, four times as far each time, until it reaches the plan in hand. (On
    masters saved from two 1,000-VM models, the cutoff at the optimum took a third of
    the time of the cutoff at the plan the rounds had in hand.)"""
    step = GUESS * abs(level) if math.isfinite(level) else math.inf
    while True:
        guess = level + step
        if not guess < best_cost - EPS_USD:
            return _master(cost, lo, hi, rows, rlo, rhi, best_cost, gap, deadline, points), lb
        res = _master(cost, lo, hi, rows, rlo, rhi, guess, gap, deadline, points)
        if res is None or res.status == 1:
            return res, lb
        if res.status == 0 and float(cost @ np.round(res.x)) < guess - EPS_USD:
            return res, lb
        # (nothing below the guess; HiGHS may still answer with a point above its objective
        # bound, its search having pruned every node at the bound: not the master's optimum)
        lb = max(lb, guess - EPS_USD)  # (cut off at guess − ε/2: no counts cost less)
        level, step = guess, GUESS_GROW * step


def _master(cost, lo, hi, rows, rlo, rhi, best_cost: float, gap: float, deadline: float, points=()):
    """HiGHS on the master, cut off at the plan in hand (``best_cost`` − ε/2: no node whose
    bound reaches it is explored); None when out of time without an answer. The answer
    has ``status`` 0 (optimal: ``x``, ``mip_dual_bound``), 1 (out of its time with counts
    ``x`` found: a proposal) or 2 (no counts below the cutoff: the plan in hand is optimal).
    ``points``: the last master's answer and the points it passed; the cheapest of them
    that no cut since removes starts the solve as HiGHS's incumbent (on masters saved
    from two 1,000-VM models: 3.6 s of solves without it, 2.8 s with it).

    The cutoff is HiGHS's ``objective_bound``, not a row Σ κ N ≤ U − ε: that row (dense,
    its coefficients 10⁻²…10⁴ beside the cuts') made single solves of ~100 integers take
    4–20 s where the cutoff takes 0.3 s on the same master; over masters saved from the
    1,000-VM models, the row took 21 s of CPU in all, the cutoff 6 s, the cutoff without
    presolve 4.6 s."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    left = max(min(left, 0.05), MASTER_SHARE * left)  # a master that grows hard hands the time back
    # (measured: the small master solves 20-40 % faster without presolve)
    a = np.array(rows)
    start = None
    for x in points:  # (a handful of points against ~100 rows: microseconds)
        ax = a @ x
        if (float(cost @ x) < best_cost - EPS_USD and np.all(x >= lo) and np.all(x <= hi)
                and np.all(ax >= np.asarray(rlo) - 1e-6) and np.all(ax <= np.asarray(rhi) + 1e-6)
                and (start is None or float(cost @ x) < float(cost @ start))):
            start = x
    res = highs_mip(cost, np.ones(len(cost)), lo, hi, a, rlo, rhi, gap=gap, time_limit=left,
                    cutoff=best_cost - EPS_USD / 2, presolve=False, save=EXTRA_POINTS > 0,
                    lean=True, start=start)
    return None if res.status == 3 else res


def _feasible(model: PlanModel, types: list[MachineType], pool: list, n: dict[tuple, float], p: np.ndarray,
              deadline: float):
    """Does the work p fit fractionally on the machines n? Column generation on
    min Σ_g s_g  s.t.  Σ_j a_gj λ_j + s_g ≥ p_g,  Σ_{j∈(t,k)} λ_j ≤ n_tk,  λ, s ≥ 0.
    (π, None, None) with the cover rows' prices when VMs are left over (a cut N
    violates); (None, pattern kinds, λ) when none are; None when out of time."""
    G = len(model.groups)
    live = sorted(n)
    li = {key: i for i, key in enumerate(live)}
    cols = [(ty, k, c) for ty, k, c in pool if (ty.key, k) in li]
    seen = {(ty.key, k, tuple(sorted(c.items()))) for ty, k, c in cols}
    # rows (all ≤): −Σ_j a_gj λ_j − s_g ≤ −p_g, then Σ_{j∈(t,k)} λ_j ≤ n_tk; columns s_g, then the
    # patterns, joining HiGHS as they are priced (each round starts from the last basis)
    h = _new_highs()
    inf = highspy.kHighsInf
    h.addRows(G + len(live), np.full(G + len(live), -inf),
              np.concatenate([-np.asarray(p, dtype=float), [float(n[key]) for key in live]]),
              0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
    h.addCols(G, np.ones(G), np.zeros(G), np.full(G, inf), G, np.arange(G, dtype=np.int32),
              np.arange(G, dtype=np.int32), -np.ones(G))
    in_lp = 0
    by_type = [ty for ty in types if any((ty.key, k) in li for k in range(len(ty.deltas)))]
    while time.monotonic() < deadline:
        if len(cols) > in_lp:
            starts, idx, val = [], [], []
            for ty, k, counts in cols[in_lp:]:
                starts.append(len(idx))
                for g, a in sorted(counts.items()):
                    idx.append(g)
                    val.append(-float(a))
                idx.append(G + li[ty.key, k])
                val.append(1.0)
            m = len(cols) - in_lp
            h.addCols(m, np.zeros(m), np.zeros(m), np.full(m, inf), len(idx), np.array(starts, dtype=np.int32),
                      np.array(idx, dtype=np.int32), np.array(val))
            in_lp = len(cols)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        sol = h.getSolution()
        y = np.array(sol.row_dual)
        pi, mu = np.maximum(-y[:G], 0.0), np.maximum(-y[G:], 0.0)
        # a pattern improves when its π-value beats its class's price μ (reduced cost
        # κ + (μ − κ) − value, as ``_price`` counts it); closed classes never do
        mus = {ty.key: [(mu[li[ty.key, k]] if (ty.key, k) in li else 1e18) - ty.kappa[k]
                        for k in range(len(ty.deltas))] for ty in by_type}
        new = 0
        for ty, _, k, counts in price_all(model, by_type, pi, mus):
            key = (ty.key, k, tuple(sorted(counts.items())))
            if (ty.key, k) in li and key not in seen:
                seen.add(key)
                cols.append((ty, k, counts))
                pool.append((ty, k, counts))
                new += 1
        if new == 0:
            kinds = [("host" if ty.host else "pat", ty.t, k, dict(counts)) for ty, k, counts in cols]
            left = h.getInfo().objective_function_value
            return (pi if left > 1e-7 else None), kinds, np.array(sol.col_value[G:])
    return None
