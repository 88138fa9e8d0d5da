"""VMs through the controller, from a third review, between real agent processes
(fake backend) on loopback: simultaneous creates of one name answer vm_exists
before any refusal for room (seed 004: "a name already used on the chosen host
returns 409 vm_exists"), and a wake refused under the vm_count policy counts the
VMs that really hold room there, never the one being woken."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

import fuse
from support import api_error, agent_vms, Proxy, wait_until

CREATE = b"POST /v1/host/vms "  # a create's request line (a sleep or wake has /<name>/... after vms)


def vm_body(name, mem=128, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}






def port(agent) -> int:
    return int(agent.url.rsplit(":", 1)[1])


def at_once(fleet, calls) -> list:
    """Run each call (client -> result) in its own thread with its own client, released
    together; each outcome is the result, or (code, message) of the ApiError."""
    out: list = [None] * len(calls)
    go = threading.Barrier(len(calls))

    def run(i, call):
        with fuse.Client(fleet.ctl.url) as c:
            go.wait()
            try:
                out[i] = call(c)
            except fuse.ApiError as exc:
                out[i] = (exc.code, exc.message)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


class SlowCreateAnswer(Proxy):
    """A loopback TCP proxy in front of an agent that, while ``answer_delay`` is set,
    holds the agent's answer to a create that long before passing it back: the agent
    has made the VM, and the controller's poller reads its summary meanwhile."""

    answer_delay = 0.0

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self._slow: set = set()  # upstream sockets whose next bytes answer a create

    def _pipe(self, src, dst, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests and data.startswith(CREATE) and self.answer_delay:
                    self._slow.add(dst)
                elif not requests and src in self._slow:
                    self._slow.discard(src)
                    time.sleep(self.answer_delay)
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)


@pytest.fixture
def proxies():
    made: list[Proxy] = []

    def make(agent, cls=Proxy):
        p = cls(port(agent))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# ---- simultaneous creates of one name -------------------------------------------------

def test_simultaneous_creates_of_one_name_on_a_small_host_are_all_but_one_vm_exists(fleet, proxies):
    a = fleet.agent("a3")
    proxy = proxies(a)
    fleet.add("h3", SimpleNamespace(url=proxy.url, token=a.token), vm_count=3)
    wait_until(lambda: fleet.client.hosts.get("h3").connected, what="h3 connected")
    proxy.hold[CREATE] = 0.5  # each create waits on the host's answer a while: they overlap
    outcomes = at_once(fleet, [lambda c: c.vms.create(vm_body("dup", host="h3"))] * 4)
    made = [o for o in outcomes if isinstance(o, dict)]
    refused = sorted(o for o in outcomes if not isinstance(o, dict))
    # (the in-flight creates' reservations were counted as room first: 409 fleet_full
    # "vm_count policy 3 reached" for one of them)
    assert len(made) == 1 and made[0]["host"] == "h3", outcomes
    assert [code for code, _ in refused] == ["vm_exists"] * 3, outcomes
    assert all("dup" in msg and "h3" in msg for _, msg in refused), refused
    assert list(agent_vms(a)) == ["dup"]
    assert fleet.client.hosts.get("h3").allocated.vm_count == 1
    # the name's reservation went with its create: the next create of it is the plain clash
    err = api_error(fleet.client.vms.create, vm_body("dup", host="h3"))
    assert (err.code, err.message) == ("vm_exists", "a vm named dup already exists on host h3")


def test_simultaneous_creates_of_one_name_placement_chooses_the_host_of_land_it_once(fleet, proxies):
    hosts = {}
    for h in ("h1", "h2"):
        a = fleet.agent(f"agent-{h}")
        proxy = proxies(a)
        proxy.hold[CREATE] = 0.5
        fleet.add(h, SimpleNamespace(url=proxy.url, token=a.token), vm_count=3)
        hosts[h] = a
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="hosts connected")
    outcomes = at_once(fleet, [lambda c: c.vms.create(vm_body("dup2"))] * 4)
    made = [o for o in outcomes if isinstance(o, dict)]
    # (best fit spread them over both hosts: the name landed twice, ambiguous from then on)
    assert len(made) == 1, outcomes
    assert sorted(o[0] for o in outcomes if not isinstance(o, dict)) == ["vm_exists"] * 3, outcomes
    assert [v["host"] for v in fleet.client.vms.list() if v["name"] == "dup2"] == [made[0]["host"]]
    assert sum("dup2" in agent_vms(a) for a in hosts.values()) == 1


