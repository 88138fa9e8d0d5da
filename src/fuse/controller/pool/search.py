"""Plans and proofs on the whole-machine pattern model (``patterns``).

    root LP (column generation) ──► plans: residual rounding, the fill of the
                                    LP's machines rounded up
                                ──► Benders cuts on the machine counts from
                                    the best plan so far (``benders``): most
                                    proofs at 1,000 VMs end here; when no plan
                                    places the target yet, the fill of the
                                    counts MIP's machines (whole counts,
                                    fractional patterns) gives them one first
                                ──► fix-and-solve, the integer master, the
                                    FFD plan
                                ──► branch-and-price on machine counts
                                    (best bound first, with depth-first dives
                                    that end in a fill of whole machine counts;
                                    reduced-cost fixing limits each child's
                                    counts, ``column_generation.class_limits``)

Every plan here packs by construction; the bound is the larger of the Benders
master's (HiGHS's dual bound on a relaxation of every plan) and the least bound
of the open branch-and-price nodes and of those closed within 10⁻⁶ USD of the
plan (see ``solve``), each a Lagrangian bound computed from the LP's row prices.
"""

from __future__ import annotations

import math
import time

import numpy as np

from fuse.controller.pool.benders import prove
from fuse.controller.pool.column_generation import class_limits, generate
from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.pattern_master import Master, Node, extract
from fuse.controller.pool.pattern_pricing import TooBig
from fuse.controller.pool.patterns import MachineType, machine_types, take_pattern
from fuse.controller.pool.solution import Solution, cost_usd, violations


