"""Prewarms against cordons, pins, full hosts and cloud caps (a black-box review's findings):
a cordoned host's standby VMs are no longer counted ready and move to a host that takes work,
scale-in counts them as use, a create pinned to a host claims one there, a refill on ``local``
re-places its VMs when their host is full, and a cloud's type limit in the way is
``budget_exceeded`` as for a purchase by hand."""

from __future__ import annotations

import pytest

import fuse
from fuse.client._core import Call
from fuse.controller.pool.reconcile import Load, decide
from support import start_agent, start_controller, wait_until
from test_elastic_rules import NOW, row
from test_prewarm import events, ready


def register(client, host_id: str, agent, vm_count: int = 4) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=agent.url, token=agent.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=vm_count, ram_mb=2048, cpus=2)))
    wait_until(lambda: client.hosts.get(host_id).connected, timeout=30, what=f"{host_id} connected")


def fleet(tmp_path, procs, *names: str):
    """A controller and a fake-backend agent per name (not registered): (controller, {name: agent})."""
    agents = {}
    for name in names:
        procs.append(agents.setdefault(name, start_agent(tmp_path, backend="fake", name=name)))
    procs.append(ctl := start_controller(tmp_path))
    return ctl, agents


def warmed(client, count: int, memory_mb: int, on: str) -> fuse.Prewarm:
    """A prewarm of ``count`` VMs of 1 vCPU and ``memory_mb``, once they are all ready."""
    pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=count, cpus=1, memory_mb=memory_mb, on=on))
    return ready(client, pw.id, count, timeout=60)


