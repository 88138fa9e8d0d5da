"""A query value with percent-escapes that are not UTF-8, or a control character (review 34):
decoded to U+FFFD it named host U+FFFD (`GET /v1/vms?host=%ff` listed that host's VMs, a
DELETE would act on it). 400 `invalid_argument` on the controller and the agent alike."""

from __future__ import annotations

import httpx

from support import refused
from test_review18_hosts import http  # noqa: F401  (the fixture: a controller over TCP)


def test_a_query_with_bad_utf8_or_a_control_character_is_400_and_touches_no_host(http, fake_agent):
    r = http.post("/v1/hosts", json={"id": "\ufffd", "url": fake_agent.url, "token": fake_agent.token,
                                     "capacity": {"vm_count": 1}})
    assert r.status_code == 201, r.text
    assert http.get("/v1/vms", params={"host": "\ufffd"}).status_code == 200  # spelt in UTF-8 it is that host
    for method, path in [("GET", "/v1/vms?host=%ff"), ("GET", "/v1/vms?host=%EF%BF"), ("DELETE", "/v1/vms/x?host=%ff"),
                         ("GET", "/v1/vms?host=a%0A"), ("GET", "/v1/vms?host=%00"), ("GET", "/v1/events?tags=%C0"),
                         ("GET", "/v1/vms?%ff=1")]:
        r = http.request(method, path)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (method, path, r.text)
        assert "no parameter here takes one" in refused(r), r.text
    assert [h["id"] for h in http.get("/v1/hosts").json()["hosts"]] == ["\ufffd"]
    # the agent's routes alike
    with httpx.Client(base_url=fake_agent.url, headers={"Authorization": f"Bearer {fake_agent.token}"},
                      timeout=30) as agent:
        r = agent.get("/v1/host/events?since=%ff")
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
        assert agent.get("/v1/host/events", params={"since": 0}).status_code == 200
