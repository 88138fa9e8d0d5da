"""One machine (one agent) registered under two host ids ("aliases"), against
real agents (fake backend) and a real controller on loopback: its events are
stored once whichever name goes and across controller restarts, and its VMs'
usage rows and events carry the name the VM was created through."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

import fuse
from fuse.controller.fleet import Fleet
from fuse.controller.service import Controller
from support import wait_until


def shape(name, host=None):
    return {"shape": {"vcpus": 1, "mem_mib": 256}, "entry": "echo hi", "name": name,
            **({"host": host} if host else {})}


def agent_events(client) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if "host_event_id" in e]


def stored_once(client) -> list[int]:
    """The agent's event ids, in the merged stream's order, each asserted to be there once."""
    seen = [e["host_event_id"] for e in agent_events(client)]
    assert len(seen) == len(set(seen)), [(e["id"], e["host"], e["host_event_id"], e["type"], e.get("vm"))
                                         for e in agent_events(client)]
    return seen


def vm_ran(client, vm: str) -> bool:
    return any(e.get("vm") == vm and e["type"] == "vm_state" and e.get("to") == "running"
               for e in agent_events(client))


def settle():
    time.sleep(2.5)  # a few polls of every name, their event reads included


def test_when_the_name_that_read_the_log_goes_the_name_left_carries_on_from_there(fleet):
    a = fleet.agent("a1")
    fleet.add("p1", a)
    fleet.add("p2", a)  # p1 sorts first: it reads the machine's log
    fleet.client.vms.create(shape("x1", host="p2"))
    wait_until(lambda: vm_ran(fleet.client, "x1"), what="x1's events")
    fleet.client.hosts.deregister("p1")
    settle()
    assert stored_once(fleet.client) == [1, 2]
    fleet.restart()  # the cursor p2 carries on from is in the store
    settle()
    assert stored_once(fleet.client) == [1, 2]
    fleet.client.vms.create(shape("x2", host="p2"))  # and nothing after is skipped
    wait_until(lambda: vm_ran(fleet.client, "x2"), what="x2's events")
    assert stored_once(fleet.client) == [1, 2, 3, 4]
    assert {e["host"] for e in agent_events(fleet.client)} == {"p2"}


def test_a_name_added_after_the_log_was_read_starts_where_the_other_got_to(fleet):
    a = fleet.agent("a1")
    fleet.add("p2", a)
    fleet.client.vms.create(shape("x0"))
    wait_until(lambda: vm_ran(fleet.client, "x0"), what="x0's events")
    fleet.client.vms.delete("x0")
    wait_until(lambda: any(e.get("to") == "deleted" for e in agent_events(fleet.client)), what="x0's delete")
    read = stored_once(fleet.client)
    fleet.add("p1", a)  # sorts first: reads the log from now on, though nothing new is in it
    fleet.client.hosts.deregister("p2")  # before any new event moved p1's cursor
    settle()
    assert stored_once(fleet.client) == read
    fleet.restart()
    settle()
    assert stored_once(fleet.client) == read


def test_usage_and_events_name_the_alias_a_vm_was_created_through(fleet):
    a = fleet.agent("a1")
    fleet.add("h0", a)
    fleet.add("cc", a)  # sorts first: reads the machine's log, and usage asks through it
    fleet.client.vms.create(shape("v2", host="h0"))
    fleet.client.vms.create(shape("v3", host="cc"))
    for vm in ("v2", "v3"):
        wait_until(lambda: vm_ran(fleet.client, vm), what=f"{vm}'s events")
    settle()
    assert sorted((v["name"], v["host"]) for v in fleet.client.vms.list()) == [("v2", "h0"), ("v3", "cc")]
    u = fleet.client.usage()
    assert u["aliases"] == {"cc": ["h0"]} and u["hosts"] == ["cc"]
    assert sorted((r["vm"], r["host"]) for r in u["vms"]) == [("v2", "h0"), ("v3", "cc")]
    tags = {(e["type"], e["vm"], e["host"]) for e in fleet.client.events.list(0, limit=500)["events"]
            if e.get("vm") in ("v2", "v3")}
    assert ("placed", "v2", "h0") in tags and ("placed", "v3", "cc") in tags
    assert {(vm, host) for _, vm, host in tags} == {("v2", "h0"), ("v3", "cc")}, sorted(tags)
    stored_once(fleet.client)
    # a VM the store no longer lists (deleted, still metered) keeps the name it ran under, as its
    # events do (it was reported under the name asked, cc: one it never ran under)
    fleet.client.vms.delete("v2")
    wait_until(lambda: any(e.get("vm") == "v2" and e.get("to") == "deleted" for e in agent_events(fleet.client)),
               what="v2's delete read")
    u = fleet.client.usage()
    assert sorted((r["vm"], r["host"]) for r in u["vms"]) == [("v2", "h0"), ("v3", "cc")]


@pytest.mark.parametrize("settled", [True, False], ids=["deleted once it ran", "created and deleted at once"])
def test_a_deleted_vms_last_events_keep_the_name_it_was_created_through(fleet, settled):
    # its "deleted" event (read after its row had gone) was tagged with the name that reads
    # the machine's log; a VM created and deleted within a poll had every event so tagged
    a = fleet.agent("a1")
    fleet.add("h0", a)
    fleet.add("cc", a)  # sorts first: reads the machine's log
    fleet.client.vms.create(shape("v2", host="h0"))
    if settled:
        wait_until(lambda: vm_ran(fleet.client, "v2"), what="v2's events")
    fleet.client.vms.delete("v2")
    wait_until(lambda: any(e.get("vm") == "v2" and e.get("to") == "deleted" for e in agent_events(fleet.client)),
               what="v2's delete")
    tags = [(e["type"], e.get("to"), e["host"]) for e in fleet.client.events.list(0, limit=500)["events"]
            if e.get("vm") == "v2"]
    assert {host for _, _, host in tags} == {"h0"}, tags
    stored_once(fleet.client)


def test_usage_asks_a_machine_through_a_name_that_answers(fleet):
    a = fleet.agent("a1")
    fleet.add("h0", a)
    fleet.client.vms.create(shape("v1", host="h0"))
    fleet.add("cc", a)
    assert fleet.client.usage()["aliases"] == {"cc": ["h0"]}
    # one name stops answering, the machine does not: asked through the other
    u = fleet.client.usage()
    assert [(r["vm"], r["host"]) for r in u["vms"]] == [("v1", "h0")]
    # pointed at another address, a name is no longer that machine's (review 27: it kept the
    # agent identity, so cordoning it stopped placement on the live name): a host of its own,
    # which does not answer
    fleet.client.hosts.register(fuse.RegisterHostRequest(
        id="cc", url="http://127.0.0.1:9", token=a.token, backend="qemu",
        capacity=fuse.HostCapacity(vm_count=10, ram_mb=4096, cpus=4, storage_gb=10)))
    wait_until(lambda: not fleet.client.hosts.get("cc").connected, what="cc disconnected")
    u = fleet.client.usage()
    assert u["aliases"] == {} and u["unreachable"] == ["cc"], u
    assert [(r["vm"], r["host"]) for r in u["vms"]] == [("v1", "h0")]


# ---- the moment between an agent's first event of a VM and the create's reply ----

AGENT = "agent-one"


@pytest.fixture
def store_fleet(tmp_path):
    """A controller's store and pollers with no agent behind them: h0 and cc, one machine."""
    ctl = Controller(tmp_path / "ctl")
    with ctl.store.tx() as c:
        for h in ("cc", "h0"):
            ctl.store.put_host(c, {"id": h, "url": f"http://{h}.invalid", "token": "", "backend": "qemu",
                                   "agent_id": AGENT, "state": "active", "capacity": {}, "last_seen": 0.0,
                                   "created_at": 0.0, "updated_at": 0.0})
    yield Fleet(ctl)
    ctl.store.close()


