"""Prewarms as a black-box review found them (review 18): removing one prewarm leaves the
machine it bought, and the VMs on it, to the other prewarms that keep VMs ready there; a
standby VM whose run ended (its hypervisor killed) is no longer counted ready and is
replaced; ``ttl_secs`` and ``memory_mb`` take the u64 range the seed gives them, what no VM
takes being refused naming the field; the CLI's ``--kind`` help says which kinds need KVM.

Real controllers and fake-backend host agents (own hosts, and a ``local`` cloud's)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import typer

import fuse
from fuse.cli.pool import app as pool_cli
from fuse.client._core import Call
from support import agent_states, start_controller, wait_until
from test_prewarm import events, ready
from test_review16_prewarm import fleet, register, warmed

U64 = 2**64 - 1
BIG = {"name": "big", "vcpus": 4, "mem_mib": 4096, "usd_per_hour": 3.0, "billing_step_secs": 60,
       "billing_min_secs": 60, "boot_secs": 1}


def prewarm(client, pw_id: str) -> fuse.Prewarm:
    return next(p for p in client.pool.prewarms() if p.id == pw_id)


def standby_names(client, pw_id: str) -> set[str]:
    return {v["name"] for v in client.vms.list() if v["name"].startswith(pw_id + "-")}


@pytest.mark.timeout(240)
def test_removing_a_prewarm_keeps_its_machine_and_the_vms_other_prewarms_keep_ready_there(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        a = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=3000, instance_type="big",
                                                             ttl_secs=900))
        (machine,) = a.new_hosts
        ready(client, a.id, 1, timeout=60)
        # the solve puts b on a's machine (room already paid for), c is pinned there
        b = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=280, ttl_secs=900))
        assert b.new_hosts == [] and [p.host for p in b.placements] == [machine], b
        c = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=300, ttl_secs=900,
                                                             on=f"host:{machine}"))
        ready(client, b.id, 1, timeout=60)
        ready(client, c.id, 1, timeout=60)
        theirs = standby_names(client, b.id) | standby_names(client, c.id)

        assert client.pool.remove_prewarm(a.id)
        assert standby_names(client, a.id) == set()
        time.sleep(3)  # (refill passes: they find b's and c's VMs still there, and buy nothing)
        assert [(h.name, h.state) for h in client.pool.cloud_hosts()] == [(machine, "joined")]
        for pw in (b, c):
            now = prewarm(client, pw.id)
            assert now.ready == 1 and [p.host for p in now.placements] == [machine] and now.new_hosts == [], now
        assert standby_names(client, b.id) | standby_names(client, c.id) == theirs  # the same VMs, never deleted
        removed = {e["vm"] for e in events(client, "vm_removed")}
        assert not removed & theirs, removed
        gone = [e for e in events(client, "elastic_host") if e.get("to") == "gone"]
        assert gone == [], gone

        # once the others end too, nothing holds it: scale-in's rules decide (never bought for them)
        assert client.pool.remove_prewarm(b.id) and client.pool.remove_prewarm(c.id)
        assert [h.name for h in client.pool.cloud_hosts()] == [machine]
        assert client.pool.cloud_remove_host([machine]).removed == [machine]


@pytest.mark.timeout(240)
def test_a_prewarm_still_gives_back_the_machine_it_bought_when_nothing_else_is_there(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        a = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=1000, ttl_secs=900))
        ready(client, a.id, 2, timeout=60)
        assert client.pool.remove_prewarm(a.id)
        assert client.pool.cloud_hosts() == []
        (gone,) = [h for h in client.pool.cloud_hosts(include_gone=True) if h.name in a.new_hosts]
        assert gone.state == "gone"


@pytest.mark.timeout(180)
def test_a_standby_vm_whose_hypervisor_died_is_not_ready_and_is_replaced(tmp_path, procs):
    ctl, agents = fleet(tmp_path, procs, "edge")
    edge = agents["edge"]
    with fuse.Client(ctl.url) as client:
        register(client, "edge", edge)
        pw = warmed(client, 1, 256, "host:edge")
        (first,) = standby_names(client, pw.id)
        (pidfile,) = (edge.state_dir / "vms").glob("*/fake.pid")
        os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)  # as a guest crash or an OOM kill
        wait_until(lambda: agent_states(edge).get(first) != "running", timeout=30, what=f"{first} ended")

        wait_until(lambda: standby_names(client, pw.id) - {first}, timeout=60, what="another standby VM")
        pw = ready(client, pw.id, 1, timeout=60)
        (again,) = standby_names(client, pw.id)
        assert again != first and [(p.host, p.count, p.ready) for p in pw.placements] == [("edge", 1, 1)]
        assert first not in agent_states(edge)  # deleted from its host, not left failed there
        vm = client.vms.create(name="job", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        (placed,) = [e for e in events(client, "placed") if e.get("vm") == "job"]
        assert vm["host"] == "edge" and placed["prewarmed"] == again
        assert client.pool.remove_prewarm(pw.id)


@pytest.mark.timeout(120)
def test_ttl_secs_and_memory_mb_take_the_u64_range_and_what_no_vm_takes_is_refused_naming_the_field(tmp_path,
                                                                                                   procs):
    ctl, agents = fleet(tmp_path, procs, "edge")
    with fuse.Client(ctl.url) as client:
        register(client, "edge", agents["edge"])
        before = int(time.time())
        # on local: the pool's solve places them, its duration the TTL
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local",
                                                              ttl_secs=2**32))
        assert before + 2**32 <= pw.expires_at <= int(time.time()) + 2**32
        forever = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local",
                                                                   ttl_secs=U64))
        assert forever.expires_at == U64  # (its end saturates: u64 unix seconds)
        ready(client, pw.id, 1, timeout=60)
        ready(client, forever.id, 1, timeout=60)
        for body, says in (({"memory_mb": 2**32}, "memory_mb: Input should be less than or equal to 1048576"),
                           ({"memory_mb": 2**64}, "memory_mb"), ({"ttl_secs": 2**64}, "ttl_secs")):
            with pytest.raises(fuse.ApiError) as e:
                client.pool._send(Call("POST", "/v1/prewarms", body={"image": "linux", "cpus": 1, "memory_mb": 256,
                                                                      "on": "host:edge"} | body))
            assert (e.value.status, e.value.code) == (400, "invalid_argument") and says in e.value.message, e.value
        assert {p.id for p in client.pool.prewarms()} == {pw.id, forever.id}
        assert client.pool.remove_prewarm(pw.id) and client.pool.remove_prewarm(forever.id)


def test_the_kind_help_of_fuse_pool_prewarm_says_vm_and_microvm_need_kvm():
    (cmd,) = [c for name, c in typer.main.get_command(pool_cli).commands.items() if name == "prewarm"]
    (kind,) = [p for p in cmd.params if p.name == "kind"]
    assert "microvm and vm need a KVM host" in kind.help and "container goes anywhere" in kind.help, kind.help
