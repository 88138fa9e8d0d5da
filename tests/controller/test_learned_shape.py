"""Issue 6: a plan's shape defaults are "learned from earlier VMs of the image": through a
real controller and agent, a VM created and deleted since still teaches its shape."""

from __future__ import annotations

import json

import fuse
from support import wait_until


def test_a_deleted_vm_still_teaches_the_plan_its_shape(fleet):
    a = fleet.agent("a")
    fleet.add("a", a, vm_count=10, ram_mb=4096, cpus=4)
    client = fleet.client
    wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="host connected")
    for i in range(2):
        client.vms.create(name=f"wide-{i}", shape={"vcpus": 2, "mem_mib": 640}, entry="sleep 600")
    client.vms.create(name="narrow", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
    for i in range(2):
        client.vms.delete(f"wide-{i}")
    assert [v["name"] for v in client.vms.list()] == ["narrow"]
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, image="linux", kind="container"))
    group = json.loads(plan.json)["model"]["groups"][0]
    assert (group["cpus"], group["mem_mib"]) == (2, 640)  # two deleted VMs against one listed
    # what the request gives wins over what was learned
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, image="linux", kind="container", cpus=1))
    assert json.loads(plan.json)["model"]["groups"][0]["cpus"] == 1
