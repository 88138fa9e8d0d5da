"""GET /v1/vms?host=: a host the controller knows nothing of is 404, as when a
create pins one, so a misspelt name never reads as "no VMs there"; a host it
knows — registered, bought by the elastic pool and not joined yet, or still
named by a VM — answers its VMs, even none. Through the real app over rows
put in the store (no agent is contacted)."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller
from fuse.controller.store import elastic_hosts
from fuse.controller.store import vms as vms_t


@pytest.fixture
def ctl(tmp_path):
    c = Controller(tmp_path / "ctl")
    yield c
    c.store.close()


def get(ctl, query: str):
    return TestClient(create_app(ctl), raise_server_exceptions=False).get("/v1/vms" + query)


def register(ctl, host: str) -> None:
    with ctl.store.tx() as c:
        ctl.store.put_host(c, {"id": host, "url": f"http://{host}.invalid", "token": "", "backend": "qemu",
                               "agent_id": f"agent-{host}", "state": "active", "capacity": {}, "last_seen": 0.0,
                               "created_at": 0.0, "updated_at": 0.0})


def put_vm(ctl, name: str, host: str) -> None:
    with ctl.store.tx() as c:
        c.execute(vms_t.insert().values(name=name, host=host, vcpus=1, mem_mib=256, state="running", record={},
                                        created_at=time.time()))


def test_a_host_nobody_knows_is_404_like_a_pinned_create(ctl):
    register(ctl, "h1")
    r = get(ctl, "?host=h2")
    assert r.status_code == 404, r.text
    assert r.json() == {"error": {"code": "not_found", "message": "host h2 not found"}}
    pinned = TestClient(create_app(ctl)).post("/v1/vms", json={"shape": {"vcpus": 1, "mem_mib": 128},
                                                               "entry": "x", "host": "h2"})
    assert (pinned.status_code, pinned.json()["error"]["code"]) == (404, "not_found")


def test_a_registered_host_with_no_vms_answers_an_empty_list(ctl):
    register(ctl, "h1")
    r = get(ctl, "?host=h1")
    assert r.status_code == 200 and r.json() == {"vms": []}


def test_the_vms_of_the_host_given_and_only_those(ctl):
    for host, vm in (("h1", "a"), ("h2", "b")):
        register(ctl, host)
        put_vm(ctl, vm, host)
    assert [v["name"] for v in get(ctl, "?host=h1").json()["vms"]] == ["a"]
    assert sorted(v["name"] for v in get(ctl, "").json()["vms"]) == ["a", "b"]


def test_vms_still_named_on_a_host_no_longer_registered_are_listed(ctl):
    put_vm(ctl, "orphan", "gone-host")
    r = get(ctl, "?host=gone-host")
    assert r.status_code == 200 and [v["name"] for v in r.json()["vms"]] == ["orphan"]


def test_a_machine_the_pool_bought_that_has_not_joined_yet_answers_an_empty_list(ctl):
    now = time.time()
    with ctl.store.tx() as c:
        c.execute(elastic_hosts.insert().values(
            name="dev-1", provider="dev", type_name="local.small", region="home", cloud_id="", state="booting",
            started=now, ended=None, expires=0, usd_per_hour=0.1, billing_step_secs=1, billing_min_secs=0,
            boot_secs=5, pinned=0, token="", record={}, updated_at=now))
    r = get(ctl, "?host=dev-1")
    assert r.status_code == 200 and r.json() == {"vms": []}, r.text


def test_the_document_lists_the_404(ctl):
    doc = create_app(ctl).openapi()
    assert "not_found" in doc["paths"]["/v1/vms"]["get"]["responses"]["404"]["description"]
