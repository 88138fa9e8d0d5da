"""VMs through the controller, from review 25 (issue 4): a delete, sleep or wake its host got
but never answered (a timeout, a dropped connection) may still be carried out: the 502 says
so, as a create's does (was: a plain "did not answer", and the VM found deleted or asleep later)."""

from __future__ import annotations

import pytest

import fuse
from support import Proxy, api_error, start_agent, start_controller, wait_until


class NoReplyTo(Proxy):
    """Passes requests on; the answer to one that starts with ``prefix`` never comes back
    (the connection is cut as it arrives): the host got it and did it, the caller heard nothing."""

    def __init__(self, upstream_port: int):
        super().__init__(upstream_port)
        self.prefix: bytes | None = None
        self._cut: set[int] = set()

    def _passes(self, src, dst, data, requests):
        if requests and self.prefix and data.startswith(self.prefix):
            self._cut.add(id(dst))  # (dst: the upstream socket its answer comes back on)
            self.prefix = None
        return requests or id(src) not in self._cut


@pytest.fixture
def one_host(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    proxy = NoReplyTo(int(agent.url.rsplit(":", 1)[1]))
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    client.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=4)))
    yield client, proxy
    client.close()
    ctl.stop()
    proxy.close()
    agent.stop()


@pytest.mark.parametrize("action", ["delete", "sleep", "wake"])
def test_an_unanswered_action_is_a_502_saying_it_may_still_happen(one_host, action):
    client, proxy = one_host
    client.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "count", "host": "h1"})
    if action == "wake":
        client.vms.sleep("v1")
    proxy.prefix = b"DELETE /v1/host/vms/v1" if action == "delete" else f"POST /v1/host/vms/v1/{action}".encode()
    err = api_error(getattr(client.vms, action), "v1")
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert f"host h1 did not answer the {action} of vm v1" in err.message, err.message
    assert f"it may still {action} it when it answers again" in err.message, err.message
    assert err.details == {"host": "h1", "vm": "v1"}
    # and it did: the host carried it out
    if action == "delete":
        assert "v1" not in [v["name"] for v in client.vms.list()] or api_error(client.vms.get, "v1").status == 404
    else:
        want = "sleeping" if action == "sleep" else "running"
        wait_until(lambda: client.vms.get("v1")["state"] == want, timeout=20, what=f"v1 {want}")


def test_a_read_of_a_vm_on_a_host_held_disconnected_waits_seconds_not_the_full_time(tmp_path):
    """(was: every GET of the VM, and its console, waited the full 10 s to learn what the
    poller knew: the host does not answer)"""
    import os
    import signal

    agent = start_agent(tmp_path, backend="fake", name="a1")
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        client.hosts.register(fuse.RegisterHostRequest(id="h1", url=agent.url, token=agent.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=4)))
        client.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "count", "host": "h1"})
        os.kill(agent.popen.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not client.hosts.get("h1").connected, timeout=90, what="h1 held disconnected")
            for read in (client.vms.get, client.vms.console):
                err = api_error(read, "v1")
                assert (err.status, err.code) == (502, "host_unreachable"), err
                assert "nothing came back within 3 s" in err.message, err.message
        finally:
            os.kill(agent.popen.pid, signal.SIGCONT)
        # back: read at once, as before
        wait_until(lambda: client.vms.get("v1")["state"] == "running", timeout=30, what="v1 read again")
    finally:
        client.close()
        ctl.stop()
        agent.stop()
