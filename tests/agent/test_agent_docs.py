"""The agent's API description is behind its token on TCP, as every other
route is; over the owner-only socket it needs none."""

from __future__ import annotations

import httpx
import pytest

from support import start_agent

TOKEN = "agent-docs-token"


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    p = start_agent(tmp_path_factory.mktemp("agent-docs"), token=TOKEN, backend="fake")
    yield p
    p.stop()


@pytest.mark.parametrize("given", ["no token", "a wrong token", "a token in the wrong scheme"])
@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_api_description_needs_the_token_on_tcp(agent, given, path):
    headers = {"no token": {}, "a wrong token": {"Authorization": "Bearer nope"},
               "a token in the wrong scheme": {"Authorization": f"Basic {TOKEN}"}}[given]
    r = httpx.get(agent.url + path, headers=headers, timeout=10)
    assert r.status_code in (401, 404), (path, r.status_code)
    if r.status_code == 401:
        assert r.json()["error"]["code"] == "unauthorized"
    assert "/v1/host" not in r.text


def test_with_the_token_the_api_description_is_served(agent):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(agent.url + "/openapi.json", headers=auth, timeout=10).json()
    assert doc["openapi"].startswith("3.") and "/v1/host" in doc["paths"]
    assert "/openapi.json" not in doc["paths"] and "/docs" not in doc["paths"]
    page = httpx.get(agent.url + "/docs", headers=auth, timeout=10)
    assert page.status_code == 200 and "/openapi.json" in page.text


def test_over_the_owner_only_socket_no_token_is_needed(agent):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://agent") as c:
        assert "/v1/host" in c.get("/openapi.json", timeout=10).json()["paths"]


def test_without_the_token_a_malformed_body_is_401_not_400(agent):
    # the token is checked before anything reads the request
    r = httpx.post(agent.url + "/v1/host/vms", content=b"{bad", headers={"content-type": "application/json"},
                   timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
    r = httpx.post(agent.url + "/v1/host/vms", content=b"{bad", timeout=10,
                   headers={"content-type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument")  # with it: the body's fault


@pytest.mark.parametrize("given", ["no token", "a wrong token"])
def test_every_route_of_the_agent_needs_the_token_on_tcp(agent, given):
    import re
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(agent.url + "/openapi.json", headers=auth, timeout=10).json()
    routes = [(m.upper(), re.sub(r"\{[^}]+\}", "x", p)) for p, ops in doc["paths"].items() for m in ops]
    assert ("POST", "/v1/host/vms") in routes and ("GET", "/v1/host") in routes
    headers = {} if given == "no token" else {"Authorization": "Bearer nope"}
    for method, path in routes:
        r = httpx.request(method, agent.url + path, headers=headers, json={}, timeout=10)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized"), (method, path)


def test_the_document_says_what_the_agent_answers(agent):
    """Review 30: the agent's document was FastAPI's default — 422 with a ``detail`` list on
    every route (the agent answers 400 with the error envelope), no 401, 404 or 409, no
    bearer scheme, request bodies open to unknown fields (refused)."""
    import json
    auth = {"Authorization": f"Bearer {TOKEN}"}
    doc = httpx.get(agent.url + "/openapi.json", headers=auth, timeout=10).json()
    text = json.dumps(doc)
    assert '"422"' not in text and "HTTPValidationError" not in text
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    create = doc["paths"]["/v1/host/vms"]["post"]
    for status in ("400", "401", "409"):
        assert create["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}, status
    assert "404" in doc["paths"]["/v1/host/vms/{name}"]["get"]["responses"]
    assert create["security"] == [{"bearerAuth": []}]
    body = create["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert doc["components"]["schemas"][body]["additionalProperties"] is False
    # and the agent answers so: an unknown field is a 400 in the documented envelope
    r = httpx.post(agent.url + "/v1/host/vms", json={"name": "x", "zz": 1}, headers=auth, timeout=10)
    assert r.status_code == 400 and set(r.json()) == {"error"} and r.json()["error"]["code"] == "invalid_argument"
    r = httpx.get(agent.url + "/v1/host/nope", headers=auth, timeout=10)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "no_route")
