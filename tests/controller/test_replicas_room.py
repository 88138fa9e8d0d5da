"""Two controller replicas on one PostgreSQL store, one agent (fake backend)
behind a loopback proxy that holds each create a while: what one replica is
placing, the other counts (room, the vm_count policy, a deregister), and a
replica survives its database restarting."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import fuse
from support import Proxy, agent_vms, answers, api_error, error_while_db_away, reap, start_agent, start_controller, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

CREATE = b"POST /v1/host/vms "


@pytest.fixture
def replicas(tmp_path, postgres, request):
    """(agent, proxy, replicas a and b, a client of each), host h1 registered through
    a at the proxy's address: vm_count 3, 1024 MiB, 4 vCPUs."""
    url = postgres.create_db(f"fuse_{request.node.name[-40:].lower()}")
    agent = start_agent(tmp_path, backend="fake", name="agent")
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    a = start_controller(tmp_path, db=url, name="ctl-a")
    b = start_controller(tmp_path, db=url, name="ctl-b")
    ca, cb = fuse.Client(a.url), fuse.Client(b.url)
    ca.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                               capacity=fuse.HostCapacity(vm_count=3, ram_mb=1024, cpus=4)))
    wait_until(lambda: ca.hosts.get("h1").connected and cb.hosts.get("h1").connected, timeout=30,
               what="h1 connected on both replicas")
    yield agent, proxy, (a, b), ca, cb
    ca.close()
    cb.close()
    proxy.close()
    for p in (a, b, agent):
        p.stop()
    reap(tmp_path)


