"""The VM state table, the event log and metering: small and exact."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from decimal import Decimal

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
    vm = Vm(name="v", state=before, shape=VmShape(vcpus=1, mem_mib=128), entry="true", bundle="linux",
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


async def test_sleeping_a_sleeping_vm_or_waking_a_running_one_is_refused_but_a_moves_calls_repeat(make_host):
    """Neither sleeping -> sleeping nor running -> running is in the table, so
    each is 409 conflict. The calls a move makes carry its id and may be
    repeated (a retry, a controller resuming after a crash): they answer as
    the first did."""
    host = await make_host(backend="fake")
    r = await host.client.post("/v1/host/vms", json={"name": "v", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "true"})
    assert r.status_code == 201, r.text

    async def call(action: str, body: dict | None = None) -> tuple[int, str, dict]:
        r = await host.client.post(f"/v1/host/vms/v/{action}", json=body or {})
        return r.status_code, r.json().get("error", {}).get("code", ""), r.json()

    status, code, body = await call("wake")
    assert (status, code) == (409, "conflict") and "already running" in body["error"]["message"]
    assert (await call("sleep"))[2]["state"] == "sleeping"
    status, code, body = await call("sleep")
    assert (status, code) == (409, "conflict") and "already sleeping" in body["error"]["message"]
    states = [e["to"] for e in host.vms.events.list() if e["type"] == "vm_state"]
    assert states == ["creating", "running", "sleeping"]  # a refusal changes nothing

    # A sleeping VM's move marks it by sleeping it; again for the same move is the same answer.
    for _ in range(2):
        status, _, vm = await call("sleep", {"move_id": "m1"})
        assert (status, vm["state"], vm["move_id"]) == (200, "sleeping", "m1")
    assert (await call("sleep"))[:2] == (409, "move_in_progress")
    for _ in range(2):  # the move ends and clears its mark, or its recovery does it again
        status, _, vm = await call("wake", {"move_id": "m1", "clear_mark": True})
        assert (status, vm["state"], vm["move_id"]) == (200, "sleeping", None)

    assert (await call("wake"))[2]["state"] == "running"
    # A retried wake of a move's target, and a move bringing home a VM it
    # never slept, find it running: no refusal, no change.
    for body in ({"move_id": "m1"}, {"move_id": "m1", "if_marked": True}):
        status, _, vm = await call("wake", body)
        assert (status, vm["state"]) == (200, "running")
    assert [e["to"] for e in host.vms.events.list() if e["type"] == "vm_state"][-1] == "running"


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


def test_events_older_than_the_memory_window_are_served_from_disk_before_and_after_a_restart(tmp_path, monkeypatch):
    # a controller away while more than KEEP events happened (or the agent restarted since)
    # had the oldest ones skipped: the page started at the window's first id
    from fuse.agent import events

    monkeypatch.setattr(events, "KEEP", 7)
    monkeypatch.setattr(events, "BLOCK", 4)
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for i in range(40):
        log.emit("tick", n=i)

    def read_all(log):
        got, since = [], 0
        while page := log.list(since=since, limit=5):
            got += page
            since = page[-1]["id"]
        return got

    assert [e["id"] for e in read_all(log)] == list(range(1, 41))
    assert [e["n"] for e in log.list(since=2, limit=3)] == [2, 3, 4]
    log.close()
    again = EventLog(path)  # keeps only the last KEEP in memory
    assert [e["id"] for e in read_all(again)] == list(range(1, 41))
    again.close()


def test_an_event_after_a_torn_last_line_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.emit("tick")
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"id":2,"ti')  # a crash mid-write
    again = EventLog(path)
    assert again.emit("tock")["id"] == 2
    again.close()
    third = EventLog(path)  # the torn text did not take the next event's line with it
    assert [(e["id"], e["type"]) for e in third.list(limit=10)] == [(1, "tick"), (2, "tock")]
    third.close()


def test_an_id_whose_line_a_crash_tore_out_is_never_given_again(tmp_path):
    """Review 21: a power loss cut the last line (id 2, already read by a controller); the
    restarted agent gave 2 to its next event, which the controller, holding a 2, never took."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.emit("tick")
    log.emit("served")
    log.close()
    path.write_bytes(path.read_bytes()[:-12])  # the last line cut short
    again = EventLog(path)
    assert again.emit("tock")["id"] == 3
    assert [(e["id"], e["type"]) for e in again.list(limit=10)] == [(1, "tick"), (2, "events_lost"), (3, "tock")]
    again.close()


