"""Twenty-fourth session: a drain and a prewarm's standby VMs. Real controller, fake-backend agents."""

from __future__ import annotations

import pytest

import fuse
from support import agent_states
from test_prewarm import ready
from test_review16_prewarm import fleet, register, standby_on


@pytest.mark.timeout(240)
def test_a_drain_hands_a_prewarms_standby_vms_to_the_prewarm_which_places_them_elsewhere(tmp_path, procs):
    """(was: the drain tried to move them, the agent refused ("standby ... claim or delete it"),
    both were reported stuck, the host stayed draining with them, and the prewarm sat at 0
    ready for good with another host empty: its refill moved standby VMs off cordoned hosts
    only)"""
    ctl, agents = fleet(tmp_path, procs, "a1", "a2")
    with fuse.Client(ctl.url) as client:
        register(client, "own1", agents["a1"])
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="host:own1"))
        ready(client, pw.id, 2, timeout=60)
        names = sorted(v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-"))
        # pinned there: nowhere else to go, so the drain says so (and leaves them)
        register(client, "own2", agents["a2"])
        report = client.hosts.drain("own1")
        assert report["moved"] == [] and report["prewarmed"] == [], report
        assert [(s["vm"], s["code"]) for s in report["stuck"]] == [(n, "standby") for n in names], report
        assert "its prewarm places it again on another host" in report["stuck"][0]["reason"]
        client.hosts.uncordon("own1")
        assert client.pool.remove_prewarm(pw.id)

        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 2, timeout=60)
        (host,) = standby_on(client, pw.id)
        other = {"own1": "own2", "own2": "own1"}[host]
        names = sorted(v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-"))
        client.vms.create(name="work", host=host, shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
        report = client.hosts.drain(host)
        assert report["stuck"] == [] and [m["vm"] for m in report["moved"]] == ["work"], report
        assert report["prewarmed"] == names, report
        assert standby_on(client, pw.id) == {other: 2}
        assert agent_states(agents["a1" if host == "own1" else "a2"]) == {}  # (nothing left on the drained host)
        assert ready(client, pw.id, 2, timeout=30).ready == 2
        client.hosts.deregister(host)  # (empty: it goes)
