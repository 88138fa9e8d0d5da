"""Capacity figures a host may declare are bounded: a figure past what placement's
64-bit arithmetic holds was stored and then made every create in the fleet a 500."""

from __future__ import annotations

import pytest

import fuse
from support import reap, start_agent, start_controller


@pytest.fixture
def one(tmp_path):
    ctl = start_controller(tmp_path)
    agent = start_agent(tmp_path, backend="fake", name="a1")
    client = fuse.Client(ctl.url)
    yield client, agent
    client.close()
    agent.stop()
    ctl.stop()
    reap(tmp_path)


@pytest.mark.parametrize("field", ["ram_mb", "vm_count", "cpus", "storage_gb", "gpus"])
def test_a_capacity_past_2_53_is_refused_and_nothing_is_stored(one, field):
    client, agent = one
    body = {"id": "big", "url": agent.url, "token": agent.token, "backend": "qemu",
            "capacity": {"vm_count": 5} | {field: 99999999999999999999}}
    with pytest.raises(fuse.ApiError) as e:
        client._send(fuse.client._core.Call("POST", "/v1/hosts", body=body))
    assert (e.value.status, e.value.code) == (400, "invalid_argument") and field in e.value.message
    assert client.hosts.list() == []


def test_the_largest_figures_register_and_placement_still_works(one):
    client, agent = one
    client.hosts.register(fuse.RegisterHostRequest(
        id="h1", url=agent.url, token=agent.token, backend="qemu",
        capacity=fuse.HostCapacity(vm_count=2**53, ram_mb=2**53, cpus=2**53)))
    vm = client.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "echo hi"})
    assert vm["host"] == "h1"
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, kind="container", memory_mb=128))
    assert [a.host for a in plan.assignments] == ["h1"]
    client.vms.delete("v1")
