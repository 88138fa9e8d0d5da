"""Twenty-sixth session: the elastic pool's budget and prewarms against a real controller
and a `local` cloud of fake-backend agents."""

from __future__ import annotations

import pytest

import fuse
from support import start_controller, wait_until

ONE_HOUR_MACHINE = {"backend": "fake", "types": [
    {"name": "big", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 36.0, "boot_secs": 2}]}


@pytest.mark.timeout(180)
def test_autoscale_commits_the_cost_its_solve_priced_against_the_monthly_cap(tmp_path, procs):
    """(was: the solve priced a create's machine at its hour, $36, but the purchase committed only
    its boot and join grace, ~$3, to the monthly cap: two such machines were bought under $40)"""
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lx", "local", ONE_HOUR_MACHINE)
        c.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True, monthly_usd=40))
        first = c.vms.create({"name": "m1", "shape": {"vcpus": 1, "mem_mib": 1024}, "entry": "sleep 3600"})
        assert first["host"].startswith("lx-"), first
        with pytest.raises(fuse.ApiError) as second:
            c.vms.create({"name": "m2", "shape": {"vcpus": 1, "mem_mib": 1024}, "entry": "sleep 3600"})
        assert second.value.code in ("fleet_full", "budget_exceeded"), second.value
        assert "monthly_usd" in second.value.message, second.value.message
        assert [h.name for h in c.pool.cloud_hosts() if h.state != "gone"] == [first["host"]]
        c.vms.delete("m1")
        c.pool.cloud_remove_host([first["host"]])


@pytest.mark.timeout(180)
def test_a_machine_bought_for_a_removed_prewarm_is_removed_once_idle_not_at_its_ttl(tmp_path, procs):
    """(was: a VM claimed from the prewarm kept the machine as the prewarm was removed, and once
    the VM was deleted too, scale-in kept the idle machine, billed, until the prewarm's TTL would
    have ended: "idle; bought for work planned until ...")"""
    from test_prewarm import ready

    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lc", "local", {"backend": "fake", "types": [
            {"name": "s1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2}]})
        c.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_usd_per_hour=1.5))
        pw = c.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, ttl_secs=3600))
        ready(c, pw.id, 1, timeout=60)
        job = c.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 512}, "entry": "sleep 600"})
        machine = job["host"]
        assert machine == pw.new_hosts[0], (job, pw)  # (claimed there: the only machine)
        assert c.pool.remove_prewarm(pw.id)
        assert [h.name for h in c.pool.cloud_hosts() if h.state != "gone"] == [machine]  # the job holds it
        c.vms.delete("job")
        decisions = {d.host: d for d in c.pool.cloud_reconcile()}
        assert decisions[machine].action == "remove", decisions[machine]
        assert [h.name for h in c.pool.cloud_hosts() if h.state != "gone"] == [], c.pool.cloud_hosts()


@pytest.mark.timeout(180)
def test_a_machine_the_pool_added_is_not_deregistered_from_under_it(tmp_path, procs):
    """(was: 204, and the machine ran on `joined`, paid for and counted against the budget until
    its TTL, with no host to use it)"""
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lc", "local", {"backend": "fake", "types": [
            {"name": "s1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2}]})
        (h,) = c.pool.cloud_add_host("lc", "s1", count=1)
        wait_until(lambda: [x.state for x in c.pool.cloud_hosts()] == ["joined"], timeout=60, what="joined")
        with pytest.raises(fuse.ApiError) as got:
            c.hosts.deregister(h.name)
        assert got.value.status == 409 and got.value.code == "conflict", got.value
        assert "fuse pool remove-host" in got.value.message, got.value.message
        assert [x.id for x in c.hosts.list()] == [h.name]  # still a host, still the pool's
        assert c.pool.cloud_remove_host([h.name]).removed == [h.name]
        assert c.hosts.list() == [] and [x.state for x in c.pool.cloud_hosts(include_gone=True)] == ["gone"]


@pytest.mark.timeout(240)
async def test_creates_of_a_prewarms_shape_arriving_together_all_land_where_there_is_room_for_them(tmp_path, procs):
    """(was: the refill of the first claims created standby VMs in the room the claims freed, and
    the creates behind them were `fleet_full` on a host with room for every one of them)"""
    import asyncio

    from test_prewarm import ready

    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lc", "local", {"backend": "fake", "types": [
            {"name": "s1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2}]})
        (h,) = c.pool.cloud_add_host("lc", "s1", count=1, ttl_hours=1)
        wait_until(lambda: [x.id for x in c.hosts.list() if x.connected] == [h.name], timeout=60, what="joined")
        pw = c.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on=f"host:{h.name}"))
        ready(c, pw.id, 2, timeout=60)
    async with fuse.AsyncClient(ctl.url) as ac:
        async def one(i):
            try:
                return await ac.vms.create({"name": f"pw-{i}", "shape": {"vcpus": 1, "mem_mib": 256},
                                            "entry": "sleep 600", "on": f"host:{h.name}"})
            except fuse.ApiError as e:
                return e

        got = await asyncio.gather(*(one(i) for i in range(4)))
    assert all(isinstance(g, dict) and g["host"] == h.name for g in got), got


