"""Review 37: the agent's metering followed the wall clock. Stepped back an hour, the
running VMs dropped out of usage (their segments began "in the future") and a VM slept
meanwhile kept a 0 s segment; stepped forward again, every VM started meanwhile was billed
an extra hour. A segment's length is now measured on CLOCK_BOOTTIME (which nobody sets)
and the wall clock only places it for windows."""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import math
import os
import time
from decimal import Decimal

import httpx
import pytest

from fuse.agent import metering
from fuse.agent.metering import Metering, window
from support import start_agent

C = "2026-12-07T15:55:00Z"
HOUR = 3600.0


class Clocks:
    """``time`` as fuse.agent.metering reads it: CLOCK_BOOTTIME and the wall clock run together
    (by ``run``) and the wall clock alone can be stepped (``step``); the rest is the real module."""

    def __init__(self, wall: float = 1_796_652_900.0, boottime: float = 50_000.0):
        self.wall, self.boottime = wall, boottime

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.boottime += seconds

    def step(self, seconds: float) -> None:
        self.wall += seconds

    def time(self) -> float:
        return self.wall

    def clock_gettime(self, clock: int) -> float:
        return self.boottime if clock == time.CLOCK_BOOTTIME else time.clock_gettime(clock)

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def clocks(monkeypatch) -> Clocks:
    c = Clocks()
    monkeypatch.setattr(metering, "time", c)
    fresh_clock(monkeypatch)
    return c


def fresh_clock(monkeypatch) -> None:
    """Metering's reading of the clocks started anew (the last test's offset is not these clocks')."""
    if hasattr(metering, "Clock"):  # (metering before review 37 kept none)
        monkeypatch.setattr(metering, "CLOCK", metering.Clock())


def usage(m: Metering, start: float | None = None, to: float | None = None) -> dict[str, Decimal]:
    """Wall seconds per VM over the window GET /v1/host/usage takes (by default [0, now))."""
    t0, t1 = window(None if start is None else str(start), None if to is None else str(to))
    return {r["vm"]: r["wall_seconds"] for r in m.usage(t0, t1)["vms"]}


def lengths(m: Metering, vm: str) -> list[float]:
    return [s["end"] - s["start"] for s in m.segments if s["vm"] == vm and s["end"] is not None]


def test_a_wall_clock_stepped_back_and_forward_changes_no_length_and_hides_no_running_vm(
        tmp_path, clocks, caplog):
    # The review's run: v1, v2 run 20 s; the wall clock steps back an hour; v3 is created,
    # v1 sleeps 10 s and wakes; the clock steps forward an hour (to the true time again).
    m = Metering(tmp_path / "metering.json")
    true_t0 = clocks.wall
    m.start("v1", 128, None, created_at=C)
    m.start("v2", 128, None, created_at=C)
    clocks.run(20)
    assert usage(m) == {"v1": 20, "v2": 20}
    with caplog.at_level(logging.WARNING, logger="fuse.agent"):
        clocks.step(-HOUR)
        # both still run, 20 s each (was: {} — their segments began after the window's end)
        assert usage(m) == {"v1": 20, "v2": 20}
        clocks.run(5)
        m.start("v3", 128, None, created_at=C)
        clocks.run(5)
        m.stop("v1")  # slept after 30 s (was: a 0 s segment, ended at its start)
        assert lengths(m, "v1") == [30.0]
        clocks.run(10)
        m.start("v1", 128, None, created_at=C)  # woken
        clocks.run(5)
        assert usage(m) == {"v1": 35, "v2": 45, "v3": 20}
        clocks.step(HOUR)
        clocks.run(11)
        got = usage(m)
    # 56 s in all: v1 ran 30 + 16, v2 56, v3 31 (the review saw v1 3615.7, v2 50.9 and v3 3626.8)
    assert got == {"v1": 46, "v2": 56, "v3": 31}
    assert sum(got.values()) == 133
    # one line a step, not one a VM or a look
    steps = [r.getMessage() for r in caplog.records if "wall clock stepped" in r.getMessage()]
    assert len(steps) == 2 and "-3600.000 s" in steps[0] and "+3600.000 s" in steps[1], steps

    # The running VMs are where they ran on the wall clock as it is now (v3, started while it
    # was an hour behind, too); v1's ended segment keeps the place it had as it ended.
    assert usage(m, start=math.floor(true_t0)) == {"v1": 16, "v2": 56, "v3": 31}
    assert usage(m, start=math.floor(true_t0 - HOUR), to=math.ceil(true_t0)) == {"v1": 30}

    # on disk: open segments carry their boottime; ended ones are as they were (the archive's too)
    m.save()
    m.save()
    hot = json.loads(m.path.read_text())["segments"]
    assert sorted(s["vm"] for s in hot) == ["v1", "v2", "v3"]
    assert all(s["end"] is None and s["boot_id"] and "boottime" in s for s in hot)
    ended = [json.loads(line)["segment"] for line in m.archive.read_text().splitlines()]
    assert [(s["vm"], s["end"] - s["start"]) for s in ended] == [("v1", 30.0)]
    assert "boottime" not in ended[0] and "boot_id" not in ended[0]
    assert usage(Metering(m.path)) == got