def solve(model: PlanModel, kept: list[int], target: int, start: Solution,
          deadline: float, search_deadline: float | None = None,
          partial: list[Solution] | None = None) -> tuple[Solution, float, bool, bool] | None:
    """(plan, valid lower bound USD, proven optimal, settled) from the pattern model,
    or None when it does not apply (a hosts pin, a DP too big, HiGHS failing, out of
    time). ``partial`` (when given) gets the plans found short of the target (the root LP's
    whole machines completed by first fit; the integer master's over the columns found):
    the answer's fallback when no plan places the target in time. ``TargetTooHigh`` when
    the converged LP cannot place the target at all. ``settled``: the bound is at least the full LP optimum. Column generation
    and the first integer master stop at ``deadline``; the branch-and-price search
    may go on to ``search_deadline``.

    Column generation at the root gives the LP bound; the integer master over the
    generated patterns gives a first plan. Then branch-and-price, best bound
    first, branching on a machine count N_tk = Σ_{j∈(t,k)} λ_j (or a placed
    count p_g) whose LP value is fractional: ``N ≤ ⌊v⌋`` | ``N ≥ ⌈v⌉``. Those are
    rows of the caps' shape, so pricing is unchanged (their duals join μ_tk) and
    every pattern stays valid in every node. A node whose counts are all
    integral has its cost fixed (Σ κ_tk N_tk); the integer master with N fixed
    then finds its plan or the node stays open. The bound is the least bound of
    the open nodes and of the nodes closed within ``tol`` of the plan; with none
    open the best plan is proven optimal. Only float rounding is taken off the
    bound (10⁻⁹ relative): it is computed from the row prices, not read from HiGHS."""
    c, groups = model.constraints, model.groups
    if c.exact_new_hosts is not None:
        return None
    types = machine_types(model, kept)
    by_key = {ty.key: ty for ty in types}
    pool: list[tuple[MachineType, int, dict[int, int]]] = []  # every pattern generated, for every node
    # When the plan in hand places fewer than the target, the first columns (its machines, one
    # group per machine) may not reach the target within the caps at all: an artificial column
    # (price ≫ any machine's) keeps the LP feasible while pricing finds the columns that do
    # (phase one), and, if it is still in use once no column prices out, the LP cannot place
    # the target: ``TargetTooHigh`` says how many it can.
    short = sum(start.placed(len(groups))) < target
    big_m = SHORT_M * (1.0 + max((max(ty.kappa, default=0.0) for ty in types), default=0.0)) if short else 0.0
    root = Master(model, types, target, big_m=big_m)
    if sum(start.placed(len(groups))) >= target:
        root.cost_cap = cost_usd(model, start)
    # seed: the FFD plan's hosts and machines as patterns (machines mapped to
    # kept dominators), and one single-group full pattern per (type, class)
    from fuse.controller.pool.formulation import dominators

    dom = dominators(model)
    on_host: dict[int, dict[int, int]] = {}
    for (g, h), n in start.on_hosts.items():
        on_host.setdefault(h, {})[g] = n
    seeds = [(("h", h), counts) for h, counts in sorted(on_host.items())]
    seeds += [(("t", dom.get(m.offer, m.offer)), m.counts) for m in start.machines]
    for key, counts in seeds:
        ty = by_key.get(key)
        if ty is not None and counts and all(g in ty.cls for g, n in counts.items() if n):
            k = max(ty.cls[g] for g, n in counts.items() if n)
            if root.add_pattern(ty, k, counts):
                pool.append((ty, k, counts))
    for ty in types:
        for g in ty.groups:
            grp = groups[g]
            counts = {g: grp.count if grp.together else min(grp.count, ty.q[g])}
            if root.add_pattern(ty, ty.cls[g], counts):
                pool.append((ty, ty.cls[g], counts))
    try:
        res, lb, converged = generate(model, root, types, pool, deadline)
    except TooBig:
        return None
    if short and res is not None:
        art = sum(res.x[j] for j, kind in enumerate(root.kind) if kind[0] == "art")
        if art > 1e-6:
            if converged:
                raise TargetTooHigh(target - art)
            return None
        lb = -math.inf  # (a bound priced with the artificial column in the LP: not taken)
        if converged:  # again without it, from the columns found: the bound as always
            root = _master(model, types, target, pool)
            try:
                res, lb, converged = generate(model, root, types, pool, deadline)
            except TooBig:  # (as above: its duals may reach a DP the first pass did not)
                return None
    if res is None or (not converged and lb <= 0):
        return None
    if partial is not None and short and (rough := _residual(model, root, res.x, 0)) is not None:
        partial.append(rough)
    end = max(deadline, search_deadline or deadline) if converged else deadline
    cands = [sol for sol in (_residual(model, root, res.x, target),
                             _fill(model, types, root.kind, res.x, target, deadline) if converged else None)
             if sol is not None]
    met = converged and any(cost_usd(model, sol) <= lb + 1e-6 for sol in cands)  # the root LP's plan is whole
    cuts_lb = -math.inf
    if converged and not met:
        so_far = min([cost_usd(model, sol) for sol in cands]
                     + [cost_usd(model, start) if sum(start.placed(len(groups))) >= target else math.inf])

        def counts_plan(so_far: float) -> Solution | None:
            x = root.counts_mip(min(COUNTS_SHARE * (end - time.monotonic()), COUNTS_SECS),
                                class_limits(root, so_far + 1e-6),
                                cutoff=so_far - 1e-6)  # only counts cheaper than the plans in hand
            return None if x is None else _fill(model, types, root.kind, x, target, end)

        def in_hand() -> Solution | None:
            return min([sol for sol in cands if sol is not None and sum(sol.placed(len(groups))) >= target]
                       + ([start] if sum(start.placed(len(groups))) >= target else []),
                       key=lambda sol: cost_usd(model, sol), default=None)

        # the counts MIP only when no plan places the target yet (the Benders rounds need one;
        # it takes 0.2–1 s at 1,000 VMs, and the rounds' own repairs find plans as good)
        if in_hand() is None:
            cands.append(counts_plan(so_far))
        if in_hand() is None and short:
            # Whole machines may hold fewer than the LP's fractions (a binding cap): the integer
            # master over the columns found, short of the target at the artificial's price,
            # places as many as it can in its time: the search's plan when that is the target,
            # else the answer's fallback (``partial``), better than first fit's under a cap.
            short_of = _master(model, types, target, pool, big_m)
            got = short_of.mip(min(SHORT_MIP_SECS, SHORT_MIP_SHARE * (end - time.monotonic())))
            if got.x is not None and not violations(model, plan := extract(model, short_of, got.x)):
                if sum(plan.placed(len(groups))) >= target:
                    cands.append(plan)
                elif partial is not None:
                    partial.append(plan)
        # Benders cuts on the machine counts, from the best plan so far: most proofs come from here
        held = in_hand()
        if held is not None and end - time.monotonic() > MIN_STEP_SECS:
            y = np.minimum(res.ineqlin.marginals, 0.0)
            sol, cost, cuts_lb, proven = prove(model, types, target, pool, root, y, held, cost_usd(model, held),
                                               time.monotonic() + BENDERS_SHARE * (end - time.monotonic()))
            if proven:
                return sol, cost, True, True  # proven: no plan is cheaper by more than 10⁻⁶ USD
            cands.append(sol)
        # (each step below takes at least ~50 ms: none starts without that much time left)
        dived = (_dive(model, types, target, pool, min(end, time.monotonic() + 0.3 * (end - time.monotonic())))
                 if end - time.monotonic() > MIN_STEP_SECS else None)
        if dived is not None:
            cands.append(dived)
    if not met and end - time.monotonic() > MIN_STEP_SECS:
        mres = root.mip(0.15 * (end - time.monotonic()) if converged else end - time.monotonic())
        if mres.x is not None:
            cands.append(extract(model, root, mres.x))
    if sum(start.placed(len(groups))) >= target:
        cands.append(start)  # no integer master in time: the search starts from the FFD plan
    cands = [sol for sol in cands if sol is not None and sum(sol.placed(len(groups))) >= target]
    if not cands:
        return None
    best = min(cands, key=lambda sol: cost_usd(model, sol))
    best_cost = cost_usd(model, best)
    if converged:
        try:
            best, best_cost, lb = _branch(model, types, target, pool, res, root, lb, best, best_cost, end)
        except TooBig:
            pass
    lb = max(0.0, lb - 1e-9 * max(1.0, abs(lb)))  # float rounding in the bound's sums
    lb = max(lb, cuts_lb)  # both bound every plan placing the target
    proven = converged and best_cost <= lb + 1e-6
    return best, min(lb, best_cost), proven, converged


