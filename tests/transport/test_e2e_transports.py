"""One contract, four transports: the same end-to-end flow (register, place a
VM, merged events, usage) against real agents on loopback reached over the
local socket, http + token, SSH and mutual TLS. Agents run the fake backend
so VM placement is real but boots no guest. Then the security figures:
socket modes, tokens never shown or logged, the controller's TCP token."""

from __future__ import annotations

import re
import stat
import time

import httpx
import pytest

import fuse

from .conftest import Agent, free_port, start_agent, start_controller, tcp_open, unix_open, wait_for, FUSE

TRANSPORTS = ["local socket", "http with a token", "ssh", "mutual TLS"]
AGENT_TOKEN = "agent-secret-7f3c9e1d2b"
CONTROLLER_TOKEN = "controller-secret-a1b2c3d4e5"


def start_fake_agent(processes, tmp, **kw) -> Agent:
    return start_agent(processes, tmp, backend="fake", **kw)


def wait_ready(agent: Agent) -> None:
    check = tcp_open(agent.port) if agent.port else unix_open(agent.socket)
    wait_for(check, agent.proc.proc, agent.proc.log, "fuse host serve")


@pytest.fixture(scope="module")
def fleet(processes, tmp_path_factory, sshd, pki):
    """Four agents, one per transport, and one controller that reaches them."""
    root = tmp_path_factory.mktemp("fleet")
    agents = {
        "local socket": start_fake_agent(processes, root / "local", socket_path=root / "local" / "run" / "agent.sock",
                                         wait=False),
        "http with a token": start_fake_agent(processes, root / "http", port=free_port(), token=AGENT_TOKEN, wait=False),
        "ssh": start_fake_agent(processes, root / "ssh", socket_path=root / "ssh" / "run" / "agent.sock", wait=False),
        "mutual TLS": start_fake_agent(processes, root / "tls", port=free_port(), tls=pki.files(pki.host, "127.0.0.1"),
                                       wait=False),
    }
    for agent in agents.values():  # started side by side, then waited for
        wait_ready(agent)
    addrs = {
        "local socket": f"unix://{agents['local socket'].socket}",
        "http with a token": f"http://127.0.0.1:{agents['http with a token'].port}",
        "ssh": sshd.addr,
        "mutual TLS": agents["mutual TLS"].tls_addr,
    }
    ctl = start_controller(processes, root / "ctl", env=sshd.env(f"{FUSE} host relay --socket {agents['ssh'].socket}"),
                           port=free_port(), token=CONTROLLER_TOKEN)
    cert, key, ca = pki.files(pki.controller, "controller")
    r = ctl.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": ca, "placement": "best_fit"})
    assert r.status_code == 200, r.text
    yield ctl, agents, addrs
    ctl.close()


def host_id(transport: str) -> str:
    return transport.lower().replace(" ", "-")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_register_place_events_and_usage_over(fleet, transport):
    ctl, agents, addrs = fleet
    c = ctl.client()
    hid = host_id(transport)
    token = AGENT_TOKEN if transport == "http with a token" else None
    host = c.hosts.register(fuse.RegisterHostRequest(id=hid, url=addrs[transport], token=token, backend="qemu",
                                                     capacity=fuse.HostCapacity(vm_count=4)))
    assert host.url == addrs[transport]
    assert host.capacity.cpus > 0 and host.capacity.ram_mb > 0 and host.agent_id  # probed over this transport

    vm_name = f"vm-{hid}"
    vm = c.vms.create(shape={"vcpus": 1, "mem_mib": 128}, entry="echo hello", name=vm_name, host=hid)
    try:
        assert vm["host"] == hid and vm["name"] == vm_name
        assert c.vms.get(vm_name)["host"] == hid
        assert any(v["name"] == vm_name for v in c.vms.list(host=hid))

        # Merged events: the controller's own, and the agent's, pulled over this transport.
        http = ctl.http()
        deadline, cursor, mine = time.monotonic() + 30, 0, []
        while time.monotonic() < deadline:
            body = http.get("/v1/events", params={"since": cursor, "wait_s": 1, "limit": 500}).json()
            cursor = body["next"]
            mine += [e for e in body["events"] if e["host"] == hid]
            if {"host_added", "placed"} <= {e["type"] for e in mine} and any("host_event_id" in e for e in mine):
                break
        assert {"host_added", "placed"} <= {e["type"] for e in mine}, mine
        assert any("host_event_id" in e for e in mine), mine  # the agent's own events came across

        r = http.get("/v1/usage")
        assert r.status_code == 200, r.text
        usage = r.json()  # metering read from the agent over this transport
        assert hid not in usage["unreachable"], usage["unreachable_reasons"]
        assert hid in usage["hosts"]
        assert any(row["host"] == hid and row.get("name", row.get("vm")) == vm_name for row in usage["vms"]), usage
    finally:
        c.vms.delete(vm_name)  # stops the fake VM's process too


