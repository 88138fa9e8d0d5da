"""Twenty-ninth session: a controller killed while it ended a prewarm (its row goes first)
or while it bought for one not stored yet left the machines bought for it idle and billed
until the prewarm's TTL — 10 days, or for good — with no prewarm left to end them (review:
`reconcile` kept them, "bought for work planned until ..."). Machines keep the prewarm
they were bought for; one whose prewarm is no more goes once idle, as after a removal."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from types import SimpleNamespace

import fuse
from fuse.controller.service import Controller
from support import reap, start_controller, wait_until

TYPES = [{"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}]


def test_a_machine_whose_prewarm_a_killed_controller_lost_goes_once_idle(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": TYPES})
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, ttl_secs=864000))
        (machine,) = pw.new_hosts
        wait_until(lambda: next(p for p in client.pool.prewarms()).ready == 1, timeout=60, what="1 ready")
        # (a prewarm kept, as alive: its machine is planned for it)
        assert [d.action for d in client.pool.cloud_reconcile() if d.host == machine] == ["keep"]
    # killed right after the prewarm's row went (its standby VM, and its machine, not yet)
    ctl.popen.send_signal(signal.SIGKILL)
    ctl.popen.wait(10)
    db = sqlite3.connect(ctl.state_dir / "fuse.db")
    with db:
        assert db.execute("DELETE FROM prewarms WHERE id = ?", (pw.id,)).rowcount == 1
        (record,) = db.execute("SELECT record FROM elastic_hosts WHERE name = ?", (machine,)).fetchone()
    db.close()
    assert f'"prewarm": "{pw.id}"' in record.replace('":"', '": "')  # (the machine names its prewarm)
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        assert client.pool.prewarms() == []
        decisions = wait_until(lambda: [d for d in client.pool.cloud_reconcile() if d.host == machine
                                        and d.action != "keep"] or None, timeout=60, what="the machine let go")
        assert decisions[0].action in ("remove", "cordon"), decisions
        wait_until(lambda: machine not in [h.name for h in client.pool.cloud_hosts() if h.state != "gone"],
                   timeout=90, what="the machine removed")


async def test_a_host_removed_by_hand_stays_so_when_a_pass_read_it_before(tmp_path):
    """(review: a pool pass that read the rows, then asked the cloud while the host was removed
    by hand, found the machine terminated and marked it "the cloud ended the machine" — gone
    again, ``ended_by_cloud`` set, its end moved later)"""
    ctl = Controller(tmp_path / "ctl", poll_interval=0.2)
    await ctl.start()
    try:
        await ctl.pool.link("dev", "local", {"backend": "fake", "types": TYPES})
        (h,) = await ctl.pool.add_hosts("dev", "local.small", ttl_hours=1)
        started = time.monotonic()
        while ctl.pool.row(h.name)["state"] != "joined":
            assert time.monotonic() - started < 60, ctl.pool.row(h.name)
            await asyncio.sleep(0.2)
        stale = ctl.pool.row(h.name)  # (as a pass read it before it asked the cloud)
        assert (await ctl.pool.remove_hosts([h.name])).removed == [h.name]
        removed = ctl.pool.row(h.name)
        await ctl.pool._follow(stale, SimpleNamespace(id=stale["cloud_id"], state="terminated", address=""),
                               ctl.pool.provider("dev"), time.time())
        row = ctl.pool.row(h.name)
        assert row["state"] == "gone" and row["ended"] == removed["ended"], row
        assert row["record"]["reason"] == "removed by hand" and not row["record"].get("ended_by_cloud"), row["record"]
        assert len(row["record"]["history"]) == len(removed["record"]["history"])
        # and a second end asked of a gone host changes nothing of the first
        ctl.pool._transition(h.name, "gone", "the cloud ended the machine")
        assert ctl.pool.row(h.name) == row
    finally:
        await ctl.close()
        reap(tmp_path)


def test_a_reasons_time_says_its_date_when_it_is_not_today():
    """(review: a machine kept for work planned 10 days out read "planned until 16:26:43 UTC",
    a time of day already past, with no date)"""
    from fuse.controller.pool.reconcile import _clock

    now = 1796560000.0  # 2026-12-06 (UTC), mid-morning
    assert _clock(now + 3600, now) == time.strftime("%H:%M:%S UTC", time.gmtime(now + 3600))
    assert _clock(now + 10 * 86400, now) == time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now + 10 * 86400))
    assert _clock(now + 10 * 86400, now).startswith("2026-12-16 ")
