"""VMs through the controller, from review 36 (network faults, issues 1 and 2): an answer from
a host that is not its agent's — something in the way (a gateway, an L7 load balancer, a WAF)
answering in its own words, after passing the request on or not — was read as the agent's.

- A create answered so (a 404 or 200 page, a 200 ``{}``, a 202) was taken for the host's
  refusal and tried on the next host: one create, the VM running on two hosts. A 201 whose body
  is not JSON was a 500 JSONDecodeError while the VM ran. Now the host is asked (as after a
  5xx): a VM it runs is the create's; else it is a host that may have got the create: 502
  host_unreachable "may still create it", no other host tried, and the VM recorded once its
  host lists it.
- A get, sleep, wake or delete answered so was a 500 JSONDecodeError (a 200 page), or ``internal``
  under the page's status with the page quoted (a 404 a REST caller reads as "gone"). Now it is
  502 host_unreachable in one sentence, never quoting the body; the agent's own error answers
  are passed on as before.

Real agents (fake backend) and a real controller; each host ``t1``/``t2`` is reached through
``Pages``, a loopback proxy that can answer a request with a canned page.
"""

from __future__ import annotations

import shutil
import socket

import pytest

import fuse
from support import Proxy, agent_states, api_error, being_created, start_agent, start_controller, wait_until


