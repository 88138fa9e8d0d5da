"""`client.hosts.add` with the SDK's own capacity record (review 32, finding 3), against a
real controller and agent: a `HostCapacity` is sent as `register` sends it, not a
`TypeError` from the JSON encoder before anything was sent."""

from __future__ import annotations

import asyncio

import pytest

import fuse
from support import start_agent, start_controller


@pytest.fixture
def fleet(tmp_path, procs):
    procs.append(agent := start_agent(tmp_path, backend="fake", name="a1"))
    procs.append(ctl := start_controller(tmp_path))
    return agent, ctl


CAPACITIES = {
    "a record with vm_count is that vm_count": (fuse.HostCapacity(vm_count=2), 2, None),
    "a record without vm_count takes the short form's default of 16": (fuse.HostCapacity(cpus=1), 16, 1),
    "a dict still works": ({"vm_count": 3}, 3, None),
}


@pytest.mark.parametrize("capacity, vm_count, cpus", CAPACITIES.values(), ids=CAPACITIES.keys())
def test_the_sync_client_adds_a_host_with_a_capacity_record(fleet, capacity, vm_count, cpus):
    agent, ctl = fleet
    with fuse.Client(ctl.url) as client:
        # (was: TypeError: Object of type HostCapacity is not JSON serializable)
        host = client.hosts.add("h1", agent.url, token=agent.token, backend="qemu", capacity=capacity)
        assert host.capacity.vm_count == vm_count
        if cpus is not None:  # (declared below the probe: kept, without a word of it)
            assert host.capacity.cpus == cpus and not [w for w in host.warnings if "cpus" in w], host.warnings
        assert client.hosts.get("h1").capacity.vm_count == vm_count


def test_the_async_client_adds_a_host_with_a_capacity_record(fleet):
    agent, ctl = fleet

    async def main() -> fuse.Host:
        async with fuse.AsyncClient(ctl.url) as client:
            return await client.hosts.add("h1", agent.url, token=agent.token, backend="qemu",
                                          capacity=fuse.HostCapacity(vm_count=2, ram_mb=128))

    host = asyncio.run(main())
    assert (host.id, host.capacity.vm_count, host.capacity.ram_mb) == ("h1", 2, 128)
