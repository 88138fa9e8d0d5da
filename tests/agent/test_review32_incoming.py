"""An incoming move's VM is its move's until the move installs or aborts it: a clear_mark,
a sleep or a move's delete that is not that move's step is refused without side effects; two
installs at once answer as one; a declaration is read strictly; a chunk for a move the agent
does not hold is refused before its bytes, chunked or not."""

from __future__ import annotations

import asyncio
import hashlib
import socket

import httpx
import pytest

from fuse.agent.backends.fake import FakeBackend
from fuse.agent.vms import SLEEP_MARK

MiB = 2**20
TOKEN = "agent-token"


def _declared(data: bytes, name: str = "state.bin") -> dict:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _body(host, move_id: str, files: list[dict], name: str = "v") -> dict:
    fp = host.vms.summary()["bundles"][0]["fingerprint"]
    return {"move_id": move_id, "vm": {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true",
                                       "bundle": "linux", "bundle_fingerprint": fp},
            "platform": host.vms.backend.platform(), "files": files}


async def _receiving(host, move_id: str = "m1", name: str = "v", data: bytes = b"fuse" * 4096):
    r = await host.client.post("/v1/host/incoming", json=_body(host, move_id, [_declared(data)], name))
    assert r.status_code == 201, r.text
    r = await host.client.put(f"/v1/host/incoming/{move_id}/files/state.bin", content=data)
    assert r.status_code == 200, r.text
    return data


def _error(r) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


async def test_clear_mark_of_a_vm_still_incoming_is_refused_and_its_move_can_still_be_aborted(make_host):
    host = await make_host(backend="fake")
    await _receiving(host)

    r = await host.client.post("/v1/host/vms/v/wake", json={"move_id": "m1", "clear_mark": True})
    assert _error(r) == (409, "conflict"), r.text
    assert "incoming" in r.json()["error"]["message"]
    vm = (await host.client.get("/v1/host/vms/v")).json()
    assert (vm["state"], vm["move_id"]) == ("incoming", "m1")  # (was: unmarked, the move stranded)

    assert (await host.client.delete("/v1/host/incoming/m1")).status_code == 204
    assert (await host.client.get("/v1/host/vms/v")).status_code == 404
    assert (await host.client.get("/v1/host/incoming")).json()["incoming"] == []
    assert not (host.vms.state_dir / "incoming" / "m1.json").exists()
    assert not host.vms.incoming.entries  # (its disk promise went with it)

    # an installed copy's mark is still cleared so
    await _receiving(host, "m2")
    assert (await host.client.post("/v1/host/incoming/m2/install")).status_code == 200
    r = await host.client.post("/v1/host/vms/v/wake", json={"move_id": "m2", "clear_mark": True})
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["move_id"]) == ("sleeping", None)


async def test_installs_of_one_move_at_once_all_answer_with_the_installed_vm(make_host):
    host = await make_host(backend="fake")
    await _receiving(host, data=b"\x5a" * (8 * MiB))  # (hashing it holds the lock while the others wait)

    answers = await asyncio.gather(*(host.client.post("/v1/host/incoming/m1/install") for _ in range(3)))
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert all((r.json()["state"], r.json()["move_id"]) == ("sleeping", "m1") for r in answers)
    assert host.vms.vms["v"].state == "sleeping"


async def test_an_install_queued_behind_an_abort_is_not_found(make_host):
    host = await make_host(backend="fake")
    await _receiving(host, data=b"\x5a" * (8 * MiB))
    mgr = host.vms
    async with mgr.lock("v"):  # the abort's turn comes first
        install = asyncio.create_task(host.client.post("/v1/host/incoming/m1/install"))
        await asyncio.sleep(0.2)
        await mgr.incoming.abort_vm(mgr.vms["v"])
    r = await install
    assert _error(r) == (404, "not_found"), r.text
    assert "v" not in mgr.vms


@pytest.mark.parametrize("move_id, code", [
    ("m1", "conflict"),             # its own move: an incoming vm does not run, so it cannot sleep
    (None, "move_in_progress"),     # anyone else: the vm is the move's
    ("other", "move_in_progress"),
], ids=["with its own move id", "with no move id", "with another move's id"])
async def test_a_sleep_of_an_incoming_vm_is_refused_without_touching_it(make_host, move_id, code):
    host = await make_host(backend="fake")
    data = await _receiving(host)
    events = len((await host.client.get("/v1/host/events")).json()["events"])

    r = await host.client.post("/v1/host/vms/v/sleep", json={"move_id": move_id} if move_id else {})
    assert _error(r) == (409, code), r.text
    if code == "conflict":
        assert r.json()["error"]["message"] == "vm v is incoming; only a running vm can sleep"
    vm = host.vms.vms["v"]
    assert (vm.state, vm.move_id) == ("incoming", "m1")
    assert not (host.vms.vm_dir("v") / SLEEP_MARK).exists()
    assert len((await host.client.get("/v1/host/events")).json()["events"]) == events
    assert (host.vms.vm_dir("v") / "state" / "state.bin").read_bytes() == data
    assert (await host.client.post("/v1/host/incoming/m1/install")).status_code == 200  # the move goes on


