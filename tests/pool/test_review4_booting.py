"""Machines bought and not joined yet are hosts with room (seed 001: "your devices first,
then hosts with room, then new cloud machines at the least cost"): a plan puts work on
them before it buys another, says when they will be ready, and the paths that carry a
plan out (a create on auto, a prewarm) wait for them to join as for a machine bought now.

The plans run on the real controller app against a moto EC2 server on loopback (its
machines never join: no agent runs there, so they stay booting); the create and the
prewarm on a real controller whose ``local`` cloud starts real host agents on loopback,
its joins held back until the pool has planned."""

from __future__ import annotations

import asyncio
import json
import time

import boto3
import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller
from fuse.models.pool import ElasticBudgetUpdate, PrewarmOptions
from support import reap

TYPES = [{"name": "local.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.36},
         {"name": "local.big", "vcpus": 4, "mem_mib": 8192, "usd_per_hour": 1.44}]



@pytest.fixture
def aws(moto_url, moto_subnet, tmp_path):
    """The controller app (not started: nothing joins) with an aws cloud on moto."""
    ctl = Controller(tmp_path / "ctl")
    client = TestClient(create_app(ctl))
    ec2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_url, aws_access_key_id="k",
                       aws_secret_access_key="s")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    r = client.put("/v1/pool/clouds/aws", json={"kind": "aws", "options": {
        "image_id": ami, "endpoint_url": moto_url, "access_key_id": "k", "secret_access_key": "s",
        "subnet_id": moto_subnet}})
    assert r.status_code == 200, r.text
    yield client, ctl
    client.post("/v1/pool/hosts/remove", json={"names": [h["name"] for h in client.get("/v1/pool/hosts").json()["hosts"]]})
    ctl.store.close()


def plan(client, **body) -> dict:
    r = client.post("/v1/pool/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_plan_puts_work_on_machines_bought_and_still_booting_before_buying_another(aws):
    client, ctl = aws
    r = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium", "region": "us-west-2",
                                            "count": 2, "ttl_hours": 3})
    assert r.status_code == 201, r.text
    assert [h["state"] for h in r.json()["hosts"]] == ["booting", "booting"]
    p = plan(client, count=2, kind="container", cpus=1, memory_mb=512)
    assert p["new_hosts"] == [] and p["unplaced"] == [], p["explain"]
    assert {a["host"] for a in p["assignments"]} <= {"aws-1", "aws-2"} and sum(a["count"] for a in p["assignments"]) == 2
    assert p["projected_usd"] == 0 and p["added_usd_per_hour"] == 0  # paid for 3 h already
    # not ready now: it is once the machine has joined (t3.medium boots in about 90 s)
    assert 1 <= p["ready_in_secs"] <= 90
    assert any("still booting, joins in about" in line for line in p["explain"]), p["explain"]
    body = json.loads(p["json"])
    assert set(body["joining"]) == {a["host"] for a in p["assignments"]}
    hosts = {h["name"]: h for h in body["model"]["hosts"]}
    assert set(hosts) == {"aws-1", "aws-2"}
    h = hosts["aws-1"]
    assert (h["own"], h["provider"], h["type_name"], h["mem_mib"], h["kvm"]) == (False, "aws", "t3.medium", 3072, False)
    # paid for its TTL, less the rest of its boot, when nothing can run there yet
    assert 3 * 3600 - 95 <= h["paid_secs_left"] <= 3 * 3600 - 1
    # apply buys nothing for the work they take
    assert plan(client, count=2, kind="container", cpus=1, memory_mb=512, apply=True)["added"] == []
    assert len(client.get("/v1/pool/hosts").json()["hosts"]) == 2
    # beyond their room the plan buys as before, and a microvm (KVM) is not for a t3 either way
    more = plan(client, count=8, kind="container", cpus=1, memory_mb=1024)
    assert more["new_hosts"] and sum(a["count"] for a in more["assignments"] if a["host"]) == 6
    assert all(a["host"] == "" for a in plan(client, count=1, kind="microvm")["assignments"])


def test_a_booting_machine_counts_only_the_room_it_has_and_gone_ones_none(aws):
    client, ctl = aws
    (h,) = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium", "ttl_hours": 1}
                       ).json()["hosts"]
    snap = {x["name"]: x for x in ctl.pool_snapshot()}
    assert snap["aws-1"]["free_mem_mib"] == 3072 and snap["aws-1"]["free_vm_slots"] == 8
    assert snap["aws-1"]["bundles"] == ["linux"] and snap["aws-1"]["joins_in_secs"] >= 1
    assert client.post("/v1/pool/hosts/remove", json={"names": ["aws-1"]}).json()["removed"] == ["aws-1"]
    assert ctl.pool_snapshot() == []
    assert plan(client, count=1, kind="container", cpus=1, memory_mb=512)["new_hosts"]


# ---- carried out: a create on auto and a prewarm wait for the machine to join ----------------

