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
    box = {"agent": agent, "ctl": ctl}

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


def test_a_log_restored_while_the_controller_looked_away_and_written_past_its_cursor_is_read_again(fleet):
    """(the diff review: the agent restarted on an older copy while the controller was away and
    wrote more events than it had lost before the next read: its newest id was past the cursor,
    so nothing looked amiss, and the events at the ids read already were never stored)"""
    import signal

    c, box, restart = fleet
    state = box["agent"].state_dir
    for f in ("events.jsonl", "events.jsonl.next"):
        shutil.copy(state / f, state.parent / (f + ".backup"))
    for vm in ("a", "b"):
        _vm(c, vm)
        assert c.delete(f"/v1/vms/{vm}").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "b"), what="b's events")

    def restore():
        for f in ("events.jsonl", "events.jsonl.next"):
            shutil.copy(state.parent / (f + ".backup"), state / f)
    ctl = box["ctl"]
    ctl.popen.send_signal(signal.SIGSTOP)  # the controller looks away
    try:
        restart(restore)
        a = httpx.Client(base_url=box["agent"].url, headers={"Authorization": f"Bearer {box['agent'].token}"},
                         timeout=30)
        for vm in ("n1", "n2", "n3"):  # past the ids the controller read (a and b: 6)
            assert a.post("/v1/host/vms", json={"name": vm, "shape": {"vcpus": 1, "mem_mib": 256},
                                                "entry": "x"}).status_code in (200, 201)
            assert a.delete(f"/v1/host/vms/{vm}").status_code in (200, 204)
        assert a.get("/v1/host").json()["last_event_id"] > 6
    finally:
        ctl.popen.send_signal(signal.SIGCONT)
    wait_until(lambda: all("deleted" in _states(_stream(c), vm) for vm in ("n1", "n2", "n3")), timeout=20,
               what="the restored log's events")
    events = _stream(c)
    assert [e["type"] for e in events].count("host_events_reset") == 1
    for vm in ("n1", "n2", "n3"):
        assert _states(events, vm) == ["creating", "running", "deleted"], (vm, _states(events, vm))


def test_a_host_registered_again_after_its_log_went_back_is_not_said_to_go_back_again(fleet):
    """(the diff review: the new name had no cursor, read the old log's newest stored id as
    where to start, and announced a second host_events_reset for a log nobody touched)"""
    c, box, restart = fleet
    for vm in ("a", "a2"):  # (the old log longer than the new one will be)
        _vm(c, vm)
        assert c.delete(f"/v1/vms/{vm}").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "a2"), what="a2's events")
    state = box["agent"].state_dir
    restart(lambda: [(state / f).unlink() for f in ("events.jsonl", "events.jsonl.next")])
    _vm(c, "b")
    wait_until(lambda: "running" in _states(_stream(c), "b"), timeout=20, what="b's events")
    assert c.delete("/v1/vms/b").status_code == 204
    wait_until(lambda: "deleted" in _states(_stream(c), "b"), what="b's delete read")
    assert c.delete("/v1/hosts/h").status_code == 204
    r = c.post("/v1/hosts", json={"name": "h", "addr": box["agent"].url, "token": box["agent"].token})
    assert r.status_code == 201, r.text
    _vm(c, "d")
    wait_until(lambda: "running" in _states(_stream(c), "d"), timeout=20, what="d's events")
    time.sleep(1.5)
    events = _stream(c)
    assert [e["type"] for e in events].count("host_events_reset") == 1, [e for e in events
                                                                         if e["type"] == "host_events_reset"]
    assert _states(events, "b") == ["creating", "running", "deleted"]  # (not read a second time)
