"""The OpenAPI 3 document: committed at docs/openapi.json, equal to what the controller serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "openapi.json"
STALE = "docs/openapi.json is stale: run `python scripts/export_openapi.py` and commit the result"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    app = create_app(Controller(tmp_path_factory.mktemp("ctl"), token="t0ken"))
    client = TestClient(app)  # not entered: no lifespan, so no pollers start
    r = client.get("/openapi.json", headers={"Authorization": "Bearer t0ken"})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_committed_document_is_what_the_controller_serves(served):
    assert COMMITTED.exists(), STALE
    assert json.loads(COMMITTED.read_text()) == served, STALE


def test_it_is_openapi_3(served):
    assert served["openapi"].startswith("3."), served["openapi"]
    assert served["info"]["title"] == "fuse controller"


@pytest.mark.parametrize("path,method", [
    ("/v1/hosts", "post"), ("/v1/hosts", "get"), ("/v1/hosts/{host_id}", "get"), ("/v1/hosts/{host_id}", "delete"),
    ("/v1/vms", "post"), ("/v1/vms", "get"), ("/v1/vms/{name}", "get"), ("/v1/vms/{name}", "delete"),
    ("/v1/events", "get"), ("/v1/usage", "get"), ("/v1/controller", "get"),
], ids=lambda v: v)
def test_the_controller_paths_are_documented(served, path, method):
    assert method in served["paths"].get(path, {}), f"{method.upper()} {path} missing; {STALE}"


@pytest.mark.parametrize("path", ["/v1/moves", "/v1/moves/{move_id}", "/v1/pool/plan"])
def test_moves_and_the_pool_are_documented(served, path):
    assert path in served["paths"], f"{path} missing; {STALE}"


def test_operation_ids_are_unique_verb_noun_names(served):
    ids = [op["operationId"] for ops in served["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert all(i[0].islower() and "_" not in i for i in ids), ids
    assert {"createVm", "listVms", "registerHost", "listEvents", "getUsage"} <= set(ids)

