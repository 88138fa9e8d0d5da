"""Review 37: a move from an agent before 1bfe855 declares the VM's serial log even while it is
still empty (a VM in its first seconds), and the target refused any 0-byte file, so every such
move failed "file console.log declares 0 bytes". An empty console.log is no state: it goes
through (as empty, its SHA-256 still checked); an empty state file is still refused."""

from __future__ import annotations

import hashlib

import httpx

from fuse.agent.backends.base import MOVED_CONSOLE
from support import start_agent

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _client(agent) -> httpx.Client:
    return httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=60)


def _asleep_for_a_move(c: httpx.Client, name: str, move_id: str) -> tuple[dict, list[dict], dict[str, bytes]]:
    """Create ``name`` and sleep it for ``move_id``: (the VM, its state files, their bytes)."""
    r = c.post("/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x"})
    assert r.status_code == 201, r.text
    r = c.post(f"/v1/host/vms/{name}/sleep", json={"move_id": move_id})
    assert r.status_code == 200, r.text
    vm = r.json()
    # (as an old source: the serial log so far goes along as it is, here empty)
    files = [f for f in vm["files"] if f["name"] != MOVED_CONSOLE]
    data = {f["name"]: c.get(f"/v1/host/vms/{name}/files/{f['name']}",
                             params={"length": max(1, f["size"])}).content for f in files}
    assert all(len(data[f["name"]]) == f["size"] > 0 for f in files), files
    return vm, files, data


def _begin(c: httpx.Client, vm: dict, move_id: str, files: list[dict], platform: dict) -> httpx.Response:
    return c.post("/v1/host/incoming", json={
        "move_id": move_id, "platform": platform, "files": files,
        "vm": {"name": vm["name"], "shape": vm["shape"], "entry": vm["entry"], "bundle": vm["bundle"],
               "bundle_fingerprint": vm["bundle_fingerprint"]}})


def test_a_move_declaring_an_empty_console_log_installs_and_wakes_on_the_target(tmp_path, procs):
    src, dst = start_agent(tmp_path, backend="fake", name="a"), start_agent(tmp_path, backend="fake", name="b")
    procs += [src, dst]
    a, b = _client(src), _client(dst)
    vm, files, data = _asleep_for_a_move(a, "v", "m1")
    declared = files + [{"name": MOVED_CONSOLE, "size": 0, "sha256": EMPTY_SHA256}]
    r = _begin(b, vm, "m1", declared, vm["platform"])
    assert r.status_code == 201, r.text  # (was: 400 "file console.log declares 0 bytes")
    for name, body in data.items():
        r = b.put(f"/v1/host/incoming/m1/files/{name}", params={"offset": 0}, content=body)
        assert r.status_code == 200, r.text
    r = b.post("/v1/host/incoming/m1/install")
    assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
    assert MOVED_CONSOLE not in [f["name"] for f in r.json()["files"]]  # (no state: set aside, as ever)
    r = b.post("/v1/host/vms/v/wake", json={"move_id": "m1"})
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert a.delete("/v1/host/vms/v", params={"move_id": "m1"}).status_code == 204
    assert b.delete("/v1/host/vms/v").status_code == 204
    a.close(), b.close()
    src.stop(), dst.stop()


def test_an_empty_state_file_or_an_empty_log_of_other_bytes_is_still_refused(tmp_path, procs):
    src, dst = start_agent(tmp_path, backend="fake", name="a"), start_agent(tmp_path, backend="fake", name="b")
    procs += [src, dst]
    a, b = _client(src), _client(dst)
    vm, files, data = _asleep_for_a_move(a, "v", "m1")
    # a state file declared empty: a broken declaration, not a VM (the wake would need its bytes)
    empty_state = [dict(f, size=0, sha256=EMPTY_SHA256) if i == 0 else f for i, f in enumerate(files)]
    r = _begin(b, vm, "m1", empty_state, vm["platform"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert "declares 0 bytes" in r.json()["error"]["message"], r.text
    # an empty log declared with another file's hash: the check of what arrived still holds
    wrong = files + [{"name": MOVED_CONSOLE, "size": 0, "sha256": hashlib.sha256(b"x").hexdigest()}]
    r = _begin(b, vm, "m1", wrong, vm["platform"])
    assert r.status_code == 201, r.text
    for name, body in data.items():
        assert b.put(f"/v1/host/incoming/m1/files/{name}", params={"offset": 0}, content=body).status_code == 200
    r = b.post("/v1/host/incoming/m1/install")
    assert r.status_code == 409 and r.json()["error"]["code"] == "checksum_mismatch", r.text
    assert b.delete("/v1/host/incoming/m1").status_code == 204
    assert a.delete("/v1/host/vms/v", params={"move_id": "m1"}).status_code == 204
    a.close(), b.close()
    src.stop(), dst.stop()
