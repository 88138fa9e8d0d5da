from __future__ import annotations

import pytest

import fuse
from support import reap, start_agent, start_controller


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """The registry only reads an agent's probe: one agent serves a module."""
    p = start_agent(tmp_path_factory.mktemp("agent"))
    yield p
    p.stop()


@pytest.fixture
def fleet(tmp_path):
    """A controller and agents (fake backend) started on demand, on loopback: ``agent(name)``
    starts one, ``add(id, agent, ...)`` registers it, ``restart()`` restarts the controller
    on the same state. A module may define its own ``fleet``."""
    procs = []

    def agent(name, **kw):
        p = start_agent(tmp_path, backend="fake", name=name, **kw)
        procs.append(p)
        return p

    ctl = start_controller(tmp_path)
    procs.append(ctl)
    client = fuse.Client(ctl.url)

    def add(host_id, a, vm_count=10, ram_mb=4096, cpus=4):
        return client.hosts.register(fuse.RegisterHostRequest(
            id=host_id, url=a.url, token=a.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=vm_count, ram_mb=ram_mb, cpus=cpus)))

    def restart(env=None):
        """Stop the controller and start it again on the same state dir (with ``env``:
        test hooks such as FUSE_TEST_PAUSE_AT)."""
        nonlocal client
        fleet_.ctl.stop()
        client.close()
        fleet_.ctl = start_controller(tmp_path, env=env)
        procs.append(fleet_.ctl)
        client = fleet_.client = fuse.Client(fleet_.ctl.url)

    fleet_ = type("Fleet", (), {"agent": staticmethod(agent), "add": staticmethod(add), "client": client,
                                "ctl": ctl, "tmp": tmp_path, "restart": staticmethod(restart)})
    yield fleet_
    fleet_.client.close()
    for p in procs:
        p.stop()
    reap(tmp_path)
