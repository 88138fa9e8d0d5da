"""Moves between real agent processes (fake backend) after a failed move left
its incoming copy on the target (the target did not answer the abort): a new
move of that VM removes the copy first, and when it cannot, it is refused
before the VM is put to sleep."""

from __future__ import annotations

import json
import types
from pathlib import Path

import httpx
import pytest

import fuse
from support import Proxy, wait_until


class CutProxy(Proxy):
    """A loopback TCP proxy in front of an agent that hangs up, without a word,
    on every request ``cut`` says yes to (a target gone for those calls while
    its poller's still answer)."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self.cut = lambda line: False
        self.dropped = 0

    def _forward(self, data: bytes) -> bool:
        if self.cut(data.split(b"\r\n", 1)[0].decode("latin-1")):
            self.dropped += 1
            return False
        return super()._forward(data)


def _verify_or_abort(line: str) -> bool:
    """The target's verify (the move fails there, its copy already begun) and the
    abort of its incoming side (so the copy stays: clean-up pending)."""
    method, _, path = line.partition(" ")
    return path.startswith("/v1/host/incoming/") and (
        (method == "POST" and path.split(" ")[0].endswith("/verify")) or method == "DELETE")


def _abort(line: str) -> bool:
    return line.startswith("DELETE /v1/host/incoming/")


def vm_body(name, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", **kw}


def host_vms(agent) -> dict:
    r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return {v["name"]: v for v in r.json()["vms"]}


def slept(vm: dict) -> int:
    """How many times the agent put the VM to sleep."""
    return sum(1 for h in vm.get("history", []) if h.get("state") == "sleeping")


@pytest.fixture
def leftover(fleet):
    """src and dst (dst behind a CutProxy), job1 running on src, and a move of it to
    dst that failed at the verify while dst hung up on its abort: dst still holds
    job1's incoming copy and the failed move's clean-up is pending."""
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    proxy = CutProxy(int(dst.url.rsplit(":", 1)[1]))
    fleet.add("src", src)
    fleet.add("dst", types.SimpleNamespace(url=proxy.url, token=dst.token))
    wait_until(lambda: fleet.client.hosts.get("dst").connected, what="dst connected")
    fleet.client.vms.create(vm_body("job1", host="src"))
    proxy.cut = _verify_or_abort
    first = fleet.client.moves.create("job1", to="dst")
    first = wait_until(lambda: (m := fleet.client.moves.get(first["id"]))["state"] == "failed" and m,
                       timeout=60, what="the first move fails and brings job1 home")
    assert host_vms(src)["job1"]["state"] == "running"
    assert host_vms(dst)["job1"]["state"] == "incoming"  # the copy the abort never reached
    proxy.cut = _abort  # dst answers everything but the abort: the janitor's retries fail too
    yield types.SimpleNamespace(src=src, dst=dst, proxy=proxy, first=first)
    proxy.close()


def test_a_move_to_a_host_holding_a_failed_moves_copy_is_refused_before_the_vm_sleeps(fleet, leftover):
    sleeps = slept(host_vms(leftover.src)["job1"])
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("job1", to="dst")
    assert (info.value.status, info.value.code) == (409, "no_target")
    assert leftover.first["id"] in info.value.message and "incoming copy" in info.value.message, info.value.message
    # ...and best fit passes dst by with the same reason
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("job1")
    assert info.value.code == "no_target" and "incoming copy" in info.value.details["hosts"]["dst"]
    vm = host_vms(leftover.src)["job1"]
    assert vm["state"] == "running" and not vm.get("move_id")
    assert slept(vm) == sleeps  # never put to sleep
    assert [m["id"] for m in fleet.client.moves.list()] == [leftover.first["id"]]  # no move was started


def test_a_move_asked_as_soon_as_the_host_answers_again_removes_the_copy_and_goes(fleet, leftover):
    leftover.proxy.cut = lambda line: False  # dst answers again; the janitor has not been round yet
    m = fleet.client.moves.create("job1", to="dst")
    m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                   timeout=60, what="the second move ends")
    assert m["state"] == "done", m["reason"]
    assert host_vms(leftover.dst)["job1"]["state"] == "running"
    assert "job1" not in host_vms(leftover.src)


def test_a_host_holding_a_failed_moves_copy_cannot_be_pointed_at_another_agent(fleet, leftover):
    """As deregistering it is refused (move_in_progress): pointed at another agent, the
    clean-up would go there and the copy on the first would be nobody's to remove."""
    other = fleet.agent("agent-other")
    with pytest.raises(fuse.ApiError) as info:
        fleet.add("dst", other)
    assert (info.value.status, info.value.code) == (409, "move_in_progress"), info.value
    assert leftover.first["id"] in info.value.message and "clean-up pending" in info.value.message
    assert fleet.client.hosts.get("dst").url == leftover.proxy.url
    assert host_vms(leftover.dst)["job1"]["state"] == "incoming"  # the copy is still in the books to remove


# ---- what the OpenAPI document says of it ----------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_document_says_no_target_names_each_hosts_reason_and_a_drain_may_stop():
    doc = json.loads(DOC.read_text())
    refusals = doc["paths"]["/v1/moves"]["post"]["responses"]["409"]["description"]
    assert "no_target" in refusals and "`hosts`" in refusals and "failed move" in refusals, refusals
    assert "no_target" in doc["components"]["schemas"]["ErrorDetail"]["description"]
    stuck = doc["components"]["schemas"]["DrainStuck"]["properties"]["code"]["description"]
    assert "drain_stopped" in stuck and "move_failed" in stuck, stuck
    drained = doc["paths"]["/v1/hosts/{host_id}"]["post"]["responses"]["200"]["description"]
    assert "drain_stopped" in drained, drained