@pytest.mark.parametrize("lose", ["rotated away", "restored from an older copy"])
def test_a_log_that_lost_its_tail_goes_on_from_its_ids(tmp_path, lose):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for i in range(3):
        log.emit("tick", n=i)
    older = path.read_bytes()
    for i in range(3, 5):
        log.emit("tick", n=i)
    log.close()
    if lose == "rotated away":
        path.rename(tmp_path / "events.jsonl.1")
    else:
        path.write_bytes(older)
    again = EventLog(path)
    assert again.emit("after")["id"] == 6  # (a controller's cursor at 5 takes it)
    assert [e["type"] for e in again.list(since=5)] == ["after"]
    lost = [e["id"] for e in again.list(limit=10) if e["type"] == "events_lost"]
    assert lost == ([] if lose == "rotated away" else [4, 5])
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


@pytest.mark.parametrize("params,window", [
    ({}, (0, None)),
    ({"from": "1761955200", "to": "1761958800"}, (1761955200, 1761958800)),
    ({"from": "1761955200.0", "to": "1761958800.5"}, (1761955200, 1761958800.5)),
    ({"from": "2025-11-01T00:00:00Z", "to": "2025-11-01T01:00:00Z"}, (1761955200, 1761958800)),
], ids=["no window: 0 to now", "unix seconds", "a fraction of a second is kept", "ISO 8601"])
async def test_usage_over_http_echoes_whole_seconds_as_integers(make_host, params, window):
    import time
    host = await make_host(bundle=False)
    t0 = time.time()
    body = (await host.client.get("/v1/host/usage", params=params)).json()
    assert body["from"] == window[0] and type(body["from"]) is type(window[0])
    if window[1] is None:  # now, rounded up to the second
        assert type(body["to"]) is int and t0 <= body["to"] <= time.time() + 1
    else:
        assert body["to"] == window[1] and type(body["to"]) is type(window[1])


@pytest.mark.parametrize("params,why", [
    ({"from": "4102444800"}, "from is in the future: to defaults to now and must not be before from"),
    ({"from": "200", "to": "100"}, "to must not be before from"),
    ({"from": "inf"}, "from must be unix seconds or an ISO 8601 time"),
    ({"to": ""}, "to is empty: give unix seconds or an ISO 8601 time, or leave it out"),
], ids=["a from in the future, to left at now", "to before from", "a from that is no time", "an empty to"])
async def test_usage_over_http_refuses_a_window_ending_before_it_starts(make_host, params, why):
    host = await make_host(bundle=False)
    r = await host.client.get("/v1/host/usage", params=params)
    assert r.status_code == 400 and r.json()["error"] == {"code": "invalid_argument", "message": why}


