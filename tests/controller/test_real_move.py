"""A counting guest in a real QEMU VM moves between two real agents and
carries on counting on the target."""

from __future__ import annotations

import re

import pytest

import fuse
from fuse.agent.backends.base import pids_mentioning
from support import install_bundle, real_bundle_dir, reap, start_agent, start_controller, wait_until

COUNTER = "i=0; while true; do echo n=$i; i=$((i+1)); sleep 0.2; done"


def numbers(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"n=(\d+)", text)]



def qemu_running(marker) -> int:
    return len(pids_mentioning(marker, b"qemu-system"))


@pytest.fixture
def two_qemu_hosts(tmp_path):
    bundle = real_bundle_dir()
    procs = []
    for name in ("src", "dst"):
        install_bundle(bundle, tmp_path / f"agent-{name}")
        procs.append(start_agent(tmp_path, backend="qemu", name=f"agent-{name}"))
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    for name, a in zip(("src", "dst"), procs):
        client.hosts.register(fuse.RegisterHostRequest(id=name, url=a.url, token=a.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=4)))
    yield client
    client.close()
    ctl.stop()
    for p in procs:
        p.stop()
    reap(tmp_path)
    assert qemu_running(tmp_path) == 0


def test_counting_guest_moves_between_real_agents_and_continues(two_qemu_hosts, tmp_path):
    c = two_qemu_hosts
    c.vms.create({"name": "counter", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER, "host": "src"})
    wait_until(lambda: len(numbers(c.vms.console("counter")["text"])) >= 5, timeout=90, what="guest counting")
    before = max(numbers(c.vms.console("counter")["text"]))
    m = c.moves.create("counter", to="dst")
    m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=120,
                   what="move to end")
    assert m["state"] == "done", m
    assert m["copied_bytes"] == m["total_bytes"] > 4 * 1024 * 1024  # several 4 MiB chunks
    assert m["copy_path"] == "bulk"  # agents on loopback TCP: the copy never enters Python
    wait_until(lambda: max(numbers(c.vms.console("counter")["text"])) >= before + 3, timeout=60,
               what="counting on the target")
    # The whole serial log moved with it (was: the target's console held only what ran there),
    # and the guest carries on from the instant it slept, not from 0: one run of numbers.
    after = numbers(c.vms.console("counter")["text"])
    assert after[0] <= 1 and max(after) > before, (before, after[:5])
    assert after == list(range(after[0], after[0] + len(after)))
    assert c.vms.get("counter")["host"] == "dst"
    assert qemu_running(tmp_path / "agent-src") == 0 and qemu_running(tmp_path / "agent-dst") == 1
    c.vms.delete("counter")


def test_a_vm_with_an_empty_console_moves(two_qemu_hosts, tmp_path):
    """A VM moved before its guest printed a byte (TCG: the first seconds of a boot) failed its move
    (was: "host dst: file console.log declares 0 bytes: a sleeping vm's state files are never
    empty"), so a drain or an mlos deallocate-then-provision-elsewhere of a fresh VM failed. Here
    the log is emptied while the VM sleeps (no process writes it), which is the same state."""
    c = two_qemu_hosts
    c.vms.create({"name": "quiet", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600", "host": "src"})
    assert c.vms.sleep("quiet")["state"] == "sleeping"
    log = tmp_path / "agent-src" / "vms" / "quiet" / "console.log"
    assert log.exists()
    log.write_bytes(b"")
    m = c.moves.create("quiet", to="dst")
    m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=120,
                   what="move to end")
    assert m["state"] == "done", m
    vm = c.vms.get("quiet")
    assert (vm["host"], vm["state"]) == ("dst", "sleeping")
    assert c.vms.wake("quiet")["state"] == "running"
    assert qemu_running(tmp_path / "agent-src") == 0 and qemu_running(tmp_path / "agent-dst") == 1
    c.vms.delete("quiet")


def test_a_real_vm_whose_qemu_died_on_the_target_while_the_controller_was_down_is_not_run_again_at_home(tmp_path):
    """Review 25 (real QEMU): the controller died between the target's wake and the move's
    `done`; the guest's QEMU on the target died before it came back. The restarted controller
    woke the source's copy from the pre-move snapshot (the VM ran a second time); the target
    woke it, so the move is through."""
    import os
    import signal

    import fuse
    from support import agent_vms

    bundle = real_bundle_dir()
    agents = {}
    for name in ("src", "dst"):
        install_bundle(bundle, tmp_path / f"agent-{name}")
        agents[name] = start_agent(tmp_path, backend="qemu", name=f"agent-{name}")
    ctl = start_controller(tmp_path, env={"FUSE_TEST_CRASH_AT": "woke"})
    c = fuse.Client(ctl.url)
    try:
        for name, a in agents.items():
            c.hosts.register(fuse.RegisterHostRequest(id=name, url=a.url, token=a.token, backend="qemu",
                                                      capacity=fuse.HostCapacity(vm_count=4)))
        c.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER, "host": "src"})
        wait_until(lambda: len(numbers(c.vms.console("job")["text"])) >= 3, timeout=90, what="guest counting")
        m = c.moves.create("job", to="dst")
        wait_until(lambda: ctl.popen.poll() is not None, timeout=120, what="the controller to die at woke")
        assert agent_vms(agents["src"])["job"]["move_id"] == m["id"]  # the source copy is still there, held
        os.kill(agent_vms(agents["dst"])["job"]["pid"], signal.SIGKILL)  # the guest's QEMU dies on the target
        wait_until(lambda: agent_vms(agents["dst"])["job"]["state"] == "failed", timeout=30, what="failed there")
        c.close()
        ctl = start_controller(tmp_path)  # (no hook now)
        c = fuse.Client(ctl.url)
        m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=120,
                       what="the move settled")
        assert (m["state"], m["source_removed"]) == ("done", True), m
        assert "job" not in agent_vms(agents["src"]) and qemu_running(tmp_path / "agent-src") == 0
        assert c.vms.get("job")["host"] == "dst"
    finally:
        c.close()
        ctl.stop()
        for a in agents.values():
            a.stop()
        reap(tmp_path)
    assert qemu_running(tmp_path) == 0