def page(status: str, body: str, kind: str = "text/html") -> bytes:
    """An HTTP/1.1 answer with ``body`` (closing the connection: a pooled one is not reused)."""
    return (f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n{body}").encode()


HTML = "<html><body>gateway says hello</body></html>"


class Pages(Proxy):
    """A ``Proxy`` that answers requests starting with a prefix of ``fake`` with that prefix's
    canned answer in place of the agent's: passed on to the agent first (its answer thrown
    away) when ``passed`` says so, else answered at once (the agent never sees it)."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self.fake: dict[bytes, tuple[bytes, bool]] = {}
        self.faked = 0
        self._owed: dict[int, bytes] = {}  # client socket -> the answer it gets in place of the agent's

    def _passes(self, src: socket.socket, dst: socket.socket, data: bytes, requests: bool) -> bool:
        if requests:
            rule = next((r for p, r in self.fake.items() if data.startswith(p)), None)
            if rule is None:
                return self._forward(data)  # (``hold``, as a plain Proxy)
            answer, passed = rule
            self.faked += 1
            if passed:
                self._owed[id(src)] = answer
                return True
            src.sendall(answer)  # (a gateway's own answer: the request goes no further)
            return False
        answer = self._owed.pop(id(dst), None)
        if answer is None:
            return True
        dst.sendall(answer)  # (the agent's answer, read in full by now or not, is dropped)
        return False


@pytest.fixture
def hosts(tmp_path):
    """t1 (the tighter host: placement's first choice) and t2, each behind a ``Pages``."""
    agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
    proxies = [Pages(int(a.url.rsplit(":", 1)[1])) for a in agents]
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url, timeout=120)
    try:
        for name, proxy, agent, ram in (("t1", proxies[0], agents[0], 1024), ("t2", proxies[1], agents[1], 4096)):
            client.hosts.register(fuse.RegisterHostRequest(
                id=name, url=proxy.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(cpus=4, ram_mb=ram, vm_count=10)))
        wait_until(lambda: all(h.connected for h in client.hosts.list()), what="both hosts connected")
        yield client, proxies, agents, ctl
    finally:
        client.close()
        ctl.stop()
        for p in proxies:
            p.close()
        for a in agents:
            a.stop()


SPEC = {"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 3600"}

# answers a host's agent never gives to a create, each sent after the agent got it
CREATE_ANSWERS = {
    "404 page": page("404 Not Found", HTML),
    "200 page": page("200 OK", HTML),
    "200 {}": page("200 OK", "{}", "application/json"),
    "202": page("202 Accepted", "", "application/json"),
    "201 page": page("201 Created", HTML),
    "502 page": page("502 Bad Gateway", HTML),
}


def listed(client, name: str) -> list[str]:
    return sorted(v["host"] for v in client.vms.list() if v["name"] == name)


def test_a_create_answered_by_something_in_the_way_is_not_tried_on_another_host(hosts):
    client, proxies, agents, ctl = hosts
    for i, (what, answer) in enumerate(CREATE_ANSWERS.items()):
        name = f"twice{i}"
        # (and the read the controller then makes of the VM there meets a gateway's 404 page
        # too: whether t1 got the create is not known)
        proxies[0].fake = {b"POST /v1/host/vms ": (answer, True),
                           f"GET /v1/host/vms/{name} ".encode(): (page("404 Not Found", HTML), False)}
        err = api_error(client.vms.create, {"name": name, **SPEC})
        proxies[0].fake = {}
        assert (err.status, err.code) == (502, "host_unreachable"), (what, err)
        assert "may still create it" in err.message and "no other host was tried" in err.message, (what, err)
        assert "gateway says hello" not in err.message and "<html" not in err.message, (what, err)
        assert err.details.get("host") == "t1", (what, err.details)
        # the VM runs on t1 alone, and the controller records it there once t1 answers for it
        assert name in agent_states(agents[0]), what
        assert name not in agent_states(agents[1]), (what, "the create was sent on to t2 as well")
        wait_until(lambda: listed(client, name) == ["t1"], timeout=30, what=f"{name} recorded on t1 ({what})")
        assert client.vms.get(name)["host"] == "t1"
        client.vms.delete(name)
        # (its host said, so the create's hold on t1's room goes: t1 is the first choice again)
        wait_until(lambda: not being_created(client, name), timeout=30, what=f"{name} no longer held")
    # with that read answered by t1's agent, the VM it runs is the create's at once
    proxies[0].fake = {b"POST /v1/host/vms ": (page("404 Not Found", HTML), True)}
    vm = client.vms.create({"name": "asked", **SPEC})
    proxies[0].fake = {}
    assert vm["host"] == "t1" and vm["state"] == "running", vm
    assert "asked" not in agent_states(agents[1]) and listed(client, "asked") == ["t1"]
    assert "Traceback" not in ctl.logs(), ctl.logs()[-3000:]


def test_a_pinned_create_answered_so_quotes_no_page(hosts):
    client, proxies, agents, ctl = hosts
    proxies[1].fake = {b"POST /v1/host/vms ": (page("200 OK", HTML), True),
                       b"GET /v1/host/vms/pinned ": (page("200 OK", HTML), False)}
    err = api_error(client.vms.create, {"name": "pinned", "host": "t2", **SPEC})
    proxies[1].fake = {}
    assert (err.status, err.code) == (502, "host_unreachable") and "may still create it" in err.message, err
    assert "<html" not in err.message and "hosts" not in err.details, err
    wait_until(lambda: listed(client, "pinned") == ["t2"], timeout=30, what="pinned recorded on t2")


def test_an_agents_own_refusal_still_passes_the_create_on(hosts):
    """The agent's own error answer (its fuse error body) is still its refusal: the next host
    takes the create. Here t1's agent lost the bundle since it listed it (its polls held)."""
    client, proxies, agents, ctl = hosts
    proxies[0].hold[b"GET /v1/host HTTP"] = 4.0
    wait_until(lambda: proxies[0].held > 0, what="a poll of t1 held")
    shutil.rmtree(agents[0].state_dir / "bundles" / "linux")
    vm = client.vms.create({"name": "refused", **SPEC})
    assert vm["host"] == "t2", vm
    assert "refused" not in agent_states(agents[0])


def test_get_sleep_wake_delete_answered_by_something_in_the_way(hosts):
    client, proxies, agents, ctl = hosts
    assert client.vms.create({"name": "w", **SPEC})["host"] == "t1"
    p = proxies[0]

    def fails(what, call, *a, **kw):
        err = api_error(call, *a, **kw)
        p.fake = {}
        assert (err.status, err.code) == (502, "host_unreachable"), (what, err)
        assert "gateway says hello" not in err.message and "<html" not in err.message, (what, err)
        assert "\n" not in err.message, (what, err)
        return err

    # a 200 page after the agent slept it: not a 500 JSONDecodeError; the sleep may have been done
    p.fake = {b"POST /v1/host/vms/w/sleep ": (page("200 OK", HTML), True)}
    err = fails("sleep 200 page", client.vms.sleep, "w")
    assert "may still sleep it" in err.message and err.details == {"host": "t1", "vm": "w"}, err
    assert agent_states(agents[0])["w"] == "sleeping"
    wait_until(lambda: client.vms.get("w")["state"] == "sleeping", what="w read asleep")
    # a proxy's 502 page to a wake: host_unreachable (not `internal` with the page quoted)
    p.fake = {b"POST /v1/host/vms/w/wake ": (page("502 Bad Gateway", HTML), True)}
    err = fails("wake 502 page", client.vms.wake, "w")
    assert "may still wake it" in err.message, err
    wait_until(lambda: client.vms.get("w")["state"] == "running", what="w read running")
    # a 200 JSON that is not the VM's record
    p.fake = {b"POST /v1/host/vms/w/sleep ": (page("200 OK", "[]", "application/json"), True)}
    fails("sleep 200 []", client.vms.sleep, "w")
    wait_until(lambda: client.vms.get("w")["state"] == "sleeping", what="w read asleep")
    client.vms.wake("w")
    # a gateway's own 404 page (nothing passed on): not a 404 a caller reads as gone
    gw404 = page("404 Not Found", HTML)
    p.fake = {b"GET /v1/host/vms/w ": (gw404, False)}
    fails("get 404 page", client.vms.get, "w")
    p.fake = {b"POST /v1/host/vms/w/sleep ": (gw404, False)}
    fails("sleep 404 page", client.vms.sleep, "w")
    p.fake = {b"DELETE /v1/host/vms/w ": (gw404, False)}
    err = fails("delete 404 page", client.vms.delete, "w")
    assert "may still delete it" in err.message, err
    assert agent_states(agents[0])["w"] == "running" and listed(client, "w") == ["t1"]
    # a 200 page to a delete (the agent answers 204): it may have been done, not "deleted"
    p.fake = {b"DELETE /v1/host/vms/w ": (page("200 OK", HTML), False)}
    fails("delete 200 page", client.vms.delete, "w")
    assert listed(client, "w") == ["t1"]
    # the agent's own error answers are passed on as they are
    err = api_error(client.vms.wake, "w")  # (it runs: the agent's 409)
    assert err.status == 409 and err.code != "host_unreachable", err
    client.vms.delete("w")
    assert "w" not in agent_states(agents[0]) and listed(client, "w") == []
    assert api_error(client.vms.get, "w").status == 404
    assert "Traceback" not in ctl.logs(), ctl.logs()[-3000:]


def test_a_page_of_json_nested_past_reading_is_no_agents_answer_not_a_recursion_error():
    """(the diff review: the checks caught ValueError only; a proxy's JSON nested deeper than the
    decoder's recursion limit escaped as a RecursionError, a 500)"""
    import httpx

    from fuse.controller.vms import agent_error, not_agents, vm_record

    deep = httpx.Response(404, content=b"[" * 200_000 + b"]" * 200_000, headers={"content-type": "application/json"})
    assert agent_error(deep) is None and vm_record(deep, "v") is None
    assert not_agents(deep, "h1").code == "host_unreachable"
