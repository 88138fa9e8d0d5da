"""A create whose host did not answer: when the request may have reached the host
(it timed out or the connection dropped after it was sent), the host may still
create the VM, so no other host is tried — the VM would run in two places; when the
connection never opened, the next host takes it as before."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest

from fuse.controller.app import Controller
from fuse.errors import HostUnreachable

BODY = {"name": "job1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "echo hi"}


class Conn:
    def __init__(self, host: str, calls: list, sent: bool | None):
        self.host, self.calls, self.sent = host, calls, sent

    async def request(self, method, path, **kw):
        self.calls.append(self.host)
        if self.sent is None:  # this host answers
            vm = {"name": kw["json"]["name"], "state": "running", "shape": kw["json"]["shape"]}
            return httpx.Response(201, json=vm)
        exc = HostUnreachable(f"{self.host} did not answer in time")
        exc.maybe_sent = self.sent
        raise exc


@pytest.fixture
def ctl(tmp_path):
    c = Controller(tmp_path / "ctl")
    now = time.time()
    views = {}
    for host, cap in (("a", 1024), ("b", 4096)):  # best fit takes a (the tighter fit) first
        with c.store.tx() as conn:
            c.store.put_host(conn, dict(id=host, url=f"http://127.0.0.1:1/{host}", token="", region="", backend="fake",
                                        labels={}, capacity={"cpus": 4, "ram_mb": cap, "vm_count": 8},
                                        state="active", agent_id=host, last_seen=now, created_at=now, updated_at=now))
        views[host] = SimpleNamespace(summary={"free_vcpus": 4, "free_mem_mib": cap, "vm_count": 0},
                                      connected=True, error="")
    yield c, views
    c.store.close()


def run(c, views, behaviour: dict):
    calls: list[str] = []
    conns = {h: Conn(h, calls, sent) for h, sent in behaviour.items()}
    async def polled(ids, timeout):  # (every view here is read already)
        return None
    c.fleet = SimpleNamespace(views=views, conn=lambda h: conns[h], upsert_vms=lambda h, vms: None,
                              changed=asyncio.Event(), first_polls=polled)
    try:
        return asyncio.run(c.vms.create(dict(BODY))), calls
    except HostUnreachable as exc:
        return exc, calls


def test_a_create_the_host_may_have_got_is_not_tried_elsewhere(ctl):
    c, views = ctl
    got, calls = run(c, views, {"a": True, "b": None})
    assert isinstance(got, HostUnreachable) and calls == ["a"]  # b never asked: job1 may yet run on a
    assert got.http_status == 502 and "may still create it" in got.message and got.details["host"] == "a"
    assert c.vms.pending_on("a").count == 0  # no reservation left behind


def test_a_create_that_never_reached_its_host_goes_to_the_next(ctl):
    c, views = ctl
    got, calls = run(c, views, {"a": False, "b": None})
    assert calls == ["a", "b"] and got["host"] == "b"
    assert c.vms.pending_on("a").count == 0 and c.vms.pending_on("b").count == 0


def test_a_stored_address_that_is_not_one_makes_its_host_unreachable_not_a_crash(tmp_path):
    # (a host stored before addresses were checked: its poller and its calls say why)
    from fuse.controller.fleet import Fleet

    c = Controller(tmp_path / "ctl")
    now = time.time()
    with c.store.tx() as conn:
        c.store.put_host(conn, dict(id="old", url="http://127.0.0.1:99999", token="", region="", backend="fake",
                                    labels={}, capacity={"cpus": 1, "ram_mb": 1024, "vm_count": 1}, state="active",
                                    agent_id="", last_seen=now, created_at=now, updated_at=now))
    try:
        with pytest.raises(HostUnreachable) as info:
            Fleet(c).conn("old")
        assert "address is not valid" in info.value.message and info.value.maybe_sent is False
    finally:
        c.store.close()
