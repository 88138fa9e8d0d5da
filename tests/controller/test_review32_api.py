"""Thirty-second session: one request held a controller or an agent for minutes. The check
for a key named twice in a JSON object counted each key in a list of all of them (quadratic:
a body of 20,000 keys held the event loop ~10 s, one of 300,000 for more than 7 minutes, with
every poll, lease and request waiting); and a host's mig_profiles took any number of
entries, sent with every read of the host."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from support import start_agent

KEYS = 100_000  # (~250 s of the event loop before; well under a second now)


def _while_posting(client: httpx.Client, url: str, body: bytes) -> tuple[httpx.Response, float]:
    """(the POST's answer, the longest a health read waited while it was under way)"""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", client.post(url, content=body, headers={"content-type": "application/json"})))
    t.start()
    worst = 0.0
    while t.is_alive():
        began = time.monotonic()
        client.get("/v1/healthz" if url.startswith("/v1/hosts") else "/v1/host")
        worst = max(worst, time.monotonic() - began)
        t.join(0.05)
    return out["r"], worst


def _labels(n: int) -> bytes:
    pairs = ",".join(f'"k{i}": "v"' for i in range(n))
    return ('{"id": "h", "url": "http://127.0.0.1:1", "capacity": {"vm_count": 1, "cpus": 1, "ram_mb": 1, '
            '"storage_gb": 1}, "labels": {' + pairs + "}}").encode()


def test_a_body_of_many_keys_is_refused_without_holding_the_controller(controller):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c",
                      timeout=120) as c:
        r, worst = _while_posting(c, "/v1/hosts", _labels(KEYS))
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
        assert "at most 128 labels" in r.json()["error"]["message"]
        assert worst < 15, f"the controller answered nothing for {worst:.1f} s"
        # a key named twice among them is still found
        twice = _labels(KEYS).replace(b'"k7": "v"', b'"k8": "v"')
        r = c.post("/v1/hosts", content=twice, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "appears twice" in r.text and "k8" in r.text, r.text


def test_a_body_of_many_keys_is_refused_without_holding_the_agent(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    try:
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=120) as c:
            extra = ",".join(f'"x{i}": 1' for i in range(KEYS))
            body = ('{"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", ' + extra + "}").encode()
            r, worst = _while_posting(c, "/v1/host/vms", body)
            assert r.status_code == 400, r.text
            assert worst < 15, f"the agent answered nothing for {worst:.1f} s"
    finally:
        agent.stop()


@pytest.mark.parametrize("n, ok", [(128, True), (129, False)])
def test_a_host_declares_at_most_128_mig_profiles(controller, n, ok):
    profiles = {f"1g.{k}gb": 1 for k in range(1, n + 1)}
    body = {"id": "g", "url": "http://127.0.0.1:1", "backend": "qemu",
            "capacity": {"vm_count": 1, "cpus": 1, "ram_mb": 1, "storage_gb": 1, "mig_profiles": profiles}}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c",
                      timeout=60) as c:
        r = c.post("/v1/hosts", json=body)
    if ok:  # (its agent does not answer: the declared figures stand, with a warning)
        assert r.status_code == 201, r.text
        assert len(r.json()["capacity"]["mig_profiles"]) == 128
    else:
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
        assert "at most 128 profiles, not 129" in r.json()["error"]["message"]
