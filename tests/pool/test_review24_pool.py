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
