"""Thirtieth session: an empty host on the per-VM routes is refused as on the others,
and a usage window's ISO times with no offset are UTC."""

from __future__ import annotations

import httpx
import pytest

from fuse.agent.metering import instant


@pytest.fixture
def raw(controller):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c",
                      timeout=30) as c:
        yield c


@pytest.mark.parametrize("method,path", [("GET", "/v1/vms/v1"), ("DELETE", "/v1/vms/v1"),
                                         ("POST", "/v1/vms/v1/sleep"), ("GET", "/v1/vms/v1/console")])
def test_an_empty_host_on_a_vms_route_is_400_as_on_the_list(raw, method, path):
    """(was: 404 "vm v1 not found: no host  is registered")"""
    r = raw.request(method, path, params={"host": ""})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
    assert "host must name a host" in r.json()["error"]["message"]


def test_iso_times_with_no_offset_are_utc_year_1_included():
    assert instant("0001-01-01T00:00:00", "from") == instant("0001-01-01T00:00:00Z", "from") == -62135596800
    assert instant("0001-01-01", "from") == -62135596800  # (was: 400 "not ISO 8601")
    assert instant("2026-12-06T10:00:00", "to") == instant("2026-12-06T10:00:00+00:00", "to")


def test_the_controller_takes_a_usage_window_from_year_1_with_no_offset(raw):
    r = raw.get("/v1/usage", params={"from": "0001-01-01T00:00:00", "to": "2026-12-06T10:00:00"})
    assert r.status_code == 200, r.text  # (was: 400 "from must be unix seconds or an ISO 8601 time")
    assert (r.json()["from"], r.json()["to"]) == (-62135596800, 1796551200)


@pytest.mark.parametrize("content,headers", [
    (b'{"name": "n\\xe9"}'.replace(b"\\xe9", bytes([0xE9])), {}),
    (b'{"shape": {"vcpus": 1' + b"0" * 5000 + b', "mem_mib": 128}}', {}),
    (b"\x1f\x8b\x08\x00not really gzip", {"Content-Encoding": "gzip"}),
])
def test_a_body_that_does_not_read_as_json_says_what_to_send(raw, content, headers):
    """(was: FastAPI's "There was an error parsing the body")"""
    r = raw.post("/v1/vms", content=content, headers={"Content-Type": "application/json", **headers})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
    msg = r.json()["error"]["message"]
    assert "error parsing the body" not in msg and "JSON" in msg, msg
