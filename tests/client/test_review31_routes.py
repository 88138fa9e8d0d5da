"""Review 31: a path ending in `/` (or holding `//`) is an empty id only where a route
takes it once the empty part is filled in; otherwise it is a route the server lacks."""

from __future__ import annotations

import httpx
import pytest

import fuse
from support import start_agent, start_controller


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    agent = start_agent(tmp, backend="fake")
    ctl = start_controller(tmp, listen=True, token="ctl-token")
    yield agent, f"http://127.0.0.1:{ctl.extra['port']}"
    ctl.stop()
    agent.stop()


@pytest.mark.parametrize("path,code", [
    ("/v1/nosuchroute/", "no_route"),
    ("/v1/vms/job1/", "no_route"),
    ("/v1//nosuch", "no_route"),
    ("/v1/vms/", "not_found"),
    ("/v1/prewarms/", "not_found"),
    ("/v1/vms//sleep", "not_found"),
])
def test_controller_trailing_slash_is_no_route_unless_an_id_is_empty(servers, path, code):
    _, url = servers
    method = "POST" if path.endswith("sleep") else "GET"
    r = httpx.request(method, url + path, headers={"Authorization": "Bearer ctl-token"}, timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (404, code), r.text


def test_agent_url_as_controller_empty_names_are_invalid_answer(servers):
    agent, _ = servers
    with fuse.Client(agent.url, token=agent.token) as c:
        for call in (lambda: c.vms.get(""), lambda: c.hosts.get("")):
            with pytest.raises(fuse.ApiError) as info:
                call()
            assert info.value.code == "invalid_answer" and not fuse.is_not_found(info.value), info.value
    with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=10) as h:
        r = h.get("/v1/host/vms/")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found"), r.text
        r = h.get("/v1/host/nosuch/")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "no_route"), r.text


@pytest.mark.parametrize("path", ["/v1/vms/a%2Fb", "/v1/moves/a%2fb"])
def test_a_name_holding_a_slash_is_not_found_not_a_missing_route(servers, path):
    _, url = servers
    r = httpx.get(url + path, headers={"Authorization": "Bearer ctl-token"}, timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found"), r.text
    r = httpx.get(url + "/v1/nosuch/a%2Fb", headers={"Authorization": "Bearer ctl-token"}, timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "no_route"), r.text


def test_the_sdk_and_cli_say_not_found_for_a_vm_name_with_a_slash(servers):
    _, url = servers
    with fuse.Client(url, token="ctl-token") as c:
        with pytest.raises(fuse.ApiError) as info:
            c.vms.get("a/b")
        assert info.value.code == "not_found" and fuse.is_not_found(info.value), info.value


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/hosts/"), ("DELETE", "/v1/hosts/"), ("POST", "/v1/hosts/?action=cordon"),
    ("POST", "/v1/hosts/?action=drain"),
])
def test_an_empty_host_id_names_nothing_as_other_routes_say(servers, method, path):
    # review 35: the hosts routes take any path, so `/v1/hosts/` reached them as host "" and
    # said "host  not found"
    _, url = servers
    r = httpx.request(method, url + path, headers={"Authorization": "Bearer ctl-token"}, timeout=10)
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {"code": "not_found", "message": "/v1/hosts/: an empty id names nothing"}, r.text
