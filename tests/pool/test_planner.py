"""The planner on hand-written models: preference order, caps, pins, KVM, together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuse.controller.pool.catalogue import catalogue_source, default_catalogue
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.model import Constraints, DemandGroup, Offer, PlanModel, PoolHost, billed_secs
from fuse.controller.pool.planner import plan
from fuse.controller.pool.solution import cost_usd

from pool_builders import offer, plan_given_a_core

SMALL, BIG = offer("small", 2, 4096, 0.10), offer("big", 8, 16384, 0.36)


def group(count=4, cpus=2, mem=2048, **kw) -> DemandGroup:
    return DemandGroup(name=kw.pop("name", "request-0"), count=count, cpus=cpus, mem_mib=mem,
                       kind=kw.pop("kind", "container"), **kw)


def test_own_devices_first_then_running_hosts_then_new_machines():
    hosts = [PoolHost(name="dev", vcpus=2, mem_mib=2048, own=True),
             PoolHost(name="cloud", vcpus=2, mem_mib=2048, own=False, usd_per_hour=0.5, paid_secs_left=7200)]
    p = plan(PlanModel(groups=[group(3)], hosts=hosts, offers=[SMALL]))
    where = {a.host or f"new{a.new_index}": a.count for a in p.assignments}
    assert where == {"dev": 1, "cloud": 1, "new0": 1}
    assert p.solver == "exact" and p.projected_usd == p.lower_bound_usd
    assert p.ready_in_secs == SMALL.boot_secs


def test_running_host_charges_only_the_time_beyond_what_is_paid():
    host = PoolHost(name="cloud", vcpus=8, mem_mib=16384, own=False, usd_per_hour=3.6, paid_secs_left=600)
    p = plan(PlanModel(groups=[group(2, duration_secs=1200)], hosts=[host], offers=[SMALL]))
    # staying on costs 600 extra seconds at $3.6/h = $0.60; two small machines cost less
    assert len(p.new_hosts) == 2
    assert p.projected_usd == pytest.approx(2 * 0.10 * billed_secs(SMALL, 1200) / 3600, abs=1e-6)


def test_new_machine_cost_is_billed_duration_plus_boot_rounded_up():
    o = offer("stepped", 2, 4096, 0.36, billing_step_secs=3600, billing_min_secs=3600, boot_secs=90)
    assert billed_secs(o, 3600) == 7200 and billed_secs(o, 10) == 3600
    p = plan(PlanModel(groups=[group(1, duration_secs=3600)], offers=[o]))
    assert p.new_hosts[0].billed_secs == 7200 and p.projected_usd == pytest.approx(0.72)


def test_exact_beats_first_fit_decreasing_on_a_mix():
    m = PlanModel(groups=[group(5, 2, 3000, name="a"), group(3, 1, 6000, name="b")], offers=[SMALL, BIG]).sorted()
    p = plan(m)
    assert p.solver == "exact"
    assert p.projected_usd <= cost_usd(m, greedy(m)) + 1e-9


@pytest.mark.parametrize("kind, placed", [("microvm", 0), ("container", 2)], ids=[
    "a microvm needs KVM so it cannot go on a non-metal machine",
    "a container goes anywhere"])
def test_kvm_kinds_only_on_kvm_machines(kind, placed):
    p = plan(PlanModel(groups=[group(2, kind=kind)], offers=[SMALL]))
    assert sum(a.count for a in p.assignments) == placed
    if not placed:
        assert "needs KVM" in p.unplaced[0].reason


def test_allow_metal_off_leaves_microvms_unplaced_on_the_default_catalogue():
    m = PlanModel(groups=[group(2, kind="microvm")], offers=list(default_catalogue()),
                  constraints=Constraints(allow_metal=False))
    p = plan(m)
    assert p.unplaced and p.unplaced[0].count == 2 and not p.new_hosts


def test_together_group_lands_on_one_machine():
    p = plan(PlanModel(groups=[group(4, together=True)], offers=[SMALL, BIG]))
    assert len(p.new_hosts) == 1 and p.new_hosts[0].type_name == "big"


def test_caps_bound_the_plan_and_unplaced_says_why():
    p = plan(PlanModel(groups=[group(4)], offers=[SMALL], constraints=Constraints(max_new_hosts=2)))
    assert len(p.new_hosts) == 2 and p.unplaced[0].count == 2
    assert "max_new_hosts: at most 2 new hosts" in p.unplaced[0].reason
    p = plan(PlanModel(groups=[group(4)], offers=[SMALL], constraints=Constraints(max_usd_per_hour=0.25)))
    assert p.added_usd_per_hour <= 0.25 and len(p.new_hosts) == 2


def test_hosts_pin_spreads_over_exactly_that_many_machines():
    p = plan(PlanModel(groups=[group(4, 1, 1024)], offers=[BIG], constraints=Constraints(exact_new_hosts=3)))
    assert len(p.new_hosts) == 3 and sum(a.count for a in p.assignments) == 4


def test_a_hosts_pin_evens_the_vms_out_over_its_machines_at_the_same_cost():
    # first fit filled the first machine and gave the others one VM each: 10, 1 and 1
    m = PlanModel(groups=[group(12, 1, 1024)], offers=[BIG], constraints=Constraints(exact_new_hosts=3))
    p = plan(m)
    per_machine = sorted(a.count for a in p.assignments)
    assert per_machine == [4, 4, 4] and len(p.new_hosts) == 3
    assert p.solver == "exact" and p.projected_usd == pytest.approx(3 * billed_secs(BIG, 3600) * 0.36 / 3600)


def test_a_hosts_pin_evens_out_one_group_beside_another_billed_shorter():
    # (review 21: the emptiest machine held the short VM, so nothing moved: 3, 2 and 1)
    groups = [group(6, 2, 2048, name="long", duration_secs=3600), group(1, 1, 512, name="short", duration_secs=60)]
    m = PlanModel(groups=groups, offers=[BIG.model_copy(update={"billing_step_secs": 1, "billing_min_secs": 0})],
                  constraints=Constraints(exact_new_hosts=4))
    p = plan(m)
    per_machine = {}
    for a in p.assignments:
        per_machine.setdefault(a.new_index, {})[a.group] = a.count
    longs = sorted(c.get("long", 0) for c in per_machine.values() if "short" not in c)
    assert longs == [2, 2, 2] and len(p.new_hosts) == 4, per_machine
    assert p.solver == "exact"


@pytest.mark.parametrize("constraints, says", [
    (Constraints(exact_new_hosts=3, max_usd_per_hour=0.5), "(the cheapest 3 cost $1.0800/h, over max_usd_per_hour=0.5)"),
    (Constraints(exact_new_hosts=3, max_new_hosts=2), "(max_new_hosts=2 allows fewer)"),
], ids=["the $/h cap", "the new-host cap"])
def test_a_hosts_pin_no_plan_can_meet_says_what_stops_it(constraints, says):
    # (review 21: the reason named the pin alone, never the cap that made it impossible)
    p = plan(PlanModel(groups=[group(3, 1, 1024)], offers=[BIG], constraints=constraints))
    assert p.unplaced[0].count == 3 and says in p.unplaced[0].reason, p.unplaced[0].reason


def test_a_hosts_pin_where_no_machine_may_go_says_so_though_the_hosts_have_room():
    own = PoolHost(name="own1", vcpus=8, mem_mib=8192, own=True, region="home")
    p = plan(PlanModel(groups=[group(2, 1, 1024, region="home")], hosts=[own], offers=[BIG],
                       constraints=Constraints(exact_new_hosts=1)))
    assert p.unplaced[0].reason == ("hosts=1: the request adds exactly 1 machine, and no new machine may take it: "
                                    "region is not home")


def test_a_together_group_the_hosts_pin_would_split_is_proven_to_have_no_plan():
    # (review 21: first fit answered, "the exact plan was not better", for a plan no model has)
    p = plan(PlanModel(groups=[group(7, 1, 512, together=True)], offers=[BIG],
                       constraints=Constraints(exact_new_hosts=2)))
    assert p.solver == "exact" and p.new_hosts == [] and p.unplaced[0].count == 7
    assert any("no plan meets the pins" in line for line in p.explain)


@pytest.mark.parametrize("step", [2**31, 2**32 - 1, 2**52], ids=["2^31 s", "the u32 most", "2^52 s (review 21: billed 0 s)"])
def test_a_billing_step_far_longer_than_the_work_bills_one_whole_step(step):
    # (model_copy checks nothing: the arithmetic itself is what is tested, past the u32 bound too)
    o = BIG.model_copy(update={"billing_step_secs": step, "billing_min_secs": 0})
    assert billed_secs(o, 60) == step


def test_an_offer_or_host_figure_beyond_what_first_fit_can_hold_is_refused():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="mem_mib"):
        Offer.model_validate(BIG.model_dump() | {"mem_mib": 2**63})
    with pytest.raises(ValidationError, match="max_vms"):
        PoolHost(name="h", vcpus=1, mem_mib=1024, max_vms=2**70)


def test_a_hosts_pin_no_plan_can_meet_is_proven_and_nothing_bought():
    # three machines, each holding at least one VM, for two VMs: no plan at all
    p = plan(PlanModel(groups=[group(2, 1, 1024)], offers=[BIG], constraints=Constraints(exact_new_hosts=3)))
    assert p.solver == "exact" and p.new_hosts == [] and p.assignments == []
    assert p.unplaced[0].count == 2 and "hosts=3" in p.unplaced[0].reason
    assert any("no plan meets the pins" in line for line in p.explain)


def test_a_hosts_pin_whose_counts_do_not_split_onto_machines_is_solved_machine_by_machine():
    # two machines for two 3-vCPU VMs and a 2-vCPU one: two 4-vCPU machines hold the 8 vCPUs
    # as a sum but not as machines (first fit placed two VMs and stopped, the time unused);
    # one 6-vCPU and one 4-vCPU machine hold all three
    groups = [group(2, 3, 1024, name="a", duration_secs=3600), group(1, 2, 1024, name="b", duration_secs=3600)]
    m = PlanModel(groups=groups, offers=[offer("four", 4, 8192, 0.10), offer("six", 6, 8192, 0.22)],
                  constraints=Constraints(exact_new_hosts=2), time_limit_secs=1.0)
    p = plan(m)
    assert p.unplaced == [] and len(p.new_hosts) == 2
    assert sorted(h.type_name for h in p.new_hosts) == ["four", "six"]
    assert p.solver == "exact" and p.lower_bound_usd == p.projected_usd
    assert sum(greedy(m.sorted()).placed(2)) == 2  # (first fit's plan: one VM fewer)


def test_quota_family_caps_vcpus():
    o = SMALL.model_copy(update={"quota_family": "std"})
    p = plan(PlanModel(groups=[group(4)], offers=[o], constraints=Constraints(quotas={"std": 4})))
    assert len(p.new_hosts) == 2


def test_default_catalogue_names_its_source_and_date():
    src = catalogue_source()
    assert "on-demand Linux prices in us-west-2" in src["source"] and "CLOUD-CATALOGUE.md" in src["source"]
    assert src["original source"].startswith("the AWS price list")
    assert src["date copied"].startswith("2026-12-02 (when these rows were copied")
    offers = default_catalogue()
    assert {o.type_name for o in offers if o.kvm} == {"c6g.metal"}
    assert all(o.one_space and not o.kvm for o in offers if o.provider == "modal")


def test_one_thousand_vms_plan_is_feasible_and_bounded():
    import random

    rng = random.Random(7)
    groups = [group(50, rng.choice([1, 2, 4]), rng.choice([1024, 2048, 4096]), name=f"g{i:02d}") for i in range(20)]
    m = PlanModel(groups=groups, offers=list(default_catalogue()), time_limit_secs=3.0)
    p = plan(m)
    assert sum(a.count for a in p.assignments) == 1000
    assert p.lower_bound_usd <= p.projected_usd
    assert p.projected_usd <= cost_usd(m.sorted(), greedy(m.sorted())) + 1e-6


def _big(time_limit: float) -> PlanModel:
    """A 1,000-VM model; seed 2 is the hardest of the benchmark's (not proven in 60 s here)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from plan import random_model

    return random_model(2, 1000, 20, 40, 10).model_copy(update={"time_limit_secs": time_limit})


