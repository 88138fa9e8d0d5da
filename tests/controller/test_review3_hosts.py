"""Hosts, from a third review: seed 000's recipe for a 409 on deregister
("cordon the host and drain its environments before retrying") succeeds when
the host's VMs have finished (exited or failed: drain cannot move them, so
they held the host for good), while a VM that holds or may hold a running
machine still refuses it; and a declared gpu_kind the probe disagrees with is
quoted as the probe reports it ('' with no GPU, not 'none')."""

from __future__ import annotations

import shutil
import typing

import httpx
import pytest

import fuse
from fuse import HostCapacity, RegisterHostRequest
from fuse.agent.vms import TRANSITIONS
from fuse.controller import hosts as registry
from fuse.models.vm import VmState
from support import api_error, agent_states, end_fake_vm, install_bundle, real_bundle_dir, start_agent, start_controller, wait_until

SHAPE = {"vcpus": 1, "mem_mib": 128}








def left_behind(report: dict) -> list[str]:
    """The finished VMs a drain left on the host: reported ``finished`` (or, by a drain
    that does not tell them apart, ``stuck`` as not_movable), and nothing else stuck."""
    assert all(s["code"] == "not_movable" for s in report["stuck"]), report
    return sorted([s["vm"] for s in report["stuck"]] + [f["vm"] for f in report.get("finished", [])])


def state_of(client, name: str) -> str | None:
    try:
        return client.vms.get(name)["state"]
    except fuse.ApiError:
        return None


# ------------------------------------------------------------------ which states are finished

def test_finished_states_are_exactly_the_agents_states_that_only_lead_to_deleted():
    assert registry.FINISHED <= set(typing.get_args(VmState))
    assert registry.FINISHED == {s for s, to in TRANSITIONS.items() if to <= {"deleted"}}


# ------------------------------------------------------------------ deregister, fake backend

def test_cordon_drain_and_retry_deregisters_a_host_whose_vms_have_finished(fleet):
    a4, a5 = fleet.agent("a4"), fleet.agent("a5")
    fleet.add("h4", a4)
    c = fleet.client
    for name in ("job7", "job9", "run1"):
        assert c.vms.create(name=name, shape=SHAPE, entry="python3 job.py", host="h4")["host"] == "h4"
    wait_until(lambda: all(state_of(c, n) == "running" for n in ("job7", "job9", "run1")), what="vms running")
    end_fake_vm(a4, "job9", 0)       # its entry finished
    end_fake_vm(a4, "job7", None)    # its process died
    wait_until(lambda: (state_of(c, "job9"), state_of(c, "job7")) == ("exited", "failed"), timeout=30,
               what="the controller to see job9 exited and job7 failed")

    # Seed 000: a 409 conflict naming the blocking VM: the running one, not a finished one
    # (which sort first).
    err = api_error(c.hosts.deregister, "h4")
    assert (err.status, err.code) == (409, "conflict") and fuse.is_conflict(err)
    assert err.message == "host h4 still has vm run1 assigned"

    # ... then cordon the host and drain its environments before retrying.
    fleet.add("h5", a5)
    wait_until(lambda: all(h.connected for h in c.hosts.list()), what="hosts connected")
    c.hosts.cordon("h4")
    report = c.hosts.drain("h4")
    assert [(m["vm"], m["to"]) for m in report["moved"]] == [("run1", "h5")]
    assert left_behind(report) == ["job7", "job9"]  # drain cannot move them
    c.hosts.deregister("h4")  # it was "409 host h4 still has vm job7 assigned", for good

    assert [h.id for h in c.hosts.list()] == ["h5"]
    # The finished VMs went with the host from the controller's view; their records stay on the agent.
    assert {v["name"]: v["host"] for v in c.vms.list()} == {"run1": "h5"}
    assert {k: v for k, v in agent_states(a4).items() if k != "run1"} == {"job7": "failed", "job9": "exited"}
    removed = [e for e in c.events.list(0, limit=500)["events"] if e["type"] == "host_removed"]
    assert [(e["host"], e.get("finished_vms")) for e in removed] == [("h4", ["job7", "job9"])]
    # A finished VM's name is free again on the fleet (no stale row to make it ambiguous).
    assert c.vms.create(name="job9", shape=SHAPE, entry="python3 job.py")["host"] == "h5"


@pytest.mark.parametrize("make", ["running", "sleeping"],
                         ids=["a running vm still refuses deregister", "a sleeping vm (a wake runs it again) still does"])
