"""The elastic pool's pure rules: the elastic host lifecycle table, billing, and scale-in decisions."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import pytest

from fuse.controller.pool.elastic_host import (TRANSITIONS, billed_secs, committed_usd, ends_on_its_own, month_usd,
                                               paid_until, pending_usd, to_record)
from fuse.controller.pool.reconcile import Load, decide

NOW = datetime(2026, 12, 15, 12, 0, tzinfo=timezone.utc).timestamp()


def row(name="aws-1", *, state="joined", started=NOW - 600, ended=None, step=3600, minimum=0, usd=1.0, pinned=False,
        expires=0, planned_until=0, cloud_id="i-1"):
    return {"name": name, "state": state, "started": started, "ended": ended, "billing_step_secs": step,
            "billing_min_secs": minimum, "usd_per_hour": usd, "pinned": pinned, "expires": expires,
            "provider": "aws", "type_name": "m7i.large", "region": "us-west-2", "cloud_id": cloud_id,
            "record": {"planned_until": planned_until}}


# ---- lifecycle ---------------------------------------------------------------------------------------------------
ALLOWED = {
    ("creating", "booting"), ("creating", "gone"),
    ("booting", "joined"), ("booting", "offline"), ("booting", "gone"),
    ("joined", "cordoned"), ("joined", "offline"), ("joined", "gone"),
    ("cordoned", "joined"), ("cordoned", "offline"), ("cordoned", "gone"),
    ("offline", "joined"), ("offline", "gone"),
}


@pytest.mark.parametrize("frm,to", list(itertools.product(TRANSITIONS, TRANSITIONS)),
                         ids=lambda v: v)
def test_every_pair_of_states_is_allowed_exactly_when_the_table_says(frm, to):
    assert (to in TRANSITIONS[frm]) == ((frm, to) in ALLOWED)


def test_gone_is_terminal():
    assert TRANSITIONS["gone"] == frozenset()


# ---- billing -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("elapsed,step,minimum,billed", [
    (0, 3600, 0, 3600),      # the first step is paid the moment it starts
    (10, 1, 60, 60),         # per-second billing with a one-minute minimum
    (61, 1, 60, 61),
    (3601, 3600, 0, 7200),   # a second into the next hour buys the whole hour
], ids=["a new machine has paid its first step", "the minimum applies", "then every second",
        "hourly billing rounds up"])
def test_billed_seconds_are_whole_steps_and_at_least_the_minimum(elapsed, step, minimum, billed):
    r = row(started=NOW - elapsed, step=step, minimum=minimum)
    assert billed_secs(r, NOW) == billed
    assert paid_until(r, NOW) == NOW - elapsed + billed


def test_a_gone_host_stops_being_billed_when_it_ended():
    r = row(started=NOW - 10_000, ended=NOW - 9_000, step=1, usd=3.6)
    assert billed_secs(r, NOW) == 1000
    assert month_usd(r, NOW) == pytest.approx(1.0)


def test_month_usd_counts_only_this_months_part():
    month = datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    r = row(started=month - 1800, step=1, usd=3.6)  # started half an hour before the month
    assert month_usd(r, NOW) == pytest.approx((NOW - month) * 3.6 / 3600)


def test_a_machine_the_cloud_refused_costs_nothing():
    assert month_usd(row(state="gone", cloud_id="", ended=NOW - 500), NOW) == 0


def test_a_machine_the_cloud_has_not_accepted_yet_is_committed_not_spent():
    """Review 28: hosts a stopped controller left `creating` counted as spent through the
    create lease, then settled `gone` and the month's spend went down ($1.50 to $0.31)."""
    creating = row(state="creating", cloud_id="", started=NOW - 600, step=1, usd=3.6)
    assert month_usd(creating, NOW) == 0
    assert pending_usd(creating, NOW) == pytest.approx(0.6)  # (the monthly cap counts it all the same)
    accepted = dict(creating, state="booting", cloud_id="i-1")
    assert month_usd(accepted, NOW) == pytest.approx(0.6) and pending_usd(accepted, NOW) == 0
    assert pending_usd(dict(creating, state="gone", ended=NOW - 10), NOW) == 0


def test_what_a_live_host_is_set_to_cost_counts_as_committed():
    pinned = row(started=NOW - 600, step=1, usd=3.6, expires=int(NOW + 3000))  # an hour's TTL, 10 min gone
    assert committed_usd(pinned, NOW) == pytest.approx(3.0)
    planned = row(started=NOW - 600, step=1, usd=3.6, planned_until=NOW + 1000)
    assert committed_usd(planned, NOW) == pytest.approx(1.0)
    assert committed_usd(row(started=NOW - 600, step=1), NOW) == 0  # nothing planned beyond now


