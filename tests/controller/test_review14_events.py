"""Review 14: an agent registered again under a new name after its old name was
deregistered carries on where the controller had read its log: the merged
stream gets each host event once, not the agent's whole history a second time
under the new name. Real controller and agent (fake backend) on loopback."""

from __future__ import annotations

import time

import httpx

from support import wait_until


def shape(name):
    return {"shape": {"vcpus": 1, "mem_mib": 256}, "entry": "echo hi", "name": name}


def host_events(client) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if "host_event_id" in e]


def vm_deleted(client, vm: str) -> bool:
    return any(e.get("vm") == vm and e.get("to") == "deleted" for e in host_events(client))


def agent_with_history(fleet):
    """Agent a1 registered as h3, with VM x1 created and deleted there (its events read)."""
    a = fleet.agent("a1")
    fleet.add("h3", a)
    fleet.client.vms.create(shape("x1"))
    fleet.client.vms.delete("x1")
    wait_until(lambda: vm_deleted(fleet.client, "x1"), what="x1's events")
    return a


def test_an_agent_registered_again_under_a_new_name_does_not_replay_its_log(fleet):
    a = agent_with_history(fleet)
    before = [(e["host"], e["host_event_id"]) for e in host_events(fleet.client)]
    assert {h for h, _ in before} == {"h3"}
    fleet.client.hosts.deregister("h3")
    fleet.add("h3c", a)  # the same agent (same identity) under a new name
    time.sleep(2.5)  # a few polls of the new name, its event reads included
    assert [(e["host"], e["host_event_id"]) for e in host_events(fleet.client)] == before
    fleet.client.vms.create(shape("x2"))  # and what comes after is read, under the new name
    fleet.client.vms.delete("x2")
    wait_until(lambda: vm_deleted(fleet.client, "x2"), what="x2's events")
    after = [(e["host"], e["host_event_id"]) for e in host_events(fleet.client)]
    assert after[:len(before)] == before
    new = after[len(before):]
    assert new and {h for h, _ in new} == {"h3c"}
    assert [i for _, i in new] == list(range(before[-1][1] + 1, before[-1][1] + 1 + len(new)))


def test_a_new_name_reads_what_the_agent_logged_while_it_had_no_name(fleet):
    # the cursor starts where the stored events end, not at the agent's newest event
    a = agent_with_history(fleet)
    fleet.client.hosts.deregister("h3")
    before = [e["host_event_id"] for e in host_events(fleet.client)]
    with httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=10) as agent:
        assert agent.post("/v1/host/vms", json=shape("x2")).status_code == 201, "x2 on the agent itself"
        last = agent.get("/v1/host").json()["last_event_id"]
    assert last > before[-1]
    fleet.add("h3c", a)
    wait_until(lambda: [e["host_event_id"] for e in host_events(fleet.client)][-1] >= last, what="x2's events")
    got = host_events(fleet.client)
    assert [e["host_event_id"] for e in got][:len(before)] == before
    new = got[len(before):]
    assert [e["host_event_id"] for e in new] == list(range(before[-1] + 1, before[-1] + 1 + len(new)))
    assert {e["host"] for e in new} == {"h3c"} and {e.get("vm") for e in new} == {"x2"}
