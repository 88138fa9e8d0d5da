"""A fast stand-in hypervisor for tests of many hosts at once.

Each "VM" is a small Python process (its command line carries the VM dir, so
pid checks work as for QEMU) that writes a counter to its console. Sleep
saves the counter to a state file and stops the process; wake starts a new
one from that number — the same observable contract as QEMU's sleep/wake,
at a fraction of the memory. It never runs the entry: the entry is only
echoed. A standby one prints FUSE-STANDBY and waits for its entry to appear
as a file. Select with `fuse host serve --backend fake`; real-VM tests use qemu.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .base import (STANDBY_MARK, Backend, BackendError, BootSpec, follow_agent_affinity, kill_and_wait, process_alive,
                   read_pidfile, wait_console_line)

_PROGRAM = r"""
import os, sys, time
vm_dir, start, entry, standby = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
state = os.path.join(vm_dir, "fake-counter")
with open(os.path.join(vm_dir, "console.log"), "a", buffering=1) as out:
    if start == 0 and standby:
        out.write("FUSE-STANDBY\n")
        given = os.path.join(vm_dir, "fake-entry")
        while not os.path.exists(given):
            time.sleep(0.01)
        with open(given) as f:
            entry = f.read()
    if start == 0:
        out.write("fake vm: entry %s\n" % entry[:200])
    i = start
    while True:
        out.write("%d\n" % i)
        with open(state + ".tmp", "w") as f:
            f.write(str(i))
        os.replace(state + ".tmp", state)
        i += 1
        time.sleep(0.2)
"""


class FakeBackend(Backend):
    name = "fake"
    supports_standby = True
    bundle_files = ()  # it boots nothing: a bundle's manifest alone will do
    guest_memory = False  # (its VMs are small processes, whatever memory they were given)

    def __init__(self, **_: Any):
        pass

    def platform(self) -> dict[str, Any]:
        return {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"}

    def _pidfile(self, spec: BootSpec) -> Path:
        return spec.vm_dir / "fake.pid"

    async def _spawn(self, spec: BootSpec, start: int) -> int:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        follow_agent_affinity()  # (as QEMU: a VM runs where the agent was pinned)
        p = subprocess.Popen([sys.executable, "-c", _PROGRAM, str(spec.vm_dir), str(start), spec.entry[:200],
                              "1" if spec.standby else "0"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self._pidfile(spec).write_text(str(p.pid))
        # Popen returns once exec began, but /proc/PID/cmdline is empty until the kernel
        # has laid out the new program's arguments: a monitor reading it in that window
        # (a loaded machine stretches it) took the VM for dead. Started means seen.
        deadline = time.monotonic() + 10
        while not process_alive(p.pid, str(spec.vm_dir)):
            if p.poll() is not None or time.monotonic() > deadline:
                raise BackendError(f"fake vm {spec.name} did not start (exit {p.poll()})")
            await asyncio.sleep(0.005)
        return p.pid

    async def start(self, spec: BootSpec) -> int:
        return await self._spawn(spec, 0)

    def pid(self, spec: BootSpec) -> int | None:
        pid = read_pidfile(self._pidfile(spec))
        return pid if process_alive(pid, str(spec.vm_dir)) else None

    async def stop(self, spec: BootSpec) -> None:
        await kill_and_wait(read_pidfile(self._pidfile(spec)), str(spec.vm_dir))

    async def sleep(self, spec: BootSpec) -> list[str]:
        await self.stop(spec)
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        live = spec.vm_dir / "fake-counter"
        (spec.state_dir / "counter").write_text(live.read_text() if live.exists() else "0")
        # A memory image stands in for guest RAM so moves copy real bytes.
        (spec.state_dir / "memory.bin").write_bytes(b"\xa5" * (1 << 20) * max(1, spec.mem_mib // 64))
        return ["counter", "memory.bin"]

    async def wake(self, spec: BootSpec) -> int:
        n = int((spec.state_dir / "counter").read_text() or 0)
        return await self._spawn(spec, n + 1)

    async def deliver_entry(self, spec: BootSpec, entry: str, timeout: float = 60.0) -> None:
        await wait_console_line(spec, STANDBY_MARK, lambda: self.pid(spec) is not None, timeout)
        tmp = spec.vm_dir / ".fake-entry"
        tmp.write_text(entry)
        os.replace(tmp, spec.vm_dir / "fake-entry")  # whole or not at all: the fake polls for it