def test_a_vm_that_holds_or_may_hold_a_machine_still_refuses_deregister(fleet, make):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    c = fleet.client
    for name in ("done1", "live1"):
        c.vms.create(name=name, shape=SHAPE, entry="python3 job.py", host="h1")
    wait_until(lambda: state_of(c, "done1") == state_of(c, "live1") == "running", what="vms running")
    end_fake_vm(a, "done1", 3)
    if make == "sleeping":
        c.vms.sleep("live1")
    wait_until(lambda: (state_of(c, "done1"), state_of(c, "live1")) == ("exited", make), timeout=30,
               what=f"done1 exited, live1 {make}")
    c.hosts.cordon("h1")
    err = api_error(c.hosts.deregister, "h1")
    assert (err.status, err.code, err.message) == (409, "conflict", "host h1 still has vm live1 assigned")
    assert [h.id for h in c.hosts.list()] == ["h1"]
    assert sorted(v["name"] for v in c.vms.list()) == ["done1", "live1"]  # nothing went with the refusal
    c.vms.delete("live1")
    c.hosts.deregister("h1")
    assert c.hosts.list() == [] and c.vms.list() == []


# ------------------------------------------------------------------ deregister, real QEMU

@pytest.mark.qemu
@pytest.mark.timeout(420)
def test_a_real_vm_whose_entry_exited_does_not_hold_its_host(tmp_path, procs):
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    install_bundle(real_bundle_dir(), tmp_path / "real")  # before the agent starts: it lists bundles at boot
    procs.append(real := start_agent(tmp_path, backend="qemu", name="real"))
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as c:
        c.hosts.register(RegisterHostRequest(id="h4", url=real.url, token=real.token, backend="qemu",
                                             capacity=HostCapacity(vm_count=2, ram_mb=1024, cpus=2)))
        c.vms.create(name="job9", shape={"vcpus": 1, "mem_mib": 256}, entry="echo done; exit 0")
        wait_until(lambda: state_of(c, "job9") == "exited", timeout=240, interval=0.5,
                   what="the real guest's entry to exit")
        assert agent_states(real)["job9"] == "exited"
        c.hosts.cordon("h4")
        assert left_behind(c.hosts.drain("h4")) == ["job9"]
        c.hosts.deregister("h4")
        assert c.hosts.list() == [] and c.vms.list() == []
        assert agent_states(real) == {"job9": "exited"}  # its record stays on the agent


# ------------------------------------------------------------------ gpu_kind warning

def test_a_declared_gpu_kind_on_a_host_without_one_quotes_what_the_probe_reports(client, agent):
    probed = httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}).json()
    if probed.get("gpu_kind"):
        pytest.skip("this machine has a GPU")
    assert probed["gpu_kind"] == ""
    host = client.hosts.register(RegisterHostRequest(id="g1", url=agent.url, token=agent.token, backend="qemu",
                                                     capacity=HostCapacity(vm_count=2, gpu_kind="A100")))
    assert host.capacity.gpu_kind == "A100"
    [w] = [w for w in host.warnings if w.startswith("capacity.gpu_kind")]
    assert w == "capacity.gpu_kind: declared 'A100' differs from probed '' (no GPU); keeping the declared value"


def test_a_declared_arch_the_probe_contradicts_is_replaced_and_said(client, agent):
    """(review 29: declared arm64 at an amd64 agent was stored amd64 without a word, where every
    other declared fact the probe contradicts is warned about)"""
    probed = httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}).json()
    other = "arm64" if probed["arch"] != "arm64" else "amd64"
    host = client.hosts.register(RegisterHostRequest(id="a1", url=agent.url, token=agent.token, backend="qemu",
                                                     capacity=HostCapacity(vm_count=2, arch=other)))
    assert host.capacity.arch == probed["arch"]
    assert (f"capacity.arch: declared {other!r} differs from probed {probed['arch']!r}; storing the probed value "
            "(the agent's machine is what runs the VMs)") in host.warnings, host.warnings
    same = client.hosts.register(RegisterHostRequest(id="a1", url=agent.url, token=agent.token, backend="qemu",
                                                     capacity=HostCapacity(vm_count=2, arch=probed["arch"])))
    assert not [w for w in same.warnings if w.startswith("capacity.arch")], same.warnings


FACTS = {"cpus": 4, "ram_mb": 8192, "storage_gb": 100, "arch": "amd64"}


@pytest.mark.parametrize("backend, machine, quoted", [
    ("qemu", "nvidia:H100", "'nvidia:H100'"),
    ("qemu", "", "'' (no GPU)"),
    ("firecracker", "", "'' (no GPU)"),
    ("firecracker", "nvidia:H100", "'' (a firecracker host passes no GPU through; the machine's is 'nvidia:H100')"),
], ids=["a qemu host's gpu is quoted as probed", "a qemu host without a gpu is '' not 'none'",
        "a firecracker host without a gpu is '' not 'none'",
        "a firecracker host's gpu is not its capacity, and the warning says whose it is"])
def test_the_gpu_kind_warning_quotes_the_probe(backend, machine, quoted):
    warnings: list[str] = []
    out = registry.merge_capacity(HostCapacity(vm_count=2, gpu_kind="A100"), backend,
                         FACTS | {"gpus": 1 if machine else 0, "gpu_kind": machine}, warnings)
    assert out.gpu_kind == "A100"
    assert [w for w in warnings if w.startswith("capacity.gpu_kind")] == [
        f"capacity.gpu_kind: declared 'A100' differs from probed {quoted}; keeping the declared value"]
    assert not any("'none'" in w for w in warnings)
