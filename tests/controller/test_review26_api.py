"""Twenty-sixth session: values that name nothing, or read loosely, are refused as elsewhere."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from support import FUSE


@pytest.fixture
def raw(controller):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c",
                      timeout=30) as c:
        yield c


def _refused(r: httpx.Response, says: str) -> None:
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
    assert says in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("body", [{"cert": "", "key": "", "ca": ""}, {"cert": " ", "key": None, "ca": None}])
def test_an_empty_certificate_path_is_refused_not_read_as_none(raw, body):
    """(was: 200, and a controller with an identity lost it past the check that guards it)"""
    _refused(raw.put("/v1/controller", json=body), "empty path")


@pytest.mark.parametrize("standby", ["no", "off", "0", 0, 0.0, 1])
def test_a_create_takes_standby_as_true_or_false_only(raw, standby):
    r = raw.post("/v1/vms", json={"shape": {"vcpus": 1, "mem_mib": 256}, "entry": "true", "standby": standby})
    _refused(r, "standby")


@pytest.mark.parametrize("name", ["local", "auto"])
def test_a_cloud_is_not_linked_under_a_name_on_reads_as_a_keyword(raw, name):
    r = raw.put(f"/v1/pool/clouds/{name}", json={"kind": "local", "options": {"backend": "fake"}})
    _refused(r, "keywords")


def test_a_prewarm_on_an_empty_target_is_refused_as_a_create_is(raw):
    _refused(raw.post("/v1/prewarms", json={"image": "linux", "count": 1, "on": ""}), "on must name")


@pytest.mark.parametrize("flag", ["--host", "--name", "--on"])
def test_the_cli_sends_an_empty_host_or_name_which_is_refused_not_dropped(controller, flag):
    """(was: dropped: the VM was placed anywhere, under a name of its own)"""
    r = subprocess.run(FUSE + ["controller", "vms", "create", "--entry", "true", flag, "", "--json"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "FUSE_URL": f"unix://{controller.socket}"})
    assert r.returncode != 0 and "invalid_argument" in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)


def test_the_cli_says_a_capacity_past_2_53_in_one_line():
    r = subprocess.run(FUSE + ["controller", "hosts", "add", "--name", "h", "--addr", "http://127.0.0.1:1",
                               "--cpus", str(2**60)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "FUSE_URL": "http://127.0.0.1:9"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--cpus" in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr


def test_the_cli_says_a_name_too_long_for_a_url_in_one_line():
    r = subprocess.run(FUSE + ["controller", "vms", "get", "a" * 70000], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "FUSE_URL": "http://127.0.0.1:9"})
    assert r.returncode == 2 and "invalid_argument" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_document_says_every_route_with_a_body_may_answer_413(raw):
    doc = raw.get("/openapi.json").json()
    ops = [(p, m, op) for p, item in doc["paths"].items() for m, op in item.items() if "requestBody" in op]
    assert ops and all("413" in op["responses"] for _, _, op in ops), [(p, m) for p, m, op in ops
                                                                        if "413" not in op["responses"]]