SHORT_M = 1e3  # the artificial column's price, per VM short, in units of the dearest machine's
SHORT_MIP_SECS, SHORT_MIP_SHARE = 0.5, 0.15  # the integer master short of the target: at most


class TargetTooHigh(Exception):
    """The pattern model's LP cannot place the target within the caps: at most ``most`` VMs
    (``search.solve`` with a target above what the plan in hand places)."""

    def __init__(self, most: float):
        super().__init__(f"the pattern LP places at most {most:g} VMs")
        self.most = most


def _master(model: PlanModel, types: list[MachineType], target: int, pool: list, big_m: float = 0.0) -> Master:
    """The root master anew, with every column ``pool`` holds (and, with ``big_m``, the
    artificial column that makes up for VMs short of the target at that price)."""
    root = Master(model, types, target, big_m=big_m)
    for ty, k, counts in pool:
        root.add_pattern(ty, k, counts)
    return root


def _counts(master: Master, x: np.ndarray) -> tuple[dict, dict[int, float], float]:
    """The LP's machine counts N_(key,k), placed counts p_g, and artificial use."""
    n: dict[tuple, float] = {}
    p: dict[int, float] = {}
    art = 0.0
    for j, kind in enumerate(master.kind):
        if kind[0] in ("pat", "host"):
            key = ("h" if kind[0] == "host" else "t", kind[1])
            n[key, kind[2]] = n.get((key, kind[2]), 0.0) + x[j]
        elif kind[0] == "p":
            p[kind[1]] = x[j]
        elif kind[0] == "art":
            art += x[j]
    return n, p, art


