"""Fixtures for the host agent's tests: one real guest bundle per session,
in-process agents (the real router and VmManager behind httpx's ASGI
transport), and a guard that no QEMU process outlives its test."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from fuse import http_errors
from fuse.agent.api.vms import router
from fuse.agent.bundle import build_bundle
from fuse.agent.vms import VmManager

# Built once and reused across runs: build_bundle leaves a bundle whose
# recorded inputs (kernel .deb, busybox, init, format) match untouched.
BUNDLE_HOME = Path(os.environ.get("FUSE_TEST_BUNDLES", "/tmp/fuse-test-bundles"))
COUNTER = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.2; done"


def qemu_pids(marker: str) -> list[int]:
    """QEMU processes whose command line mentions ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in cmd and marker.encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="session")
def bundle_dir() -> Path:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    build_bundle(BUNDLE_HOME, "linux", progress=lambda _msg: None)
    return BUNDLE_HOME / "bundles" / "linux"


def install_bundle(bundle_dir: Path, state_dir: Path) -> None:
    """Give an agent state dir the session's bundle (hard links: instant)."""
    dest = state_dir / "bundles" / bundle_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    for f in bundle_dir.iterdir():
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)


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


class Host:
    """An in-process agent: ``client`` speaks the host API to ``vms``."""

    def __init__(self, vms: VmManager, client: httpx.AsyncClient):
        self.vms, self.client = vms, client

    async def wait_state(self, name: str, states: set[str], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            vm = (await self.client.get(f"/v1/host/vms/{name}")).json()
            if vm.get("state") in states:
                return vm
            assert time.monotonic() < deadline, f"vm {name} stuck in {vm.get('state')}"
            await asyncio.sleep(0.05)

    async def console(self, name: str) -> str:
        return (await self.client.get(f"/v1/host/vms/{name}/console")).json()["text"]

    async def wait_console(self, name: str, pred, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not pred(text := await self.console(name)):
            assert time.monotonic() < deadline, f"console of {name} never matched:\n{text[-2000:]}"
            await asyncio.sleep(0.05)
        return text


@pytest.fixture
async def make_host(tmp_path, bundle_dir):
    """Factory: ``await make_host(name, ram_mb=..., max_vms=..., pressure=...)``.
    Every VM still on a host at the end is deleted (its process killed)."""
    hosts: list[Host] = []

    async def make(name: str = "host", *, bundle: bool = True, **kwargs) -> Host:
        state = tmp_path / name
        state.mkdir(parents=True, exist_ok=True)
        if bundle:
            install_bundle(bundle_dir, state)
        kwargs.setdefault("ram_mb", 4096)
        kwargs.setdefault("cpus", 2)
        vms = VmManager(state, "qemu", **kwargs)
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


def counted(text: str) -> list[int]:
    """The numbers a counting guest printed, in order."""
    return [int(line) for line in text.replace("\r", "").splitlines() if line.strip().isdigit()]
