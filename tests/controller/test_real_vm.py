"""The controller placing a real QEMU VM: a real agent with the real guest
bundle next to a fake-backend agent, both registered in a real controller;
and the async SDK against the fake backend."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import fuse
from fuse.agent.backends.base import pids_mentioning
from support import install_bundle, real_bundle_dir, start_agent, start_controller, wait_until



def qemu_pids(marker: Path) -> list[int]:
    """QEMU processes whose command line mentions `marker` (this test's tmp dir)."""
    return pids_mentioning(marker, b"qemu-system")


@pytest.mark.qemu
@pytest.mark.timeout(420)
def test_a_vm_placed_through_the_controller_boots_prints_is_metered_and_goes(tmp_path, procs):
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    install_bundle(real_bundle_dir(), tmp_path / "real")  # before the agent starts: it lists bundles at boot
    procs.append(real := start_agent(tmp_path, backend="qemu", name="real"))
    procs.append(fake := start_agent(tmp_path, backend="fake", name="fake"))
    procs.append(ctl := start_controller(tmp_path))
    t0 = int(time.time()) - 1
    with fuse.Client(ctl.url) as client:
        for host_id, agent, ram in (("real", real, 2048), ("fake", fake, 256)):
            client.hosts.register(fuse.RegisterHostRequest(
                id=host_id, url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=4, ram_mb=ram, cpus=2)))
        wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="hosts connected")

        # Best fit, not a pin: the fake host's 256 MiB cannot hold 384, so the VM lands on the real one.
        vm = client.vms.create(name="hello", shape={"vcpus": 1, "mem_mib": 384},
                               entry="echo FUSE-MARKER-$((6*7)); while true; do sleep 1; done")
        assert (vm["name"], vm["host"]) == ("hello", "real") and vm["state"] in ("booting", "running")
        assert len(qemu_pids(tmp_path)) == 1

        text = ""

        def printed() -> bool:
            nonlocal text
            text = client.vms.console("hello")["text"]
            return "FUSE-MARKER-42" in text

        wait_until(printed, timeout=120, interval=0.5, what="the guest's marker on the console")

        listed = {v["name"]: v for v in client.vms.list()}
        assert listed["hello"]["host"] == "real" and listed["hello"]["state"] == "running"
        assert client.vms.get("hello")["host"] == "real"

        def seen(pred) -> bool:
            return any(pred(e) for e in client.events.list(0, limit=500)["events"])

        assert seen(lambda e: e["type"] == "placed" and e.get("vm") == "hello" and e.get("host") == "real")
        wait_until(lambda: seen(lambda e: e["type"] == "vm_state" and e.get("vm") == "hello"
                                and e.get("host") == "real" and e.get("to") == "running"),
                   timeout=30, what="the host's vm_state event merged into the controller's stream")

        def metered() -> dict | None:
            rows = [r for r in client.usage(from_=t0)["vms"] if r["vm"] == "hello"]
            return rows[0] if rows and float(rows[0]["cpu_seconds"]) > 0 else None

        wait_until(metered, timeout=30, interval=0.5, what="usage with cpu_seconds > 0")
        row = metered()
        assert row["host"] == "real" and float(row["wall_seconds"]) > 0

        client.vms.delete("hello")
        assert "hello" not in {v["name"] for v in client.vms.list()}
        wait_until(lambda: not qemu_pids(tmp_path), timeout=15, what="the QEMU process gone")


async def test_the_async_client_registers_creates_lists_and_follows_events(tmp_path, procs):
    procs.append(agent := start_agent(tmp_path, backend="fake", name="a1"))
    procs.append(ctl := start_controller(tmp_path))
    async with fuse.AsyncClient(ctl.url) as c:
        host = await c.hosts.register(fuse.RegisterHostRequest(
            id="h1", url=agent.url, token=agent.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=4, ram_mb=2048, cpus=2)))
        assert host.id == "h1"
        vm = await c.vms.create(shape={"vcpus": 1, "mem_mib": 256}, entry="echo hi")
        assert vm["host"] == "h1" and vm["name"].startswith("vm-")
        assert [v["name"] for v in await c.vms.list()] == [vm["name"]]
        types = []
        async for e in c.events.afollow(0, wait_s=2):
            types.append(e["type"])
            if e["type"] == "placed":
                assert e["vm"] == vm["name"] and e["host"] == "h1"
                break
        assert "host_added" in types and types[-1] == "placed"
        await c.vms.delete(vm["name"])
        assert await c.vms.list() == []
