"""The token in the OpenAPI document: the controller's TCP listener wants
`Authorization: Bearer <token>` on every route but the health check, and the
document says so — an HTTP bearer scheme, required by every other operation,
each with its 401 in the error envelope. What it documents is what the
listener enforces (a TestClient request is a TCP one: it is not on the
owner-only socket)."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller

TOKEN = "t0ken"
OPEN_PATHS = ("/v1/healthz",)  # issue 7: the one route the TCP listener serves without the token


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    ctl = Controller(tmp_path_factory.mktemp("ctl"), token=TOKEN)
    yield create_app(ctl)
    ctl.store.close()


@pytest.fixture(scope="module")
def served(app) -> dict:
    r = TestClient(app).get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return r.json()


def operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def test_the_document_declares_an_http_bearer_scheme(served):
    schemes = served["components"]["securitySchemes"]
    assert [s for s in schemes.values() if (s["type"], s["scheme"]) == ("http", "bearer")], schemes


def test_every_operation_but_the_health_check_requires_the_token_and_documents_its_401(served):
    (scheme,) = served["components"]["securitySchemes"]
    secured = [(p, m, op) for p, m, op in operations(served) if p not in OPEN_PATHS]
    assert len(secured) > 20
    for path, method, op in secured:
        assert op.get("security") == [{scheme: []}], f"{method.upper()} {path}"
        r401 = op["responses"].get("401")
        assert r401 and "unauthorized" in r401["description"], f"{method.upper()} {path}"
        assert r401["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert "error" in served["components"]["schemas"]["ErrorBody"]["properties"]


def test_the_health_check_needs_no_token_in_the_document(served):
    op = served["paths"]["/v1/healthz"]["get"]
    assert "security" not in op and "401" not in op["responses"]
    assert "security" not in served  # no document-wide requirement the health check would inherit


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}"],
                         ids=["no token", "another token", "the token under another scheme"])
def test_what_the_document_secures_the_listener_refuses_with_401_unauthorized(app, served, auth):
    client = TestClient(app, raise_server_exceptions=False)
    headers = {"Authorization": auth} if auth else {}
    for path, method, _ in operations(served):
        url = re.sub(r"\{[^}]+\}", "x", path)
        r = client.request(method.upper(), url, headers=headers)
        if path in OPEN_PATHS:
            assert r.status_code == 200, f"{method.upper()} {path}: {r.text}"
        else:
            assert r.status_code == 401, f"{method.upper()} {path}: {r.status_code}"
            assert r.json()["error"]["code"] == "unauthorized"
