"""Thirty-eighth session: the agent refuses move ids no move has (a control character, say), but
still wakes a VM an older agent marked with one by that mark; a mark whose move is recorded and
live is left alone. (Settling a mark whose move the store lost was tried and taken back: woken
at its source it could run twice — the diff review.) (Fake-backend agents, real controllers.)"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from support import start_agent, wait_until

LEASE = {"FUSE_MOVE_LEASE_S": "2"}  # (the judging a lease apart takes: short, for the test's time)


def _h(agent) -> dict:
    return {"Authorization": f"Bearer {agent.token}"}


def _vms(agent) -> dict[str, dict]:
    r = httpx.get(agent.url + "/v1/host/vms", headers=_h(agent), timeout=10)
    return {v["name"]: v for v in r.json()["vms"] if v["state"] != "deleted"}


def _incoming(agent) -> list:
    return httpx.get(agent.url + "/v1/host/incoming", headers=_h(agent), timeout=10).json()["incoming"]


def _events(client, type_: str) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if e["type"] == type_]


def _store_lost(fleet, crash_at: str) -> tuple[dict, str]:
    """Hosts a and b (agents a1, a2), vm v1 moving from a to b, the controller killed at
    ``crash_at`` and started again on an empty store (its disk lost), both hosts registered
    again: (the agents by host, the move's id)."""
    agents = {"a": fleet.agent("a1"), "b": fleet.agent("a2")}
    fleet.add("a", agents["a"])
    fleet.add("b", agents["b"])
    fleet.restart(env={"FUSE_TEST_CRASH_AT": crash_at})
    fleet.client.vms.create({"name": "v1", "host": "a", "shape": {"vcpus": 1, "mem_mib": 256},
                             "entry": "sleep 600"})
    move = fleet.client.moves.create("v1", to="b")
    wait_until(lambda: fleet.ctl.popen.poll() is not None, timeout=60, what=f"the controller's crash at {crash_at}")
    fleet.ctl.state_dir.rename(fleet.ctl.state_dir.with_name("controller.lost"))
    fleet.restart(env=LEASE)
    fleet.add("a", agents["a"])
    fleet.add("b", agents["b"])
    return agents, move["id"]


@pytest.mark.timeout(180)
def test_a_mark_whose_move_is_recorded_and_live_is_left_alone(fleet):
    agents = {"a": fleet.agent("a1"), "b": fleet.agent("a2")}
    fleet.add("a", agents["a"])
    fleet.add("b", agents["b"])
    fleet.restart(env={"FUSE_TEST_PAUSE_AT": "copied:40", **LEASE})  # (the move holds, live, after its copy)
    fleet.client.vms.create({"name": "v1", "host": "a", "shape": {"vcpus": 1, "mem_mib": 256},
                             "entry": "sleep 600"})
    move = fleet.client.moves.create("v1", to="b")
    wait_until(lambda: (m := fleet.client.moves.get(move["id"]))["state"] == "copying"
               and 0 < m["copied_bytes"] == m["total_bytes"], timeout=60, what="the copy through")
    for _ in range(8):  # four leases and more, looked at on the way
        time.sleep(1)
        assert _vms(agents["a"])["v1"]["move_id"] == move["id"]
        m = fleet.client.moves.get(move["id"])
        assert m["state"] == "copying" and not m["rolling_back"], m
    assert _incoming(agents["b"]) and _events(fleet.client, "move_mark_settled") == []


def test_such_move_ids_are_refused_now_and_a_vm_an_older_agent_marked_with_one_goes_by_its_mark(tmp_path, procs):
    """The agent took any string as a move id (review 38's fuzz left six VMs marked with control
    and non-ASCII characters). It refuses those now (400) for a sleep, a wake, a delete and an
    incoming move's path; a VM an older agent marked so still goes by its own id."""
    agent = start_agent(tmp_path, backend="fake", name="a1")
    procs.append(agent)
    h = _h(agent)
    with httpx.Client(base_url=agent.url, headers=h, timeout=30) as c:
        assert c.post("/v1/host/vms", json={"name": "lg", "shape": {"vcpus": 1, "mem_mib": 128},
                                            "entry": "sleep 600"}).status_code == 201
        for bad in ("a\nb", "mv-\x00", "ªØ\n\u00ad)", "..", "x" * 129):
            r = c.post("/v1/host/vms/lg/sleep", json={"move_id": bad})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (bad, r.text)
            r = c.post("/v1/host/vms/lg/wake", json={"move_id": bad})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (bad, r.text)
            r = c.delete("/v1/host/vms/lg", params={"move_id": bad})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (bad, r.text)
        for path in ("/v1/host/incoming/a%0Ab", "/v1/host/incoming/%C2%AA"):
            r = c.delete(path)
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (path, r.text)
            r = c.post(path + "/verify")
            assert r.status_code == 400, (path, r.text)
        assert _vms(agent)["lg"]["state"] == "running"
        # every controller's id, and the shorter ones other callers give, still mark a VM
        r = c.post("/v1/host/vms/lg/sleep", json={"move_id": "mv-0123456789ab"})
        assert r.status_code == 200 and r.json()["move_id"] == "mv-0123456789ab", r.text
        assert c.post("/v1/host/vms/lg/wake", json={"move_id": "mv-0123456789ab"}).status_code == 200
        assert c.post("/v1/host/vms/lg/sleep").status_code == 200  # (asleep, unmarked)
    # an older agent marked it with any string: its record says so
    agent.stop()
    legacy = "ªØ\n\u00ad)"
    record = agent.state_dir / "vms" / "lg" / "vm.json"
    rec = json.loads(record.read_text())
    rec.update(move_id=legacy, move_role="source")
    record.write_text(json.dumps(rec))
    agent = start_agent(tmp_path, backend="fake", name="a1", port=int(agent.url.rsplit(":", 1)[1]))
    procs.append(agent)
    assert _vms(agent)["lg"]["move_id"] == legacy
    r = httpx.post(agent.url + "/v1/host/vms/lg/wake", headers=h, json={"move_id": "other\n"}, timeout=10)
    assert r.status_code == 400, r.text  # (not its mark: refused as any such id)
    # it goes by its own mark still (the way out by hand for a VM so marked)
    r = httpx.post(agent.url + "/v1/host/vms/lg/wake", headers=h, json={"move_id": legacy, "clear_mark": True},
                   timeout=30)
    assert r.status_code == 200 and not r.json().get("move_id"), r.text
