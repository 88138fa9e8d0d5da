"""Moves between real agent processes (fake backend): a move to the source
machine under another host id is refused at once, and a chunk read that
meets a dropped connection is sent again instead of failing the move."""

from __future__ import annotations

import time

import httpx
import pytest

import fuse
from support import Proxy, reap, start_agent, start_controller, wait_until


class DropFirstChunkRead(Proxy):
    """A loopback TCP proxy in front of an agent that hangs up, without a
    word, on the connection carrying the first chunk read of a move: what a
    kept-alive connection the agent closed as it was reused looks like."""

    dropped = 0

    def _forward(self, data: bytes) -> bool:
        """Whether a request's bytes go on (False: hang up)."""
        if not self.dropped and data.startswith(b"GET /v1/host/vms/") and b"/files/" in data:
            self.dropped += 1
            return False
        return True


class Fleet:
    def __init__(self, tmp, env=None):
        self.tmp, self.procs = tmp, []
        self.ctl = start_controller(tmp, env=env)
        self.client = fuse.Client(self.ctl.url)

    def agent(self, name):
        a = start_agent(self.tmp, backend="fake", name=name)
        self.procs.append(a)
        return a

    def add(self, host_id, url, token="agent-token"):
        self.client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=url, token=token, backend="qemu",
                                                            capacity=fuse.HostCapacity(vm_count=10)))
        wait_until(lambda: self.client.hosts.get(host_id).connected, what=f"{host_id} connected")

    def vms_on(self, agent):
        r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
        return {v["name"]: v for v in r.json()["vms"]}

    def close(self):
        self.client.close()
        self.ctl.stop()
        for p in self.procs:
            p.stop()
        reap(self.tmp)


def vm_body(name, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "count", **kw}


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path, env={"FUSE_MOVE_COPY_PATH": "http"})
    yield f
    f.close()


def test_a_move_to_the_same_machine_under_another_id_is_refused_at_once(fleet):
    a = fleet.agent("agent-a")
    fleet.add("src", a.url)
    fleet.add("alias", a.url)  # the same agent, registered a second time
    wait_until(lambda: fleet.client.hosts.get("alias").agent_id == fleet.client.hosts.get("src").agent_id != "",
               what="both ids carry the agent's identity")
    fleet.client.vms.create(vm_body("job1", host="src"))
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("job1", to="alias")
    assert (info.value.status, info.value.code) == (409, "same_host")
    assert "same machine" in info.value.message and "src" in info.value.message, info.value.message
    # ...and a target chosen by best fit is never the source's alias either
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("job1")
    assert (info.value.status, info.value.code) == (409, "no_target")
    assert fleet.client.moves.list() == []
    assert fleet.vms_on(a)["job1"]["state"] == "running"  # never put to sleep


def test_a_chunk_read_on_a_dropped_connection_is_sent_again_and_the_move_completes(fleet):
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    proxy = DropFirstChunkRead(int(src.url.rsplit(":", 1)[1]))
    try:
        fleet.add("src", f"http://127.0.0.1:{proxy.port}")
        fleet.add("dst", dst.url)
        fleet.client.vms.create(vm_body("job1", host="src"))
        m = fleet.client.moves.create("job1", to="dst")
        m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                       timeout=60, what="the move ends")
        assert proxy.dropped == 1
        assert m["state"] == "done", m["reason"]
        assert m["copy_path"] == "http" and m["copied_bytes"] == m["total_bytes"] > 0
        assert fleet.vms_on(dst)["job1"]["state"] == "running"
    finally:
        proxy.close()


class SlowProxy(DropFirstChunkRead):
    """A loopback TCP proxy in front of an agent that, while ``delay`` is set, holds
    each request that much before passing it on (a busy host's first answer)."""

    delay = 0.0

    def _forward(self, data: bytes) -> bool:
        if self.delay:
            time.sleep(self.delay)
        return True


def test_a_move_asked_right_after_a_controller_restart_waits_for_the_first_poll(fleet):
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    proxy = SlowProxy(int(src.url.rsplit(":", 1)[1]))
    try:
        fleet.add("src", f"http://127.0.0.1:{proxy.port}")
        fleet.add("dst", dst.url)
        fleet.client.vms.create(vm_body("job1", host="src"))
        fleet.client.close()
        fleet.ctl.stop()
        proxy.delay = 1.5  # the restarted controller's first poll of src answers late
        fleet.ctl = start_controller(fleet.tmp)
        fleet.client = fuse.Client(fleet.ctl.url)
        # at once: the poller has not heard from src yet (this was refused "source
        # host src is not connected" until its first answer)
        m = fleet.client.moves.create("job1", to="dst")
        proxy.delay = 0.0
        m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                       timeout=60, what="the move ends")
        assert m["state"] == "done", m["reason"]
        assert fleet.vms_on(dst)["job1"]["state"] == "running"
    finally:
        proxy.close()
