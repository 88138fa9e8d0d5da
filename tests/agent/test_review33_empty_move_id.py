"""Review 33: ``DELETE /v1/host/vms/NAME?move_id=`` (an empty value) deleted a VM no move holds: the
empty id read as none, where the README says a delete with a move id removes only the copy that
move holds (a VM no move holds: 404, left as it is). An empty move id is no move's: 400, on the
delete, the sleep and the wake alike, and the VM is left as it is."""

from __future__ import annotations

import httpx


def test_an_empty_move_id_is_refused_and_the_vm_is_left(fake_agent):
    with httpx.Client(base_url=fake_agent.url, headers={"Authorization": f"Bearer {fake_agent.token}"},
                      timeout=30) as c:
        r = c.post("/v1/host/vms", json={"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600"})
        assert r.status_code == 201, r.text
        r = c.delete("/v1/host/vms/v", params={"move_id": ""})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text  # (was: 204)
        for action in ("sleep", "wake"):
            r = c.post(f"/v1/host/vms/v/{action}", json={"move_id": ""})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
        assert [v["name"] for v in c.get("/v1/host/vms").json()["vms"]] == ["v"]
        assert c.get("/v1/host/vms/v").json()["state"] == "running"
        assert c.delete("/v1/host/vms/v").status_code == 204
