"""The store on both engines: SQLite (embedded default) and a real,
throwaway PostgreSQL server; two controllers sharing one PostgreSQL fleet."""

from __future__ import annotations

import time

import pytest

import fuse
from fuse.controller.store import Store, engine_url
from support import reap, start_agent, start_controller, wait_until


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return None
    pg = request.getfixturevalue("postgres")
    return pg.create_db(f"fuse_{abs(hash(str(tmp_path))) % 10**8}")


def test_registry_round_trip_and_restart(tmp_path, agent, db_url):
    ctl = start_controller(tmp_path, db=db_url)
    try:
        with fuse.Client(ctl.url) as c:
            c.hosts.register(fuse.RegisterHostRequest(id="h1", url=agent.url, token=agent.token,
                                                      capacity=fuse.HostCapacity(vm_count=3)))
            c.hosts.cordon("h1")
    finally:
        ctl.stop()
    ctl = start_controller(tmp_path, db=db_url)
    try:
        with fuse.Client(ctl.url) as c:
            h = c.hosts.get("h1")
            assert h.state == "cordoned" and h.capacity.vm_count == 3
    finally:
        ctl.stop()
    if db_url is None:
        assert (tmp_path / "controller" / "fuse.db").exists()


def test_two_controllers_share_one_postgresql_fleet(tmp_path, agent, postgres):
    url = postgres.create_db("fuse_shared")
    a = start_controller(tmp_path, db=url, name="ctl-a")
    b = start_controller(tmp_path, db=url, name="ctl-b")
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            ca.hosts.register(fuse.RegisterHostRequest(id="shared", url=agent.url, token=agent.token,
                                                       capacity=fuse.HostCapacity(vm_count=2)))
            assert [h.id for h in cb.hosts.list()] == ["shared"]
            cb.hosts.cordon("shared")
            assert ca.hosts.get("shared").state == "cordoned"
    finally:
        a.stop()
        b.stop()


def test_events_get_increasing_ids_on_both_engines(tmp_path, db_url):
    store = Store(db_url and engine_url(db_url, tmp_path) or engine_url(None, tmp_path))
    try:
        for i in range(5):
            store.add_event("placed", {"i": i}, host="h")
        got = store.events_after(0)
        assert [e["data"]["i"] for e in got] == list(range(5))
        assert [e["id"] for e in got] == sorted(e["id"] for e in got)
        assert store.events_after(got[2]["id"])[0]["data"]["i"] == 3
    finally:
        store.close()


