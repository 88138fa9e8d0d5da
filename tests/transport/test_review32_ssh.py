"""Review 32, ssh:// against a real sshd on loopback and the real `fuse host relay`:

* a relay that could not connect to the agent (no socket, or one that refuses
  connections: the agent stopped or crashed) forwarded nothing, so the request is one
  the host never got (`maybe_sent` False: a create goes on to the next host and holds
  no name), as over unix:// to the same socket; a relay that did connect and lost the
  agent may have delivered it;
* an SSH user holding a shell's `;`, `$(...)` or backquotes is no login name: 400 before
  anything is dialled or stored (sshd saw "Invalid user $(id)"), while directory logins
  (user@domain, DOMAIN+user) stay addresses;
* a host key marked @revoked in known_hosts is said to be revoked, not missing."""

from __future__ import annotations

import socket
import threading

import pytest

from fuse.errors import HostUnreachable, NotTrusted
from fuse.transport import HostConnection, ssh
from fuse.transport.address import BadAddress, parse_address

from .conftest import FUSE, start_controller

TOKEN = "controller-secret-review32"



async def create_error(addr: str) -> HostUnreachable:
    conn = HostConnection(addr, timeout=20)
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("POST", "/v1/host/vms", json={"name": "w1"})
    finally:
        await conn.close()
    return info.value


def refusing_socket(path) -> socket.socket:
    """A socket file nothing accepts on (an agent SIGKILLed leaves its socket so)."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("agent", ["no socket", "a socket that refuses connections"])
async def test_a_relay_that_could_not_reach_the_agent_sent_nothing(relay_env, monkeypatch, tmp_path, agent):
    path = tmp_path / "agent.sock"
    held = refusing_socket(path) if agent != "no socket" else None
    try:
        monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {path}")
        over_ssh = await create_error(relay_env.addr)
        over_unix = await create_error(f"unix://{path}")
    finally:
        if held is not None:
            held.close()
    said = "no host agent socket at" if agent == "no socket" else "refuses connections"
    assert said in over_ssh.message, over_ssh.message
    # (it was True: "it may still create it ..., so no other host was tried", and the name held)
    assert over_ssh.maybe_sent is False, over_ssh.message
    assert over_unix.maybe_sent is False  # the same agent over its socket: passed on, as now over SSH


async def test_a_relay_that_reached_the_agent_and_lost_it_may_have_delivered_the_request(relay_env, monkeypatch,
                                                                                        tmp_path):
    path = tmp_path / "agent.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen()
    got: list[bytes] = []

    def agent_dies_on_the_request():
        conn, _ = srv.accept()
        got.append(conn.recv(65536))
        conn.close()

    threading.Thread(target=agent_dies_on_the_request, daemon=True).start()
    try:
        monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {path}")
        err = await create_error(relay_env.addr)
    finally:
        srv.close()
    assert got and got[0].startswith(b"POST /v1/host/vms"), got
    assert getattr(err, "maybe_sent", True) is True, err.message  # (unset: the callers read it so)


def test_the_relay_and_the_transport_agree_on_the_never_connected_status():
    from fuse.cli import relay
    assert relay.NOT_CONNECTED == ssh.RELAY_NOT_CONNECTED


# ------------------------------------------------------------------ an SSH user that is no name

SHELL_USERS = ["a;b", "$(id)", "`id`", "a|b", "a&b", "a>b", "{a,b}", 'a"b', "a*", "-oProxyCommand=x"]


@pytest.mark.parametrize("user", SHELL_USERS)
def test_an_ssh_user_with_shell_characters_is_no_address(user):
    with pytest.raises(BadAddress, match="is not a login name"):
        parse_address(f"ssh://{user}@127.0.0.1:22")


@pytest.mark.parametrize("user", ["ops", "first.last", "svc-fuse_1", "CORP+ops", "ops@corp.example", "CORP.ops",
                                  "CORP\\alice", "HOST$", "o'brien"])
def test_directory_logins_stay_addresses(user):
    assert parse_address(f"ssh://{user}@127.0.0.1:22").user == user


def test_registering_an_ssh_user_with_shell_characters_dials_nothing_and_stores_nothing(sshd, processes, tmp_path):
    ctl = start_controller(processes, tmp_path / "ctl", env=sshd.env(f"{FUSE} host relay"))
    try:
        http = ctl.http()
        full = {"vm_count": 2, "cpus": 2, "ram_mb": 1024, "storage_gb": 5}  # (an outage would be stored)
        for user in ("a;b", "$(id)", "`id`"):
            r = http.post("/v1/hosts", json={"id": "h", "url": f"ssh://{user}@127.0.0.1:{sshd.port}",
                                             "backend": "qemu", "capacity": full})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "invalid_argument" and "is not a login name" in err["message"], err
        assert http.get("/v1/hosts").json()["hosts"] == []
    finally:
        ctl.close()
    for user in ("a;b", "$(id)", "`id`"):  # sshd never saw the login (it logged "Invalid user $(id)")
        assert f"Invalid user {user} " not in sshd.proc.text(), sshd.proc.text()[-2000:]


# ------------------------------------------------------------------ a revoked host key

async def test_a_host_key_marked_revoked_is_said_to_be_revoked(relay_env, monkeypatch, tmp_path):
    listed = relay_env.known_hosts.read_text().strip()       # "[127.0.0.1]:PORT ssh-ed25519 AAAA..."
    (known := tmp_path / "known_hosts").write_text(f"{listed}\n@revoked {listed}\n")
    monkeypatch.setenv("FUSE_SSH_KNOWN_HOSTS", str(known))
    err = await create_error(relay_env.addr)
    assert isinstance(err, NotTrusted)
    # (it was "it is missing from or does not match": the operator would add a key already there)
    assert err.message == (f"the SSH host key of 127.0.0.1:{relay_env.port} is not trusted: it is marked "
                           f"@revoked in {known}"), err.message