def standby_on(client, pw_id: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in client.vms.list():
        if v["name"].startswith(pw_id + "-"):
            out[v["host"]] = out.get(v["host"], 0) + 1
    return out


def test_scale_in_counts_a_hosts_prewarmed_vms_as_vms_that_need_room_elsewhere():
    # the other host has room for aws-1's one VM but not for its two prewarmed ones as well:
    # cordoning it would leave them unclaimable (they counted for nothing before)
    loads = {"aws-1": Load(vms=(256,), prewarmed=2, standby=(1024, 1024), mem_mib=8192),
             "aws-2": Load(vms=(4096,), mem_mib=8192)}
    rows = [row(name="aws-1"), row(name="aws-2")]
    d = {x.host: x for x in decide(rows, loads, {"aws-1": (5632, 5), "aws-2": (1536, 4)}, NOW)}
    assert d["aws-1"].action == "keep", d
    # with room for all three elsewhere it is cordoned, and the reason counts them
    d = {x.host: x for x in decide(rows, loads, {"aws-1": (5632, 5), "aws-2": (4096, 4)}, NOW)}
    assert d["aws-1"].action == "cordon" and "1 VMs and 2 prewarmed" in d["aws-1"].reason, d


def test_a_cordoned_hosts_standby_vms_are_not_ready_and_move_to_a_host_that_takes_work(tmp_path, procs):
    ctl, agents = fleet(tmp_path, procs, "a", "b")
    with fuse.Client(ctl.url) as client:
        register(client, "a", agents["a"])
        pw = warmed(client, 2, 256, "local")
        register(client, "b", agents["b"])
        client.hosts.cordon("a")
        # at once: a create would not claim them there, so they are not ready
        now = next(p for p in client.pool.prewarms() if p.id == pw.id)
        assert now.ready == 0 or [p.host for p in now.placements] == ["b"], now
        pw = ready(client, pw.id, 2, timeout=60)
        assert [(p.host, p.count, p.ready) for p in pw.placements] == [("b", 2, 2)], pw
        wait_until(lambda: standby_on(client, pw.id) == {"b": 2}, timeout=30, what="none left on a")
        vm = client.vms.create(name="job", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        assert vm["host"] == "b"
        (placed,) = [e for e in events(client, "placed") if e.get("vm") == "job"]
        assert placed["prewarmed"].startswith(pw.id + "-")
        assert client.pool.remove_prewarm(pw.id)


def test_a_prewarm_pinned_to_a_host_that_is_cordoned_keeps_its_vms_there_not_ready_until_uncordoned(tmp_path,
                                                                                                       procs):
    ctl, agents = fleet(tmp_path, procs, "edge", "other")
    with fuse.Client(ctl.url) as client:
        register(client, "edge", agents["edge"])
        register(client, "other", agents["other"])
        pw = warmed(client, 2, 256, "host:edge")
        client.hosts.cordon("edge")
        pw = ready(client, pw.id, 0, timeout=10)
        assert [(p.host, p.count) for p in pw.placements] == [("edge", 2)]
        import time
        time.sleep(3)  # (refill passes run meanwhile: they move nothing, delete nothing)
        assert standby_on(client, pw.id) == {"edge": 2}
        client.hosts.uncordon("edge")
        ready(client, pw.id, 2, timeout=10)
        assert client.pool.remove_prewarm(pw.id)


def test_a_create_pinned_to_a_host_claims_a_standby_vm_there(tmp_path, procs):
    ctl, agents = fleet(tmp_path, procs, "edge")
    with fuse.Client(ctl.url) as client:
        register(client, "edge", agents["edge"], vm_count=2)
        pw = warmed(client, 2, 160, "host:edge")
        # the host's two VM slots hold the standby VMs: only a claim can place these
        vm = client.vms.create(name="pinned", shape={"vcpus": 1, "mem_mib": 160}, entry="sleep 600", host="edge")
        vm2 = client.vms.create(name="on-host", shape={"vcpus": 1, "mem_mib": 160}, entry="sleep 600",
                                on="host:edge")
        assert vm["host"] == vm2["host"] == "edge"
        claimed = {e["vm"]: e.get("prewarmed", "") for e in events(client, "placed")}
        assert claimed["pinned"].startswith(pw.id + "-") and claimed["on-host"].startswith(pw.id + "-"), claimed
        assert client.pool.remove_prewarm(pw.id)


def test_a_refill_on_local_places_its_vm_on_another_own_host_when_its_host_is_full(tmp_path, procs):
    ctl, agents = fleet(tmp_path, procs, "a", "b")
    with fuse.Client(ctl.url) as client:
        register(client, "a", agents["a"], vm_count=2)
        pw = warmed(client, 2, 256, "local")
        register(client, "b", agents["b"])
        # a claim leaves its VM in one of a's two slots: a has room for one standby VM only
        client.vms.create(name="job", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        pw = ready(client, pw.id, 2, timeout=60)
        assert sorted((p.host, p.count) for p in pw.placements) == [("a", 1), ("b", 1)], pw
        assert client.pool.remove_prewarm(pw.id)


def test_a_prewarm_a_clouds_type_limit_stops_is_budget_exceeded_like_a_purchase_by_hand(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "limits": {"local.small": 0}, "types": [
            {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}]})
        with pytest.raises(fuse.ApiError) as by_hand:
            client.pool.cloud_add_host("dev", "local.small")
        with pytest.raises(fuse.ApiError) as e:
            client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512))
        assert (by_hand.value.status, by_hand.value.code) == (409, "budget_exceeded")
        assert (e.value.status, e.value.code) == (409, "budget_exceeded"), e.value.message
        assert client.pool.cloud_hosts() == [] and client.pool.prewarms() == []


def test_a_budget_field_in_both_spellings_says_so_and_a_small_monthly_cap_shows_its_cents(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        with pytest.raises(fuse.ApiError) as e:
            client.pool._send(Call("PATCH", "/v1/pool/budget", body={"maxNewHosts": 2, "max_new_hosts": 3}))
        assert e.value.status == 400 and "max_new_hosts (maxNewHosts) given in both spellings" in e.value.message
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [
            {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}]})
        client.pool.cloud_budget(fuse.ElasticBudgetUpdate(monthly_usd=0.015))
        with pytest.raises(fuse.ApiError) as e:
            client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
        assert e.value.code == "budget_exceeded" and "$0.0150 (monthly_usd)" in e.value.message, e.value.message
