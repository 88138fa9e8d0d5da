"""The bulk copy protocol, spoken to a real agent process on the same
listeners as its HTTP API: what it serves, what it refuses and why."""

from __future__ import annotations

import hashlib
import json
import os
import socket

import httpx
import pytest

from fuse.agent.bulk import MAGIC
from support import reap, start_agent

TOKEN = "agent-token"


@pytest.fixture
def agent(tmp_path):
    a = start_agent(tmp_path, backend="fake", token=TOKEN)
    yield a
    a.stop()
    reap(tmp_path)


def api(a, method, path, **kw):
    r = httpx.request(method, a.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, **kw)
    assert r.status_code < 300, r.text
    return r.json() if r.content else None


def tcp(a) -> socket.socket:
    host, port = a.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def unix(a) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(a.socket))
    return s


def ask(sock, header: dict | bytes) -> dict:
    sock.sendall(header if isinstance(header, bytes) else MAGIC + json.dumps(header).encode() + b"\n")
    line = b""
    while not line.endswith(b"\n"):
        got = sock.recv(1)
        assert got, f"connection closed after {line!r}"
        line += got
    return json.loads(line)


def read_all(sock, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(min(1 << 20, n - len(out)))
        assert got, f"short read: {len(out)} of {n}"
        out += got
    return bytes(out)


@pytest.fixture
def asleep(agent):
    api(agent, "POST", "/v1/host/vms", json={"name": "s1", "shape": {"vcpus": 1, "mem_mib": 1024}, "entry": "count"})
    vm = api(agent, "POST", "/v1/host/vms/s1/sleep", json={})
    return max(vm["files"], key=lambda f: f["size"])  # the memory image


def test_read_sends_the_file_bytes_with_the_token_over_tcp_and_without_it_over_the_socket(agent, asleep):
    f = asleep
    for connect, token in ((tcp, TOKEN), (unix, None)):
        with connect(agent) as s:
            reply = ask(s, {"op": "read", "token": token, "vm": "s1", "file": f["name"], "offset": 0,
                            "length": f["size"]})
            assert reply == {"ok": True, "length": f["size"]}
            data = read_all(s, f["size"])
            assert s.recv(1) == b""  # one operation per connection
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
    with tcp(agent) as s:  # a range
        assert ask(s, {"op": "read", "token": TOKEN, "vm": "s1", "file": f["name"], "offset": 5, "length": 7})["ok"]
        assert read_all(s, 7) == data[5:12]


@pytest.mark.parametrize("header, status, code", [
    ({"op": "read", "token": "wrong", "vm": "s1", "file": "memory.bin", "offset": 0, "length": 1}, 401, "unauthorized"),
    ({"op": "read", "vm": "s1", "file": "memory.bin", "offset": 0, "length": 1}, 401, "unauthorized"),
    ({"op": "read", "token": TOKEN, "vm": "nope", "file": "memory.bin", "offset": 0, "length": 1}, 404, "not_found"),
    ({"op": "read", "token": TOKEN, "vm": "s1", "file": "../vm.json", "offset": 0, "length": 1}, 404, "not_found"),
    ({"op": "read", "token": TOKEN, "vm": "s1", "file": "FILE", "offset": -1, "length": 1}, 400, "invalid_argument"),
    ({"op": "read", "token": TOKEN, "vm": "s1", "file": "FILE", "offset": 0, "length": 10**12}, 400,
     "invalid_argument"),
    ({"op": "write", "token": TOKEN, "move": "mv-none", "file": "memory", "offset": 0, "length": 1}, 404,
     "not_found"),
    ({"op": "delete", "token": TOKEN}, 400, "invalid_argument"),
    (MAGIC + b"{not json\n", 401, "unauthorized"),  # (no token could be read: 401 whatever it sent)
])
def test_refusals_say_status_and_code_and_end_the_connection(agent, asleep, header, status, code):
    if isinstance(header, dict) and header.get("file") == "FILE":
        header = dict(header, file=asleep["name"])
    with tcp(agent) as s:
        reply = ask(s, header)
        assert reply["ok"] is False and reply["status"] == status and reply["error"]["code"] == code, reply
        assert reply["error"]["message"]
        assert s.recv(1) == b""
    assert api(agent, "GET", "/v1/host")["features"] == ["bulk-copy/1"]  # HTTP on the same port is unharmed


def test_write_lands_bytes_in_an_incoming_file_and_verify_checks_them(agent, asleep, tmp_path):
    payload = os.urandom(3 * 2**20 + 17)
    good = hashlib.sha256(payload).hexdigest()
    vm = api(agent, "GET", "/v1/host/vms/s1")
    api(agent, "POST", "/v1/host/incoming", json={
        "move_id": "mv-bulk1", "platform": vm.get("platform") or {},
        "files": [{"name": "memory", "size": len(payload), "sha256": good}],
        "vm": {"name": "arriving", "shape": vm["shape"], "entry": "count", "bundle": vm["bundle"],
               "bundle_fingerprint": vm["bundle_fingerprint"]}})
    with tcp(agent) as s:  # a write past the declared size is refused before any byte moves
        reply = ask(s, {"op": "write", "token": TOKEN, "move": "mv-bulk1", "file": "memory", "offset": 1,
                        "length": len(payload)})
        assert (reply["status"], reply["error"]["code"]) == (400, "invalid_argument")
    damaged = bytes([payload[0] ^ 1]) + payload[1:]
    for body, ok in ((damaged, False), (payload, True)):
        with tcp(agent) as s:
            assert ask(s, {"op": "write", "token": TOKEN, "move": "mv-bulk1", "file": "memory", "offset": 0,
                           "length": len(body)}) == {"ok": True}
            s.sendall(body)
            assert ask(s, b"") == {"ok": True, "written": len(body)}
        v = api(agent, "POST", "/v1/host/incoming/mv-bulk1/verify")
        assert v["verified"] is ok and v["files"][0]["match"] is ok
        assert v["files"][0]["sha256"] == hashlib.sha256(body).hexdigest()
    assert api(agent, "POST", "/v1/host/incoming/mv-bulk1/install")["state"] == "sleeping"


def test_a_writer_that_stops_early_gets_no_closing_reply_and_verify_says_no(agent, asleep):
    vm = api(agent, "GET", "/v1/host/vms/s1")
    size = 2 * 2**20
    api(agent, "POST", "/v1/host/incoming", json={
        "move_id": "mv-bulk2", "platform": vm.get("platform") or {},
        "files": [{"name": "memory", "size": size, "sha256": "0" * 64}],
        "vm": {"name": "arriving2", "shape": vm["shape"], "entry": "count", "bundle": vm["bundle"],
               "bundle_fingerprint": vm["bundle_fingerprint"]}})
    with tcp(agent) as s:
        assert ask(s, {"op": "write", "token": TOKEN, "move": "mv-bulk2", "file": "memory", "offset": 0,
                       "length": size})["ok"]
        s.sendall(b"x" * 1000)
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100) == b""
    assert api(agent, "POST", "/v1/host/incoming/mv-bulk2/verify")["verified"] is False
    api(agent, "DELETE", "/v1/host/incoming/mv-bulk2")
    assert api(agent, "GET", "/v1/host/incoming")["incoming"] == []


