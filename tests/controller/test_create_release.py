"""A create gives back its reservation and its name on every way out: an error between
the host's answer and the record (here: recording it fails) left the name held, so every
later create of it was vm_exists and the host could never be deregistered."""

from __future__ import annotations

import pytest

from fuse.controller.service import Controller
from fuse.models.hosts import HostCapacity, RegisterHostRequest
from support import start_agent


@pytest.fixture
async def ctl(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    c = Controller(tmp_path / "ctl", poll_interval=0.2)
    await c.start()
    try:
        await c.register_host(RegisterHostRequest(id="h1", url=agent.url, token=agent.token, backend="qemu",
                                                  capacity=HostCapacity(vm_count=4, cpus=2, ram_mb=2048)))
        yield c
    finally:
        for v in c.vms.list():
            try:
                await c.vms.delete(v["name"], v["host"])
            except Exception:
                pass
        await c.close()
        agent.stop()


async def test_an_error_after_the_hosts_answer_gives_back_the_name_and_the_room(ctl, monkeypatch):
    record = ctl.vms._record

    def broken(host, vm):
        raise RuntimeError("the store failed")

    monkeypatch.setattr(ctl.vms, "_record", broken)
    with pytest.raises(RuntimeError):
        await ctl.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 60"})
    assert ctl.vms.placing_on("h1").count == 0 and ctl.vms.pending_on("h1").count == 0  # no room held
    assert ctl.vms._naming == {}  # and the name not held: a later create of it is not refused for it
    monkeypatch.setattr(ctl.vms, "_record", record)
    other = await ctl.vms.create({"name": "other", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 60"})
    assert other["host"] == "h1"
