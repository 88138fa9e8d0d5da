"""Request bodies on the controller's API: a JSON object sent as
`Content-Type: application/json`, naming only fields the API knows; anything
else is one 400 `invalid_argument` whose message names the problem the way
the caller spelt it. Through the real app (no lifespan: no host is
contacted; a create with no hosts answers 409 fleet_full, which shows the
body got through)."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller
from fuse.controller.validation import unknown_fields
from fuse.controller.vms import ControllerCreateVm
from fuse.models.hosts import HostCapacity, RegisterHostRequest
from fuse.models.pool import PrewarmOptions
from support import refused

VM = {"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "echo hi"}
JSON_HINT = "send the body as JSON with Content-Type: application/json"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    ctl = Controller(tmp_path_factory.mktemp("ctl"))
    yield TestClient(create_app(ctl), raise_server_exceptions=False)
    ctl.store.close()


# ---- the content type ------------------------------------------------------------

@pytest.mark.parametrize("content_type,said", [
    ("application/x-www-form-urlencoded", "it came as application/x-www-form-urlencoded"),  # curl -d
    ("text/plain", "it came as text/plain"),
    (None, "it came with no Content-Type"),
], ids=["curl -d's form encoding", "text/plain", "no content type"])
@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/vms", VM),
    ("POST", "/v1/hosts", {"name": "h", "addr": "local"}),
    ("POST", "/v1/moves", {"vm": "a"}),
    ("PUT", "/v1/controller", {"placement": "best_fit"}),
], ids=["createVm", "registerHost", "createMove", "putController"])
def test_a_json_body_not_sent_as_json_is_refused_saying_to_send_it_as_json(client, method, path, body,
                                                                           content_type, said):
    headers = {"content-type": content_type} if content_type else {}
    msg = refused(client.request(method, path, content=json.dumps(body).encode(), headers=headers))
    assert JSON_HINT in msg and said in msg, msg
    assert "dictionary" not in msg


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/vnd.fuse+json"],
                         ids=["application/json", "with a charset", "a +json type"])
def test_json_content_types_are_read(client, content_type):
    r = client.post("/v1/vms", content=json.dumps(VM).encode(), headers={"content-type": content_type})
    assert r.status_code == 409 and r.json()["error"]["code"] == "fleet_full", r.text


# ---- messages name what is wrong, as the caller spelt it --------------------------

@pytest.mark.parametrize("path,body,expected", [
    ("/v1/hosts", {"name": 5, "addr": "local"}, "name: Input should be a valid string"),
    ("/v1/hosts", {"name": "h", "addr": 7}, "addr: Input should be a valid string"),
    ("/v1/hosts", {"id": 5, "url": "local"}, "id: Input should be a valid string"),
    ("/v1/hosts", {"name": "h"}, "missing field addr"),
    ("/v1/hosts", {"id": "h"}, "missing field url"),
    ("/v1/hosts", {}, "missing fields id (or name), url (or addr)"),
    ("/v1/hosts", {"name": "h", "addr": "local", "capacity": {"vm_count": "many"}},
     "capacity.vm_count: Input should be a valid integer"),
    ("/v1/vms", {}, "missing field shape"),
    ("/v1/vms", {"shape": {"vcpus": 1}, "entry": "x"}, "missing field shape.mem_mib"),
    ("/v1/vms", {"shape": {"vcpus": 0, "mem_mib": 128}, "entry": "x"},
     "shape.vcpus: Input should be greater than or equal to 1"),
    ("/v1/vms", {"shape": {"vcpus": 1, "mem_mib": 128}}, "entry is required (unless standby)"),
], ids=["short form: name, never the alias id", "short form: addr, never the alias url", "long form: id",
        "short form: the missing addr", "long form: the missing url", "neither form: both spellings",
        "a nested field by its path", "createVm: the missing field", "a missing nested field",
        "a value out of range", "a rule of the whole body, without pydantic's prefix"])
def test_a_bad_field_is_named_as_the_caller_spelt_it(client, path, body, expected):
    msg = refused(client.post(path, json=body))
    assert msg == expected or msg.startswith(expected), msg


@pytest.mark.parametrize("path", ["/v1/hosts", "/v1/vms", "/v1/moves"])
def test_an_empty_body_says_it_is_empty(client, path):
    for headers in ({}, {"content-type": "application/json"}):
        msg = refused(client.post(path, content=b"", headers=headers))
        assert msg.startswith("the body is empty") and "application/json" in msg, msg


@pytest.mark.parametrize("body,kind", [([VM], "an array"), ("vm", "a string"), (5, "a number"), (None, "null")],
                         ids=["array", "string", "number", "null"])
def test_a_body_that_is_not_an_object_says_what_it_is(client, body, kind):
    for path in ("/v1/vms", "/v1/hosts"):
        assert refused(client.post(path, content=json.dumps(body).encode(),
                                   headers={"content-type": "application/json"})) == \
            f"the body must be a JSON object, not {kind}"


def test_malformed_json_names_where_it_breaks(client):
    msg = refused(client.post("/v1/vms", content=b'{\n  "shape": }', headers={"content-type": "application/json"}))
    assert msg == "the body is not valid JSON: Expecting value at line 2 column 12", msg


def test_a_query_parameter_is_named_as_one(client):
    msg = refused(client.get("/v1/events?since=soon"))
    assert msg.startswith("query parameter since: Input should be a valid integer"), msg


@pytest.mark.parametrize("path, message", [
    ("/v1/vms?hosts=a", "unknown query parameter hosts (did you mean host?)"),
    ("/v1/events?since=0&wait=1", "unknown query parameter wait (did you mean wait_s?)"),
    ("/v1/hosts?verbose=1", "unknown query parameter verbose"),
])
def test_a_query_parameter_no_route_takes_is_refused_not_ignored(client, path, message):
    # (review 17) ``?hosts=a`` answered every host's VMs as if filtered
    assert refused(client.get(path)) == message


def test_a_route_takes_its_own_query_parameters(client):
    assert client.get("/v1/events?since=0&wait_s=0&limit=5").status_code == 200
    assert client.get("/v1/vms?host=a").json()["error"]["code"] == "not_found"  # (no host a: the route ran)
    assert client.get("/v1/hosts?limit=5").status_code == 200


def test_several_problems_are_named_together(client):
    msg = refused(client.post("/v1/vms", json={"name": 5, "shape": {"vcpus": "two"}}))
    assert "name: Input should be a valid string" in msg and "shape.vcpus: " in msg
    assert "missing field shape.mem_mib" in msg


# ---- unknown fields --------------------------------------------------------------

@pytest.mark.parametrize("method,path,body,expected", [
    ("POST", "/v1/vms", VM | {"bogus": 1}, "unknown field bogus"),
    ("POST", "/v1/vms", VM | {"hosts": "h1"}, "unknown field hosts (did you mean host?)"),
    ("POST", "/v1/vms", {"shape": {"vcpus": 1, "mem_mib": 128, "cpus": 2}, "entry": "x"},
     "unknown field shape.cpus (did you mean vcpus?)"),
    ("POST", "/v1/hosts", {"name": "h", "addr": "local", "regoin": "eu"},
     "unknown field regoin (did you mean region?)"),
    ("POST", "/v1/hosts", {"id": "h", "url": "local", "capacity": {"vm_count": 4, "ram_gb": 8}},
     "unknown field capacity.ram_gb (did you mean ram_mb?)"),
    ("POST", "/v1/hosts", {"id": "h", "url": "local", "name": "h"},
     "name: is id in seed 004's form: give id or name, not both"),
    ("POST", "/v1/moves", {"vm": "a", "too": "h2"}, "unknown field too (did you mean to?)"),
    ("PUT", "/v1/controller", {"placement": "best_fit", "plaecment": "x"},
     "unknown field plaecment (did you mean placement?)"),
], ids=["createVm: an unknown field", "createVm: a misspelt optional pin", "createVm: inside shape",
        "registerHost: a misspelt optional field", "registerHost: inside capacity",
        "registerHost: both spellings of the id", "createMove: a misspelt target", "putController"])
def test_an_unknown_field_is_refused_by_name(client, method, path, body, expected):
    msg = refused(client.request(method, path, json=body))
    assert msg == expected, msg


def test_an_unknown_field_comes_with_the_bodys_other_problems(client):
    msg = refused(client.post("/v1/vms", json={"shapes": {"vcpus": 1, "mem_mib": 128}, "entry": "x"}))
    assert msg == "unknown field shapes (did you mean shape?); missing field shape", msg


def test_a_body_with_only_known_fields_is_placed(client):
    r = client.post("/v1/vms", json=VM | {"name": "a", "bundle": "linux", "standby": False, "host": None,
                                          "on": "auto"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "fleet_full", r.text


# ---- what the SDK and the CLI send is all known ------------------------------------

def test_the_sdks_register_body_is_all_known_fields():
    body = RegisterHostRequest(id="h", url="http://h:1", token="t", region="r", backend="qemu", labels={"a": "b"},
                               capacity=HostCapacity(vm_count=3, cpus=2, mig_profiles={"1g.10gb": 1})
                               ).model_dump(mode="json", exclude_none=True)
    assert unknown_fields(RegisterHostRequest, body) == []


def test_aliases_and_models_that_set_extra_themselves_are_respected():
    assert unknown_fields(PrewarmOptions, {"count": 2}) == []  # forbid: pydantic reports its own extras
    assert unknown_fields(ControllerCreateVm, VM | {"shape": {"vcpus": 1, "memMib": 1}})[0]["loc"] == \
        ("shape", "memMib")


# ---- a value given twice (review 21: the last was taken, the first dropped without a word) ----

@pytest.mark.parametrize("query, name, values", [
    ("/v1/vms?host=h2&host=h3", "host", "h2, h3"),
    ("/v1/usage?from=1761955200&from=5", "from", "1761955200, 5"),
    ("/v1/events?since=0&since=3", "since", "0, 3"),
], ids=["a filter", "a window's start", "a cursor"])
def test_a_query_parameter_given_twice_is_refused(client, query, name, values):
    r = client.get(query)
    assert r.status_code == 400 and r.json()["error"] == {
        "code": "invalid_argument", "message": f"query parameter {name}: given 2 times ({values}): give it once"}


def test_a_json_key_given_twice_is_refused_and_nothing_is_created(client):
    raw = b'{"name": "dupkey", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "entry": "y"}'
    r = client.post("/v1/vms", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": "invalid_argument", "message": "entry: appears twice in one JSON object: give it once"}
    assert client.get("/v1/vms").json()["vms"] == []


@pytest.mark.parametrize("body, expected", [
    ({"name": "", "addr": "local"}, "name: must not be empty"),
    ({"name": "h", "addr": ""}, "addr: must not be empty"),
    ({"id": "", "url": "local", "capacity": {"vm_count": 1}}, "id: must not be empty"),
    ({"name": "h", "addr": "local", "url": "local"}, "addr: is url in seed 004's form: give url or addr, not both"),
], ids=["an empty name", "an empty addr", "an empty id", "both spellings of the url"])
def test_a_host_field_is_named_as_the_caller_spelt_it(client, body, expected):
    # (review 21: seed 004's form was told "id is required" and "url is required")
    assert refused(client.post("/v1/hosts", json=body)) == expected


def test_an_empty_on_is_refused_as_an_empty_host_is(client):
    msg = refused(client.post("/v1/vms", json=VM | {"on": ""}))
    assert msg.startswith("on must name where the VM may go"), msg
