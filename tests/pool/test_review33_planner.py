"""Review 33 of the elastic planner (seed 001 ``cloud_plan``).

1. A finite $ cap past int64 micro-dollars (a budget's ``monthly_usd`` or a request's
   ``max_usd_per_hour`` of 1e13) crashed the exact model: REST 500, CLI traceback. Such a cap
   binds nothing and is no row; figures the exact models cannot count (a $4e9/h type for u32
   seconds) are first fit's to answer; an edited model's $1e308/h is refused naming the field.
2. A machine still booting was paid 1 s short: work ending at its paid end cost a billing
   step more there, and the plan bought a machine beside it.
3. A cloud's quota and type limit were said as what the machines running leave ("quota
   dev:standard=0", "type limit 0"), not as set; a ``hosts`` pin a quota blocks said no cause.
4. A devices_only plan did not name the operator's own host that is away (disconnected).

Real controller processes with ``local`` clouds of fake-backend agents (through the SDK), the
controller app in-process where a machine must stay booting (it is not started: nothing
joins), the CLI, and ``plan()`` itself.
"""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

import fuse
from fuse.cli.pool import app as pool_cli
from fuse.controller.pool.model import U32, Constraints, DemandGroup, Offer, PlanModel, PoolHost
from fuse.controller.pool.planner import plan
from fuse.controller.pool.greedy import greedy
from fuse.controller.pool.solution import cost_usd
from support import reap, start_agent, wait_until

runner = CliRunner(env={"FUSE_URL": ""})


def offer(name: str, vcpus: int, mem: int, usd: float, **kw) -> Offer:
    return Offer(provider="aws", type_name=name, region="r", arch="amd64", vcpus=vcpus, mem_mib=mem,
                 usd_per_hour=usd, **kw)


@pytest.fixture
def ctl(pool_client):
    return pool_client


# ---- 1. caps past int64 micro-dollars --------------------------------------------------------

def test_a_budget_and_a_request_cap_past_int64_micro_dollars_plan_as_no_cap_through_the_controller(ctl):
    client = ctl
    client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [
        {"name": "l.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.25}]})
    # (was: ApiError 500 internal (TypeError) for each: 1e13 USD is 1e19 micro-USD, past int64)
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(monthly_usd=1e13))
    req = dict(count=6, cpus=1, memory_mb=1024, kind="container", duration_secs=600)
    capped = client.pool.cloud_plan(fuse.ElasticPlanRequest(max_usd_per_hour=0.5, **req))
    assert (len(capped.new_hosts), sum(u.count for u in capped.unplaced)) == (2, 4), capped.explain
    assert "max_usd_per_hour=0.5" in capped.unplaced[0].reason and "monthly" not in capped.unplaced[0].reason
    pinned = client.pool.cloud_plan(fuse.ElasticPlanRequest(provider="dev", hosts=1, **req))
    assert len(pinned.new_hosts) == 1 and sum(u.count for u in pinned.unplaced) == 5, pinned.explain
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(monthly_usd=0.0))
    for cap in (1e13, 1e300):
        p = client.pool.cloud_plan(fuse.ElasticPlanRequest(provider="dev", hosts=1, max_usd_per_hour=cap, **req))
        assert p.solver == "exact" and len(p.new_hosts) == 1 and p.unplaced[0].count == 5, p.explain


def test_a_cap_at_or_past_what_any_plan_costs_gives_the_plan_without_the_cap():
    base = PlanModel(groups=[DemandGroup(name="g", count=30, cpus=2, mem_mib=2048, kind="container",
                                         duration_secs=31_536_000)],
                     hosts=[PoolHost(name="run", vcpus=4, mem_mib=4096, own=False, usd_per_hour=1.0,
                                     billing_step_secs=3600)],
                     offers=[offer("s", 4, 8192, 1.0), offer("b", 16, 32768, 3.5)],
                     constraints=Constraints(exact_new_hosts=2), time_limit_secs=2.0)
    want = plan(base)
    assert want.solver == "exact" and want.unplaced  # (the pin leaves work unplaced: the exact model runs)
    for caps in ({"monthly_usd_left": 1e13}, {"max_usd_per_hour": 1e13}, {"monthly_usd_left": 1e308},
                 {"max_usd_per_hour": 1e308, "monthly_usd_left": 9.3e12}):
        got = plan(base.model_copy(update={"constraints": base.constraints.model_copy(update=caps)}))
        assert (got.solver, got.projected_usd, got.lower_bound_usd) == (want.solver, want.projected_usd,
                                                                        want.lower_bound_usd), caps
        assert [u.count for u in got.unplaced] == [u.count for u in want.unplaced]