def _never_worse_than_first_fit(m: PlanModel, p) -> None:
    base = greedy(m.sorted())
    assert sum(a.count for a in p.assignments) >= sum(base.placed(len(m.groups)))
    assert p.lower_bound_usd <= p.projected_usd <= cost_usd(m.sorted(), base) + 1e-6


def test_a_short_time_limit_on_a_big_model_is_never_worse_than_first_fit():
    # which label 50 ms earns depends on the machine's speed; the guarantees do not
    m = _big(0.05)
    p = plan(m)
    assert p.solver in ("greedy", "exact-incumbent")
    _never_worse_than_first_fit(m, p)


def test_first_fit_answers_when_no_exact_model_finds_a_plan_in_time(monkeypatch):
    from fuse.controller.pool import formulation as F
    from fuse.controller.pool import search

    # neither the pattern search nor CP-SAT finds a plan within the limit
    monkeypatch.setattr(search, "solve", lambda *a, **k: None)
    monkeypatch.setattr(F, "run", lambda f, model, time_limit: ("unknown", None))
    m = _big(0.5)
    p = plan(m)
    assert p.solver == "greedy"
    assert any("no plan in time" in line for line in p.explain)
    _never_worse_than_first_fit(m, p)


def test_the_time_limit_ends_the_search_with_the_best_plan_found_unproven():
    m = _big(2.0)
    p = plan(m)
    assert p.solver == "exact-incumbent"
    _never_worse_than_first_fit(m, p)
    assert p.lower_bound_usd > 0 and p.projected_usd < cost_usd(m.sorted(), greedy(m.sorted()))
    assert any("time limit" in line for line in p.explain)


