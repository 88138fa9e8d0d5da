"""Review 38 (big VMs and long moves):

- A host whose agent is under memory pressure is passed by with the agent's own reason
  (its ``--reserve-mib`` above what the machine has available, or PSI's avg10), in a
  create's ``fleet_full`` and a named move's ``no_target``: "host is under memory
  pressure" alone sent an operator who over-reserved looking for memory stalls that did
  not exist. An agent older than the reason (the flag alone) keeps those words.
- The controller's waits for a host to sleep, install or wake a VM (a move's steps, and
  its own sleep and wake) grow with the VM's memory (``state_wait_s``): a fixed 120 s
  rolled back every move of a 16 GiB guest on a busy host.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from starlette.testclient import TestClient

import fuse
from fuse.controller import vms as controller_vms
from fuse.controller.moves.steps import MoveSteps
from fuse.controller.vms import VmService
from fuse.transport import HostConnection
from support import api_error, reap, start_agent, start_controller, wait_until


def vm_body(name, mem=256, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}


def mem_total_mib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:"))


# ---- the agent's reason for its memory pressure reaches the refusals ----------------------

@pytest.fixture
def fleet(tmp_path):
    procs = []
    ctl = start_controller(tmp_path)
    procs.append(ctl)
    client = fuse.Client(ctl.url)

    def agent(name, **kw):
        p = start_agent(tmp_path, backend="fake", name=name, **kw)
        procs.append(p)
        return p

    def add(host_id, a, ram_mb=4096):
        client.hosts.register(fuse.RegisterHostRequest(
            id=host_id, url=a.url, token=a.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=10, ram_mb=ram_mb, cpus=4)))

    yield type("Fleet", (), {"agent": staticmethod(agent), "add": staticmethod(add), "client": client})
    client.close()
    for p in procs:
        p.stop()
    reap(tmp_path)


def test_a_host_over_reserved_is_refused_naming_its_reserve_not_a_memory_stall(fleet):
    """An agent whose --reserve-mib is above the machine's memory (MemAvailable can never
    cover it, however idle the machine) says so in its summary; the create's 409 and a
    move's no_target quote it."""
    reserve = mem_total_mib() + 1024
    over = fleet.agent("over", extra=["--reserve-mib", str(reserve)])
    home = fleet.agent("home")
    fleet.add("over", over)
    fleet.add("home", home)
    wait_until(lambda: fleet.client.hosts.get("over").memory_pressure, timeout=30, what="the controller's poll")

    err = api_error(fleet.client.vms.create, vm_body("pinned", host="over"))
    assert (err.status, err.code) == (409, "fleet_full"), err.message
    said = err.details["hosts"]["over"]
    assert said.startswith("host under memory pressure: ") and f"less than its {reserve} MiB host reserve" in said, \
        err.details

    fleet.client.vms.create(vm_body("job", host="home"))
    err = api_error(fleet.client.moves.create, "job", to="over")
    assert (err.status, err.code) == (409, "no_target"), err.message
    assert "host over has no room for vm job: host under memory pressure: " in err.message, err.message
    assert f"less than its {reserve} MiB host reserve" in err.message, err.message
    # the agent's summary: the flag as before, and its reason beside it
    summary = httpx.get(over.url + "/v1/host", headers={"Authorization": f"Bearer {over.token}"}, timeout=10).json()
    assert summary["memory_pressure"] is True, summary
    assert f"less than its {reserve} MiB host reserve" in summary["memory_pressure_reason"], summary


@pytest.mark.parametrize("summary, said", [
    ({"memory_pressure": True}, "host is under memory pressure"),
    ({"memory_pressure": True, "memory_pressure_reason": None}, "host is under memory pressure"),
    ({"memory_pressure": True, "memory_pressure_reason": 42}, "host is under memory pressure"),
    ({"memory_pressure": True, "memory_pressure_reason": " \n "}, "host is under memory pressure"),
    ({"memory_pressure": True, "memory_pressure_reason": "host under memory pressure (PSI some avg10=42.0)"},
     "host under memory pressure (PSI some avg10=42.0)"),
    ({"memory_pressure": True, "memory_pressure_reason": "a\nb" + "x" * 400}, "a b" + "x" * 297),
], ids=["an older agent's flag alone keeps today's words", "a null reason is the flag's words",
        "a reason that is no string is the flag's words", "a blank reason is the flag's words",
        "PSI's figures are quoted", "a long reason is one line of 300 characters"])
