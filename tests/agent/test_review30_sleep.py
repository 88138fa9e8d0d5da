"""Review 30: a move's sleep reads no bundle file, so a running VM whose bundle is gone (or not
this fuse's) still moves and drains (it was 500 bundle_missing; a plain sleep is still refused,
since nothing could wake it there); and a move's
sleep whose console copy the disk has no room for records the VM asleep (it was recorded
running with no process left, its move `failed`)."""

from __future__ import annotations

import errno
import shutil

import pytest

from agent_support import COUNTER, counted
from fuse.models.vm import CreateVmRequest
from support import fake_bundle
from test_review22_agent import SHAPE, fake_agent, wait_for
from fuse.agent import vms as vms_mod


async def test_a_vm_whose_bundle_is_gone_still_sleeps_fake(tmp_path):
    state = tmp_path / "host"
    async with fake_agent(state) as mgr:
        await mgr.create(CreateVmRequest.model_validate({"name": "b", "shape": SHAPE, "entry": "x"}))
        shutil.rmtree(state / "bundles" / "linux")
        with pytest.raises(vms_mod.FuseError) as err:  # (a plain sleep: nothing could wake it here)
            await mgr.sleep("b")
        assert err.value.code == "bundle_missing" and mgr.get("b").state == "running"
        assert (await mgr.sleep("b", move_id="mv-1")).state == "sleeping"  # (was: 500 bundle_missing)
        fake_bundle(state)


@pytest.mark.qemu
async def test_a_real_vm_whose_bundle_is_gone_sleeps_for_its_move_and_wakes_once_it_is_back(tmp_path, bundle_dir):
    state = tmp_path / "host"
    shutil.copytree(bundle_dir, state / "bundles" / bundle_dir.name)
    async with fake_agent(state, backend="qemu") as mgr:
        await mgr.create(CreateVmRequest.model_validate({"name": "c", "shape": SHAPE, "entry": COUNTER}))
        console = mgr.vm_dir("c") / "console.log"
        await wait_for(lambda: len(counted(console.read_text())) >= 2, "c never counted", 60)
        shutil.move(state / "bundles" / bundle_dir.name, tmp_path / "away")
        assert (await mgr.sleep("c", move_id="mv-3")).state == "sleeping"  # (a move's: its target wakes it)
        shutil.move(tmp_path / "away", state / "bundles" / bundle_dir.name)
        before = len(counted(console.read_text()))
        assert (await mgr.wake("c", move_id="mv-3", if_marked=True)).state == "running"  # (the move home)
        await wait_for(lambda: len(counted(console.read_text())) > before + 1, "c did not count on", 60)


async def test_a_moves_sleep_whose_console_copy_finds_no_room_still_records_the_vm_asleep(tmp_path, monkeypatch):
    state = tmp_path / "host"
    async with fake_agent(state) as mgr:
        await mgr.create(CreateVmRequest.model_validate({"name": "m", "shape": SHAPE, "entry": "x"}))
        (mgr.vm_dir("m") / "console.log").write_text("printed before the move\n")

        def full(src, dst, *a, **kw):
            open(dst, "wb").close()  # (a partial copy, then the disk is full)
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(vms_mod.shutil, "copyfile", full)
        vm = await mgr.sleep("m", move_id="mv-2")  # (was: OSError, the VM recorded running with no process)
        assert vm.state == "sleeping" and vm.move_id == "mv-2"
        assert vms_mod.MOVED_CONSOLE not in [f.name for f in vm.files]
        assert not (mgr.vm_dir("m") / "state" / vms_mod.MOVED_CONSOLE).exists()