def wait_move(c, move_id: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        move = c.moves.get(move_id)
        if move["state"] in ("done", "failed"):
            return move
        time.sleep(0.2)
    raise AssertionError(f"move {move_id} did not finish in {timeout} s: {move}")


@pytest.mark.parametrize("transport", [t for t in TRANSPORTS if t != "local socket"])
def test_a_vm_moves_there_and_back_over(fleet, transport):
    """Sleep, copy the state files, wake: from the local host to one reached
    over `transport` and home again, so bytes cross it in both directions."""
    ctl, _, addrs = fleet
    c = ctl.client()
    home, away = host_id("local socket"), host_id(transport)
    for hid, t in ((home, "local socket"), (away, transport)):
        c.hosts.register(fuse.RegisterHostRequest(
            id=hid, url=addrs[t], token=AGENT_TOKEN if t == "http with a token" else None,
            capacity=fuse.HostCapacity(vm_count=4)))
    name = f"mover-{away}"
    c.vms.create(shape={"vcpus": 1, "mem_mib": 128}, entry="echo moving", name=name, host=home)
    try:
        for to in (away, home):
            move = wait_move(c, c.moves.create(name, to=to)["id"])
            assert move["state"] == "done", move
            if "copied_bytes" in move:
                assert move["copied_bytes"] == move["total_bytes"] > 0, move
            # Plain sockets take the bulk protocol; encrypted transports copy over HTTP.
            assert move["copy_path"] == ("bulk" if transport == "http with a token" else "http"), move
            assert c.vms.get(name)["host"] == to
    finally:
        c.vms.delete(name)


# ------------------------------------------------------------------ security figures

def test_sockets_are_owner_only_in_an_owner_only_directory(fleet):
    ctl, agents, _ = fleet
    for sock in (ctl.socket, agents["local socket"].socket, agents["ssh"].socket):
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600, sock
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700, sock.parent  # fuse made run/


def test_tokens_are_never_returned_by_the_api(fleet):
    ctl, _, addrs = fleet
    c = ctl.client()
    c.hosts.register(fuse.RegisterHostRequest(id="http-with-a-token", url=addrs["http with a token"],
                                              token=AGENT_TOKEN, capacity=fuse.HostCapacity(vm_count=4)))
    http = ctl.http()
    for path in ("/v1/hosts", "/v1/hosts/http-with-a-token", "/v1/controller", "/openapi.json", "/v1/events",
                 "/v1/usage", "/v1/vms"):
        r = http.get(path)
        assert AGENT_TOKEN not in r.text and CONTROLLER_TOKEN not in r.text, path
    assert "token" not in http.get("/v1/hosts/http-with-a-token").json()


def test_tokens_are_never_written_to_logs(fleet):
    ctl, agents, _ = fleet
    for log in [ctl.proc.log] + [a.proc.log for a in agents.values()]:
        text = log.read_text(errors="replace")
        assert AGENT_TOKEN not in text and CONTROLLER_TOKEN not in text, log


def controller_routes(ctl) -> list[tuple[str, str]]:
    """Every (method, path) the controller's OpenAPI document lists, path
    parameters filled in: "every route" is whatever the API has today."""
    with httpx.Client(base_url=f"http://127.0.0.1:{ctl.port}", timeout=10,
                      headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"}) as c:
        doc = c.get("/openapi.json").json()
    routes = []
    for path, ops in doc["paths"].items():
        filled = re.sub(r"\{[^}]+\}", "x", path)
        routes += [(m.upper(), filled) for m in ops if m in ("get", "put", "post", "patch", "delete")]
    return sorted(routes)


@pytest.mark.parametrize("given", ["no token", "a wrong token", "a token in the wrong scheme"])
def test_the_controllers_tcp_listener_requires_its_token_on_every_route_but_health(fleet, given):
    ctl, _, _ = fleet
    headers = {"no token": {}, "a wrong token": {"Authorization": "Bearer nope"},
               "a token in the wrong scheme": {"Authorization": f"Basic {CONTROLLER_TOKEN}"}}[given]
    routes = controller_routes(ctl)
    assert ("POST", "/v1/hosts") in routes and ("PUT", "/v1/controller") in routes
    with httpx.Client(base_url=f"http://127.0.0.1:{ctl.port}", headers=headers, timeout=10) as c:
        assert c.get("/v1/healthz").status_code == 200
        for method, path in routes:
            if path == "/v1/healthz":
                continue
            r = c.request(method, path, json={})
            assert r.status_code == 401, (method, path, r.status_code)
            assert r.json()["error"]["code"] == "unauthorized", (method, path)
            # a body that does not parse tells a caller without the token nothing either
            r = c.request(method, path, content=b"{bad", headers={"content-type": "application/json"})
            assert r.status_code == 401, (method, path, r.status_code)


def test_the_controllers_api_description_needs_the_token_too(fleet):
    ctl, _, _ = fleet
    with httpx.Client(base_url=f"http://127.0.0.1:{ctl.port}", timeout=10) as c:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert c.get(path).status_code in (401, 404), path


def test_the_controllers_tcp_listener_admits_its_token(fleet):
    ctl, _, _ = fleet
    with fuse.Client(f"http://127.0.0.1:{ctl.port}", token=CONTROLLER_TOKEN) as c:
        assert isinstance(c.hosts.list(), list)


def test_a_stopped_agent_and_controller_remove_their_sockets(tmp_path):
    from support import start_agent, start_controller
    agent = start_agent(tmp_path, backend="fake", name="sock-agent")
    ctl = start_controller(tmp_path, name="sock-ctl")
    assert agent.socket.exists() and ctl.socket.exists()
    agent.stop()
    ctl.stop()
    assert agent.popen.returncode == 0 and ctl.popen.returncode == 0
    assert not agent.socket.exists() and not ctl.socket.exists()
