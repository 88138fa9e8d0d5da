"""The controller's create reuses the host's shape (``VmShape``): a shape no
guest can boot in and a shape number that is not a JSON integer are 400
`invalid_argument` there too, before any host is asked. Through the real app
with no hosts (a create that gets through answers 409 fleet_full)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    ctl = Controller(tmp_path_factory.mktemp("ctl"))
    yield TestClient(create_app(ctl), raise_server_exceptions=False)
    ctl.store.close()


@pytest.mark.parametrize("shape, said", [
    ({"vcpus": True, "mem_mib": 128}, "shape.vcpus: Input should be a valid integer"),
    ({"vcpus": "2", "mem_mib": 128}, "shape.vcpus: Input should be a valid integer"),
    ({"vcpus": 1, "mem_mib": "128"}, "shape.mem_mib: Input should be a valid integer"),
    ({"vcpus": 1, "mem_mib": 128.0}, "shape.mem_mib: Input should be a valid integer"),
    ({"vcpus": 1, "mem_mib": 64}, "shape.mem_mib: Input should be greater than or equal to 128"),
    ({"vcpus": 64, "mem_mib": 128}, "shape: mem_mib 128 is below the floor of 224 MiB for vcpus 64"),
], ids=["true is not a vCPU count", "a string is not a vCPU count", "a string is not a memory size",
        "128.0 is not an integer", "64 MiB is below the floor", "64 vCPUs need more than 128 MiB"])
def test_a_bad_shape_is_refused_by_the_controller_naming_it(client, shape, said):
    r = client.post("/v1/vms", json={"shape": shape, "entry": "true"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument" and err["message"].startswith(said), err


def test_a_shape_at_the_floor_goes_on_to_placement(client):
    r = client.post("/v1/vms", json={"shape": {"vcpus": 32, "mem_mib": 160}, "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "fleet_full"), r.text


@pytest.mark.parametrize("bundle", ["", "../linux", "Linux"], ids=["empty", "a path", "upper case"])
def test_a_bundle_that_is_not_a_bundle_name_is_refused(client, bundle):
    r = client.post("/v1/vms", json={"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true", "bundle": bundle})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("bundle: "), r.text