def record(name: str, created: float) -> dict:
    return {"name": name, "state": "running", "shape": {"vcpus": 1, "mem_mib": 256},
            "created_at": datetime.fromtimestamp(created, timezone.utc).isoformat()}


def tags(fleet) -> list[tuple[int, str, str]]:
    return [(e["host_event_id"], e["data"].get("vm"), e["host"]) for e in fleet.store.events_after(0)]


@pytest.mark.parametrize("adopted_first", [False, True],
                         ids=["the store did not know the vm yet", "the reading name's poller had adopted it"])
def test_events_read_before_a_create_through_the_other_name_was_recorded_follow_the_vm(store_fleet, adopted_first):
    now = time.time()
    # an older VM of the same name on this machine, long gone: its events stay where they were
    store_fleet._store_events("cc", AGENT, 0, [{"id": 1, "time": now - 100, "type": "vm_state", "vm": "v2",
                                                "to": "deleted"}])
    store_fleet._store_events("cc", AGENT, 1, [{"id": 2, "time": now + 0.01, "type": "vm_state", "vm": "v2",
                                                "to": "creating"}])
    if adopted_first:
        store_fleet.upsert_vms("cc", [record("v2", now)], replace=True)
    store_fleet.upsert_vms("h0", [record("v2", now)])  # the create's reply, through h0
    assert [(v["name"], v["host"]) for v in store_fleet.store.list_vms()] == [("v2", "h0")]
    store_fleet._store_events("cc", AGENT, 2, [{"id": 3, "time": now + 0.02, "type": "vm_state", "vm": "v2",
                                                "to": "running"}])
    assert tags(store_fleet) == [(1, "v2", "cc"), (2, "v2", "h0"), (3, "v2", "h0")]