def test_an_idle_plan_machine_whose_vms_came_and_went_goes_before_its_next_billing_step():
    """(was: kept to the very end of its planned work, the end of its paid step, so it went only
    once the next step had begun: 10 s of work on a type billed per 120 s cost two steps)"""
    from fuse.controller.pool.reconcile import decide
    from test_elastic_rules import NOW, row

    fresh = row(started=NOW - 60, step=120, planned_until=NOW + 60)
    (d,) = decide([fresh], {}, {}, NOW)
    assert d.action == "keep" and "planned" in d.reason  # (its VMs may not be created yet)
    had_work = row(started=NOW - 60, step=120, planned_until=NOW + 60)
    had_work["record"]["used"] = True
    (d,) = decide([had_work], {}, {}, NOW)
    assert d.action == "remove", d
    long_plan = row(started=NOW - 60, step=120, planned_until=NOW + 3600)
    long_plan["record"]["used"] = True
    (d,) = decide([long_plan], {}, {}, NOW)
    assert d.action == "keep" and "planned" in d.reason  # (the work it was bought for is not over yet)


@pytest.mark.timeout(180)
def test_a_vm_placed_on_a_plan_machine_marks_it_used_and_scale_in_removes_it_once_idle(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lc", "local", {"backend": "fake", "types": [
            {"name": "s1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2,
             "billing_step_secs": 120, "billing_min_secs": 120}]})
        plan = c.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=512, duration_secs=10,
                                                         provider="lc", apply=True))
        (machine,) = [h.name for h in c.pool.cloud_hosts()]
        wait_until(lambda: [x.id for x in c.hosts.list() if x.connected] == [machine], timeout=60, what="joined")
        c.vms.create({"name": "w", "shape": {"vcpus": 1, "mem_mib": 512}, "entry": "true", "on": "lc"})
        c.vms.delete("w")
        decisions = {d.host: d for d in c.pool.cloud_reconcile()}
        assert decisions[machine].action == "remove", (decisions[machine], plan.explain)


@pytest.mark.timeout(240)
def test_a_pool_machine_whose_agent_is_gone_for_good_is_removed_with_force_and_ended(tmp_path, procs):
    """(the diff review: refused 409 for the pool's machines, force or not, while the pool's
    removal refuses a host with VMs, whose delete and drain need the agent: no way out)"""
    import json
    import os
    import signal

    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.pool.link_cloud("lc", "local", {"backend": "fake", "types": [
            {"name": "s1", "vcpus": 2, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2}]})
        (h,) = c.pool.cloud_add_host("lc", "s1", count=1)
        wait_until(lambda: [x.id for x in c.hosts.list() if x.connected] == [h.name], timeout=60, what="joined")
        c.vms.create({"name": "w", "host": h.name, "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 600"})
        (machine,) = list((ctl.state_dir / "clouds").glob(f"*/{h.name}/machine.json"))
        pid = json.loads(machine.read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)  # its agent answers no more; the machine runs on
        try:
            wait_until(lambda: not c.hosts.get(h.name).connected, timeout=60, what="disconnected")
            with pytest.raises(fuse.ApiError) as got:
                c.hosts.deregister(h.name)
            assert got.value.code == "conflict"
            c.hosts.deregister(h.name, force=True)
            assert c.hosts.list() == [] and c.vms.list() == []
            assert [x.state for x in c.pool.cloud_hosts(include_gone=True)] == ["gone"]
            wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                       open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=30, what="its machine ended")
        finally:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGCONT)