def test_verify_and_install_wait_for_writes_in_flight(agent, asleep):
    payload = os.urandom(2 * 2**20)
    vm = api(agent, "GET", "/v1/host/vms/s1")
    api(agent, "POST", "/v1/host/incoming", json={
        "move_id": "mv-bulk3", "platform": vm.get("platform") or {},
        "files": [{"name": "memory", "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}],
        "vm": {"name": "arriving3", "shape": vm["shape"], "entry": "count", "bundle": vm["bundle"],
               "bundle_fingerprint": vm["bundle_fingerprint"]}})
    with tcp(agent) as s:
        assert ask(s, {"op": "write", "token": TOKEN, "move": "mv-bulk3", "file": "memory", "offset": 0,
                       "length": len(payload)})["ok"]
        s.sendall(payload[:1000])
        for step in ("verify", "install"):
            r = httpx.post(f"{agent.url}/v1/host/incoming/mv-bulk3/{step}",
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "writes_in_flight"), r.text
        s.sendall(payload[1000:])
        assert ask(s, b"") == {"ok": True, "written": len(payload)}
    # the write counted as ended before its closing reply went out
    r = httpx.post(f"{agent.url}/v1/host/incoming/mv-bulk3/verify",
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200 and r.json()["verified"] is True
    assert api(agent, "POST", "/v1/host/incoming/mv-bulk3/install")["state"] == "sleeping"
