"""Review 32: a prewarm placed on a cloud machine that never joins (booting, then ``offline``:
silent for its boot time and the join grace, no longer offered) stayed there at 0 ready for
good, and a machine bought for it was kept ("idle; bought for work planned until ...") and paid
to the prewarm's TTL. Its placement goes where the prewarm's solve puts it now, and a machine
bought for it is then ended by scale-in as any idle one; a machine added by hand still ends at
its TTL.

A real controller process (``FUSE_PREWARM_AWAY_S`` short) with an aws cloud on a moto server
whose subnet is on loopback: no agent ever answers on its machines, so none joins. The join
timeout (boot time + 300 s) is reached by dating the machine's purchase back in the
controller's store, as ``test_review16_aws`` does in process."""

from __future__ import annotations

import sqlite3
import time

import pytest

import fuse
from fuse.controller.pool.elastic_host import JOIN_GRACE_SECS
from support import start_controller, wait_until

INSTANCE = "m7i.large"


@pytest.fixture
def aws_pool(tmp_path, link_aws):
    ctl = start_controller(tmp_path, env={"FUSE_PREWARM_AWAY_S": "1"})
    client = fuse.Client(ctl.url)
    link_aws(client)
    yield client, ctl
    for pw in client.pool.prewarms():
        client.pool.remove_prewarm(pw.id)
    client.pool.cloud_remove_host([h.name for h in client.pool.cloud_hosts()])
    client.close()
    ctl.stop()


def past_join_grace(ctl, host) -> None:
    """Date ``host``'s purchase back past its boot time and the join grace: the pool's next
    pass finds it silent that long and takes it ``offline``."""
    with sqlite3.connect(ctl.state_dir / "fuse.db", timeout=30) as db:
        boot = db.execute("SELECT boot_secs FROM elastic_hosts WHERE name = ?", (host,)).fetchone()[0]
        db.execute("UPDATE elastic_hosts SET started = ? WHERE name = ?",
                   (time.time() - boot - JOIN_GRACE_SECS - 10, host))


def state(client, name: str) -> str:
    return next(h.state for h in client.pool.cloud_hosts(include_gone=True) if h.name == name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("by_hand", [False, True], ids=[
    "a machine bought for the prewarm that never joins is left, and scale-in ends it",
    "a machine added by hand that never joins is left, and kept to its TTL"])
def test_a_prewarm_on_a_machine_that_never_joins_is_placed_again(aws_pool, by_hand):
    client, ctl = aws_pool
    if by_hand:
        (h,) = client.pool.cloud_add_host("aws1", INSTANCE, ttl_hours=1)
        assert h.state == "booting"
    opts = fuse.PrewarmOptions(on="aws1", kind="container", cpus=1, memory_mb=512, count=1, instance_type=INSTANCE)
    pw = client.pool.prewarm("linux", opts)
    assert [(p.host, p.count, p.ready) for p in pw.placements] == [("aws1-1", 1, 0)]
    assert pw.new_hosts == ([] if by_hand else ["aws1-1"])

    past_join_grace(ctl, "aws1-1")
    wait_until(lambda: state(client, "aws1-1") == "offline", timeout=30, interval=0.3, what="aws1-1 offline")
    wait_until(lambda: "aws1-1" not in {p.host for p in next(x for x in client.pool.prewarms()
                                                             if x.id == pw.id).placements},
               timeout=30, interval=0.3, what="the prewarm's VM placed off aws1-1")
    now = next(x for x in client.pool.prewarms() if x.id == pw.id)
    assert [(p.host, p.count) for p in now.placements] == [("aws1-2", 1)]  # (bought for it: nothing else here)
    assert now.new_hosts == ([] if by_hand else ["aws1-1"]) + ["aws1-2"]

    decisions = {d.host: d for d in client.pool.cloud_reconcile()}
    if by_hand:
        d = decisions["aws1-1"]
        assert d.action == "keep" and d.reason == "added by hand: it ends at its TTL", d
        assert state(client, "aws1-1") == "offline"
    else:
        # no work planned on it any more: idle past its paid time, removed (by this pass or the loop's)
        d = decisions.get("aws1-1")
        assert d is None or d.action == "remove", d
        assert state(client, "aws1-1") == "gone"
    assert state(client, "aws1-2") == "booting" and decisions["aws1-2"].action == "keep"


@pytest.mark.timeout(180)
def test_a_machine_that_never_joins_and_fills_the_cap_goes_and_the_prewarm_buys_again_within_it(aws_pool):
    # max_new_hosts=1 counts the machine offline too: nothing else can be bought while it is
    # there, so its VMs cannot leave it; it holds them for nothing, so scale-in ends it, and the
    # prewarm, its place lost, buys again within the cap
    client, ctl = aws_pool
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=1))
    opts = fuse.PrewarmOptions(on="aws1", kind="container", cpus=1, memory_mb=512, count=1, instance_type=INSTANCE)
    pw = client.pool.prewarm("linux", opts)
    assert pw.new_hosts == ["aws1-1"]

    past_join_grace(ctl, "aws1-1")
    wait_until(lambda: state(client, "aws1-1") == "offline", timeout=30, interval=0.3, what="aws1-1 offline")

    def removed() -> bool:
        client.pool.cloud_reconcile()
        return state(client, "aws1-1") == "gone"
    wait_until(removed, timeout=30, interval=0.5, what="aws1-1 removed by scale-in")
    wait_until(lambda: [(p.host, p.count) for p in next(x for x in client.pool.prewarms()
                                                         if x.id == pw.id).placements] == [("aws1-2", 1)],
               timeout=30, interval=0.3, what="the prewarm placed on aws1-2, bought within the cap")
    assert [h.name for h in client.pool.cloud_hosts()] == ["aws1-2"]


@pytest.mark.timeout(180)
def test_machines_that_never_join_one_after_another_back_the_prewarm_off(aws_pool):
    """(the diff review: each machine bought for it that never joined was replaced at once, one
    every boot time + 300 s for the prewarm's whole TTL — a broken image or network — where a
    machine the cloud ends early counts toward the backoff)"""
    client, ctl = aws_pool
    opts = fuse.PrewarmOptions(on="aws1", kind="container", cpus=1, memory_mb=512, count=1, instance_type=INSTANCE)
    pw = client.pool.prewarm("linux", opts)

    def now():
        return next(x for x in client.pool.prewarms() if x.id == pw.id)
    for host, then in (("aws1-1", "aws1-2"), ("aws1-2", None)):
        past_join_grace(ctl, host)
        wait_until(lambda: state(client, host) == "offline", timeout=30, interval=0.3, what=f"{host} offline")
        if then:  # the first: replaced at once (one early end is no pattern)
            wait_until(lambda: [(p.host, p.count) for p in now().placements] == [(then, 1)], timeout=30,
                       interval=0.3, what=f"placed on {then}")
    # the second in a row: nothing more is bought for a while, and it says why
    wait_until(lambda: now().backoff_until > time.time(), timeout=30, interval=0.3, what="the prewarm backing off")
    assert "never joined" in now().backoff_reason
    events = client.events.list(0, limit=500)["events"]
    assert [e for e in events if e["type"] == "prewarm_backoff" and e.get("prewarm") == pw.id]
    time.sleep(2)
    assert sorted(h.name for h in client.pool.cloud_hosts(include_gone=True)) == ["aws1-1", "aws1-2"]