# ---- a wake under the vm_count policy --------------------------------------------------

def test_a_vm_slept_then_woken_at_once_on_a_full_host_is_not_counted_against_itself(fleet):
    fleet.add("h3", fleet.agent("a3"), vm_count=3)
    for n in ("x", "y", "z"):
        fleet.client.vms.create(vm_body(n))
    fleet.client.vms.sleep("x")
    # at once: the poller's last summary still counts x as running (it was refused "its
    # vm_count policy 3 is reached (3 vms hold room there)" with two running)
    woke = fleet.client.vms.wake("x")
    assert woke["state"] == "running"
    assert fleet.client.hosts.get("h3").allocated.vm_count == 3


def test_a_wake_refused_by_the_vm_count_policy_counts_the_vms_that_hold_room(fleet, proxies):
    a = fleet.agent("a3")
    proxy = proxies(a, SlowCreateAnswer)
    fleet.add("h3", SimpleNamespace(url=proxy.url, token=a.token), vm_count=3)
    wait_until(lambda: fleet.client.hosts.get("h3").connected, what="h3 connected")
    for n in ("x", "y", "z"):
        fleet.client.vms.create(vm_body(n))
    fleet.client.vms.sleep("x")
    # w's answer comes back after a poll read the host's summary with w in it: the
    # create's answer counted w a second time until the next poll
    proxy.answer_delay = 1.5
    wait_until(lambda: fleet.client.vms.create(vm_body("w")), what="w created (once a poll has seen x asleep)")
    proxy.answer_delay = 0.0
    err = api_error(fleet.client.vms.wake, "x")
    assert (err.status, err.code) == (409, "host_full"), err.message
    # (it said "(4 vms hold room there)": w twice)
    assert err.message == "host h3 has no room to wake vm x: its vm_count policy 3 is reached " \
                          "(3 vms hold room there)", err.message
    assert fleet.client.hosts.get("h3").allocated.vm_count == 3
    assert {v["name"]: v["state"] for v in fleet.client.vms.list()}["x"] == "sleeping"
    fleet.client.vms.delete("w")
    assert wait_until(lambda: fleet.client.vms.wake("x"), what="x woken")["state"] == "running"


def test_two_wakes_of_one_vm_at_once_are_one_wake_and_one_conflict_not_host_full(fleet, proxies):
    a = fleet.agent("a3")
    proxy = proxies(a)
    fleet.add("h3", SimpleNamespace(url=proxy.url, token=a.token), vm_count=3)
    wait_until(lambda: fleet.client.hosts.get("h3").connected, what="h3 connected")
    for n in ("x", "y", "z"):
        fleet.client.vms.create(vm_body(n))
    fleet.client.vms.sleep("x")
    wait_until(lambda: fleet.client.hosts.get("h3").allocated.vm_count == 2, what="x asleep")
    time.sleep(1.2)  # a poll has seen x asleep
    proxy.hold[b"POST /v1/host/vms/x/wake"] = 0.5
    outcomes = at_once(fleet, [lambda c: c.vms.wake("x")] * 2)
    # (the second counted the first's reservation of x: "policy 3 is reached (3 vms hold room there)")
    assert sorted(o["state"] if isinstance(o, dict) else o[0] for o in outcomes) == ["conflict", "running"], outcomes
    [msg] = [o[1] for o in outcomes if not isinstance(o, dict)]
    assert "x" in msg and "host_full" not in msg and "policy" not in msg, msg
    assert agent_vms(a)["x"]["state"] == "running"
    assert fleet.client.hosts.get("h3").allocated.vm_count == 3