@pytest.mark.parametrize("r, now, ends", [
    (row(pinned=True, expires=int(NOW + 3000)), NOW, NOW + 3000),
    (row(started=NOW - 600, planned_until=NOW + 1800), NOW, NOW + 3000),
    (row(started=NOW - 600, step=1, minimum=60, planned_until=NOW + 1800), NOW, NOW + 1800),
    (row(started=NOW - 600, planned_until=NOW - 60), NOW, NOW + 3000),
    (row(started=NOW - 600, planned_until=NOW - 60), NOW + 3600, NOW + 6600),
    (row(state="gone", started=NOW - 600, ended=NOW - 300, step=60, planned_until=NOW + 1800), NOW, NOW - 300),
], ids=["a TTL (added by hand): then", "a plan's machine: the paid end after its planned work (hourly billing)",
        "a plan's machine: its planned end (per-second billing)",
        "past its planned work: the end of its paid time now", "later, while VMs keep it: the paid end then",
        "gone: when its paid time ended"])
def test_expires_is_when_a_host_ends_on_its_own(r, now, ends):
    # seed 001: ElasticHost.expires "Unix seconds it ends on its own" -- never 0 for a plan's machine
    assert ends_on_its_own(r, now) == ends
    assert to_record(r, now).expires == int(ends)


# ---- scale-in ----------------------------------------------------------------------------------------------------
def test_an_idle_host_near_the_end_of_its_paid_time_is_removed_and_says_what_it_saves():
    r = row(started=NOW - 3550)  # 50 s of its hour left
    (d,) = decide([r], {}, {}, NOW)
    assert d.action == "remove" and d.saves_usd == pytest.approx(1.0) and "idle" in d.reason


def test_an_idle_host_with_paid_time_left_is_kept_until_then():
    r = row(started=NOW - 600)
    (d,) = decide([r], {}, {}, NOW)
    assert d.action == "keep" and d.until == int(NOW - 600 + 3600 - 120) and "idle" in d.reason


def test_a_host_added_by_hand_is_never_removed_by_the_scaler_only_by_its_ttl():
    kept, = decide([row(pinned=True, started=NOW - 3590, expires=int(NOW + 3600))], {}, {}, NOW)
    assert kept.action == "keep" and "by hand" in kept.reason
    ended, = decide([row(pinned=True, started=NOW - 3590, expires=int(NOW - 1))], {}, {}, NOW)
    assert ended.action == "remove" and "TTL" in ended.reason
    assert ended.saves_usd == pytest.approx(1.0)  # another hour-long step at $1/h (it said 0)


def test_a_ttl_ending_under_vms_cordons_instead_of_losing_them():
    r = row(pinned=True, expires=int(NOW - 1))
    (d,) = decide([r], {"aws-1": Load(vms=(512,), mem_mib=4096)}, {}, NOW)
    assert d.action == "cordon"


def test_the_least_used_host_is_cordoned_when_the_others_have_room_for_its_vms():
    a, b = row("aws-1"), row("aws-2")
    loads = {"aws-1": Load(vms=(1024, 1024), mem_mib=8192), "aws-2": Load(vms=(512,), mem_mib=8192)}
    room = {"aws-1": (6144, 10), "aws-2": (7680, 10)}
    by = {d.host: d for d in decide([a, b], loads, room, NOW)}
    assert by["aws-2"].action == "cordon" and "least used" in by["aws-2"].reason
    assert by["aws-1"].action == "keep" and "2 VMs" in by["aws-1"].reason


def test_no_host_is_cordoned_when_the_others_cannot_take_its_vms():
    a, b = row("aws-1"), row("aws-2")
    loads = {"aws-1": Load(vms=(4096,), mem_mib=8192), "aws-2": Load(vms=(2048,), mem_mib=8192)}
    room = {"aws-1": (1024, 10), "aws-2": (6144, 10)}  # aws-1 has 1 GiB free: aws-2's 2 GiB VM does not fit
    assert all(d.action == "keep" for d in decide([a, b], loads, room, NOW))


def test_no_host_is_cordoned_for_room_on_a_host_the_same_pass_removes():
    # idle "aws-2" goes now (its paid time ends): its room is no place for busy "aws-1"'s VM
    busy, idle = row("aws-1"), row("aws-2", started=NOW - 3550)
    loads = {"aws-1": Load(vms=(1024,), mem_mib=2048), "aws-2": Load(mem_mib=2048)}
    room = {"aws-1": (1024, 3), "aws-2": (2048, 4)}
    by = {d.host: d for d in decide([busy, idle], loads, room, NOW)}
    assert by["aws-2"].action == "remove"
    assert by["aws-1"].action == "keep", by["aws-1"]


