"""Review 37: a move's (and a drain's) lease is judged on the reader's own clock, by watching it go
unrenewed, never by comparing the holder's wall-clock stamp with the reader's. A replica a few
seconds ahead of the one driving a move took every move (and drain) over from it, the driver live
("stopped renewing its lease", the move rolled back); a controller restarted with its clock
stepped back left the move its crash cut unsettled for the size of the step (its VM asleep, a
wake refused ``move_in_progress``).

In-process, each replica's wall clock is ``time`` in the moves modules, patched, and the monotonic
clock the leases are watched on is moved by the test (one look a second, as the janitor's). With
real controllers, a skewed writer is a PostgreSQL trigger shifting the stamps one replica writes,
or a stamp rewritten in the SQLite store of a crashed controller before it starts again."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import sqlite3
import time
import types

import pytest
from sqlalchemy import create_engine, insert, text

import fuse
from fuse.controller.moves.drain import MoveDrains, _drain_key
from fuse.controller.moves.records import LEASE_S
from fuse.controller.moves.service import MoveService
from fuse.controller.store import Store, engine_url, moves as moves_t
from support import reap, start_agent, start_controller, wait_until
from test_moves import register_src_dst, vm_body

LOOKS = math.ceil(LEASE_S)  # janitor passes (a second apart) an unrenewed lease lasts


class Clock:
    """One replica's wall clock (``offset`` from the real one: set before each replica acts) and
    the monotonic clock the test moves (a tick, a second: the wall clocks go on by as much),
    standing in for the ``time`` module of the moves package."""

    START = 1000.0

    def __init__(self):
        self.offset, self.mono = 0.0, self.START

    def time(self) -> float:
        return time.time() + self.offset + (self.mono - self.START)

    def monotonic(self) -> float:
        return self.mono

    def tick(self) -> None:
        self.mono += 1.0


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    for name in ("janitor", "records", "drain", "leases"):
        try:
            module = importlib.import_module(f"fuse.controller.moves.{name}")
        except ImportError:  # (leases: the code before review 37 has none)
            continue
        monkeypatch.setattr(module, "time", c)
    return c


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'fuse.db'}")
    yield s
    s.close()


def _replica(store: Store, instance: str) -> MoveService:
    return MoveService(types.SimpleNamespace(store=store, instance=instance, fleet=None))


def _move(store: Store, owner: str, lease_until: float, state: str = "copying") -> None:
    with store.tx() as c:
        c.execute(insert(moves_t).values(id="mv-1", vm="job", source="src", target="dst", state=state,
                                         record={"owner": owner, "lease_until": lease_until},
                                         created_at=time.time(), updated_at=time.time()))


@pytest.mark.parametrize("skew", [10.0, 3600.0, -3600.0],
                         ids=["a replica 10 s ahead", "a replica an hour ahead", "a replica an hour behind"])
def test_a_replica_whose_clock_differs_takes_over_a_move_only_once_its_driver_stops_renewing(store, clock, skew):
    a, b = _replica(store, "a"), _replica(store, "b")
    _move(store, "a", time.time() + LEASE_S)
    for i in range(3 * LOOKS):  # a drives the move: each of its writes renews the lease
        clock.offset = 0.0
        a._set("mv-1", copied_bytes=i)
        clock.offset = skew
        clock.tick()
        assert b._claim("mv-1") is None, f"b took over the move a drives ({skew:+g} s)"
    looks = 0  # a stops renewing (it died): b takes the move over a lease's length later
    while (got := b._claim("mv-1")) is None:
        clock.tick()
        looks += 1
        assert looks <= LOOKS, "b never took over the move a left"
    assert looks == LOOKS and got["record"]["owner"] == "b"
    assert a._row("mv-1")["record"]["owner"] == "b"


@pytest.mark.parametrize("step", [-3600.0, -30.0, 0.0, 3600.0],
                         ids=["stepped back an hour", "stepped back 30 s", "not stepped", "stepped on an hour"])
def test_a_controller_restarted_with_its_clock_stepped_settles_its_last_runs_move_a_lease_after_it_looks(
        store, clock, step):
    """The last run stamped the lease on its clock; the new run's is ``step`` from it. The new run (a
    new instance) settles the move LEASE_S after its first look, whatever its clock did."""
    _move(store, "last-run", time.time() + LEASE_S, state="sleeping")
    new = _replica(store, "this-run")
    settled: list[str] = []

    async def recover(row):
        settled.append(row["id"])

    new._recover = recover
    clock.offset = step

    async def passes() -> int:
        for look in range(LOOKS + 2):
            new._renew_and_recover()
            await asyncio.sleep(0)  # (the settling task runs)
            if settled:
                return look
            clock.tick()
        return -1

    assert asyncio.run(passes()) == LOOKS, f"the move was not settled within {LOOKS + 1} looks (clock {step:+g} s)"
    assert settled == ["mv-1"] and new._row("mv-1")["record"]["owner"] == "this-run"


def _draining(store: Store) -> None:
    with store.tx() as c:
        store.put_host(c, {"id": "old", "url": "http://127.0.0.1:1", "token": "", "region": "", "backend": "qemu",
                           "labels": {}, "capacity": {}, "state": "draining", "agent_id": "", "last_seen": 0.0,
                           "created_at": 0.0, "updated_at": 0.0})


class _Drainer(MoveDrains):
    """A replica's drains, each drain a wait (no hosts)."""

    def __init__(self, store: Store, instance: str, secs: float):
        self.store, self.ctl, self._drains, self.secs = store, types.SimpleNamespace(instance=instance), {}, secs
        self._held_drains, self.ran = set(), []

    async def _drain(self, host_id):
        self.ran.append(host_id)
        await asyncio.sleep(self.secs)
        return {"host": host_id, "moved": [], "stuck": [], "finished": [], "prewarmed": []}

    async def _resumed_drain(self, host_id):
        return await self._drain(host_id)


