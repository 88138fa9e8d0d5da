"""A CPU pin of a running agent made the ordinary way, `taskset -cp LIST PID` (review 32,
finding 2): it changes the agent's main thread only, and the worker threads the agent
made before keep their old mask. A registration's fresh probe (run on such a thread)
still counted every CPU, and a QEMU started from one still ran on them all."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

import fuse
from fuse.agent import probe
from support import install_bundle, real_bundle_dir, start_agent, start_controller

CPUS = sorted(os.sched_getaffinity(0))  # (this test's main thread: the mask the agent starts with)

pytestmark = pytest.mark.skipif(
    len(CPUS) < 2 or probe.usable_cpus() < 2,
    reason=f"needs two usable CPUs to pin the agent to one of them (this process may use {probe.usable_cpus()})")


def allowed(pid: int) -> dict[int, str]:
    """Each thread of ``pid``: its Cpus_allowed_list."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        out[int(task.name)] = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                                   if line.startswith("Cpus_allowed_list:"))
    return out


def pin_main_thread(pid: int, cpu: int) -> None:
    """`taskset -cp CPU PID`, as an operator types it: the main thread alone."""
    if shutil.which("taskset"):
        subprocess.run(["taskset", "-cp", str(cpu), str(pid)], check=True, capture_output=True)
    else:  # (the same call taskset makes)
        os.sched_setaffinity(pid, {cpu})
    # The case in question: a thread the agent made before still runs on every CPU.
    masks = allowed(pid)
    assert masks[pid] == str(cpu) and len(set(masks.values())) > 1, masks


def test_a_registration_after_taskset_p_stores_the_cpus_the_agent_may_still_use(tmp_path, procs):
    procs.append(agent := start_agent(tmp_path, backend="fake", name="a1"))
    procs.append(ctl := start_controller(tmp_path))

    def register() -> int:
        with fuse.Client(ctl.url) as client:
            return client.hosts.register(fuse.RegisterHostRequest(
                id="h1", url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=4))).capacity.cpus

    assert register() == probe.usable_cpus()  # (its fresh probe ran on a worker thread)
    pin_main_thread(agent.popen.pid, CPUS[-1])
    # (was: 2, the worker thread's mask, without a warning)
    assert register() == 1
    facts = httpx.get(agent.url + "/v1/host", params={"fresh": "true"},
                      headers={"Authorization": f"Bearer {agent.token}"}, timeout=30).json()
    assert facts["cpus"] == 1


@pytest.mark.qemu
@pytest.mark.timeout(300)
def test_a_qemu_vm_started_after_taskset_p_runs_on_the_cpus_the_agent_was_pinned_to(tmp_path, procs):
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    install_bundle(real_bundle_dir(), tmp_path / "real")  # before the agent starts: it lists bundles at boot
    procs.append(agent := start_agent(tmp_path, backend="qemu", name="real"))
    vms = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=120)

    def qemu_masks(name: str) -> set[str]:
        r = vms.post("/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 128},
                                           "entry": "while true; do sleep 1; done"})
        assert r.status_code == 201, r.text
        pid = r.json()["pid"]
        assert "qemu-system" in Path(f"/proc/{pid}/cmdline").read_text()
        return set(allowed(pid).values())

    try:
        # No pin: as ever, where the agent runs (where this test runs: it inherited the mask).
        assert qemu_masks("before") == {allowed(os.getpid())[os.getpid()]}
        pin_main_thread(agent.popen.pid, CPUS[-1])
        # (was: {"0-1"}: the worker thread's mask)
        assert qemu_masks("after") == {str(CPUS[-1])}
    finally:
        for name in ("before", "after"):
            vms.delete(f"/v1/host/vms/{name}")
        vms.close()
