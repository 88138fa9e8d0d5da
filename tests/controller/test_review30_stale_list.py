"""A host's VM list read before a create landed, answered after the create was
recorded: the VM stays known (its row was dropped, and its delete answered 404
while it ran on)."""

from __future__ import annotations

import threading
import time

import pytest

import fuse
from support import Proxy, agent_vms, reap, start_agent, start_controller, wait_until

pytestmark = pytest.mark.timeout(120)

LIST = b"GET /v1/host/vms "


class SlowListProxy(Proxy):
    """Holds the answer (not the request) to the next VM list read, once: the host
    lists its VMs at once and the list reaches the controller ``secs`` later."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self.secs = 0.0
        self.holding = threading.Event()
        self._asked: dict[int, bytes] = {}  # client socket -> the start of its last request

    def _passes(self, src, dst, data, requests):
        if requests:
            self._asked[src.fileno()] = data[:len(LIST)]
        elif self.secs and self._asked.get(dst.fileno()) == LIST:
            secs, self.secs = self.secs, 0.0
            self.holding.set()
            time.sleep(secs)
            self.holding.clear()
        return super()._passes(src, dst, data, requests)


def test_a_vm_created_while_a_stale_list_was_on_its_way_stays_known(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    proxy = SlowListProxy(int(agent.url.rsplit(":", 1)[1]))
    ctl = start_controller(tmp_path)
    try:
        with fuse.Client(ctl.url) as c:
            c.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                                      capacity=fuse.HostCapacity(vm_count=4)))
            wait_until(lambda: c.hosts.get("h1").connected, timeout=30, what="h1 connected")
            shape = {"vcpus": 1, "mem_mib": 128}
            c.vms.create(name="zero", shape=shape, entry="sleep 600")  # (the first polls' lists are read)
            wait_until(lambda: "zero" in agent_vms(agent), timeout=20, what="zero listed")
            time.sleep(1.5)  # (its events read, and the list they prompt)
            proxy.secs = 3.0  # (the list the poller reads after the next VM's events)
            c.vms.create(name="first", shape=shape, entry="sleep 600")
            assert proxy.holding.wait(20), "the poller read the VM list"
            c.vms.create(name="late", shape=shape, entry="sleep 600")  # made after the held list was read
            wait_until(lambda: not proxy.holding.is_set(), timeout=20, what="the held list delivered")
            time.sleep(0.3)  # (the controller has taken the list in)
            assert "late" in [v["name"] for v in c.vms.list()]
            c.vms.delete("late")  # was 404 "vm late not found", the VM running on
            assert "late" not in agent_vms(agent)
            # a VM the host no longer has still goes with the next list
            httpx_delete(agent, "first")
            wait_until(lambda: "first" not in [v["name"] for v in c.vms.list()], timeout=20,
                       what="a VM deleted past the controller dropped from its list")
    finally:
        proxy.close()
        ctl.stop()
        agent.stop()
        reap(tmp_path)


def httpx_delete(agent, name: str) -> None:
    import httpx
    r = httpx.delete(f"{agent.url}/v1/host/vms/{name}", headers={"Authorization": f"Bearer {agent.token}"},
                     timeout=30)
    assert r.status_code in (200, 204), r.text
