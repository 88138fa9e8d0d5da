"""The elastic planner: where VMs go and what it costs, solved exactly.

``plan(model) -> ElasticPlan`` is a pure function: the model is sorted first,
the solver runs single-threaded with ``model.seed``, nothing is printed.

Notation
--------
groups g: n_g VMs of (c_g vCPUs, m_g MiB), duration d_g;   hosts h: free (C_h, M_h) and
S_h VM slots (its vm_count policy less the VMs on it; ∞ when it has none);
offers t: (C_t, M_t), r_t USD/h;   billing classes k of t: the distinct durations
δ_k of the groups allowed on t (a machine is billed for its longest work, so
it is in exactly one class);  b_tk = billed_secs(t, δ_k) = max(min_t,
⌈(δ_k + boot_t)/step_t⌉·step_t).

Variables (integer counts, never one variable per VM — identical VMs and
identical machines are symmetric):
  x_gh ∈ ℕ   VMs of g on existing host h          (together: x_gh = n_g·w_gh, w ∈ {0,1})
  N_tk ∈ ℕ   new machines of type t in class k
  z_gtk ∈ ℕ  VMs of g on those machines, allowed iff d_g ≤ δ_k  (together: n_g·w_gtk)
  y_gh ∈ {0,1}, e_h ≥ 0   running cloud host h used by g, and its extra cost
  p_g = Σ_h x_gh + Σ_tk z_gtk ≤ n_g   VMs of g placed

Constraints: Σ_g c_g x_gh ≤ C_h, Σ_g m_g x_gh ≤ M_h, Σ_g x_gh ≤ S_h;  Σ_g c_g z_gtk ≤ C_t N_tk,
Σ_g m_g z_gtk ≤ M_t N_tk, z_gtk ≤ q_gt N_tk (q_gt = VMs of g one machine holds),
Σ_g z_gtk ≥ N_tk (no empty machine);  one_space offers: Σ_g z_gtk ≤ N_tk;
caps: Σ r_t N_tk ≤ max_usd_per_hour, Σ N_tk ≤ max_new_hosts (= hosts pin),
Σ_k N_tk ≤ limit_t, Σ_{t∈f} vcpus_t N_tk ≤ quota_f, cost ≤ monthly_usd_left;
rules (KVM kinds on KVM machines only, allow_metal, arch, pins) remove variables.

Objective, lexicographic:
  1. maximise Σ_g p_g — as many VMs as possible (solved first, only when the
     greedy baseline leaves some unplaced; when it answers no count in its share of
     the time, the pattern model aims at all of the work and its LP's most, a
     relaxation's too, is the target);
  2. minimise COST with Σ_g p_g ≥ that maximum, where
     COST = Σ_tk κ_tk N_tk + Σ_h e_h in micro-USD, κ_tk = ⌊10⁶ r_t b_tk / 3600⌋,
     e_h ≥ ⌊10⁶ r_h extra_secs(h, d_g)/3600⌋·y_gh (extra billed time beyond paid);
  3. minimise TIE with COST fixed at its optimum (best effort in the time left):
     TIE = Σ_{running h} x_gh + 2 Σ z_gtk + R,  R ≥ boot_t·[t used] (readiness).
  Own devices cost 0, running hosts cost only their extra billed time, new
  machines always cost > 0; so cost alone orders devices < running < new
  whenever prices differ, and TIE orders them (and then prefers the faster
  boot) when they do not. TIE is a stage of the aggregate model only; every
  answer then passes ``prefer.prefer_order``, which moves work, at no more cost
  and breaking no constraint, onto own hosts with room and off new machines a
  running host can take as cheaply: the same order on the pattern model's plans.

The capacity sums over N identical machines are a relaxation (a VM cannot
straddle two machines), so the optimum of this model is a lower bound on the
cost of any plan placing the same work. ``pack`` then splits each (t, k) over
its N machines; when every split succeeds the plan costs exactly the bound and
is proven optimal (``exact``, to the micro-dollar flooring of κ). Otherwise the
unpacked VMs are completed by first-fit (``exact-incumbent``), and the answer
is compared against first-fit decreasing on the whole model: the better one
(more VMs placed, then cheaper) is returned, labelled by who produced it.

Before the aggregate model, ``patterns`` solves the whole-machine pattern model
(Gilmore–Gomory, column generation priced by a per-type knapsack DP, HiGHS for
the LP and the integer master; each existing host is a type of its own with
one machine), whose LP must settle within 80% of the time; Benders cuts on the
machine counts (``benders``: an integer master over N_tk, each answer checked
by a feasibility LP that returns a cut or holds the work) and then
branch-and-price on machine counts may use the rest. Its plans pack by
construction and its bound is valid. It answers ``exact`` when its plan meets its bound; when its
search ran to the time limit the aggregate model (a weaker bound) is skipped;
else the better plan of the two is kept and the bound is the larger of the two
(each bounds every plan placing the target). Offers are first pruned by
dominance (``formulation.dominators``). The searches end 10% of the time limit
(at most 0.25 s) and 20 µs per VM before it (at most 30% in all), so the answer,
checked and explained, is back within it.

An answer still unproven with time left, of a small model (at most ``slots.MAX_SLOTS``
machines), is solved once more with every new machine named (``slots``: the per-machine
model, exact, so its answers pack, the ``hosts`` pin included): ``exact`` when it proves
both the most VMs placed and the least cost, else its plan when it places more or costs
less (the aggregate answer that did not pack, completed by first fit, is what it mends).

Labels (``solver``): ``exact`` when the plan is proven optimal — stage 1 proved
its placed count the most possible (or nothing was left unplaced by first fit)
and its cost meets the bound. ``exact-incumbent`` for the best plan the exact
models found without that proof: the time limit ended a search (stage 1's, the
branch-and-price, or CP-SAT's stage 2), or the aggregate model's answer did not
pack onto whole machines and first fit completed it (a packing gap; the note
says so). ``greedy`` when first-fit decreasing answered: the exact models
found no plan in time, or none better. Never worse than first fit either way.

``lower_bound_usd``: the pattern model's bound (the larger of the Benders
master's bound and the least bound of the open branch-and-price nodes), or ⌈bound⌉ / 10⁶ with ``bound`` CP-SAT's proven bound
on stage 2 (re-solved for the plan's placed count when the answer places fewer
VMs than stage 1 found), the larger when both apply; it equals
``projected_usd`` when exact.
"""

