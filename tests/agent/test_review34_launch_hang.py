"""A QEMU launch that never returns (its process stopped or hung before it reported being set
up) fails within the launch's deadline as the documented error: a wake 500 ``wake_failed``, the VM
sleeping with its room given back, a create 500 ``boot_failed``, its record failed; and no QEMU of
either is left running. (Was: 500 ``internal`` with a ``TimeoutExpired`` traceback after 60 s, the
wake's room kept, the create's record stuck ``creating``.)"""

from __future__ import annotations

import os
import shutil
import threading
import time

import httpx
import pytest

from fuse.agent.backends.base import pids_mentioning
from support import install_bundle, real_bundle_dir, start_agent, wait_until

SHAPE = {"vcpus": 1, "mem_mib": 128}


def _hanging_qemu(tmp_path, real: str):
    """A ``qemu-system-x86_64`` first on PATH that, while ``hang`` exists, launches the real one
    (which detaches and runs) and then stops itself (SIGSTOP) instead of returning: the launch
    the agent waits on never ends, as with a QEMU stopped while it starts."""
    bin_dir, hang = tmp_path / "bin", tmp_path / "hang"
    bin_dir.mkdir()
    wrapper = bin_dir / "qemu-system-x86_64"
    wrapper.write_text(f"""#!/bin/sh
if [ -e {hang} ]; then
    {real} "$@"
    kill -STOP $$
    exit 0
fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    return bin_dir, hang


def test_a_launch_that_never_returns_fails_as_wake_failed_and_boot_failed_and_leaves_no_qemu(tmp_path, procs):
    real = shutil.which("qemu-system-x86_64")
    if real is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    install_bundle(real_bundle_dir(), tmp_path / "agent")
    bin_dir, hang = _hanging_qemu(tmp_path, real)
    procs.append(agent := start_agent(tmp_path, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}))
    c = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=200)
    r = c.post("/v1/host/vms", json={"name": "s", "shape": SHAPE, "entry": "sleep 600"})
    assert r.status_code == 201, r.text
    r = c.post("/v1/host/vms/s/sleep", json={})
    assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
    assert c.get("/v1/host").json()["vm_count"] == 0

    hang.touch()
    answers: dict[str, httpx.Response] = {}

    def call(key: str, method: str, path: str, body: dict) -> None:
        answers[key] = c.request(method, path, json=body)

    started = time.monotonic()
    calls = [threading.Thread(target=call, args=("wake", "POST", "/v1/host/vms/s/wake", {})),
             threading.Thread(target=call, args=("create", "POST", "/v1/host/vms",
                                                 {"name": "c", "shape": SHAPE, "entry": "sleep 600"}))]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    took = time.monotonic() - started
    hang.unlink()

    wake, create = answers["wake"], answers["create"]
    assert wake.status_code == 500 and wake.json()["error"]["code"] == "wake_failed", wake.text  # (was: internal)
    assert "did not finish starting" in wake.json()["error"]["message"]
    assert create.status_code == 500 and create.json()["error"]["code"] == "boot_failed", create.text
    assert took < 100, took
    vms = {v["name"]: v for v in c.get("/v1/host/vms").json()["vms"]}
    assert (vms["s"]["state"], vms["s"]["reserved"], vms["s"]["pid"]) == ("sleeping", False, None)
    assert vms["c"]["state"] == "failed", vms["c"]  # (was: creating, with no process, for ever)
    assert c.get("/v1/host").json()["vm_count"] == 0  # (was: 2, the wake's room and the create's held)
    assert not (agent.state_dir / "vms" / "s" / "wake.pending").exists()
    for name in ("s", "c"):  # the QEMUs those launches started are gone, detached or not
        wait_until(lambda: not pids_mentioning(agent.state_dir / "vms" / name, b"qemu-system"), timeout=15,
                   what=f"no qemu of {name}")

    # the sleeping VM is whole: it wakes once QEMU starts
    r = c.post("/v1/host/vms/s/wake", json={})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    for name in ("s", "c"):
        assert c.delete(f"/v1/host/vms/{name}").status_code == 204
