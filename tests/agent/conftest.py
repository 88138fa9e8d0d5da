"""Fixtures for the host agent's tests: one real guest bundle per session,
in-process agents (the real router and VmManager behind httpx's ASGI
transport), and a guard that no QEMU process outlives its test."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from agent_support import Host, install_bundle, qemu_pids
from support import fake_bundle, real_bundle_dir
from fuse import http_errors
from fuse.agent.api.vms import router
from fuse.agent.vms import VmManager


@pytest.fixture(scope="session")
def bundle_dir() -> Path:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    return real_bundle_dir()


@pytest.fixture(autouse=True)
def no_qemu_left(tmp_path):
    """Fail a test that leaves a QEMU process of its state dirs behind
    (and kill it, so one failure does not leak into the next test)."""
    yield
    deadline = time.monotonic() + 5
    while (left := qemu_pids(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"QEMU processes left behind: {left}"


@pytest.fixture
async def make_host(tmp_path, bundle_dir):
    """Factory: ``await make_host(name, ram_mb=..., max_vms=..., pressure=...)``
    (``backend="fake"``: the fast stand-in, for rules that need no real guest).
    Every VM still on a host at the end is deleted (its process killed)."""
    hosts: list[Host] = []

    async def make(name: str = "host", *, bundle: bool = True, backend: str = "qemu", **kwargs) -> Host:
        state = tmp_path / name
        state.mkdir(parents=True, exist_ok=True)
        if bundle and backend == "fake":
            fake_bundle(state)  # a manifest: the fake backend boots nothing
        elif bundle:
            install_bundle(bundle_dir, state)
        kwargs.setdefault("ram_mb", 4096)
        kwargs.setdefault("cpus", 2)
        if kwargs.pop("relative", False):  # the state dir as a path relative to the working dir
            state = Path(os.path.relpath(state))
        vms = VmManager(state, backend, **kwargs)
        await vms.start()
        app = FastAPI()
        http_errors.install(app)
        app.include_router(router)
        app.state.vms, app.state.events = vms, vms.events
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")
        hosts.append(host := Host(vms, client))
        return host

    yield make
    for host in hosts:
        for vm in list(host.vms.vms.values()):
            await host.vms.delete(vm.name, vm.move_id)
        await host.vms.close()
        await host.client.aclose()