def test_a_plan_is_not_exact_while_the_most_placeable_count_is_unproven(monkeypatch):
    """Stage 1 (how many VMs can be placed at all) stopped by the time limit: even a
    cost proven least for that count is labelled exact-incumbent, with a note."""
    from fuse.controller.pool import formulation as F

    real_run, calls = F.run, []

    def stage1_times_out(f, model, time_limit):
        st, solver = real_run(f, model, time_limit)
        calls.append(st)
        return ("feasible" if len(calls) == 1 else st), solver

    # b fits on no machine, so first fit leaves it out and stage 1 runs
    m = PlanModel(groups=[group(2, name="a"), group(1, 64, 2048, name="b")], offers=[SMALL])
    assert plan(m).solver == "exact"
    monkeypatch.setattr(F, "run", stage1_times_out)
    # a small model: the per-machine model proves the count itself (review 25: it was not asked)
    assert plan(m).solver == "exact" and calls[0] == "optimal"
    from fuse.controller.pool import slots
    monkeypatch.setattr(slots, "solve", lambda *a, **kw: None)  # as for a model too big for it
    calls.clear()
    p = plan(m)
    assert calls[0] == "optimal"  # the stage-1 answer was in fact optimal, but reported unproven
    assert p.solver == "exact-incumbent" and sum(a.count for a in p.assignments) == 2
    assert any("most VMs that can be placed" in line for line in p.explain)


