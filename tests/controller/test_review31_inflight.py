"""Review 31: a controller killed while a create was on its way to a host (the host slow or
frozen) forgot it on SQLite: the name was placed again on another host after the restart,
and once the first host carried out the create the VM ran on two hosts."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from support import start_agent, start_controller, wait_until


def _c(ctl) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                        timeout=60)


def _two_hosts(tmp_path):
    """Two fake-backend agents registered as h1 and h2 with a listening controller, connected."""
    a1 = start_agent(tmp_path, backend="fake", name="a1")
    a2 = start_agent(tmp_path, backend="fake", name="a2")
    ctl = start_controller(tmp_path, listen=True, token="ct")
    c = _c(ctl)
    for name, a in (("h1", a1), ("h2", a2)):
        r = c.post("/v1/hosts", json={"name": name, "addr": a.url, "token": a.token})
        assert r.status_code == 201, r.text
    wait_until(lambda: all(h.get("connected") for h in c.get("/v1/hosts").json()["hosts"]), what="connected")
    return a1, a2, ctl, c


def test_a_create_in_flight_when_the_controller_dies_holds_its_name_after_the_restart(tmp_path):
    a1, a2, ctl, c = _two_hosts(tmp_path)
    try:
        a1.popen.send_signal(signal.SIGSTOP)  # the create reaches h1's socket, unread
        body = {"name": "tw1", "host": "h1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "x"}
        def create() -> None:
            try:
                _c(ctl).post("/v1/vms", json=body)
            except httpx.HTTPError:  # (the controller is killed under it: its caller gets no answer)
                pass

        threading.Thread(target=create, daemon=True).start()
        # (sent: the create waits on h1's answer)
        wait_until(lambda: c.get("/v1/vms/tw1").status_code == 409, what="the create under way")
        ctl.stop(signal.SIGKILL)
        ctl = start_controller(tmp_path, listen=True, token="ct")
        c = _c(ctl)
        r = c.get("/v1/vms/tw1")
        assert r.status_code == 409 and r.json()["error"]["details"].get("being_created"), r.text
        r = c.post("/v1/vms", json={**body, "host": None})  # placement would choose h2 (h1 is out of reach)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "vm_exists"), r.text
        a1.popen.send_signal(signal.SIGCONT)  # h1 reads the create and makes the VM
        wait_until(lambda: c.get("/v1/vms/tw1").status_code == 200, timeout=30, what="tw1 recorded")
        assert c.get("/v1/vms/tw1").json()["host"] == "h1"
        for a in (a1, a2):
            names = [v["name"] for v in httpx.get(a.url + "/v1/host/vms", headers={"Authorization": f"Bearer {a.token}"},
                                                   timeout=10).json()["vms"] if v["state"] != "deleted"]
            assert names == (["tw1"] if a is a1 else []), (a.url, names)
        def placed():
            return [e for e in c.get("/v1/events", params={"since": 0, "limit": 500}).json()["events"]
                    if e["type"] == "placed" and e.get("vm") == "tw1"]
        wait_until(placed, timeout=10, what="tw1's placed")  # (said by the restarted controller's check)
        time.sleep(1.5)
        assert len(placed()) == 1, placed()
        assert c.delete("/v1/vms/tw1").status_code == 204
    finally:
        a1.popen.send_signal(signal.SIGCONT)
        ctl.stop()
        a1.stop()
        a2.stop()


def test_a_create_whose_connection_never_opened_holds_nothing(tmp_path):
    """(the diff review: its in-flight record stayed, as an unanswered create's: the next try
    was `409 vm_exists` on the host that never got it, and the name held until it answered)"""
    a1, a2, ctl, c = _two_hosts(tmp_path)
    try:
        a1.stop(signal.SIGKILL)  # its port refuses: a create is never sent
        body = {"name": "x1", "host": "h1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "x"}
        r = c.post("/v1/vms", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "fleet_full"), r.text
        assert c.get("/v1/vms/x1").status_code == 404
        r = c.post("/v1/vms", json={**body, "host": None})
        assert r.status_code == 201 and r.json()["host"] == "h2", r.text
        assert c.delete("/v1/vms/x1").status_code == 204
    finally:
        ctl.stop()
        a1.stop()
        a2.stop()