@pytest.fixture
async def local(tmp_path):
    """A started controller with a local cloud; its machines join only once ``gate`` is set."""
    ctl = Controller(tmp_path / "ctl", poll_interval=0.2)
    await ctl.start()
    ctl.pool.interval = 0.2
    gate = asyncio.Event()
    tick = ctl.pool.tick

    async def gated_tick():
        await gate.wait()
        await tick()

    ctl.pool.tick = gated_tick
    try:
        await ctl.pool.link("dev", "local", {"backend": "fake", "types": TYPES})
        ctl.pool.update_budget(ElasticBudgetUpdate(autoscale=True))
        yield ctl, gate
    finally:
        gate.set()
        for pw in ctl.prewarm.list():
            await ctl.prewarm.remove(pw.id)
        for v in ctl.vms.list():
            try:
                await ctl.vms.delete(v["name"], v["host"])
            except Exception:
                pass
        await ctl.pool.remove_hosts([h.name for h in ctl.pool.hosts()])
        await ctl.close()
        reap(tmp_path)


def _open_after_planning(ctl, gate) -> list:
    """Let the machines join once the pool has planned (what it decided is kept)."""
    plans, solve = [], ctl.pool.plan

    async def planned(*a, **k):
        result = await solve(*a, **k)
        plans.append(result)
        gate.set()
        return result

    ctl.pool.plan = planned
    return plans


async def test_a_create_on_auto_waits_for_a_machine_that_boots_and_buys_no_other(local):
    ctl, gate = local
    (h,) = await ctl.pool.add_hosts("dev", "local.big", ttl_hours=1)
    assert h.state == "booting"
    plans = _open_after_planning(ctl, gate)
    vm = await asyncio.wait_for(ctl.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 256},
                                                "entry": "sleep 600"}), 90)
    assert vm["host"] == "dev-1"
    assert [x.name for x in ctl.pool.hosts()] == ["dev-1"]  # nothing else bought
    assert plans and plans[0].new_hosts == [] and plans[0].ready_in_secs >= 1


async def test_with_autoscale_off_a_create_waits_for_a_machine_bought_by_hand_that_boots(local):
    # autoscale off buys nothing, but a machine the operator added and is paying for is room
    # on its way: the create waits for it (it was fleet_full 'autoscale is off' at once)
    ctl, gate = local
    ctl.pool.update_budget(ElasticBudgetUpdate(autoscale=False))
    await ctl.pool.add_hosts("dev", "local.big", ttl_hours=1)
    _open_after_planning(ctl, gate)
    vm = await asyncio.wait_for(ctl.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 256},
                                                "entry": "sleep 600"}), 90)
    assert vm["host"] == "dev-1"
    assert [x.name for x in ctl.pool.hosts()] == ["dev-1"]  # nothing bought
    # and with no machine on its way it is still fleet_full, saying autoscale is off
    from fuse.errors import FuseError
    with pytest.raises(FuseError) as e:
        await ctl.vms.create({"name": "big", "shape": {"vcpus": 1, "mem_mib": 9000}, "entry": "x"})
    assert e.value.code == "fleet_full" and "autoscale is off" in e.value.message, e.value.message
    assert [x.name for x in ctl.pool.hosts()] == ["dev-1"]


async def test_a_prewarm_placed_on_a_machine_that_boots_fills_once_it_joined(local):
    ctl, gate = local
    await ctl.pool.add_hosts("dev", "local.big", ttl_hours=1)
    plans = _open_after_planning(ctl, gate)
    pw = await ctl.prewarm.prewarm("linux", PrewarmOptions(count=2, cpus=1, memory_mb=256, kind="container"))
    assert pw.new_hosts == [] and [(p.host, p.count) for p in pw.placements] == [("dev-1", 2)]
    assert plans[0].new_hosts == []
    started = time.monotonic()
    while ctl.prewarm.list()[0].ready < 2:
        assert time.monotonic() - started < 60, ctl.prewarm.list()
        await ctl.prewarm.fill()
        await asyncio.sleep(0.2)
    assert [x.name for x in ctl.pool.hosts()] == ["dev-1"]


async def test_with_nothing_to_buy_the_pool_still_waits_for_a_machine_that_boots(local):
    # what a create with autoscale off may ask (host_for(buy=False)): never a purchase
    ctl, gate = local
    assert await ctl.pool.host_for(1, 256, "linux", None, timeout=5, buy=False) is None  # none joins
    assert ctl.pool.hosts() == []
    await ctl.pool.add_hosts("dev", "local.small", ttl_hours=1)
    _open_after_planning(ctl, gate)
    got = await asyncio.wait_for(ctl.pool.host_for(1, 256, "linux", None, timeout=60, buy=False), 90)
    assert got == "dev-1" and ctl.pool.row("dev-1")["state"] == "joined"
    assert [x.name for x in ctl.pool.hosts()] == ["dev-1"]


def test_scale_in_does_not_count_a_booting_machines_room(aws, monkeypatch):
    # a host is cordoned when the other hosts have room for its VMs: room that is still
    # booting cannot take them yet
    from fuse.controller.pool import reconcile as rec

    client, ctl = aws
    r = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium", "region": "us-west-2",
                                            "count": 1, "ttl_hours": 3})
    assert r.status_code == 201, r.text
    assert any(h.get("joins_in_secs") for h in ctl.pool_snapshot())  # the booting machine is in the plans' pool
    seen = {}

    def decide(rows, loads, room, now, horizon):
        seen["room"] = dict(room)
        return []

    monkeypatch.setattr(rec, "decide", decide)
    asyncio.run(rec.reconcile(ctl.pool))
    assert "aws-1" not in seen["room"], seen["room"]
