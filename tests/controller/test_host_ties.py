"""What ties a host to its machine and fills its room, as the controller keeps
them, between real agent processes (fake backend): a create waiting on the
host's answer holds the host against deregister and a new url; a move holds
its VM's room on the target until it ends; a wake counts under the host's
vm_count policy; an agent replaced at the host's address (its state dir
wiped) has its VM list read again."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import httpx

import fuse
from support import api_error, agent_vms, Proxy, wait_until


def vm_body(name, mem=128, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}


def agent_id(agent) -> str:
    return httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"},
                     timeout=10).json()["agent_id"]


def port(agent) -> int:
    return int(agent.url.rsplit(":", 1)[1])


def test_a_create_waiting_on_its_host_holds_it_against_deregister_and_a_new_url(fleet):
    a, other = fleet.agent("a1"), fleet.agent("a2")
    proxy = Proxy(port(a))
    try:
        fleet.add("h1", SimpleNamespace(url=proxy.url, token=a.token))
        proxy.hold[b"POST /v1/host/vms HTTP"] = 3.0  # the host takes its time to answer the create
        created = {}

        def create():
            with fuse.Client(fleet.ctl.url) as c:
                created["vm"] = c.vms.create(vm_body("job1"))

        t = threading.Thread(target=create)
        t.start()
        wait_until(lambda: proxy.held == 1, what="the create reached the host")
        err = api_error(fleet.client.hosts.deregister, "h1")
        assert (err.status, err.code) == (409, "conflict") and "has vm job1 being placed" in err.message, err.message
        err = api_error(fleet.client.hosts.register, fuse.RegisterHostRequest(
            id="h1", url=other.url, token=other.token, backend="qemu", capacity=fuse.HostCapacity(vm_count=10)))
        assert (err.status, err.code) == (409, "conflict") and "being placed" in err.message, err.message
        assert "cannot move to" in err.message
        t.join(30)
        assert created["vm"]["host"] == "h1"  # the VM landed where the controller knows it is
        assert fleet.client.hosts.get("h1").url == proxy.url
        assert [(v["name"], v["host"]) for v in fleet.client.vms.list()] == [("job1", "h1")]
        fleet.client.vms.delete("job1")
        fleet.client.hosts.deregister("h1")  # nothing holds it now
    finally:
        proxy.close()


def test_re_registering_with_a_trailing_slash_is_the_same_address(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(vm_body("job1", host="h1"))
    host = fleet.add("h1", SimpleNamespace(url=a.url + "/", token=a.token))  # was 409 "cannot move to"
    assert host.url == a.url == fleet.client.hosts.get("h1").url


def _pause_moves(fleet, where):
    fleet.restart(env={"FUSE_TEST_PAUSE_AT": where})
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="the controller sees the hosts")


def test_a_move_holds_its_room_on_the_target_until_it_ends(fleet):
    fleet.add("big", fleet.agent("a1"), ram_mb=4096)
    fleet.add("small", fleet.agent("a2"), ram_mb=512)  # declared: room for one 300 MiB VM
    for n in ("v", "w", "x"):
        fleet.client.vms.create(vm_body(n, mem=300, host="big"))
    _pause_moves(fleet, "copied:4")  # each move waits 4 s once copied
    m = fleet.client.moves.create("v", to="small")
    err = api_error(fleet.client.moves.create, "w", to="small")  # asked at once: v's room is promised
    assert (err.status, err.code) == (409, "no_target") and "212 MiB free" in err.message, err.message
    wait_until(lambda: fleet.client.moves.get(m["id"])["state"] == "copying", timeout=30, what="copying")
    small = fleet.client.hosts.get("small")
    assert (small.allocated.ram_mb, small.allocated.vm_count) == (300, 1)
    assert small.free_mem_mib <= 512 - 300
    err = api_error(fleet.client.vms.create, vm_body("y", mem=300, host="small"))
    assert (err.status, err.code) == (409, "fleet_full"), err.message
    fleet.client.vms.sleep("x")
    err = api_error(fleet.client.moves.create, "x", to="small")  # a sleeping VM's move needs the room too
    assert err.code == "no_target", err.message
    m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                   timeout=60, what="the move ends")
    assert m["state"] == "done", m["reason"]
    small = fleet.client.hosts.get("small")
    assert (small.allocated.ram_mb, small.allocated.vm_count) == (300, 1)  # the VM's own row, counted once
    assert [v["host"] for v in fleet.client.vms.list() if v["name"] == "v"] == ["small"]


def test_a_failed_move_gives_its_room_on_the_target_back(fleet):
    fleet.add("big", fleet.agent("a1"), ram_mb=4096)
    fleet.add("small", fleet.agent("a2"), ram_mb=512)
    fleet.client.vms.create(vm_body("v", mem=300, host="big"))
    fleet.restart(env={"FUSE_TEST_FAIL_AT": "copied"})  # the move fails once copied, and goes home
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="the controller sees the hosts")
    m = fleet.client.moves.create("v", to="small")
    m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                   timeout=60, what="the move ends")
    assert m["state"] == "failed"
    small = fleet.client.hosts.get("small")
    assert (small.allocated.ram_mb, small.allocated.vm_count) == (0, 0)
    fleet.client.vms.create(vm_body("y", mem=300, host="small"))  # the room is free again


def test_waking_counts_under_the_hosts_vm_count_policy(fleet):
    fleet.add("h1", fleet.agent("a1"), vm_count=2, ram_mb=4096)
    for n in ("a", "b"):
        fleet.client.vms.create(vm_body(n))
        fleet.client.vms.sleep(n)
    for n in ("c", "d"):  # the sleeping VMs hold no room: the policy's two slots are theirs
        # (once a poll has seen them asleep: until then the host's own count says 2)
        wait_until(lambda: fleet.client.vms.create(vm_body(n)), what=f"{n} created")
    err = api_error(fleet.client.vms.wake, "a")
    assert (err.status, err.code) == (409, "host_full") and "vm_count" in err.message, err.message
    assert fleet.client.hosts.get("h1").allocated.vm_count == 2
    assert {v["name"]: v["state"] for v in fleet.client.vms.list()}["a"] == "sleeping"
    fleet.client.vms.delete("c")
    woke = wait_until(lambda: fleet.client.vms.wake("a"), what="a woken")  # a slot is free again
    assert woke["state"] == "running"


def test_an_agent_replaced_at_the_hosts_address_has_its_vm_list_read_again(fleet):
    old, new = fleet.agent("a1"), fleet.agent("a2")  # a2: the same machine after its state dir was wiped
    proxy = Proxy(port(old))
    try:
        fleet.add("h1", SimpleNamespace(url=proxy.url, token=old.token))
        for n in ("v", "w"):
            fleet.client.vms.create(vm_body(n))
        proxy.switch(port(new))  # between two polls: the host never reads as disconnected
        wait_until(lambda: fleet.client.hosts.get("h1").agent_id == agent_id(new), what="the new identity")
        wait_until(lambda: fleet.client.vms.list() == [], timeout=10, what="the old agent's VMs dropped")
        assert agent_vms(new) == {}
        assert fleet.client.hosts.get("h1").allocated.vm_count == 0
        fleet.client.hosts.deregister("h1")  # nothing phantom holds it
    finally:
        proxy.close()
