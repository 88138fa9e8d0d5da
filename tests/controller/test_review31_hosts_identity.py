"""Agent identities, from review 31 (finding 4): an agent-id file copied to another machine
(one made from an image after its agent ran) gives two agents one identity. Each agent
reports an `instance`, new at each start, so the registry tells one machine reached two ways
(one instance at both addresses) from two machines (the other address answering as another
process): the copy is refused (409 conflict, naming both addresses and the copied file), where
it was registered as an alias of the first, and a host moved to it forgot the VM running on
the first without an event."""

from __future__ import annotations

import contextlib
import shutil

import httpx
import pytest

import fuse
from fuse import HostCapacity
from support import start_agent, start_controller, wait_until


@contextlib.contextmanager
def two_machines(tmp_path):
    """(a, b, client): two fake-backend agents, b's state dir holding a copy of a's agent-id."""
    a = start_agent(tmp_path, backend="fake", name="a")
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "agent-id", tmp_path / "b" / "agent-id")  # (the image)
    b = start_agent(tmp_path, backend="fake", name="b")
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        yield a, b, client
    finally:
        client.close()
        ctl.stop()
        b.stop()
        a.stop()


def register(client, host_id: str, agent, url: str | None = None):
    return client.hosts.register(fuse.RegisterHostRequest(
        id=host_id, url=url or agent.url, token=agent.token, backend="qemu", capacity=HostCapacity(vm_count=2)))


def facts(agent) -> dict:
    return httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10).json()


def refusal(fn) -> fuse.ApiError:
    with pytest.raises(fuse.ApiError) as exc:
        fn()
    return exc.value


def test_a_copy_of_an_agents_identity_is_refused_as_an_alias_of_it(tmp_path):
    with two_machines(tmp_path) as (a, b, client):
        assert facts(a)["agent_id"] == facts(b)["agent_id"] and facts(a)["instance"] != facts(b)["instance"]
        register(client, "ha", a)
        # (was: 201, hb an alias of ha, one machine to the registry: usage, room and VMs shared)
        err = refusal(lambda: register(client, "hb", b))
        assert (err.status, err.code) == (409, "conflict"), err
        assert a.url in err.message and b.url in err.message and "host ha's address" in err.message, err.message
        assert "agent-id file of one copied from the other" in err.message, err.message
        assert [h.id for h in client.hosts.list()] == ["ha"]
        # As the message says: the copy takes an identity of its own, and registers.
        b.stop()
        (tmp_path / "b" / "agent-id").unlink()
        b = start_agent(tmp_path, backend="fake", name="b")
        try:
            hb = register(client, "hb", b)
            assert hb.agent_id and hb.agent_id != client.hosts.get("ha").agent_id
        finally:
            b.stop()


def test_a_host_is_not_moved_to_a_copy_of_its_agent_while_the_first_answers(tmp_path):
    with two_machines(tmp_path) as (a, b, client):
        register(client, "ha", a)
        client.vms.create({"name": "keep", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 1000",
                           "host": "ha"})
        # (was: 200, and the controller forgot vm keep, still running on a, without an event)
        err = refusal(lambda: register(client, "ha", b))
        assert (err.status, err.code) == (409, "conflict"), err
        assert f"the one at {a.url} (this host's address before)" in err.message, err.message
        assert client.hosts.get("ha").url == a.url
        assert [(v["name"], v["host"]) for v in client.vms.list()] == [("keep", "ha")]
        # The first machine gone (its address no longer answers): a machine that moved, as before.
        a.stop()
        assert register(client, "ha", b).url == b.url


def test_one_agent_reached_two_ways_is_one_machine(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a")
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        register(client, "tcp", agent)
        host = register(client, "sock", agent, url=f"unix://{agent.socket}")  # (one instance at both)
        assert host.agent_id == client.hosts.get("tcp").agent_id
        assert sorted(h.id for h in client.hosts.list()) == ["sock", "tcp"]
    finally:
        client.close()
        ctl.stop()
        agent.stop()


def test_an_agent_reports_a_new_instance_at_each_start(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a")
    first = facts(agent)
    agent.stop()
    agent = start_agent(tmp_path, backend="fake", name="a")
    try:
        again = wait_until(lambda: facts(agent), what="the agent")
        assert again["agent_id"] == first["agent_id"] and len(first["instance"]) == 16
        assert again["instance"] != first["instance"]
    finally:
        agent.stop()
