"""Twenty-seventh session: the controller reads no more of a host's answer than any agent sends
(a host answering 150 MiB on each poll took the controller to 1.5 GB; 1.2 GiB, to 7.2 GB)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from support import wait_until

FACTS = {"cpus": 4, "ram_mb": 4000, "storage_gb": 10, "arch": "amd64", "backend": "qemu", "agent_id": "stub-1"}


class Stub:
    """Answers GET /v1/host with the facts, padded to ``pad`` bytes (sent chunked when asked)."""

    def __init__(self):
        self.pad, self.chunked = 0, False
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                if self.path.startswith("/v1/host/vms"):
                    body = b'{"vms": []}'
                elif self.path.startswith("/v1/host/events"):
                    body = b'{"events": [], "next": 0}'
                else:
                    body = json.dumps({**FACTS, "pad": "x" * stub.pad}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if stub.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 2**20):
                        part = body[i:i + 2**20]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *a):
                pass

            def handle(self):  # (the controller hangs up mid-answer on purpose)
                try:
                    super().handle()
                except ConnectionError:
                    pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


@pytest.fixture
def raw(controller):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c",
                      timeout=60) as c:
        yield c


@pytest.mark.parametrize("chunked", [False, True])
def test_a_host_whose_facts_are_huge_is_not_registered(stub, raw, chunked):
    stub.pad, stub.chunked = 12 * 2**20, chunked
    r = raw.post("/v1/hosts", json={"id": "huge", "url": stub.url, "token": "t", "capacity": {"vm_count": 4}})
    assert (r.status_code, r.json()["error"]["code"]) == (502, "host_unreachable"), r.text[:500]
    assert "more than" in r.json()["error"]["message"]
    assert raw.get("/v1/hosts/huge").status_code == 404


def test_a_registered_host_that_starts_answering_huge_facts_reads_as_disconnected(stub, raw):
    r = raw.post("/v1/hosts", json={"id": "h", "url": stub.url, "token": "t", "capacity": {"vm_count": 4}})
    assert r.status_code == 201, r.text
    wait_until(lambda: raw.get("/v1/hosts/h").json()["connected"], timeout=30, what="connected")
    stub.pad, stub.chunked = 40 * 2**20, True
    wait_until(lambda: not raw.get("/v1/hosts/h").json()["connected"], timeout=60, what="disconnected")
    events = raw.get("/v1/events", params={"since": 0}).json()["events"]
    said = [json.dumps(e) for e in events if e["type"] == "host_disconnected"]
    assert any("more than" in why for why in said), said
