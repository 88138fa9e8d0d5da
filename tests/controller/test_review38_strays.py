"""Thirty-eighth session: a VM held by the mark of a move the controller's store has no record
of (the store lost mid-move, or restored from before it; a mark something else gave the agent)
was held for good: wake, sleep, delete and move all 409 ``move_in_progress`` naming a move that
``GET /v1/moves/{id}`` answered 404, and its host could not be deregistered. The janitor now
settles such a mark as a failed move's once it has seen it unknown a lease apart; a mark whose
move is recorded and live is left alone. The agent refuses move ids no move has (a control
character, say), but still wakes and removes a VM an older agent marked with one.
(Fake-backend agents and real controllers, on loopback.)"""

from __future__ import annotations

import json
import time

import httpx
import pytest

import fuse
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
def test_a_vm_held_by_a_move_a_fresh_store_has_no_record_of_is_woken_at_home(fleet):
    """(was: v1 asleep on a, marked, for good: every call 409 move_in_progress naming a move
    that reads 404, a's deregister refused, b's incoming copy left holding its room)"""
    agents, move_id = _store_lost(fleet, "copied")  # (a asleep and marked, b's copy received)
    assert _vms(agents["a"])["v1"]["move_id"] == move_id and _incoming(agents["b"]), "the move's state to settle"
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.get(move_id)
    assert info.value.status == 404
    wait_until(lambda: (v := _vms(agents["a"]).get("v1")) is not None and v["state"] == "running"
               and not v.get("move_id"), timeout=60, interval=0.5, what="v1 woken at home, unmarked")
    assert _incoming(agents["b"]) == [] and "v1" not in _vms(agents["b"])
    (event,) = _events(fleet.client, "move_mark_settled")
    assert (event["move"], event["vm"], event["host"]) == (move_id, "v1", "a"), event
    assert "woken at a" in event["done"] and "incoming copy on b aborted" in event["done"], event
    wait_until(lambda: [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()]
               == [("v1", "a", "running")], timeout=30, what="the fleet's list")
    fleet.client.vms.sleep("v1")  # (was: 409 move_in_progress, for good)
    fleet.client.vms.delete("v1")
    fleet.client.hosts.deregister("a")


@pytest.mark.timeout(180)
def test_a_vm_the_unrecorded_move_woke_on_its_target_is_not_woken_at_its_source_too(fleet):
    """The move had woken v1 on b when its store was lost: the marked copy on a is the stale
    one, removed, never woken (the VM would run twice)."""
    agents, move_id = _store_lost(fleet, "woke")
    assert _vms(agents["b"])["v1"]["state"] == "running" and _vms(agents["a"])["v1"]["move_id"] == move_id
    wait_until(lambda: "v1" not in _vms(agents["a"]), timeout=60, interval=0.5, what="a's stale copy removed")
    assert _vms(agents["b"])["v1"]["state"] == "running"
    (event,) = _events(fleet.client, "move_mark_settled")
    assert "runs on b" in event["done"] and "removed" in event["done"], event
    wait_until(lambda: [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()]
               == [("v1", "b", "running")], timeout=30, what="the fleet's list")


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


def test_a_vm_an_older_agent_marked_with_any_string_is_released_and_such_ids_are_refused_now(tmp_path, procs):
    """The agent took any string as a move id (review 38's fuzz left six VMs marked with control
    and non-ASCII characters). It refuses those now (400) for a sleep, a wake, a delete and an
    incoming move's path; a VM an older agent marked so still wakes and goes by its own id, and
    a controller releases it."""
    from support import start_controller

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
    # a controller, which never made that move, releases it: unmarked, asleep as it was
    ctl = start_controller(tmp_path, env=LEASE)
    procs.append(ctl)
    with fuse.Client(ctl.url) as client:
        client.hosts.register(fuse.RegisterHostRequest(
            id="h1", url=agent.url, token=agent.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=4, ram_mb=2048, cpus=2)))
        wait_until(lambda: not _vms(agent)["lg"].get("move_id"), timeout=60, interval=0.5, what="lg unmarked")
        assert _vms(agent)["lg"]["state"] == "sleeping"
        (event,) = _events(client, "move_mark_settled")
        assert event["move"] == legacy and "unmarked at h1, asleep" in event["done"], event
        client.vms.wake("lg")  # (was: 409 move_in_progress, for good)
        client.vms.delete("lg")


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_two_replicas_on_postgresql_release_a_mark_no_move_recorded_and_leave_a_live_moves(tmp_path, procs, postgres):
    """On a shared PostgreSQL store: v1 marked on its host by a move no replica made (its
    agent was given the mark by hand) is woken at home; v2, held by a move replica a drives
    (paused after its copy, its lease renewed), is left alone by both."""
    from support import start_controller
    from test_moves import register_src_dst, vm_body

    db = postgres.create_db("fuse_review38_strays")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_PAUSE_AT": "copied:40", **LEASE})
    procs.append(a)
    b = start_controller(tmp_path, db=db, name="ctl-b", env=LEASE)
    procs.append(b)
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    procs.extend(agents)
    src = agents[0]
    with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
        register_src_dst(ca, cb, agents)
        ca.vms.create(vm_body("v1", mem=256, host="src"))
        ca.vms.create(vm_body("v2", mem=256, host="src"))
        move = ca.moves.create("v2", to="dst")
        wait_until(lambda: (m := cb.moves.get(move["id"]))["state"] == "copying"
                   and 0 < m["copied_bytes"] == m["total_bytes"], timeout=60, what="v2's copy through")
        r = httpx.post(src.url + "/v1/host/vms/v1/sleep", headers=_h(src), json={"move_id": "mv-feedfacecafe"},
                       timeout=30)
        assert r.status_code == 200 and r.json()["move_id"] == "mv-feedfacecafe", r.text
        wait_until(lambda: (v := _vms(src)["v1"])["state"] == "running" and not v.get("move_id"), timeout=60,
                   interval=0.5, what="v1 woken at home, unmarked")
        time.sleep(6)  # (three leases more: v2's mark stays its live move's)
        assert _vms(src)["v2"]["move_id"] == move["id"]
        m = cb.moves.get(move["id"])
        assert m["state"] == "copying" and not m["rolling_back"], m
        settled = _events(cb, "move_mark_settled")
        assert settled and {(e["move"], e["vm"]) for e in settled} == {("mv-feedfacecafe", "v1")}, settled