def test_a_step_while_the_agent_was_down_changes_no_length(tmp_path, clocks, caplog):
    m = Metering(tmp_path / "metering.json")
    m.start("v", 256, None, created_at=C)
    clocks.run(10)
    m.sample("v")
    m.save()
    del m
    clocks.step(-HOUR)  # (the agent down: no look saw it)
    clocks.run(5)
    with caplog.at_level(logging.WARNING, logger="fuse.agent"):
        again = Metering(tmp_path / "metering.json")
        assert usage(again) == {"v": 15}
    assert sum("wall clock stepped" in r.getMessage() for r in caplog.records) == 1
    clocks.run(5)
    again.stop("v")
    assert lengths(again, "v") == [20.0]
    row = again.usage(0, math.ceil(clocks.wall))["vms"][0]
    assert row["wall_seconds"] == 20 and row["mem_mib_seconds"] == 20 * 256


def test_an_end_read_on_the_clock_before_it_stepped_back_is_not_after_now(tmp_path, clocks, monkeypatch):
    # A VM that ended while the agent was down, its end read from a file's mtime (a sleep's
    # state files, a delete's mark) written before the clock stepped back: on the clock as it
    # is now, that time is an hour ahead. The segment ends by now (the restart) at the latest.
    monkeypatch.setattr(metering, "cpu_seconds", lambda pid: 1.0)
    m = Metering(tmp_path / "metering.json")
    m.start("v", 128, None, created_at=C)
    clocks.run(10)
    m.sample("v")
    m.save()
    written = clocks.wall + 2  # (it ended 2 s after it was last seen)
    clocks.run(30)
    clocks.step(-HOUR)
    again = Metering(tmp_path / "metering.json")
    seen = again.last_seen("v")
    assert seen == clocks.wall - 30  # (placed as the clock reads now: 30 s ago)
    again.stop("v", now=max(seen, written))
    [length] = lengths(again, "v")
    assert 12 <= length <= 40  # (measured on the wall clock after the step, 3612)


def test_records_without_a_boottime_of_this_boot_are_measured_on_the_wall_clock_as_before(tmp_path, clocks):
    # An older agent's open segment (no boottime) and one from an earlier boot: the wall clock's.
    start = clocks.wall - 10
    path = tmp_path / "metering.json"
    path.write_text(json.dumps({"segments": [
        {"vm": "old", "created_at": C, "start": start, "end": None, "mem_mib": 64, "pid": None, "cpu_s": 0.0},
        {"vm": "reboot", "created_at": C, "start": start, "end": None, "mem_mib": 64, "pid": None, "cpu_s": 0.0,
         "boottime": 10.0, "boot_id": "an-earlier-boot"}], "writes": []}))
    m = Metering(path)
    assert usage(m) == {"old": 10, "reboot": 10}
    clocks.step(100)
    assert usage(m) == {"old": 110, "reboot": 110}
    m.stop("old")
    m.stop("reboot")
    assert lengths(m, "old") == lengths(m, "reboot") == [110.0]
    # explicit times (a console's last write, a mark's mtime) are taken as they are, to the microsecond
    m.start("v", 64, None, now=start + 0.25, created_at=C)
    m.stop("v", now=start + 7.000001)
    assert m.usage(0, math.ceil(clocks.wall))["vms"][-1]["wall_seconds"] == Decimal("6.750001")