def test_an_event_already_stored_under_the_other_name_is_not_stored_again(store_fleet):
    store_fleet._store_events("h0", AGENT, 0, [{"id": 1, "time": 1.0, "type": "x"}])
    # another replica, which saw cc connected, read the same part of the log
    store_fleet._store_events("cc", AGENT, 0, [{"id": 1, "time": 1.0, "type": "x"}, {"id": 2, "time": 2.0, "type": "y"}])
    assert [(e["host_event_id"], e["host"]) for e in store_fleet.store.events_after(0)] == [(1, "h0"), (2, "cc")]


def test_events_of_a_create_through_the_other_name_awaiting_its_reply_carry_that_name_at_once(store_fleet):
    """A follower reads each event once, so its tag must not change after it is stored: the
    agent's first events of a VM whose create through h0 has not had its reply yet are read
    by cc's poller, and are h0's from the start (they had been cc's until the reply's retag)."""
    vms = store_fleet.ctl.vms
    vms._name("h0", "v5", +1)  # the create through h0 is under way
    store_fleet._store_events("cc", AGENT, 0, [{"id": 1, "time": time.time(), "type": "vm_state", "vm": "v5",
                                                "to": "creating"},
                                               {"id": 2, "time": time.time(), "type": "vm_state", "vm": "v6",
                                                "to": "creating"}])
    assert tags(store_fleet) == [(1, "v5", "h0"), (2, "v6", "cc")]
    vms._name("h0", "v5", -1)
    store_fleet.upsert_vms("h0", [record("v5", time.time() - 1)])  # the reply: nothing left to move
    assert tags(store_fleet) == [(1, "v5", "h0"), (2, "v6", "cc")]


# ---- the second name's VMs (black-box review of issue 2) ----------------------------

def vm_state(client, name: str) -> str | None:
    return next((v["state"] for v in client.vms.list() if v["name"] == name), None)


def test_a_vm_of_the_name_that_does_not_read_the_log_follows_the_agents_state(fleet):
    """The first name reads the machine's log for both; a VM created through the second
    that died stayed `running` under it (and held its deregister off) until a restart."""
    import os
    import signal

    a = fleet.agent("a1")
    fleet.add("ha", a)
    fleet.add("hb", a)  # ha sorts first: it reads the machine's log
    vb = fleet.client.vms.create(shape("vb", host="hb"))
    va = fleet.client.vms.create(shape("va", host="ha"))
    for vm in (va, vb):
        os.kill(vm["pid"], signal.SIGKILL)
    wait_until(lambda: vm_state(fleet.client, "va") == "failed", what="va failed")
    wait_until(lambda: vm_state(fleet.client, "vb") == "failed", what="vb failed through the other name")
    assert {v["name"]: v["host"] for v in fleet.client.vms.list()} == {"va": "ha", "vb": "hb"}
    fleet.client.hosts.deregister("hb")  # a finished VM does not hold it (was 409: "still has vm vb")


def test_a_finished_vm_of_a_deregistered_name_stays_listed_the_same_across_a_restart(fleet):
    """A finished VM of a name deregistered while the machine keeps another name is listed
    under that name at once, as the controller lists it after a restart (it was gone,
    and came back after one)."""
    import os
    import signal

    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.add("h2", a)
    vm = fleet.client.vms.create(shape("dead1", host="h1"))
    os.kill(vm["pid"], signal.SIGKILL)
    wait_until(lambda: vm_state(fleet.client, "dead1") == "failed", what="dead1 failed")
    fleet.client.hosts.deregister("h1")
    before = sorted((v["name"], v["host"], v["state"]) for v in fleet.client.vms.list())
    assert before == [("dead1", "h2", "failed")], before
    removed = [e for e in fleet.client.events.list(0, limit=500)["events"] if e["type"] == "host_removed"]
    assert removed[-1]["finished_vms"] == ["dead1"] and removed[-1]["finished_vms_kept_by"] == "h2", removed
    fleet.restart()
    settle()
    after = sorted((v["name"], v["host"], v["state"]) for v in fleet.client.vms.list())
    assert after == before, (before, after)
