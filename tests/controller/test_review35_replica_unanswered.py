"""Replicas on one PostgreSQL store, one of them killed with a create its host did not
answer: the replicas left take that create over (review 35, findings 1 and 2).

README, Placement: "Until that host says whether the VM landed, its name stays held — a
create of it that placement places, or one pinned to that host, is `409 vm_exists` [...]
— across controller restarts and replicas (the store records it, from before the create
is sent: a controller killed while a host carries a create out holds its name when it
starts again; a replica that meets a name another replica left so asks the host itself),
however long the host is away; its room and the host (deregistering it) are held for
`FUSE_CREATE_UNANSWERED_S` (600 s)." And Events: "A create its host did not answer (502)
whose VM landed all the same gets its `placed` once the host says so, with
`unanswered: true`".

Before the fix, a dead replica's unanswered creates were held only by its placing rows,
which lapse `FUSE_PLACING_LEASE_S` after it died: the host could then be deregistered (the
VM landed on it untracked) and its room given away; a VM that landed had no `placed`, and
a name that never landed was `409 vm_exists` at its next create, until a replica started."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

import fuse
from support import Postgres, Proxy, api_error, free_port, reap, start_agent, start_controller, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

LEASE_S = 3.0  # FUSE_PLACING_LEASE_S: a dead replica's placing rows lapse this long after its last renewal
ENV = {"FUSE_PLACING_LEASE_S": str(LEASE_S)}


def _port() -> int:
    return free_port()  # (below the ephemeral range: no connection of the test's own takes it)


@pytest.fixture(scope="module")
def postgres():
    pg = Postgres()
    pg.port = _port()
    pg.start()
    yield pg
    pg.stop()


class Partition(Proxy):
    """A loopback proxy in front of an agent, that hangs up on the
    first create of a VM without passing it on, and from then on on every request (the host
    gone while it may have got the create) until ``heal()``: then it passes all on."""

    gone = healed = False

    def __init__(self, upstream_port: int):
        self.upstream_port, self.hold, self.held = upstream_port, {}, 0
        self.port = _port()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _forward(self, data: bytes) -> bool:
        if data.startswith(b"POST /v1/host/vms ") and not self.healed:
            self.gone = True
        return not self.gone

    def heal(self) -> None:
        self.gone, self.healed = False, True


def register(client, host: str, url: str, token: str, **cap) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id=host, url=url, token=token, backend="qemu",
                                                   capacity=fuse.HostCapacity(**({"vm_count": 4, "ram_mb": 4096,
                                                                                  "cpus": 4} | cap))))


def unanswered_create(client, name: str, host: str) -> None:
    """A create of vm ``name`` on ``host`` whose host hangs up on it: 502, it may still land."""
    err = api_error(client.vms.create, name=name, host=host, shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
    assert (err.status, err.code) == (502, "host_unreachable") and "may still create it" in err.message, err


def land(agent, name: str) -> None:
    """Have the agent make vm ``name`` after all, as if the create got through late."""
    r = httpx.post(agent.url + "/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": 256},
                                                     "entry": "sleep 600"},
                   headers={"Authorization": f"Bearer {agent.token}"}, timeout=30)
    assert r.status_code == 201, r.text


def placed(client, name: str) -> list[dict]:
    return [e for e in client.events.list(since=0, limit=500)["events"]
            if e["type"] == "placed" and e.get("vm") == name]


def records(db: str) -> list[str]:
    """The store's records of unanswered creates (settings ``unanswered:...``): their VM names."""
    engine = create_engine(db.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as c:
            return sorted(v["name"] for v in c.execute(text(
                "SELECT value FROM settings WHERE key LIKE 'unanswered:%'")).scalars())
    finally:
        engine.dispose()


def test_a_dead_replicas_unanswered_create_holds_its_host_and_room_past_the_placing_lease(tmp_path, postgres):
    db = postgres.create_db("fuse_r35_hold")
    agent = start_agent(tmp_path, backend="fake", name="agent", port=_port())
    proxy = Partition(int(agent.url.rsplit(":", 1)[1]))
    a = start_controller(tmp_path, db=db, name="ctl-a", env=ENV)
    b = start_controller(tmp_path, db=db, name="ctl-b", env=ENV)
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            # one machine under two names: h1 behind the proxy, h1b straight to the agent, one VM at most
            register(cb, "h1", proxy.url, agent.token, vm_count=1)
            register(cb, "h1b", agent.url, agent.token, vm_count=1)
            wait_until(lambda: all(c.hosts.get(h).connected for c in (ca, cb) for h in ("h1", "h1b")), timeout=30,
                       what="h1 and h1b connected on both replicas")
            unanswered_create(ca, "job1", "h1")
            a.kill()  # (its placing rows stay until their lease runs out)
            time.sleep(2 * LEASE_S)  # (past it: the rows of replica a have lapsed)

            err = api_error(cb.hosts.deregister, "h1")
            assert (err.status, err.code) == (409, "conflict") and "vm job1" in err.message, err
            # its room on the machine too (h1b is the same one, a VM at most): no create takes it
            err = api_error(cb.vms.create, name="other", host="h1b", shape={"vcpus": 1, "mem_mib": 256},
                            entry="sleep 600")
            assert (err.status, err.code) == (409, "fleet_full"), err
            assert "vm_count" in err.details["hosts"]["h1b"], err.details

            # the host comes back with the VM: recorded, with its placed (unanswered), and it holds the host
            proxy.heal()
            land(agent, "job1")
            got = wait_until(lambda: placed(cb, "job1"), timeout=30, what="job1's placed event")
            assert len(got) == 1 and got[0].get("unanswered") is True and got[0]["host"] == "h1", got
            assert cb.vms.get("job1")["host"] == "h1"
            err = api_error(cb.hosts.deregister, "h1")
            assert (err.status, err.code) == (409, "conflict") and "still has vm job1 assigned" in err.message, err
            wait_until(lambda: records(db) == [], timeout=30, what="job1's record gone")
    finally:
        proxy.close()
        for p in (a, b, agent):
            p.stop()
        reap(tmp_path)


def test_the_replicas_left_settle_a_dead_replicas_unanswered_creates_one_of_them_each(tmp_path, postgres):
    db = postgres.create_db("fuse_r35_settle")
    agents = [start_agent(tmp_path, backend="fake", name=f"agent{i}", port=_port()) for i in (1, 2)]
    proxies = [Partition(int(ag.url.rsplit(":", 1)[1])) for ag in agents]
    a, b, c = (start_controller(tmp_path, db=db, name=f"ctl-{n}", env=ENV) for n in "abc")
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb, fuse.Client(c.url) as cc:
            for i, (ag, px) in enumerate(zip(agents, proxies), 1):
                register(cb, f"h{i}", px.url, ag.token)
            wait_until(lambda: all(x.hosts.get(h).connected for x in (ca, cb, cc) for h in ("h1", "h2")),
                       timeout=30, what="h1 and h2 connected on every replica")
            unanswered_create(ca, "job1", "h1")  # (it lands: the agent makes it below)
            unanswered_create(ca, "job2", "h2")  # (it never does)
            a.kill()
            for px in proxies:
                px.heal()
            land(agents[0], "job1")

            # no replica is started again: b or c takes each create over once a's rows have lapsed
            got = wait_until(lambda: placed(cb, "job1"), timeout=30, what="job1's placed event (unanswered)")
            assert got[0].get("unanswered") is True and got[0]["host"] == "h1", got
            wait_until(lambda: records(db) == [], timeout=30, what="the records of job1 and job2 gone")
            assert len(placed(cc, "job1")) == 1 and placed(cb, "job2") == []
            # the name that never landed is free at its first create (it was 409 vm_exists)
            vm = cb.vms.create(name="job2", host="h2", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
            assert vm["host"] == "h2"
            # one replica took each over (its claim: the other found its placing row)
            for name in ("job1", "job2"):
                said = [p.logs().count(f"vm {name}: the replica that sent its create") for p in (b, c)]
                assert sum(said) == 1, (name, said)
    finally:
        for px in proxies:
            px.close()
        for p in (a, b, c, *agents):
            p.stop()
        reap(tmp_path)
