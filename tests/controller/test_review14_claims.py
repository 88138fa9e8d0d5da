"""Review 14: a create's claim of a prewarmed VM, and a create's count against the host's
vm_count policy, with fake-backend agents over real HTTP.

A claim is a placement: a cordoned host gives none of its standby VMs to a create. And a
VM a create has just made counts once toward its host's vm_count policy, also when the
poller read the host's summary while the host made it."""

from __future__ import annotations

import socket
import time

import pytest

import fuse
from support import Proxy, api_error, wait_until

SHAPE = {"vcpus": 1, "mem_mib": 256}


def placed(client, name: str) -> dict:
    (e,) = [e for e in client.events.list(0, limit=500)["events"] if e["type"] == "placed" and e.get("vm") == name]
    return e


@pytest.mark.timeout(120)
def test_a_create_claims_no_prewarmed_vm_on_a_cordoned_host_and_boots_one_elsewhere(fleet):
    a, b = fleet.agent("a"), fleet.agent("b")
    fleet.add("a", a)
    fleet.add("b", b)
    c = fleet.client
    wait_until(lambda: c.hosts.get("a").connected and c.hosts.get("b").connected, timeout=30, what="hosts connected")
    pw = c.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=256, on="host:a"))
    wait_until(lambda: next(p for p in c.pool.prewarms() if p.id == pw.id).ready == 2, timeout=60, interval=0.2,
               what="2 ready on a")

    c.hosts.cordon("a")
    vm = c.vms.create(name="job", shape=SHAPE, entry="sleep 600")
    assert vm["host"] == "b" and not placed(c, "job").get("prewarmed")  # booted anew where placement may go
    standby = [v for v in c.vms.list() if v["name"].startswith(pw.id)]
    assert len(standby) == 2 and all(v["host"] == "a" and v["standby"] for v in standby)  # none claimed

    c.hosts.uncordon("a")  # placement may use it again: its standby VMs are claimed again
    vm = c.vms.create(name="job2", shape=SHAPE, entry="sleep 600")
    assert vm["host"] == "a" and placed(c, "job2")["prewarmed"].startswith(pw.id + "-")
    assert c.pool.remove_prewarm(pw.id)


class HoldCreated(Proxy):
    """A proxy that holds each ``201 Created`` answer ``secs`` after the agent sent it: the
    agent has made the VM, and the controller's poller reads its summary meanwhile."""
    secs = 0.0

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        if requests:
            return super()._pipe(src, dst, requests)
        try:
            while data := src.recv(65536):
                if data.startswith(b"HTTP/1.1 201") and self.secs:
                    time.sleep(self.secs)
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)


@pytest.mark.timeout(120)
def test_a_vm_just_created_counts_once_toward_the_vm_count_policy_when_a_poll_read_it_meanwhile(fleet):
    agent = fleet.agent("own1")
    proxy = HoldCreated(int(agent.url.rsplit(":", 1)[1]))
    try:
        c = fleet.client
        c.hosts.register(fuse.RegisterHostRequest(id="own1", url=proxy.url, token=agent.token, backend="qemu",
                                                  capacity=fuse.HostCapacity(vm_count=3, ram_mb=4096, cpus=4)))
        wait_until(lambda: c.hosts.get("own1").connected, timeout=30, what="own1 connected")
        c.vms.create(name="v1", host="own1", shape=SHAPE, entry="sleep 600")
        proxy.secs = 2.5  # (two polls, a second apart, read own1's summary while it answers the create)
        c.vms.create(name="v2", host="own1", shape=SHAPE, entry="sleep 600")
        proxy.secs = 0
        # at once: 2 VMs on own1, its policy 3 — the third fits (it was fleet_full, "vm_count policy 3 reached")
        c.vms.create(name="v3", host="own1", shape=SHAPE, entry="sleep 600")
        assert sorted(v["name"] for v in c.vms.list() if v["host"] == "own1") == ["v1", "v2", "v3"]
        e = api_error(c.vms.create, name="v4", host="own1", shape=SHAPE, entry="sleep 600")
        assert e.code == "fleet_full" and "vm_count" in str(e.details)  # the policy still holds
    finally:
        proxy.close()
