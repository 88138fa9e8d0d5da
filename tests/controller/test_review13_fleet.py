"""Seed 004 / issue 4 review findings, against a real controller and real agents
(fake backend) on loopback: query values that are no number (a wait of NaN, an
offset or a time far past any real one) are answered, never spun on or turned
into a 500; the controller's own delete and sleep free room for the next create
at once; one machine under two names is never given each name's capacity on top
of the other's; and a fleet_full reason never shows free room below 0."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

import fuse
from fuse.controller.placement import FleetArrays, rank
from fuse.controller.resources import Resources
from support import api_error, refused

NOT_NUMBERS = pytest.mark.parametrize("wait_s", ["nan", "inf", "-inf"],
                                      ids=["NaN", "infinity", "minus infinity"])


def shape(name=None, mem=128, host=None):
    return {"shape": {"vcpus": 1, "mem_mib": mem}, "entry": "echo hi",
            **({"name": name} if name else {}), **({"host": host} if host else {})}


def ctl_http(fleet) -> httpx.Client:
    """Plain HTTP to the controller's socket, for query strings the SDK would not send."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(fleet.ctl.socket)), base_url="http://c", timeout=10)


def agent_http(agent) -> httpx.Client:
    return httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)


# ---- a wait that is no number ------------------------------------------------------

@NOT_NUMBERS
def test_a_merged_events_wait_that_is_no_number_is_refused_at_once(fleet, wait_s):
    with ctl_http(fleet) as c:
        started = time.monotonic()
        assert "wait_s" in refused(c.get("/v1/events", params={"since": 0, "wait_s": wait_s}))
        assert time.monotonic() - started < 5
        # and the controller is not left spinning on an abandoned poll: it answers as ever
        assert c.get("/v1/events", params={"since": 0, "wait_s": 0}).status_code == 200


@NOT_NUMBERS
def test_the_sdk_gets_the_controllers_400_for_a_wait_that_is_no_number(fleet, wait_s):
    err = api_error(fleet.client.events.list, 0, wait_s=float(wait_s))
    assert (err.status, err.code) == (400, "invalid_argument"), err


@NOT_NUMBERS
def test_a_host_events_wait_that_is_no_number_is_refused_by_the_agent(fleet, wait_s):
    a = fleet.agent("a1")
    with agent_http(a) as c:
        assert "wait_s" in refused(c.get("/v1/host/events", params={"since": 0, "wait_s": wait_s}))


# ---- the controller's own actions free room at once ----------------------------------

def test_a_create_right_after_a_delete_gets_the_room_the_delete_freed(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a, vm_count=1)
    for i in range(3):  # each time before the poller's next read of the host
        fleet.client.vms.create(shape(f"x{i}"))
        fleet.client.vms.delete(f"x{i}")
    assert fleet.client.vms.create(shape("last"))["host"] == "h1"


def test_a_create_right_after_a_sleep_gets_the_room_the_sleep_freed(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a, vm_count=1)
    fleet.client.vms.create(shape("sleeper"))
    fleet.client.vms.sleep("sleeper")
    assert fleet.client.vms.create(shape("next"))["host"] == "h1"


# ---- one machine under two names ----------------------------------------------------

def test_one_machine_under_two_names_holds_no_more_than_one_names_capacity(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a, vm_count=16, ram_mb=1024)
    fleet.add("h1u", a, vm_count=16, ram_mb=1024)
    placed, refusals = [], []
    for i in range(16):
        try:
            placed.append(fleet.client.vms.create(shape(f"v{i}", mem=128))["host"])
        except fuse.ApiError as err:
            refusals.append(err)
    assert len(placed) == 8, placed  # 8 x 128 MiB = the 1024 MiB each name declares
    assert {e.code for e in refusals} == {"fleet_full"}
    # and a name's reason counts what the other name holds
    assert "0 MiB free" in str(refusals[0].details["hosts"]["h1"]), refusals[0].details
    # so does the host listing: each name's free room is the machine's, not its own share
    free = {h.id: h.free_mem_mib for h in fleet.client.hosts.list()}
    assert free == {"h1": 0, "h1u": 0}, free
    assert fleet.client.hosts.get("h1u").free_mem_mib == 0


def test_a_fleet_full_reason_never_shows_free_memory_below_zero():
    # more assigned than declared (a capacity lowered under its VMs, a reservation on top)
    f = FleetArrays(["h"], np.array([4]), np.array([1024]), np.array([4]), np.array([-128]), np.array([3]),
                    np.array([10]), np.array([True]))
    assert rank(f, Resources.vm(1, 128)).reasons == {"h": "needs 128 MiB of memory, 0 MiB free"}


# ---- numbers far past any real one ---------------------------------------------------

@pytest.mark.parametrize("offset", [2**40 + 1, 2**50, 2**63, 2**64 + 5],
                         ids=["past 1 TiB", "past ext4's largest file", "past a signed 64-bit seek",
                              "past 64 bits"])
def test_a_console_offset_far_past_the_end_reads_from_the_end(fleet, offset):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(shape("c"))
    with agent_http(a) as agent, ctl_http(fleet) as ctl:
        size = agent.get("/v1/host/vms/c/console").json()["next_offset"]
        for c, path in ((agent, "/v1/host/vms/c/console"), (ctl, "/v1/vms/c/console")):
            r = c.get(path, params={"offset": str(offset)})
            assert r.status_code == 200, (path, r.text)
            assert r.json()["offset"] >= size and r.json()["next_offset"] == r.json()["offset"], r.json()
        refused(ctl.get("/v1/vms/c/console", params={"offset": "1e30"}))  # no integer
        refused(ctl.get("/v1/vms/c/console", params={"offset": "-1"}))


@pytest.mark.parametrize("params", [{"to": "1e20"}, {"to": "1e30"}, {"from": "-1e20"},
                                    {"from": "0", "to": "253402300800"}],
                         ids=["to 1e20", "to 1e30", "from -1e20", "to the year 10000"])
def test_a_usage_window_beyond_the_years_1_to_9999_is_refused(fleet, params):
    a = fleet.agent("a1")
    with ctl_http(fleet) as c, agent_http(a) as agent:  # the controller and a host alike
        assert "years 1 to 9999" in refused(c.get("/v1/usage", params=params))
        assert "years 1 to 9999" in refused(agent.get("/v1/host/usage", params=params))


def test_a_usage_window_up_to_the_year_9999_is_echoed_exactly(fleet):
    with ctl_http(fleet) as c:
        r = c.get("/v1/usage", params={"from": "0", "to": "253402300799"})
        assert r.status_code == 200, r.text
        assert b'"to":253402300799' in r.content.replace(b" ", b"")
