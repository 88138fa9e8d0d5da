"""Review 16 of the host agent.

A hung hypervisor (its QEMU stopped with SIGSTOP: the QMP socket still
accepts, in the kernel, but nothing greets or answers) holds up neither the
agent's start, nor the other VMs' adoption, nor a delete, nor a move: every
QMP step has a deadline. And the agent reads a request body as the
controller does: known fields only, one 400 ``invalid_argument`` in the
controller's words."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest
from starlette.testclient import TestClient

import fuse
from agent_support import COUNTER, counted, install_bundle, qemu_pids
from test_review6_agent import agent  # noqa: F401 (the fixture: a fake-backend agent app)
from fuse.agent.backends import qemu as qemu_backend
from fuse.agent.backends.base import BackendError
from fuse.agent.backends.qemu import qmp_path, qmp_session
from fuse.agent.vms import VmManager
from fuse.controller.app import create_app as create_controller_app
from fuse.controller.service import Controller
from fuse.models.vm import CreateVmRequest
from support import reap, refused, start_agent, start_controller, wait_until

qemu = pytest.mark.qemu
SHAPE = {"vcpus": 1, "mem_mib": 128}
STEP = 3.0  # the QMP deadline the in-process tests run with (the agent's own: QMP_TIMEOUT)


@contextlib.contextmanager
def stopped(*pids: int):
    """The processes stopped (SIGSTOP) inside the block, continued after it
    however it ends (a failing test leaves none stopped)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.fixture
def short_qmp_deadline(monkeypatch):
    """Each QMP step within ``STEP`` s (not raising: on an agent without the
    deadline the test runs, and fails on what it checks)."""
    monkeypatch.setattr(qemu_backend, "QMP_TIMEOUT", STEP, raising=False)


async def _counting(host, name: str, upto: int = 3) -> int:
    """Boot a counting guest on ``host``; its QEMU's pid once it counts."""
    r = await host.client.post("/v1/host/vms", json={"name": name, "shape": SHAPE, "entry": COUNTER})
    assert r.status_code == 201, r.text
    await host.wait_console(name, lambda t: len(counted(t)) >= upto)
    return r.json()["pid"]


async def _counts_on(host, name: str) -> None:
    before = len(counted(await host.console(name)))
    await host.wait_console(name, lambda t: len(counted(t)) > before + 2, timeout=30)


# ---- a hung VM and the agent's start ----------------------------------------------

@qemu
async def test_a_hung_vm_holds_up_neither_the_agents_start_nor_the_other_vms_adoption(
        tmp_path, bundle_dir, short_qmp_deadline):
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    first = VmManager(state, "qemu", ram_mb=4096, cpus=2)
    await first.start()
    second = None
    try:
        for name in ("hung1", "hung2", "ok"):
            await first.create(CreateVmRequest.model_validate({"name": name, "shape": SHAPE, "entry": COUNTER}))
        pids = {name: first.get(name).pid for name in ("hung1", "hung2", "ok")}
        console = first.vm_dir("ok") / "console.log"
        while len(counted(console.read_text())) < 2:
            await asyncio.sleep(0.05)
        await first.close()
        last = first.events.last_id

        with stopped(pids["hung1"], pids["hung2"]):
            second = VmManager(state, "qemu", ram_mb=4096, cpus=2)
            began = time.monotonic()
            await asyncio.wait_for(second.start(), 30)  # (before the fix: never, no greeting came)
            took = time.monotonic() - began
            # Side by side: the two hung VMs cost one deadline, not one each.
            assert took < 2 * STEP, took
            assert {n: (v.state, v.pid) for n, v in second.vms.items()} == {n: ("running", p) for n, p in pids.items()}
            events = [e for e in second.events.list() if e["id"] > last]
            warned = {e["vm"]: e["reason"] for e in events if e["type"] == "vm_adopt_warning"}
            assert set(warned) == {"hung1", "hung2"}, events
            assert all("no greeting" in why for why in warned.values()), warned
            assert sorted(e["vm"] for e in events if e["type"] == "vm_adopted") == ["hung1", "hung2", "ok"]
            before = len(counted(console.read_text()))
            while len(counted(console.read_text())) <= before + 2:  # the healthy guest is untouched
                await asyncio.sleep(0.05)
        # Continued, the hung VMs are this agent's as any other: they count on, and go when deleted.
        for name in ("hung1", "hung2"):
            log = second.vm_dir(name) / "console.log"
            before = len(counted(log.read_text()))
            deadline = time.monotonic() + 30
            while len(counted(log.read_text())) <= before + 2:
                assert time.monotonic() < deadline, f"{name} did not count on"
                await asyncio.sleep(0.05)
        for name in ("hung1", "hung2", "ok"):
            await second.delete(name)
        assert not qemu_pids(str(state))
    finally:
        if second is not None and second._monitor is not None:
            await second.close()
        reap(state)


