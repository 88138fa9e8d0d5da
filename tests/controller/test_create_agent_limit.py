"""A create passes over a host whose summary shows its agent's own VM-count limit
(--max-vms) reached, with that reason, instead of asking it and taking its refusal;
the registered vm_count stays the operator's policy above it."""

from __future__ import annotations

import httpx

from support import api_error, wait_until


def vm_body(name, mem=128, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}


def test_a_create_skips_a_host_at_its_agents_max_vms(fleet):
    picky, roomy = fleet.agent("picky", extra=["--max-vms", "1"]), fleet.agent("roomy")
    fleet.add("picky", picky, vm_count=10, ram_mb=1024)  # the smallest: best fit's first choice
    fleet.add("roomy", roomy, vm_count=10, ram_mb=4096, cpus=8)
    assert fleet.client.vms.create(vm_body("a"))["host"] == "picky"
    # the controller learns the agent's limit from its summary (max_vms) at the next poll
    wait_until(lambda: httpx.get(picky.url + "/v1/host", headers={"Authorization": f"Bearer {picky.token}"},
                                 timeout=10).json()["vm_count"] == 1, timeout=20, what="picky's VM counted")
    wait_until(lambda: fleet.client.vms.create(vm_body("b"))["host"] == "roomy", timeout=20,
               what="a create passing over picky")
    fleet.client.hosts.cordon("roomy")
    err = api_error(fleet.client.vms.create, vm_body("c"))
    assert (err.status, err.code) == (409, "fleet_full"), err.message
    assert err.details["hosts"]["picky"] == "its agent's max_vms 1 reached", err.details
