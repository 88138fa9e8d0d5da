"""The statement watchdog on PostgreSQL and a controller that itself did not run for a while
(SIGSTOP, its VM paused): the CI run of the thirty-fifth session's stop failed on a replica
frozen with a statement out, whose connection the watchdog cut as it resumed (its clock had
gone on), so its drain's caller got 503 db_unavailable while the database answered. A statement
is timed on the time this process ran; one really unanswered is still cut."""

from __future__ import annotations

import threading
import time
import types
import uuid

import pytest
from sqlalchemy import text

import fuse.controller.store as store_mod
from fuse.controller.store import DB_OP_TIMEOUT_S, Store

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def _active(watch) -> bool:
    from psycopg import pq

    with watch._lock:
        conns = list(watch.conns)
    return any(not c.closed and c.pgconn.transaction_status == pq.TransactionStatus.ACTIVE for c in conns)


def test_a_stall_of_the_controller_does_not_count_against_its_statement_and_an_unanswered_one_is_still_cut(
        postgres, monkeypatch):
    store = Store(postgres.create_db(f"stall_{uuid.uuid4().hex[:8]}"))
    watch = store._watch
    watch.stop.set()  # (this test makes the looks itself, on a clock of its own)
    time.sleep(0.4)
    clock = [1000.0]
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    watch.looked = clock[0]
    got: dict[str, object] = {}

    def statement() -> None:
        try:
            with store.read() as c:
                got["rows"] = c.execute(text("SELECT pg_sleep(8), 1")).all()
        except Exception as exc:  # noqa: BLE001 - what the call ended with is the test's subject
            got["error"] = exc

    t = threading.Thread(target=statement, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not _active(watch):
        assert time.monotonic() < deadline, "the statement never went out"
        time.sleep(0.02)
    clock[0] += 0.25
    watch._look()
    clock[0] += DB_OP_TIMEOUT_S + 10  # the process stopped: no look for longer than a statement's time
    watch._look()
    assert not watch.down.is_set() and t.is_alive() and "error" not in got, got
    while clock[0] < 1000.25 + DB_OP_TIMEOUT_S + 10 + DB_OP_TIMEOUT_S - 0.3:  # looks a quarter second apart, resumed
        clock[0] += 0.25
        watch._look()
        assert not watch.down.is_set() and t.is_alive() and "error" not in got, (clock[0], got)
    for _ in range(3):
        clock[0] += 0.25
        watch._look()  # (its probe, on a connection of its own, is answered: not held down after)
    t.join(10)  # unanswered DB_OP_TIMEOUT_S of this process's time: its connection was cut
    assert not t.is_alive() and "rows" not in got and "error" in got, got
    store.engine.dispose()


def test_a_younger_statement_is_still_cut_while_the_probe_of_a_frozen_server_takes_seconds(postgres, monkeypatch):
    """(the diff review: the looks after a cut each run a probe that waits up to 3 s on a frozen
    server; timed from each look's start, every look read as a stall of this process and reset
    the timers, so a statement younger than the one cut was never cut: the event loop's call
    hung, the health check with it)"""
    store = Store(postgres.create_db(f"stall_{uuid.uuid4().hex[:8]}"))
    watch = store._watch
    watch.stop.set()
    time.sleep(0.4)
    clock = [1000.0]
    monkeypatch.setattr(store_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    watch.looked = clock[0]

    def frozen_probe() -> bool:  # (a frozen server: its probe waits out its 3 s and fails)
        clock[0] += 3.0
        return False

    monkeypatch.setattr(watch, "_answers", frozen_probe)
    got: dict[str, object] = {}

    def statement(key: str) -> None:
        try:
            with store.read() as c:
                got[key] = c.execute(text("SELECT pg_sleep(8), 1")).all()
        except Exception as exc:  # noqa: BLE001 - what the call ended with is the test's subject
            got[key] = exc

    def active() -> int:
        from psycopg import pq
        with watch._lock:
            return sum(1 for c in list(watch.conns)
                       if not c.closed and c.pgconn.transaction_status == pq.TransactionStatus.ACTIVE)

    older = threading.Thread(target=statement, args=("older",), daemon=True)
    older.start()
    wait = time.monotonic() + 10
    while active() < 1:
        assert time.monotonic() < wait
        time.sleep(0.02)
    for _ in range(11):  # (2.5 s of looks a quarter second apart: the older seen busy from the first)
        watch._look()
        clock[0] += 0.25
    younger = threading.Thread(target=statement, args=("younger",), daemon=True)
    younger.start()
    while active() < 2:
        assert time.monotonic() < wait
        time.sleep(0.02)
    for _ in range(40):  # (10 s of looks a quarter second apart, each probe after the cut taking 3 s)
        clock[0] += 0.25
        watch._look()
        if not younger.is_alive() or "younger" in got:
            break
        time.sleep(0.05)
    older.join(10)
    younger.join(10)
    assert isinstance(got.get("older"), Exception) and isinstance(got.get("younger"), Exception), got
    store.engine.dispose()
