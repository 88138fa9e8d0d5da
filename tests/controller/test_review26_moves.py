"""Twenty-sixth session: what a move left on a host removed with force, once the same agent
is registered again (fake-backend agents, a real controller)."""

from __future__ import annotations

import httpx
import pytest

from support import wait_until


def _agent_vms(agent) -> dict[str, dict]:
    r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return {v["name"]: v for v in r.json()["vms"]}


def _incoming(agent) -> list:
    r = httpx.get(agent.url + "/v1/host/incoming", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return r.json()["incoming"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("gone", ["target", "source"])
def test_a_host_removed_with_force_and_registered_again_is_cleared_of_what_the_move_left(fleet, gone):
    """(was: the source's VM kept the failed move's mark for good: wake, sleep, delete and move
    all 409 move_in_progress naming a move long failed, the host removable only with force again;
    a target kept the failed move's copy, its room and the VM's name, and every later move of
    the VM there slept it and failed "already exists")"""
    from test_review23_fleet import move_held_after_copy

    agents, move, dead = move_held_after_copy(fleet, gone)
    ports = {h: int(a.url.rsplit(":", 1)[1]) for h, a in agents.items()}
    fleet.client.hosts.deregister(dead, force=True)
    assert fleet.client.moves.get(move["id"])["state"] == "failed"
    # the same agent (its state dir) comes back and is registered again
    back = fleet.agent("a1" if dead == "a" else "a2", port=ports[dead])
    assert move["id"] in str(_agent_vms(back)) or _incoming(back), "the move's leftover is there to clear"
    fleet.add(dead, back)
    if gone == "source":  # home, as any failed move's VM: woken there, unmarked, and the only copy
        wait_until(lambda: (v := _agent_vms(back).get("v1")) is not None and v["state"] == "running"
                   and not v.get("move_id"), timeout=30, what="v1 woken at home")
        assert "v1" not in _agent_vms(agents["b"])
        wait_until(lambda: [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()]
                   == [("v1", "a", "running")], timeout=30, what="the fleet's list")
        fleet.client.vms.sleep("v1")  # (was: 409 move_in_progress, for good)
        fleet.client.vms.delete("v1")
    else:  # the copy the failed move brought there is gone, and the VM moves there again
        wait_until(lambda: _incoming(back) == [] and "v1" not in _agent_vms(back), timeout=30,
                   what="the failed move's copy aborted")
        assert [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()] == [("v1", "a", "running")]
        fleet.restart()  # (no pause now)
        again = fleet.client.moves.create("v1", to="b")
        wait_until(lambda: fleet.client.moves.get(again["id"])["state"] in ("done", "failed"), timeout=60,
                   what="the second move")
        assert fleet.client.moves.get(again["id"])["state"] == "done", fleet.client.moves.get(again["id"])