def test_a_stage_one_that_finds_no_count_in_its_time_still_plans_the_most_whole_machines_hold(monkeypatch):
    """Review 28: under a short limit (or a loaded machine) stage 1 found no count in its
    share; the target fell to first fit's (26 of 808 VMs under a $20/h cap and quotas) and
    the answer, first fit's 26, came back in a third of the limit, where 124 are placeable.
    The pattern model now aims at all of the work and plans for what its LP holds: 124, the
    most (the LP is a relaxation), at a cost proven least."""
    from fuse.controller.pool import formulation as F

    real_run, calls = F.run, []

    def stage1_finds_nothing(f, model, time_limit):
        calls.append(time_limit)
        return ("unknown", None) if len(calls) == 1 else real_run(f, model, time_limit)

    data = json.loads((Path(__file__).parent / "data" / "review28_capped_model.json").read_text())
    m = PlanModel.model_validate(data["model"]).model_copy(update={"time_limit_secs": 10.0})
    first_fit = sum(greedy(m.sorted()).placed(len(m.groups)))
    monkeypatch.setattr(F, "run", stage1_finds_nothing)
    p = plan(m)
    assert calls, "stage 1 ran"
    assert first_fit == 26 and sum(a.count for a in p.assignments) == 124, p.explain
    assert p.solver == "exact" and p.projected_usd == p.lower_bound_usd, p.explain


