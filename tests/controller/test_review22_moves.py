"""Moves as review 22 found them (real controller, fake-backend agents): a delete already
asking the VM's host when a move of the VM is asked refuses the move (the move was
accepted, 202, and read ``failed`` with the VM gone: ``failed`` means the VM is home); a
failed move whose source could not wake the VM (its disk full, say) keeps trying to wake
it, so a VM that was running does not stay asleep for good."""

from __future__ import annotations

import threading
import time
import types

import httpx
import pytest

import fuse
from support import Proxy, wait_until


def vm_body(name, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", **kw}


def on_agent(agent, name):
    r = httpx.get(agent.url + f"/v1/host/vms/{name}", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return r.json() if r.status_code == 200 else None


@pytest.fixture
def deleting(fleet):
    """src (behind a proxy) with VMs z and y, dst, and a delete of z that src holds 2 s,
    begun 0.5 s ago: ``(src, dst, thread)``."""
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    proxy = Proxy(int(src.url.rsplit(":", 1)[1]))
    fleet.add("src", types.SimpleNamespace(url=proxy.url, token=src.token))
    fleet.add("dst", dst)
    wait_until(lambda: fleet.client.hosts.get("src").connected, what="src connected")
    for name in ("z", "y"):
        fleet.client.vms.create(vm_body(name, host="src"))
    proxy.hold[b"DELETE /v1/host/vms/z"] = 2.0  # the delete waits on the host
    t = threading.Thread(target=lambda: fleet.client.vms.delete("z"))
    t.start()
    time.sleep(0.5)
    yield src, dst, t
    t.join(30)
    proxy.close()


def test_a_move_asked_while_a_delete_of_the_vm_waits_on_its_host_is_refused(fleet, deleting):
    src, dst, t = deleting
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("z", to="dst")
    assert (info.value.status, info.value.code) == (409, "not_movable"), info.value
    assert info.value.message == "vm z is being deleted on src: ask again once that has answered"
    t.join(30)
    assert fleet.client.moves.list() == []  # (was: a move, 202, then failed with the VM gone)
    assert on_agent(dst, "z") is None and on_agent(src, "z") is None


@pytest.mark.timeout(180)
def test_a_vm_a_failed_move_could_not_wake_at_home_is_woken_once_its_host_can(fleet):
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    fleet.restart(env={"FUSE_TEST_PAUSE_AT": "copied:3", "FUSE_TEST_FAIL_AT": "copied"})
    fleet.add("src", src)
    fleet.add("dst", dst)
    fleet.client.vms.create(vm_body("z", host="src"))
    m = fleet.client.moves.create("z", to="dst")
    wait_until(lambda: fleet.client.moves.get(m["id"])["state"] == "copying", timeout=30, what="the copy")
    bundle = src.state_dir / "bundles" / "linux"
    aside = bundle.with_name("linux.aside")
    bundle.rename(aside)  # the source cannot wake it: its bundle gone (a full disk did the same)
    try:
        m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] == "failed" and x, timeout=60,
                       what="the move fails")
        assert "the vm is asleep on src: waking it failed" in m["reason"], m["reason"]
        assert on_agent(src, "z")["state"] == "sleeping"
        time.sleep(3)  # (the janitor's tries fail meanwhile: it is still asleep)
        assert on_agent(src, "z")["state"] == "sleeping"
    finally:
        aside.rename(bundle)
    # (was: asleep for good, for the operator to find and wake)
    wait_until(lambda: on_agent(src, "z")["state"] == "running", timeout=90, what="z woken at home")
    assert on_agent(dst, "z") is None
    woken = [e for e in fleet.client.events.list(0, limit=500)["events"] if e["type"] == "move_source_woken"]
    assert [(e["move"], e["vm"]) for e in woken] == [(m["id"], "z")]
    assert fleet.client.vms.get("z")["state"] == "running"


def test_a_drain_meeting_a_delete_of_a_vm_waits_for_it_and_moves_the_rest(fleet, deleting):
    src, dst, t = deleting
    report = fleet.client.hosts.drain("src")
    t.join(30)
    assert report["stuck"] == [] and [m["vm"] for m in report["moved"]] == ["y"], report
    assert on_agent(dst, "y")["state"] == "running" and on_agent(src, "z") is None
