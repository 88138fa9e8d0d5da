"""Thirty-fifth session (review of issue 8, mlos_bench `FuseVMService`): the check made before a
VM is deleted to be recreated did not follow the controller's placement, so the VM was
deleted and the create then refused (fleet_full, or 400 for a bundle), leaving the trial no
VM, a sleeping one its saved state lost with it:

- F1: a machine registered under two names and cordoned under one takes no work under the
  other, and a host under memory pressure takes none; the check read each name's own state;
- F2: a host whose agent has no guest bundle (`bundles: []`) counted as having the trial's;
- F3: a VM on the machine vmHost names, registered under another id, was FAILED on every
  provision when asleep ("same_host") and recreated for nothing when running.

Real controller and agents (fake backend: no guest needs to boot)."""

from __future__ import annotations

import pytest

pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

import fuse  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402

from fuse.integrations.mlos import OP_KEY, FuseVMService  # noqa: E402
from support import fake_bundle, reap, start_agent, start_controller, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(150)

def _port() -> int:
    """A free loopback port below the ephemeral range (no connection of the test's own takes it)."""
    from support import free_port
    return free_port()


def fake_agent_on(tmp, name: str, port: int | None = None, **kw):
    """A fake-backend agent on a port of this file's range (another, should one be taken
    between the look and the agent's bind)."""
    for _ in range(3):
        try:
            return start_agent(tmp, backend="fake", name=name, port=port or _port(), **kw)
        except RuntimeError as err:
            if "taken" not in str(err) or port:
                raise
    raise RuntimeError(f"agent {name}: every port tried was taken")


@pytest.fixture
def fleet(tmp_path):
    """h1 (agent a1: bundle linux), h2 and h2b (agent a2, one machine under two names: bundles
    linux and only2), h7 (agent a7: no bundle at all); each declares 4096 MiB (h7 8192) and 8
    VMs."""
    ctl = start_controller(tmp_path)
    fake_bundle(tmp_path / "a2", "only2", "fake-bundle-0002")
    agents = {n: fake_agent_on(tmp_path, n) for n in ("a1", "a2", "a7")}
    for d in (tmp_path / "a7" / "bundles").iterdir():  # (start_agent gives a fake agent bundle linux)
        (d / "manifest.json").unlink()
        d.rmdir()
    client = fuse.Client(ctl.url)
    for host, agent in (("h1", "a1"), ("h2", "a2"), ("h2b", "a2"), ("h7", "a7")):
        client.hosts.register(fuse.RegisterHostRequest(
            id=host, url=agents[agent].url, token=agents[agent].token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=8, ram_mb=8192 if host == "h7" else 4096, cpus=4)))
    wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="every host answering")
    wait_until(lambda: client.hosts.get("h7").bundles == [], timeout=30, what="h7 listing no bundle")
    f = type("Fleet", (), {"ctl": ctl, "client": client, "agents": agents, "tmp": tmp_path})
    yield f
    client.close()
    for p in (*f.agents.values(), ctl):
        p.stop()
    reap(tmp_path)


def service(fleet) -> FuseVMService:
    return FuseVMService({"url": fleet.ctl.url, "pollInterval": 0.05, "pollTimeout": 30})


def provision(svc, params) -> tuple[Status, dict]:
    status, out = svc.provision_host(params)
    if status.is_pending():
        assert OP_KEY in out
        status, out = svc.wait_host_deployment(out, is_setup=True)
    return status, out


def where(client) -> list[tuple[str, str, str]]:
    return sorted((v["name"], v["host"], v["state"]) for v in client.vms.list())


def placed(client) -> list[tuple[str, str, int]]:
    return [(e["vm"], e["host"], e["mem_mib"]) for e in client.events.list(0, limit=500)["events"]
            if e["type"] == "placed"]


# ---- F1: a machine cordoned under another name; memory pressure --------------------------
@pytest.mark.parametrize("how", ["pinned", "unpinned", "sleeping"])
def test_a_recreate_on_a_machine_cordoned_under_another_name_keeps_the_vm(fleet, caplog, how):
    """h2b cordoned: placement takes nothing on h2 either ("host is cordoned (as h2b: the same
    machine)"). Unpinned, bundle only2 is on that machine alone."""
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmBundle": "only2", "vmHost": "h2"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        if how != "pinned":
            del p["vmHost"]
        if how == "sleeping":
            assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        fleet.client.hosts.cordon("h2b")
        before = where(fleet.client)
        assert before == [("keep", "h2", "sleeping" if how == "sleeping" else "running")]
        assert provision(svc, {**p, "memMiB": 256})[0] == Status.FAILED
        assert "is cordoned as h2b (the same machine" in caplog.text and "is kept" in caplog.text
        assert where(fleet.client) == before  # (it was deleted, then the create fleet_full)
        assert placed(fleet.client) == [("keep", "h2", 128)]  # never deleted, never recreated
        fleet.client.hosts.uncordon("h2b")
        # the machine active again under every name: the new shape is recreated there
        status, info = provision(svc, {**p, "memMiB": 256})
        assert status == Status.SUCCEEDED and info["vmHost"] in ("h2", "h2b"), caplog.text
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})


