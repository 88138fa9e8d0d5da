"""A prewarm's shape is one a VM create takes (the create shape, ``VmShape``: integer
numbers, its bounds, the memory floor of 128 MiB, or 96 + 2 per vCPU when more). Any
other is 400 ``invalid_argument`` when it is set, nothing bought: each of its standby
creates would be refused, and logged, at every refill pass for as long as it lived.
Through the REST API, the SDK and the CLI of a real controller with a linked cloud (a
prewarm it accepted would buy a machine there), and in process for a learned shape."""

from __future__ import annotations

import time

import httpx
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

import fuse
from fuse.cli.pool import app as pool_cli
from fuse.controller.app import create_app
from fuse.controller.service import Controller
from fuse.controller.store import prewarms, vms as vms_t
from support import start_controller, wait_until

SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}
WIDE = {"name": "local.wide", "vcpus": 64, "mem_mib": 4096, "usd_per_hour": 1.0}


@pytest.fixture
def linked(tmp_path, procs):
    """A controller with a linked `local` cloud (fake VM backend): what it accepts, it buys."""
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL, WIDE]})
    return ctl


def nothing_bought(ctl) -> None:
    with fuse.Client(ctl.url) as client:
        assert client.pool.prewarms() == [] and client.pool.cloud_hosts() == []


@pytest.mark.parametrize("body, says", [
    ({"memory_mb": 64}, ["memory_mb 64", "memory_mb: Input should be greater than or equal to 128",
                         "at least 96 + 2 per vCPU"]),
    ({"cpus": 1, "memory_mb": 127}, ["memory_mb: Input should be greater than or equal to 128"]),
    ({"cpus": 32, "memory_mb": 130}, ["cpus 32 and memory_mb 130", "below the floor of 160 MiB"]),
    ({"cpus": 64, "memory_mb": 223}, ["below the floor of 224 MiB"]),
    ({"cpus": 65}, ["cpus: Input should be less than or equal to 64"]),
    ({"cpus": 1, "memory_mb": 256.0}, ["memory_mb", "valid integer"]),
    ({"cpus": "2", "memory_mb": 256}, ["cpus", "valid integer"]),
    ({"cpus": True, "memory_mb": 256}, ["cpus", "valid integer"]),
], ids=["memory below 128 MiB", "memory one MiB below 128", "memory below the floor of 32 vCPUs",
        "memory one MiB below the floor of 64 vCPUs", "more vCPUs than a create takes", "a float of memory",
        "a string of vCPUs", "a boolean of vCPUs"])
def test_a_shape_a_create_refuses_is_400_over_rest_and_nothing_is_bought(linked, body, says):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(linked.socket)), base_url="http://c") as http:
        r = http.post("/v1/prewarms", json={"image": "linux", "count": 1} | body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument"
    for s in says:
        assert s in err["message"], err["message"]
    nothing_bought(linked)


def test_the_floor_is_the_creates_own_at_its_edge(linked):
    # one MiB below the floor of 32 vCPUs is refused; the floor itself is taken (a machine bought for it)
    with fuse.Client(linked.url) as client:
        with pytest.raises(fuse.ApiError) as e:
            client.pool.prewarm("linux", fuse.PrewarmOptions(cpus=32, memory_mb=159, ttl_secs=60))
        assert e.value.status == 400 and "below the floor of 160 MiB for vcpus 32" in e.value.message
        nothing_bought(linked)
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(cpus=32, memory_mb=160, ttl_secs=60))
        assert (pw.cpus, pw.memory_mb) == (32, 160) and len(pw.new_hosts) == 1
        assert client.pool.remove_prewarm(pw.id)
        wait_until(lambda: not client.pool.cloud_hosts(), timeout=60, interval=0.3, what="its machine gone")


@pytest.mark.parametrize("options", [fuse.PrewarmOptions(cpus=1, memory_mb=64), {"cpus": 1, "memory_mb": 64}],
                         ids=["a record", "a dict"])
def test_the_sdk_raises_an_api_error_naming_the_floor(linked, options):
    with fuse.Client(linked.url) as client:
        with pytest.raises(fuse.ApiError) as e:
            client.pool.prewarm("linux", options)
    assert (e.value.status, e.value.code) == (400, "invalid_argument")
    assert "memory_mb: Input should be greater than or equal to 128" in e.value.message
    nothing_bought(linked)


def test_the_cli_prints_the_error_and_exits_1_without_a_traceback(linked):
    # (the controller's 400: exit 1, as under `fuse controller`; a flag refused before asking is 2)
    r = CliRunner().invoke(pool_cli, ["prewarm", "linux", "--cpus", "32", "--memory-mb", "130",
                                      "--url", linked.url])
    assert r.exit_code == 1, r.output
    assert "error: invalid_argument: cpus 32 and memory_mb 130" in r.output and "floor of 160 MiB" in r.output
    assert "Traceback" not in r.output
    nothing_bought(linked)


# ---- in process: a shape learned from earlier VMs is checked as one given -----------------
@pytest.fixture
def ctl(tmp_path):
    c = Controller(tmp_path / "ctl")
    yield c
    c.store.close()


def _record_vm(ctl, name: str, vcpus: int, mem_mib: int) -> None:
    """A VM of a shape an older agent admitted (below today's floor)."""
    rec = {"name": name, "bundle": "linux", "shape": {"vcpus": vcpus, "mem_mib": mem_mib}, "state": "running"}
    with ctl.store.tx() as c:
        c.execute(vms_t.insert().values(name=name, host="h1", vcpus=vcpus, mem_mib=mem_mib, state="running",
                                        record=rec, created_at=time.time()))


@pytest.mark.parametrize("given, says", [
    ({}, "cpus 32 and memory_mb 128 (cpus and memory_mb learned from earlier VMs of the image: give them)"),
    ({"cpus": 32}, "cpus 32 and memory_mb 128 (memory_mb learned from earlier VMs of the image: give them)"),
], ids=["both learned", "memory learned"])
def test_a_learned_shape_below_the_floor_is_400_saying_it_was_learned(ctl, given, says):
    _record_vm(ctl, "old", 32, 128)
    http = TestClient(create_app(ctl))  # not entered: no pollers start
    r = http.put("/v1/pool/clouds/dev", json={"kind": "local", "options": {"backend": "fake", "types": [SMALL]}})
    assert r.status_code == 200, r.text
    r = http.post("/v1/prewarms", json={"image": "linux"} | given)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_argument" and says in r.json()["error"]["message"], r.text
    assert ctl.pool.rows() == []  # nothing bought


async def test_a_prewarm_stored_before_the_check_with_such_a_shape_ends_at_the_next_refill(ctl):
    now = time.time()
    rec = {"id": "pw-old", "image": "linux", "kind": "microvm", "cpus": 1, "memory_mb": 64, "count": 1,
           "on": "auto", "ttl_secs": 600, "expires_at": int(now + 600), "next": 1, "new_hosts": [],
           "placements": {"h1": 1}}
    with ctl.store.tx() as c:
        c.execute(prewarms.insert().values(id="pw-old", record=rec, created_at=now))
    await ctl.prewarm.fill()  # (it would have asked h1 for a VM of 64 MiB at every pass)
    assert ctl.prewarm.list() == []
    (ended,) = [e["data"] for e in ctl.store.events_after(0) if e["type"] == "prewarm_removed"]
    assert ended["prewarm"] == "pw-old" and "memory_mb: Input should be greater than or equal to 128" in ended["reason"]
