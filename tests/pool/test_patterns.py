"""The whole-machine pattern model on its own: its plans are feasible, its bound is
below every plan, and what it calls proven matches brute force."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from pool_builders import brute_force, offer, small_models

from fuse.controller.pool import formulation as F
from fuse.controller.pool import search
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.model import Constraints, DemandGroup, PlanModel, PoolHost
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