def test_costs_past_what_the_exact_models_count_are_first_fits_to_answer_never_a_crash():
    # a linked local type may cost up to u32 $/h: a year of it is past int64 micro-USD
    m = PlanModel(groups=[DemandGroup(name="g", count=5, cpus=1, mem_mib=1024, kind="container",
                                      duration_secs=U32)],
                  hosts=[PoolHost(name="run", vcpus=1, mem_mib=1024, own=False, usd_per_hour=4e9)],
                  offers=[offer("t", 2, 2048, 4e9, limit=1), offer("u", 1, 1024, 3e9)],
                  constraints=Constraints(monthly_usd_left=1e13, max_usd_per_hour=9e9), time_limit_secs=1.0)
    p = plan(m)  # (was: TypeError, "Linear constraints only accept integer values")
    assert p.solver == "greedy" and p.lower_bound_usd == 0.0
    assert any("past what the exact models count in micro-dollars" in line for line in p.explain), p.explain
    first = greedy(m.sorted())
    assert sum(a.count for a in p.assignments) >= sum(first.placed(1))
    assert p.projected_usd <= cost_usd(m.sorted(), first) + 1e-6


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setattr("fuse.controller.service.default_controller_socket", lambda: tmp_path / "none.sock")


def test_the_cli_plans_a_cap_past_int64_micro_dollars_and_refuses_a_price_past_u32_naming_it(tmp_path, offline):
    # (was: a rich traceback and exit 1)
    r = runner.invoke(pool_cli, ["plan", "--count", "20", "--cpus", "4", "--memory-mb", "16384", "--kind",
                                 "container", "--hosts", "1", "--max-usd-per-hour", "1e13", "--time-limit", "1",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["solver"] in ("exact", "exact-incumbent")
    f = tmp_path / "monthly.json"
    f.write_text(json.dumps({"model": {
        "groups": [{"name": "g", "count": 3, "cpus": 1, "mem_mib": 1024, "kind": "container",
                    "duration_secs": 31536000}],
        "offers": [{"provider": "aws", "type_name": "t", "region": "r", "arch": "amd64", "vcpus": 4,
                    "mem_mib": 8192, "usd_per_hour": 1.0}],
        "constraints": {"monthly_usd_left": 1e13}, "time_limit_secs": 1.0}}))
    r = runner.invoke(pool_cli, ["plan", "--model", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["projected_usd"] == 8760.025  # (a year and its 90 s boot at $1/h)
    body = json.loads(f.read_text())
    body["model"]["offers"][0]["usd_per_hour"] = 1e308
    f.write_text(json.dumps(body))
    # (was: "cannot convert float NaN to integer", naming no field)
    r = runner.invoke(pool_cli, ["plan", "--model", str(f), "--json"])
    assert r.exit_code == 2, r.output
    assert "offers.0.usd_per_hour" in r.output and "invalid_argument" in r.output, r.output


# ---- 2. a booting machine's paid time, counted exactly ----------------------------------------

@pytest.fixture
def booting(tmp_path):
    """The controller app (not started: nothing joins, so a machine bought stays booting) with a
    local cloud whose machines boot in 600 s and are billed by the hour."""
    from fuse.controller.app import create_app
    from fuse.controller.service import Controller

    ctl = Controller(tmp_path / "ctl")
    client = TestClient(create_app(ctl))
    r = client.put("/v1/pool/clouds/dev", json={"kind": "local", "options": {"backend": "fake", "types": [
        {"name": "h.big", "vcpus": 4, "mem_mib": 8192, "usd_per_hour": 1.0, "billing_step_secs": 3600,
         "billing_min_secs": 3600, "boot_secs": 600},
        {"name": "h.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.4, "billing_step_secs": 3600,
         "billing_min_secs": 3600, "boot_secs": 600}]}})
    assert r.status_code == 200, r.text
    try:
        yield client
    finally:
        client.post("/v1/pool/hosts/remove", json={"names": [h["name"] for h in
                                                              client.get("/v1/pool/hosts").json()["hosts"]]})
        ctl.store.close()
        reap(tmp_path)


def test_work_that_ends_at_a_booting_machines_paid_end_goes_there_at_no_cost(booting):
    client = booting
    shape = dict(cpus=1, memory_mb=1024, kind="container", provider="dev", duration_secs=3000)
    r = client.post("/v1/pool/plan", json={"count": 4, "apply": True, **shape})
    assert r.status_code == 200, r.text
    (added,) = r.json()["added"]
    assert (added["type_name"], added["state"]) == ("h.big", "booting")
    # paid for 3600 s from its start, joins 600 s after it: 3000 s of work there adds nothing
    r = client.post("/v1/pool/plan", json={"count": 1, **shape})
    assert r.status_code == 200, r.text
    p = r.json()
    (host,) = [h for h in json.loads(p["json"])["model"]["hosts"] if h["name"] == added["name"]]
    assert host["paid_secs_left"] == 3000  # (was 2999)
    # (was: a new h.small at $0.40, the booting machine charged a step more)
    assert p["new_hosts"] == [] and p["projected_usd"] == 0, p["explain"]
    assert [(a["host"], a["count"]) for a in p["assignments"]] == [(added["name"], 1)]
    assert any("within paid time" in line for line in p["explain"]), p["explain"]


# ---- 3. quotas and type limits said as set ---------------------------------------------------

BIG = [{"name": "l2.big", "vcpus": 4, "mem_mib": 8192, "usd_per_hour": 1.0, "billing_step_secs": 3600,
        "billing_min_secs": 3600, "boot_secs": 5}]


def test_quotas_and_type_limits_the_machines_running_use_are_said_as_set_with_what_runs(ctl):
    client = ctl

    def link(**caps):
        client.pool.link_cloud("dev2", "local", {"backend": "fake", "types": BIG, **caps})

    def reason(**kw) -> str:
        p = client.pool.cloud_plan(fuse.ElasticPlanRequest(cpus=1, memory_mb=1024, kind="container",
                                                           provider="dev2", duration_secs=600, **kw))
        assert p.unplaced, p.explain
        return p.unplaced[0].reason

    link()
    client.pool.cloud_add_host("dev2", "l2.big", count=2, ttl_hours=1)
    # both joined and answering first: a machine still connecting is said in the reason too ("taking
    # no work now: dev2-2 (host is disconnected)", seen on a loaded machine)
    wait_until(lambda: sorted((h.id, h.connected) for h in client.hosts.list() if h.id.startswith("dev2-"))
               == [("dev2-1", True), ("dev2-2", True)], timeout=60, what="both dev2 machines answering")
    link(quotas={"standard": 8})
    # (was: "quota dev2:standard=0 (0 vCPUs used)")
    assert "quota dev2:standard=8 reached: the machines running leave none for new machines" in reason(count=40)
    link(limits={"l2.big": 2})
    # (was: "type limit 0", as if the operator had set 0)
    said = reason(count=40)
    assert "type limit 2 reached (the machines running count against it)" in said and "limit 0" not in said, said
    link(quotas={"standard": 12})
    # (was: "quota dev2:standard=4 (4 vCPUs used)")
    said = reason(count=40)
    assert "quota dev2:standard=12 (12 vCPUs used: 8 running, 4 this plan)" in said, said
    # one more machine fits the quota: a pin of 2 says so (was: "hosts=2: the request adds exactly 2 machines")
    said = reason(count=8, hosts=2)
    assert said.endswith("hosts=2: the request adds exactly 2 machines (the quotas let 1 of them in: "
                         "quota dev2:standard=12 (8 vCPUs running))"), said


def test_a_type_limit_or_quota_no_machine_runs_under_is_worded_as_before():
    m = PlanModel(groups=[DemandGroup(name="g", count=20, cpus=1, mem_mib=1024, kind="container")],
                  offers=[offer("t", 4, 8192, 1.0, quota_family="f")],
                  constraints=Constraints(quotas={"f": 4}), time_limit_secs=1.0)
    (u,) = plan(m).unplaced
    assert u.reason == "no room within the caps: quota f=4 (4 vCPUs used)", u.reason
    m = m.model_copy(update={"constraints": Constraints(quotas={"f": 0}), "offers": [offer("t", 4, 8192, 1.0, limit=0)]})
    (u,) = plan(m).unplaced
    assert "type limit 0" in u.reason, u.reason


# ---- 4. an own host away, named in a devices_only plan's reason -------------------------------

def test_a_devices_only_plan_names_the_own_host_that_is_away_and_why(tmp_path, ctl):
    client = ctl
    agent = start_agent(tmp_path, backend="fake", name="own-agent")
    try:
        client.hosts.register(fuse.RegisterHostRequest(id="own", url=agent.url, token=agent.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=4)))
        ok = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, kind="container", devices_only=True))
        assert [a.host for a in ok.assignments] == ["own"] and not ok.unplaced, ok.explain
    finally:
        agent.stop()

    def away():
        p = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, kind="container", devices_only=True))
        return p.unplaced and "own (host is disconnected" in p.unplaced[0].reason and p

    # (was: "no machine can hold it: devices_only (...)", the operator's own device named nowhere)
    p = wait_until(away, timeout=60, what="the plan naming own away")
    assert p.unplaced[0].count == 2 and "; taking no work now: own (host is disconnected" in p.unplaced[0].reason


def test_a_dive_whose_duals_reach_a_knapsack_table_past_its_size_gives_up_the_dive_not_the_plan():
    # (found checking 1: a type of 4096 vCPUs and 65536 MiB for VMs of 1 MiB is a DP table past
    # MAX_CELLS; the root's pricing never built it, the dive's did: TooBig escaped plan(), a 500)
    def o(name, vcpus, mem, **kw):
        return Offer(provider="aws", type_name=name, region="r", arch="amd64", vcpus=vcpus, mem_mib=mem,
                     usd_per_hour=10000.0, **kw)
    m = PlanModel(groups=[DemandGroup(name="g", count=10, cpus=1, mem_mib=1, kind="container", together=True,
                                      duration_secs=86400)],
                  offers=[o("t0", 64, 1024, boot_secs=U32),
                          o("t1", 4096, 65536, billing_step_secs=3600, billing_min_secs=U32, limit=3, quota_family="f")],
                  constraints=Constraints(quotas={"f": 8}), time_limit_secs=1.0)
    p = plan(m)
    assert not p.unplaced and p.solver == "exact" and p.projected_usd == p.lower_bound_usd
