"""A VM's ``created_at`` orders ``GET /v1/host/vms``: an incoming move that declares one without a
timezone is refused (400 ``invalid_argument``), and a stored record holding such a time (an agent
before this check took it) is read as UTC, so no record makes the list a 500 for everyone."""

from __future__ import annotations

import hashlib
import json

import httpx

from support import start_agent

FAKE_PLATFORM = {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"}
SHAPE = {"vcpus": 1, "mem_mib": 128}


def _incoming(fp: str, created_at: str, move_id: str = "m1") -> dict:
    data = b"fuse" * 1024
    return {"move_id": move_id, "platform": FAKE_PLATFORM,
            "vm": {"name": "v", "shape": SHAPE, "entry": "true", "bundle": "linux", "bundle_fingerprint": fp,
                   "created_at": created_at},
            "files": [{"name": "state.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}


def test_an_incoming_created_at_without_a_timezone_is_refused_and_the_list_still_answers(tmp_path, procs):
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    h = {"Authorization": f"Bearer {agent.token}"}
    fp = httpx.get(f"{agent.url}/v1/host", headers=h).json()["bundles"][0]["fingerprint"]
    assert httpx.post(f"{agent.url}/v1/host/vms", json={"name": "a", "shape": SHAPE, "entry": "true"},
                      headers=h, timeout=30).status_code == 201

    r = httpx.post(f"{agent.url}/v1/host/incoming", json=_incoming(fp, "2020-01-01T00:00:00"), headers=h)
    assert r.status_code == 400, r.text  # (was: 201, then GET /v1/host/vms 500 internal, TypeError)
    assert r.json()["error"]["code"] == "invalid_argument"
    assert "created_at" in r.json()["error"]["message"] and "timezone" in r.json()["error"]["message"]
    assert httpx.get(f"{agent.url}/v1/host/incoming", headers=h).json()["incoming"] == []
    r = httpx.get(f"{agent.url}/v1/host/vms", headers=h)
    assert r.status_code == 200 and [v["name"] for v in r.json()["vms"]] == ["a"], r.text

    # one with an offset is taken, and keeps its place in the list
    r = httpx.post(f"{agent.url}/v1/host/incoming", json=_incoming(fp, "2020-01-01T02:00:00+02:00"), headers=h)
    assert r.status_code == 201, r.text
    r = httpx.get(f"{agent.url}/v1/host/vms", headers=h)
    assert r.status_code == 200 and [v["name"] for v in r.json()["vms"]] == ["v", "a"], r.text
    assert httpx.delete(f"{agent.url}/v1/host/incoming/m1", headers=h).status_code == 204


def test_a_stored_record_whose_created_at_has_no_timezone_is_read_as_utc(tmp_path, procs):
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    h = {"Authorization": f"Bearer {agent.token}"}
    for name in ("a", "b"):
        r = httpx.post(f"{agent.url}/v1/host/vms", json={"name": name, "shape": SHAPE, "entry": "true"},
                       headers=h, timeout=30)
        assert r.status_code == 201, r.text
    agent.stop()
    record = agent.state_dir / "vms" / "b" / "vm.json"
    vm = json.loads(record.read_text())
    vm["created_at"] = "2020-01-01T00:00:00"  # (as an agent before the check stored a move's copy)
    record.write_text(json.dumps(vm))

    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    r = httpx.get(f"{agent.url}/v1/host/vms", headers=h)
    assert r.status_code == 200, r.text  # (was: 500 internal at every start until b was deleted)
    assert [(v["name"], v["created_at"]) for v in r.json()["vms"]][0] == ("b", "2020-01-01T00:00:00Z")
    for name in ("a", "b"):
        assert httpx.delete(f"{agent.url}/v1/host/vms/{name}", headers=h).status_code == 204
