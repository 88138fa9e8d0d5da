"""Twenty-fourth session: creates on a cloud racing for the last machine the budget allows.
Real controller, a `local` cloud of fake-backend agents."""

from __future__ import annotations

import asyncio
import json

import pytest

import fuse
from support import start_controller


@pytest.mark.timeout(240)
async def test_a_create_that_lost_the_race_for_the_last_machine_names_its_real_reason(tmp_path, procs):
    """(was: the loser's fleet_full said the machine the winner had just bought in that very cloud
    was "not a host of cloud lr", beside "no room (lr-1)": the create read the cloud's hosts once,
    as it began)"""
    procs.append(ctl := start_controller(tmp_path))
    async with fuse.AsyncClient(ctl.url) as c:
        await c.pool.link_cloud("lr", "local", {"backend": "fake", "types": [
            {"name": "r1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 0.01, "boot_secs": 2}]})
        await c.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True, max_new_hosts=1))

        async def one(i):
            try:
                return await c.vms.create({"name": f"r2-{i}", "shape": {"vcpus": 1, "mem_mib": 900},
                                           "entry": "sleep 600", "on": "lr"})
            except fuse.ApiError as e:
                return e

        got = await asyncio.gather(one(0), one(1))
        won = [g for g in got if isinstance(g, dict)]
        lost = [g for g in got if isinstance(g, fuse.ApiError)]
        assert len(won) == 1 and len(lost) == 1, got
        machine = won[0]["host"]
        assert lost[0].code == "fleet_full", lost[0]
        hosts = lost[0].details["hosts"]
        assert "not a host of cloud" not in hosts.get(machine, ""), json.dumps(hosts)
        assert "MiB" in hosts[machine], json.dumps(hosts)  # (its memory: the real reason)
        await c.vms.delete(won[0]["name"])
        await c.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=0))
        await c.pool.cloud_remove_host([machine])


@pytest.mark.timeout(120)
def test_a_prewarm_pinned_to_a_cordoned_host_is_refused_for_the_cordon(tmp_path, procs):
    """(was: "host own2 has room for 0 of 1 VMs" for a host with GBs free: the cordon unsaid,
    where a create pinned there says "host is cordoned")"""
    from support import start_agent
    from test_review16_prewarm import register

    procs.append(agent := start_agent(tmp_path, backend="fake", name="a1"))
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        register(client, "own2", agent)
        client.hosts.cordon("own2")
        with pytest.raises(fuse.ApiError) as got:
            client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="host:own2"))
        assert got.value.code == "fleet_full"
        assert got.value.message == "host own2: host is cordoned; no VM of the prewarm can be placed there"
        client.hosts.uncordon("own2")
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="host:own2"))
        assert [(p.host, p.count) for p in pw.placements] == [("own2", 1)]
        assert client.pool.remove_prewarm(pw.id)