def create(ctl_url: str, name: str, out: dict, **kw) -> None:
    with fuse.Client(ctl_url) as c:
        try:
            out[name] = c.vms.create(name=name, shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600", **kw)["host"]
        except fuse.ApiError as err:
            out[name] = err.code


def test_concurrent_creates_through_two_replicas_never_overcommit_a_host(replicas):
    agent, proxy, (a, b), ca, cb = replicas
    proxy.hold[CREATE] = 1.0  # (each create waits on the host a second: the replicas overlap)
    out: dict[str, str] = {}
    threads = [threading.Thread(target=create, args=((a if i % 2 else b).url, f"r{i}", out)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(out.values()) == ["fleet_full"] * 3 + ["h1"] * 3, out
    assert len(agent_vms(agent)) == 3  # the vm_count policy the host was registered with
    # both replicas count the three (read once both have recorded them: under a loaded full run
    # one replica read 2 at the instant the creates answered)
    wait_until(lambda: ca.hosts.get("h1").allocated.vm_count == 3 == cb.hosts.get("h1").allocated.vm_count,
               timeout=10, what="both replicas count the host's 3 VMs")


def test_a_deregister_through_one_replica_waits_for_a_create_through_the_other(replicas):
    agent, proxy, (a, b), ca, cb = replicas
    proxy.hold[CREATE] = 3.0
    out: dict[str, str] = {}
    t = threading.Thread(target=create, args=(b.url, "late", out), kwargs={"host": "h1"})
    t.start()
    wait_until(lambda: proxy.held >= 1, timeout=30, what="the create held at the proxy")
    err = api_error(ca.hosts.deregister, "h1")
    assert err.status == 409 and err.code == "conflict" and "vm late" in err.message, err
    t.join(60)
    assert out == {"late": "h1"}
    assert [h.id for h in ca.hosts.list()] == ["h1"] and "late" in agent_vms(agent)


def test_a_replica_sees_hosts_added_through_another_after_its_database_restarts(replicas, postgres, tmp_path):
    agent, proxy, (a, b), ca, cb = replicas
    postgres.down()
    time.sleep(3)  # (several of the replicas' host-registry reads fail meanwhile)
    postgres.up()
    wait_until(lambda: answers(ca) and answers(cb), timeout=60, what="both replicas reading the store again")
    other = start_agent(tmp_path, backend="fake", name="agent2")
    try:
        cb.hosts.register(fuse.RegisterHostRequest(id="h2", url=other.url, token=other.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=2, ram_mb=512, cpus=2)))
        wait_until(lambda: ca.hosts.get("h2").connected, timeout=30, what="h2 connected on the other replica")
        assert ca.vms.create(name="there", host="h2", shape={"vcpus": 1, "mem_mib": 128}, entry="true")["host"] == "h2"
    finally:
        other.stop()


def test_a_replica_without_its_database_says_so_with_503(replicas, postgres):
    agent, proxy, (a, b), ca, cb = replicas
    health = a.url  # (unix socket: the health check needs no token either way)
    postgres.down()
    try:
        err = api_error(ca.hosts.list)
        assert (err.status, err.code) == (503, "db_unavailable"), err
        assert "cannot reach its database" in err.message
        with httpx.Client(transport=httpx.HTTPTransport(uds=health[len("unix://"):])) as h:
            r = h.get("http://controller/v1/healthz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "db_unavailable", r.text
    finally:
        postgres.up()
    wait_until(lambda: answers(ca), timeout=60, what="the replica reading the store again")
    with httpx.Client(transport=httpx.HTTPTransport(uds=health[len("unix://"):])) as h:
        assert h.get("http://controller/v1/healthz").json() == {"status": "ok"}


def test_one_vm_moved_through_two_replicas_at_once_gets_one_move(replicas, tmp_path):
    agent, proxy, (a, b), ca, cb = replicas
    other = start_agent(tmp_path, backend="fake", name="agent2")
    try:
        ca.hosts.register(fuse.RegisterHostRequest(id="h2", url=other.url, token=other.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=2, ram_mb=512, cpus=2)))
        wait_until(lambda: cb.hosts.get("h2").connected, timeout=30, what="h2 connected on both replicas")
        ca.vms.create(name="m", host="h1", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
        proxy.hold[b"GET /v1/host/vms/m "] = 1.0  # (both replicas read the VM before either records a move)
        out: dict[str, object] = {}

        def move(client: fuse.Client, key: str) -> None:
            try:
                out[key] = client.moves.create("m", to="h2")["id"]
            except fuse.ApiError as err:
                out[key] = err.code

        threads = [threading.Thread(target=move, args=(c, k)) for c, k in ((ca, "a"), (cb, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(str(v).startswith("mv-") for v in out.values()) == [False, True], out
        assert "move_in_progress" in out.values(), out
        proxy.hold.clear()
        wait_until(lambda: ca.moves.list()[0]["state"] in ("done", "failed"), timeout=60, what="the move's end")
        assert [m["state"] for m in ca.moves.list()] == ["done"]
        assert [(v["name"], v["host"]) for v in ca.vms.list()] == [("m", "h2")]
    finally:
        other.stop()


def test_a_drain_whose_replica_died_is_taken_over_by_another_once(tmp_path, postgres):
    """Replica a drains host old and dies mid-copy of the first move (a test hook);
    replica b, running all along, settles that move (its lease ran out) and takes the
    drain over: one drain resumed, one report, the host empty."""
    from support import agent_states

    url = postgres.create_db("fuse_drain_takeover")
    old, new = (start_agent(tmp_path, backend="fake", name=n) for n in ("old", "new"))
    a = start_controller(tmp_path, db=url, name="ctl-a", env={"FUSE_TEST_CRASH_AT": "chunk:2"})
    b = start_controller(tmp_path, db=url, name="ctl-b")
    procs = [old, new, a, b]
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            for host_id, agent in (("old", old), ("new", new)):
                ca.hosts.register(fuse.RegisterHostRequest(id=host_id, url=agent.url, token=agent.token,
                                                           backend="qemu",
                                                           capacity=fuse.HostCapacity(vm_count=10, ram_mb=8192,
                                                                                      cpus=4)))
            wait_until(lambda: all(h.connected for h in cb.hosts.list()) and len(cb.hosts.list()) == 2,
                       timeout=30, what="both hosts connected on b")
            for n in ("a", "b", "c"):
                ca.vms.create(name=n, host="old", shape={"vcpus": 1, "mem_mib": 2048}, entry="count")
            threading.Thread(target=_quietly, args=(ca.hosts.drain, "old"), daemon=True).start()
            wait_until(lambda: a.popen.poll() is not None, timeout=60, what="replica a to die mid-move")
            wait_until(lambda: sorted(agent_states(new)) == ["a", "b", "c"] and agent_states(old) == {},
                       timeout=120, what="the drain taken over to empty the host")
            events = wait_until(lambda: [e for e in cb.events.list(0, limit=500)["events"]
                                         if e["type"] == "host_drain_report"], timeout=30, what="the drain's report")
            time.sleep(3)  # (a second drain, had one started, would report by now)
            types = [e["type"] for e in cb.events.list(0, limit=500)["events"]]
            assert types.count("host_drain_resumed") == 1 and types.count("host_drain_report") == 1, types
            assert sorted(m["vm"] for m in events[0]["moved"]) == ["a", "b", "c"] and events[0]["stuck"] == []
            assert cb.hosts.get("old").state == "draining"
    finally:
        for p in procs:
            p.stop()
        reap(tmp_path)


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # (the replica dies under the call)
        pass


def test_a_wake_through_one_replica_holds_its_room_from_the_other(replicas):
    """A sleeping VM woken through replica b: while the host has not answered the wake,
    replica a counts its memory as taken (a create that needs it is fleet_full), and once
    woken the VM's own row holds it."""
    agent, proxy, (a, b), ca, cb = replicas
    ca.vms.create(name="big", host="h1", shape={"vcpus": 1, "mem_mib": 768}, entry="sleep 600")
    ca.vms.sleep("big")
    proxy.hold[b"POST /v1/host/vms/big/wake "] = 2.0
    out: dict[str, object] = {}
    t = threading.Thread(target=lambda: out.update(woke=cb.vms.wake("big")["state"]))
    t.start()
    wait_until(lambda: proxy.held >= 1, timeout=30, what="the wake held at the proxy")
    err = api_error(ca.vms.create, name="other", shape={"vcpus": 1, "mem_mib": 512}, entry="true")
    assert err.code == "fleet_full", err
    t.join(60)
    assert out == {"woke": "running"}
    assert api_error(ca.vms.create, name="other", shape={"vcpus": 1, "mem_mib": 512}, entry="true").code == "fleet_full"


def test_a_drain_a_stopping_replica_cancels_lets_its_lease_go_and_a_finished_one_is_left_alone(tmp_path):
    """The drain lease on a store (SQLite here: the rule is the same): a drain cancelled by
    its replica stopping (a resumed drain has no request to wait for) lets the lease go
    at once, and another replica takes it over; one that ended (its report given) is done,
    and a live replica leaves it alone (the next start resumes it)."""
    import asyncio
    import types

    from fuse.controller.moves.drain import MoveDrains, _drain_key
    from fuse.controller.store import Store

    store = Store(f"sqlite:///{tmp_path / 'fuse.db'}")
    with store.tx() as c:
        store.put_host(c, {"id": "old", "url": "http://127.0.0.1:1", "token": "", "region": "", "backend": "qemu",
                           "labels": {}, "capacity": {}, "state": "draining", "agent_id": "", "last_seen": 0.0,
                           "created_at": 0.0, "updated_at": 0.0})

    class Replica(MoveDrains):
        def __init__(self, instance: str, drain_secs: float):
            self.store, self.ctl, self._drains, self.drain_secs = store, types.SimpleNamespace(instance=instance), {}, drain_secs
            self._held_drains, self.ran = set(), []

        async def _drain(self, host_id):
            self.ran.append(host_id)
            await asyncio.sleep(self.drain_secs)
            return {"host": host_id, "moved": [], "stuck": [], "finished": []}

        async def _resumed_drain(self, host_id):
            return await self._drain(host_id)

    async def scenario():
        a, b = Replica("a", 60), Replica("b", 0)
        task = a._drain_task("old")
        await asyncio.sleep(0.2)
        assert b.resume_drains(takeover=True) == []  # a's lease is live
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        lease = store.get_setting(_drain_key("old"))
        assert lease["owner"] == "a" and lease["until"] == 0 and not lease.get("done"), lease
        assert b.resume_drains(takeover=True) == ["old"]  # let go: b takes it over at once
        await b._drains["old"]
        assert b.ran == ["old"] and store.get_setting(_drain_key("old"))["done"] is True
        c = Replica("c", 0)
        assert c.resume_drains(takeover=True) == []  # done: a live replica leaves it alone
        assert c.resume_drains() == ["old"]  # a replica's start resumes it, as one controller's does
        await c._drains["old"]
        # A replica whose renewals failed long enough for another to take its drain over stops its own
        # at its next renewal; one only waiting for the lease is left waiting.
        d, e = Replica("d", 60), Replica("e", 60)
        mine = d._drain_task("old")
        await asyncio.sleep(0.2)
        waiting = e._drain_task("old")
        await asyncio.sleep(0.2)
        e.renew_drains()
        assert not waiting.done() and e.ran == []
        lease = store.get_setting(_drain_key("old"))
        store.put_setting(_drain_key("old"), lease | {"owner": "f"})  # (f took it over)
        d.renew_drains()
        with pytest.raises(asyncio.CancelledError):
            await mine
        assert store.get_setting(_drain_key("old"))["owner"] == "f"  # (d's stop leaves f's lease be)
        waiting.cancel()

    asyncio.run(scenario())
    store.close()


def test_a_killed_replicas_reservation_stops_counting_once_its_vm_is_recorded(replicas):
    """(was: the dead replica's placing row counted the VM's room a second time beside its
    own row until the lease ran out: a create needing that room refused for ~60 s)"""
    agent, proxy, (a, b), ca, cb = replicas
    proxy.hold[CREATE] = 3.0
    out: dict[str, str] = {}
    t = threading.Thread(target=create, args=(a.url, "v", out), kwargs={"host": "h1"})
    t.start()
    time.sleep(1.0)  # (held at the proxy)
    a.popen.kill()  # the replica dies with its reservation recorded
    t.join(30)
    proxy.hold.pop(CREATE, None)
    wait_until(lambda: [v["name"] for v in cb.vms.list()] == ["v"], timeout=30, what="v landed and recorded")
    with fuse.Client(b.url) as c:  # 1024 MiB, 4 vCPUs: v's 256 MiB and this one's 768 fit, not more
        got = c.vms.create(name="w", shape={"vcpus": 1, "mem_mib": 768}, entry="sleep 600")
    assert got["host"] == "h1"


def test_a_dead_replicas_unanswered_create_is_settled_by_another(replicas):
    """(was: only the replica that sent it, or one started later, asked the host about it:
    with that replica dead the name stayed held on the others for good, 409 being_created)"""
    import os
    import signal

    agent, proxy, (a, b), ca, cb = replicas
    os.kill(agent.popen.pid, signal.SIGSTOP)
    try:
        out: dict[str, str] = {}
        create(a.url, "v", out, host="h1")
        assert out["v"] == "host_unreachable"
    finally:
        os.kill(agent.popen.pid, signal.SIGCONT)
    a.popen.kill()  # the replica that holds it in memory dies

    def settled() -> str | None:  # (the host read the create once it resumed and made v, or it did not)
        try:
            return cb.vms.get("v")["host"]
        except fuse.ApiError as err:
            return "gone" if err.code == "not_found" else None
    where = wait_until(settled, timeout=150, what="the host's word on v, read by the live replica")  # (lease: 60 s)
    if where == "gone":
        assert cb.vms.create(name="v", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")["host"] == "h1"
    else:
        assert where == "h1" and api_error(cb.vms.create, name="v", shape={"vcpus": 1, "mem_mib": 256},
                                           entry="sleep 600").code == "vm_exists"


def test_a_create_the_host_made_while_the_database_went_away_says_the_vm_is_there(replicas, postgres):
    """Review 28: answered 503 "try again" while the VM ran on its host (a retried create
    without a name made a second VM), and it never got its `placed`. The answer says it was
    made there; once the database is back it is listed and its `placed` comes, unanswered."""
    agent, proxy, (a, b), ca, cb = replicas
    proxy.hold[CREATE] = 3.0
    err = error_while_db_away(lambda: ca.vms.create(shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600"),
                              proxy, postgres, "create")
    assert err is not None and (err.status, err.code) == (503, "db_unavailable"), err
    name = err.details["vm"]
    assert err.details == {"host": "h1", "vm": name} and "do not create it again" in err.message, err
    assert name in agent_vms(agent)
    wait_until(lambda: answers(ca) and name in [v["name"] for v in ca.vms.list()], timeout=60,
               what="the VM listed once the database is back")
    wait_until(lambda: [e for e in ca.events.list(0, limit=500)["events"]
                        if e["type"] == "placed" and e.get("vm") == name and e.get("unanswered")],
               timeout=60, what="its placed event")


def test_the_merged_stream_has_no_holes_in_its_ids_with_two_replicas_reading_one_host(replicas):
    """Review 28: both replicas store each host event; the one the unique key refused still
    spent an id of PostgreSQL's sequence (64, 68, 69...)."""
    agent, proxy, (a, b), ca, cb = replicas

    done: list[str] = []
    # (one create and delete at a time, each through the other replica than the last: the two
    # replicas read the host's events as they come either way. Creates and deletes racing
    # through both at once were flaky here — a create fleet_full, a delete 404 — see the note)
    for k in range(2):
        for i in range(6):
            (ca if (k + i) % 2 else cb).vms.create(name=f"e{k}-{i}", shape={"vcpus": 1, "mem_mib": 128},
                                                   entry="sleep 600")
            (cb if (k + i) % 2 else ca).vms.delete(f"e{k}-{i}")
            done.append(f"e{k}-{i}")
    wait_until(lambda: {e.get("vm") for e in ca.events.list(0, limit=500)["events"]
                        if e["type"] == "vm_state" and e.get("to") == "deleted"} >= set(done),
               timeout=60, what="every delete's event stored")
    time.sleep(2)  # (both replicas' reads of the last events done)
    ids = [e["id"] for e in ca.events.list(0, limit=500)["events"]]
    assert ids == list(range(ids[0], ids[0] + len(ids))), [(x, y) for x, y in zip(ids, ids[1:]) if y != x + 1]


def test_creates_and_deletes_racing_through_two_replicas_lose_no_vm(replicas):
    """Each create through one replica, its delete through the other at once, two such at a
    time: a replica's adoption of a host list read before a create landed dropped the VM
    it did not list (the delete then 404, the VM running on; a later create fleet_full)."""
    agent, proxy, (a, b), ca, cb = replicas
    errors: list[str] = []

    def churn(k: int) -> None:
        with fuse.Client((a if k % 2 else b).url) as c, fuse.Client((b if k % 2 else a).url) as other:
            for i in range(8):
                try:
                    c.vms.create(name=f"c{k}-{i}", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
                    other.vms.delete(f"c{k}-{i}")
                except fuse.ApiError as err:
                    errors.append(f"c{k}-{i}: {err}")

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and agent_vms(agent) == {}, (errors, sorted(agent_vms(agent)))


def test_a_host_added_or_freed_through_one_replica_takes_a_create_through_the_other_at_once(replicas, tmp_path):
    """Review 30: a host registered through one replica was "disconnected" to the other for
    about a second (its registry read once a second: a create pinned there 409 fleet_full),
    and the slot a delete through one replica freed was "vm_count policy 1 reached" to a
    create through the other (its poller's summary up to a second old)."""
    agent, proxy, (a, b), ca, cb = replicas
    other = start_agent(tmp_path, backend="fake", name="agent2")
    try:
        for k in range(3):
            cb.hosts.register(fuse.RegisterHostRequest(id=f"one{k}", url=other.url, token=other.token,
                                                       backend="qemu", capacity=fuse.HostCapacity(vm_count=1)))
            assert ca.vms.create(name=f"first{k}", host=f"one{k}", shape={"vcpus": 1, "mem_mib": 128},
                                 entry="sleep 600")["host"] == f"one{k}"
            cb.vms.delete(f"first{k}", host=f"one{k}")
            assert ca.vms.create(name=f"again{k}", host=f"one{k}", shape={"vcpus": 1, "mem_mib": 128},
                                 entry="sleep 600")["host"] == f"one{k}"
            ca.vms.delete(f"again{k}", host=f"one{k}")
            ca.hosts.deregister(f"one{k}")
    finally:
        other.stop()