def test_a_small_model_whole_machines_cannot_fill_to_the_relaxations_count_is_proven_exact():
    """Review 25: capacity summed over machines allows 3 VMs (3+3+2 vCPUs on two 4-vCPU
    machines, the quota's most), whole machines hold 2: the plan placing 2 at the least cost
    was answered exact-incumbent, "time limit reached", in a fraction of its 30 s. The
    per-machine model proves the count: exact."""
    x4 = Offer(provider="aws", type_name="x4", region="r", arch="amd64", vcpus=4, mem_mib=8192,
               usd_per_hour=0.1, quota_family="aws:standard")
    m = PlanModel(groups=[group(2, 3, 1024, name="g0", kind="container"),
                          group(1, 2, 1024, name="g1", kind="container")],
                  offers=[x4], constraints=Constraints(quotas={"aws:standard": 8}), time_limit_secs=30)
    p = plan(m)
    assert p.solver == "exact" and sum(a.count for a in p.assignments) == 2, p.explain
    assert p.projected_usd == p.lower_bound_usd == pytest.approx(0.205)
    assert not any("time limit" in line for line in p.explain), p.explain


def test_a_host_placement_undone_by_the_monthly_budget_leaves_nothing_behind():
    # first fit puts the VM on the running host, then takes it back (an hour there costs
    # $0.50, the month has $0.20 left): no empty entry may remain for the exact models
    m = PlanModel(groups=[DemandGroup(name="g", count=1, cpus=1, mem_mib=512, kind="container", duration_secs=3600)],
                  hosts=[PoolHost(name="h", vcpus=1, mem_mib=2048, kvm=False, own=False, usd_per_hour=0.5)],
                  constraints=Constraints(monthly_usd_left=0.2), time_limit_secs=2.0).sorted()
    assert greedy(m).on_hosts == {}
    p = plan(m)
    assert p.assignments == [] and [u.count for u in p.unplaced] == [1]


def test_an_unplaced_reason_says_the_caps_as_an_operator_set_them():
    # a cap left after what runs is subtracted (0.03 − 0.01) read 0.019999999999999997
    m = PlanModel(groups=[DemandGroup(name="g", count=1, cpus=1, mem_mib=1024, kind="container")],
                  offers=[offer("t.small", 2, 4096, 0.05)],
                  constraints=Constraints(max_usd_per_hour=0.03 - 0.010000000000000002))
    (u,) = plan(m).unplaced
    assert u.reason == "no room within the caps: max_usd_per_hour=0.02 ($0.0000/h used)"


def test_an_unplaced_reason_names_the_cap_that_stopped_it_not_every_cap_set():
    # (review 17) it listed max_new_hosts 5, max_usd_per_hour 50 and quota f=100 beside the
    # monthly budget, the one cap a second machine would break: an operator could not tell
    m = PlanModel(groups=[DemandGroup(name="g", count=10, cpus=1, mem_mib=1024, kind="container", duration_secs=1000)],
                  offers=[offer("A", 2, 4096, 1.0, quota_family="f", billing_min_secs=0)],
                  constraints=Constraints(max_new_hosts=5, max_usd_per_hour=50, quotas={"f": 100},
                                          monthly_usd_left=0.35), time_limit_secs=2.0)
    p = plan(m)
    (u,) = p.unplaced
    assert (len(p.new_hosts), u.count) == (1, 8)
    assert u.reason == "no room within the caps: monthly_usd_left=0.35 ($0.3028 planned)", u.reason


