"""Twenty-seventh session: a move waits on a silent host only as long as the README says:
the target's hash of what it received, FUSE_MOVE_IO_TIMEOUT and a second per 50 MiB (was a
fixed 120 s, the guest paused all along); the source copy's removal at done, the quick
timeout (was 60 s, the move held at waking after the VM ran on its target). A host is made
silent by SIGSTOP while a proxy holds the request it is about to get."""

from __future__ import annotations

import os
import signal
import time

import fuse
import pytest
from support import Proxy, wait_until
from test_moves import Fleet, vm_body


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    for a in f.agents.values():
        if a.popen.poll() is None:
            os.kill(a.popen.pid, signal.SIGCONT)
    f.close()


def _behind_proxy(fleet, host_id):
    a = fleet.agent(host_id)
    proxy = Proxy(int(a.url.rsplit(":", 1)[1]))
    fleet.client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=proxy.url, token=a.token, backend="qemu",
                                                         capacity=fuse.HostCapacity(vm_count=10)))
    return proxy


def _move_silencing(fleet, vm: str, proxy, nth: int, silent: str) -> tuple[dict, float]:
    """Move ``vm`` to dst, holding the target's POSTs to its incoming move 2 s each on the way,
    and SIGSTOP host ``silent``'s agent as the ``nth`` of them is held: (the move as it ended,
    seconds from the stop)."""
    proxy.hold[b"POST /v1/host/incoming/"] = 2.0  # the verify, then the install
    m = fleet.client.moves.create(vm, to="dst")
    wait_until(lambda: proxy.held >= nth, timeout=30, interval=0.01, what=f"request {nth} on its way")
    os.kill(fleet.agents[silent].popen.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    m = fleet.wait_move(m["id"], timeout=150)
    return m, time.monotonic() - t0


def test_a_target_silent_during_its_verify_fails_the_move_after_the_io_timeout(fleet):
    fleet.add("src")
    proxy = _behind_proxy(fleet, "dst")
    try:
        fleet.client.vms.create(vm_body("job1", host="src", mem=256))
        fleet.restart_controller(env={"FUSE_MOVE_COPY_PATH": "http", "FUSE_MOVE_IO_TIMEOUT": "3"})
        m, took = _move_silencing(fleet, "job1", proxy, 1, "dst")  # silent as the verify is on its way
        assert m["state"] == "failed" and "copying" in m["reason"], m
        assert took < 30, (took, m["reason"])
        wait_until(lambda: fleet.client.vms.get("job1")["state"] == "running", timeout=30, what="home again")
        assert fleet.client.vms.get("job1")["host"] == "src"
    finally:
        proxy.hold.clear()
        proxy.close()


def test_a_source_silent_at_the_end_does_not_hold_the_move_past_the_quick_timeout(fleet):
    proxy_src = _behind_proxy(fleet, "src")
    proxy_dst = _behind_proxy(fleet, "dst")
    try:
        fleet.client.vms.create(vm_body("job2", host="src", mem=256))
        fleet.restart_controller(env={"FUSE_MOVE_QUICK_TIMEOUT": "2"})
        m, took = _move_silencing(fleet, "job2", proxy_dst, 2, "src")  # silent as the install is on its way
        assert m["state"] == "done" and m["source_removed"] is False, m
        assert took < 20, took
        assert fleet.client.vms.get("job2")["host"] == "dst"
    finally:
        for p in (proxy_src, proxy_dst):
            p.hold.clear()
            p.close()
