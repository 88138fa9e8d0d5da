"""A bundle boots only on a backend that finds in it the files it boots from.

A manifest listing no files is the fake backend's bundle (it boots nothing),
and stays good there. On QEMU a hand-written one used to be offered by the
host and accepted at create, and QEMU, handed a kernel that is not there,
ended it in 500 ``boot_failed``. Now the host reads its bundles with its
backend's needs (``Backend.bundle_files``): such a bundle is not listed in
``GET /v1/host`` (the controller places nothing there for it) and a create
naming it is 400 with the loader's reason, before any process starts."""

from __future__ import annotations

import json

import pytest

from agent_support import qemu_pids
from fuse.agent import bundle as b
from fuse.agent.backends.base import get_backend


def file_less(state, name="empty", fingerprint="hand-written-0001") -> None:
    d = state / "bundles" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({"name": name, "fingerprint": fingerprint, "kernel": "k",
                                                 "files": {}}))


def _ask(bundle: str, name: str = "v1") -> dict:
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "echo hi", "bundle": bundle}


@pytest.mark.parametrize("backend,boots", [("qemu", True), ("firecracker", True), ("fake", False)],
                         ids=["qemu boots a kernel and an initramfs", "so does firecracker",
                              "the fake boots nothing"])
def test_each_backend_says_which_files_a_bundle_must_list(tmp_path, backend, boots):
    be = get_backend(backend, state_dir=tmp_path)
    assert be.bundle_files == (b.BOOT_FILES if boots else ())
    file_less(tmp_path)
    loaded = b.load_bundle(tmp_path, "empty", be.bundle_files)
    if boots:
        assert loaded == ("bundle empty is not usable: its manifest lists no files (a stand-in for a backend "
                          "that boots nothing), and this host's backend boots from vmlinux and initrd.cpio.gz")
        assert b.list_bundles(tmp_path, be.bundle_files) == []
    else:
        assert isinstance(loaded, b.Bundle) and loaded.fingerprint == "hand-written-0001" and loaded.files == ()
        assert [x["name"] for x in b.list_bundles(tmp_path, be.bundle_files)] == ["empty"]


@pytest.mark.qemu
async def test_a_qemu_host_refuses_a_create_from_a_file_less_bundle_with_the_reason(make_host, monkeypatch):
    host = await make_host()  # the real bundle, as "linux"
    file_less(host.vms.state_dir)
    started = []
    real_start = host.vms.backend.start
    monkeypatch.setattr(host.vms.backend, "start", lambda spec: started.append(spec.name) or real_start(spec))

    assert [x["name"] for x in host.vms.summary()["bundles"]] == ["linux"]  # what GET /v1/host lists

    r = await host.client.post("/v1/host/vms", json=_ask("empty"))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument"
    assert err["message"].startswith("bundle empty is not usable: its manifest lists no files")
    assert started == [] and host.vms.vms == {} and not qemu_pids(str(host.vms.state_dir))
    assert not (host.vms.state_dir / "vms" / "v1").exists()

    # An absent bundle is refused the same way, naming it (it said "None" when the body gave no name)
    r = await host.client.post("/v1/host/vms", json=_ask("nosuch"))
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "no bundle named nosuch on this host (fuse bundle build --name nosuch)")
    assert started == []


async def test_the_fake_backend_still_boots_its_file_less_bundles(make_host):
    host = await make_host(backend="fake")
    file_less(host.vms.state_dir)
    assert {x["name"] for x in host.vms.summary()["bundles"]} == {"linux", "empty"}
    r = await host.client.post("/v1/host/vms", json=_ask("empty"))
    assert r.status_code == 201, r.text
    assert r.json()["bundle_fingerprint"] == "hand-written-0001"
    await host.wait_state("v1", {"running"}, timeout=20)


@pytest.mark.qemu
async def test_a_qemu_host_refuses_an_incoming_move_of_a_bundle_it_cannot_boot(make_host):
    """The receiving side of a move checks the bundle as its backend boots it: a file-less
    manifest with the very fingerprint the VM names is refused before anything is reserved
    (it had been accepted, and the move failed only at the wake, after the copy)."""
    host = await make_host()
    file_less(host.vms.state_dir, fingerprint="fp-moved")
    free = host.vms.summary()["free_mem_mib"]
    r = await host.client.post("/v1/host/incoming", json={
        "move_id": "m1", "platform": {},
        "vm": {"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "echo hi", "bundle": "empty",
               "bundle_fingerprint": "fp-moved"},
        "files": [{"name": "memory", "size": 1, "sha256": "0" * 64}]})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "bundle_mismatch"
    assert "its manifest lists no files" in err["message"]
    assert host.vms.summary()["free_mem_mib"] == free and host.vms.vms == {}


def test_the_offline_probe_lists_only_bundles_its_backend_boots(tmp_path):
    from fuse.agent.probe import host_facts

    file_less(tmp_path)
    assert [x["name"] for x in host_facts(tmp_path, backend="fake")["bundles"]] == ["empty"]
    assert host_facts(tmp_path, backend="qemu")["bundles"] == []
