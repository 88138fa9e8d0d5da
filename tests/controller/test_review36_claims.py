"""A create that claims a prewarmed standby VM (POST /v1/host/vms/{standby}/claim: its host
renames it and gives it the entry), from review 36's fix of plain creates
(test_review36_answers.py): the claim read its host's answer as plain creates no longer do.

- Any status but 200 was "another create took it first" and the claim moved on, and a 200 was
  read with ``resp.json()``: an answer that is not the agent's (a gateway's page, a 200 that is
  not the VM's record), sent after the agent had claimed the VM, tried the next candidate or
  host (the VM ran on two hosts under the create's name) or was a 500 JSONDecodeError.
- A claim the host did not answer (a connection dropped, a timeout: it may have got it) also
  moved on: the claim landed on t1 and the create ran the VM on t2 as well.

Now the host is asked for the VM under the create's name: there (claimed), the claim is done;
else 502 host_unreachable "may still", no other candidate or host tried and the name held until
the host says. The agent's own refusal (its error body) still moves on.

Real agents (fake backend) and a real controller; t1, the one standby VM's host, has room for
that VM alone (a create that moves on can only go to t2), each host behind a ``Pages`` proxy.
"""

from __future__ import annotations

import pytest

import fuse
from support import agent_states, api_error, being_created, start_agent, start_controller, wait_until
from test_review36_answers import HTML, Pages, page

SHAPE = {"vcpus": 1, "mem_mib": 256}
SPEC = {"shape": SHAPE, "entry": "sleep 3600"}


def listed(client, name: str) -> list[str]:
    return sorted(v["host"] for v in client.vms.list() if v["name"] == name)


def events(client, type_: str) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if e["type"] == type_]


@pytest.fixture
def hosts(tmp_path):
    """t1 with one ready standby VM (and room for no other VM) and t2 with room, each behind a
    ``Pages``: (client, proxies, agents, controller, the standby VM's name)."""
    agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
    proxies = [Pages(int(a.url.rsplit(":", 1)[1])) for a in agents]
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url, timeout=120)

    def register(name, proxy, agent, vm_count):
        client.hosts.register(fuse.RegisterHostRequest(
            id=name, url=proxy.url, token=agent.token, backend="qemu",
            capacity=fuse.HostCapacity(cpus=4, ram_mb=4096, vm_count=vm_count)))
        wait_until(lambda: client.hosts.get(name).connected, timeout=30, what=f"{name} connected")

    try:
        register("t1", proxies[0], agents[0], 1)
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local"))
        wait_until(lambda: next(p for p in client.pool.prewarms() if p.id == pw.id).ready == 1,
                   timeout=60, interval=0.3, what="the standby VM ready")
        (standby,) = [v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-")]
        register("t2", proxies[1], agents[1], 10)
        yield client, proxies, agents, ctl, standby
    finally:
        client.close()
        ctl.stop()
        for p in proxies:
            p.close()
        for a in agents:
            a.stop()


def claim(standby: str) -> bytes:
    return f"POST /v1/host/vms/{standby}/claim ".encode()


def claimed_on_t1(client, agents, name: str, standby: str, vm: dict) -> None:
    """The create's answer is the VM t1 claimed for it, recorded as a claim is."""
    on = {h: sorted(agent_states(a)) for h, a in zip(("t1", "t2"), agents)}
    assert name not in on["t2"], ("the create went on to t2 as well: the VM runs twice", vm.get("host"), on)
    assert vm["host"] == "t1" and vm["name"] == name and vm["state"] == "running", vm
    assert name in on["t1"] and standby not in on["t1"], on
    (placed,) = [e for e in events(client, "placed") if e.get("vm") == name]
    assert placed.get("prewarmed") == standby and placed.get("host") == "t1", placed
    assert standby not in [v["name"] for v in client.vms.list()]  # (its row went with the claim)
    assert listed(client, name) == ["t1"]


# answers a host's agent never gives to a claim, each sent after the agent claimed the VM
CLAIM_ANSWERS = {
    "dropped": b"",  # (the connection cut with no answer: a claim that may have been sent)
    "404 page": page("404 Not Found", HTML),
    "200 page": page("200 OK", HTML),
    "200 {}": page("200 OK", "{}", "application/json"),
    "502 page": page("502 Bad Gateway", HTML),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("what", list(CLAIM_ANSWERS))
def test_a_claim_its_host_did_not_answer_as_its_agent_is_asked_about_not_moved_on(hosts, what):
    """(was: the claim moved on and the create booted the VM on t2 while t1 ran it too, or,
    for a 200 page, a 500 JSONDecodeError while t1 ran it)"""
    client, proxies, agents, ctl, standby = hosts
    proxies[0].fake = {claim(standby): (CLAIM_ANSWERS[what], True)}
    vm = client.vms.create({"name": "job", **SPEC})
    proxies[0].fake = {}
    assert proxies[0].faked == 1, proxies[0].faked
    claimed_on_t1(client, agents, "job", standby, vm)
    assert "Traceback" not in ctl.logs(), ctl.logs()[-3000:]


@pytest.mark.timeout(180)
def test_a_claim_whose_host_does_not_say_is_502_may_still_and_holds_the_name(hosts):
    """Dropped after t1 claimed the VM, and the ask then meets a gateway's 404 page: whether t1
    claimed it is not known. (was: 201 on t2, the VM then running on both hosts)"""
    client, proxies, agents, ctl, standby = hosts
    proxies[0].fake = {claim(standby): (b"", True), b"GET /v1/host/vms/job ": (page("404 Not Found", HTML), False)}
    err = api_error(client.vms.create, {"name": "job", **SPEC})
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert "may still" in err.message and "no other" in err.message, err
    assert "<html" not in err.message and "gateway says hello" not in err.message, err
    assert err.details == {"host": "t1", "vm": "job"}, err.details
    assert "job" in agent_states(agents[0]) and "job" not in agent_states(agents[1])
    # the name is held until t1 says: another create of it is no new VM on t2
    assert being_created(client, "job")
    again = api_error(client.vms.create, {"name": "job", **SPEC})
    assert again.code == "vm_exists", again
    assert "job" not in agent_states(agents[1])
    proxies[0].fake = {}  # t1 answers again: the VM it claimed is recorded there
    wait_until(lambda: listed(client, "job") == ["t1"], timeout=30, what="job recorded on t1")
    wait_until(lambda: standby not in [v["name"] for v in client.vms.list()], timeout=30,
               what="the standby VM's row gone")
    assert client.vms.get("job")["host"] == "t1"
    assert "Traceback" not in ctl.logs(), ctl.logs()[-3000:]


@pytest.mark.timeout(180)
def test_the_agents_own_refusal_of_a_claim_still_moves_on(hosts):
    """The agent's JSON error body (409: another create claimed it first) is its refusal: the
    create goes on, here to a VM booted on t2, and t1's standby VM stays."""
    client, proxies, agents, ctl, standby = hosts
    refusal = page("409 Conflict", '{"error": {"code": "conflict", "message": "vm was claimed meanwhile"}}',
                   "application/json")
    proxies[0].fake = {claim(standby): (refusal, False)}
    vm = client.vms.create({"name": "job", **SPEC})
    proxies[0].fake = {}
    assert vm["host"] == "t2", vm
    assert "job" not in agent_states(agents[0]) and standby in agent_states(agents[0])
    assert listed(client, "job") == ["t2"]
