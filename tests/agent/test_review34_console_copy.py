"""Review 34: the console copy a move's sleep leaves beside the VM's state files is owner-only
(0600) whatever the agent's umask, as every agent state file (it was 0644 under umask 022)."""

from __future__ import annotations

import os
import stat
import time

import httpx

from fuse.agent.backends.base import MOVED_CONSOLE
from support import start_agent


def test_a_moves_console_copy_is_owner_only_whatever_the_umask(tmp_path, procs):
    mask = os.umask(0o022)  # (the agent's: the fork server starts it with the test's umask)
    try:
        agent = start_agent(tmp_path, backend="fake")
    finally:
        os.umask(mask)
    procs.append(agent)
    c = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=60)
    r = c.post("/v1/host/vms", json={"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x"})
    assert r.status_code == 201, r.text
    console = agent.state_dir / "vms" / "v" / "console.log"
    deadline = time.monotonic() + 30
    while not (console.exists() and console.stat().st_size):  # (an empty log is not taken along)
        assert time.monotonic() < deadline, "v printed nothing"
        time.sleep(0.05)
    r = c.post("/v1/host/vms/v/sleep", json={"move_id": "m1"})
    assert r.status_code == 200 and MOVED_CONSOLE in [f["name"] for f in r.json()["files"]], r.text
    copy = agent.state_dir / "vms" / "v" / "state" / MOVED_CONSOLE
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # (was: 0o644)
    assert c.delete("/v1/host/vms/v", params={"move_id": "m1"}).status_code == 204
    c.close()
    agent.stop()