def test_an_unplaced_reason_names_a_used_up_type_limit_beside_the_cap_the_other_type_breaks():
    # (found by a black-box review of seed 001) the small type's limit is used up, the big
    # one costs more than the $/h left: it named only the $/h cap, which a small machine fits
    m = PlanModel(groups=[DemandGroup(name="g", count=2, cpus=1, mem_mib=1000, kind="container")],
                  hosts=[PoolHost(name="h", vcpus=1, mem_mib=1024, own=False, usd_per_hour=0.36)],
                  offers=[offer("local.small", 1, 1024, 0.36, limit=0), offer("local.big", 4, 8192, 1.44)],
                  constraints=Constraints(max_usd_per_hour=0.37), time_limit_secs=2.0)
    (u,) = plan(m).unplaced
    assert u.count == 1
    assert u.reason == ("no room within the caps: max_usd_per_hour=0.37 ($0.0000/h used), "
                        "limit local.small=0 (all used)"), u.reason


@pytest.mark.parametrize("group, constraints, says, not_says", [
    (dict(no_scale=True), {}, "no new machine may: no_scale (2 machine types)", "max_new_hosts"),
    (dict(devices_only=True), {}, "no new machine may: devices_only (2 machine types)", "max_new_hosts"),
    (dict(kind="microvm"), dict(allow_metal=False), "allow_metal is off", "caps"),
], ids=["no_scale", "devices_only", "allow_metal off"])
def test_an_unplaced_reason_names_what_ruled_the_machines_out(group, constraints, says, not_says):
    # the host is full; no new machine may be added, and the reason says why, not a cap the
    # request's no_scale set on its way (it read "no room within the caps: max_new_hosts=0")
    m = PlanModel(groups=[DemandGroup(name="g", count=3, cpus=1, mem_mib=1024, **({"kind": "container"} | group))],
                  hosts=[PoolHost(name="own", vcpus=1, mem_mib=1024)],
                  offers=[offer("t.small", 2, 4096, 0.05), offer("m.metal", 8, 16384, 1.0, kvm=True, metal=True)],
                  constraints=Constraints(**constraints) if not group.get("no_scale") and not group.get("devices_only")
                  else Constraints(max_new_hosts=0, **constraints), time_limit_secs=2.0)
    (u,) = plan(m).unplaced
    assert u.count == 2 and says in u.reason and not_says not in u.reason, u.reason


@pytest.mark.parametrize("hosts, constraints, says, not_says", [
    ([], Constraints(max_new_hosts=0), "max_new_hosts reached", "max_new_hosts=0"),
    ([], Constraints(max_new_hosts=1), "max_new_hosts: at most 1 new host", "max_new_hosts=1"),
    ([], Constraints(max_usd_per_hour=0.0), "max_usd_per_hour reached", "max_usd_per_hour=0"),
    ([PoolHost(name="own1", vcpus=4, mem_mib=4096, max_vms=0)], Constraints(exact_new_hosts=0),
     "no host can take it: vm_count limit reached (own1); and no new machine within the caps: hosts=0: the request "
     "adds no machine", "no room within the caps"),
], ids=["the budget's max_new_hosts used up reads reached, not =0 (0 is no cap in the budget)",
        "what is left of it reads as what is left",
        "no dollars an hour left reads reached, not =0",
        "a hosts=0 pin on a full fleet names the full host too"])
def test_an_unplaced_reason_says_what_stops_it_as_an_operator_reads_it(hosts, constraints, says, not_says):
    m = PlanModel(groups=[DemandGroup(name="g", count=2, cpus=1, mem_mib=3072, kind="container")], hosts=hosts,
                  offers=[offer("t.small", 2, 4096, 0.05)], constraints=constraints, time_limit_secs=2.0)
    (u,) = plan(m).unplaced
    assert says in u.reason and not_says not in u.reason, u.reason


def test_an_unplaced_reason_with_nothing_to_place_on_does_not_say_the_pool_is_empty():
    # the hosts without the image were left out before the model (the caller says they lack it):
    # "no hosts in the pool" read beside "dev-1, own1 have no image"
    (u,) = plan(PlanModel(groups=[group(1)])).unplaced
    assert u.reason == "no host or cloud machine type can take it"


