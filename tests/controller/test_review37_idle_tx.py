"""A replica stopped inside a write transaction (SIGSTOP, its VM paused, a network gone without
a FIN) held the replicas' write lock: every other replica's writes failed busy (503
``db_unavailable``) until it ran again, and no take-over happened meanwhile (the thirty-sixth
session's stall review; for a partition, until TCP keep-alive: hours). PostgreSQL now ends a
session idle inside a transaction for ``DB_IDLE_TX_TIMEOUT_S``: its transaction rolls back, the
lock goes, the others write; the stopped replica's next statement fails, nothing of it kept."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from sqlalchemy import text

import fuse.controller.store as store_mod
from fuse.controller.store import DB_IDLE_TX_TIMEOUT_S, DB_LOCK_TIMEOUT_S, Store

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def test_the_sessions_of_a_store_end_a_transaction_left_idle(postgres):
    store = Store(postgres.create_db(f"idle_{uuid.uuid4().hex[:8]}"))
    try:
        with store.read() as c:
            shown = c.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
        assert shown == f"{int(DB_IDLE_TX_TIMEOUT_S)}s", shown
        assert DB_IDLE_TX_TIMEOUT_S > DB_LOCK_TIMEOUT_S  # (a busy write is said as such first)
    finally:
        store.close()


def test_a_replica_stopped_inside_a_write_transaction_does_not_hold_the_others_writes(postgres, monkeypatch):
    monkeypatch.setattr(store_mod, "DB_IDLE_TX_TIMEOUT_S", 1.5)  # (read as each connection is made)
    url = postgres.create_db(f"idle_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE marks (who text)")
    a, b = Store(url), Store(url)
    holding = threading.Event()
    got: dict[str, object] = {}

    def stopped_replica() -> None:
        try:
            with a.tx() as c:  # the write lock, then a write, then no statement: the process stopped
                c.execute(text("INSERT INTO marks VALUES ('a')"))
                holding.set()
                time.sleep(4)
                c.execute(text("SELECT 1"))
            got["a"] = "committed"
        except Exception as exc:  # noqa: BLE001 - how its transaction ended is the test's subject
            got["a"] = exc

    t = threading.Thread(target=stopped_replica, daemon=True)
    t.start()
    try:
        assert holding.wait(10), "the stopped replica never held the lock"
        t0 = time.monotonic()
        with b.tx() as c:  # another replica's write: it waits for the lock, not lock_timeout and fail
            c.execute(text("INSERT INTO marks VALUES ('b')"))
        took = time.monotonic() - t0
        assert took < DB_LOCK_TIMEOUT_S, took
        t.join(15)
        assert not t.is_alive()
        assert isinstance(got["a"], Exception), got  # its transaction was ended under it
        with b.read() as c:
            assert [r[0] for r in c.execute(text("SELECT who FROM marks"))] == ["b"]  # nothing of a's kept
        # the stopped replica goes on once it runs again: a new session, a new transaction
        with a.tx() as c:
            c.execute(text("INSERT INTO marks VALUES ('a2')"))
        with a.read() as c:
            assert sorted(r[0] for r in c.execute(text("SELECT who FROM marks"))) == ["a2", "b"]
    finally:
        t.join(15)
        a.close()
        b.close()
