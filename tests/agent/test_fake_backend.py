"""The fake backend's process contract, which the agent's monitor relies on."""

from __future__ import annotations

import asyncio
from collections import Counter

from fuse.agent.backends import fake
from fuse.agent.backends.base import BootSpec, process_alive
from support import reap


def test_a_started_vm_is_seen_alive_the_moment_start_returns(tmp_path, monkeypatch):
    # Right after Popen returns, /proc/PID/cmdline can still be empty: the kernel has not
    # yet laid out the new program's arguments (read at once, ~6 % of spawns here; a
    # loaded machine stretches the window). A monitor tick there took a healthy VM for
    # dead and failed it, and a CI run lost a test to it. The window is made certain
    # here: a process's first three looks miss it, as a look inside the window would.
    looks: Counter[int] = Counter()

    def in_window(pid, marker):
        looks[pid] += 1
        return looks[pid] > 3 and process_alive(pid, marker)

    monkeypatch.setattr(fake, "process_alive", in_window)
    backend = fake.FakeBackend()
    spec = BootSpec(name="v", vm_dir=tmp_path / "v", vcpus=1, mem_mib=64, entry="",
                    kernel=tmp_path / "k", initrd=tmp_path / "i")
    spec.vm_dir.mkdir()

    async def run() -> tuple[int, int | None]:
        pid = await backend.start(spec)
        seen = backend.pid(spec)  # what the agent's monitor asks
        await backend.stop(spec)
        return pid, seen

    try:
        pid, seen = asyncio.run(run())
        assert seen == pid
    finally:
        reap(tmp_path)