async def test_an_agent_whose_wall_clock_steps_meters_its_fake_vms_by_how_long_they_ran(make_host, monkeypatch):
    # A real VmManager and router (in-process) with the fake backend's real processes; the wall
    # clock metering reads steps back an hour and forward again, CLOCK_BOOTTIME runs as it does.
    offset = [0.0]

    class Stepped:
        def time(self) -> float:
            return time.time() + offset[0]

        def __getattr__(self, name: str):
            return getattr(time, name)

    monkeypatch.setattr(metering, "time", Stepped())
    fresh_clock(monkeypatch)
    host = await make_host("agent", backend="fake")  # (its VMs deleted, its client closed after)
    vms, client = host.vms, host.client

    async def rows() -> dict[str, Decimal]:
        r = await client.get("/v1/host/usage")
        assert r.status_code == 200, r.text
        return {row["vm"]: row["wall_seconds"] for row in json.loads(r.content, parse_float=Decimal)["vms"]}

    began = time.monotonic()  # (before any VM: none can have run longer)
    for name in ("v1", "v2"):
        r = await client.post("/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 128},
                                                    "entry": "true"})
        assert r.status_code == 201, r.text
    await asyncio.sleep(1.5)
    offset[0] = -HOUR
    running = await rows()
    # both still there, each having run more than the 1.5 s waited (was: {})
    assert set(running) == {"v1", "v2"} and min(running.values()) > 1.4, running
    assert (await client.post("/v1/host/vms/v1/sleep")).status_code == 200
    slept = vms.metering.segments[0]
    assert slept["vm"] == "v1" and slept["end"] - slept["start"] > 1.4, slept  # (was 0 s)
    r = await client.post("/v1/host/vms/v1/wake", json={})
    assert r.status_code == 200, r.text
    offset[0] = 0.0
    await asyncio.sleep(1)
    after = await rows()
    ran = time.monotonic() - began
    # no VM billed beyond the time that passed (was: v1 an extra hour)
    assert set(after) == {"v1", "v2"} and all(1.4 < s <= ran + 1 for s in after.values()), (after, ran)


def _libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1")
                   + glob.glob("/usr/local/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def test_an_agent_process_whose_wall_clock_steps_meters_by_how_long_its_vms_ran(tmp_path, procs, monkeypatch):
    # The review's run on a whole agent (its own process, the fake backend): libfaketime steps
    # its wall clock (CLOCK_REALTIME, from a file read at every call), not its monotonic clocks.
    lib = _libfaketime()
    if lib is None:
        pytest.skip("libfaketime is not installed (apt-get install libfaketime): "
                    "nothing else steps an agent process's wall clock alone")
    monkeypatch.setenv("FUSE_TEST_FORK", "0")  # (exec'd, not forked from the fork server: LD_PRELOAD applies)
    shim = tmp_path / "shim"
    shim.mkdir()
    # the agent keeps libfaketime; its fake VMs run on the true clock (libfaketime 0.9.10 fails
    # Python's time.sleep with EINVAL under DONT_FAKE_MONOTONIC)
    (shim / "sitecustomize.py").write_text("import os\nos.environ.pop('LD_PRELOAD', None)\n")
    stamp = tmp_path / "faketime"
    stamp.write_text("+0s\n")
    path = [str(shim)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = {"LD_PRELOAD": lib, "FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1",
           "DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": os.pathsep.join(path)}
    agent = start_agent(tmp_path, backend="fake", env=env)
    procs.append(agent)
    h = {"Authorization": f"Bearer {agent.token}"}

    def rows() -> dict[str, Decimal]:
        r = httpx.get(f"{agent.url}/v1/host/usage", headers=h, timeout=30)
        assert r.status_code == 200, r.text
        return {row["vm"]: row["wall_seconds"] for row in json.loads(r.content, parse_float=Decimal)["vms"]}

    began = time.monotonic()  # (before any VM: none can have run longer)
    for name in ("v1", "v2"):
        r = httpx.post(f"{agent.url}/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 128},
                                                         "entry": "true"}, headers=h, timeout=30)
        assert r.status_code == 201, r.text
    time.sleep(2)
    stamp.write_text("-3600s\n")
    running = rows()
    # both still there, each having run the 2 s waited (was: {})
    assert set(running) == {"v1", "v2"} and min(running.values()) > 1.9, running
    assert httpx.post(f"{agent.url}/v1/host/vms/v1/sleep", headers=h, timeout=30).status_code == 200
    r = httpx.post(f"{agent.url}/v1/host/vms/v1/wake", json={}, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    stamp.write_text("+0s\n")
    time.sleep(1)
    after = rows()
    ran = time.monotonic() - began
    # no VM billed beyond the time that passed (was: v1 woken an hour early, an extra hour)
    assert set(after) == {"v1", "v2"} and all(1.9 < s <= ran + 1 for s in after.values()), (after, ran)
    agent.stop()
    archived = [json.loads(line) for line in (agent.state_dir / "metering.jsonl").read_text().splitlines()]
    segments = [rec["segment"] for rec in archived if "segment" in rec]
    segments += json.loads((agent.state_dir / "metering.json").read_text())["segments"]
    slept = [s for s in segments if s["vm"] == "v1" and s["end"] is not None]
    assert len(slept) == 1 and slept[0]["end"] - slept[0]["start"] > 1.9, slept  # (was 0 s)
    assert agent.logs().count("the wall clock stepped") == 2, agent.logs()[-2000:]