from __future__ import annotations

import gc
import heapq
import math
import threading
import time

from fuse.controller.pool import formulation as F
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.model import PlanModel, offer_vcpus
from fuse.controller.pool.pack import pack, pack_partial
from fuse.controller.pool.prefer import prefer_order
from fuse.controller.pool.solution import Machine, Solution, better, cost_usd, to_plan, violations
from fuse.models.pool import ElasticPlan


def plan(model: PlanModel) -> ElasticPlan:
    """Plan ``model`` exactly within ``model.time_limit_secs``; see the module docstring."""
    warm()  # once per process, before the clock starts: the limit is the solve's
    model = model.sorted()
    sol, solver, lb, notes = solve(model)
    # the preference order among plans of equal cost (own, running, new), on every path
    sol = prefer_order(model, sol, exact=solver == "exact")
    return to_plan(model, sol, solver=solver, lower_bound_usd=lb, notes=notes)


_WARM = threading.Lock()
_warmed = False


def warm() -> None:
    """Import the solver libraries and take what the imports left out of the garbage
    collector's full scans; once per process (the controller starts it in the background).

    The imports (scipy's HiGHS, OR-Tools with pandas) take 0.5–0.9 s, and leave ~10⁵
    objects that a full collection scans in ~0.15 s, which the first plan's allocations
    trigger: both would come out of a 1 s time limit. ``gc.freeze`` moves every object
    alive now to the permanent generation, which collections skip."""
    global _warmed
    with _WARM:
        if _warmed:
            return
        import ortools.sat.python.cp_model  # noqa: F401
        import scipy.optimize  # noqa: F401

        from fuse.controller.pool import benders, knapsack, patterns, search  # noqa: F401

        knapsack.warm()  # compiled once per machine (numba's cache), loaded once per process

        gc.collect()
        gc.freeze()
        _warmed = True


