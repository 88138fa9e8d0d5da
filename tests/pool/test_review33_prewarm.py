"""Review 33, the pool's prewarms against a real controller and its `local` (fake) cloud:

- a prewarm pinned to a host (``on: host:NAME``) is refused (409 ``fleet_full``, saying the
  room) when the host's room is promised to another prewarm's VMs still to be created (memory
  or VM slots): it was accepted while a fill pass was busy, and sat at 0 ready for its TTL;
- the backoff counts only machines bought for the prewarm: one added by hand that it was placed
  on, ended by the cloud, made the first machine bought for it back off instead of being
  rebought at once;
- a machine added by hand with a prewarm pinned to it ends at its TTL, taking the prewarm with
  it (``prewarm_removed``, saying so): it stayed, billed and back in placement."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import pytest

import fuse
from support import start_controller, wait_until

S1 = {"name": "s1", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 1.0, "boot_secs": 2}
SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}


def agent_pid(ctl, name: str) -> int:
    (rec,) = (ctl.state_dir / "clouds" / "dev").glob(f"**/{name}/machine.json")
    return json.loads(rec.read_text())["pid"]


def prewarm(client, pw_id: str) -> fuse.Prewarm | None:
    return next((p for p in client.pool.prewarms() if p.id == pw_id), None)


def joined(client, n: int) -> bool:
    return sum(h.state == "joined" for h in client.pool.cloud_hosts()) >= n


@pytest.mark.timeout(180)
@pytest.mark.parametrize("by", ["memory", "slots"])
def test_a_pinned_prewarm_is_refused_on_room_promised_to_another_prewarms_vms_to_come(tmp_path, procs, by):
    procs.append(ctl := start_controller(tmp_path))
    slots = by == "slots"
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [S1], **({"vm_count": 1} if slots else {})})
        client.pool.cloud_add_host("dev", "s1", None, 2, 1)
        wait_until(lambda: joined(client, 2), timeout=60, interval=0.3, what="two machines joined")
        mem = 128 if slots else 600  # (slots: memory for several, a slot for one)
        opts = {"count": 1, "cpus": 1, "memory_mb": mem, "ttl_secs": 600}
        # a fill pass kept busy: a prewarm pinned to a machine whose agent is stopped, its create waiting there
        stopped = agent_pid(ctl, "dev-2")
        os.kill(stopped, signal.SIGSTOP)
        try:
            client.pool.prewarm("linux", fuse.PrewarmOptions(**(opts | {"memory_mb": 128}), on="host:dev-2"))
            time.sleep(1)
            a = client.pool.prewarm("linux", fuse.PrewarmOptions(**opts, on="host:dev-1"))
            assert [(p.host, p.count) for p in a.placements] == [("dev-1", 1)]
            with pytest.raises(fuse.ApiError) as refused:  # (A's VM not created yet: its room is A's)
                client.pool.prewarm("linux", fuse.PrewarmOptions(**opts, on="host:dev-1"))
            assert refused.value.status == 409 and refused.value.code == "fleet_full", refused.value
            assert refused.value.message.startswith(
                f"host dev-1 has room for 0 of 1 VMs of 1 vCPUs and {mem} MiB (the rest of its room is held "
                "for other prewarms' VMs still to be created)"), refused.value.message
            assert [p.id for p in client.pool.prewarms() if p.placements[0].host == "dev-1"] == [a.id]
        finally:
            os.kill(stopped, signal.SIGCONT)
        wait_until(lambda: prewarm(client, a.id).ready == 1, timeout=60, interval=0.3, what="A ready")
        with pytest.raises(fuse.ApiError) as refused:  # (as once A's VM exists)
            client.pool.prewarm("linux", fuse.PrewarmOptions(**opts, on="host:dev-1"))
        assert refused.value.code == "fleet_full" and "room for 0 of 1 VMs" in refused.value.message
        for pw in client.pool.prewarms():
            client.pool.remove_prewarm(pw.id)
        client.pool.cloud_remove_host(["dev-1", "dev-2"])


@pytest.mark.timeout(180)
def test_a_hand_added_machine_the_prewarm_was_placed_on_is_no_purchase_of_its_backoff(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        client.pool.cloud_add_host("dev", "local.small", None, 1, 1)
        wait_until(lambda: joined(client, 1), timeout=60, interval=0.3, what="dev-1 joined")
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, on="dev", ttl_secs=600))
        assert [p.host for p in pw.placements] == ["dev-1"] and pw.new_hosts == []
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready on dev-1")

        os.kill(agent_pid(ctl, "dev-1"), signal.SIGKILL)  # the cloud ends the machine added by hand
        wait_until(lambda: prewarm(client, pw.id).new_hosts == ["dev-2"], timeout=60, interval=0.2,
                   what="dev-2 bought for the prewarm")
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready on dev-2")
        assert prewarm(client, pw.id).backoff_until == 0

        os.kill(agent_pid(ctl, "dev-2"), signal.SIGKILL)  # the first machine bought for it ends early: rebought
        now = wait_until(lambda: (p := prewarm(client, pw.id)) and (p.new_hosts[1:] or p.backoff_until) and p,
                         timeout=60, interval=0.2, what="dev-2 rebought, or a backoff")
        assert now.backoff_until == 0 and now.backoff_reason == "", now
        assert now.new_hosts == ["dev-2", "dev-3"], now
        assert not [e for e in client.events.list(0, limit=500)["events"] if e["type"] == "prewarm_backoff"]
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready on dev-3")
        assert client.pool.remove_prewarm(pw.id)


@pytest.mark.timeout(180)
def test_a_hand_added_machine_ends_at_its_ttl_with_its_pinned_prewarm(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [S1]})
        client.pool.cloud_add_host("dev", "s1", None, 1, 1)
        wait_until(lambda: joined(client, 1), timeout=60, interval=0.3, what="dev-1 joined")
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=128, on="host:dev-1",
                                                              ttl_secs=86400))
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready on dev-1")
        # its TTL comes now (ttl_hours is at least 1): the pool reads it from the store every pass
        with sqlite3.connect(ctl.state_dir / "fuse.db", timeout=30) as db:
            db.execute("UPDATE elastic_hosts SET expires = ? WHERE name = 'dev-1'", (int(time.time()),))

        def gone() -> bool:
            client.pool.cloud_reconcile()
            return [h.state for h in client.pool.cloud_hosts(include_gone=True)] == ["gone"]
        wait_until(gone, timeout=30, interval=0.5, what="dev-1 gone at its TTL")
        assert prewarm(client, pw.id) is None
        events = client.events.list(0, limit=500)["events"]
        (removed,) = [e for e in events if e["type"] == "prewarm_removed"]
        assert removed["prewarm"] == pw.id
        assert removed["reason"] == "the host it is pinned to, dev-1, ended at its TTL", removed
        assert client.pool.cloud_budget(fuse.ElasticBudgetUpdate()).running_usd_per_hour == 0
