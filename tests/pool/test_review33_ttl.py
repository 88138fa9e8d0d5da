"""Review 33: a machine added by hand with a TTL the API takes (``ttl_hours`` is u32: up to
~490,000 years) but paid past u32 seconds (~1,193,047 hours and more) made the pool's snapshot
"malformed" (500 internal, pydantic's text) for every plan and prewarm, ``devices_only`` and
``on=local`` included, until that machine was removed. Such a machine is paid past any work's
duration (u32 bounds those): it plans as paid for good."""

from __future__ import annotations

import fuse


def test_a_machine_added_with_a_ttl_of_centuries_leaves_every_plan_working(client, link_aws):
    link_aws(client)
    [added] = client.pool.cloud_add_host("aws1", "t3.medium", region="us-west-2", count=1, ttl_hours=2**32 - 1)
    try:
        plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, cpus=1, memory_mb=512, kind="container",
                                                              duration_secs=3600))
        assert plan.solver in ("exact", "exact-incumbent", "greedy"), plan  # (was: 500 pool snapshot is malformed)
        plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=512, devices_only=True))
        assert plan.unplaced and plan.new_hosts == [], plan
    finally:
        client.pool.cloud_remove_host([added.name])
