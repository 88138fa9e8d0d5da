"""The elastic pool as review 22 found it: a create claiming a prewarmed VM on a machine
that ``cloud_remove_host`` (or the end of the prewarm that bought it) removes at that moment
keeps its VM and its machine (the create answered 201, then the VM was deleted with the
machine, or the remove said "not removed" yet terminated it).

Real controllers and fake-backend host agents of a ``local`` cloud; the claim is held at
the controller's test hook (``FUSE_TEST_PAUSE_AT=claim:S``) so the remove comes mid-claim."""

from __future__ import annotations

import threading
import time

import pytest

import fuse
from support import start_controller, wait_until
from test_prewarm import events, ready

BIG = {"name": "big", "vcpus": 4, "mem_mib": 4096, "usd_per_hour": 3.0, "billing_step_secs": 60,
       "billing_min_secs": 60, "boot_secs": 1}
SHAPE = {"vcpus": 1, "mem_mib": 3000}


def claim_while(ctl, client, remove) -> tuple[dict, object]:
    """A create of the prewarmed shape, and ``remove()`` called once its claim holds (6 s)."""
    created: list = []
    t = threading.Thread(target=lambda: created.append(client.vms.create({"name": "c1", "shape": SHAPE,
                                                                          "entry": "x"})))
    t.start()
    wait_until(lambda: "test hook: held at claim" in ctl.logs(), what="the create holding in its claim")
    removed = remove()
    t.join(60)
    assert created, "the create did not answer"
    return created[0], removed


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["cloud_remove_host", "remove_prewarm"])
def test_a_machine_whose_prewarmed_vm_a_create_is_claiming_stays_with_the_vm(tmp_path, procs, how):
    procs.append(ctl := start_controller(tmp_path, env={"FUSE_TEST_PAUSE_AT": "claim:6"}))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=3000, instance_type="big",
                                                              ttl_secs=900))
        (machine,) = pw.new_hosts
        ready(client, pw.id, 1, timeout=60)
        if how == "cloud_remove_host":
            vm, out = claim_while(ctl, client, lambda: client.pool.cloud_remove_host([machine]))
            assert out.removed == [] and len(out.failed) == 1, out
            assert out.failed[0].startswith(f"{machine}: a VM is being placed on it (c1)"), out
        else:
            vm, out = claim_while(ctl, client, lambda: client.pool.remove_prewarm(pw.id))
            assert out is True
        assert vm["host"] == machine and vm["state"] == "running", vm
        time.sleep(2)  # (pool passes: nothing ends the machine under the VM)
        assert client.vms.get("c1")["state"] == "running"
        # (a refill may buy another for the prewarm: the VM took the one it had)
        assert (machine, "joined") in [(h.name, h.state) for h in client.pool.cloud_hosts()]
        assert events(client, "vm_lost") == [] and not [e for e in events(client, "vm_removed") if e["vm"] == "c1"]
        wait_until(lambda: client.vms.get("c1")["state"] == "running", timeout=5, what="c1 running")


@pytest.mark.timeout(240)
def test_a_host_a_prewarm_is_pinned_to_is_not_removed_from_under_it(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        (machine,) = [h.name for h in client.pool.cloud_add_host("dev", "big")]
        wait_until(lambda: client.hosts.get(machine).connected, timeout=60, what=f"{machine} joined")
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, on=f"host:{machine}",
                                                              ttl_secs=900))
        ready(client, pw.id, 1, timeout=60)
        out = client.pool.cloud_remove_host([machine])
        assert out.removed == [] and out.failed == [
            f"{machine}: prewarm {pw.id} is pinned to it (on host:{machine}): remove the prewarm first"], out
        assert ready(client, pw.id, 1).ready == 1  # (was: removed, and the prewarm never ready again)
        assert client.pool.remove_prewarm(pw.id)
        assert client.pool.cloud_remove_host([machine]).removed == [machine]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pin,said", [({"instance_type": "big"}, "is not a big machine (an own host)"),
                                      ({"region": "far"}, "is not in region far (its region: near)")])
def test_a_prewarm_pinned_to_a_host_keeps_its_type_and_region_pins(tmp_path, procs, pin, said):
    from support import start_agent

    procs.append(agent := start_agent(tmp_path, backend="fake", name="own1"))
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [BIG]})
        client.hosts.register(fuse.RegisterHostRequest(id="own1", url=agent.url, token=agent.token, backend="qemu",
                                                       region="near", capacity=fuse.HostCapacity(vm_count=4)))
        wait_until(lambda: client.hosts.get("own1").connected, timeout=30, what="own1 connected")
        with pytest.raises(fuse.ApiError) as err:
            client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="host:own1", **pin))
        assert (err.value.status, err.value.code) == (409, "fleet_full"), err.value
        assert err.value.message == f"host own1 {said}"
        assert client.pool.prewarms() == []
