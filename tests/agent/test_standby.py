"""Standby VMs: booted without their entry, claimed later (renamed, given the
entry) and started at once — what prewarm builds on."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import pytest

from agent_support import install_bundle, qemu_pids
from fuse.agent.backends.base import BackendError
from fuse.agent.vms import VmManager
from fuse.models.vm import ClaimRequest, CreateVmRequest

SHAPE = {"vcpus": 1, "mem_mib": 128}
HELLO = "echo hello-$((6*7))"


async def _standby(host, name: str) -> dict:
    r = await host.client.post("/v1/host/vms", json={"name": name, "shape": SHAPE, "standby": True})
    assert r.status_code == 201, r.text
    return r.json()


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


# -- real QEMU ----------------------------------------------------------------

@pytest.mark.qemu
async def test_a_claimed_standby_vm_runs_its_entry_under_its_new_name(make_host):
    host = await make_host()
    vm = await _standby(host, "pw-1")
    assert (vm["state"], vm["standby"], vm["entry"]) == ("running", True, "")
    assert vm["dir"].startswith("_sb-") and host.vms.vm_dir("pw-1").name == vm["dir"]
    assert host.vms.summary()["free_mem_mib"] == 4096 - 256 - 128  # it holds its memory
    r = await host.client.post("/v1/host/vms/pw-1/sleep")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")
    await host.wait_console("pw-1", lambda t: "FUSE-STANDBY" in t)

    t0 = time.monotonic()
    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"name": "job", "entry": HELLO})
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 1.0
    vm = r.json()
    assert (vm["name"], vm["standby"], vm["entry"], vm["history"][-1]["claimed_from"]) == \
        ("job", False, HELLO, "pw-1")
    text = await host.wait_console("job", lambda t: "FUSE-EXIT" in t, timeout=30)
    assert "hello-42" in text and "FUSE-EXIT 0" in text
    # The entry went in on COM2 with echo off: neither it nor its base64 is in the log.
    assert HELLO not in text and base64.b64encode(HELLO.encode()).decode() not in text
    assert (await host.wait_state("job", {"exited"}))["exit_status"] == 0
    assert (await host.client.get("/v1/host/vms/pw-1")).status_code == 404
    claimed = [e for e in host.vms.events.list() if e["type"] == "vm_claimed"]
    assert [(e["vm"], e["previous_name"]) for e in claimed] == [("job", "pw-1")]

    r = await host.client.post("/v1/host/vms/job/claim", json={"entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")
    assert "standby" in r.json()["error"]["message"]


@pytest.mark.qemu
async def test_a_claimed_vm_sleeps_and_wakes_on_its_command_line_and_deletes_clean(make_host):
    host = await make_host()
    await _standby(host, "pw-1")
    # Two claims at once: exactly one wins, whichever name it asked for.
    replies = await asyncio.gather(*(host.client.post("/v1/host/vms/pw-1/claim", json={
        "name": n, "entry": "echo counting; sleep 60"}) for n in ("a", "b")))
    assert sorted(r.status_code for r in replies) == [200, 409], [r.text for r in replies]
    name = next(r.json()["name"] for r in replies if r.status_code == 200)
    await host.wait_console(name, lambda t: "counting" in t)

    vm_dir = host.vms.vm_dir(name)
    booted = _cmdline(host.vms.get(name).pid)
    assert (await host.client.post(f"/v1/host/vms/{name}/sleep")).json()["state"] == "sleeping"
    assert not qemu_pids(str(vm_dir))
    vm = (await host.client.post(f"/v1/host/vms/{name}/wake")).json()
    assert vm["state"] == "running" and host.vms.vm_dir(name) == vm_dir
    woke = _cmdline(vm["pid"])
    assert woke.startswith(booted) and woke[len(booted):].startswith(b"-incoming\0")
    assert (await host.client.delete(f"/v1/host/vms/{name}")).status_code == 204
    assert not qemu_pids(str(host.vms.root)) and not vm_dir.exists()


async def _restarted(mgr: VmManager) -> VmManager:
    """The next agent on the same state dir (VMs outlive the one before)."""
    await mgr.close()
    nxt = VmManager(mgr.state_dir, "qemu", ram_mb=2048, cpus=2)
    await nxt.start()  # also kills processes no record accounts for: not these
    return nxt


@pytest.mark.qemu
async def test_standby_and_claimed_vms_are_adopted_by_a_restarted_agent(tmp_path, bundle_dir):
    install_bundle(bundle_dir, tmp_path / "host")
    mgr = VmManager(tmp_path / "host", "qemu", ram_mb=2048, cpus=2)
    await mgr.start()
    try:
        first = await mgr.create(CreateVmRequest(name="pw-1", shape=SHAPE, standby=True))
        mgr = await _restarted(mgr)
        vm = mgr.get("pw-1")
        assert (vm.state, vm.standby, vm.pid, vm.dir) == ("running", True, first.pid, first.dir)
        await mgr.claim("pw-1", ClaimRequest(name="job", entry="echo adopted-$((1+1)); sleep 60"))

        mgr = await _restarted(mgr)
        vm = mgr.get("job")
        assert (vm.state, vm.standby, vm.pid, vm.dir) == ("running", False, first.pid, first.dir)
        console = mgr.vm_dir("job") / "console.log"
        deadline = time.monotonic() + 30
        while "adopted-2" not in console.read_text():
            assert time.monotonic() < deadline, console.read_text()
            await asyncio.sleep(0.05)
    finally:
        for name in list(mgr.vms):
            await mgr.delete(name)
        await mgr.close()
    assert not qemu_pids(str(tmp_path))


async def test_standby_needs_a_backend_that_can_hand_an_entry_over(make_host):
    host = await make_host("fc", backend="firecracker")
    r = await host.client.post("/v1/host/vms", json={"shape": SHAPE, "standby": True})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument")
    assert "qemu backend" in r.json()["error"]["message"]


# -- the fake backend: the rules, fast ----------------------------------------

@pytest.mark.parametrize("body, says", [
    ({"shape": SHAPE}, "entry is required (unless standby)"),
    ({"shape": SHAPE, "standby": True, "entry": "true"}, "gets its entry when it is claimed"),
], ids=["an entry-less create that is not standby", "a standby create with an entry"])
async def test_a_create_is_refused_when_its_entry_does_not_fit_standby(make_host, body, says):
    host = await make_host(backend="fake")
    r = await host.client.post("/v1/host/vms", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument")
    assert says in r.json()["error"]["message"]


async def test_a_fake_standby_vm_is_claimed_renamed_and_metered_under_its_new_name(make_host):
    host = await make_host(backend="fake")
    await _standby(host, "pw-1")
    r = await host.client.post("/v1/host/vms/nope/claim", json={"entry": "true"})
    assert r.status_code == 404
    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"entry": "x" * 1301})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument")

    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"entry": "run-me"})
    assert r.status_code == 200 and r.json()["name"] == "pw-1"  # no new name: it keeps its own
    await host.wait_console("pw-1", lambda t: "fake vm: entry run-me" in t, timeout=10)
    await _standby(host, "pw-2")
    r = await host.client.post("/v1/host/vms/pw-2/claim", json={"name": "pw-1", "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "vm_exists")
    r = await host.client.post("/v1/host/vms/pw-2/claim", json={"name": "job", "entry": "run-me-too"})
    assert r.status_code == 200, r.text
    await host.wait_console("job", lambda t: "fake vm: entry run-me-too" in t, timeout=10)
    usage = (await host.client.get("/v1/host/usage", params={"from": 0})).json()
    assert sorted(row["vm"] for row in usage["vms"]) == ["job", "pw-1"]


async def test_a_claim_the_guest_does_not_take_leaves_the_vm_standby_under_its_name(make_host, monkeypatch):
    host = await make_host(backend="fake")
    await _standby(host, "pw-1")

    async def no_answer(spec, entry, timeout=60.0):
        raise BackendError("the guest did not answer")
    monkeypatch.setattr(host.vms.backend, "deliver_entry", no_answer)
    r = await host.client.post("/v1/host/vms/pw-1/claim", json={"name": "job", "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (500, "claim_failed")
    vm = (await host.client.get("/v1/host/vms/pw-1")).json()
    assert (vm["state"], vm["standby"], vm["entry"]) == ("running", True, "")
    assert (await host.client.get("/v1/host/vms/job")).status_code == 404
