"""One machine (one agent, fake backend) registered under two host ids (review 34): a create
of a name its VM has, through the other id, is 409 vm_exists naming the host the VM is listed
under, which ``?host=`` reaches (it said "already exists on host q1b", while
``GET /v1/vms/NAME?host=q1b`` was 404): pinned to the other id, a full one included, and
placed there by placement (the agent's own vm_exists)."""

from __future__ import annotations

import pytest

from support import api_error, wait_until

pytestmark = pytest.mark.timeout(120)

SAME = "a vm named rv1 already exists on host q1 (the same machine as q1b)"


def _create(client, **kw):
    return client.vms.create(name="rv1", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600", **kw)


def _the_409_names_where_the_vm_is_reached(client, err) -> None:
    assert (err.status, err.code) == (409, "vm_exists"), err
    assert err.message == SAME, err.message
    assert client.vms.get("rv1", host="q1")["host"] == "q1"  # (the host named reaches it)
    assert [v["host"] for v in client.vms.list() if v["name"] == "rv1"] == ["q1"]


@pytest.mark.parametrize("q1b_vm_count", [10, 1], ids=["room there", "its vm_count reached"])
def test_a_create_pinned_to_the_other_name_names_the_host_the_vm_is_listed_under(fleet, q1b_vm_count):
    a = fleet.agent("a1")
    fleet.add("q1", a)
    fleet.add("q1b", a, vm_count=q1b_vm_count)
    wait_until(lambda: all(fleet.client.hosts.get(h).connected for h in ("q1", "q1b")), what="both names up")
    _create(fleet.client, host="q1")
    err = api_error(_create, fleet.client, host="q1b")
    _the_409_names_where_the_vm_is_reached(fleet.client, err)
    assert api_error(fleet.client.vms.get, "rv1", host="q1b").code == "not_found"  # (as documented: one name)


def test_a_create_placement_sends_to_the_other_name_names_the_host_the_vm_is_listed_under(fleet):
    a = fleet.agent("a1")
    fleet.add("q1", a, vm_count=1)  # (rv1 fills q1's policy: placement can only choose q1b)
    fleet.add("q1b", a)
    wait_until(lambda: all(fleet.client.hosts.get(h).connected for h in ("q1", "q1b")), what="both names up")
    _create(fleet.client, host="q1")
    err = api_error(_create, fleet.client)
    _the_409_names_where_the_vm_is_reached(fleet.client, err)
