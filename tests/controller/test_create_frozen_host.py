"""A create sent to a host whose agent stops answering (frozen: SIGSTOP) fails once the
poller finds the host gone (two failed polls), not after the create's whole 180-s wait;
the host may still have the request, so nothing else is tried and, once it answers
again, the VM list shows whatever it did with it."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

import fuse
from support import wait_until


@pytest.mark.timeout(240)
def test_a_create_on_a_host_that_freezes_fails_when_its_polls_do_not_after_180_s(fleet):
    a = fleet.agent("a")
    fleet.add("a", a, vm_count=4, ram_mb=4096, cpus=4)
    client = fleet.client
    wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="host connected")
    os.kill(a.popen.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(fuse.ApiError) as err:
            client.vms.create(name="cold", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        took = time.monotonic() - t0
        assert err.value.status == 502 and err.value.code == "host_unreachable", err.value
        assert "a" in err.value.details.get("host", "") and "may still create it" in err.value.message
        assert took < 60, took  # the poller's verdict (5-s polls, two in a row), not the create's 180 s
    finally:
        os.kill(a.popen.pid, signal.SIGCONT)
    # once the agent answers again, the controller lists what it did with the request (it may
    # have made the VM, or dropped the request its caller had hung up on): the agent's own list
    wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=60, what="host connected again")
    agent = httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=10)
    with agent:
        wait_until(lambda: sorted(v["name"] for v in client.vms.list())
                   == sorted(v["name"] for v in agent.get("/v1/host/vms").json()["vms"]),
                   timeout=60, what="the controller's list matching the agent's")
        assert [v["name"] for v in client.vms.list()] in ([], ["cold"])  # never twice, nowhere else
    if client.vms.list():
        client.vms.delete("cold")
