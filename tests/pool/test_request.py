"""Request defaults, snapshot parsing, and the POST /v1/pool/plan route."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fuse.controller.pool.request import kind_of_image, learned_shape, model_from_request
from fuse.errors import InvalidArgument
from fuse.models.pool import ElasticPlan, ElasticPlanRequest


def test_defaults_are_documented_values():
    g = model_from_request(ElasticPlanRequest()).groups[0]
    assert (g.name, g.count, g.image, g.kind, g.cpus, g.mem_mib, g.duration_secs) == \
        ("request-0", 1, "linux", "microvm", 1, 1024, 3600)


@pytest.mark.parametrize("image, kind", [("linux", "microvm"), ("windows-11", "vm"),
                                         ("docker.io/library/python:3.11", "container")],
                         ids=["linux is a microvm", "windows is a vm", "an OCI reference is a container"])
def test_kind_comes_from_the_image(image, kind):
    assert kind_of_image(image) == kind


def test_duration_by_caller_and_shape_learned_from_history():
    history = [{"image": "linux", "cpus": 4, "memory_mb": 8192}] * 2 + [{"image": "linux", "cpus": 1, "memory_mb": 512}]
    assert learned_shape("linux", history) == (4, 8192)
    g = model_from_request(ElasticPlanRequest(caller="batch"), history=history).groups[0]
    assert (g.cpus, g.mem_mib, g.duration_secs) == (4, 8192, 14400)


def test_pins_become_constraints_and_snapshot_becomes_hosts():
    snap = [{"name": "dev", "cpus": 8, "mem_mib": 16384, "free_vcpus": 4, "free_mem_mib": 4096,
             "arch": "amd64", "kvm": True, "own": True, "state": "online"},
            {"name": "gone", "cpus": 8, "mem_mib": 16384, "free_vcpus": 8, "free_mem_mib": 16384,
             "arch": "amd64", "kvm": True, "own": True, "state": "cordoned"}]
    m = model_from_request(ElasticPlanRequest(count=3, no_scale=True, max_usd_per_hour=2), snap)
    assert [h.name for h in m.hosts] == ["dev"] and m.hosts[0].vcpus == 4
    assert m.constraints.max_new_hosts == 0 and m.constraints.max_usd_per_hour == 2
    assert m.groups[0].no_scale


def test_bad_input_is_invalid_argument():
    with pytest.raises(InvalidArgument):
        model_from_request(ElasticPlanRequest(kind="unikernel"))
    with pytest.raises(InvalidArgument):
        model_from_request(ElasticPlanRequest(instance_type="nope.large"))


def _app(state: Path, snapshot=None) -> TestClient:
    from fuse.controller.app import create_app
    from fuse.controller.service import Controller
    app = create_app(Controller(state))  # (the test's own dir: a temp dir of its own was left behind)
    app.state.pool_snapshot = lambda: snapshot or []
    return TestClient(app)  # not entered: no lifespan, so no pollers start


def test_route_plans_against_the_snapshot_and_accepts_camel_case(tmp_path):
    snap = [{"name": "dev", "cpus": 8, "mem_mib": 16384, "free_vcpus": 8, "free_mem_mib": 16384,
             "arch": "arm64", "kvm": True, "own": True, "state": "online"}]
    r = _app(tmp_path, snap).post("/v1/pool/plan", json={"count": 12, "cpus": 2, "memoryMb": 4096})
    assert r.status_code == 200
    p = ElasticPlan.model_validate(r.json())
    assert p.assignments[0].host == "dev" and p.assignments[0].count == 4
    assert len(p.new_hosts) == 1 and p.new_hosts[0].type_name == "c6g.metal"
    assert p.solver == "exact" and "model" in p.json


def test_route_maps_bad_input_to_400(tmp_path):
    r = _app(tmp_path).post("/v1/pool/plan", json={"kind": "unikernel"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"


def test_a_host_the_controller_calls_unavailable_is_not_planned_on():
    snap = [{"name": "down", "cpus": 8, "mem_mib": 16384, "free_vcpus": 8, "free_mem_mib": 16384,
             "arch": "amd64", "kvm": True, "own": True, "state": "unavailable"}]
    assert model_from_request(ElasticPlanRequest(), snap).hosts == []


@pytest.mark.parametrize("pool_cap, asked, want", [(0.0, 2.0, 0.0), (None, 2.0, 2.0), (1.0, 2.0, 1.0), (3.0, 0.0, 0.0)],
                         ids=["a pool cap of 0 is a cap, not none", "no pool cap: the request's",
                              "the lower of the two", "a request cap of 0 holds"])
def test_max_usd_per_hour_takes_the_lower_cap(pool_cap, asked, want):
    from fuse.controller.pool.model import Constraints

    m = model_from_request(ElasticPlanRequest(max_usd_per_hour=asked), constraints=Constraints(max_usd_per_hour=pool_cap))
    assert m.constraints.max_usd_per_hour == want