AGGREGATE_SHARE = 0.85  # of the time left, for stage 2 on the aggregate model
PATTERN_LP_SHARE = 0.8  # of the time left, by which the pattern model's LP must settle
AGGREGATE_MIN_SHARE = 0.25  # of the time limit: with less left, the aggregate model is not started
# kept of the time limit for finishing the answer: a share (at most TAIL_SECS) and, since
# checking and explaining a plan grows with it, a little per VM (at most 30% in all)
TAIL_SHARE, TAIL_SECS, TAIL_PER_VM = 0.05, 0.25, 2e-5  # (measured: 5 ms past the search at 1,000 VMs, 50 at 5,000)
NO_PLAN_MEETS_PINS = "no plan meets the pins and caps together (proven): nothing is placed or bought"
PARTIAL_PLAN = ("time limit reached before a plan placing the most VMs the models allow was found: the pattern "
                "LP's whole machines, the rest by first fit")
PER_MACHINE = "time limit reached (the per-machine model): a cheaper plan may exist"
STAGE1_UNPROVEN = ("time limit reached before the most VMs that can be placed was proven: "
                   "a plan placing more may exist")


def stage1_unproven(most: int | None, placed: int) -> str:
    """Why a plan whose cost is proven least for its count is not proven optimal: the count.
    ``most``: the relaxation's proven most (summed capacity: a VM may not straddle machines)."""
    if most is not None and most > placed:
        return (f"the most VMs that can be placed is not proven: capacity summed over the machines allows "
                f"{most}, whole machines were found for {placed} (a plan placing more may exist)")
    return STAGE1_UNPROVEN


def solve(model: PlanModel) -> tuple[Solution, str, float, list[str]]:
    """(solution, solver label, lower bound USD, explain notes) for a sorted model."""
    # the searches stop early enough for the answer to be written within the limit
    # (a search step in flight, the plan's checks and its explain lines)
    total = sum(g.count for g in model.groups)
    tail = min(TAIL_SHARE * model.time_limit_secs, TAIL_SECS) + TAIL_PER_VM * total
    deadline = time.monotonic() + model.time_limit_secs - min(tail, 0.3 * model.time_limit_secs)
    base = greedy(model)
    if total == 0:
        return base, "exact", 0.0, []
    kept = F.undominated_offers(model)
    if (why := F.too_large(model, kept)) is not None:
        # (figures a linked type may have, past CP-SAT's int64: first fit's plan, and 0 is a bound)
        return base, "greedy", 0.0, [why]
    base_placed = sum(base.placed(len(model.groups)))

    target, most_proven, reach = base_placed, True, False
    if base_placed < total:  # stage 1: how many can be placed at all
        f = F.build(model, kept)
        f.m.maximize(sum(f.placed))
        f.hint(model, base)
        st, solver = F.run(f, model, 0.3 * (deadline - time.monotonic()))
        if st == "infeasible" and base_placed == 0:
            # the model (a relaxation of every plan) has no answer at all: the pins
            # admit none (hosts=N with fewer than N VMs...), so nothing placed is exact
            return base, "exact", 0.0, [NO_PLAN_MEETS_PINS]
        if st == "optimal":
            target = int(round(solver.objective_value))
        elif st == "feasible":
            target = max(base_placed, int(round(solver.objective_value)))
        else:
            # no count found in stage 1's share (a short limit, a loaded machine): the pattern
            # model aims at all of the work, and its LP, when that cannot hold it all, says how
            # many whole machines within the caps can (``_solve_target``); planning for first
            # fit's count instead answered with first fit's VMs and most of the time unused
            target, reach = total, True
        # the objective puts VMs placed first: a cost proven least for ``target`` VMs
        # is not an optimal plan unless ``target`` is proven the most placeable
        most_proven = st == "optimal" or target == total
    sol, label, lb, notes, most = _solve_target(model, kept, base, target, deadline, reach=reach)
    if reach:
        # (``most``: the pattern LP's most, a relaxation's: a plan placing that many places the most)
        placed = sum(sol.placed(len(model.groups)))
        target = total if placed >= total else most if most is not None else base_placed
        most_proven = placed >= target and (placed >= total or most is not None)
    if label != "exact" and (got := _per_machine(model, kept, sol, lb, target if most_proven else None,
                                                 deadline)) is not None:
        return got  # (its proofs are of whole machines: no relaxation's count to meet)
    placed = sum(sol.placed(len(model.groups)))
    if label == "exact" and (not most_proven or placed < target):
        # (fewer than stage 1's count: the pattern LP placed no more within the caps, which the
        # aggregate model, a relaxation, could not tell; the most placeable is then not proven
        # by them: the per-machine model, of whole machines, may prove it on a small model)
        if (got := _per_machine(model, kept, sol, lb, None, deadline)) is not None:
            return got
        return sol, "exact-incumbent", lb, notes + [stage1_unproven(target if most_proven else None, placed)]
    return sol, label, lb, notes


