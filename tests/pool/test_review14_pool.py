"""Review 14 of the elastic pool's REST surface and its machines' lives.

Pool bodies take numbers and switches as such (``true`` is no count, ``"yes"`` no switch:
400 naming the field, as a plan's count); a pin to a linked cloud whose machines lack the
image says that, not that no such cloud is linked; and a machine the cloud ends takes its
registered host with it. The REST checks against the real controller app (not started)
with ``local`` clouds; the machine's end with a real controller and agents."""

from __future__ import annotations

import json
import os
import signal

import pytest
from starlette.testclient import TestClient

import fuse
from fuse.controller.app import create_app
from fuse.controller.service import Controller
from support import fake_bundle, reap, start_controller, wait_until

SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}


@pytest.fixture
def app(tmp_path):
    """The controller app (not started) with two local clouds: ``dev``, whose machines get
    images linux and alpine, and ``nb``, whose machines get linux only."""
    ctl = Controller(tmp_path / "ctl")
    client = TestClient(create_app(ctl))
    fake_bundle(tmp_path / "b", name="alpine")
    for name, extra in (("dev", {"bundle_dir": str(tmp_path / "b" / "bundles" / "alpine")}), ("nb", {})):
        r = client.put(f"/v1/pool/clouds/{name}", json={"kind": "local", "options": {
            "backend": "fake", "types": [SMALL], **extra}})
        assert r.status_code == 200, r.text
    yield client
    ctl.store.close()
    reap(tmp_path)


@pytest.mark.parametrize("method, path, body, field", [
    ("POST", "/v1/prewarms", {"image": "linux", "count": True}, "count"),
    ("POST", "/v1/prewarms", {"image": "linux", "count": "2"}, "count"),
    ("POST", "/v1/prewarms", {"image": "linux", "ttl_secs": True}, "ttl_secs"),
    ("PATCH", "/v1/pool/budget", {"max_new_hosts": True}, "max_new_hosts"),
    ("PATCH", "/v1/pool/budget", {"max_usd_per_hour": True}, "max_usd_per_hour"),
    ("PATCH", "/v1/pool/budget", {"monthly_usd": "5"}, "monthly_usd"),
    ("PATCH", "/v1/pool/budget", {"autoscale": "yes"}, "autoscale"),
    ("PATCH", "/v1/pool/budget", {"warm": 1}, "warm"),
    ("PATCH", "/v1/pool/budget", {"allow_metal": "true"}, "allow_metal"),
    ("POST", "/v1/pool/hosts", {"provider": "dev", "instance_type": "local.small", "count": True}, "count"),
    ("POST", "/v1/pool/hosts", {"provider": "dev", "instance_type": "local.small", "ttl_hours": "2"}, "ttl_hours"),
], ids=["prewarm count true", "prewarm count a string", "prewarm ttl_secs true", "budget max_new_hosts true",
        "budget max_usd_per_hour true", "budget monthly_usd a string", "budget autoscale yes", "budget warm 1",
        "budget allow_metal a string", "add hosts count true", "add hosts ttl_hours a string"])
def test_pool_bodies_refuse_a_boolean_or_a_string_for_a_number_or_a_switch_naming_the_field(app, method, path, body,
                                                                                            field):
    before = app.get("/v1/pool/budget").json()
    r = app.request(method, path, json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert field in r.json()["error"]["message"]
    assert app.get("/v1/pool/budget").json() == before and app.get("/v1/pool/hosts").json()["hosts"] == []
    assert app.get("/v1/prewarms").json()["prewarms"] == []


def test_pool_bodies_still_take_numbers_and_switches(app):
    r = app.patch("/v1/pool/budget", json={"max_new_hosts": 3, "max_usd_per_hour": 2, "monthly_usd": 10.5,
                                           "autoscale": True, "warm": False, "allow_metal": False})
    assert r.status_code == 200, r.text
    assert (r.json()["max_new_hosts"], r.json()["max_usd_per_hour"], r.json()["autoscale"]) == (3, 2.0, True)


def test_a_pin_to_a_linked_cloud_whose_machines_lack_the_image_says_so(app):
    plan = {"count": 1, "image": "alpine", "kind": "container", "cpus": 1, "memory_mb": 512}
    r = app.post("/v1/pool/plan", json=plan)  # unpinned: dev's machines have it
    assert r.status_code == 200 and [h["provider"] for h in r.json()["new_hosts"]] == ["dev"], r.text
    r = app.post("/v1/pool/plan", json=plan | {"provider": "dev"})
    assert r.status_code == 200 and not r.json()["unplaced"], r.text

    r = app.post("/v1/pool/plan", json=plan | {"provider": "nb"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    message = r.json()["error"]["message"]
    assert "no linked cloud" not in message and "'nb'" in message and "image 'alpine'" in message, message
    assert "they get: linux" in message

    r = app.post("/v1/prewarms", json={"image": "alpine", "on": "nb", "cpus": 1, "memory_mb": 512})
    assert r.status_code == 400 and "image 'alpine'" in r.json()["error"]["message"], r.text
    assert app.get("/v1/pool/hosts").json()["hosts"] == [] and app.get("/v1/prewarms").json()["prewarms"] == []

    r = app.post("/v1/pool/plan", json=plan | {"provider": "xx"})  # a cloud that is not linked: as before
    assert r.status_code == 400 and "no linked cloud 'xx'" in r.json()["error"]["message"], r.text


@pytest.mark.timeout(180)
@pytest.mark.parametrize("with_vm", [False, True], ids=["an idle machine", "a machine running a VM"])
def test_a_machine_the_cloud_ends_takes_its_registered_host_and_vms_with_it(tmp_path, procs, with_vm):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        (host,) = client.pool.cloud_add_host("dev", "local.small", count=1, ttl_hours=1)
        name = host.name
        wait_until(lambda: client.hosts.get(name).connected, timeout=60, interval=0.2, what=f"{name} joined")
        if with_vm:
            vm = client.vms.create({"name": "work", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 3600",
                                    "host": name})
            assert vm["host"] == name

        (machine,) = (ctl.state_dir / "clouds" / "dev").glob(f"**/{name}/machine.json")
        os.kill(json.loads(machine.read_text())["pid"], signal.SIGKILL)  # the cloud ends it, VMs and all
        wait_until(lambda: [h.state for h in client.pool.cloud_hosts(include_gone=True)] == ["gone"],
                   timeout=60, interval=0.2, what=f"{name} gone")
        # its host goes with it: it had stayed registered for good, cordoned and disconnected (with a
        # VM: 409, still has vm work assigned)
        wait_until(lambda: name not in {h.id for h in client.hosts.list()}, timeout=15, interval=0.2,
                   what=f"{name} deregistered")
        events = client.events.list(0, limit=500)["events"]
        (removed,) = [e for e in events if e["type"] == "host_removed"]
        assert removed["host"] == name, removed
        lost = [(e["vm"], e["host"], e["reason"]) for e in events if e["type"] == "vm_lost"]
        if with_vm:  # failed, and gone with the host as a finished VM goes
            assert lost == [("work", name, "the cloud ended its machine")], lost
            assert removed["finished_vms"] == ["work"], removed
            assert "work" not in {v["name"] for v in client.vms.list()}
        else:
            assert lost == [] and "finished_vms" not in removed, removed