@pytest.mark.parametrize("skew", [10.0, -3600.0], ids=["a replica 10 s ahead", "a replica an hour behind"])
def test_a_replica_whose_clock_differs_takes_over_a_drain_only_once_its_holder_stops_renewing(store, clock, skew):
    _draining(store)

    async def scenario():
        a, b = _Drainer(store, "a", 600), _Drainer(store, "b", 0)
        held = a._drain_task("old")
        await asyncio.sleep(0.1)
        assert a.ran == ["old"]
        try:
            for _ in range(3 * LOOKS):
                clock.offset = 0.0
                a.renew_drains()
                clock.offset = skew
                clock.tick()
                assert b.resume_drains(takeover=True) == [], f"b took over the drain a runs ({skew:+g} s)"
            looks = 0  # a stops renewing (it died): b takes the drain over a lease's length later
            while not b.resume_drains(takeover=True):
                clock.tick()
                looks += 1
                assert looks <= LOOKS, "b never took over the drain a left"
            assert looks == LOOKS
            await b._drains["old"]
            assert b.ran == ["old"] and store.get_setting(_drain_key("old"))["owner"] == "b"
        finally:
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held

    asyncio.run(scenario())


def test_a_controller_restarted_with_its_clock_stepped_back_resumes_its_last_runs_drain_a_lease_after_it_looks(
        store, clock):
    _draining(store)
    store.put_setting(_drain_key("old"), {"host": "old", "owner": "last-run", "until": time.time() + 3600})

    async def scenario():
        new = _Drainer(store, "this-run", 0)
        assert new.resume_drains() == []  # its start: the last run's lease is seen for the first time
        for look in range(1, LOOKS + 2):
            clock.tick()
            if new.resume_drains(takeover=True) == ["old"]:
                await new._drains["old"]
                return look
        return -1

    assert asyncio.run(scenario()) == LOOKS


def test_a_lease_seen_unchanged_across_a_gap_in_the_looks_starts_its_time_again(clock):
    """(the janitor's blind-period rule, per lease: the holder may not have renewed for the
    same reason this replica did not look)"""
    from fuse.controller.moves.leases import BLIND_S, LeaseWatch

    watch = LeaseWatch(LEASE_S)
    assert not watch.ran_out("k", ("a", 1.0, 1))
    clock.mono += BLIND_S + LEASE_S
    assert not watch.ran_out("k", ("a", 1.0, 1))  # (a look after the gap starts its time again)
    for _ in range(LOOKS - 1):
        clock.tick()
        assert not watch.ran_out("k", ("a", 1.0, 1))
    clock.tick()
    assert watch.ran_out("k", ("a", 1.0, 1))
    assert not watch.ran_out("k", ("a", 1.0, 2))  # renewed


# ---- real controllers ----------------------------------------------------------------------------

