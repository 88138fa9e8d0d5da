"""Moves and drains, from a third review: a move request's fields each name
something (an empty or blank one is 400 invalid_argument, never looked up as a
host or VM called ""), and a drain reports VMs whose run is over (exited,
failed) as finished, not stuck: deregister lets them go with the host. Real
agent processes (fake backend) on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from fuse.controller.service import Controller
from fuse.errors import InvalidArgument
from support import agent_states, end_fake_vm, wait_until

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def vm_body(name, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "count", **kw}




def post_move(fleet, body: dict) -> httpx.Response:
    """POST /v1/moves as sent (the SDK leaves an empty ``to`` out)."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(fleet.ctl.socket)), base_url="http://c") as c:
        return c.post("/v1/moves", json=body, timeout=30)




# ---- empty names in a move request ------------------------------------------------------

BLANK = [
    ({"vm": "cli1", "to": ""}, "to: ", ["leave to out", "best fit"]),
    ({"vm": "cli1", "to": "  "}, "to: ", ["leave to out", "best fit"]),
    ({"vm": "", "to": "h2"}, "vm: ", ["name the VM"]),
    ({"vm": " ", "to": "h2"}, "vm: ", ["name the VM"]),
    ({"flashvm": "", "to": "h2"}, "flashvm: ", ["name the VM"]),
    ({"vm": "cli1", "host": ""}, "host: ", ["leave host out"]),
]
BLANK_IDS = ["an empty to", "a blank to", "an empty vm", "a blank vm", "an empty flashvm (seed 004's name)",
             "an empty host"]


@pytest.mark.parametrize("body,starts,says", BLANK, ids=BLANK_IDS)
def test_an_empty_name_in_a_move_request_is_invalid_argument_saying_what_to_send(fleet, body, starts, says):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.add("h2", fleet.agent("a2"))
    fleet.client.vms.create(vm_body("cli1", host="h1"))
    r = post_move(fleet, body)
    # (an empty to was 409 unknown_host "host  is not registered"; a blank vm 409 not_movable)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument" and err["message"].startswith(starts), err
    assert all(s in err["message"] for s in says), err["message"]
    assert fleet.client.moves.list() == []
    assert agent_states(a) == {"cli1": "running"}  # untouched
    # (and leaving to out is the best fit the message points to)
    if body.get("to") is not None and not body["to"].strip():
        m = fleet.client.moves.create("cli1")
        assert m["to"] == "h2"


@pytest.mark.parametrize("body,starts,says", BLANK, ids=BLANK_IDS)
def test_the_move_service_refuses_an_empty_name_from_any_caller(tmp_path, body, starts, says):
    """The drain and the MCP tool hand the service a dict, not the route's model."""
    ctl = Controller(tmp_path / "ctl")
    try:
        with pytest.raises(InvalidArgument) as info:
            asyncio.run(ctl.moves.create(body))
        assert info.value.message.startswith(starts) and all(s in info.value.message for s in says)
    finally:
        ctl.store.close()


# ---- a drain and the VMs whose run is over ---------------------------------------------

def test_a_drain_reports_finished_vms_as_finished_not_stuck_and_the_host_then_deregisters(fleet):
    a1 = fleet.agent("a1")
    fleet.add("h1", a1)
    c = fleet.client
    for name in ("job7", "job9", "run1"):
        c.vms.create(vm_body(name, host="h1"))
    end_fake_vm(a1, "job9", 0)     # its entry finished: exited
    end_fake_vm(a1, "job7", None)  # its process died: failed
    wait_until(lambda: {v["name"]: v["state"] for v in c.vms.list()} == {"job7": "failed", "job9": "exited",
                                                                         "run1": "running"},
               timeout=30, what="the controller to see job9 exited and job7 failed")
    fleet.add("h2", fleet.agent("a2"))
    wait_until(lambda: all(h.connected for h in c.hosts.list()), what="hosts connected")
    report = c.hosts.drain("h1")
    # (they were stuck with code not_movable, as if they kept the host)
    assert report["stuck"] == [], report
    assert [(m["vm"], m["to"]) for m in report["moved"]] == [("run1", "h2")]
    assert report["finished"] == [{"vm": "job7", "state": "failed"}, {"vm": "job9", "state": "exited"}]
    c.hosts.deregister("h1")  # nothing stuck: nothing keeps it
    assert [h.id for h in c.hosts.list()] == ["h2"]


def test_a_drain_with_nothing_finished_reports_an_empty_finished_list(fleet):
    fleet.add("h1", fleet.agent("a1"))
    fleet.add("h2", fleet.agent("a2"))
    fleet.client.vms.create(vm_body("run1", host="h1"))
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="hosts connected")
    report = fleet.client.hosts.drain("h1")
    assert report == {"host": "h1", "moved": [{"vm": "run1", "move": report["moved"][0]["move"], "to": "h2"}],
                      "stuck": [], "finished": [], "prewarmed": []}


# ---- what the OpenAPI document says -------------------------------------------------------

def test_the_document_says_what_an_empty_name_a_finished_vm_and_failed_trust_get():
    doc = json.loads(DOC.read_text())
    bad = doc["paths"]["/v1/moves"]["post"]["responses"]["400"]["description"]
    assert "empty" in bad and "leave to out for best fit" in bad, bad
    schemas = doc["components"]["schemas"]
    assert "leave it out" in schemas["MoveRequest"]["properties"]["to"]["description"]
    finished = schemas["DrainReport"]["properties"]["finished"]
    assert "finished" not in schemas["DrainReport"].get("required", [])
    assert finished["items"]["$ref"].endswith("/DrainFinished") and "exited" in finished["description"]
    drained = doc["paths"]["/v1/hosts/{host_id}"]["post"]["responses"]["200"]["description"]
    assert "finished" in drained and "exited" in drained, drained
    deregister = doc["paths"]["/v1/hosts/{host_id}"]["delete"]["responses"]["409"]["description"]
    assert "exited or failed" in deregister, deregister
    unreachable = doc["paths"]["/v1/hosts"]["post"]["responses"]["502"]["description"]
    assert "trust failed" in unreachable and "https://" in unreachable and "certificate" in unreachable
    assert "nothing is stored" in unreachable, unreachable
