"""Review 25: moves of a real QEMU VM whose serial log is still empty."""

from __future__ import annotations

import pytest

from test_real_move import qemu_running, two_qemu_hosts  # noqa: F401  (the fixture)
from support import wait_until

pytestmark = pytest.mark.qemu


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
