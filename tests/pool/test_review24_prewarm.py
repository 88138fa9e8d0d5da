"""Twenty-fourth session: a drain and a prewarm's standby VMs. Real controller, fake-backend agents."""

from __future__ import annotations

import pytest

import fuse
from support import agent_states, wait_until
from test_prewarm import ready
from test_review16_prewarm import fleet, register, standby_on


@pytest.mark.timeout(240)
def test_a_drain_hands_a_prewarms_standby_vms_to_the_prewarm_which_places_them_elsewhere(tmp_path, procs):
    """(was: the drain tried to move them, the agent refused ("standby ... claim or delete it"),
    both were reported stuck, the host stayed draining with them, and the prewarm sat at 0
    ready for good with another host empty: its refill moved standby VMs off cordoned hosts
    only)"""
    ctl, agents = fleet(tmp_path, procs, "a1", "a2")
    with fuse.Client(ctl.url) as client:
        register(client, "own1", agents["a1"])
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="host:own1"))
        ready(client, pw.id, 2, timeout=60)
        names = sorted(v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-"))
        # pinned there: nowhere else to go, so the drain says so (and leaves them)
        register(client, "own2", agents["a2"])
        report = client.hosts.drain("own1")
        assert report["moved"] == [] and report["prewarmed"] == [], report
        assert [(s["vm"], s["code"]) for s in report["stuck"]] == [(n, "standby") for n in names], report
        assert report["stuck"][0]["reason"] == ("a prewarm's standby VM (no entry yet: not moved): its prewarm is "
                                                "pinned to this host (on host:...); remove the prewarm, or delete the VM")
        client.hosts.uncordon("own1")
        assert client.pool.remove_prewarm(pw.id)

        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 2, timeout=60)
        (host,) = standby_on(client, pw.id)
        other = {"own1": "own2", "own2": "own1"}[host]
        names = sorted(v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-"))
        client.vms.create(name="work", host=host, shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
        report = client.hosts.drain(host)
        assert report["stuck"] == [] and [m["vm"] for m in report["moved"]] == ["work"], report
        assert report["prewarmed"] == names, report
        assert standby_on(client, pw.id) == {other: 2}
        assert agent_states(agents["a1" if host == "own1" else "a2"]) == {}  # (nothing left on the drained host)
        assert ready(client, pw.id, 2, timeout=30).ready == 2
        client.hosts.deregister(host)  # (empty: it goes)


BIG = {"name": "big", "vcpus": 4, "mem_mib": 4096, "usd_per_hour": 3.0, "billing_step_secs": 60,
       "billing_min_secs": 60, "boot_secs": 1}


def test_scale_in_counts_for_standby_vms_only_the_room_their_prewarm_may_take():
    from fuse.controller.pool.reconcile import Load, decide
    from test_elastic_rules import NOW, row

    rows = [row(name="aws-1"), row(name="aws-2")]
    # aws-1's VM and two prewarmed VMs of a prewarm that may go to aws-1 alone (on that cloud,
    # say, or the only host with its image); the operator's host has room for all three
    loads = {"aws-1": Load(vms=(256,), prewarmed=2, standby=(256, 256), mem_mib=4096,
                           standby_on=(frozenset({"aws-1"}),) * 2),
             "aws-2": Load(vms=(3000,), mem_mib=4096)}
    room = {"own1": (16384, 10), "aws-2": (1096, 5)}
    d = {x.host: x for x in decide(rows, loads, room, NOW)}
    assert d["aws-1"].action == "keep", d  # (was cordoned: the room counted was own1's)
    # once its prewarm may use aws-2 too, there is room for them there
    loads["aws-1"] = Load(vms=(256,), prewarmed=2, standby=(256, 256), mem_mib=4096,
                          standby_on=(frozenset({"aws-1", "aws-2"}),) * 2)
    d = {x.host: x for x in decide(rows, loads, room, NOW)}
    assert d["aws-1"].action == "cordon", d


@pytest.mark.timeout(240)
def test_scale_in_keeps_the_machine_whose_prewarmed_vms_have_no_other_room_within_their_cloud(tmp_path, procs):
    """(was: cordoned as "the other hosts have room for its 1 VMs and 2 prewarmed" — the room was
    the operator's own host, outside the prewarm's `on`: the prewarm sat at 0 ready for good and
    a create of its shape booted cold)"""
    ctl, agents = fleet(tmp_path, procs, "a1")
    with fuse.Client(ctl.url) as client:
        register(client, "own1", agents["a1"])
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="dev"))
        (machine,) = pw.new_hosts
        ready(client, pw.id, 2, timeout=60)
        vm = client.vms.create(name="work", on="dev", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        assert vm["host"] == machine
        (d,) = [d for d in client.pool.cloud_reconcile() if d.host == machine]
        assert d.action == "keep", d
        assert client.hosts.get(machine).state == "active"
        assert ready(client, pw.id, 2, timeout=10).ready == 2
        got = client.vms.create(name="fast", on="dev", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        placed = [e for e in client.events.list(0, limit=500)["events"]
                  if e["type"] == "placed" and e.get("vm") == "fast"]
        assert got["host"] == machine and placed and placed[0].get("prewarmed"), placed  # (claimed: not cold)
        client.vms.delete("fast")
        client.vms.delete("work")
        assert client.pool.remove_prewarm(pw.id)


def test_scale_in_owes_no_room_to_standby_vms_no_other_host_may_take_and_packs_the_choosy_first():
    """(a diff review: a cordoned host's VMs of a prewarm pinned there blocked every cordon in the
    fleet, "room held" for them; and first fit by size alone put a VM that may go anywhere on the
    one host a standby VM could use)"""
    from fuse.controller.pool.reconcile import Load, _fits, decide
    from test_elastic_rules import NOW, row

    rows = [row(name="c1", state="cordoned"), row(name="b1"), row(name="b2")]
    loads = {"c1": Load(vms=(256,), prewarmed=1, standby=(512,), mem_mib=4096, standby_on=(frozenset({"c1"}),)),
             "b1": Load(vms=(256,), mem_mib=4096), "b2": Load(vms=(256, 256), mem_mib=4096)}
    d = {x.host: x for x in decide(rows, loads, {"b1": (3000, 10), "b2": (3000, 10)}, NOW)}
    assert d["b1"].action == "cordon", d
    assert "the 1 VMs of c1 (cordoned)" in d["b1"].reason, d  # (its VM, not the pinned standby one)
    assert _fits([(1024, None), (1024, frozenset({"A"}))], {"A": (1024, 5), "B": (1024, 5)})
    assert not _fits([(1024, frozenset({"A"})), (1024, frozenset({"A"}))], {"A": (1024, 5), "B": (1024, 5)})


@pytest.mark.timeout(240)
def test_a_drain_hands_standby_vms_over_with_warm_off_and_says_at_once_what_cannot_go(tmp_path, procs):
    """(a diff review: with the budget's warm off the refill never ran, so the drain waited 60 s
    and reported them stuck saying the prewarm would move them; one whose image no other host has
    was waited for 60 s too)"""
    import time

    ctl, agents = fleet(tmp_path, procs, "a1", "a2")
    with fuse.Client(ctl.url) as client:
        register(client, "own1", agents["a1"])
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 1, timeout=60)
        register(client, "own2", agents["a2"])
        client.pool.cloud_budget(fuse.ElasticBudgetUpdate(warm=False))
        (name,) = [v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-")]
        t0 = time.monotonic()
        report = client.hosts.drain("own1")
        assert report["prewarmed"] == [name] and report["stuck"] == [], report
        assert standby_on(client, pw.id) == {"own2": 1}
        assert time.monotonic() - t0 < 30
        (name,) = [v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-")]  # (a new one)

        # own1 back, without the image: nowhere for own2's standby VM to go
        client.hosts.uncordon("own1")
        (tmp_path / "a1" / "bundles" / "linux" / "manifest.json").unlink()
        wait_until(lambda: "linux" not in [b["name"] for b in client.hosts.get("own1").bundles],
                   timeout=10, what="own1 without linux")
        t0 = time.monotonic()
        report = client.hosts.drain("own2")
        assert [(s["vm"], s["code"]) for s in report["stuck"]] == [(name, "standby")], report
        assert "no other host within its prewarm's on has its image" in report["stuck"][0]["reason"]
        assert time.monotonic() - t0 < 30, "waited for a VM that cannot go anywhere"


def test_scale_in_keeps_the_one_host_a_cordoned_hosts_standby_vms_may_go_to():
    """(a diff review: owed room was filtered against the other hosts alone, so the candidate that
    was the only place those standby VMs could go was cordoned)"""
    from fuse.controller.pool.reconcile import Load, decide
    from test_elastic_rules import NOW, row

    rows = [row(name="c1", state="cordoned"), row(name="x1"), row(name="b1")]
    loads = {"c1": Load(prewarmed=1, standby=(512,), mem_mib=4096, standby_on=(frozenset({"c1", "x1"}),)),
             "x1": Load(vms=(256,), mem_mib=4096), "b1": Load(vms=(2048,), mem_mib=4096)}
    d = {x.host: x for x in decide(rows, loads, {"x1": (3000, 10), "b1": (2000, 10)}, NOW)}
    assert d["x1"].action == "keep", d


@pytest.mark.timeout(300)
def test_a_drain_moves_the_vms_with_work_before_its_standby_vms_take_any_room(tmp_path, procs):
    """(a diff review: the pool's loop handed a draining host's standby VMs over as the drain
    began, and their new copies took the room on the target that the VMs with work needed:
    two of eight were left `stuck` no_target)"""
    from support import start_agent, start_controller

    a1 = start_agent(tmp_path, backend="fake", name="a1")
    a2 = start_agent(tmp_path, backend="fake", name="a2")
    procs += [a1, a2]
    procs.append(ctl := start_controller(tmp_path, env={"FUSE_DRAIN_STANDBY_WAIT_S": "3"}))
    with fuse.Client(ctl.url) as client:
        def add(host_id, agent, ram):
            client.hosts.register(fuse.RegisterHostRequest(
                id=host_id, url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=12, ram_mb=ram, cpus=4)))
            wait_until(lambda: client.hosts.get(host_id).connected, timeout=30, what=f"{host_id} connected")

        add("h1", a1, 4096)
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 2, timeout=60)
        work = [f"u{i}" for i in range(8)]
        for name in work:  # (another shape than the prewarm's: none of them claims a standby VM)
            client.vms.create(name=name, host="h1", shape={"vcpus": 2, "mem_mib": 256}, entry="sleep 600")
        add("h2", a2, 2048)  # room for the eight exactly
        report = client.hosts.drain("h1")
        assert sorted(m["vm"] for m in report["moved"]) == work, report
        from fuse.controller.moves.drain import STANDBY_STAYS
        assert [(s["code"], s["reason"]) for s in report["stuck"]] == [("standby", STANDBY_STAYS["waits"])] * 2
        assert report["prewarmed"] == []
        assert {v["name"]: v["host"] for v in client.vms.list() if v["name"] in work} == dict.fromkeys(work, "h2")
