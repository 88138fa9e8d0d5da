"""An agent that itself did not run for a while (SIGSTOP, its VM paused) while it waited for a
QEMU's QMP greeting: review 36 found the sleep failed ``sleep_failed`` "no greeting within 10 s"
from a QEMU that had greeted a moment after the wait began (the agent's clock went on while it
was stopped). The agent's event loop leaves out the time it did not run (``fuse.stalls``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from support import install_bundle, start_agent

pytestmark = pytest.mark.timeout(240)


def _qemu_pid(agent, name: str) -> int:
    r = httpx.get(f"{agent.url}/v1/host/vms/{name}", headers={"Authorization": f"Bearer {agent.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["pid"]


@pytest.mark.qemu
def test_an_agent_stopped_while_it_waits_for_a_qmp_greeting_sleeps_the_vm_that_greeted(tmp_path, bundle_dir):
    install_bundle(bundle_dir, tmp_path / "q1")
    agent = start_agent(tmp_path, name="q1")
    auth = {"Authorization": f"Bearer {agent.token}"}
    try:
        with httpx.Client(base_url=agent.url, headers=auth, timeout=120) as c:
            r = c.post("/v1/host/vms", json={"name": "v", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 600"})
            assert r.status_code == 201, r.text
            qemu = _qemu_pid(agent, "v")
            os.kill(qemu, signal.SIGSTOP)  # (its QMP socket accepts, but it does not greet)
            out: dict[str, object] = {}
            t = threading.Thread(target=lambda: out.setdefault("r", c.post("/v1/host/vms/v/sleep")), daemon=True)
            try:
                t.start()
                time.sleep(1.5)  # (the agent waits for the greeting)
                agent.popen.send_signal(signal.SIGSTOP)
                os.kill(qemu, signal.SIGCONT)  # (it greets, into the stopped agent's socket)
                time.sleep(11)  # (past the agent's 10 s for a greeting)
            finally:
                os.kill(qemu, signal.SIGCONT)
                agent.popen.send_signal(signal.SIGCONT)
            t.join(120)
            assert out["r"].status_code == 200, out["r"].text
            assert c.get("/v1/host/vms/v").json()["state"] == "sleeping"
    finally:
        try:
            httpx.delete(f"{agent.url}/v1/host/vms/v", headers=auth, timeout=60)
        finally:
            agent.stop()
