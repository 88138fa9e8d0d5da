"""The whole-machine pattern model on its own: its plans are feasible, its bound is
below every plan, and what it calls proven matches brute force."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from pool_builders import brute_force, offer, small_models

from fuse.controller.pool import formulation as F
from fuse.controller.pool import column_generation, highs, pack, patterns, search
from fuse.controller.pool.catalogue import default_catalogue
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.model import Constraints, DemandGroup, PlanModel, PoolHost
from fuse.controller.pool.pattern_master import Master
from fuse.controller.pool.planner import plan
from fuse.controller.pool.solution import cost_usd, violations

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from plan import random_model  # noqa: E402


def solve(m: PlanModel, target: int, secs: float = 2.0):
    base = greedy(m)
    now = time.monotonic()
    return search.solve(m, F.undominated_offers(m), target, base, now + secs / 2, now + secs)


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_models(max_vms=4))
def test_pattern_plans_are_feasible_their_bound_is_below_brute_force_and_proven_means_optimal(model):
    m = model.sorted()
    best_placed, best_cost = brute_force(m)
    got = solve(m, best_placed)
    if got is None:  # a hosts pin, or nothing to place: the planner uses the aggregate model
        return
    sol, lb, proven, _ = got
    assert violations(m, sol) == []
    assert sum(sol.placed(len(m.groups))) >= best_placed
    assert lb <= best_cost + 1e-6
    assert lb <= cost_usd(m, sol) + 1e-6
    if proven:
        assert abs(cost_usd(m, sol) - best_cost) <= 1e-6


def test_pattern_bound_is_below_first_fit_and_the_plan_no_costlier_on_a_100_vm_model():
    m = random_model(1, 100, 5, 20, 4).sorted()
    base = greedy(m)
    sol, lb, _, settled = solve(m, sum(base.placed(len(m.groups))))
    assert settled and violations(m, sol) == []
    assert lb <= cost_usd(m, sol) + 1e-9 <= cost_usd(m, base) + 1e-6


def test_type_limit_and_new_host_cap_hold_in_every_pattern_plan():
    cheap, dear = offer("cheap", 4, 8192, 0.10, limit=1), offer("dear", 4, 8192, 0.30)
    g = DemandGroup(name="g", count=12, cpus=1, mem_mib=1024, kind="container")
    m = PlanModel(groups=[g], offers=[cheap, dear], constraints=Constraints(max_new_hosts=3)).sorted()
    sol, _, proven, _ = solve(m, 12)
    assert violations(m, sol) == [] and proven
    used = sorted(m.offers[mach.offer].type_name for mach in sol.machines)
    assert used == ["cheap", "dear", "dear"]


def test_each_existing_host_is_one_machine_with_its_own_patterns():
    # two own devices of 3 vCPUs: their summed room (6) would take three 2-vCPU VMs,
    # but each device holds one, so the third needs a new machine
    hosts = [PoolHost(name=f"dev{i}", vcpus=3, mem_mib=8192, own=True) for i in range(2)]
    wide = DemandGroup(name="w", count=3, cpus=2, mem_mib=1024, kind="container")
    m = PlanModel(groups=[wide], hosts=hosts, offers=[offer("o", 2, 4096, 0.2)]).sorted()
    sol, lb, proven, _ = solve(m, 3)
    assert violations(m, sol) == [] and proven
    assert sum(sol.on_hosts.values()) == 2 and len(sol.machines) == 1
    assert abs(lb - cost_usd(m, sol)) <= 1e-6


def _root(m: PlanModel, target: int):
    """The root LP of the pattern model, solved to convergence: (types, master, LP result)."""
    types = patterns.machine_types(m, F.undominated_offers(m))
    master = Master(m, types, target)
    for ty in types:
        for g in ty.groups:
            grp = m.groups[g]
            master.add_pattern(ty, ty.cls[g], {g: grp.count if grp.together else min(grp.count, ty.q[g])})
    res, _, converged = column_generation.generate(m, master, types, [], time.monotonic() + 30)
    assert converged
    return types, master, res


def test_fill_puts_the_work_on_the_lp_machines_rounded_up_and_costs_no_more():
    # the LP's whole machines as they are, the shared rest on ⌈N⌉ − Σ⌊λ⌋ machines of each (type, class)
    for m in (random_model(1, 100, 5, 20, 4).sorted(), random_model(2, 300, 8, 20, 0).sorted()):
        target = sum(greedy(m).placed(len(m.groups)))
        types, master, res = _root(m, target)
        sol = search._fill(m, types, master.kind, res.x, target, time.monotonic() + 5)
        assert sol is not None and violations(m, sol) == []
        assert sum(sol.placed(len(m.groups))) >= target
        n, _, _ = search._counts(master, res.x)
        kappa = {ty.key: ty.kappa for ty in types}
        rounded_up = sum(kappa[key][k] * math.ceil(v - 1e-6) for (key, k), v in n.items())
        assert res.fun - 1e-6 <= cost_usd(m, sol) <= rounded_up + 1e-6


def test_a_fill_that_any_full_placement_will_do_places_everything_within_the_machines():
    # the counts a Benders master proposes: any placement of all the work proves them, so first
    # fit's answer is taken when it places everything and CP-SAT stops at its first such answer
    for m in (random_model(1, 100, 5, 20, 4).sorted(), random_model(2, 300, 8, 20, 0).sorted()):
        target = sum(greedy(m).placed(len(m.groups)))
        types, master, res = _root(m, target)
        n, _, _ = search._counts(master, res.x)
        kappa = {ty.key: ty.kappa for ty in types}
        rounded_up = sum(kappa[key][k] * math.ceil(v - 1e-6) for (key, k), v in n.items())
        for loosen in (0, 1):
            sol = search._fill(m, types, master.kind, res.x, target, time.monotonic() + 5, loosen=loosen, any_full=True)
            assert sol is not None and violations(m, sol) == []
            assert sum(sol.placed(len(m.groups))) >= target
            assert cost_usd(m, sol) <= rounded_up + 1e-6


def test_first_fit_of_a_fills_rest_keeps_room_class_slots_and_together_groups():
    m = PlanModel(groups=[DemandGroup(name="big", count=3, cpus=4, mem_mib=4096, kind="container", duration_secs=3600),
                          DemandGroup(name="pair", count=2, cpus=1, mem_mib=1024, kind="container", together=True, duration_secs=600),
                          DemandGroup(name="long", count=2, cpus=1, mem_mib=512, kind="container", duration_secs=14400)],
                  offers=[offer("o", 8, 8192, 0.1)], constraints=Constraints()).sorted()
    ty = patterns.machine_types(m, [0])[0]
    short, long_ = 0, len(ty.deltas) - 1  # classes: 1 h (the pair, the big VMs) and 4 h
    bins = [(ty, short), (ty, long_), (ty, long_)]
    left = [g.count for g in m.groups]
    got = dict(search._first_fit_rest(m, bins, left, [0, 1, 2]))
    by = {m.groups[g].name: g for g in range(3)}
    placed = {name: sum(c.get(g, 0) for c in got.values()) for name, g in by.items()}
    assert placed == {"big": 3, "pair": 2, "long": 2}
    assert all(c.get(by["long"], 0) == 0 for b, c in got.items() if bins[b][1] == short)  # 4-h work on 1-h machines: no
    for b, c in got.items():
        assert sum(m.groups[g].cpus * v for g, v in c.items()) <= 8
        assert sum(m.groups[g].mem_mib * v for g, v in c.items()) <= ty.cap_mem
        assert c.get(by["pair"], 0) in (0, 2)  # together: both VMs on one machine or none
    # a VM-count limit: one slot per machine leaves the rest out, never over it
    ty.slots = 1
    got = dict(search._first_fit_rest(m, bins, left, [0, 1, 2]))
    assert all(sum(c.values()) <= 1 for c in got.values())


def test_first_fit_tries_more_than_one_order():
    # by memory first, the 4-vCPU VM opens the first machine and one 4-vCPU VM is left out;
    # by the larger share of a machine (or by vCPUs) all five fit on the two machines exactly
    items = [(0, 2, 2, 3), (1, 1, 4, 3), (2, 2, 4, 1)]
    by_memory = sorted(items, key=lambda it: (-it[3], -it[2], it[0]))
    assert pack._first_fit(by_memory, 2, 8, 8, None)[1] == 1
    bins = pack._ffd(items, 2, 8, 8, None)
    assert bins is not None and sum(sum(b.values()) for b in bins) == 5
    for b in bins:
        assert sum(items[g][2] * k for g, k in b.items()) <= 8 and sum(items[g][3] * k for g, k in b.items()) <= 8


def test_microvm_work_on_the_one_kvm_type_is_proven_optimal_with_the_shipped_catalogue():
    # 1,000 VMs in 20 groups on the shipped AWS catalogue, a third of them microVMs that only
    # c6g.metal can hold: whole metal machines in three billing classes, packed exactly
    import random as rnd

    rng = rnd.Random(0)
    cuts = sorted(rng.sample(range(1, 1000), 19))
    groups = []
    for g, count in enumerate(b - a for a, b in zip([0] + cuts, cuts + [1000])):
        cpus = rng.choice([1, 1, 2, 2, 4, 8])
        groups.append(DemandGroup(
            name=f"g{g}", count=count, cpus=cpus, mem_mib=cpus * rng.choice([512, 1024, 2048, 4096]),
            kind=rng.choice(["container", "container", "microvm"]), duration_secs=rng.choice([600, 3600, 3600, 14400]),
            together=count <= 8 and rng.random() < 0.3))
    m = PlanModel(groups=groups, offers=list(default_catalogue()), time_limit_secs=30.0)
    p = plan(m)
    sm = m.sorted()
    assert p.solver == "exact" and p.projected_usd == p.lower_bound_usd
    assert p.projected_usd < cost_usd(sm, greedy(sm))


def test_solver_output_from_c_never_reaches_stdout(capfd):
    # HiGHS's MIP can print a debug line from C++ whatever scipy's disp says; stdout is
    # where ``fuse pool plan --json`` writes its answer, so a solve writes it to stderr
    with highs.stdout_to_stderr():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution\n")
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert out == "after\n" and "HighsMipSolverData" in err


def test_reduced_cost_fixing_keeps_every_optimal_plan():
    # class_limits bounds N_tk for plans no costlier than a given cost: the proven
    # optimal plan's own machine counts must be within them, at the root's row prices
    for seed, (vms, types_n, hosts) in enumerate([(30, 8, 0), (50, 12, 2), (80, 20, 0), (80, 20, 4)]):
        m = random_model(100 + seed, vms, 4, types_n, hosts).model_copy(update={"time_limit_secs": 20}).sorted()
        best = solve(m, sum(greedy(m).placed(len(m.groups))), secs=20)
        sol, _, proven, _ = best
        assert proven
        target = sum(sol.placed(len(m.groups)))
        types, master, _ = _root(m, target)
        limits = column_generation.class_limits(master, cost_usd(m, sol) + 1e-6)
        assert limits  # some classes are priced out of any plan this cheap
        by_key = {ty.key: ty for ty in types}
        used: dict[tuple, int] = {}
        for mach in sol.machines:
            ty = by_key[("t", mach.offer)]
            longest = max(m.groups[g].duration_secs for g, k in mach.counts.items() if k)
            k = next(k for k, d in enumerate(ty.deltas) if d >= longest)
            used[ty.key, k] = used.get((ty.key, k), 0) + 1
        for key, count in used.items():
            assert count <= limits.get(key, math.inf), (key, count, limits.get(key))