# ---- sleep and delete of a hung VM ----------------------------------------------

@qemu
async def test_sleeping_a_hung_vm_fails_in_bounded_time_and_leaves_it_running(make_host, short_qmp_deadline):
    host = await make_host()
    pid = await _counting(host, "hung")
    with stopped(pid):
        began = time.monotonic()
        r = await asyncio.wait_for(host.client.post("/v1/host/vms/hung/sleep"), STEP + 10)
        assert time.monotonic() - began < STEP + 5
        assert (r.status_code, r.json()["error"]["code"]) == (500, "sleep_failed"), r.text
        assert "could not sleep" in r.json()["error"]["message"]
        vm = (await host.client.get("/v1/host/vms/hung")).json()
        assert (vm["state"], vm["pid"]) == ("running", pid)
        assert not (host.vms.vm_dir("hung") / "state" / "state.bin.partial").exists()
    # Continued, it runs on where it was, and sleeps and wakes as any VM.
    await _counts_on(host, "hung")
    r = await host.client.post("/v1/host/vms/hung/sleep")
    assert (r.status_code, r.json()["state"]) == (200, "sleeping"), r.text
    r = await host.client.post("/v1/host/vms/hung/wake")
    assert (r.status_code, r.json()["state"]) == (200, "running"), r.text
    await _counts_on(host, "hung")


@qemu
async def test_a_delete_does_not_wait_behind_the_sleep_of_a_hung_vm(make_host, short_qmp_deadline):
    host = await make_host()
    pid = await _counting(host, "hung")
    with stopped(pid):
        sleeping = asyncio.create_task(host.client.post("/v1/host/vms/hung/sleep"))
        await asyncio.sleep(0.5)  # the sleep holds the VM's lock now
        deleting = asyncio.create_task(host.client.delete("/v1/host/vms/hung"))
        done, _ = await asyncio.wait({deleting}, timeout=STEP + 5)
        gone = not qemu_pids(str(host.vms.vm_dir("hung")))
    # (continued here: before the fix the sleep, and then the delete, run only now)
    slept, deleted = await asyncio.wait_for(asyncio.gather(sleeping, deleting), 60)
    assert deleting in done, "the delete waited behind the sleep of the hung vm"
    assert gone and deleted.status_code == 204, deleted.text
    assert slept.json()["error"]["code"] == "sleep_failed", slept.text
    assert (await host.client.get("/v1/host/vms/hung")).status_code == 404


@qemu
async def test_a_command_a_stopped_qemu_missed_the_deadline_of_is_undone_once_it_runs_again(
        make_host, short_qmp_deadline):
    # What it was sent still runs when it is continued: `stop` would leave the guest
    # paused behind the agent's back, unless the session's settle commands follow it.
    host = await make_host()
    pid = await _counting(host, "c")
    path = qmp_path(host.vms.vm_dir("c"))
    async with qmp_session(path, settle=("cont",)) as qmp:
        with stopped(pid):
            with pytest.raises(BackendError, match="did not answer stop within 1 s"):
                await qmp.execute("stop", timeout=1)
            with pytest.raises(BackendError, match="not answering"):  # at once: it is hung
                await qmp.execute("query-status")
    await _counts_on(host, "c")
    async with qmp_session(path) as qmp:
        assert (await qmp.execute("query-status"))["status"] == "running"


# ---- a move of a hung VM ----------------------------------------------------------

