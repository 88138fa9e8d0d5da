"""The incoming side of a move refuses what it cannot hold or install, never
installs bytes it did not check, and a wake that fails says why."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import threading

import pytest

from fuse.agent import incoming
from fuse.agent.backends.base import BackendError, BootSpec

MiB = 2**20


def _body(host, move_id: str, files: list[dict], name: str = "v") -> dict:
    fp = host.vms.summary()["bundles"][0]["fingerprint"]
    return {"move_id": move_id, "vm": {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true",
                                       "bundle": "linux", "bundle_fingerprint": fp},
            "platform": host.vms.backend.platform(), "files": files}


def _declared(data: bytes, name: str = "state.bin") -> dict:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


async def _written_while_hashing(host, monkeypatch, path: str):
    """POST ``path`` (a verify or an install of move m1); once it has hashed
    its first file, and before it goes on, a corrupting write lands."""
    hashed, written, real = threading.Event(), threading.Event(), incoming._size_and_hash

    def paused(path):
        out = real(path)
        if not hashed.is_set():
            hashed.set()
            written.wait(10)
        return out
    monkeypatch.setattr(incoming, "_size_and_hash", paused)
    call = asyncio.create_task(host.client.post(path))
    assert await asyncio.to_thread(hashed.wait, 10)
    r = await host.client.put("/v1/host/incoming/m1/files/state.bin", content=b"\xff" * 16)
    assert r.status_code == 200, r.text
    written.set()
    return await call


async def test_a_write_during_a_verify_leaves_the_move_unverified_so_install_refuses_the_bytes(
        make_host, monkeypatch):
    host = await make_host(backend="fake")
    data = b"fuse" * 4096
    assert (await host.client.post("/v1/host/incoming", json=_body(host, "m1", [_declared(data)]))).status_code == 201
    assert (await host.client.put("/v1/host/incoming/m1/files/state.bin", content=data)).status_code == 200

    # The verify hashes the good bytes, then waits (in its thread) until a corrupting write has landed.
    verify = await _written_while_hashing(host, monkeypatch, "/v1/host/incoming/m1/verify")
    assert verify.json()["verified"]  # true of the bytes it hashed

    r = await host.client.post("/v1/host/incoming/m1/install")
    assert r.status_code == 409 and r.json()["error"]["code"] == "checksum_mismatch", r.text
    assert host.vms.vms["v"].state == "incoming"


async def test_a_write_during_an_install_stops_it_installing_bytes_it_did_not_check(make_host, monkeypatch):
    host = await make_host(backend="fake")
    data = b"fuse" * 4096
    await host.client.post("/v1/host/incoming", json=_body(host, "m1", [_declared(data)]))
    await host.client.put("/v1/host/incoming/m1/files/state.bin", content=data)
    r = await _written_while_hashing(host, monkeypatch, "/v1/host/incoming/m1/install")
    assert r.status_code == 409 and r.json()["error"]["code"] == "writes_in_flight", r.text
    assert host.vms.vms["v"].state == "incoming"
    monkeypatch.undo()
    r = await host.client.post("/v1/host/incoming/m1/install")  # hashes again: what is there now
    assert r.status_code == 409 and r.json()["error"]["code"] == "checksum_mismatch", r.text


async def test_a_write_after_a_clean_verify_makes_install_hash_again(make_host):
    host = await make_host(backend="fake")
    data = b"fuse" * 4096
    await host.client.post("/v1/host/incoming", json=_body(host, "m1", [_declared(data)]))
    await host.client.put("/v1/host/incoming/m1/files/state.bin", content=data)
    assert (await host.client.post("/v1/host/incoming/m1/verify")).json()["verified"]
    await host.client.put("/v1/host/incoming/m1/files/state.bin", params={"offset": 8}, content=b"!")
    r = await host.client.post("/v1/host/incoming/m1/install")
    assert r.status_code == 409 and r.json()["error"]["code"] == "checksum_mismatch", r.text


@pytest.mark.parametrize("file, said", [
    ({"name": "state.bin", "size": -5, "sha256": "abc"}, "declares -5 bytes"),
    ({"name": "state.bin", "size": 5, "sha256": "abc"}, "not 64 lowercase hex digits"),
    ({"name": "state.bin", "size": 5, "sha256": "A" * 64}, "not 64 lowercase hex digits"),
    (_declared(b""), "never empty"),
], ids=["a negative size is refused", "a sha256 that is no digest is refused",
        "an upper-case digest, which no received file could match, is refused",
        "an empty state file, which no wake can load, is refused"])
async def test_an_impossible_declaration_is_refused_before_anything_is_reserved(make_host, file, said):
    host = await make_host(backend="fake", ram_mb=1024)
    free = host.vms.summary()["free_mem_mib"]
    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", [file]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert said in r.json()["error"]["message"]
    assert host.vms.vms == {} and host.vms.summary()["free_mem_mib"] == free


@pytest.mark.parametrize("move_id", [".", ".."])
async def test_a_move_id_a_url_path_would_resolve_away_is_refused(make_host, move_id):
    # (review 21: ".." took a reservation that DELETE .../incoming/.. could never reach)
    host = await make_host(backend="fake", ram_mb=1024)
    free = host.vms.summary()["free_mem_mib"]
    r = await host.client.post("/v1/host/incoming", json=_body(host, move_id, [_declared(b"x")]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert "move_id" in r.json()["error"]["message"]
    assert host.vms.vms == {} and host.vms.summary()["free_mem_mib"] == free


async def test_a_move_bigger_than_the_free_disk_is_refused_with_the_figures(make_host):
    host = await make_host(backend="fake")
    huge = {"name": "state.bin", "size": 10 * 2**40, "sha256": "0" * 64}
    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", [huge]))
    assert r.status_code == 409 and r.json()["error"]["code"] == "host_full", r.text
    message = r.json()["error"]["message"]
    assert f"need {10 * 2**40} bytes" in message and "bytes free" in message
    assert host.vms.vms == {}


async def test_the_disk_room_counts_what_other_incoming_moves_have_yet_to_receive(make_host, monkeypatch):
    host = await make_host(backend="fake")
    real = shutil.disk_usage

    def hundred_mib_free(path):  # the host's disk only (the rest of the process sees the real one)
        if str(path).startswith(str(host.vms.state_dir)):
            return real(path)._replace(free=100 * MiB)
        return real(path)
    monkeypatch.setattr(shutil, "disk_usage", hundred_mib_free)
    sixty = {"name": "state.bin", "size": 60 * MiB, "sha256": "0" * 64}
    assert (await host.client.post("/v1/host/incoming", json=_body(host, "a", [sixty], "va"))).status_code == 201
    r = await host.client.post("/v1/host/incoming", json=_body(host, "b", [sixty], "vb"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "host_full", r.text
    assert f"{60 * MiB} of them promised to 1 other incoming move(s)" in r.json()["error"]["message"]
    assert "vb" not in host.vms.vms
    assert (await host.client.delete("/v1/host/incoming/a")).status_code == 204
    assert (await host.client.post("/v1/host/incoming", json=_body(host, "b", [sixty], "vb"))).status_code == 201


async def test_received_bytes_count_bytes_written_not_the_length_a_far_write_gives_a_sparse_file(make_host):
    host = await make_host(backend="fake")
    size = 64 * MiB
    await host.client.post("/v1/host/incoming", json=_body(host, "m1", [{"name": "state.bin", "size": size,
                                                                         "sha256": "0" * 64}]))
    r = await host.client.put("/v1/host/incoming/m1/files/state.bin", params={"offset": size - 4096},
                              content=b"x" * 4096)
    assert r.status_code == 200, r.text
    got = (await host.client.get("/v1/host/incoming")).json()["incoming"][0]["received_bytes"]
    assert 4096 <= got < MiB  # (a block or so: the file system's rounding), not 64 MiB


async def test_a_write_past_the_declared_size_is_refused(make_host):
    host = await make_host(backend="fake")
    await host.client.post("/v1/host/incoming", json=_body(host, "m1", [_declared(b"x" * 100)]))
    for offset, length in ((100, 1), (90, 11), (9 * 2**40, 1)):
        r = await host.client.put("/v1/host/incoming/m1/files/state.bin", params={"offset": offset},
                                  content=b"y" * length)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", (offset, r.text)
    assert (await host.client.get("/v1/host/incoming")).json()["incoming"][0]["received_bytes"] == 0


@pytest.mark.qemu
@pytest.mark.parametrize("state, said", [
    (b"garbage!" * 512, "no QEMU state (4096 bytes starting 67617262"),
    (b"QEVM\x00\x00\x00\x03" + b"\x00" * 64, "a QEMU state of 72 bytes that this QEMU rejected"),
], ids=["a file that is no QEMU state says so",
        "a QEMU state QEMU rejects says so"])
async def test_a_wake_that_fails_to_load_its_state_says_why(make_host, state, said):
    host = await make_host()
    b = host.vms.bundle("linux")
    vm_dir = host.vms.vm_dir("w")
    spec = BootSpec(name="w", vm_dir=vm_dir, vcpus=1, mem_mib=128, entry="true", kernel=b.vmlinux,
                    initrd=b.initrd, platform=host.vms.backend.platform())
    spec.state_dir.mkdir(parents=True)
    (spec.state_dir / "state.bin").write_bytes(state)
    with pytest.raises(BackendError) as err:
        await host.vms.backend.wake(spec)
    assert said in str(err.value), str(err.value)