def test_the_pressure_reason_is_the_agents_words_or_the_flags(summary, said):
    assert controller_vms.pressure_reason(summary) == said


# ---- waits that grow with the VM's memory ------------------------------------------------

@pytest.mark.parametrize("mem_mib, secs", [
    (None, 120), ("4096", 120), (True, 120), (0, 120), (256, 120), (2048, 120), (3072, 150), (4096, 180),
    (16384, 540), (65536, 120 + 30 * 62), (10 ** 9, 120 + 30 * (1024 - 2)),
], ids=["no size known", "a size that is no integer", "a bool is no size", "0 MiB", "256 MiB", "2 GiB",
        "3 GiB: 30 s more", "4 GiB", "16 GiB", "64 GiB", "past the largest shape: the largest's"])
def test_the_wait_for_a_sleep_or_wake_is_120_s_and_30_s_a_gib_past_2_gib(mem_mib, secs):
    assert controller_vms.state_wait_s(mem_mib) == pytest.approx(secs)


class RecordingSteps(MoveSteps):
    """A move's steps whose host calls are recorded (path -> timeout) and answered as an
    agent would, with nothing stored."""

    def __init__(self):
        self.calls: dict[str, float] = {}

    async def _host(self, host, method, path, ok=(200, 201, 204), **kw):
        self.calls[path] = kw.get("timeout")
        return {"name": "big", "state": "sleeping", "files": [{"name": "state.bin", "size": 1, "sha256": "x"}]}

    def _answer(self, got, host, what):
        return got

    async def _write(self, move_id, state=None, **rec):
        return {}

    async def _outlast(self, kind, call):
        return None


def move_row(record):
    return {"id": "mv-1", "vm": "big", "source": "a", "target": "b", "record": record}


@pytest.mark.parametrize("record, secs", [
    ({"was_running": True, "vm": {"name": "big", "shape": {"vcpus": 2, "mem_mib": 16384}}}, 540),
    ({"was_running": True, "vm": {"name": "small", "shape": {"vcpus": 1, "mem_mib": 512}}}, 120),
    ({"was_running": True}, 120),
    ({"was_running": True, "vm": {"name": "odd", "shape": "big"}}, 120),
], ids=["a 16 GiB vm waits 540 s", "a 512 MiB vm waits 120 s", "a row without the vm's record waits 120 s",
        "a record without a shape waits 120 s"])
def test_a_moves_sleep_install_and_wake_wait_by_the_vms_memory(record, secs):
    steps = RecordingSteps()
    row = move_row(record)
    asyncio.run(steps._sleep(row))
    asyncio.run(steps._install(row))
    asyncio.run(steps._wake_target(row))
    assert steps.calls == {"/v1/host/vms/big/sleep": secs, "/v1/host/incoming/mv-1/install": secs,
                           "/v1/host/vms/big/wake": secs}, steps.calls


def test_the_controllers_own_sleep_and_wake_wait_by_the_vms_memory():
    """``VmService.act`` with its host call recorded: the VM's row (16 GiB) sets the wait."""
    calls = []

    class Store:
        def vms_named(self, name):
            return [{"host": "h", "name": name, "mem_mib": 16384, "vcpus": 2}]

    class Fleet:
        def upsert_vms(self, host, vms):
            pass

    svc = VmService.__new__(VmService)
    svc.ctl = type("Ctl", (), {"fleet": Fleet()})()
    svc.store = Store()
    svc.locate = lambda name, host=None: "h"
    svc._act_on = lambda name, host, action: contextlib.nullcontext()

    async def vm_call(host, name, method, path, **kw):
        calls.append((path, kw.get("timeout")))
        return {"name": name, "state": "sleeping"}

    async def no_room_to_take(name, host):
        return controller_vms.Resources()

    async def refresh(host):
        pass
    svc._vm_call, svc._wake_room, svc._refresh_room = vm_call, no_room_to_take, refresh
    asyncio.run(svc.act("big", "sleep"))
    asyncio.run(svc.act("big", "wake"))
    assert calls == [("/v1/host/vms/big/sleep", 540), ("/v1/host/vms/big/wake", 540)], calls


