"""Review 33: a deregister reads the host once more so that its events up to then are in the
merged stream before ``host_removed`` (README) — but that read was one poll, one page of 500
events: the rest of a backlog (an agent that logged while the controller was down, or while it
was cut off) never entered the stream. The last read goes on, a page a poll, until it is read out."""

from __future__ import annotations

import httpx
import pytest

import fuse
from fuse.errors import Conflict, HostUnreachable
from support import start_controller


def all_events(client: fuse.Client) -> list[dict]:
    out, cursor = [], 0
    while True:
        page = client.events.list(since=cursor, limit=500)
        if not page["events"]:
            return out
        out += page["events"]
        cursor = page["next_cursor"]


def test_a_deregister_reads_the_hosts_whole_backlog_into_the_stream_before_host_removed(tmp_path, fake_agent):
    ctl = start_controller(tmp_path)
    try:
        with fuse.Client(ctl.url) as c:
            c.hosts.register(fuse.RegisterHostRequest(id="hx", url=fake_agent.url, token=fake_agent.token,
                                                      backend="qemu", capacity=fuse.HostCapacity(vm_count=2)))
        ctl.stop()
        # 1,500 events on the agent while no controller reads it (refused creates: no VM starts)
        with httpx.Client(base_url=fake_agent.url, headers={"Authorization": f"Bearer {fake_agent.token}"}) as a:
            for i in range(1500):
                r = a.post("/v1/host/vms", json={"name": f"b{i}", "shape": {"vcpus": 1, "mem_mib": 999999},
                                                 "entry": "true"})
                assert r.status_code == 409, r.text
            last = a.get("/v1/host").json()["last_event_id"]
        ctl = start_controller(tmp_path)
        with fuse.Client(ctl.url) as c:
            c.hosts.deregister("hx")  # (at once: its poller has read a page at most)
            events = all_events(c)
        ids = [e["host_event_id"] for e in events if e.get("host") == "hx" and "host_event_id" in e]
        assert ids and max(ids) == last and len(ids) == len(set(ids)) == last, (len(ids), last)  # (was: 1,000)
        removed = max(i for i, e in enumerate(events) if e["type"] == "host_removed")
        assert all(i < removed for i, e in enumerate(events) if e.get("host") == "hx" and "host_event_id" in e)
    finally:
        ctl.stop()


@pytest.mark.parametrize("later", [HostUnreachable("connection reset"), TimeoutError()], ids=["unreachable", "timeout"])
async def test_a_force_deregister_is_refused_when_the_first_read_answered_however_a_later_page_fails(
        tmp_path, fake_agent, later):
    """The diff review: a page after the first failing with HostUnreachable marked the host 'failed', and
    a force deregister removed a host whose agent had answered that same call (its VMs' records dropped,
    their processes left running)."""
    from fuse.controller.service import Controller
    ctl = Controller(tmp_path / "ctl", poll_interval=1.0)
    await ctl.start()
    try:
        await ctl.register_host(fuse.RegisterHostRequest(id="h1", url=fake_agent.url, token=fake_agent.token,
                                                         backend="qemu", capacity=fuse.HostCapacity(vm_count=4)))
        fleet, real_poll = ctl.fleet, ctl.fleet._poll_once

        async def refresh(host_id):  # the agent answers, a full page read...
            await real_poll(host_id)
            return 500

        async def poll_once(host_id, events=True):  # ... and the next page's read fails
            raise later

        fleet.refresh, fleet._poll_once = refresh, poll_once
        with pytest.raises(Conflict, match="its agent answers"):
            await ctl.deregister_host("h1", force=True)
        assert ctl.store.get_host("h1") is not None
    finally:
        await ctl.close()
