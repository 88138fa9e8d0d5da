"""The Firecracker release gates a move only between Firecracker hosts (seed 000: it is
"" on qemu hosts; compare releases across the fleet before migrating). A qemu agent that
finds a firecracker binary on PATH reported that binary's release, and a move of a QEMU
VM between it and a qemu host without one was refused as arch_mismatch."""

from __future__ import annotations

from types import SimpleNamespace

from fuse.controller.moves import MoveService


def _service(a: dict, b: dict) -> SimpleNamespace:
    base = {"platform": "linux/amd64/qemu", "bundles": [{"name": "linux", "fingerprint": "f" * 64}]}
    return SimpleNamespace(fleet=SimpleNamespace(views={
        "a": SimpleNamespace(summary=base | a), "b": SimpleNamespace(summary=base | b)}))


VM = {"name": "v1", "bundle": "linux", "bundle_fingerprint": "f" * 64, "platform": {}}


def test_qemu_hosts_move_whatever_firecracker_binary_one_finds():
    svc = _service({"backend": "qemu", "firecracker": ""}, {"backend": "qemu", "firecracker": "v1.7.0"})
    assert MoveService.compatible(svc, VM, "a", "b") is None
    assert MoveService.compatible(svc, VM, "b", "a") is None


def test_firecracker_hosts_on_different_releases_do_not_move():
    fc = {"platform": "linux/amd64/firecracker"}
    svc = _service(fc | {"backend": "firecracker", "firecracker": "v1.10.1"},
                   fc | {"backend": "firecracker", "firecracker": "v1.7.0"})
    assert MoveService.compatible(svc, VM, "a", "b") == "firecracker release differs: v1.10.1 vs v1.7.0"
    same = _service(fc | {"backend": "firecracker", "firecracker": "v1.10.1"},
                    fc | {"backend": "firecracker", "firecracker": "v1.10.1"})
    assert MoveService.compatible(same, VM, "a", "b") is None