def _per_machine(model: PlanModel, kept: list[int], sol: Solution, lb: float, most_known: int | None,
                 deadline: float) -> tuple[Solution, str, float, list[str]] | None:
    """An unproven answer of a small model given to the per-machine model (``slots``) with
    the time left: ``exact`` when that proves both stages, else its plan when it places more
    or costs less; None when it changes nothing (too big, no time, nothing better)."""
    from fuse.controller.pool import slots

    got = slots.solve(model, kept, sol, most_known, deadline)
    if got is None or violations(model, got.sol):
        return None
    if got.most_proven and got.cost_proven and not better(model, sol, got.sol):
        none = not any(got.sol.placed(len(model.groups)))
        return got.sol, "exact", cost_usd(model, got.sol), [NO_PLAN_MEETS_PINS] if none else []
    if not better(model, got.sol, sol):
        return None
    # a bound for plans placing fewer VMs also bounds those placing more
    placed = sum(sol.placed(len(model.groups)))
    bound = max(got.bound_usd, lb if placed <= sum(got.sol.placed(len(model.groups))) else 0.0)
    return (got.sol, "exact-incumbent", min(bound, cost_usd(model, got.sol)),
            [PER_MACHINE] + ([] if got.most_proven else [STAGE1_UNPROVEN]))


def _solve_target(model: PlanModel, kept: list[int], base: Solution, target: int, deadline: float,
                  reach: bool = False) -> tuple[Solution, str, float, list[str], int | None]:
    """Stage 2 (and 3): the least-cost plan placing at least ``target`` VMs, and the most
    VMs the pattern LP holds when it cannot hold ``target`` (else None). ``reach``: the target
    is all of the work, not a count stage 1 found: when the pattern model does not say how
    many it holds, the aggregate model plans for first fit's count."""
    from fuse.controller.pool.search import TargetTooHigh  # (scipy and HiGHS: imported on first use)

    # the whole-machine pattern model first (it packs by construction): its LP must settle
    # within most of the time (the aggregate model's bound is far weaker at this scale)
    share = deadline - (1 - PATTERN_LP_SHARE) * (deadline - time.monotonic())
    partial: list[Solution] = []  # the pattern LP's rounding, when no plan places the target
    most = None
    try:
        pat = _patterns(model, kept, target, base, share, deadline, partial)
    except TargetTooHigh as high:
        # stage 1's count came from the aggregate model (capacity sums: a relaxation), and
        # whole machines within the caps hold fewer: plan for as many as the pattern LP places
        # (at 1,000 VMs under a binding $/hour cap, 629 of stage 1's 649; the aggregate model
        # searched for 649 in vain till the limit, and first fit placed 105)
        most = math.floor(high.most + 1e-6)
        target = max(sum(base.placed(len(model.groups))), most)
        share = deadline - (1 - PATTERN_LP_SHARE) * (deadline - time.monotonic())
        try:
            pat = _patterns(model, kept, target, base, share, deadline, partial)
        except TargetTooHigh:
            pat = None
    if reach and most is None and pat is None:
        target = sum(base.placed(len(model.groups)))
    if pat is not None and pat[2]:
        return pat[0], "exact", cost_usd(model, pat[0]), [], most
    if pat is not None and pat[3] and not better(model, base, pat[0]) and deadline - time.monotonic() < 0.05:
        # settled: the pattern LP bound is in hand and branch-and-price has had the
        # time; the aggregate model's bound is weaker, so it is not run
        return pat[0], "exact-incumbent", pat[1], ["time limit reached (branch-and-price on the pattern model)"], most
    if (pat is not None and deadline - time.monotonic() < AGGREGATE_MIN_SHARE * model.time_limit_secs
            and sum(pat[0].placed(len(model.groups))) >= target and not better(model, base, pat[0])):
        # too little time left for the aggregate model to build and solve (at 5,000 VMs
        # building it alone takes ~0.1 s): the pattern model's plan and bound answer
        return pat[0], "exact-incumbent", pat[1], ["time limit reached (the pattern model's column generation)"], most
    sol, solver, lb, notes = _aggregate(model, kept, base, target, deadline)
    if pat is None and partial and solver != "exact":
        rough = min(partial, key=lambda p: (-sum(p.placed(len(model.groups))), cost_usd(model, p)))
        if better(model, rough, sol):  # (more VMs placed than first fit, say, under a binding cap)
            return rough, "exact-incumbent", _bound(model, kept, rough, deadline), [PARTIAL_PLAN], most
    if pat is None or solver == "exact":
        return sol, solver, lb, notes, most
    psol, plb = pat[0], pat[1]
    if sum(psol.placed(len(model.groups))) < target or violations(model, psol) or not better(model, psol, sol):
        if sum(sol.placed(len(model.groups))) >= target:
            lb = max(lb, plb)  # both bound every plan placing the target (see the docstring)
        return sol, solver, min(lb, cost_usd(model, sol)), notes, most
    lb = max(lb, plb)
    cost = cost_usd(model, psol)
    if cost <= lb + 1e-6:
        return psol, "exact", cost, [], most
    return psol, "exact-incumbent", lb, ["time limit reached"], most


