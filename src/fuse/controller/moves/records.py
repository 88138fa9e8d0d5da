"""The move record and the host call: what every part of the move service stands on.

A move is a row in the store's ``moves`` table. Its state changes only through
`MoveRecords._set`, which checks the transition table (`TRANSITIONS`), persists
the change with the step's history and lease, and emits a ``move_state`` event
(``move_rolling_back`` for the one state the wire does not show), all in one
transaction, before the step the state names runs. `_wire` is the seed's view of
a row, where a move rolling back stays at the step that failed.

`_host` is the one way the service asks a host anything: it marks a call that ran
out of time with the host and its limit (for the move's reason) and reads a 404 as
"nothing there" only when it is the agent's own answer. The limits on those calls
(`IO_TIMEOUT`, `QUICK_TIMEOUT`) live here beside it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import httpx
from typing import Any, Callable, TypeVar

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from ...envsettings import seconds
from ...errors import HostUnreachable, NotFound
from ..store import ACTIVE_MOVES, moves as moves_t
from ..store.outage import PassLog, db_unreachable
from ..vms import agent_not_found

# (one logger for the whole service, under the name it has always had)
log = logging.getLogger("fuse.controller.moves")
# A move's driver waiting for a database out of reach says so in a line, not a traceback
waits = PassLog(log)
T = TypeVar("T")

# every state but done and failed ("pending": an earlier version's "starting")
ACTIVE = ACTIVE_MOVES
STATES = ("starting", "sleeping", "copying", "waking", "done", "failed")  # the wire's (seed 004)
# A move belongs to the controller that drives it for as long as it renews
# its lease; with several replicas on one PostgreSQL store, a replica takes
# over (finishes or rolls back) only moves whose driver stopped renewing: whose
# lease it has seen unrenewed this long on its own clock (leases.py).
LEASE_S = seconds("FUSE_MOVE_LEASE_S", 5.0)

TRANSITIONS: dict[str, frozenset[str]] = {
    "starting": frozenset({"sleeping", "rolling_back"}),
    "pending": frozenset({"sleeping", "rolling_back"}),
    "sleeping": frozenset({"copying", "rolling_back"}),
    "copying": frozenset({"waking", "rolling_back"}),
    "waking": frozenset({"done", "rolling_back"}),
    "rolling_back": frozenset({"failed"}),
    "done": frozenset(),
    "failed": frozenset(),
}

# Per-request limit while copying: a target whose network vanished must fail
# the move (and bring the VM home) in bounded time, not hang it.
IO_TIMEOUT = seconds("FUSE_MOVE_IO_TIMEOUT", 30.0)


class TakenOver(Exception):
    """This replica drove a move another one has taken over since (this one stalled past
    its lease: a pause, a frozen process): it stops, and writes nothing more to the move."""


# The move the running task drives (`_run`, `_recover`; the tasks they start inherit it): only
# a driver's writes are refused once another replica owns the move — the janitor's tidying of
# a finished move, a force deregister's, are anyone's (an ended move keeps its last owner).
DRIVING: contextvars.ContextVar[str | None] = contextvars.ContextVar("fuse_move_driving", default=None)
# The limit for the calls on a moving VM's path that do little on the host: the
# target beginning its incoming side (an admission check and a reservation) and
# aborting one that was never woken (removing files). They answer in milliseconds;
# one not answered in this long means a hung or cut-off host, and the VM, asleep
# meanwhile, is better brought home than kept down for IO_TIMEOUT (or the 60 s a
# begin used to have). A chunk, a verify (hashing every file) or a wake may take
# long on a healthy host and keep their own limits.
QUICK_TIMEOUT = seconds("FUSE_MOVE_QUICK_TIMEOUT", 10.0)
# A controller that stops settles the moves it drives (the VM home, or through) for at
# most this long before it exits; a move still unsettled then is the next run's to settle
STOP_SETTLE_S = seconds("FUSE_MOVE_STOP_SETTLE_S", 10.0)


def timed_out(exc: BaseException) -> bool:
    """Whether a failed call ran out of time (a host that stopped answering), as
    opposed to one that was refused or cut: httpx's timeouts, or a socket's
    SO_RCVTIMEO/SO_SNDTIMEO (the bulk copy's), anywhere in the exception chain."""
    import errno

    import httpx

    cur: BaseException | None = exc
    for _ in range(8):
        if cur is None:
            return False
        if isinstance(cur, (httpx.TimeoutException, TimeoutError)) or (
                isinstance(cur, OSError) and cur.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ETIMEDOUT)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (for a reason: "a JSON list")."""
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), "object")


class MoveRecords:
    """Reading, writing and reporting moves, and calling their hosts. The base of
    every part of `MoveService` (which sets ``ctl``, ``store`` and the task tables)."""

    _gone: set[str] | frozenset[str] = frozenset()  # (MoveService's own set: MoveService.forgetting)

    @property
    def fleet(self):
        return self.ctl.fleet

    def get(self, move_id: str) -> dict[str, Any]:
        with self.store.read() as c:
            row = c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().first()
        if row is None:
            raise NotFound(f"move {move_id} not found")
        return self._wire(dict(row))

    def list(self) -> list[dict[str, Any]]:
        with self.store.read() as c:
            rows = c.execute(select(moves_t).order_by(moves_t.c.created_at)).mappings().all()
        return [self._wire(dict(r)) for r in rows]

    @staticmethod
    def _wire(row: dict) -> dict[str, Any]:
        rec = row["record"] or {}
        state = row["state"]
        if state == "pending":
            state = "starting"
        elif state == "rolling_back":  # the step that failed, until the VM is home
            seen = [h["state"] for h in rec.get("history", []) if h.get("state") in STATES]
            state = seen[-1] if seen else "starting"
        return {"id": row["id"], "vm": row["vm"], "from": row["source"], "to": row["target"], "state": state,
                "rolling_back": row["state"] == "rolling_back",
                "copied_bytes": rec.get("copied_bytes", 0), "total_bytes": rec.get("total_bytes", 0),
                "copy_path": rec.get("copy_path", ""), "copy_secs": rec.get("copy_secs"),
                "verify_secs": rec.get("verify_secs"),
                "reason": rec.get("reason", ""),
                "source_removed": state == "done" and rec.get("source_removed", True),
                "created_at": row["created_at"], "updated_at": row["updated_at"],
                "history": rec.get("history", [])}

    def _row(self, move_id: str) -> dict:
        with self.store.read() as c:
            return dict(c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().one())

    def _set(self, move_id: str, state: str | None = None, **rec: Any) -> dict:
        """Persist a transition (checked against the table) and/or record fields."""
        with self.store.tx() as c:
            q = select(moves_t).where(moves_t.c.id == move_id)
            row = dict(c.execute(q if self.store.is_sqlite else q.with_for_update()).mappings().one())
            owner = (row["record"] or {}).get("owner")
            if DRIVING.get() == move_id and owner not in (None, self.ctl.instance) and "owner" not in rec:
                raise TakenOver(f"move {move_id}: replica {owner} took it over while this one stalled past its "
                                f"lease (it is {row['state']} there); this one stops driving it")
            record = dict(row["record"] or {}, **rec)
            if record.get("owner") == self.ctl.instance:  # (every write of the driver renews its lease)
                record["lease_until"] = time.time() + LEASE_S
                record["lease_n"] = record.get("lease_n", 0) + 1  # (what other replicas watch: leases.py)
            values: dict[str, Any] = {"record": record, "updated_at": time.time()}
            if state is not None and state != row["state"]:
                if state not in TRANSITIONS[row["state"]]:
                    raise RuntimeError(f"move {move_id}: illegal transition {row['state']} -> {state}")
                values["state"] = state
                if state == "rolling_back":  # not a wire state: the move stays at its step until home
                    record["rollback_at"] = time.time()
                    self.store.add_event("move_rolling_back", {"move": move_id, "vm": row["vm"],
                                                               "reason": record.get("reason", "")},
                                         host=row["source"], conn=c)
                else:
                    record["history"] = record.get("history", []) + [{"state": state, "time": time.time()}]
                    self.store.add_event("move_state", {"move": move_id, "vm": row["vm"],
                                                        "from": self._wire(dict(row))["state"],
                                                        "to": state, "reason": record.get("reason", "")},
                                         host=row["source"], conn=c)
            c.execute(update(moves_t).where(moves_t.c.id == move_id).values(**values))
        if state is not None and self.fleet:
            self.fleet.changed.set()
        return self._row(move_id)

    async def _write(self, move_id: str, state: str | None = None, **rec: Any) -> dict:
        """`_set` as a move's driver (or its settling) writes: while the database is out of
        reach (an outage, its server stalled) it waits for it and writes again, rather than
        end the driver's task on the error (review 36: an 8 s stall of PostgreSQL mid-copy
        killed it with a traceback; its own janitor then took the move over from itself and
        failed it as a dead controller's). The writes are idempotent: a state already reached
        is not a transition, and the fields are the same again."""
        return await self._outlast(f"move {move_id}", lambda: self._set(move_id, state, **rec))

    async def _read(self, move_id: str) -> dict:
        """`_row`, waiting for a database out of reach as `_write` does."""
        return await self._outlast(f"move {move_id}", lambda: self._row(move_id))

    async def _outlast(self, kind: str, call: Callable[[], T]) -> T:
        """``call()``, called again each second while the database is out of reach; ``kind``
        names the waiter in the log's line."""
        while True:
            try:
                got = call()
            except DBAPIError as exc:
                if not db_unreachable(exc):
                    raise
                waits.failed(kind, exc)  # (a line when it starts, once a minute, one when it is back)
                await asyncio.sleep(1)
                continue
            waits.ok(kind)
            return got

    def _progress(self, move_id: str, copied: int) -> None:
        """Record how far a copy got. With the database out of reach the copy goes on, and
        the next write says it (a TakenOver still stops the copy)."""
        try:
            self._set(move_id, copied_bytes=copied)
        except DBAPIError as exc:
            if not db_unreachable(exc):
                raise
            waits.failed(f"move {move_id}", exc)

    @staticmethod
    def _answer(resp: httpx.Response, host: str, what: str) -> dict:
        """The JSON object a host's answer carries; HostUnreachable naming the host and what
        was wrong when it is not one (a proxy's or gateway's page in the agent's place, a body
        cut short): the agent's own answer never came back (review 36: the move's reason was a
        bare "JSONDecodeError: Expecting value" or "KeyError: 'files'")."""
        try:
            got = resp.json()
        except (ValueError, RecursionError):
            kind = resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"
            raise HostUnreachable(f"host {host} answered {what} with a {resp.status_code} whose body is not "
                                  f"JSON ({kind}), not a fuse agent's answer") from None
        if not isinstance(got, dict):
            raise HostUnreachable(f"host {host} answered {what} with a JSON {json_kind(got)}, not the "
                                  "object a fuse agent answers")
        return got

    async def _host(self, host: str, method: str, path: str, ok=(200, 201, 204), **kw):
        if host in self._gone:  # removed with force, its agent gone for good: it holds nothing
            resp = httpx.Response(404, json={"error": {"code": "not_found", "message": (
                f"host {host} was removed with force (its agent is gone): it holds nothing")}})
            if 404 in ok:
                return resp
            from ..vms import host_error
            raise host_error(resp, host)
        # (the host's address is read from the store: a move's driver waits out a database out of
        # reach here too, rather than end on it (review 36); a request's caller gets its 503)
        driving = DRIVING.get()
        conn = await self._outlast(f"move {driving}", lambda: self.fleet.conn(host)) if driving \
            else self.fleet.conn(host)
        try:
            resp = await conn.request(method, path, **kw)
        except HostUnreachable as exc:
            if timed_out(exc) and kw.get("timeout"):
                exc.hung = (host, kw["timeout"])  # (for the move's reason: `_failure`)
            exc.host = host  # (the reason names the host and its role: `_failure`)
            raise
        if resp.status_code == 404 and 404 in ok and not agent_not_found(resp):
            # a 404 read as "the host holds nothing" must be the agent's own word: a proxy or
            # gateway in the way (a cut link's traffic can end at one) answering 404 would have
            # a move roll back while the target's copy runs, or leave its files for good
            raise HostUnreachable(f"host {host} did not answer {method} {path}: a 404 came back that is "
                                  "not the host agent's (no fuse error body), so whether it holds the "
                                  "vm is not known")
        if resp.status_code not in ok:
            from ..vms import host_error
            raise host_error(resp, host)
        return resp
