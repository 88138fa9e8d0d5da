"""Review 34: a unix:// address with a trailing slash is stored without it, as an http:// or
ssh:// one is (README: "A url is stored without trailing slashes"), and it reaches its agent.
It was stored as given, dialled as a directory path and failed for good with the raw
"[Errno 20] Not a directory". One that names only '/' names no socket: 400."""

from __future__ import annotations

import httpx
import pytest

from support import start_controller, wait_until


@pytest.fixture
def ctl(tmp_path):
    p = start_controller(tmp_path)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(p.socket)), base_url="http://c", timeout=30) as c:
        yield c
    p.stop()


@pytest.mark.parametrize("slashes", ["/", "//"])
@pytest.mark.parametrize("capacity", ["probed", "declared"])
def test_a_unix_address_with_a_trailing_slash_is_stored_without_it_and_reached(fake_agent, ctl, slashes,
                                                                              capacity):
    cap = {"vm_count": 4} if capacity == "probed" else {"vm_count": 4, "cpus": 1, "ram_mb": 1024, "storage_gb": 5}
    r = ctl.post("/v1/hosts", json={"id": "h1", "url": f"unix://{fake_agent.socket}{slashes}", "backend": "qemu",
                                    "capacity": cap})
    assert r.status_code == 201, r.text  # (it was 502 "cannot reach ...: [Errno 20] Not a directory")
    assert r.json()["url"] == f"unix://{fake_agent.socket}", r.json()
    wait_until(lambda: ctl.get("/v1/hosts/h1").json()["connected"], what="host h1 connected")
    # registered again spelt without the slash: the same address, not a move
    r = ctl.post("/v1/hosts", json={"id": "h1", "url": f"unix://{fake_agent.socket}", "backend": "qemu",
                                    "capacity": cap})
    assert r.status_code in (200, 201), r.text
    assert r.json()["url"] == f"unix://{fake_agent.socket}"


@pytest.mark.parametrize("url", ["unix:///", "unix:////"])
def test_a_unix_address_of_only_slashes_is_no_socket_path(ctl, url):
    r = ctl.post("/v1/hosts", json={"id": "h1", "url": url, "backend": "qemu", "capacity": {"vm_count": 4}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument" and "names no socket path" in err["message"], err
    assert ctl.get("/v1/hosts").json()["hosts"] == []