def test_a_recreate_on_a_host_under_memory_pressure_keeps_the_vm(fleet, caplog):
    """Placement passes a host under memory pressure by, whatever room its figures show; the
    check counted the old VM's memory as freed there and found room for a shape of the same
    memory. The pressure: a1 restarted with a host reserve above what the machine has
    available (its agent then says memory_pressure)."""
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        a1 = fleet.agents["a1"]
        a1.stop()
        fleet.agents["a1"] = fake_agent_on(fleet.tmp, "a1", port=int(a1.url.rsplit(":", 1)[1]),
                                           extra=["--reserve-mib", str(1 << 40)])
        wait_until(lambda: (h := fleet.client.hosts.get("h1")).connected and h.memory_pressure, timeout=30,
                   what="h1 under memory pressure")
        before = where(fleet.client)
        assert before == [("keep", "h1", "running")]
        assert provision(svc, {**p, "vcpus": 2})[0] == Status.FAILED
        assert "vmHost h1 is under memory pressure" in caplog.text and "is kept running on h1" in caplog.text
        assert where(fleet.client) == before
        assert placed(fleet.client) == [("keep", "h1", 128)]
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})


# ---- F2: an agent with no bundle at all ---------------------------------------------------
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_a_host_whose_agent_has_no_bundle_is_no_room_for_a_recreate(fleet, caplog, pinned):
    """h7's agent lists `bundles: []`: placement passes it by ("host has no bundle linux"),
    and a create pinned there is 400. Unpinned, h2 and h2b are cordoned and h1 has not the
    memory of the new shape: only h7 (8192 MiB) had "room"."""
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        if pinned:
            change = {**p, "vmHost": "h7"}
            says = "bundle linux is on no vmHost h7"
        else:
            for h in ("h2", "h2b"):
                fleet.client.hosts.cordon(h)
            change = {"vmName": "keep", "vcpus": 1, "memMiB": 5000}
            # (h1's memory, the old VM's counted: h7, with the room, is no candidate)
            says = "5000 MiB asked, at most 4096 MiB free (on any host, on h1)"
        assert provision(svc, change)[0] == Status.FAILED
        assert says in caplog.text and "is kept running on h1" in caplog.text
        assert where(fleet.client) == [("keep", "h1", "running")]
        assert placed(fleet.client) == [("keep", "h1", 128)]
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})


# ---- F3: vmHost names the VM's own machine under another id --------------------------------
@pytest.mark.parametrize("asleep", [False, True], ids=["running", "sleeping"])
def test_a_vm_on_the_machine_vmhost_names_under_another_id_stays_there(fleet, caplog, asleep):
    """The controller counts a VM on h2 as on h2b already (a move there is 409 same_host): a
    sleeping one is woken where it is, a running one kept; a new shape is still recreated,
    on h2b as asked, the old VM's room on the machine counted free."""
    svc = service(fleet)
    with svc:
        p = {"vmName": "vm", "vcpus": 1, "memMiB": 128, "vmHost": "h2"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        if asleep:
            assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        status, info = provision(svc, {**p, "vmHost": "h2b"})
        assert status == Status.SUCCEEDED, caplog.text
        assert where(fleet.client) == [("vm", "h2", "running")]
        assert placed(fleet.client) == [("vm", "h2", 128)]  # woken or kept, never recreated
        # again: nothing to do, at once
        assert svc.provision_host({**p, "vmHost": "h2b"}) == (Status.SUCCEEDED, {})
        # h2b's policy down to one VM: the machine holds one (this one), which the recreate frees
        h2b = fleet.client.hosts.get("h2b")
        fleet.client.hosts.register(fuse.RegisterHostRequest(
            id="h2b", url=h2b.url, token="agent-token", backend="qemu",
            capacity=fuse.HostCapacity(vm_count=1, ram_mb=4096, cpus=4)))
        wait_until(lambda: fleet.client.hosts.get("h2b").free_vm_slots == 0, timeout=20, what="h2b full")
        status, info = provision(svc, {**p, "vmHost": "h2b", "memMiB": 256})
        assert (status, info["vmHost"]) == (Status.SUCCEEDED, "h2b"), caplog.text
        assert where(fleet.client) == [("vm", "h2b", "running")]
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})