def _branch(model, types, target, pool, res, root, root_lb, best, best_cost, deadline):
    """Branch-and-price from the root LP; returns (plan, cost, bound).

    Best bound first, with dives: from the root, and again every ``DIVE_EVERY``
    nodes from the node in hand, a depth-first plunge that rounds up the count
    nearest its ceiling (backtracking to the other side when a child closes) until
    the machine counts are integral; there ``_fill`` (then the integer master with
    the counts fixed) looks for a plan on exactly those machines. A dive ends there,
    or after ``DIVE_NODES`` nodes; the nodes it left go back to the open set."""
    import heapq

    big_m = 1e3 * (best_cost + 1.0)
    tol = 1e-6
    heap: list[tuple[float, int, Node, object, Master | None]] = [(root_lb, 0, Node(bound=root_lb), res, root)]
    stuck: list[float] = []  # bounds of nodes left open without a branch to take
    pruned: list[float] = []  # bounds of nodes closed within ``tol`` of the plan in hand
    seq = 1
    base, synced = Master(model, types, target, None, big_m), 0  # every node's master starts as a copy
    base.cost_cap = best_cost
    costs: dict[str, dict] = {"down": {}, "up": {}}  # pseudo-costs: bound rise per unit step, per count
    dive: list = []  # the plunge's stack (depth first); empty between dives
    dive_nodes, since_dive = 0, DIVE_EVERY  # the root starts with a dive

    def end_dive():
        for entry in dive:
            heapq.heappush(heap, entry)
        dive.clear()

    while heap or dive:
        if dive:
            entry = dive.pop()
            bound, _, node, nres, master = entry
            if bound >= best_cost - tol:
                pruned.append(bound)
                continue
            if time.monotonic() >= deadline:
                dive.append(entry)
                break
            dive_nodes += 1
            in_dive = True
        else:
            bound, _, node, nres, master = heap[0]
            if bound >= best_cost - tol:
                break  # best bound first: every open node is as costly as the plan in hand
            if time.monotonic() >= deadline:
                break
            heapq.heappop(heap)
            since_dive += 1
            in_dive = since_dive >= DIVE_EVERY
            if in_dive:
                since_dive, dive_nodes = 0, 0
        if nres is None:
            for ty, k, counts in pool[synced:]:  # the columns priced since, into the base
                base.add_pattern(ty, k, counts)
            synced = len(pool)
            base.cost_cap = best_cost
            master = base.with_node(node, big_m)
            nres, nlb, conv = generate(model, master, types, pool, deadline)
            if nres is None or not conv:  # HiGHS failed, or out of time (the loop then ends)
                stuck.append(max(bound, nlb))
                continue
            bound = max(bound, nlb)
            if node.origin is not None:  # how much the bound rose per unit of the step that made this node
                what, side, step, parent = node.origin
                rise = (bound - parent) / max(step, 1e-6)
                for at in (what, None):
                    seen = costs[side].setdefault(at, [0.0, 0])
                    seen[0] += rise
                    seen[1] += 1
            if bound >= best_cost - tol:
                pruned.append(bound)
                continue
        n, p, art = _counts(master, nres.x)
        frac = [(v - math.floor(v), ("n", key)) for key, v in n.items() if abs(v - round(v)) > 1e-6]
        frac += [(v - math.floor(v), ("p", g)) for g, v in p.items() if abs(v - round(v)) > 1e-6]
        if not frac:
            end_dive()
            if art > 1e-7:
                stuck.append(bound)
                continue
            sol = _fill(model, types, master.kind, nres.x, target, deadline)
            if sol is not None:
                cost = cost_usd(model, sol)
                if cost < best_cost:
                    best, best_cost = sol, cost
                if cost <= bound + tol:
                    pruned.append(bound)
                    continue
            fixed = Node(n={key: (round(v), round(v)) for key, v in n.items()}, p=node.p)
            fm = Master(model, types, target, fixed)
            for ty, k, counts in pool:
                fm.add_pattern(ty, k, counts)
            mres = fm.mip(min(0.2, deadline - time.monotonic()))
            if mres.x is not None:
                sol = extract(model, fm, mres.x)
                cost = cost_usd(model, sol)
                if cost < best_cost and sum(sol.placed(len(model.groups))) >= target:
                    best, best_cost = sol, cost
                if cost <= bound + tol:
                    pruned.append(bound)
                    continue
            stuck.append(bound)
            continue
        if in_dive:  # round up the count nearest its ceiling (the cheapest step to integral)
            _, (what, key) = max(frac, key=lambda it: (it[0], str(it[1])))
        else:  # pseudo-costs: the count whose two sides are expected to raise the bound most
            _, (what, key) = max(frac, key=lambda it: (_score(costs, it[1], it[0]), str(it[1])))
        v = n[key] if what == "n" else p[key]
        limits = class_limits(master, best_cost + tol)  # reduced-cost fixing for the node's children
        for lo_hi in ("down", "up"):  # in a dive the up side is popped first
            child = Node(n=dict(node.n), p=dict(node.p), bound=bound,
                         origin=((what, key), lo_hi, v - math.floor(v) if lo_hi == "down" else math.ceil(v) - v, bound))
            for kk, most in limits.items():
                lo, hi = child.n.get(kk, (0, math.inf))
                if most < hi:
                    child.n[kk] = (lo, most)
            if any(lo > hi for lo, hi in child.n.values()):
                continue  # every plan in it costs more than the plan in hand
            table = child.n if what == "n" else child.p
            grp = model.groups[key] if what == "p" else None
            lo, hi = table.get(key, (0, math.inf if grp is None else 1 if grp.together else grp.count))
            if lo_hi == "down":
                table[key] = (lo, math.floor(v))
            else:
                table[key] = (math.ceil(v), hi)
            if table[key][0] > table[key][1]:
                continue
            if in_dive:
                dive.append((bound, seq, child, None, None))
            else:
                heapq.heappush(heap, (bound, seq, child, None, None))
            seq += 1
        if in_dive and dive_nodes >= DIVE_NODES:
            end_dive()
    lb = min([b for b, *_ in heap] + [b for b, *_ in dive] + stuck + pruned + [best_cost])
    return best, best_cost, max(root_lb, lb)