def _patterns(model: PlanModel, kept: list[int], target: int, base: Solution, share: float,
              deadline: float, partial: list[Solution] | None = None) -> tuple[Solution, float, bool, bool] | None:
    """The pattern model's (plan, bound, proven, settled), or None when it does not apply.
    Its LP must settle by ``share``; once it has, its search may use the time to ``deadline``."""
    from fuse.controller.pool import patterns, search  # scipy is imported on first use

    got = search.solve(model, kept, target, base, share, deadline, partial=partial)
    if got is None:
        return None
    sol, lb, proven, settled = got
    sol = patterns.prefer_existing(model, sol)
    if violations(model, sol) or sum(sol.placed(len(model.groups))) < target:
        return None
    return sol, min(lb, cost_usd(model, sol)), proven and cost_usd(model, sol) <= lb + 1e-6, settled


def _aggregate(model: PlanModel, kept: list[int], base: Solution, target: int,
               deadline: float) -> tuple[Solution, str, float, list[str]]:
    """Stages 2 and 3 on the aggregate CP-SAT model, packed and repaired."""
    f = F.build(model, kept)
    f.m.add(sum(f.placed) >= target)
    f.m.minimize(f.cost)
    f.hint(model, base)
    # a share of the time is kept for what may follow: a bound of its own when the plan
    # is first fit's or places fewer VMs (another CP-SAT run), or stage 3
    st, solver = F.run(f, model, AGGREGATE_SHARE * (deadline - time.monotonic()))
    if st not in ("optimal", "feasible"):
        return base, "greedy", _bound(model, kept, base, deadline), ["exact solver found no plan in time"]
    bound_micro = max(0, math.ceil(solver.best_objective_bound - 1e-6))
    if st == "optimal" and deadline - time.monotonic() > 0.05:
        # stage 3: among plans of that cost, prefer own devices, then running hosts,
        # then the quickest to be ready (best effort: the cost stays optimal either way)
        f3 = F.build(model, kept)
        f3.m.add(sum(f3.placed) >= target)
        f3.m.add(f3.cost <= int(round(solver.objective_value)))
        f3.m.minimize(f3.tie)
        f3.hint_from(f, solver)
        st3, solver3 = F.run(f3, model, deadline - time.monotonic())
        if st3 in ("optimal", "feasible"):
            f, solver = f3, solver3

    sol, packed_all = realise(model, f, solver, deadline)
    notes = [] if packed_all else ["packing gap: some machines' aggregate share did not split; completed by first fit"]
    if violations(model, sol) or better(model, base, sol):
        lb = bound_micro / 1e6 if sum(base.placed(len(model.groups))) >= target else _bound(model, kept, base, deadline)
        return base, "greedy", lb, notes + ["first-fit decreasing answered: the exact plan was not better"]
    placed = sum(sol.placed(len(model.groups)))
    if placed < target:
        return sol, "exact-incumbent", _bound(model, kept, sol, deadline), notes
    if st == "optimal" and packed_all:
        return sol, "exact", cost_usd(model, sol), notes
    return sol, "exact-incumbent", bound_micro / 1e6, notes + ([] if st == "optimal" else ["time limit reached"])


