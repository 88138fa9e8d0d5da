"""cloud_plan through the SDK (sync and async) against a real controller
whose pool holds a real registered host."""

from __future__ import annotations

import asyncio

import fuse
from support import reap, start_agent, start_controller


def test_cloud_plan_uses_own_hosts_first_then_new_machines(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    ctl = start_controller(tmp_path)
    try:
        with fuse.Client(ctl.url) as c:
            c.hosts.register(fuse.RegisterHostRequest(id="own", url=agent.url, token=agent.token, backend="qemu",
                                                      capacity=fuse.HostCapacity(vm_count=4, ram_mb=8192, cpus=8)))
            small = c.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, cpus=1, memory_mb=1024, kind="container"))
            assert isinstance(small, fuse.ElasticPlan)
            assert small.new_hosts == [] and small.projected_usd == 0
            assert [(a.host, a.count) for a in small.assignments] == [("own", 2)]
            big = c.pool.cloud_plan(fuse.ElasticPlanRequest(count=12, cpus=2, memory_mb=2048, kind="container"))
            assert sum(a.count for a in big.assignments) + sum(u.count for u in big.unplaced) == 12
            assert big.new_hosts and big.projected_usd > 0 and big.lower_bound_usd <= big.projected_usd + 1e-9
            assert big.solver in ("exact", "exact-incumbent", "greedy")

        async def run():
            async with fuse.AsyncClient(ctl.url) as ac:
                return await ac.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=512))
        assert isinstance(asyncio.run(run()), fuse.ElasticPlan)
    finally:
        ctl.stop()
        agent.stop()
        reap(tmp_path)