async def test_a_since_beyond_the_newest_event_is_read_as_the_newest(make_host):
    # as the controller's merged stream reads it: the cursor handed back is a real
    # one, and the long poll waits for what comes after the newest, like any other
    host = await make_host(bundle=False)
    for _ in range(3):
        host.vms.events.emit("tick")
    r = await host.client.get("/v1/host/events", params={"since": 10})
    assert r.json() == {"events": [], "next": 3, "last_id": 3}

    poll = asyncio.create_task(host.client.get("/v1/host/events", params={"since": 10, "wait_s": 10}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    host.vms.events.emit("tock")  # id 4: newer than the newest, older than since
    body = (await asyncio.wait_for(poll, 5)).json()
    assert [e["type"] for e in body["events"]] == ["tock"] and body["next"] == body["last_id"] == 4

    t0 = time.monotonic()  # nothing new: it waits its whole wait_s
    body = (await host.client.get("/v1/host/events", params={"since": 99, "wait_s": 0.5})).json()
    assert time.monotonic() - t0 >= 0.5 and body == {"events": [], "next": 4, "last_id": 4}


async def test_usage_over_http_is_exact_for_two_16_gib_vms_held_a_month(make_host):
    # 17 significant digits: more than a float holds. The body's numbers are exact, every
    # total is the sum of its rows, and a row's MiB·s is its MiB × its wall seconds.
    host = await make_host(bundle=False)
    t0, m = 1_700_000_000.0, host.vms.metering
    for vm, held in (("a", 2_592_000.1234567), ("b", 2_592_000.7654321)):
        m.start(vm, 16384, None, now=t0)
        m.segments[-1]["cpu_s"] = held / 3
        m.stop(vm, now=t0 + held)
    r = await host.client.get("/v1/host/usage", params={"from": "0", "to": str(int(t0) + 3_000_000)})
    body = json.loads(r.content, parse_float=Decimal)
    rows = body["vms"]
    assert [row["vm"] for row in rows] == ["a", "b"]
    for figure in ("cpu_seconds", "mem_mib_seconds", "wall_seconds", "state_bytes_written"):
        assert body["totals"][figure] == sum(row[figure] for row in rows), figure
    assert [row["wall_seconds"] for row in rows] == [Decimal("2592000.123457"), Decimal("2592000.765432")]
    assert all(row["mem_mib_seconds"] == 16384 * row["wall_seconds"] for row in rows)
    assert body["totals"]["mem_mib_seconds"] == Decimal("84934670563.557376")


def test_a_cpu_reading_is_on_disk_within_a_second_and_before_it_is_reported(tmp_path):
    # An agent crash loses at most PERSIST_S of CPU readings, and never one it reported
    # (the file is written at most once a second for them, not at every reading)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    path = tmp_path / "metering.json"
    try:
        m = Metering(path)
        m.start("v", 64, busy.pid)
        writes, real_save = [], m.save
        m.save = lambda: (writes.append(1), real_save())
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            m.sample("v")
            time.sleep(0.01)
        assert 2 <= len(writes) <= 3
        assert Metering(path).segments[-1]["cpu_s"] > 0

        reported = m.usage()["vms"][0]["cpu_seconds"]
        busy.kill()  # its process gone, what a restarted agent reports is what is on disk
        busy.wait()
        assert Metering(path).usage()["vms"][0]["cpu_seconds"] >= reported > 0
        seen = m.segments[-1]["seen"]
        m.stop("v", now=m.segments[-1]["start"])  # an end read before it was last seen alive
        assert Metering(path).segments[-1]["end"] >= seen
    finally:
        busy.kill()
        busy.wait()


def test_metering_puts_when_a_vm_was_last_seen_on_disk_every_few_seconds_even_idle(tmp_path, monkeypatch):
    """The end of a VM whose process ends while the agent is down is when it was last seen
    alive: an idle VM (its CPU reading unchanged) has that persisted too, at least every
    SEEN_PERSIST_S, not only when its CPU reading changes."""
    from fuse.agent import metering as m

    clock = [1000.0]
    monkeypatch.setattr(m, "cpu_seconds", lambda pid: 1.0)
    monkeypatch.setattr(m.time, "monotonic", lambda: clock[0])
    meter = m.Metering(tmp_path / "metering.json")
    meter.start("idle", 128, pid=1, now=10.0)
    clock[0] += m.PERSIST_S
    meter.sample("idle")  # the first reading changes the CPU figure: saved
    on_disk = lambda: json.loads((tmp_path / "metering.json").read_text())["segments"][0].get("seen")  # noqa: E731
    first = on_disk()
    assert first is not None
    clock[0] += m.SEEN_PERSIST_S / 2
    meter.sample("idle")
    assert on_disk() == first  # (unchanged CPU: not written every tick)
    clock[0] += m.SEEN_PERSIST_S
    meter.sample("idle")
    assert on_disk() > first and meter.last_seen("idle") == on_disk()