def _score(costs: dict, what: tuple, f: float) -> float:
    """Pseudo-cost score of branching on ``what`` at fractional part ``f``: the product of
    the bound rises expected on its two sides (the mean over all counts where it has none).
    ``costs[side]``: {count: [sum of rises per unit step, how many]}, and None: the totals."""
    out = 1.0
    for side, step in (("down", f), ("up", 1 - f)):
        total, n = costs[side].get(what) or costs[side].get(None) or (1.0, 1)
        out *= max(total / n * step, 1e-6)
    return out


FILL_MIN_SECS = 0.05  # CP-SAT's least time for placing the rest in a fill
MIN_STEP_SECS = 0.05  # a search step (a dive, the integer master) starts only with this much time left
COUNTS_SHARE, COUNTS_SECS = 0.35, 1.0  # the counts MIP's time: a share of the search's, at most this (s)
BENDERS_SHARE = 0.95  # of what is left then, for the Benders proof (``benders``) before branch-and-price
# (it ends early when its counts do not pack; run to its deadline it is near a proof, which
# the 20 % it left at 0.8 cost 1,000-VM models at a 1 s limit, and branch-and-price seldom finds)
DIVE_EVERY = 40  # best-first nodes between dives
DIVE_NODES = 60  # nodes one dive may take before it hands its open nodes back


