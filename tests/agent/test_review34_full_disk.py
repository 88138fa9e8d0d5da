"""Review 34: a full disk under the agent's state dir loses nothing after the hypervisor acted.

A wake whose record cannot be written once its QEMU started stops that QEMU: the VM sleeps on
as it was, its move's mark, files and room kept, and the answer is 500 ``wake_failed`` (it was
500 ``internal`` with the woken QEMU left running behind a record saying sleeping: the next wake
ran the guest twice, and a move's target whose move id was dropped could not be aborted, so the
source's rollback ran the VM on both hosts). A sleep whose QEMU saved the state and quit but
whose record cannot be written leaves the VM asleep, in memory and (once there is room) on disk,
its mark telling a restarted agent so (it was 500 ``internal``, the VM put back to running,
recorded failed by the monitor, and a restart kept it failed: its memory lost)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import httpx
import pytest

from agent_support import COUNTER, counted, install_bundle, qemu_pids
from fuse.agent import vms as vms_mod
from fuse.agent.vms import VmManager
from fuse.models.vm import CreateVmRequest
from support import start_agent
from test_review22_agent import SHAPE, fill, tmpfs, unfill, wait_for

PAGE = 4096


def until(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


@pytest.mark.qemu
def test_a_wake_whose_record_the_full_disk_refuses_stops_its_qemu_and_the_vm_sleeps_on_held(
        tmp_path, bundle_dir, procs):
    # the state dir is the tmpfs (the agent's log is beside it, not on it)
    with tmpfs(tmp_path / "disk", "200m") as disk:
        install_bundle(bundle_dir, disk)
        agent = start_agent(tmp_path, name="disk")
        procs.append(agent)
        c = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=180)
        vm_dir = disk / "vms" / "w1"
        try:
            r = c.post("/v1/host/vms", json={"name": "w1", "shape": SHAPE, "entry": "sleep 100000"})
            assert r.status_code == 201, r.text
            # a quiet guest (its console takes no page while the disk is full)
            until(lambda: b"FUSE-ENTRY-START" in (vm_dir / "console.log").read_bytes(), "w1 never ran its entry")
            time.sleep(1)
            r = c.post("/v1/host/vms/w1/sleep", json={"move_id": "m1"})
            assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
            asleep = r.json()
            held = c.get("/v1/host").json()["vm_count"]
            # room for the wake's mark and QEMU's pid file, none for the record
            fill(disk)
            os.truncate(disk / "filler", os.path.getsize(disk / "filler") - 2 * PAGE)
            try:
                r = c.post("/v1/host/vms/w1/wake", json={"move_id": "m1"})
                # (was: 500 internal, the woken QEMU running on)
                assert r.status_code == 500 and r.json()["error"]["code"] == "wake_failed", r.text
                assert "record could not be written" in r.json()["error"]["message"]
                assert qemu_pids(str(vm_dir)) == []
                vm = c.get("/v1/host/vms/w1").json()
                assert (vm["state"], vm["pid"], vm["move_id"], vm["files"]) == (
                    "sleeping", None, "m1", asleep["files"])  # (was: move_id dropped, files gone)
                assert not (vm_dir / vms_mod.WAKE_MARK).exists()
                assert c.get("/v1/host").json()["vm_count"] == held
                # still its move's: another caller's delete is refused, as before the wake
                r = c.delete("/v1/host/vms/w1")
                assert r.status_code == 409 and r.json()["error"]["code"] == "move_in_progress", r.text
            finally:
                unfill(disk)
            # with room again the move's wake runs the guest once
            r = c.post("/v1/host/vms/w1/wake", json={"move_id": "m1"})
            assert r.status_code == 200 and r.json()["state"] == "running", r.text
            assert qemu_pids(str(vm_dir)) == [r.json()["pid"]]  # (was: two QEMUs of w1)
        finally:
            unfill(disk)
            for vm in c.get("/v1/host/vms").json()["vms"]:
                c.delete(f"/v1/host/vms/{vm['name']}", params={"move_id": vm["move_id"]} if vm["move_id"] else {})
            c.close()
            agent.stop()


@pytest.mark.qemu
async def test_a_sleep_whose_record_the_full_disk_refuses_leaves_the_vm_asleep_across_a_restart(
        tmp_path, bundle_dir, monkeypatch):
    with tmpfs(tmp_path / "disk", "200m") as disk:
        state = disk / "host"
        shutil.copytree(bundle_dir, state / "bundles" / bundle_dir.name)
        mgr = VmManager(state, "qemu", ram_mb=4096, cpus=2)
        await mgr.start()
        try:
            await mgr.create(CreateVmRequest.model_validate({"name": "s2", "shape": SHAPE, "entry": COUNTER}))
            vm_dir = mgr.vm_dir("s2")
            console = vm_dir / "console.log"
            await wait_for(lambda: len(counted(console.read_text())) >= 2, "s2 never counted", 60)
            # The disk fills in the sleep's last step: QEMU has written the state and quit (the
            # state file is described), and then the record cannot be written.
            describe, filled = vms_mod._describe, []

            def describe_then_fill(path):
                described = describe(path)
                if path.name == "state.bin" and not filled:
                    filled.append(fill(disk))
                return described
            monkeypatch.setattr(vms_mod, "_describe", describe_then_fill)
            vm = await mgr.sleep("s2", move_id="m2")  # (was: OSError, 500 internal)
            assert filled and (vm.state, vm.move_id, vm.pid) == ("sleeping", "m2", None)
            assert "state.bin" in [f.name for f in vm.files]
            before = len(counted(console.read_text()))
            await asyncio.sleep(1)  # (the monitor's ticks: it was recorded failed here)
            assert mgr.get("s2").state == "sleeping"
            # on disk: the last record, and the mark that says the sleep finished
            assert json.loads((vm_dir / "vm.json").read_text())["state"] == "running"
            assert json.loads((vm_dir / vms_mod.SLEEP_MARK).read_text()) == {"move_id": "m2"}
            # an agent restarted before there is room finds it asleep, its move's still
            await mgr.close()
            mgr = VmManager(state, "qemu", ram_mb=4096, cpus=2)
            await mgr.start()
            vm = mgr.get("s2")  # (was: failed, its mark dropped)
            assert (vm.state, vm.move_id, vm.move_role) == ("sleeping", "m2", "source")
            assert (vm_dir / vms_mod.SLEEP_MARK).exists()
            unfill(disk)
            # written once the disk has room; the mark goes with it
            await wait_for(lambda: json.loads((vm_dir / "vm.json").read_text())["state"] == "sleeping",
                           "its record was not written once the disk had room", 10)
            assert json.loads((vm_dir / "vm.json").read_text())["move_id"] == "m2"
            assert not (vm_dir / vms_mod.SLEEP_MARK).exists()
            # and nothing of the guest was lost: it counts on from where it slept
            assert (await mgr.wake("s2", move_id="m2")).state == "running"
            await wait_for(lambda: len(counted(console.read_text())) > before + 1, "s2 did not count on", 60)
            assert counted(console.read_text())[before] == counted(console.read_text())[before - 1] + 1
        finally:
            unfill(disk)
            for v in list(mgr.vms.values()):
                await mgr.delete(v.name, v.move_id)
            await mgr.close()
