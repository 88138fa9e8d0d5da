"""A controller on a real PostgreSQL whose database goes away (review 32): a postmaster that
answers no new connection (frozen: its SYNs queued) is 503 db_unavailable on every route within
seconds, not a minute a request; a delete, sleep or wake its host carried out while the
database went away says it is done (not "try again"), and is recorded once the database is
back, a delete with its vm_removed; the background passes say the outage in a line, not a
traceback each."""

from __future__ import annotations

import os
import signal
import time
import uuid

import httpx
import psycopg
import pytest

import fuse
from support import Proxy, agent_vms, answers, error_while_db_away, reap, start_agent, start_controller, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def one_host(tmp_path, postgres):
    """(database url, agent, proxy before it, controller, its client): host h1 registered at
    the proxy's address."""
    url = postgres.create_db(f"r32_{uuid.uuid4().hex[:8]}")
    agent = start_agent(tmp_path, backend="fake", name="agent")
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    ctl = start_controller(tmp_path, db=url, listen=True, token="C")
    client = fuse.Client(ctl.url)
    client.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=8, ram_mb=2048, cpus=4)))
    wait_until(lambda: client.hosts.get("h1").connected, timeout=30, what="h1 connected")
    yield url, agent, proxy, ctl, client
    client.close()
    proxy.close()
    for p in (ctl, agent):
        p.stop()
    reap(tmp_path)


def _freeze(url: str, postmaster: int) -> None:
    """SIGSTOP the postmaster, then end the controller's backends through a session opened
    before (a backend works on with its postmaster stopped): the controller must connect
    anew, and no new connection is answered (ended first, it had connected again already)."""
    with psycopg.connect(url, autocommit=True) as c:
        os.kill(postmaster, signal.SIGSTOP)
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    time.sleep(0.3)  # (the backends gone)


def test_a_postmaster_that_answers_no_new_connection_is_503_on_every_route_within_seconds(one_host, postgres):
    """The controller's connections cut, then the postmaster frozen (SIGSTOP): each store call
    on the event loop (the host's poller first) waited its own 4 s connect, and healthz took
    40-90 s. A connect that times out holds the database out of reach: 503 at once after it,
    and service back once the postmaster answers, with no restart."""
    url, agent, proxy, ctl, client = one_host
    postmaster = int((postgres.dir / "data" / "postmaster.pid").read_text().split()[0])
    try:
        _freeze(url, postmaster)
        with httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer C"},
                          timeout=15) as c:
            t = time.monotonic()
            r = c.get("/v1/healthz")
            took = time.monotonic() - t
            assert r.status_code == 503 and r.json()["error"]["code"] == "db_unavailable", r.text
            assert took < 8, took  # (one 4 s connect at most, on a loaded machine)
            for path in ("/v1/hosts", "/v1/vms", "/v1/healthz"):
                t = time.monotonic()
                r = c.get(path)
                assert r.status_code == 503 and r.json()["error"]["code"] == "db_unavailable", (path, r.text)
                assert time.monotonic() - t < 3, (path, time.monotonic() - t)
            os.kill(postmaster, signal.SIGCONT)
            wait_until(lambda: c.get("/v1/healthz").status_code == 200 and c.get("/v1/hosts").status_code == 200,
                       timeout=20, what="service back once the postmaster answers")
    finally:
        os.kill(postmaster, signal.SIGCONT)


HELD = {"delete": b"DELETE /v1/host/vms/", "sleep": b"POST /v1/host/vms/v1/sleep",
        "wake": b"POST /v1/host/vms/v1/wake"}
AFTER = {"delete": None, "sleep": "sleeping", "wake": "running"}


@pytest.mark.parametrize("action", ["delete", "sleep", "wake"],
                         ids=["a delete", "a sleep", "a wake"])
def test_what_the_host_did_while_the_database_went_away_is_503_saying_so_and_recorded_later(
        one_host, postgres, action):
    """Answered 503 "try again" with no details while the host had done it: the retry was 404
    or 409, and a delete's vm_removed was lost when the poller dropped the row first. The
    answer says it is done (host, vm, what); once the database is back the VM list shows it,
    and a delete gets its vm_removed once."""
    url, agent, proxy, ctl, client = one_host
    client.vms.create(name="v1", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
    if action == "wake":
        client.vms.sleep("v1")
    proxy.hold[HELD[action]] = 3.0
    err = error_while_db_away(lambda: getattr(client.vms, action)("v1"), proxy, postgres, action)
    assert err is not None and (err.status, err.code) == (503, "db_unavailable"), err
    assert err.details == {"host": "h1", "vm": "v1", "done": action}, err.details
    assert f"do not {action} it again" in err.message, err.message
    on_host = agent_vms(agent)
    assert ("v1" not in on_host) if action == "delete" else on_host["v1"]["state"] == AFTER[action], on_host
    wait_until(lambda: answers(client), timeout=30, what="the controller answering again")
    listed = lambda: {v["name"]: v["state"] for v in client.vms.list()}  # noqa: E731
    if action == "delete":
        wait_until(lambda: "v1" not in listed() and [e for e in client.events.list(0, limit=500)["events"]
                                                      if e["type"] == "vm_removed" and e.get("vm") == "v1"],
                   timeout=30, what="the VM's row gone and its vm_removed")
        time.sleep(2)  # (no second one)
        removed = [e for e in client.events.list(0, limit=500)["events"]
                   if e["type"] == "vm_removed" and e.get("vm") == "v1"]
        assert len(removed) == 1, removed
    else:
        wait_until(lambda: listed().get("v1") == AFTER[action], timeout=30, what=f"v1 listed {AFTER[action]}")


def test_background_passes_say_the_database_is_away_in_a_line_not_a_traceback_each(one_host, postgres):
    """Each pass (the host's poller, the move leases, the elastic pool) logged a full traceback
    of `Connection refused` every second while the database was away (344 in minutes). Now a
    line per kind of pass when the outage starts, and one when it answers again."""
    url, agent, proxy, ctl, client = one_host
    since = len(ctl.logs())
    postgres.down()
    try:
        time.sleep(6)
    finally:
        postgres.up()
    wait_until(lambda: answers(client), timeout=30, what="the controller answering again")
    time.sleep(3)  # (every pass has run again)
    during = ctl.logs()[since:]
    tracebacks = during.count("Traceback") - during.count("During handling of the above exception") \
        - during.count("The above exception was the direct cause")  # (one exception's chain counts once)
    assert tracebacks <= 1, during[-3000:]
    assert during.count("the host pollers: the database is out of reach") == 1, during[-3000:]
    assert during.count("move leases: the database is out of reach") == 1, during[-3000:]
    assert "the host pollers: the database answers again" in during, during[-3000:]