def _dive(model: PlanModel, types: list[MachineType], target: int, pool: list, deadline: float) -> Solution | None:
    """Fix-and-solve: fix the LP's whole machines (λ_j ≥ ⌊λ_j⌋ as column bounds),
    price again, repeat while that fixes more; then the integer master over the
    small remainder. Bounds on columns leave pricing unchanged. A plan, or None."""
    master = Master(model, types, target)
    for ty, k, counts in pool:
        master.add_pattern(ty, k, counts)
    while time.monotonic() < deadline:
        try:
            res, _, _ = generate(model, master, types, pool, deadline)
        except TooBig:  # (new duals reached a shared DP past MAX_CELLS: the root's did not, so it ran)
            return None
        if res is None:
            return None
        x = np.concatenate([res.x, np.zeros(len(master.kind) - len(res.x))])  # columns priced after it
        cols = [j for j, kind in enumerate(master.kind) if kind[0] in ("pat", "host")]
        frac = [j for j in cols if x[j] - math.floor(x[j] + 1e-9) > 1e-6]
        if not frac:
            sol = extract(model, master, x)
            ok = not violations(model, sol) and sum(sol.placed(len(model.groups))) >= target
            return sol if ok else None
        moved = False
        for j in cols:
            lo = math.floor(x[j] + 0.3)  # nearly whole machines (λ ≥ ⌊λ⌋ + 0.7) are rounded up too
            if lo > master.bounds[j][0]:
                master.bounds[j] = (lo, master.bounds[j][1])
                moved = True
        if not moved:  # what is left is small: the integer master over it, the whole machines fixed
            mres = master.mip(deadline - time.monotonic())
            if mres.x is None:
                return None
            sol = extract(model, master, mres.x)
            ok = not violations(model, sol) and sum(sol.placed(len(model.groups))) >= target
            return sol if ok else None
    return None


def _residual(model: PlanModel, master: Master, x: np.ndarray, target: int) -> Solution | None:
    """Residual rounding: the LP's whole machines (⌊λ_j⌋ of each pattern), the rest
    of the work by first fit. A feasible plan, or None."""
    from fuse.controller.pool.greedy import greedy

    xf = np.floor(np.concatenate([np.asarray(x, dtype=float), np.zeros(max(0, len(master.kind) - len(x)))]) + 1e-9)
    for j, kind in enumerate(master.kind):
        if kind[0] == "p":
            xf[j] = master.bounds[j][1]  # keep every VM the whole machines hold
    sol = greedy(model, start=extract(model, master, xf))
    if violations(model, sol) or sum(sol.placed(len(model.groups))) < target:
        return None
    return sol


