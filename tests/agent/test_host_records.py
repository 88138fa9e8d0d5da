"""The VM state table, the event log and metering: small and exact."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import pytest

from fuse.agent.events import EventLog
from fuse.agent.metering import Metering
from fuse.agent.vms import TRANSITIONS, VmManager
from fuse.errors import Conflict, InvalidArgument
from fuse.models.vm import Vm, VmShape

PAIRS = list(itertools.product(TRANSITIONS, TRANSITIONS))


@pytest.mark.parametrize("before, after", PAIRS, ids=[f"{a} to {b}" for a, b in PAIRS])
async def test_every_transition_is_allowed_or_refused_by_the_table(tmp_path, before, after):
    mgr = VmManager(tmp_path, "qemu", ram_mb=1024, cpus=1)
    vm = Vm(name="v", state=before, shape=VmShape(vcpus=1, mem_mib=64), entry="true", bundle="linux",
            bundle_fingerprint="f", created_at=datetime.now(timezone.utc))
    mgr.vms["v"] = vm
    if after in TRANSITIONS[before]:
        mgr.transition(vm, after)
        assert vm.state == after and vm.history[-1]["state"] == after
        assert mgr.events.list()[-1] == {**mgr.events.list()[-1], "type": "vm_state", "vm": "v",
                                        "from": before, "to": after}
        if after != "deleted":  # persisted, so a restarted agent knows it
            assert Vm.model_validate_json((tmp_path / "vms/v/vm.json").read_text()).state == after
    else:
        with pytest.raises(Conflict):
            mgr.transition(vm, after)
        assert vm.state == before and mgr.events.list() == []
    mgr.events.close()


def test_deleted_is_terminal_and_every_state_can_reach_it():
    assert TRANSITIONS["deleted"] == frozenset()
    assert all("deleted" in to for state, to in TRANSITIONS.items() if state != "deleted")


def test_event_ids_increase_across_restarts_and_pages_are_bounded(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    for i in range(10):
        log.emit("tick", n=i)
    assert [e["id"] for e in log.list(since=3, limit=4)] == [4, 5, 6, 7]
    with pytest.raises(InvalidArgument):
        log.list(limit=501)
    log.close()
    again = EventLog(tmp_path / "events.jsonl")
    assert again.emit("tock")["id"] == 11 and len(again.list(limit=500)) == 11
    assert again.list(since=11) == []
    again.close()


async def test_events_over_http_reject_a_page_over_500(make_host):
    host = await make_host(bundle=False)
    r = await host.client.get("/v1/host/events", params={"limit": 501})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument")
    r = await host.client.get("/v1/host/events", params={"since": 0, "wait_s": 0.2})
    assert r.json() == {"events": [], "next": 0, "last_id": 0}


def test_usage_clips_segments_to_the_window_and_totals_are_exact(tmp_path):
    m = Metering(tmp_path / "metering.json")
    m.start("a", 128, None, now=100.0)
    m.segments[-1]["cpu_s"] = 5.0
    m.stop("a", now=110.0)
    m.state_written("a", 60_000_001, now=110.0)
    m.start("a", 128, None, now=120.0)
    m.segments[-1]["cpu_s"] = 1.0
    m.stop("a", now=130.0)
    m.start("b", 256, None, now=105.0)
    m.stop("b", now=106.5)

    whole = m.usage(0, 200, now=200)
    a = next(r for r in whole["vms"] if r["vm"] == "a")
    assert a == {"vm": "a", "cpu_seconds": 6.0, "mem_mib_seconds": 2560.0, "wall_seconds": 20.0,
                 "state_bytes_written": 60_000_001}
    assert whole["totals"] == {"cpu_seconds": 6.0, "mem_mib_seconds": 2560.0 + 384.0, "wall_seconds": 21.5,
                               "state_bytes_written": 60_000_001}

    half = m.usage(105, 125, now=200)  # half of a's first segment, half of its second
    a = next(r for r in half["vms"] if r["vm"] == "a")
    assert (a["wall_seconds"], a["cpu_seconds"], a["state_bytes_written"]) == (10.0, 3.0, 60_000_001)
    assert Metering(tmp_path / "metering.json").usage(0, 200, now=200) == whole  # persisted


async def test_usage_over_http_takes_unix_or_iso_times(make_host):
    host = await make_host(bundle=False)
    for params in ({"from": "0"}, {"from": "2024-01-01T00:00:00Z", "to": "2030-01-01T00:00:00+00:00"}):
        r = await host.client.get("/v1/host/usage", params=params)
        assert r.status_code == 200 and r.json()["vms"] == []
    r = await host.client.get("/v1/host/usage", params={"from": "yesterday"})
    assert r.status_code == 400