def realise(model: PlanModel, f: F.Formulation, solver, deadline: float) -> tuple[Solution, bool]:
    """Turn solver counts into machines; returns (solution, every (t, k) split cleanly)."""
    sol = Solution()
    for (g, h), expr in f.x.items():
        k = int(solver.value(expr))
        if k:
            sol.on_hosts[g, h] = k
    ok = True
    pin = model.constraints.exact_new_hosts
    for (t, k), nvar in sorted(f.n.items()):
        n = int(solver.value(nvar))
        if n == 0:
            continue
        o = model.offers[t]
        items = []
        for g in f.groups_on[t, k]:
            z = int(solver.value(f.z[g, t, k]))
            if z:
                grp = model.groups[g]
                items.append((g, -z if grp.together else z, grp.cpus, grp.mem_mib))
        cap_cpu = offer_vcpus(o, model.constraints)
        slots = 1 if o.one_space else None
        bins = pack(items, n, cap_cpu, o.mem_mib, max_vms=slots,
                    time_limit=min(0.2, max(0.0, deadline - time.monotonic())), seed=model.seed)
        if bins is None:
            # the aggregate share does not split: keep what first fit places on
            # these N machines; the greedy completion below places the rest
            ok = False
            bins = pack_partial(items, n, cap_cpu, o.mem_mib, max_vms=slots)
        full = [b for b in bins if b]
        if pin is not None and len(full) < len(bins):
            full = _spread(model, bins)
        sol.machines.extend(Machine(offer=t, counts=b) for b in full)
    if not ok:
        sol = greedy(model, start=sol)
    return sol, ok


def _spread(model: PlanModel, bins: list[dict[int, int]]) -> list[dict[int, int]]:
    """Fill empty machines (the hosts pin wants all N) with one VM from the fullest (the
    first of the fullest: a heap of (−VMs, position), so N machines cost N log N, not N²)."""
    heap = [(-sum(d.values()), i) for i, d in enumerate(bins)]
    heapq.heapify(heap)
    for b in bins:
        if b:
            continue
        _, i = heapq.heappop(heap)
        donor = bins[i]
        g = next((g for g, k in sorted(donor.items()) if k > 1 or (k == 1 and len(donor) > 1)
                  if not model.groups[g].together), None)
        if g is None:
            break
        donor[g] -= 1
        if donor[g] == 0:
            del donor[g]
        b[g] = 1
        heapq.heappush(heap, (-sum(donor.values()), i))
        # (b was empty: its entry (0, j) stands for what it holds now, 1 VM, which no donor
        # with 2 or more is passed over for; a donor of 1 VM gives none: the same choice)
    return [b for b in bins if b]


def _bound(model: PlanModel, kept: list[int], sol: Solution, deadline: float) -> float:
    """A proven lower bound (USD) on plans placing at least as many VMs as ``sol``."""
    placed = sum(sol.placed(len(model.groups)))
    f = F.build(model, kept)
    f.m.add(sum(f.placed) >= placed)
    f.m.minimize(f.cost)
    st, solver = F.run(f, model, max(0.05, deadline - time.monotonic()))
    if st in ("optimal", "feasible"):
        return min(solver.best_objective_bound / 1e6, cost_usd(model, sol))
    return 0.0
