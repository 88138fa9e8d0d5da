"""Twenty-seventh session: the agent reads request bodies as the controller does (16 MiB at most,
a move's raw file chunk 64 MiB), and a chunk for a move that is not there is refused unread."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import httpx

from support import start_agent


def _head_only(url: str, token: str, method: str, path: str, length: int, ctype: str = "application/json") -> bytes:
    """Send a request's head declaring ``length`` body bytes, none of them, and read the answer."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=20) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: {ctype}\r\nContent-Length: {length}\r\n\r\n".encode())
        s.settimeout(20)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_a_body_past_16_mib_is_413_before_it_is_read(tmp_path):
    """(was: read whole into the agent's memory first: a 600 MiB body took it to 1.25 GB)"""
    agent = start_agent(tmp_path, backend="fake")
    try:
        answer = _head_only(agent.url, agent.token, "POST", "/v1/host/vms", 600 * 2**20)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        big = json.dumps({"name": "x" * (17 * 2**20)})
        r = httpx.post(agent.url + "/v1/host/vms", content=big, timeout=60,
                       headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "invalid_argument", r.text[:300]
        assert "at most 16777216" in r.json()["error"]["message"]

        def chunked():
            for _ in range(20):
                yield b" " * 2**20
        r = httpx.post(agent.url + "/v1/host/vms", content=chunked(), timeout=60,
                       headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"})
        assert r.status_code == 413, r.text[:300]
        # (review 30: it said "is 16935910 bytes", the bytes read when it stopped: the size is unknown)
        assert r.json()["error"]["message"] == ("the request body is over 16777216 bytes: at most 16777216 "
                                                "are read"), r.text[:300]
        # without the token it is 401 whatever it promises
        assert _head_only(agent.url, "wrong", "POST", "/v1/host/vms", 600 * 2**20).startswith(b"HTTP/1.1 401")
        assert httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}).status_code == 200
    finally:
        agent.stop()


def test_a_file_chunk_is_read_up_to_64_mib_and_not_at_all_for_a_move_not_here(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    try:
        answer = _head_only(agent.url, agent.token, "PUT", "/v1/host/incoming/no-such-move/files/state.bin",
                            10 * 2**20, "application/octet-stream")
        assert answer.startswith(b"HTTP/1.1 404"), answer[:300]
        answer = _head_only(agent.url, agent.token, "PUT", "/v1/host/incoming/no-such-move/files/state.bin",
                            65 * 2**20, "application/octet-stream")
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    finally:
        agent.stop()


def test_a_chunk_past_16_mib_still_lands_in_a_move_here(tmp_path):
    import hashlib
    import os
    agent = start_agent(tmp_path, backend="fake")
    h = {"Authorization": f"Bearer {agent.token}"}
    try:
        payload = os.urandom(20 * 2**20)
        r = httpx.post(agent.url + "/v1/host/incoming", headers=h, timeout=30, json={
            "move_id": "mv-big", "platform": {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"},
            "files": [{"name": "memory", "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}],
            "vm": {"name": "arriving", "shape": {"vcpus": 1, "mem_mib": 64}, "entry": "count", "bundle": "linux",
                   "bundle_fingerprint": "fake-bundle-0001"}})
        assert r.status_code == 201, r.text
        r = httpx.put(agent.url + "/v1/host/incoming/mv-big/files/memory", headers=h, content=payload, timeout=60)
        assert r.status_code == 200 and r.json()["written"] == len(payload), r.text[:300]
        assert httpx.post(agent.url + "/v1/host/incoming/mv-big/verify", headers=h, timeout=60).json()["verified"]
    finally:
        agent.stop()


def test_a_file_name_or_digest_with_a_trailing_newline_is_not_a_plain_name(tmp_path):
    """(was: 201 for "state.bin\\n": `$` matches before a final newline; such a file can never
    be sent over the HTTP copy path)"""
    import hashlib
    agent = start_agent(tmp_path, backend="fake")
    h = {"Authorization": f"Bearer {agent.token}"}
    good = hashlib.sha256(b"x").hexdigest()
    try:
        for name, digest in (("state.bin\n", good), ("state.bin", good + "\n")):
            r = httpx.post(agent.url + "/v1/host/incoming", headers=h, timeout=30, json={
                "move_id": "mv-nl", "platform": {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"},
                "files": [{"name": name, "size": 10, "sha256": digest}],
                "vm": {"name": "arriving", "shape": {"vcpus": 1, "mem_mib": 64}, "entry": "count", "bundle": "linux",
                       "bundle_fingerprint": "fake-bundle-0001"}})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (name, digest, r.text)
        assert httpx.get(agent.url + "/v1/host/incoming", headers=h).json()["incoming"] == []
    finally:
        agent.stop()


def test_a_bulk_write_streams_a_file_past_the_http_chunk_limit(tmp_path):
    """The limit is an HTTP chunk's: the bulk protocol streams a whole file in one write
    (the first version of the pre-read check refused a 256 MiB image's: 'chunks are at most')."""
    import hashlib
    from test_bulk_protocol import ask, tcp
    agent = start_agent(tmp_path, backend="fake")
    h = {"Authorization": f"Bearer {agent.token}"}
    size = 65 * 2**20
    try:
        r = httpx.post(agent.url + "/v1/host/incoming", headers=h, timeout=30, json={
            "move_id": "mv-bulk", "platform": {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"},
            "files": [{"name": "memory", "size": size, "sha256": hashlib.sha256(bytes(size)).hexdigest()}],
            "vm": {"name": "arriving", "shape": {"vcpus": 1, "mem_mib": 64}, "entry": "count", "bundle": "linux",
                   "bundle_fingerprint": "fake-bundle-0001"}})
        assert r.status_code == 201, r.text
        with tcp(agent) as s:
            s.settimeout(60)
            assert ask(s, {"op": "write", "token": agent.token, "move": "mv-bulk", "file": "memory", "offset": 0,
                           "length": size}) == {"ok": True}
            s.sendall(bytes(size))
            assert ask(s, b"") == {"ok": True, "written": size}
        assert httpx.post(agent.url + "/v1/host/incoming/mv-bulk/verify", headers=h, timeout=60).json()["verified"]
    finally:
        agent.stop()