@qemu
def test_a_move_of_a_hung_vm_fails_and_leaves_it_running_at_home(tmp_path, bundle_dir):
    # Real agents (the agent's own QMP deadline) and a real controller.
    agents = []
    for name in ("src", "dst"):
        install_bundle(bundle_dir, tmp_path / f"agent-{name}")
        agents.append(start_agent(tmp_path, name=f"agent-{name}"))
    ctl = start_controller(tmp_path)
    c = fuse.Client(ctl.url)
    try:
        for name, a in zip(("src", "dst"), agents):
            c.hosts.register(fuse.RegisterHostRequest(id=name, url=a.url, token=a.token, backend="qemu",
                                                      capacity=fuse.HostCapacity(vm_count=4)))
        vm = c.vms.create({"name": "hung", "shape": SHAPE, "entry": COUNTER, "host": "src"})
        wait_until(lambda: len(counted(c.vms.console("hung")["text"])) >= 2, timeout=90, what="the guest counting")
        with stopped(vm["pid"]):
            move = c.moves.create("hung", to="dst")
            # (before the fix the source's sleep never answers: the move is still sleeping at 60 s)
            move = wait_until(lambda: (m := c.moves.get(move["id"]))["state"] in ("done", "failed") and m,
                              timeout=60, what="the move to end")
            assert move["state"] == "failed", move
            assert "could not sleep" in move["reason"], move
            home = c.vms.get("hung")
            assert (home["host"], home["state"], home["pid"], home.get("move_id")) == ("src", "running", vm["pid"],
                                                                                      None)
        before = len(counted(c.vms.console("hung")["text"]))
        wait_until(lambda: len(counted(c.vms.console("hung")["text"])) > before + 2, timeout=30,
                   what="the guest counting on at home")
        assert len(qemu_pids(str(tmp_path / "agent-src"))) == 1 and not qemu_pids(str(tmp_path / "agent-dst"))
        c.vms.delete("hung")
    finally:
        c.close()
        ctl.stop()
        for a in agents:
            a.stop()
        reap(tmp_path)


# ---- request bodies, read as the controller reads them ------------------------------


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    ctl = Controller(tmp_path_factory.mktemp("ctl"))
    yield TestClient(create_controller_app(ctl), raise_server_exceptions=False)
    ctl.store.close()


E = "sleep 60"
BODIES = {
    "an unknown field is named": ({"shape": SHAPE, "entry": E, "foo": 1}, "unknown field foo"),
    "an unknown field inside the shape is named by its path": (
        {"shape": SHAPE | {"disk": 3}, "entry": E}, "unknown field shape.disk"),
    "a misspelt field is named with the field meant": (
        {"shape": SHAPE, "entry": E, "bundel": "linux"}, "unknown field bundel (did you mean bundle?)"),
    "a missing entry says so without pydantic's prefix": ({"shape": SHAPE}, "entry is required (unless standby)"),
    "a missing shape is a missing field": ({"entry": E}, "missing field shape"),
    "an array is not an object": ([1], "the body must be a JSON object, not an array"),
    "a field out of range is named with the rule": (
        {"shape": {"vcpus": 0, "mem_mib": 128}, "entry": E}, "shape.vcpus: Input should be greater than or equal to 1"),
}


@pytest.mark.parametrize("body, said", list(BODIES.values()), ids=list(BODIES))
def test_a_bad_create_body_is_refused_in_the_controllers_words(agent, controller, body, said):
    assert refused(agent.post("/v1/host/vms", json=body)) == said
    assert refused(controller.post("/v1/vms", json=body)) == said  # the very same answer


@pytest.mark.parametrize("content, said", [
    (b"{xx", "the body is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    (b"", "the body is empty: send a JSON object with Content-Type: application/json"),
], ids=["bad JSON is placed by line and column", "an empty body says what to send"])
def test_a_body_that_is_no_json_object_is_refused_in_the_controllers_words(agent, controller, content, said):
    headers = {"content-type": "application/json"}
    assert refused(agent.post("/v1/host/vms", content=content, headers=headers)) == said
    assert refused(controller.post("/v1/vms", content=content, headers=headers)) == said


@pytest.mark.parametrize("path, body, said", [
    ("/v1/host/vms/x/sleep", {"moveid": "m"}, "unknown field moveid (did you mean move_id?)"),
    ("/v1/host/vms/x/claim", {"entry": E, "host": "h"}, "unknown field host"),
    ("/v1/host/incoming", {"move_id": "m", "platform": {}, "files": [{"name": "f", "size": 1, "sha256": "s", "x": 1}],
                           "vm": {"name": "a", "shape": SHAPE, "entry": E, "bundle_fingerprint": "b", "y": 2}},
     "unknown field files[0].x; unknown field vm.y"),
], ids=["a sleep's body", "a claim's body", "an incoming move's body, at any depth"])
def test_every_body_the_agent_takes_names_only_fields_it_knows(agent, path, body, said):
    assert refused(agent.post(path, json=body)) == said


def test_a_good_create_body_still_boots(agent):
    r = agent.post("/v1/host/vms", json={"name": "fine", "shape": SHAPE, "entry": E})
    assert r.status_code == 201, r.text
    assert agent.delete("/v1/host/vms/fine").status_code == 204
