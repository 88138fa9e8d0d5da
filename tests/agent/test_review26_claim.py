"""Twenty-sixth session: a claim in flight keeps the standby VM's old name, and a standby VM whose
entry's delivery was cut off takes no other entry."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agent_support import qemu_pids
from fuse.agent.backends.base import EntryCutOff
from fuse.agent.vms import DELIVERING, VmManager
from fuse.models.vm import CreateVmRequest
from test_standby import SHAPE, _restarted, _standby


async def test_a_standby_vms_name_is_not_free_while_a_claim_of_it_is_in_flight(make_host, monkeypatch):
    """(was: a create took the old name during the claim's delivery; the claim failed and put the
    standby back under that name over the new VM's record: its QEMU ran on, unlisted, unstoppable,
    and its memory uncounted; with a claim that succeeded the two VMs' usage rows were swapped)"""
    from fuse.agent.backends.base import BackendError

    host = await make_host(backend="fake")
    await _standby(host, "pw-1")
    delivering, release = asyncio.Event(), asyncio.Event()

    async def slow(spec, entry, timeout=60.0):
        delivering.set()
        await release.wait()
        raise BackendError("the guest did not answer")
    monkeypatch.setattr(host.vms.backend, "deliver_entry", slow)
    claim = asyncio.create_task(host.client.post("/v1/host/vms/pw-1/claim", json={"name": "job", "entry": "true"}))
    await delivering.wait()
    r = await asyncio.wait_for(host.client.post("/v1/host/vms", json={
        "name": "pw-1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 60"}), 20)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "vm_exists"), r.text
    assert "being claimed" in r.json()["error"]["message"]
    release.set()
    r = await claim
    assert (r.status_code, r.json()["error"]["code"]) == (500, "claim_failed")
    vms = {v["name"]: v for v in (await host.client.get("/v1/host/vms")).json()["vms"]}
    assert list(vms) == ["pw-1"] and (vms["pw-1"]["standby"], vms["pw-1"]["shape"]["mem_mib"]) == (True, 128)


async def test_a_standby_vm_whose_entry_was_cut_off_in_delivery_is_ended_not_offered_again(make_host, monkeypatch):
    host = await make_host(backend="fake")
    await _standby(host, "pw-1")

    async def cut(spec, entry, timeout=60.0):
        raise EntryCutOff("vm job did not show FUSE-ENTRY-START within 15 s")
    monkeypatch.setattr(host.vms.backend, "deliver_entry", cut)
    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"name": "job", "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (500, "claim_failed")
    assert "takes no other" in r.json()["error"]["message"]
    vm = (await host.client.get("/v1/host/vms/pw-1")).json()
    assert (vm["state"], vm["standby"], vm["ready"], vm["pid"]) == ("failed", False, False, None), vm
    assert "cut off" in vm["reason"]
    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"name": "job", "entry": "true"})
    assert r.status_code == 409


@pytest.mark.qemu
@pytest.mark.timeout(180)
async def test_a_real_guest_that_did_not_start_its_entry_in_time_is_stopped_not_given_the_next_one(make_host):
    """(was: its guest kept the first bytes of the first entry's line, the VM was offered ready
    again, and the next claim's guest ran `echo Fecho SECOND-ENTRY` where its record said
    `echo SECOND-ENTRY`)"""
    host = await make_host()
    await _standby(host, "pw-1")
    await host.wait_console("pw-1", lambda t: "FUSE-STANDBY" in t, timeout=120)
    pid = host.vms.get("pw-1").pid
    os.kill(pid, signal.SIGSTOP)  # (a guest too slow to take its entry on a loaded host)
    try:
        r = await host.client.post("/v1/host/vms/pw-1/claim", json={"name": "first", "entry": "echo FIRST"})
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (r.status_code, r.json()["error"]["code"]) == (500, "claim_failed"), r.text
    vm = (await host.client.get("/v1/host/vms/pw-1")).json()
    assert (vm["state"], vm["standby"]) == ("failed", False), vm
    deadline = time.monotonic() + 20
    while pid in qemu_pids(str(host.vms.root)):
        assert time.monotonic() < deadline, "its QEMU still runs"
        await asyncio.sleep(0.1)
    assert (await host.client.get("/v1/host/vms/first")).status_code == 404


@pytest.mark.qemu
@pytest.mark.timeout(180)
async def test_a_standby_vm_an_agent_died_delivering_to_is_ended_by_the_next_agent(tmp_path, bundle_dir):
    from agent_support import install_bundle

    install_bundle(bundle_dir, tmp_path / "host")
    mgr = VmManager(tmp_path / "host", "qemu", ram_mb=2048, cpus=2)
    await mgr.start()
    try:
        vm = await mgr.create(CreateVmRequest(name="pw-1", shape=SHAPE, standby=True))
        other = await mgr.create(CreateVmRequest(name="pw-2", shape=SHAPE, standby=True))
        (mgr.root / vm.dir / DELIVERING).touch()  # as a claim leaves it when its agent dies mid-delivery
        mgr = await _restarted(mgr)
        ended = mgr.get("pw-1")
        assert (ended.state, ended.standby, ended.pid) == ("failed", False, None), ended
        assert vm.pid not in qemu_pids(str(tmp_path)) and not (mgr.root / vm.dir / DELIVERING).exists()
        kept = mgr.get("pw-2")  # (one with no delivery under way is adopted as it was)
        assert (kept.state, kept.standby, kept.pid) == ("running", True, other.pid)
    finally:
        for name in list(mgr.vms):
            await mgr.delete(name)
        await mgr.close()
    assert not qemu_pids(str(tmp_path))
