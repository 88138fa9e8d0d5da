"""Thirty-second session (review of seed 002): a trial that changes its VM was recreated
onto a host the controller's placement then refused — the service counted free VM slots
from the host's own `allocated` against its `vm_count`, which misses the agent's own
`--max-vms` and the VMs of a machine registered under a second name — so the running VM
was deleted and the trial FAILED with no VM left. The host record now says
`free_vm_slots` as placement counts them, and the service reads it."""

from __future__ import annotations

import pytest

pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

import fuse  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402

from support import reap, start_agent, start_controller, wait_until  # noqa: E402
from test_mlos import provision  # noqa: E402
from test_mlos_review import service, where  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def fleet(tmp_path):
    """h1 (an agent of its own), h2 and h2b (one agent, two names; h2b's vm_count policy 1),
    h3 (an agent started with --max-vms 1)."""
    ctl = start_controller(tmp_path)
    a1, a2 = (start_agent(tmp_path, backend="fake", name=n) for n in ("a1", "a2"))
    a3 = start_agent(tmp_path, backend="fake", name="a3", extra=["--max-vms", "1"])
    client = fuse.Client(ctl.url)
    for host, agent, slots in (("h1", a1, 8), ("h2", a2, 8), ("h2b", a2, 1), ("h3", a3, 8)):
        client.hosts.register(fuse.RegisterHostRequest(
            id=host, url=agent.url, token=agent.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=slots, ram_mb=4096, cpus=4)))
    f = type("Fleet", (), {"ctl": ctl, "client": client})
    yield f
    client.close()
    for p in (a1, a2, a3, ctl):
        p.stop()
    reap(tmp_path)


def slots(client) -> dict[str, int]:
    return {h.id: h.free_vm_slots for h in client.hosts.list()}


def test_the_host_record_counts_vm_slots_as_placement_does(fleet):
    wait_until(lambda: slots(fleet.client) == {"h1": 8, "h2": 8, "h2b": 1, "h3": 1}, timeout=20,
               what="every host's slots")
    fleet.client.vms.create({"name": "on-h2", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": "h2"})
    fleet.client.vms.create({"name": "on-h3", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": "h3"})
    # h2b: its machine holds one VM (under h2), its policy is 1; h3: its agent's --max-vms is 1
    wait_until(lambda: slots(fleet.client) == {"h1": 8, "h2": 7, "h2b": 0, "h3": 0}, timeout=20,
               what=f"the slots taken ({slots(fleet.client)})")
    h2b = fleet.client.hosts.get("h2b")
    assert h2b.allocated.vm_count == 0 and h2b.free_vm_slots == 0  # (allocated alone said there was room)
    with pytest.raises(fuse.ApiError) as err:
        fleet.client.vms.create({"name": "x", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": "h3"})
    assert err.value.code == "fleet_full"  # (the slot the record says is gone is gone for placement)


@pytest.mark.parametrize("full", ["h3", "h2b"])
def test_a_recreate_onto_a_host_past_its_agents_limit_or_its_machines_keeps_the_vm(fleet, full, caplog):
    fleet.client.vms.create({"name": "filler", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x",
                             "host": "h3" if full == "h3" else "h2"})
    wait_until(lambda: slots(fleet.client)[full] == 0, timeout=20, what=f"{full} full")
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert provision(svc, {**p, "vmHost": full})[0] == Status.FAILED
        assert f"vmHost {full} is at its VM limit" in caplog.text
        assert ("keep", "h1", "running") in where(fleet.client)  # (it was deleted, then fleet_full)


def test_a_recreate_on_a_host_past_a_lowered_limit_keeps_the_vm(fleet, caplog):
    """(the diff review: the record's slots stopped at 0, and the service's own VM counted as
    one more: on a host holding more VMs than a lowered policy, 0 + 1 read as room; the VM was
    deleted, then the create refused)"""
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        fleet.client.vms.create({"name": "other", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": "h1"})
        h1 = fleet.client.hosts.get("h1")
        fleet.client.hosts.register(fuse.RegisterHostRequest(id="h1", url=h1.url, token="agent-token", backend="qemu",
                                                             capacity=fuse.HostCapacity(vm_count=1, ram_mb=4096,
                                                                                        cpus=4)))
        wait_until(lambda: slots(fleet.client)["h1"] == -1, timeout=20, what="h1 one VM past its policy")
        assert provision(svc, {**p, "memMiB": 256})[0] == Status.FAILED
        assert "vmHost h1 is at its VM limit" in caplog.text
        assert ("keep", "h1", "running") in where(fleet.client)
