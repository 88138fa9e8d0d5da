"""Review 32: a plan's unplaced reason (and a create's ``fleet_full``, which quotes it) named
the budget's ``max_usd_per_hour`` as the cap less the $/h already running, a figure the
operator never set, with "$0.0000/h used" hiding what fills it. They name the cap as set and
the $/h it counts: what runs and what the plan adds.

A real controller process, a linked ``local`` cloud of fake-backend agents, through the SDK."""

from __future__ import annotations

import pytest

import fuse
from support import wait_until

# (the running host is a small one; a VM of 2000 MiB needs a big one, which no cap below has room for)
TYPES = [{"name": "local.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.218},
         {"name": "local.big", "vcpus": 2, "mem_mib": 4096, "usd_per_hour": 0.5}]


@pytest.fixture
def pool(pool_client):
    pool_client.pool.link_cloud("dev", "local", {"backend": "fake", "types": TYPES})
    return pool_client


def test_a_cap_reached_is_said_as_set_with_the_dollars_per_hour_running_and_planned(pool):
    client = pool
    (h,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
    wait_until(lambda: any(x.name == h.name and x.state == "joined" for x in client.pool.cloud_hosts()),
               timeout=60, what="dev-1 joined")
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_usd_per_hour=0.223, autoscale=True))
    assert client.pool.cloud_budget().running_usd_per_hour == pytest.approx(0.218)

    # more than the running host holds: a new machine, which the cap has no room for
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, memory_mb=2000, kind="container", provider="dev"))
    (u,) = plan.unplaced
    said = "max_usd_per_hour=0.223 ($0.2180/h used: $0.2180/h running, $0.0000/h this plan)"
    assert said in u.reason, u.reason
    assert "max_usd_per_hour=0.005" not in u.reason

    # a create no host takes: its fleet_full quotes the same words
    with pytest.raises(fuse.ApiError) as e:
        client.vms.create({"shape": {"vcpus": 1, "mem_mib": 2000}, "entry": "sleep 600", "on": "dev"})
    assert e.value.code == "fleet_full", e.value
    assert said in e.value.message, e.value.message
    assert said in e.value.details["hosts"]["elastic pool"], e.value.details


def test_a_cap_the_running_hosts_fill_says_what_runs(pool):
    client = pool
    (h,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
    wait_until(lambda: any(x.name == h.name and x.state == "joined" for x in client.pool.cloud_hosts()),
               timeout=60, what="dev-1 joined")
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_usd_per_hour=0.2))
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, memory_mb=2000, kind="container", provider="dev"))
    (u,) = plan.unplaced
    assert "max_usd_per_hour reached: the $0.2180/h running leaves no $/h for new machines" in u.reason, u.reason


def test_a_request_cap_below_the_budget_is_said_as_the_request_gave_it(pool):
    client = pool
    (h,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
    wait_until(lambda: any(x.name == h.name and x.state == "joined" for x in client.pool.cloud_hosts()),
               timeout=60, what="dev-1 joined")
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_usd_per_hour=5.0))
    # (the request's cap is on what the plan adds: nothing running counts against it)
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, memory_mb=2000, kind="container", provider="dev",
                                                          max_usd_per_hour=0.1))
    (u,) = plan.unplaced
    assert "max_usd_per_hour=0.1 ($0.0000/h used)" in u.reason and "running" not in u.reason, u.reason