async def test_a_begin_again_with_other_files_is_refused_and_the_same_one_is_answered_again(make_host):
    host = await make_host(backend="fake")
    first = [_declared(b"fuse" * 4096)]
    assert (await host.client.post("/v1/host/incoming", json=_body(host, "m1", first))).status_code == 201

    other = [_declared(b"other" * 100)]
    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", other))
    assert _error(r) == (409, "conflict"), r.text
    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", first + [_declared(b"x", "more.bin")]))
    assert _error(r) == (409, "conflict"), r.text

    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", first))
    assert r.status_code == 201 and r.json()["files"] == first, r.text


@pytest.mark.parametrize("size", [16384.0, True, "16384"], ids=["a float", "a bool", "a string"])
async def test_a_declared_file_size_is_a_json_integer_only(make_host, size):
    host = await make_host(backend="fake")
    files = [_declared(b"fuse" * 4096) | {"size": size}]
    r = await host.client.post("/v1/host/incoming", json=_body(host, "m1", files))
    assert _error(r) == (400, "invalid_argument"), r.text
    assert "v" not in host.vms.vms


async def test_a_move_delete_of_a_vm_that_move_does_not_hold_leaves_it(make_host):
    host = await make_host()  # a real guest
    r = await host.client.post("/v1/host/vms", json={"name": "sd1", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "sleep 600"})
    assert r.status_code == 201, r.text
    await host.wait_state("sd1", {"running"})

    r = await host.client.delete("/v1/host/vms/sd1", params={"move_id": "some-old-move"})
    assert _error(r) == (404, "not_found"), r.text  # (the controller's removal takes 404 as done)
    assert "not held by move some-old-move" in r.json()["error"]["message"]
    assert (await host.client.get("/v1/host/vms/sd1")).json()["state"] == "running"
    assert host.vms.backend.pid(host.vms.spec(host.vms.vms["sd1"])) is not None

    assert (await host.client.post("/v1/host/vms/sd1/sleep", json={"move_id": "mv2"})).status_code == 200
    r = await host.client.delete("/v1/host/vms/sd1", params={"move_id": "some-old-move"})
    assert _error(r) == (409, "move_in_progress"), r.text
    assert (await host.client.delete("/v1/host/vms/sd1", params={"move_id": "mv2"})).status_code == 204
    # a retry whose first reply was lost
    r = await host.client.delete("/v1/host/vms/sd1", params={"move_id": "mv2"})
    assert _error(r) == (404, "not_found"), r.text


@pytest.fixture
def agent(fake_agent):
    return fake_agent


def test_a_chunked_put_for_a_move_not_here_is_refused_before_its_body_is_read(agent):
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)
    for offset in (0, -5):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"PUT /v1/host/incoming/nope/files/state.bin?offset={offset} HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            s.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")  # the body goes on (no last chunk): never all read
            s.settimeout(5)
            got = b""
            while b"\r\n\r\n" not in got:
                more = s.recv(4096)
                assert more, f"closed after {got!r}"
                got += more
            assert got.startswith(b"HTTP/1.1 404"), got[:300]

    # a chunked PUT for a move that is here still writes
    data = b"fuse" * 4096
    headers = {"Authorization": f"Bearer {TOKEN}"}
    fp = httpx.get(agent.url + "/v1/host", headers=headers).json()["bundles"][0]["fingerprint"]
    body = {"move_id": "m1", "vm": {"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true",
                                    "bundle": "linux", "bundle_fingerprint": fp},
            "platform": FakeBackend().platform(), "files": [_declared(data)]}
    r = httpx.post(agent.url + "/v1/host/incoming", json=body, headers=headers)
    assert r.status_code == 201, r.text
    r = httpx.put(agent.url + "/v1/host/incoming/m1/files/state.bin", headers=headers,
                  content=iter([data[:100], data[100:]]))  # (an iterator: chunked, no Content-Length)
    assert r.status_code == 200 and r.json()["written"] == len(data), r.text
    assert httpx.post(agent.url + "/v1/host/incoming/m1/verify", headers=headers).json()["verified"]