def test_an_assignment_syncs_on_a_new_machine_and_not_on_a_host_that_has_the_image():
    hosts = [PoolHost(name="dev", vcpus=2, mem_mib=2048)]
    p = plan(PlanModel(groups=[group(2)], hosts=hosts, offers=[SMALL]))
    assert sorted((a.host, a.new_index, a.sync) for a in p.assignments) == [("", 0, True), ("dev", None, False)]


def test_a_host_the_scaler_cordoned_is_a_running_host_and_the_explain_line_says_so():
    host = PoolHost(name="aws-1", vcpus=4, mem_mib=8192, own=False, usd_per_hour=0.5, paid_secs_left=7200,
                    scaler_cordoned=True)
    p = plan(PlanModel(groups=[group(2)], hosts=[host], offers=[SMALL]))
    assert [(a.host, a.count) for a in p.assignments] == [("aws-1", 2)] and p.new_hosts == []
    assert "the scaler had cordoned it" in p.explain[0], p.explain


def _capped(seed: int, usd_per_hour: float, time_limit: float) -> PlanModel:
    """A benchmark 1,000-VM model under a $/hour cap that leaves most of the work unplaced."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from plan import random_model

    m = random_model(seed, 1000, 20, 40, 10).model_copy(update={"time_limit_secs": time_limit})
    return m.model_copy(update={"constraints": m.constraints.model_copy(update={"max_usd_per_hour": usd_per_hour})})


def test_a_binding_hourly_cap_still_gets_the_exact_models_plan_not_first_fits():
    """Review 17: the pattern model's first columns (first fit's machines, one group per
    machine) reached no target above first fit's under a $20/h cap, so its LP was infeasible
    at once; the aggregate model found nothing either, and first fit's 105 of 1,000 VMs
    answered (629 and more fit). An artificial column lets pricing find the columns that do."""
    m = _capped(0, 20.0, 10.0)
    p, _ = plan_given_a_core(m, lambda p: sum(a.count for a in p.assignments) >= 640)
    placed = sum(a.count for a in p.assignments)
    assert p.lower_bound_usd <= p.projected_usd  # (more VMs than first fit: costlier, as it may be)
    assert sum(greedy(m.sorted()).placed(len(m.groups))) == 105
    assert placed >= 640 and p.solver in ("exact", "exact-incumbent"), (placed, p.solver, p.explain)
    assert sum(h.usd_per_hour for h in p.new_hosts) <= 20.0 + 1e-9


def test_a_target_whole_machines_do_not_reach_in_time_answers_the_pattern_models_best_short_of_it():
    """Stage 1's count (the aggregate model's, a relaxation) that no plan found in time
    reaches: the answer is the pattern model's best short of it (its integer master, or its
    LP's whole machines and first fit), labelled exact-incumbent, not first fit's 128."""
    m = _capped(2, 20.0, 5.0)
    p, _ = plan_given_a_core(m, lambda p: sum(a.count for a in p.assignments) > 256)
    assert p.lower_bound_usd <= p.projected_usd  # (more VMs than first fit: costlier, as it may be)
    assert sum(greedy(m.sorted()).placed(len(m.groups))) == 128
    assert sum(a.count for a in p.assignments) > 256 and p.solver == "exact-incumbent", p.explain


def test_a_what_if_on_a_hosts_shape_gets_the_room_its_memory_admits():
    """Review 17: the `json` model held an own host's vCPUs padded for the request's shape (3
    for 1-vCPU VMs), so a what-if with 2-vCPU VMs bought a c6g.metal for work the host, where
    CPU only ranks, takes: the controller itself put both VMs there for $0."""
    import json

    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    snap = [{"name": "own1", "cpus": 4, "mem_mib": 4096, "free_vcpus": 0, "free_mem_mib": 3072,
             "free_vm_slots": 10, "arch": "amd64", "own": True, "state": "active"}]
    first = plan(model_from_request(ElasticPlanRequest(count=2, memory_mb=1024), snap))
    assert [(a.host, a.count) for a in first.assignments] == [("own1", 2)]
    data = json.loads(first.json)["model"]
    data["groups"][0]["cpus"] = 2
    again = plan(PlanModel.model_validate(data))
    assert [(a.host, a.count) for a in again.assignments] == [("own1", 2)] and again.projected_usd == 0
    assert again.new_hosts == []
