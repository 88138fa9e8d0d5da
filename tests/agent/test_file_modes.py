"""Owner-only on disk whatever the umask (README: sockets 0600, every directory
fuse creates 0700): a real agent under umask 000 runs a real QEMU VM, sleeps
and wakes it, and every directory, socket and state file it made for that is
the owner's alone. QEMU daemonized sets its own umask (027), so what it
creates is checked too."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent_support import COUNTER, install_bundle
from fuse.agent.backends.qemu import qmp_path
from support import FUSE, wait_until

pytestmark = pytest.mark.qemu


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def wait_vm(c: httpx.Client, name: str, state: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while (vm := c.get(f"/v1/host/vms/{name}").json()).get("state") != state:
        assert time.monotonic() < deadline, f"vm {name} stuck in {vm.get('state')}"
        time.sleep(0.1)
    return vm


def test_an_agent_under_umask_000_keeps_its_vm_dirs_sockets_and_state_files_owner_only(tmp_path, bundle_dir):
    state, sock = tmp_path / "state", tmp_path / "run" / "agent.sock"
    install_bundle(bundle_dir, state)
    log = open(tmp_path / "agent.log", "ab")
    # umask 000: the loosest a user could run fuse under (the child's alone: pytest's threads keep theirs)
    agent = subprocess.Popen(FUSE + ["host", "serve", "--state-dir", str(state), "--backend", "qemu",
                                     "--socket", str(sock)],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, umask=0,
                             start_new_session=True)
    log.close()
    c = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://agent", timeout=60)
    try:
        wait_until(lambda: agent.poll() is None and sock.exists() and c.get("/v1/host").status_code == 200,
                   timeout=60, what="agent")
        r = c.post("/v1/host/vms", json={"name": "m1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER})
        assert r.status_code == 201, r.text
        wait_vm(c, "m1", "running")
        vm_dir = state / "vms" / "m1"
        wait_until(lambda: (state / "metering.json").exists(), what="metering.json")

        assert mode(sock) == 0o600 and mode(sock.parent) == 0o700
        for d in (state / "vms", vm_dir, state / "incoming"):
            assert mode(d) == 0o700, (d, oct(mode(d)))
        assert mode(qmp_path(vm_dir)) == 0o600, oct(mode(qmp_path(vm_dir)))
        for f in (vm_dir / "vm.json", vm_dir / "qemu.err", vm_dir / "console.log", state / "events.jsonl",
                  state / "agent-id", state / "metering.json"):
            assert mode(f) == 0o600, (f, oct(mode(f)))

        r = c.post("/v1/host/vms/m1/sleep")
        assert r.status_code == 200, r.text
        assert mode(vm_dir / "state") == 0o700
        assert mode(vm_dir / "state" / "state.bin") == 0o600, oct(mode(vm_dir / "state" / "state.bin"))
        assert mode(vm_dir / "vm.json") == 0o600

        r = c.post("/v1/host/vms/m1/wake")
        assert r.status_code == 200, r.text
        vm = wait_vm(c, "m1", "running")
        assert mode(qmp_path(vm_dir)) == 0o600, oct(mode(qmp_path(vm_dir)))

        # the receiving side of a move: its record, the VM's directory and what it receives
        r = c.post("/v1/host/incoming", json={
            "move_id": "mv1", "platform": vm["platform"],
            "vm": {"name": "in1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER, "bundle": vm["bundle"],
                   "bundle_fingerprint": vm["bundle_fingerprint"]},
            "files": [{"name": "state.bin", "size": 4, "sha256": "0" * 64}]})
        assert r.status_code == 201, r.text
        r = c.put("/v1/host/incoming/mv1/files/state.bin", params={"offset": 0}, content=b"abcd")
        assert r.status_code in (200, 204), r.text
        assert mode(state / "incoming" / "mv1.json") == 0o600
        for d in (state / "vms" / "in1", state / "vms" / "in1" / "state"):
            assert mode(d) == 0o700, (d, oct(mode(d)))
        assert mode(state / "vms" / "in1" / "state" / "state.bin") == 0o600
        assert c.delete("/v1/host/incoming/mv1").status_code == 204
    finally:
        try:
            c.delete("/v1/host/vms/m1")  # (204; best effort when an assertion failed first)
        except httpx.HTTPError:
            pass
        c.close()
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
