"""Host ids and texts every store keeps and every route reaches (a review on real
controllers, SQLite and PostgreSQL): an id with a newline had registered (201) and then
answered 404 to every get, cordon and removal while still taking placements; a NUL in
an id or region was 201 on SQLite and 500 on PostgreSQL, and so was a path with %00."""

from __future__ import annotations

import httpx
import pytest

from support import start_controller


@pytest.fixture(params=["sqlite", "postgresql"])
def ctl(request, tmp_path):
    db = None
    if request.param == "postgresql":
        db = request.getfixturevalue("postgres").create_db(f"fuse_ids_{abs(hash(str(tmp_path))) % 10**8}")
    c = start_controller(tmp_path, db=db, listen=True, token="ids-token")
    c.http = f"http://127.0.0.1:{c.extra['port']}"
    c.headers = {"Authorization": "Bearer ids-token"}
    yield c
    c.stop()


def _register(http, agent, **over):
    body = {"id": "h1", "url": agent.url, "token": agent.token, "capacity": {"vm_count": 2}} | over
    return http.post("/v1/hosts", json=body)


@pytest.mark.parametrize("bad", ["a\nb", "a\x00b", "a\x1bb", "a\x7fb", "\t"])
def test_an_id_with_a_control_character_is_refused_and_nothing_stored(ctl, agent, bad):
    with httpx.Client(base_url=ctl.http, headers=ctl.headers, timeout=30) as http:
        r = _register(http, agent, id=bad)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_argument"
        assert http.get("/v1/hosts").json()["hosts"] == []


@pytest.mark.parametrize("field", ["region", "labels"])
def test_a_nul_in_a_text_is_400_on_either_store(ctl, agent, field):
    value = "r\x00" if field == "region" else {"rack": "a\x00"}
    with httpx.Client(base_url=ctl.http, headers=ctl.headers, timeout=30) as http:
        r = _register(http, agent, **{field: value})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
        assert "NUL" in r.json()["error"]["message"]
        assert http.get("/v1/hosts").json()["hosts"] == []


def test_a_path_with_a_nul_is_400_not_a_database_error(ctl, agent):
    with httpx.Client(base_url=ctl.http, headers=ctl.headers, timeout=30) as http:
        assert _register(http, agent).status_code == 201
        for method, path in [("GET", "/v1/hosts/a%00b"), ("DELETE", "/v1/hosts/a%00b"),
                             ("POST", "/v1/hosts/a%00b?action=cordon"), ("GET", "/v1/vms/a%00b")]:
            r = http.request(method, path)
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (path, r.text)
        assert http.get("/v1/hosts/h1").json()["state"] == "active"  # nothing touched
        # the token still comes first
        r = httpx.get(ctl.http + "/v1/hosts/a%00b", timeout=30)
        assert r.status_code == 401
