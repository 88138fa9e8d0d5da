"""A create its host did not answer, between real processes: the host (a real agent
behind a loopback proxy that hangs up) may still have made the VM, so it cannot be
deregistered (409 conflict, as while a create waits on it) until it says whether the
VM is there; and for no longer than a bound, should it never say."""

from __future__ import annotations

import json
import types
from pathlib import Path

import httpx
import pytest

import fuse
from support import Proxy, wait_until

BODY = {"name": "job1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", "host": "a"}


class Partition(Proxy):
    """A loopback TCP proxy in front of an agent that passes the create of a VM on, as
    far as the agent, and hangs up on the controller before a word of the answer: from
    then on, until ``heal()``, it hangs up on every request (the host is gone)."""

    gone = False

    def _forward(self, data: bytes) -> bool:
        if data.startswith(b"POST /v1/host/vms "):
            self.gone = True
        return not self.gone and super()._forward(data)

    def heal(self) -> None:
        self.gone = False


@pytest.fixture
def unanswered(fleet):
    """Host a (an agent behind a Partition) and a create of job1 there that it did not
    answer: ``land()`` has the agent make job1 after all, as if the request got through."""
    def setup(env=None):
        if env:
            fleet.restart(env)
        agent = fleet.agent("agent-a")
        proxy = Partition(int(agent.url.rsplit(":", 1)[1]))
        fleet.add("a", types.SimpleNamespace(url=proxy.url, token=agent.token))
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.vms.create(dict(BODY))
        assert (info.value.status, info.value.code) == (502, "host_unreachable"), info.value.message
        assert "may still create it" in info.value.message

        def land():
            body = {k: v for k, v in BODY.items() if k != "host"}
            r = httpx.post(agent.url + "/v1/host/vms", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {agent.token}"})
            assert r.status_code == 201, r.text

        made.append(proxy)
        return types.SimpleNamespace(agent=agent, proxy=proxy, land=land)

    made: list[Proxy] = []
    yield setup
    for p in made:
        p.close()


def deregister(fleet):
    """None when it went, else the refusal."""
    try:
        fleet.client.hosts.deregister("a")
    except fuse.ApiError as exc:
        return exc
    return None


def test_a_host_whose_unanswered_create_landed_is_not_deregistered_and_keeps_the_vm(fleet, unanswered):
    u = unanswered()
    u.land()  # the create did reach the agent; the controller cannot know (the host is gone)
    err = deregister(fleet)
    assert err is not None and (err.status, err.code) == (409, "conflict"), err
    assert "has vm job1 being placed" in err.message, err.message  # (seed 000: names the blocking VM)
    u.proxy.heal()
    wait_until(lambda: any(v["name"] == "job1" and v["host"] == "a" for v in fleet.client.vms.list()),
               timeout=30, what="job1 recorded on a once a answers")
    err = deregister(fleet)
    assert err is not None and err.code == "conflict" and "still has vm job1 assigned" in err.message, err
    # the stream says where it went, as for an answered create (review 22: it never said)
    placed = wait_until(lambda: [e for e in fleet.client.events.list(0, limit=500)["events"]
                                 if e["type"] == "placed"], timeout=10, what="a placed event")
    assert [(e["vm"], e["host"], e["vcpus"], e["mem_mib"], e["unanswered"]) for e in placed] == [
        ("job1", "a", 1, 256, True)]


def test_a_host_that_says_the_vm_is_not_there_can_be_deregistered_again(fleet, unanswered):
    u = unanswered()
    err = deregister(fleet)
    assert err is not None and (err.status, err.code) == (409, "conflict"), err
    u.proxy.heal()
    wait_until(lambda: deregister(fleet) is None, timeout=30, what="a deregistered once it said no job1")
    assert fleet.client.hosts.list() == []


def test_a_host_that_never_answers_again_is_held_only_for_a_bounded_time(fleet, unanswered):
    unanswered(env={"FUSE_CREATE_UNANSWERED_S": "3"})
    err = deregister(fleet)
    assert err is not None and (err.status, err.code) == (409, "conflict"), err
    wait_until(lambda: deregister(fleet) is None, timeout=30, what="a let go after the bound")


# ---- what the OpenAPI document says of it ----------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_document_says_a_waiting_create_holds_the_host_and_capacities_are_integers():
    doc = json.loads(DOC.read_text())
    delete = doc["paths"]["/v1/hosts/{host_id}"]["delete"]["responses"]["409"]["description"]
    assert "conflict" in delete and "a create waits on the host" in delete and "did not answer" in delete, delete
    register = doc["paths"]["/v1/hosts"]["post"]["responses"]
    assert "a create waits on the host" in register["409"]["description"], register["409"]
    assert "not an integer" in register["400"]["description"], register["400"]
