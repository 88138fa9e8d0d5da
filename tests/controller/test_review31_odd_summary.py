"""Review 31: one host whose summary (`GET /v1/host`) carries a figure that is no whole number
(null, a string, 1e400) or is no JSON object made `GET /v1/hosts` and every unpinned create a
500 for the whole fleet. Such a host reads as out of reach, saying why; the others place."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from support import start_agent, start_controller, wait_until

GOOD = {"cpus": 2, "ram_mb": 1024, "storage_gb": 5, "arch": "amd64", "backend": "qemu", "agent_id": "odd-agent",
        "free_vcpus": 2, "free_mem_mib": 1024, "vm_count": 0}


class Odd(BaseHTTPRequestHandler):
    summary: object = GOOD

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        body = {"/v1/host": type(self).summary, "/v1/host/vms": {"vms": []},
                "/v1/host/events": {"events": [], "next": 0}}.get(path)
        raw = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def fleet(tmp_path):
    odd = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=odd.serve_forever, daemon=True).start()
    agent = start_agent(tmp_path, backend="fake")
    ctl = start_controller(tmp_path, listen=True, token="ct")
    c = httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                     timeout=30)
    r = c.post("/v1/hosts", json={"id": "odd", "url": f"http://127.0.0.1:{odd.server_address[1]}", "token": "t",
                                  "backend": "qemu", "capacity": {"vm_count": 2}})
    assert r.status_code in (200, 201), r.text
    r = c.post("/v1/hosts", json={"name": "good", "addr": agent.url, "token": agent.token})
    assert r.status_code == 201, r.text
    yield c
    Odd.summary = GOOD
    for v in c.get("/v1/vms").json().get("vms", []):
        c.delete(f"/v1/vms/{v['name']}")
    ctl.stop()
    agent.stop()
    odd.shutdown()


@pytest.mark.parametrize("summary", [
    {**GOOD, "free_vcpus": None}, {**GOOD, "free_mem_mib": "lots"}, '{"free_mem_mib": 1e400, "free_vcpus": 1}',
    [GOOD], {**GOOD, "bundles": ["linux"]},
], ids=["null", "a string", "1e400", "a list", "bundles of strings"])
def test_an_odd_summary_is_that_hosts_outage_not_the_fleets_500(fleet, summary):
    c = fleet
    Odd.summary = summary

    def odd_out():
        hosts = c.get("/v1/hosts")
        assert hosts.status_code == 200, hosts.text
        return next(h for h in hosts.json()["hosts"] if h["id"] == "odd").get("connected") is False
    wait_until(odd_out, timeout=15, what="the odd host read as out of reach")
    said = [e for e in c.get("/v1/events", params={"since": 0}).json()["events"]
            if e["type"] == "host_disconnected" and e.get("host") == "odd"]
    assert said and "is not a fuse agent's" in said[-1]["reason"], said
    for i in range(2):
        r = c.post("/v1/vms", json={"name": f"v{i}", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true"})
        assert r.status_code == 201 and r.json()["host"] == "good", r.text
