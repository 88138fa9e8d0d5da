"""Shared helpers for the host agent's tests (a uniquely named module:
several test dirs have a conftest.py, so `from conftest import` is ambiguous)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

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


def install_bundle(bundle_dir: Path, state_dir: Path) -> None:
    """Give an agent state dir the session's bundle (hard links: instant)."""
    dest = state_dir / "bundles" / bundle_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    for f in bundle_dir.iterdir():
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)


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
