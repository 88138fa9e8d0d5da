"""The elastic pool on PostgreSQL replicas, as review 22 found it: a purchase through each of
two replicas at once both passed a $/h cap that allowed one (the check and the machines'
record are now one write transaction), and a prewarm of 3 claimed from through both kept 5
standby VMs and bought a machine for them (one replica fills at a time now).

Real controllers on a throwaway PostgreSQL, a ``local`` cloud of fake-backend agents."""

from __future__ import annotations

import threading
import time

import pytest

import fuse
from support import start_controller, wait_until
from test_prewarm import ready

SMALL = {"name": "small", "vcpus": 8, "mem_mib": 4096, "usd_per_hour": 0.02, "billing_step_secs": 60,
         "billing_min_secs": 60, "boot_secs": 1}

pytestmark = pytest.mark.postgres


@pytest.fixture
def two(tmp_path, procs, postgres, request):
    url = postgres.create_db(f"fuse_{request.node.name[-40:].lower()}")
    procs.append(a := start_controller(tmp_path, db=url, name="ctl-a"))
    procs.append(b := start_controller(tmp_path, db=url, name="ctl-b"))
    with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
        ca.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        wait_until(lambda: cb.pool.clouds(), timeout=30, what="the cloud seen by b")
        yield ca, cb
        for h in ca.pool.cloud_hosts():
            if h.state != "gone":
                for pw in ca.pool.prewarms():
                    ca.pool.remove_prewarm(pw.id)
                ca.pool.cloud_remove_host([h.name])


def test_two_purchases_through_two_replicas_at_once_keep_the_cap(two):
    ca, cb = two
    ca.pool.cloud_budget({"max_usd_per_hour": 0.03})  # room for one more small, not two
    got: dict[str, object] = {}

    def buy(who, client):
        try:
            got[who] = [h.name for h in client.pool.cloud_add_host("dev", "small")]
        except fuse.ApiError as exc:
            got[who] = exc.code
    ts = [threading.Thread(target=buy, args=(w, c)) for w, c in (("a", ca), ("b", cb))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert sorted(map(str, got.values())) == ["['dev-1']", "budget_exceeded"], got  # (was: both bought)
    assert ca.pool.cloud_budget().running_usd_per_hour <= 0.03


@pytest.mark.timeout(240)
def test_a_prewarm_claimed_through_two_replicas_keeps_its_count(two):
    ca, cb = two
    (machine,) = [h.name for h in ca.pool.cloud_add_host("dev", "small")]
    wait_until(lambda: ca.hosts.get(machine).connected and cb.hosts.get(machine).connected, timeout=60,
               what=f"{machine} joined on both")
    pw = ca.pool.prewarm("linux", fuse.PrewarmOptions(count=3, cpus=1, memory_mb=256, on="dev", ttl_secs=900))
    ready(ca, pw.id, 3, timeout=60)
    names = iter(range(100))
    ts = [threading.Thread(target=lambda c=c: c.vms.create({"name": f"c{next(names)}", "shape": {
        "vcpus": 1, "mem_mib": 256}, "entry": "x"})) for c in (ca, cb, ca, cb)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    time.sleep(10)  # (the refills of both replicas' passes)
    standby = [v for v in ca.vms.list() if v["name"].startswith(pw.id + "-")]
    assert len(standby) == 3, [v["name"] for v in standby]  # (was: 5, and a machine bought for them)
    assert [h.name for h in ca.pool.cloud_hosts() if h.state != "gone"] == [machine]
