"""The error envelope on the wire: an unexpected exception is 500 `internal`
in the envelope (not Starlette's text/plain), and a code's extras travel both
beside `code` and under `error.details`, which the SDK reads as one dict."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from starlette.testclient import TestClient

from fuse.client._core import ApiError, check
from fuse.controller.app import create_app
from fuse.controller.service import Controller
from fuse.controller.store import vms as vms_t
from fuse.errors import FleetFull, NotFound, error_body


@pytest.fixture
def ctl(tmp_path):
    c = Controller(tmp_path / "ctl")
    yield c
    c.store.close()


def client(ctl) -> TestClient:
    # not entered: no lifespan, so no pollers start; a server error answers instead of raising here
    return TestClient(create_app(ctl), raise_server_exceptions=False)


def test_an_unexpected_exception_is_500_internal_in_the_envelope_with_the_traceback_logged(ctl, caplog):
    async def broken(*a, **kw):
        raise RuntimeError("the store's secret path /var/x")

    ctl.events.list = broken
    with caplog.at_level(logging.ERROR, logger="fuse.http"):
        r = client(ctl).get("/v1/events")
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "internal" and "RuntimeError" in err["message"]
    assert "/var/x" not in err["message"]  # the details go to the log, not to the caller
    logged = [rec for rec in caplog.records if rec.name == "fuse.http"]
    assert len(logged) == 1 and "GET /v1/events" in logged[0].getMessage()
    assert logged[0].exc_info and logged[0].exc_info[0] is RuntimeError


def test_expected_errors_keep_their_own_status_and_code(ctl):
    r = client(ctl).get("/v1/hosts/nope")
    assert r.status_code == 404 and r.json() == {"error": {"code": "not_found", "message": "host nope not found"}}


@pytest.mark.parametrize("err,extras", [
    (FleetFull("no host can take vm a", details={"hosts": {"h1": "host is cordoned"}}),
     {"hosts": {"h1": "host is cordoned"}}),
    (NotFound("vm a not found"), {}),
], ids=["fleet_full's hosts sit beside code and under details", "an error without extras has no details"])
def test_extras_are_beside_code_and_under_details(err, extras):
    body = err.body()["error"]
    assert {k: body[k] for k in extras} == extras
    if extras:
        assert body["details"] == extras
    else:
        assert body == {"code": err.code, "message": err.message}


def test_an_ambiguous_vm_answer_carries_hosts_under_details_on_the_wire(ctl):
    with ctl.store.tx() as c:
        for host in ("h1", "h2"):
            c.execute(vms_t.insert().values(name="twin", host=host, vcpus=1, mem_mib=256, state="running",
                                            record={}, created_at=time.time()))
    r = client(ctl).get("/v1/vms/twin")
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "ambiguous_vm"
    assert err["hosts"] == err["details"]["hosts"] == ["h1", "h2"]


@pytest.mark.parametrize("body", [
    error_body("fleet_full", "full", hosts={"h1": "why"}),
    {"error": {"code": "fleet_full", "message": "full", "hosts": {"h1": "why"}}},  # a controller before details
    {"error": {"code": "fleet_full", "message": "full", "details": {"hosts": {"h1": "why"}}}},  # details only
], ids=["both places", "beside code only", "under details only"])
def test_the_sdk_reads_the_extras_as_one_dict(body):
    with pytest.raises(ApiError) as info:
        check(httpx.Response(409, json=body))
    assert info.value.code == "fleet_full" and info.value.details == {"hosts": {"h1": "why"}}
