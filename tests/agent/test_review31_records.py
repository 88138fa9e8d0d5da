"""Review 31: an agent starting over a VM record it cannot read, or over a delete the last
agent died in.

A torn ``vm.json`` was skipped without a word: the VM's running hypervisor was killed as an
orphan, and a create of its name wrote over its dir (a sleeping VM's memory). Now it is kept
aside (``vm.json.damaged-<time>``) with one ``vm_record_damaged`` event, its hypervisor runs
on, and its name is refused (409) while the dir holds it.

An agent killed inside a delete, after it stopped the VM's process and before it recorded
the VM deleted, left a VM the next agent read as ``failed``; the delete's mark in the VM's
dir now has the next agent finish it.

The kill is simulated in-process at a precise step, as in ``test_review16_crash``: the
step raises ``Crash`` (nothing after it runs, as after SIGKILL), the monitor stops, and a
fresh ``VmManager`` on the same state dir starts as a restarted agent does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from agent_support import install_bundle, qemu_pids
from support import fake_bundle
from fuse import http_errors
from fuse.agent.api.vms import router
from fuse.agent.backends.base import BackendError, pids_mentioning
from fuse.agent.vms import VmManager
from fuse.errors import Conflict
from fuse.models.vm import ClaimRequest, CreateVmRequest


class Crash(BaseException):
    """The agent dies here (a BaseException: no handler of the agent's own runs)."""


def _ask(name: str, **more) -> CreateVmRequest:
    return CreateVmRequest.model_validate({"name": name, "shape": {"vcpus": 1, "mem_mib": 128},
                                           "entry": "sleep 3600"} | more)


async def _agent(state: Path, backend: str = "fake") -> VmManager:
    if backend == "fake":
        fake_bundle(state)
    mgr = VmManager(state, backend, ram_mb=4096, cpus=2)
    await mgr.start()
    return mgr


async def _die(mgr: VmManager) -> None:
    """What SIGKILL leaves of an agent: nothing more runs or is written."""
    if mgr._monitor is not None:
        mgr._monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await mgr._monitor
    mgr.events.close()


def _events(mgr: VmManager, kind: str) -> list[dict]:
    return [e for e in mgr.events.list() if e["type"] == kind]


def _client(mgr: VmManager) -> httpx.AsyncClient:
    app = FastAPI()
    http_errors.install(app)
    app.include_router(router)
    app.state.vms, app.state.events = mgr, mgr.events
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")


def _processes(state: Path) -> list[int]:
    """The fake VMs' processes (any process naming the state dir)."""
    return pids_mentioning(state)


def _kill_all(state: Path) -> None:
    for pid in _processes(state) + qemu_pids(str(state)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def state(tmp_path):
    d = tmp_path / "host"
    yield d
    _kill_all(d)


# -- a torn record ---------------------------------------------------------------


async def test_a_sleeping_vms_torn_record_is_kept_aside_reported_once_and_its_name_refused(state):
    first = await _agent(state)
    await first.create(_ask("t"))
    await first.sleep("t")
    vm_dir = first.vm_dir("t")
    memory = {p.name: p.read_bytes() for p in (vm_dir / "state").iterdir()}
    assert memory
    await first.close()
    torn = (vm_dir / "vm.json").read_bytes()[:200]
    (vm_dir / "vm.json").write_bytes(torn)  # what a crash mid-write leaves

    second = await _agent(state)
    try:
        assert "t" not in second.vms
        (aside,) = vm_dir.glob("vm.json.damaged-*")
        assert aside.read_bytes() == torn and not (vm_dir / "vm.json").exists()
        (event,) = _events(second, "vm_record_damaged")
        assert (event["vm"], event["path"]) == ("t", str(aside))
        assert "could not be read" in event["reason"]

        async with _client(second) as c:
            r = await c.post("/v1/host/vms", json={"name": "t", "shape": {"vcpus": 1, "mem_mib": 128},
                                                   "entry": "true"})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "conflict"
        assert "damaged record" in r.json()["error"]["message"] and "vm.json" in r.json()["error"]["message"]
        assert {p.name: p.read_bytes() for p in (vm_dir / "state").iterdir()} == memory  # not written over
        assert aside.exists()
    finally:
        await second.close()

    third = await _agent(state)  # reported once: the record was put aside the first time
    try:
        assert len(_events(third, "vm_record_damaged")) == 1  # (the log holds the second agent's)
        with pytest.raises(Conflict):
            await third.create(_ask("t"))
        # a standby VM claimed under that name, or a move bringing one, is refused as well
        await third.create(_ask("sb", standby=True, entry=None))
        with pytest.raises(Conflict, match="damaged record"):
            await third.claim("sb", ClaimRequest(entry="true", name="t"))
        with pytest.raises(Conflict, match="damaged record"):
            third.check_free("t")
        # the operator removes the dir: the name is free again
        shutil.rmtree(vm_dir)
        assert (await third.create(_ask("t"))).state == "running"
    finally:
        for name in list(third.vms):
            await third.delete(name)
        await third.close()


async def test_a_torn_record_is_reported_once_not_at_every_start(state):
    first = await _agent(state)
    await first.create(_ask("t"))
    await first.sleep("t")
    await first.close()
    (first.vm_dir("t") / "vm.json").write_bytes(b"")  # a rename that landed before its data
    for _ in range(2):
        mgr = await _agent(state)
        await mgr.close()
    assert len(_events(mgr, "vm_record_damaged")) == 1


async def test_a_record_is_on_disk_before_it_replaces_the_last_one(state, monkeypatch):
    # renamed over the last record unwritten, a power cut left an empty or torn vm.json
    mgr = await _agent(state)
    try:
        vm = await mgr.create(_ask("s"))
        calls: list[tuple[str, str]] = []
        fsync, replace = os.fsync, os.replace

        def fsync_seen(fd):
            calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return fsync(fd)

        def replace_seen(src, dst):
            calls.append(("replace", str(dst)))
            return replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync_seen)
        monkeypatch.setattr(os, "replace", replace_seen)
        mgr.save(vm)
        monkeypatch.undo()
        record, tmp = mgr.vm_dir("s") / "vm.json", mgr.vm_dir("s") / "vm.tmp"
        assert calls == [("fsync", str(tmp)), ("replace", str(record)), ("fsync", str(record.parent))]
    finally:
        await mgr.delete("s")
        await mgr.close()


# -- a delete the agent died in ----------------------------------------------------


def _crash_at_transition(mgr: VmManager, to: str) -> None:
    real = mgr.transition

    def transition(vm, state, reason=None):
        if state == to:
            raise Crash
        return real(vm, state, reason)

    mgr.transition = transition


def _crash_before_stop(mgr: VmManager) -> None:
    async def stop(spec):
        raise Crash

    mgr.backend.stop = stop


@pytest.mark.parametrize("crash", [lambda mgr: _crash_at_transition(mgr, "deleted"), _crash_before_stop],
                         ids=["after its process was killed", "before its process was killed"])
@pytest.mark.parametrize("asleep", [False, True], ids=["running", "sleeping"])
async def test_a_delete_the_agent_died_in_is_finished_by_the_next_agent(state, crash, asleep):
    first = await _agent(state)
    await first.create(_ask("d"))
    if asleep:
        await first.sleep("d")
    vm_dir = first.vm_dir("d")
    crash(first)
    with pytest.raises(Crash):
        await first.delete("d")
    await _die(first)
    assert (vm_dir / "vm.json").exists()

    second = await _agent(state)
    try:
        assert "d" not in second.vms  # not failed: deleted, as asked
        assert not vm_dir.exists()
        assert not _processes(state)  # its process, had it survived, stopped
        (last,) = [e for e in _events(second, "vm_state") if e["vm"] == "d"][-1:]
        assert last["to"] == "deleted" and "delete" in last["reason"]
        assert not _events(second, "orphan_killed")
        assert second.metering._open_segment("d") is None
        assert (await second.create(_ask("d"))).state == "running"  # its name is free
    finally:
        for name in list(second.vms):
            await second.delete(name)
        await second.close()


async def test_a_delete_that_failed_leaves_no_mark_for_the_next_agent(state):
    first = await _agent(state)
    await first.create(_ask("k"))

    async def stop(spec):
        raise BackendError("process 1 did not exit within 10s")

    real, first.backend.stop = first.backend.stop, stop
    with pytest.raises(BackendError):
        await first.delete("k")
    assert not list(first.vm_dir("k").glob("delete.*"))  # (its mark)
    first.backend.stop = real
    await first.close()

    second = await _agent(state)
    try:
        assert second.get("k").state == "running"  # the delete failed: the VM is as it was
    finally:
        await second.delete("k")
        await second.close()


# -- real QEMU: the orphan sweep kills hypervisors, the fake's processes it leaves alone ----------


@pytest.mark.qemu
async def test_a_running_vms_torn_record_does_not_get_its_qemu_killed(tmp_path, bundle_dir):
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    first = await _agent(state, "qemu")
    vm = await first.create(_ask("q"))
    pid = vm.pid
    await first.close()
    path = first.vm_dir("q") / "vm.json"
    path.write_bytes(path.read_bytes()[:300])

    second = await _agent(state, "qemu")
    try:
        assert qemu_pids(str(first.vm_dir("q"))) == [pid]  # left running, not swept as an orphan
        assert not _events(second, "orphan_killed")
        (event,) = _events(second, "vm_record_damaged")
        assert event["vm"] == "q"
        with pytest.raises(Conflict, match="damaged record"):
            await second.create(_ask("q"))
        assert qemu_pids(str(first.vm_dir("q"))) == [pid]
    finally:
        await second.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if not qemu_pids(str(state)):
                break
            await asyncio.sleep(0.05)