def test_a_reader_never_passes_an_event_id_a_slower_replica_commits_later(tmp_path, postgres):
    # Two replicas on one PostgreSQL: A draws an event id and holds its transaction open;
    # B's event must not become visible before A's, or a reader at B's id skips A's for good.
    import threading

    url = postgres.create_db("fuse_event_order")
    a, b = Store(engine_url(url, tmp_path)), Store(engine_url(url, tmp_path))
    try:
        drawn, release, b_done = threading.Event(), threading.Event(), threading.Event()

        def slow_a():
            with a.tx() as c:
                a.add_event("placed", {"by": "a"}, conn=c)
                drawn.set()
                release.wait(10)

        def quick_b():
            b.add_event("placed", {"by": "b"})
            b_done.set()

        ta = threading.Thread(target=slow_a)
        ta.start()
        assert drawn.wait(10)
        tb = threading.Thread(target=quick_b)
        tb.start()
        time.sleep(0.5)
        # B waits for A's transaction (writes are serialised), so nothing is visible yet
        assert not b_done.is_set() and b.events_after(0) == []
        release.set()
        ta.join(10)
        tb.join(10)
        assert [e["data"]["by"] for e in b.events_after(0)] == ["a", "b"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("state,record,holds", [
    ("creating", {}, True),
    ("running", {}, True),
    ("sleeping", {}, False),
    ("sleeping", {"move_id": "mv-1", "move_role": "source", "return_room": True}, True),
    ("sleeping", {"move_id": "mv-1", "move_role": "source", "return_room": False}, False),
    ("sleeping", {"reserved": True}, True),
    ("exited", {}, False),
    ("failed", {}, False),
], ids=["a creating vm holds its room", "a running vm holds its room", "a sleeping vm gave its room back",
        "the source copy of a running vm's move keeps its room to come home to",
        "the source copy of a sleeping vm's move holds nothing", "a reserved sleeping copy keeps its room",
        "an exited vm holds nothing", "a failed vm holds nothing"])
def test_allocated_counts_only_vms_that_hold_room_on_both_engines(tmp_path, db_url, state, record, holds):
    from fuse.controller.store import vms
    store = Store(db_url and engine_url(db_url, tmp_path) or engine_url(None, tmp_path))
    try:
        with store.tx() as c:
            c.execute(vms.delete())
            c.execute(vms.insert().values(name="base", host="h", vcpus=1, mem_mib=256, state="running",
                                          record={}, created_at=0))
            c.execute(vms.insert().values(name="vm", host="h", vcpus=2, mem_mib=1024, state=state,
                                          record={"state": state, **record}, created_at=0))
        want = {"vm_count": 2, "cpus": 3, "ram_mb": 1280} if holds else {"vm_count": 1, "cpus": 1, "ram_mb": 256}
        assert store.allocated() == {"h": want}
    finally:
        store.close()


def test_replicas_report_a_host_connecting_and_going_away_once(tmp_path, postgres):
    url = postgres.create_db("fuse_links")
    ag = start_agent(tmp_path, backend="fake", name="agent-links")
    a = start_controller(tmp_path, db=url, name="ctl-a")
    b = start_controller(tmp_path, db=url, name="ctl-b")
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            ca.hosts.register(fuse.RegisterHostRequest(id="shared", url=ag.url, token=ag.token,
                                                       capacity=fuse.HostCapacity(vm_count=2)))
            wait_until(lambda: ca.hosts.get("shared").connected and cb.hosts.get("shared").connected,
                       what="both replicas connected")
            time.sleep(2.5)  # both pollers have seen the host several times
            ag.stop()
            wait_until(lambda: not ca.hosts.get("shared").connected and not cb.hosts.get("shared").connected,
                       timeout=30, what="both replicas see the host gone")
            time.sleep(1.5)

            def link_events(client):
                return [e["type"] for e in client.events.list(0, limit=500)["events"]
                        if e["type"] in ("host_connected", "host_disconnected") and e["host"] == "shared"]
            assert link_events(ca) == link_events(cb) == ["host_connected", "host_disconnected"]
    finally:
        a.stop()
        b.stop()
        ag.stop()
        reap(tmp_path)


@pytest.mark.parametrize("state,record,arrived,holds", [
    ("starting", {}, False, True),
    ("sleeping", {}, False, True),
    ("copying", {}, False, True),
    ("waking", {}, False, True),
    ("waking", {}, True, False),
    ("rolling_back", {}, False, True),
    ("rolling_back", {"target_clear": True}, False, False),
    ("done", {}, False, False),
    ("failed", {}, False, False),
], ids=["a move that chose its target holds the room there", "so does one whose source sleeps",
        "so does one copying", "so does one waking", "a vm woken on the target is counted by its own row, once",
        "a move rolling back holds it until the target's side is aborted", "then it holds nothing",
        "a finished move holds nothing (the vm's row does)", "a failed move holds nothing"])
def test_allocated_counts_a_moves_room_on_its_target_on_both_engines(tmp_path, db_url, state, record, arrived, holds):
    from fuse.controller.store import moves, vms
    store = Store(db_url and engine_url(db_url, tmp_path) or engine_url(None, tmp_path))
    vm = {"name": "vm", "shape": {"vcpus": 2, "mem_mib": 1024}}
    try:
        with store.tx() as c:
            c.execute(vms.delete())
            c.execute(moves.delete())
            c.execute(vms.insert().values(name="base", host="t", vcpus=1, mem_mib=256, state="running",
                                          record={}, created_at=0))
            if arrived:
                c.execute(vms.insert().values(name="vm", host="t", vcpus=2, mem_mib=1024, state="running",
                                              record={}, created_at=0))
            c.execute(moves.insert().values(id="mv-1", vm="vm", source="s", target="t", state=state,
                                            record={"vm": vm, **record}, created_at=0, updated_at=0))
        want = {"vm_count": 2, "cpus": 3, "ram_mb": 1280} if holds or arrived else \
            {"vm_count": 1, "cpus": 1, "ram_mb": 256}
        assert store.allocated() == {"t": want}
    finally:
        store.close()
