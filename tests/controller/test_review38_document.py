"""Review 38: the controller's OpenAPI document as a contract, checked against a real controller
(a fake-backend agent registered as h1), and what that review found the controller doing that
its document did not say, or that it should not do:

- a cordon, uncordon or drain of a host already so emitted its event again (an event follower
  saw state changes that did not happen); now only a change does, the call answering as before;
- ``HEAD`` was 405 everywhere, a load balancer's health check on ``/v1/healthz`` included: it is
  served wherever GET is (same status and headers, no body);
- limits the services enforce (events' since/wait_s/limit, a console's offset, ``host=``, a
  create's entry, a move's and a registration's names) were not in the schema; they are, and the
  answers past them are word for word what they were;
- ``Host.state`` was a plain string; the 200s of the console, the controller's settings and the
  health check had no shape;
- 413 (every route), 405 and ``404 no_route`` (said once), 502 ``unauthorized`` on the VM routes
  and the host codes that pass through as 500 were not named; nor that integer fields of a body
  take JSON integers only."""

from __future__ import annotations

import socket
import time

import httpx
import jsonschema
import pytest

from support import reap, start_agent, start_controller

TOKEN = "ctl-token"
HOST_STATE_EVENTS = ("host_cordoned", "host_uncordoned", "host_draining")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A controller on its socket and on TCP (token ``TOKEN``), with h1 (a fake agent) registered
    and one VM, v1, running there."""
    tmp = tmp_path_factory.mktemp("r38-doc")
    agent = start_agent(tmp, backend="fake", name="a1")
    ctl = start_controller(tmp, listen=True, token=TOKEN)
    c = httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://c", timeout=60)
    try:
        r = c.post("/v1/hosts", json={"id": "h1", "url": agent.url, "token": agent.token, "backend": "qemu",
                                      "capacity": {"vm_count": 4, "cpus": 4, "ram_mb": 4096}})
        assert r.status_code == 201, r.text
        r = c.post("/v1/vms", json={"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true",
                                    "host": "h1"})
        assert r.status_code == 201, r.text
        yield type("Fleet", (), {"c": c, "ctl": ctl, "agent": agent, "port": ctl.extra["port"],
                                 "doc": c.get("/openapi.json").json()})
    finally:
        c.close()
        ctl.stop()
        agent.stop()
        reap(tmp)


def _state_events(c: httpx.Client, since: int) -> list[str]:
    page = c.get("/v1/events", params={"since": since, "limit": 500}).json()
    return [e["type"] for e in page["events"] if e["type"] in HOST_STATE_EVENTS and e["host"] == "h1"]


# ---- 7: a host's state events say changes only ------------------------------------

def test_a_cordon_uncordon_or_drain_of_a_host_already_so_emits_no_event_and_answers_as_before(fleet):
    c = fleet.c
    since = c.get("/v1/events", params={"since": 10**9}).json()["next_cursor"]  # (the newest event's id)
    answers = []
    for action in ("cordon", "cordon", "cordon", "uncordon", "uncordon", "drain", "drain", "cordon", "uncordon"):
        r = c.post("/v1/hosts/h1", params={"action": action})
        answers.append(r.status_code)
        if action == "drain":  # (v1 has nowhere to go: stuck, as before, both times)
            assert [s["vm"] for s in r.json()["stuck"]] == ["v1"], r.text
    assert answers == [204, 204, 204, 204, 204, 200, 200, 204, 204]
    assert _state_events(c, since) == ["host_cordoned", "host_uncordoned", "host_draining", "host_cordoned",
                                       "host_uncordoned"]  # (was: every call's, nine)
    assert c.get("/v1/hosts/h1").json()["state"] == "active"
    assert c.post("/v1/hosts/nosuch", params={"action": "cordon"}).json()["error"]["code"] == "not_found"


# ---- 5: HEAD wherever GET is ---------------------------------------------------------

def _raw(port: int, request: bytes) -> bytes:
    """The whole answer to ``request`` (sent with Connection: close) on a TCP connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_head_on_the_health_check_is_its_get_without_the_body(fleet):
    got = httpx.get(f"http://127.0.0.1:{fleet.port}/v1/healthz", timeout=30)
    answer = _raw(fleet.port, b"HEAD /v1/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer  # (was: 405, allow: GET)
    assert body == b""
    assert f"content-length: {len(got.content)}".encode() in head.lower()


def test_an_agent_serves_head_wherever_it_serves_get(fleet):
    """The agent's `HEAD /v1/host` was 405 too (rB): the same rule as the controller's."""
    auth = {"Authorization": f"Bearer {fleet.agent.token}"}
    with httpx.Client(base_url=fleet.agent.url, timeout=30) as a:
        got = a.get("/v1/host", headers=auth)
        r = a.head("/v1/host", headers=auth)
        assert r.status_code == 200 and r.content == b"", (r.status_code, r.headers)
        assert got.status_code == 200 and got.content
        assert a.head("/v1/host").status_code == 401


def test_head_is_served_on_every_get_route_and_named_in_a_405s_allow(fleet):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{fleet.port}", timeout=30) as tcp:
        assert tcp.head("/v1/vms", headers=auth).status_code == 200
        assert tcp.head("/v1/vms/v1/console", headers=auth).status_code == 200
        assert tcp.head("/v1/vms/nosuch", headers=auth).status_code == 404  # (as its GET)
        assert tcp.head("/v1/vms").status_code == 401  # (the token as for GET)
        r = tcp.head("/v1/pool/reconcile", headers=auth)  # (POST only)
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
        r = tcp.patch("/v1/vms", headers=auth)
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST", r.headers
        assert r.json()["error"]["code"] == "method_not_allowed"


# ---- 2: the limits the services enforce, in the schema; their answers unchanged ----------

def _param(doc: dict, path: str, method: str, name: str) -> dict:
    return next(p for p in doc["paths"][path][method]["parameters"] if p["name"] == name)


def _text(schema: dict) -> dict:
    return next((s for s in schema.get("anyOf", []) if s.get("type") == "string"), schema)


def test_the_query_limits_are_in_the_schema(fleet):
    doc = fleet.doc
    events = {n: _param(doc, "/v1/events", "get", n) for n in ("since", "wait_s", "limit")}
    assert events["since"]["schema"]["minimum"] == 0
    assert events["wait_s"]["schema"]["minimum"] == 0 and "60" in events["wait_s"]["description"]
    assert (events["limit"]["schema"]["minimum"], events["limit"]["schema"]["maximum"]) == (1, 500)
    assert _param(doc, "/v1/vms/{name}/console", "get", "offset")["schema"]["minimum"] == 0
    takes_host = [(path, m) for path, ops in doc["paths"].items() if path.startswith("/v1/vms")
                  for m, op in ops.items() if any(p["name"] == "host" for p in op.get("parameters", []))]
    assert len(takes_host) == 6, takes_host  # list, get, delete, sleep, wake, console
    for path, m in takes_host:
        assert _param(doc, path, m, "host")["schema"]["minLength"] == 1, (m, path)


def test_the_body_limits_are_in_the_schema(fleet):
    schemas = fleet.doc["components"]["schemas"]
    create = schemas["ControllerCreateVm"]
    entry = create["properties"]["entry"]
    assert entry["type"] == "string" and entry["minLength"] == 1 and entry["maxLength"] == 1300
    assert "1300 bytes" in entry["description"] and "characters" in entry["description"]
    assert "entry" in create["required"] and create["properties"]["standby"]["enum"] == [False]
    for name in ("vm", "flashvm", "to", "host"):
        assert _text(schemas["MoveRequest"]["properties"][name])["minLength"] == 1, name
    for model, names in (("RegisterHostRequest", ("id", "url")), ("AddHostRequest", ("name", "addr"))):
        for name in names:
            assert schemas[model]["properties"][name]["minLength"] == 1, (model, name)


@pytest.mark.parametrize("method,path,kw,status,words", [
    ("GET", "/v1/events", {"params": {"limit": 0}}, 400, "limit must be between 1 and 500"),
    ("GET", "/v1/events", {"params": {"limit": 501}}, 400, "limit must be between 1 and 500"),
    ("GET", "/v1/events", {"params": {"since": -1}}, 400, "since must be >= 0"),
    ("GET", "/v1/events", {"params": {"wait_s": -1}}, 400, "wait_s must be a number of seconds >= 0"),
    ("GET", "/v1/vms", {"params": {"host": ""}}, 400, "host must name a host (leave it out for every host's VMs)"),
    ("GET", "/v1/vms/v1", {"params": {"host": ""}}, 400, "host must name a host (leave it out and the vm"),
    ("GET", "/v1/vms/v1/console", {"params": {"offset": -1}}, 400, "offset must be >= 0"),
    ("GET", "/v1/vms/nosuch/console", {"params": {"offset": -1}}, 404, "vm nosuch not found"),
    ("POST", "/v1/vms", {"json": {"shape": {"vcpus": 1, "mem_mib": 128}, "host": "h1"}}, 400,
     "entry is required (unless standby)"),
    ("POST", "/v1/vms", {"json": {"shape": {"vcpus": 1, "mem_mib": 128}, "host": "h1", "entry": "é" * 651}}, 400,
     "1300"),
    ("POST", "/v1/moves", {"json": {"vm": "v1", "host": ""}}, 400, "host: must name the host the VM is on"),
    ("POST", "/v1/hosts", {"json": {"name": "", "addr": "127.0.0.1:1"}}, 400, "name: must not be empty"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_an_answer_past_a_limit_is_the_one_it_was(fleet, method, path, kw, status, words):
    """The document states them; the services still check them, in their own words (a schema
    constraint FastAPI checked first would have answered in pydantic's)."""
    r = fleet.c.request(method, path, **kw)
    assert r.status_code == status and r.json()["error"]["code"] in ("invalid_argument", "not_found"), r.text
    assert words in r.json()["error"]["message"], r.text


# ---- 6: shapes of what is answered -----------------------------------------------------

def _check(doc: dict, schema: dict, answer) -> None:
    jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(answer)


def _ok_schema(doc: dict, path: str, method: str) -> dict:
    return doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("method,path,ask", [
    ("get", "/v1/healthz", "/v1/healthz"),
    ("get", "/v1/controller", "/v1/controller"),
    ("get", "/v1/vms/{name}/console", "/v1/vms/v1/console"),
], ids=["health", "controller", "console"])
def test_a_200_has_a_shape_and_the_answer_is_of_it(fleet, method, path, ask):
    schema = _ok_schema(fleet.doc, path, method)
    ref = schema["$ref"].rsplit("/", 1)[1]  # (was: an open object, no properties)
    shape = fleet.doc["components"]["schemas"][ref]
    answer = fleet.c.get(ask).json()
    assert set(shape["required"]) == set(answer), (shape, answer)
    _check(fleet.doc, schema, answer)


def test_put_controller_answers_the_shape_get_does(fleet):
    doc = fleet.doc
    assert _ok_schema(doc, "/v1/controller", "put") == _ok_schema(doc, "/v1/controller", "get")
    r = fleet.c.put("/v1/controller", json={"placement": "best_fit"})
    assert r.status_code == 200, r.text
    _check(doc, _ok_schema(doc, "/v1/controller", "put"), r.json())


def test_a_hosts_state_is_an_enum_and_its_answers_are_of_it(fleet):
    state = fleet.doc["components"]["schemas"]["Host"]["properties"]["state"]
    assert state["enum"] == ["active", "cordoned", "draining"]
    for action, want in (("cordon", "cordoned"), ("uncordon", "active")):
        assert fleet.c.post("/v1/hosts/h1", params={"action": action}).status_code == 204
        host = fleet.c.get("/v1/hosts/h1").json()
        assert host["state"] == want
        _check(fleet.doc, {"$ref": "#/components/schemas/Host"}, host)


# ---- 4 and 3: statuses and rules said --------------------------------------------------

def test_every_operation_lists_the_413_it_answers(fleet):
    ops = [(m, p, op) for p, ops in fleet.doc["paths"].items() for m, op in ops.items()]
    missing = [f"{m.upper()} {p}" for m, p, op in ops if "413" not in op["responses"]]
    assert not missing, missing  # (was: only the routes taking a body)
    r = fleet.c.post("/v1/vms/v1/sleep", content=b"x" * (17 * 2**20), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text


def test_the_api_description_says_405_no_route_head_and_json_integers(fleet):
    text = fleet.doc["info"]["description"]
    for words in ("405 method_not_allowed", "Allow", "404 no_route", "HEAD", "413", "`1.0`", "JSON integers only"):
        assert words in text, words
    r = fleet.c.post("/v1/vms", json={"shape": {"vcpus": 1.0, "mem_mib": 128}, "entry": "true", "host": "h1"})
    assert r.status_code == 400 and "shape.vcpus" in r.json()["error"]["message"], r.text  # (as said)
    assert fleet.c.get("/v1/nosuch").json()["error"]["code"] == "no_route"


@pytest.mark.parametrize("method,path", [("get", "/v1/vms/{name}"), ("delete", "/v1/vms/{name}"),
                                         ("post", "/v1/vms/{name}/sleep"), ("post", "/v1/vms/{name}/wake"),
                                         ("get", "/v1/vms/{name}/console")])
def test_the_vm_routes_502_names_unauthorized(fleet, method, path):
    text = fleet.doc["paths"][path][method]["responses"]["502"]["description"]
    assert "host_unreachable" in text and "unauthorized" in text, text


@pytest.mark.parametrize("method,path,codes", [
    ("post", "/v1/vms", ["boot_failed", "io_error"]),
    ("post", "/v1/vms/{name}/sleep", ["sleep_failed", "bundle_missing"]),
    ("post", "/v1/vms/{name}/wake", ["wake_failed", "bundle_missing"]),
])
def test_the_host_codes_that_pass_through_are_named_on_their_routes(fleet, method, path, codes):
    text = fleet.doc["paths"][path][method]["responses"]["500"]["description"]
    assert all(code in text for code in codes), text


def test_a_vm_route_answers_502_unauthorized_as_its_document_says(tmp_path):
    """What the 502's description now names, answered: the agent restarted with another token."""
    agent = start_agent(tmp_path, backend="fake", name="a2")
    ctl = start_controller(tmp_path)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://c",
                          timeout=60) as c:
            r = c.post("/v1/hosts", json={"id": "h2", "url": agent.url, "token": agent.token, "backend": "qemu",
                                          "capacity": {"vm_count": 2}})
            assert r.status_code == 201, r.text
            assert c.post("/v1/vms", json={"name": "v2", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true",
                                           "host": "h2"}).status_code == 201
            port = int(agent.url.rsplit(":", 1)[1])
            agent.stop()
            agent = start_agent(tmp_path, backend="fake", name="a2", port=port, token="another-token")
            deadline = time.monotonic() + 30
            r = c.get("/v1/vms/v2")
            while r.status_code != 502 and time.monotonic() < deadline:
                time.sleep(0.2)
                r = c.get("/v1/vms/v2")
            assert r.status_code == 502 and r.json()["error"]["code"] == "unauthorized", r.text
            doc = c.get("/openapi.json").json()
            assert "unauthorized" in doc["paths"]["/v1/vms/{name}"]["get"]["responses"]["502"]["description"]
    finally:
        ctl.stop()
        agent.stop()
        reap(tmp_path)


def test_a_host_in_a_state_this_release_does_not_know_still_parses():
    """The document names the three states, but the SDK reads the record of a newer
    controller whose host is in a fourth: a Literal there made every hosts.list fail."""
    import fuse

    assert fuse.Host.model_validate({"id": "a", "state": "retiring"}).state == "retiring"
    schema = fuse.Host.model_json_schema()["properties"]["state"]
    assert schema["enum"] == ["active", "cordoned", "draining"]
