"""The agent is a real process (`fuse host serve`): restart it under running
VMs and they are adopted, not lost or orphaned."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import httpx
import pytest

from agent_support import COUNTER, counted, install_bundle, qemu_pids
from fuse.agent.backends.base import BootSpec
from fuse.agent.backends.qemu import QemuBackend, qmp_path, qmp_session
from fuse.agent.bundle import get_bundle
from fuse.agent.vms import VmManager
from fuse.models.vm import CreateVmRequest
from support import start_agent, wait_until

pytestmark = pytest.mark.qemu


def test_restarting_the_agent_keeps_its_vms(tmp_path, bundle_dir):
    install_bundle(bundle_dir, tmp_path / "agent")
    agent = start_agent(tmp_path)
    auth = {"Authorization": f"Bearer {agent.token}"}
    try:
        with httpx.Client(base_url=agent.url, headers=auth, timeout=30) as c:
            r = c.post("/v1/host/vms", json={"name": "keep", "shape": {"vcpus": 1, "mem_mib": 128},
                                             "entry": COUNTER})
            assert r.status_code == 201, r.text
            pid = r.json()["pid"]
            host = c.get("/v1/host").json()
            assert host["vm_count"] == 1 and host["bundles"][0]["name"] == "linux"
            assert host["free_mem_mib"] <= host["ram_mb"] - 256 - 128
            wait_until(lambda: len(counted(c.get("/v1/host/vms/keep/console").json()["text"])) >= 2,
                       timeout=60, what="the guest counting")
            last_event = c.get("/v1/host/events").json()["last_id"]

        agent.stop(signal.SIGKILL)  # no goodbye: the VM must not depend on one
        assert qemu_pids(str(agent.state_dir)) == [pid]

        agent = start_agent(tmp_path)
        with httpx.Client(base_url=agent.url, headers=auth, timeout=30) as c:
            vm = c.get("/v1/host/vms/keep").json()
            assert (vm["state"], vm["pid"]) == ("running", pid)
            events = c.get("/v1/host/events", params={"since": last_event}).json()["events"]
            assert [e["type"] for e in events] == ["vm_adopted"] and events[0]["id"] == last_event + 1
            before = len(counted(c.get("/v1/host/vms/keep/console").json()["text"]))
            wait_until(lambda: len(counted(c.get("/v1/host/vms/keep/console").json()["text"])) > before + 2,
                       timeout=30, what="the adopted guest counting on")
            # Still fully managed after adoption: sleep, wake, delete.
            assert c.post("/v1/host/vms/keep/sleep").json()["state"] == "sleeping"
            assert c.post("/v1/host/vms/keep/wake").json()["state"] == "running"
            assert c.delete("/v1/host/vms/keep").status_code == 204
            assert c.get("/v1/host").json()["vm_count"] == 0
        assert not qemu_pids(str(agent.state_dir))
    finally:
        agent.stop()


async def test_a_vm_caught_mid_sleep_by_an_agent_crash_runs_on_after_adoption(tmp_path, bundle_dir):
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    first = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await first.start()
    second = None
    try:
        await first.create(CreateVmRequest.model_validate(
            {"name": "c", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER}))
        console = first.vm_dir("c") / "console.log"
        while len(counted(console.read_text())) < 2:
            await asyncio.sleep(0.05)
        # What a crash between `stop` and the state file leaves: a paused guest.
        async with qmp_session(qmp_path(first.vm_dir("c"))) as qmp:
            await qmp.execute("stop")
        await first.close()

        second = VmManager(state, "qemu", ram_mb=2048, cpus=2)
        await second.start()
        assert second.get("c").state == "running"
        before = len(counted(console.read_text()))
        for _ in range(100):
            if len(counted(console.read_text())) > before + 2:
                break
            await asyncio.sleep(0.05)
        assert counted(console.read_text()) == list(range(len(counted(console.read_text()))))
        assert len(counted(console.read_text())) > before + 2
    finally:
        mgr = second or first
        await mgr.delete("c")
        await mgr.close()


async def test_a_hypervisor_process_no_record_accounts_for_is_killed_on_start(tmp_path, bundle_dir):
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    b = get_bundle(state, "linux")
    backend = QemuBackend(accel="tcg")
    ghost = BootSpec(name="ghost", vm_dir=state / "vms" / "ghost", vcpus=1, mem_mib=128, entry="sleep 600",
                     kernel=b.vmlinux, initrd=b.initrd, platform=backend.platform())
    pid = await backend.start(ghost)
    assert qemu_pids(str(ghost.vm_dir)) == [pid]

    mgr = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await mgr.start()
    try:
        assert not qemu_pids(str(ghost.vm_dir))
        assert [(e["type"], e["vm"], e["pid"]) for e in mgr.events.list()] == [("orphan_killed", "ghost", pid)]
    finally:
        await mgr.close()


async def _run_and_stop(tmp_path, bundle_dir, name: str, entry: str):
    """A host's state dir with VM ``name`` running ``entry``, its agent stopped."""
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    first = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await first.start()
    await first.create(CreateVmRequest.model_validate(
        {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": entry}))
    await first.close()
    return state


async def test_a_vm_that_ends_while_the_agent_is_down_is_metered_to_its_end(tmp_path, bundle_dir):
    # its guest reported its exit: it ran until then, not until the agent came back
    state = await _run_and_stop(tmp_path, bundle_dir, "short", "echo hi; sleep 1; exit 3")  # down while it ends
    while qemu_pids(str(state / "vms" / "short")):
        await asyncio.sleep(0.1)
    ended = time.time()
    await asyncio.sleep(3)
    second = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await second.start()
    try:
        vm = second.get("short")
        assert (vm.state, vm.exit_status) == ("exited", 3)
        (row,) = second.metering.usage()["vms"]
        seg = second.metering.segments[0]
        assert seg["end"] <= ended + 0.5, (seg, ended)  # not the restart's time, 3 s later
        assert row["wall_seconds"] >= 1
    finally:
        await second.delete("short")
        await second.close()


async def test_a_vm_killed_while_the_agent_is_down_is_metered_to_when_it_was_last_seen(tmp_path, bundle_dir):
    # (found by a black-box review of issue 3: with no exit reported, its wall seconds and
    # MiB·s ran to the restart that found it gone: an agent down an hour billed the hour)
    import os

    state = await _run_and_stop(tmp_path, bundle_dir, "held", "sleep 600")
    (pid,) = qemu_pids(str(state / "vms" / "held"))
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    while qemu_pids(str(state / "vms" / "held")):
        await asyncio.sleep(0.05)
    await asyncio.sleep(4)  # the agent is down for a while after the VM died
    second = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await second.start()
    try:
        assert second.get("held").state == "failed"
        seg = second.metering.segments[0]
        assert seg["end"] <= killed + 0.5, (seg, killed)  # not the restart's time, 4 s later
        assert seg["end"] >= seg["start"]
    finally:
        await second.delete("held")
        await second.close()


async def test_an_orphan_killed_on_start_is_metered_no_longer(tmp_path, bundle_dir):
    state = await _run_and_stop(tmp_path, bundle_dir, "lost", "sleep 600")
    (state / "vms" / "lost" / "vm.json").unlink()  # its record gone: the process is an orphan now
    second = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await second.start()
    try:
        assert not qemu_pids(str(state / "vms" / "lost"))
        before = second.metering.usage()["totals"]["wall_seconds"]
        await asyncio.sleep(1.5)
        assert second.metering.usage()["totals"]["wall_seconds"] == before
    finally:
        await second.close()


def test_the_agent_reaps_its_vms_qemu_at_once(tmp_path, bundle_dir):
    # QEMU daemonizes; `fuse host serve` is its subreaper, so a deleted or finished
    # VM leaves no zombie for init to collect (ps would still list it a while)
    install_bundle(bundle_dir, tmp_path / "agent")
    agent = start_agent(tmp_path)
    try:
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=60) as c:
            pids = {}
            for name, entry in (("kept", "sleep 600"), ("done", "echo bye")):
                r = c.post("/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": entry})
                assert r.status_code == 201, r.text
                pids[name] = r.json()["pid"]
                assert Path(f"/proc/{pids[name]}/status").read_text().split("PPid:")[1].split()[0] == str(
                    agent.popen.pid)  # the agent's child, not init's
            assert c.delete("/v1/host/vms/kept").status_code == 204
            assert not Path(f"/proc/{pids['kept']}").exists()  # gone, not a zombie
            wait_until(lambda: c.get("/v1/host/vms/done").json()["state"] == "exited", timeout=60, what="exit")
            wait_until(lambda: not Path(f"/proc/{pids['done']}").exists(), timeout=2, what="reaped")
            c.delete("/v1/host/vms/done")
    finally:
        agent.stop()


# Busy for some seconds under TCG, then done: it outlives the agent killed meanwhile.
BURN = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exit 0"


def test_cpu_seconds_once_reported_survive_a_crash_and_the_vm_ending_meanwhile(tmp_path, bundle_dir):
    # Its QEMU ends while no agent runs: /proc has nothing left to read, so the CPU
    # seconds are what the last agent put on disk -- at least what it reported
    install_bundle(bundle_dir, tmp_path / "agent")
    agent = start_agent(tmp_path)
    auth = {"Authorization": f"Bearer {agent.token}"}
    vm_dir = agent.state_dir / "vms" / "burn"

    def row(c: httpx.Client) -> dict:
        return next((r for r in c.get("/v1/host/usage").json()["vms"] if r["vm"] == "burn"), {})

    try:
        with httpx.Client(base_url=agent.url, headers=auth, timeout=30) as c:
            r = c.post("/v1/host/vms", json={"name": "burn", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": BURN})
            assert r.status_code == 201, r.text
            pid = r.json()["pid"]
            reported = wait_until(lambda: row(c).get("cpu_seconds", 0) >= 1.0 and row(c), timeout=60,
                                  what="a second of CPU")
        agent.stop(signal.SIGKILL)
        assert qemu_pids(str(vm_dir)), "the vm ended before the agent died: nothing tested"
        # gone from /proc altogether: collected, not a zombie whose CPU figures can still be read
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=120, what="the vm ending while no agent runs")

        agent = start_agent(tmp_path)
        with httpx.Client(base_url=agent.url, headers=auth, timeout=30) as c:
            vm = c.get("/v1/host/vms/burn").json()
            assert (vm["state"], vm["exit_status"]) == ("exited", 0)
            after = row(c)
            for figure in ("cpu_seconds", "wall_seconds", "mem_mib_seconds"):
                assert after[figure] >= reported[figure], (figure, reported, after)
            assert c.delete("/v1/host/vms/burn").status_code == 204
    finally:
        agent.stop()


async def test_a_vm_the_agent_died_booting_is_metered_from_its_process_start(tmp_path, bundle_dir):
    # The agent dies after QEMU started but before create opened the VM's segment:
    # the next agent adopts the VM and meters it from its process's start, not from then
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    first = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await first.start()
    real_start = first.backend.start
    booted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def start_then_die(spec):
        booted.set_result(await real_start(spec))
        await asyncio.Event().wait()  # the agent is gone from here on

    first.backend.start = start_then_die
    create = asyncio.create_task(first.create(CreateVmRequest.model_validate(
        {"name": "mid", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600"})))
    second = None
    try:
        pid = await asyncio.wait_for(booted, 60)
        started = time.time()
        await asyncio.sleep(2)  # unmetered by the first agent
        for task in (create, first._monitor):  # what its crash leaves: nothing more written
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        first.events.close()
        assert first.get("mid").state == "creating" and first.metering._open_segment("mid") is None

        second = VmManager(state, "qemu", ram_mb=2048, cpus=2)
        await second.start()
        assert (second.get("mid").state, second.get("mid").pid) == ("running", pid)
        seg = second.metering._open_segment("mid")
        assert seg["start"] <= started
        (row,) = second.metering.usage()["vms"]
        assert row["wall_seconds"] >= 2 and row["mem_mib_seconds"] == 128 * row["wall_seconds"]
    finally:
        if second is not None:
            await second.delete("mid")
            await second.close()
        else:  # (no_qemu_left kills what it left)
            for task in (create, first._monitor):
                task.cancel()
