"""Review 33: a deregister reads the host once more so that its events up to then are in the
merged stream before ``host_removed`` (README) — but that read was one poll, one page of 500
events: the rest of a backlog (an agent that logged while the controller was down, or while it
was cut off) never entered the stream. The last read goes on, a page a poll, until it is read out."""

from __future__ import annotations

import httpx

import fuse
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