def _fill(model: PlanModel, types: list[MachineType], kinds: list[tuple], x: np.ndarray, target: int,
          deadline: float, secs: float | None = None, loosen: int = 0, any_full: bool = False) -> Solution | None:
    """A plan on the machines of an LP answer ``x`` over columns ``kinds`` (a master's
    ``kind``: placed counts ("p", g) and patterns): the whole machines ⌊λ_j⌋ of each
    pattern as they are, then the work the fractional patterns share placed on the
    ⌈N_(t,k)⌉ − Σ⌊λ_j⌋ machines left of each type and class (``_place_rest``). When
    the counts N are integral (a branch-and-price node's) and everything fits, the
    cost is at most Σ κ N (a machine is billed no longer than its class). What does
    not fit is completed by first fit. A feasible plan placing ``target`` VMs, or None.
    ``secs``: CP-SAT's time for the rest, instead of its share of what is left. ``loosen``:
    that many machines fewer of each pattern are taken whole (their work joins the rest,
    their machines the bins), for counts whose whole patterns leave a rest that does not fit.
    ``any_full``: any placement of all of it will do (whole counts a master proposed: the
    plan then costs at most their Σ κ N, which is what the proof asks), so first fit's
    answer is taken when it places everything, and CP-SAT stops at its first such answer."""
    from fuse.controller.pool.greedy import greedy
    from fuse.controller.pool.solution import Machine

    groups = model.groups
    by_key = {ty.key: ty for ty in types}
    x = np.concatenate([np.asarray(x, dtype=float), np.zeros(max(0, len(kinds) - len(x)))])
    left = [0] * len(groups)
    room: dict[tuple, float] = {}
    for j, kind in enumerate(kinds):
        if kind[0] == "p":
            left[kind[1]] = int(round(x[j])) * (groups[kind[1]].count if groups[kind[1]].together else 1)
        elif kind[0] in ("pat", "host"):
            key = (("h" if kind[0] == "host" else "t", kind[1]), kind[2])
            room[key] = room.get(key, 0.0) + x[j]
    room = {key: math.ceil(v - 1e-6) for key, v in room.items()}
    sol, taken = Solution(), set()
    # existing hosts first, as ``extract``: a surplus (cover rows are ≥) lands on new machines
    for j in sorted(range(len(kinds)), key=lambda j: kinds[j][0] != "host"):
        kind = kinds[j]
        whole = int(math.floor(x[j] + 1e-6)) - loosen
        if kind[0] not in ("pat", "host") or whole <= 0:
            continue
        room[("h" if kind[0] == "host" else "t", kind[1]), kind[2]] -= whole
        if kind[0] == "host":
            taken.add(("h", kind[1]))
        for _ in range(whole):
            take_pattern(model, sol, kind, left)
    # an existing host is one machine whatever its classes: one bin, of its longest
    # class with room, unless a whole pattern already took it
    for key in {key for key, _ in room if key[0] == "h"}:
        ks = sorted(k for (kk, k), r in room.items() if kk == key and r > 0)
        for k in ks:
            room[key, k] = 1 if k == ks[-1] and key not in taken else 0
    bins = [(by_key[key], k) for (key, k), r in sorted(room.items()) for _ in range(max(r, 0))]
    for b, counts in _place_rest(model, bins, left, deadline, secs, any_full):
        ty = bins[b][0]
        for g, a in counts.items():
            left[g] -= a
        if ty.host:
            for g, a in counts.items():
                sol.on_hosts[g, ty.t] = sol.on_hosts.get((g, ty.t), 0) + a
        else:
            sol.machines.append(Machine(offer=ty.t, counts=counts))
    if any(v > 0 for v in left):
        sol = greedy(model, start=sol)
    if violations(model, sol) or sum(sol.placed(len(groups))) < target:
        return None
    return sol


