"""Shared helpers for the host agent's tests (a uniquely named module:
several test dirs have a conftest.py, so `from conftest import` is ambiguous)."""

from __future__ import annotations

import asyncio
import time

from fuse.agent.backends.base import pids_mentioning
from support import install_bundle  # noqa: F401  (re-exported for the agent tests)

COUNTER = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.2; done"


def qemu_pids(marker: str) -> list[int]:
    """QEMU processes whose command line mentions ``marker``."""
    return pids_mentioning(marker, b"qemu-system")


def counted(text: str) -> list[int]:
    """The numbers a counting guest printed, in order."""
    return [int(line) for line in text.replace("\r", "").splitlines() if line.strip().isdigit()]


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


async def fake_vm_with_a_small_console(make_host, console_max: int = 1 << 20):
    """A VM on a fake-backend host whose console cap is ``console_max``: (host, vm, console path)."""
    host = await make_host(backend="fake")
    r = await host.client.post("/v1/host/vms", json={"name": "chatty", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "sleep 600"})
    assert r.status_code == 201, r.text
    host.vms.console_max = console_max
    return host, host.vms.get("chatty"), host.vms.vm_dir("chatty") / "console.log"
