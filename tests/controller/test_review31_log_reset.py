"""Review 31: an agent whose event log went back while its identity stayed (its log and
`.next` removed, or both restored from an older copy) gives ids the controller had read
already. The merged stream used to skip everything up to the old cursor for good (and the
VMs made meanwhile were never adopted: a deregister answered 204 while one ran)."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from support import start_agent, start_controller, wait_until


@pytest.fixture
def fleet(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    ctl = start_controller(tmp_path, listen=True, token="ct")
    c = httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                     timeout=30)
    r = c.post("/v1/hosts", json={"name": "h", "addr": agent.url, "token": agent.token})
    assert r.status_code == 201, r.text
    box = {"agent": agent}

    def restart(between=lambda: None):
        port = int(box["agent"].url.rsplit(":", 1)[1])
        box["agent"].stop()
        between()
        box["agent"] = start_agent(tmp_path, backend="fake", port=port)

    yield c, box, restart
    a = httpx.Client(base_url=box["agent"].url, headers={"Authorization": f"Bearer {box['agent'].token}"})
    for vm in a.get("/v1/host/vms").json().get("vms", []):
        a.delete(f"/v1/host/vms/{vm['name']}")
    ctl.stop()
    box["agent"].stop()


def _vm(c: httpx.Client, name: str) -> None:
    r = c.post("/v1/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "x"})
    assert r.status_code in (200, 201), r.text


def _stream(c: httpx.Client) -> list[dict]:
    return c.get("/v1/events", params={"since": 0, "limit": 500}).json()["events"]


def _states(events: list[dict], vm: str) -> list[str]:
    return [e.get("to") for e in events if e["type"] == "vm_state" and e.get("vm") == vm]


def test_a_log_restored_from_an_older_copy_is_read_again_and_its_old_events_not_twice(fleet):
    c, box, restart = fleet
    state = box["agent"].state_dir
    _vm(c, "a")
    assert c.delete("/v1/vms/a").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "a"), what="a's events")
    for f in ("events.jsonl", "events.jsonl.next"):
        shutil.copy(state / f, state.parent / (f + ".backup"))
    _vm(c, "b")
    assert c.delete("/v1/vms/b").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "b"), what="b's events")

    def restore():
        for f in ("events.jsonl", "events.jsonl.next"):
            shutil.copy(state.parent / (f + ".backup"), state / f)
    restart(restore)
    _vm(c, "c")  # its events take ids 4.. again, as b's did
    wait_until(lambda: "running" in _states(_stream(c), "c"), timeout=20, what="c's events in the stream")
    events = _stream(c)
    assert [e["type"] for e in events].count("host_events_reset") == 1
    reset = next(e for e in events if e["type"] == "host_events_reset")
    assert reset["host"] == "h" and reset["read_to"] == 6 and 3 <= reset["newest"] < 6, reset
    for vm in ("a", "b"):  # the older copy's events are not stored a second time
        assert _states(events, vm) == ["creating", "running", "deleted"], (vm, events)
    assert _states(events, "c")[:2] == ["creating", "running"]
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids))


def test_a_removed_log_is_read_from_its_start_and_its_vms_adopted(fleet):
    c, box, restart = fleet
    _vm(c, "a")
    assert c.delete("/v1/vms/a").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "a"), what="a's events")
    state = box["agent"].state_dir
    restart(lambda: [(state / f).unlink() for f in ("events.jsonl", "events.jsonl.next")])
    a = httpx.Client(base_url=box["agent"].url, headers={"Authorization": f"Bearer {box['agent'].token}"},
                     timeout=30)
    r = a.post("/v1/host/vms", json={"name": "e", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "x"})
    assert r.status_code in (200, 201), r.text  # made on the host itself: the controller learns it by its events
    wait_until(lambda: any(v["name"] == "e" for v in c.get("/v1/vms").json()["vms"]), timeout=20,
               what="e adopted")
    assert c.delete("/v1/hosts/h").status_code == 409  # a VM runs there: not deregistered under it
    events = _stream(c)
    assert _states(events, "e")[:2] == ["creating", "running"]
    assert _states(events, "a") == ["creating", "running", "deleted"]
    time.sleep(1.5)  # polls go on without another reset
    assert [e["type"] for e in _stream(c)].count("host_events_reset") == 1