def _place_rest(model: PlanModel, bins: list[tuple[MachineType, int]], left: list[int],
                deadline: float, secs: float | None = None, any_full: bool = False) -> list[tuple[int, dict[int, int]]]:
    """Place what ``left`` still wants on ``bins`` (one per machine: its type and class),
    exactly: one CP-SAT variable per (group, machine), most VMs first, then the least
    cost of the machines used. [(bin, {group: VMs})], empty when nothing is placed.

    ``any_full``: only a placement of all of it is wanted. First fit's, when it places
    everything; else CP-SAT on the feasibility model alone (every VM placed, no cost, no
    machine-use switches): it finds such a packing or proves there is none in a fraction
    of the time the optimisation takes (25 ms against 1.2 s on a 1,000-VM model's rest of
    26 machines). When there is none, first fit's partial placement is the answer."""
    from ortools.sat.python import cp_model

    groups = model.groups
    need = [g for g in range(len(groups)) if left[g] > 0]
    if not bins or not need:
        return []
    first = _first_fit_rest(model, bins, left, need) if any_full else []
    if any_full and sum(sum(c.values()) for _, c in first) == sum(left[g] for g in need):
        return first  # all of it on the bins: a plan costing at most the bins' Σ κ
    m = cp_model.CpModel()
    xs: dict[tuple[int, int], cp_model.IntVar] = {}
    of_group: dict[int, list] = {g: [] for g in need}
    used = []
    for b, (ty, k) in enumerate(bins):
        load = []
        for g in need:
            if g not in ty.cls or ty.cls[g] > k or ty.q[g] <= 0:
                continue
            grp = groups[g]
            unit = grp.count if grp.together else 1
            xs[g, b] = m.new_int_var(0, 1 if grp.together else min(left[g], ty.q[g]), f"x{g}_{b}")
            load.append((xs[g, b], unit, grp))
            of_group[g].append(xs[g, b] * unit)
        if not load:
            used.append(None)
            continue
        m.add(sum(v * u * grp.cpus for v, u, grp in load) <= ty.cap_cpu)
        m.add(sum(v * u * grp.mem_mib for v, u, grp in load) <= ty.cap_mem)
        per = 1 if ty.one_space(model) else ty.slots
        if per is not None:
            m.add(sum(v * u for v, u, _ in load) <= per)
        if any_full:
            continue
        on = m.new_bool_var(f"u{b}")
        for v, _, _ in load:
            m.add(v == 0).only_enforce_if(on.Not())
        if b and used[-1] is not None and bins[b - 1][0] is ty and bins[b - 1][1] == k:
            m.add_implication(on, used[-1])  # identical machines: the used ones first
        used.append(on)
    if any_full:
        if any(not col for col in of_group.values()):
            return first  # a group no machine here takes
        for g, col in of_group.items():
            m.add(sum(col) == left[g])
        hint = {(g, b): a // (groups[g].count if groups[g].together else 1) for b, counts in first for g, a in counts.items()}
        for key, v in xs.items():
            m.add_hint(v, hint.get(key, 0))
    else:
        placed = [sum(col) for g, col in of_group.items() if col]
        if not placed:
            return []
        for g, col in of_group.items():
            if col:
                m.add(sum(col) <= left[g])
        # most VMs first, then the least cost of the machines used (micro-USD)
        price = [(on, round(1e6 * bins[b][0].kappa[bins[b][1]])) for b, on in enumerate(used) if on is not None]
        scale = 1 + sum(c for _, c in price)
        m.maximize(scale * sum(placed) - sum(c * on for on, c in price))
    solver = cp_model.CpSolver()
    left_secs = deadline - time.monotonic()  # up to 0.5 s early in a long search, 0.1 s late or in a short one
    share = max(FILL_MIN_SECS, min(0.5, 0.05 * left_secs)) if secs is None else secs
    solver.parameters.max_time_in_seconds = max(0.01, min(share, left_secs))
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = model.seed
    if any_full:
        solver.parameters.linearization_level = 2  # the LP in the search: ~5× faster on the larger rests
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return first
    filled: dict[int, dict[int, int]] = {}
    for (g, b), v in xs.items():
        got = solver.value(v) * (groups[g].count if groups[g].together else 1)
        if got:
            filled.setdefault(b, {})[g] = got
    return sorted(filled.items())


def _first_fit_rest(model: PlanModel, bins: list[tuple[MachineType, int]], left: list[int],
                    need: list[int]) -> list[tuple[int, dict[int, int]]]:
    """First fit decreasing of what ``left`` wants onto ``bins`` (largest VMs first, a
    together group as one item, each machine's class, VMs per machine and room kept):
    [(bin, {group: VMs})], as ``_place_rest`` answers; what does not fit is left out."""
    groups = model.groups
    room = [[ty.cap_cpu, ty.cap_mem, 1 if ty.one_space(model) else ty.slots] for ty, _ in bins]
    out: dict[int, dict[int, int]] = {}
    for g in sorted(need, key=lambda g: (-groups[g].cpus * groups[g].mem_mib, g)):
        grp = groups[g]
        unit = grp.count if grp.together else 1
        items = 1 if grp.together else left[g]
        for b, (ty, k) in enumerate(bins):
            if not items:
                break
            if g not in ty.cls or ty.cls[g] > k or ty.q[g] <= 0:
                continue
            cpu, mem, slots = room[b]
            fit = min(items, ty.q[g] if not grp.together else 1, cpu // (grp.cpus * unit), mem // (grp.mem_mib * unit))
            if slots is not None:
                fit = min(fit, slots // unit)
            if fit <= 0:
                continue
            room[b][0] -= fit * unit * grp.cpus
            room[b][1] -= fit * unit * grp.mem_mib
            if slots is not None:
                room[b][2] -= fit * unit
            out.setdefault(b, {})[g] = fit * unit
            items -= fit
    return sorted(out.items())
