"""A bulk read makes the checks of the HTTP route it stands for, and refuses as it does:
JSON integers only, and a listed state file gone from disk is 404, said in the protocol's
refusal (was: the connection ended with no reply and nothing logged)."""

from __future__ import annotations

import socket

import httpx
import pytest

from test_bulk_protocol import ask as ask_on

TOKEN = "agent-token"


@pytest.fixture
def agent(fake_agent):
    return fake_agent


def api(a, method, path, **kw) -> httpx.Response:
    return httpx.request(method, a.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, **kw)


def ask(a, header: dict) -> dict:
    """One bulk header to agent ``a`` on a connection of its own, and its reply line."""
    host, port = a.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        return ask_on(s, header)


@pytest.fixture
def asleep(agent):
    r = api(agent, "POST", "/v1/host/vms", json={"name": "s1", "shape": {"vcpus": 1, "mem_mib": 128},
                                                  "entry": "count"})
    assert r.status_code == 201, r.text
    r = api(agent, "POST", "/v1/host/vms/s1/sleep", json={})
    assert r.status_code == 200, r.text
    return max(r.json()["files"], key=lambda f: f["size"])


@pytest.mark.parametrize("field, value", [
    ("offset", True), ("length", True), ("length", False),
], ids=["offset true", "length true", "length false"])
def test_a_read_refuses_a_bool_where_an_integer_goes(agent, asleep, field, value):
    header = {"op": "read", "token": TOKEN, "vm": "s1", "file": asleep["name"], "offset": 0, "length": 4}
    reply = ask(agent, header | {field: value})
    assert (reply["ok"], reply["status"], reply["error"]["code"]) == (False, 400, "invalid_argument"), reply
    # the HTTP route it stands for
    r = api(agent, "GET", f"/v1/host/vms/s1/files/{asleep['name']}", params={"offset": "true", "length": 4})
    assert r.status_code == 400


def test_a_read_of_a_listed_file_gone_from_disk_is_404_as_over_http(agent, asleep):
    (agent.state_dir / "vms" / "s1" / "state" / asleep["name"]).unlink()
    r = api(agent, "GET", f"/v1/host/vms/s1/files/{asleep['name']}")
    assert r.status_code == 404, r.text

    reply = ask(agent, {"op": "read", "token": TOKEN, "vm": "s1", "file": asleep["name"], "offset": 0, "length": 4})
    assert (reply["ok"], reply["status"], reply["error"]) == (False, 404, r.json()["error"]), reply
    assert api(agent, "GET", "/v1/host").status_code == 200  # the agent is fine
