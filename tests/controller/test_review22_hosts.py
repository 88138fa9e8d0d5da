"""Host registry, from review 22 (seed 000, against a real controller and agents): a host
of an architecture the planner does not plan is left out of plans (every plan was a 500);
the GPU rule is the machine's (a firecracker agent registered as qemu with GPUs is 400);
the CLI shows ids as written, not as rich markup."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import fuse
from fuse import HostCapacity, RegisterHostRequest
from fuse.controller.pool.request import hosts_from_snapshot
from support import FUSE, api_error, fake_firecracker_env, start_agent, wait_until
from test_registry import FACTS, impostor  # noqa: F401 (the fixture: a stand-in that answers the probe)
from test_review20_hosts import gpu_fleet, register  # noqa: F401 (the fixture: an agent with an A100)


def test_a_host_of_an_arch_the_planner_does_not_plan_is_left_out_of_plans_not_a_500(client, impostor):  # noqa: F811
    impostor.body = json.dumps({**FACTS, "arch": "riscv64"}).encode()
    impostor.content_type = "application/json"
    host = client.hosts.register(RegisterHostRequest(id="rv", url=impostor.url, token="t",
                                                     capacity=HostCapacity(vm_count=2)))
    assert host.capacity.arch == "riscv64"
    assert [w for w in host.warnings if w.startswith("arch:")] == [
        "arch: the host agent runs on riscv64; the elastic planner plans amd64 and arm64 machines only, "
        "so its plans leave this host out"]
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=512))  # (was: 500)
    assert all(a.host != "rv" for a in plan.assignments)


def test_the_planners_snapshot_leaves_out_a_host_of_another_arch():
    snap = [{"name": "rv", "arch": "riscv64", "free_vcpus": 4, "free_mem_mib": 8192},
            {"name": "x", "arch": "amd64", "free_vcpus": 4, "free_mem_mib": 8192}]
    assert [h.name for h in hosts_from_snapshot(snap)] == ["x"]


def test_a_firecracker_agent_registered_as_qemu_may_not_declare_gpus(client, tmp_path):
    agent = start_agent(tmp_path, backend="firecracker", name="fc", env=fake_firecracker_env(tmp_path))
    try:
        for cap in ({"gpus": 2}, {"mig_profiles": {"1g.10gb": 4}}):
            err = api_error(client.hosts.register, RegisterHostRequest(
                id="fc", url=agent.url, token=agent.token, backend="qemu",
                capacity=HostCapacity.model_validate({"vm_count": 2, **cap})))
            assert (err.status, err.code) == (400, "invalid_argument"), err
            assert err.message.startswith("only qemu hosts may declare capacity.") and "runs firecracker" in err.message
        assert client.hosts.list() == []
    finally:
        agent.stop()


@pytest.mark.parametrize("host_id", ["[bold red]boom[/bold red]", "a[/]b"])
def test_the_cli_shows_host_ids_as_written(controller, client, agent, host_id):
    client.hosts.register(RegisterHostRequest(id=host_id, url=agent.url, token=agent.token,
                                              capacity=HostCapacity(vm_count=2)))
    for args in (["hosts", "list"], ["hosts", "get", host_id]):
        r = subprocess.run(FUSE + ["controller", "--url", controller.url, *args], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "COLUMNS": "250"})
        assert r.returncode == 0, r.stderr  # (a "[/]" crashed every host table: MarkupError)
        assert host_id in r.stdout, r.stdout  # (not "boom", its markup taken for styling)


def test_an_agent_that_wants_a_token_none_was_given_for_says_so(client, agent):
    err = api_error(client.hosts.register, RegisterHostRequest(id="h", url=agent.url, token="",
                                                               capacity=HostCapacity(vm_count=2)))
    assert (err.status, err.code) == (502, "unauthorized"), err
    assert err.message == f"the host agent at {agent.url} requires a token (none was given)"  # (was: "rejected the token")


def test_re_registering_with_the_probe_skipped_keeps_what_the_agent_reported(gpu_fleet):  # noqa: F811
    agent, client, _ = gpu_fleet
    register(client, agent, "h1", "qemu")
    first = client.hosts.get("h1").capacity
    assert first.gpus == 1 and first.gpu_kind == "nvidia:A100" and first.arch
    agent.stop()  # (unreachable: the three figures declared, it registers without a probe)
    host = register(client, agent, "h1", "qemu", cpus=2, ram_mb=2048, storage_gb=10)
    assert any(w.startswith("probe skipped") for w in host.warnings), host.warnings
    now = client.hosts.get("h1").capacity
    # (was: gpus 0, gpu_kind '', no devices, arch '': an update wiped them)
    assert (now.gpus, now.gpu_kind, now.arch, [d.uuid for d in now.gpu_devices]) == (
        first.gpus, first.gpu_kind, first.arch, [d.uuid for d in first.gpu_devices])
    assert (now.cpus, now.ram_mb, now.storage_gb) == (2, 2048, 10)


def test_the_same_agent_reached_another_way_is_re_pointed_with_its_vms_running(fleet):
    """(was: 409 "still has vm ... assigned" for the agent's own socket: a transport change
    needed a full drain)"""
    a = fleet.agent("a1")
    fleet.add("h1", a)
    wait_until(lambda: fleet.client.hosts.get("h1").connected, timeout=30, what="h1 connected")
    fleet.client.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", "host": "h1"})
    host = fleet.client.hosts.register(RegisterHostRequest(id="h1", url=f"unix://{a.socket}", token=a.token,
                                                           backend="qemu", capacity=HostCapacity(vm_count=10)))
    assert host.url == f"unix://{a.socket}"
    wait_until(lambda: fleet.client.hosts.get("h1").connected, timeout=30, what="h1 connected again")
    assert fleet.client.vms.get("v1")["state"] == "running"
    fleet.client.vms.delete("v1")  # (through the new address)
    other = fleet.agent("a2")  # another agent is still refused while a VM is there
    fleet.client.vms.create({"name": "v2", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", "host": "h1"})
    err = api_error(fleet.add, "h1", other)
    assert (err.status, err.code) == (409, "conflict") and "still has vm v2 assigned" in err.message, err