SKEW_TRIGGER = """
CREATE TABLE test_skew (owner text PRIMARY KEY, secs double precision NOT NULL);
CREATE FUNCTION test_skew_lease() RETURNS trigger AS $$
DECLARE s double precision;
BEGIN
  SELECT secs INTO s FROM test_skew WHERE owner = NEW.record->>'owner';
  IF s IS NOT NULL AND NEW.record->>'lease_until' IS NOT NULL THEN
    NEW.record := jsonb_set(NEW.record::jsonb, '{lease_until}',
                            to_jsonb((NEW.record->>'lease_until')::double precision + s))::json;
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_skew_lease BEFORE INSERT OR UPDATE ON moves FOR EACH ROW EXECUTE FUNCTION test_skew_lease();
"""


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_replica_a_minute_ahead_of_the_one_driving_a_move_leaves_it_alone(tmp_path, postgres):
    """Every lease stamp replica a writes is shifted a minute back in the database (a's clock a
    minute behind b's): b took the move a drives over at its next look, and rolled it back."""
    db = postgres.create_db("fuse_review37_lease_clock")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_PAUSE_AT": "slept:8"})
    b = start_controller(tmp_path, db=db, name="ctl-b")
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    engine = create_engine(engine_url(db, tmp_path))
    try:
        with engine.begin() as c:
            c.execute(text(SKEW_TRIGGER))
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            register_src_dst(ca, cb, agents)
            ca.vms.create(vm_body("job", host="src"))
            m = ca.moves.create("job", to="dst")
            wait_until(lambda: "test hook: held at slept" in a.logs(), timeout=30, what="the move held at slept")
            with engine.begin() as c:
                owner = c.execute(text("SELECT record->>'owner' FROM moves WHERE id = :id"), {"id": m["id"]}).scalar()
                c.execute(text("INSERT INTO test_skew VALUES (:owner, -60)"), {"owner": owner})
            wait_until(lambda: _lease_behind(engine, m["id"]), timeout=10, what="a's renewal stamped a minute behind")
            end = wait_until(lambda: (x := ca.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                             timeout=60, what="the move to end")
            assert (end["state"], end["reason"]) == ("done", ""), end
            assert "taking over" not in b.logs(), b.logs()[-3000:]
            vm = cb.vms.get("job")
            assert (vm["host"], vm["state"]) == ("dst", "running"), vm
    finally:
        engine.dispose()
        for p in (a, b, *agents):
            p.stop()
        reap(tmp_path)


def _lease_behind(engine, move_id: str) -> bool:
    with engine.begin() as c:
        until = c.execute(text("SELECT (record->>'lease_until')::double precision FROM moves WHERE id = :id"),
                          {"id": move_id}).scalar()
    return until is not None and until < time.time() - 30


@pytest.mark.timeout(180)
def test_a_controller_restarted_with_its_clock_an_hour_behind_settles_the_move_its_crash_cut(tmp_path):
    """The crashed run's lease stamp is an hour ahead of the restarted one's clock (NTP stepped it
    back, or a snapshot restored): the move was left sleeping, its VM unwakeable, for that hour."""
    ctl = start_controller(tmp_path, name="ctl", env={"FUSE_TEST_CRASH_AT": "slept"})
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    procs = [ctl, *agents]
    try:
        with fuse.Client(ctl.url) as c:
            register_src_dst(c, c, agents)
            c.vms.create(vm_body("job", host="src"))
            m = c.moves.create("job", to="dst")
        wait_until(lambda: ctl.popen.poll() is not None, timeout=60, what="the controller to crash at slept")
        with contextlib.closing(sqlite3.connect(tmp_path / "ctl" / "fuse.db")) as db, db:
            db.execute("UPDATE moves SET record = json_set(record, '$.lease_until', ?) WHERE id = ?",
                       (time.time() + 3600, m["id"]))
        ctl = start_controller(tmp_path, name="ctl")
        procs.append(ctl)
        with fuse.Client(ctl.url) as c:
            end = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                             timeout=60, what="the restarted controller to settle the move")
            assert end["state"] == "failed" and "restarted" in end["reason"], end
            wait_until(lambda: (v := c.vms.get("job"))["host"] == "src" and v["state"] == "running", timeout=30,
                       what="the vm running at home again")
    finally:
        for p in procs:
            p.stop()
        reap(tmp_path)


async def test_a_caller_waiting_for_a_dead_replicas_drain_of_a_host_no_longer_draining_gets_its_answer(tmp_path):
    """(the diff review) Replica a's caller waits for the drain replica b took over; b dies, and the
    operator uncordons the host: a's janitor, every pass, forgot the leases of hosts not draining,
    so each of the waiting caller's looks was the first and the wait never ended (before this
    session's change it ended once b's stamp passed, ~5 s). The real janitor loop, a real store."""
    store = Store(f"sqlite:///{tmp_path / 'fuse.db'}")
    now = time.time()
    with store.tx() as c:
        c.execute(insert(fuse.controller.store.hosts).values(
            id="h1", url="http://127.0.0.1:1", backend="fake", capacity={}, state="draining",
            last_seen=now, created_at=now, updated_at=now))
    store.put_setting(_drain_key("h1"), {"host": "h1", "owner": "b", "until": now + LEASE_S, "n": 7})
    a = _replica(store, "a")
    store.set_host_state("h1", "active")
    janitor = asyncio.create_task(a._janitor_loop())
    try:
        t0 = time.monotonic()
        got = await asyncio.wait_for(a._their_report("h1"), LEASE_S + 15)
        assert got is None and time.monotonic() - t0 >= LEASE_S - 1.5, got  # (b's lease ran out: a goes on)
    finally:
        janitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await janitor
        store.close()