def test_a_real_move_and_sleep_of_a_4_gib_vm_wait_180_s(tmp_path, monkeypatch):
    """Through a controller (in this process, its host calls recorded) and two real agents
    (fake backend): every call that sleeps, installs or wakes the 4 GiB VM is given 180 s."""
    from fuse.controller.app import create_app
    from fuse.controller.service import Controller

    seen: list[tuple[str, float | None]] = []
    plain = HostConnection.request

    async def recording(self, method, path, **kw):
        seen.append((path, kw.get("timeout")))
        return await plain(self, method, path, **kw)
    monkeypatch.setattr(HostConnection, "request", recording)
    agents = [start_agent(tmp_path, backend="fake", name=n) for n in ("one", "two")]
    ctl = Controller(tmp_path / "ctl")
    try:
        with TestClient(create_app(ctl)) as c:
            for name, a in zip(("one", "two"), agents):
                r = c.post("/v1/hosts", json={"id": name, "url": a.url, "token": a.token, "backend": "qemu",
                                              "capacity": {"vm_count": 4, "ram_mb": 8192, "cpus": 4}})
                assert r.status_code == 201, r.text
            r = c.post("/v1/vms", json=vm_body("big", mem=4096, host="one"))
            assert r.status_code == 201, r.text
            assert c.post("/v1/vms/big/sleep").status_code == 200
            assert c.post("/v1/vms/big/wake").status_code == 200
            r = c.post("/v1/moves", json={"vm": "big", "to": "two"})
            assert r.status_code == 202, r.text
            move = r.json()["id"]
            wait_until(lambda: c.get(f"/v1/moves/{move}").json()["state"] in ("done", "failed"), timeout=60,
                       what="the move")
            assert c.get(f"/v1/moves/{move}").json()["state"] == "done", c.get(f"/v1/moves/{move}").text
    finally:
        ctl.store.close()
        for a in agents:
            a.stop()
        reap(tmp_path)
    waits = {(p, t) for p, t in seen if p.endswith(("/sleep", "/wake", "/install"))}
    assert waits == {("/v1/host/vms/big/sleep", 180), ("/v1/host/vms/big/wake", 180),
                     (f"/v1/host/incoming/{move}/install", 180)}, waits


def test_the_agents_load_deadline_grows_as_the_controllers_wait():
    """The agent's own deadline for a wake's load (QEMU reading the state) was a fixed 120 s:
    a 16 GiB guest's wake failed at the agent at 120 s whatever the controller waited. It
    grows with the guest's memory as the controller's wait does."""
    from fuse.agent.backends.qemu import load_timeout
    from fuse.controller.vms import state_wait_s

    for mib in (512, 2048, 4096, 16384, 65536):
        assert load_timeout(mib) == state_wait_s(mib)
    assert load_timeout(16384) == 540.0


def test_the_sdks_sleep_and_wake_wait_past_the_controllers_wait_for_a_16_gib_vm():
    """The SDK gave a sleep or wake 180 s while the controller now waits 540 s for a 16 GiB VM:
    the caller gave up on work still going on. It waits 600 s, and takes a longer ``timeout``."""
    import httpx

    import fuse
    from fuse.controller.vms import state_wait_s

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.extensions["timeout"]["read"]))
        return httpx.Response(200, json={"name": "v", "state": "sleeping"})

    c = fuse.Client("http://127.0.0.1:9", "t", transport=httpx.MockTransport(answer))
    c.vms.sleep("v")
    c.vms.wake("v", timeout=2000)
    assert seen == [("/v1/vms/v/sleep", 600.0), ("/v1/vms/v/wake", 2000)]
    assert 600.0 > state_wait_s(16384)
