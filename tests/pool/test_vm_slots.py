"""A host's VM-count limit (``PoolHost.max_vms``: its vm_count policy less the VMs
on it) holds on every path of the planner, not only its room."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fuse.controller.pool import formulation as F
from fuse.controller.pool import search
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.model import DemandGroup, PlanModel, PoolHost, host_reject
from fuse.controller.pool.pack import pack, pack_partial
from fuse.controller.pool.pattern_pricing import _price
from fuse.controller.pool.patterns import machine_types, prefer_existing
from fuse.controller.pool.planner import plan, realise
from fuse.controller.pool.request import model_from_request
from fuse.controller.pool.solution import Machine, Solution, cost_usd, violations
from fuse.models.pool import ElasticPlanRequest

from pool_builders import offer

NEW = offer("new", 8, 16384, 0.40)


def small(count: int = 8, **kw) -> DemandGroup:
    return DemandGroup(name=kw.pop("name", "g"), count=count, cpus=1, mem_mib=1024, kind="container", **kw)


def model(slots: int | None, *groups: DemandGroup) -> PlanModel:
    # room for 16 small VMs, but only ``slots`` by count
    host = PoolHost(name="dev", vcpus=16, mem_mib=16384, own=True, max_vms=slots)
    return PlanModel(groups=list(groups) or [small()], hosts=[host], offers=[NEW]).sorted()


def on_host(sol: Solution) -> int:
    return sum(sol.on_hosts.values())


def test_the_snapshot_slots_become_max_vms():
    snap = [{"name": "dev", "free_vcpus": 8, "free_mem_mib": 8192, "free_vm_slots": 3},
            {"name": "free", "free_vcpus": 8, "free_mem_mib": 8192}]
    hosts = {h.name: h for h in model_from_request(ElasticPlanRequest(), snap).hosts}
    assert hosts["dev"].max_vms == 3 and hosts["free"].max_vms is None


@pytest.mark.parametrize("slots, together, why", [
    (0, False, "vm_count limit reached"), (3, True, "vm_count limit: 3 more VMs"), (8, True, None)],
    ids=["no slots left: refused", "a together group larger than the slots: refused",
         "a together group within the slots: allowed"])
def test_host_reject_says_when_the_count_limit_refuses(slots, together, why):
    m = model(slots, small(4, together=together))
    assert host_reject(m.groups[0], m.hosts[0], m.constraints) == why


def test_first_fit_decreasing_stops_at_the_slots():
    sol = greedy(model(3))
    assert violations(model(3), sol) == [] and on_host(sol) == 3
    assert sum(sum(m.counts.values()) for m in sol.machines) == 5


@pytest.mark.parametrize("want_on_host, status", [(3, "optimal"), (4, "infeasible")],
                         ids=["up to the slots: feasible", "one more than the slots: infeasible"])
def test_the_aggregate_cp_sat_model_stops_at_the_slots(want_on_host, status):
    m = model(3, small(4, name="a"), small(4, name="b"))  # two groups: each alone fits the slots
    f = F.build(m, F.undominated_offers(m))
    f.m.add(sum(f.placed) >= 8)
    f.m.add(sum(f.x.values()) >= want_on_host)
    f.m.minimize(f.cost)
    st, solver = F.run(f, m, 5.0)
    assert st == status
    if st == "optimal":
        sol, _ = realise(m, f, solver, time.monotonic() + 5)
        assert violations(m, sol) == [] and on_host(sol) == 3


def test_pricing_a_host_type_counts_vms_when_the_limit_binds():
    m = model(3, small(4, name="a"), small(2, name="b", together=True, duration_secs=60))
    ty = next(t for t in machine_types(m, F.undominated_offers(m)) if t.host)
    assert ty.slots == 3  # room for 16: the count binds, so the DP gets its VM dimension
    pi = np.array([1.0, 1.0])  # every VM is worth the same: the best pattern holds as many as allowed
    (rc, k, counts), = [p for p in _price(m, ty, pi, [0.0] * len(ty.deltas)) if p[1] == len(ty.deltas) - 1]
    assert sum(counts.values()) == 3 and rc == pytest.approx(-3.0)
    unbound = next(t for t in machine_types(model(40), [0]) if t.host)
    assert unbound.slots is None  # a limit above what the room holds adds no dimension


def test_the_pattern_model_stops_at_the_slots():
    m = model(3)
    now = time.monotonic()
    sol, lb, proven, _ = search.solve(m, F.undominated_offers(m), 8, greedy(m), now + 2, now + 4)
    assert violations(m, sol) == [] and on_host(sol) == 3 and proven
    assert lb == pytest.approx(cost_usd(m, sol))


def test_prefer_existing_moves_only_as_many_vms_as_the_slots_admit():
    m = model(3)
    sol = prefer_existing(m, Solution(machines=[Machine(offer=0, counts={0: 8})]))
    assert violations(m, sol) == [] and on_host(sol) == 3


@pytest.mark.parametrize("max_vms, bins_used", [(None, 1), (2, 3), (1, 5)],
                         ids=["no limit: one machine", "two a machine: three", "one a machine: five"])
def test_pack_honours_a_per_machine_vm_limit(max_vms, bins_used):
    items = [(0, 5, 1, 1024)]
    bins = pack(items, 5, 8, 16384, max_vms=max_vms)
    assert bins is not None and sum(1 for b in bins if b) == bins_used
    assert all(sum(b.values()) <= (max_vms or 99) for b in bins)
    assert pack(items, 2, 8, 16384, max_vms=2) is None  # 5 VMs cannot go on 2 machines of 2
    assert sum(sum(b.values()) for b in pack_partial(items, 2, 8, 16384, max_vms=2)) == 4


def test_violations_report_a_host_over_its_slots():
    m = model(3)
    assert violations(m, Solution(on_hosts={(0, 0): 4})) == ["dev: 4 VMs > vm_count limit 3"]


@pytest.mark.parametrize("slots", [0, 1, 3, 8, None], ids=lambda s: f"slots {s}")
def test_the_plan_uses_the_host_up_to_its_slots_and_buys_the_rest(slots):
    m = model(slots)
    p = plan(m)
    free = min(8, 16 if slots is None else slots)
    assert sum(a.count for a in p.assignments if a.host == "dev") == free
    assert sum(a.count for a in p.assignments) == 8
    assert p.solver == "exact" and (len(p.new_hosts) == 1) == (free < 8)
