"""A controller on a real PostgreSQL whose write waits behind another transaction's lock
(review 33): the statement waited until the watchdog took the database for out of reach,
and the answer was 503 "cannot reach its database" while it answered, every other call
failing with it until the watchdog's probe did. A write that waits ``lock_timeout`` is 503
``db_unavailable`` saying the database is busy; reads go on answering, and the write goes
through once the lock is let go."""

from __future__ import annotations

import time
import uuid

import httpx
import psycopg
import pytest

import fuse
from fuse.controller.store import DB_LOCK_TIMEOUT_S, WRITE_LOCK_KEY
from support import reap, start_agent, start_controller, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


def test_a_write_behind_another_transactions_lock_is_503_busy_and_reads_go_on(tmp_path, postgres):
    url = postgres.create_db(f"r34_{uuid.uuid4().hex[:8]}")
    agent = start_agent(tmp_path, backend="fake", name="agent")
    ctl = start_controller(tmp_path, db=url, listen=True, token="C")
    try:
        with fuse.Client(ctl.url) as client:
            client.hosts.register(fuse.RegisterHostRequest(
                id="h1", url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=8, ram_mb=2048, cpus=4)))
            wait_until(lambda: client.hosts.get("h1").connected, timeout=30, what="h1 connected")
        with httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer C"},
                          timeout=30) as c, psycopg.connect(url, autocommit=True) as other:
            # another replica's write transaction, held: every write takes this lock first
            other.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
            t = time.monotonic()
            r = c.post("/v1/hosts/h1", params={"action": "cordon"})
            took = time.monotonic() - t
            assert r.status_code == 503, r.text
            body = r.json()["error"]
            assert body["code"] == "db_unavailable" and "busy" in body["message"], body
            assert "cannot reach" not in body["message"], body
            assert DB_LOCK_TIMEOUT_S - 0.5 < took < DB_LOCK_TIMEOUT_S + 4, took
            # the database answers: reads do too, at once (it was not taken for out of reach)
            for path in ("/v1/healthz", "/v1/hosts", "/v1/vms"):
                r = c.get(path)
                assert r.status_code == 200, (path, r.text)
            assert c.get("/v1/hosts/h1").json()["state"] == "active"
            other.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK_KEY,))
            r = c.post("/v1/hosts/h1", params={"action": "cordon"})
            assert r.status_code == 204, r.text
            assert c.get("/v1/hosts/h1").json()["state"] == "cordoned"
    finally:
        for p in (ctl, agent):
            p.stop()
        reap(tmp_path)


def test_the_lock_timeout_keeps_the_options_the_url_gives(postgres):
    """(the diff review: set as the startup `options`, it replaced a search_path given in the url,
    and the controller used schema public: another fleet's tables, maybe)"""
    from urllib.parse import quote

    from fuse.controller.store import Store

    url = postgres.create_db(f"r34o_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE SCHEMA tenant1")
    store = Store(url + ("&" if "?" in url else "?") + "options=" + quote("-csearch_path=tenant1"))
    try:
        with store.engine.connect() as c:
            from sqlalchemy import text
            assert c.execute(text("SHOW search_path")).scalar() == "tenant1"
            assert c.execute(text("SHOW lock_timeout")).scalar() == f"{int(DB_LOCK_TIMEOUT_S * 1000)}ms"
        with psycopg.connect(url, autocommit=True) as c:
            tables = {r[0] for r in c.execute("SELECT table_schema FROM information_schema.tables "
                                              "WHERE table_name = 'hosts'")}
        assert tables == {"tenant1"}, tables
    finally:
        store.close()


def test_a_delete_its_host_did_while_the_database_was_busy_says_busy_and_done(tmp_path, postgres):
    """(the diff review: the 503 of a delete the host carried out said "its database did not
    answer" when a lock held it up)"""
    url = postgres.create_db(f"r34d_{uuid.uuid4().hex[:8]}")
    agent = start_agent(tmp_path, backend="fake", name="agent")
    ctl = start_controller(tmp_path, db=url, listen=True, token="C")
    try:
        with fuse.Client(ctl.url, timeout=120) as client:
            client.hosts.register(fuse.RegisterHostRequest(
                id="h1", url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=8, ram_mb=2048, cpus=4)))
            wait_until(lambda: client.hosts.get("h1").connected, timeout=30, what="h1 connected")
            client.vms.create(name="v1", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
            with psycopg.connect(url, autocommit=True) as other:
                other.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK_KEY,))
                try:
                    client.vms.delete("v1")
                    raise AssertionError("the delete was recorded behind the lock")
                except fuse.ApiError as err:
                    assert (err.status, err.code) == (503, "db_unavailable"), err
                    assert err.details == {"host": "h1", "vm": "v1", "done": "delete"}, err.details
                    assert "its database was busy" in err.message, err.message
                finally:
                    other.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK_KEY,))
            wait_until(lambda: client.vms.list() == [], timeout=60, what="the delete recorded once the lock went")
    finally:
        for p in (ctl, agent):
            p.stop()
        reap(tmp_path)
