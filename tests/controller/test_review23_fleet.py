"""Twenty-third session: the fleet's record of VMs an agent no longer has."""

from __future__ import annotations

import httpx

from support import wait_until


def shape(mem=256, vcpus=1, **kw):
    return {"shape": {"vcpus": vcpus, "mem_mib": mem}, "entry": "echo hi", **kw}


def test_vms_dropped_for_a_new_agent_identity_leave_a_vm_lost_event(fleet):
    """(was: the VMs another agent at the host's address did not have left the list with no
    event: the stream never said where they went)"""
    a = fleet.agent("a1")
    port = int(a.url.rsplit(":", 1)[1])
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="keep-me", entry="sleep 600"))
    cursor = fleet.client.events.list(0)["next_cursor"]
    a.stop()
    fresh = fleet.agent("a1-wiped", port=port)  # another state dir at the same address
    ident = httpx.get(fresh.url + "/v1/host", headers={"Authorization": f"Bearer {fresh.token}"}).json()["agent_id"]
    wait_until(lambda: fleet.client.vms.list() == [], timeout=40, what="the VM dropped")
    lost = [e for e in fleet.client.events.list(cursor)["events"] if e["type"] == "vm_lost"]
    assert [(e["vm"], e["host"], e["was"]) for e in lost] == [("keep-me", "h1", "running")], lost
    assert "another agent answers at host h1" in lost[0]["reason"]
    assert fleet.client.hosts.get("h1").agent_id == ident


def test_a_vm_deleted_on_its_agent_is_not_called_lost(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="gone", entry="sleep 600"))
    cursor = fleet.client.events.list(0)["next_cursor"]
    httpx.delete(a.url + "/v1/host/vms/gone", headers={"Authorization": f"Bearer {a.token}"},
                 timeout=30).raise_for_status()
    wait_until(lambda: fleet.client.vms.list() == [], timeout=40, what="the VM dropped")
    assert not [e for e in fleet.client.events.list(cursor)["events"] if e["type"] == "vm_lost"]