# own1 has 596 MiB free; aws-1 and aws-2 each run one 512 MiB VM on 8 GiB
ROOM = {"own1": (596, 8), "aws-1": (7680, 9), "aws-2": (7680, 9)}


@pytest.mark.parametrize("first, room", [
    (row("aws-1", state="cordoned"), ROOM),
    (row("aws-1", state="cordoned"), {"aws-1": (7680, 9), "aws-2": (7680, 9)}),
    (row("aws-1", pinned=True, expires=int(NOW - 1)), ROOM),
], ids=["a host an earlier pass cordoned holds the room its VMs need",
        "a cordoned host is no room for another's VMs",
        "so does a host cordoned for its TTL in the same pass"])
def test_a_second_host_is_not_cordoned_against_room_promised_to_a_cordoned_hosts_vms(first, room):
    # pass 2 cordoned aws-2 against the 596 MiB pass 1 counted for aws-1's VM: both stayed paid
    loads = {"aws-1": Load(vms=(512,), mem_mib=8192), "aws-2": Load(vms=(512,), mem_mib=8192)}
    by = {d.host: d for d in decide([first, row("aws-2")], loads, room, NOW)}
    assert by["aws-2"].action == "keep", by["aws-2"]
    assert by["aws-1"].action == ("cordon" if first["pinned"] else "keep")
    if "own1" in room:
        assert "held for the 1 VMs of aws-1" in by["aws-2"].reason, by["aws-2"].reason


def test_a_host_is_cordoned_when_the_others_have_room_for_its_vms_and_a_cordoned_hosts():
    loads = {"aws-1": Load(vms=(512,), mem_mib=8192), "aws-2": Load(vms=(512,), mem_mib=8192)}
    by = {d.host: d for d in decide([row("aws-1", state="cordoned"), row("aws-2")], loads,
                                    ROOM | {"own1": (1100, 8)}, NOW)}
    assert by["aws-2"].action == "cordon" and "the 1 VMs of aws-1 (cordoned)" in by["aws-2"].reason
    assert by["aws-1"].action == "keep" and by["aws-1"].reason == "cordoned; 1 VMs on it"


def test_an_idle_machine_a_plan_bought_is_kept_until_its_planned_work_ends():
    (d,) = decide([row(started=NOW - 60, step=1, planned_until=NOW + 3600)], {}, {}, NOW)
    assert d.action == "keep" and "planned" in d.reason and d.until == int(NOW + 3600)
    # a short plan's machine too, though its planned end is within the horizon: the VMs it was
    # bought for may not be created yet (it was removed 8 s after it was bought for 2 minutes)
    (d,) = decide([row(started=NOW - 8, step=1, planned_until=NOW + 112)], {}, {}, NOW)
    assert d.action == "keep" and "planned" in d.reason
    (d,) = decide([row(started=NOW - 4000, step=1, planned_until=NOW - 10)], {}, {}, NOW)
    assert d.action == "remove"


def test_a_host_keeping_prewarmed_vms_is_kept():
    (d,) = decide([row(started=NOW - 3590)], {"aws-1": Load(prewarmed=2, mem_mib=4096)}, {}, NOW)
    assert d.action == "keep" and "prewarmed" in d.reason


def test_gone_hosts_get_no_decision():
    assert decide([row(state="gone")], {}, {}, NOW) == []


async def test_a_machine_whose_create_never_answered_is_given_up_and_says_where_to_look(tmp_path):
    import time as time_

    from fuse.controller.service import Controller
    from fuse.controller.store import elastic_hosts

    ctl = Controller(tmp_path / "ctl")
    try:
        old = time_.time() - 3600
        with ctl.store.tx() as c:
            c.execute(elastic_hosts.insert().values(
                name="aws-7", provider="aws", type_name="m7i.large", region="us-west-2", cloud_id="", state="creating",
                started=old, ended=None, expires=0, usd_per_hour=0.1, billing_step_secs=1, billing_min_secs=60,
                boot_secs=90, pinned=0, token="t", record={}, updated_at=old))
        await ctl.pool.tick()
        row = ctl.pool.row("aws-7")
        assert row["state"] == "gone" and "Name=aws-7" in row["record"]["reason"]
        assert ctl.pool.budget().month_usd == 0  # never accepted by the cloud: nothing billed
    finally:
        ctl.store.close()
