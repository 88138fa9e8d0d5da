"""The janitor: move leases across controller replicas, taking over the moves a
dead driver left, and removing what failed or finished moves left on hosts.

Several replicas may share one store. Each move names its driver (``owner``),
which renews a lease every second (`LEASE_S`); a move whose lease ran out is
claimed under a row lock, so a live replica's move is never rolled back by
another, and settled (`MoveRollback._recover`). Whether it ran out is judged on
this replica's own clock, by watching the lease go unrenewed (`leases.LeaseWatch`),
never by comparing the driver's wall-clock stamp with this machine's. The same
loop retries, every 2 s and beside the lease renewal, the tidying a move could
not do at once: aborting a target's incoming copy (``cleanup_pending``) and
removing a done move's source copy (``source_removed`` false). A new move of a
VM does the first at once for its own leftovers (`_clear_leftovers`) before it
puts the VM to sleep.
"""

from __future__ import annotations

import asyncio
import functools
import time

from sqlalchemy import and_, false, func, or_, select, true, update

from ...errors import FuseError, HostUnreachable
from ..store import moves as moves_t
from ..store.outage import PassLog
from .leases import BLIND_S, LeaseWatch, seen
from .records import ACTIVE, LEASE_S, MoveRecords, log

passes = PassLog(log)  # (the database out of reach: a line, not a traceback a second)

# A new move removes what a failed move of the same VM left on a host (its
# abort did not get through) before it starts; it waits this long for the host,
# holding up other moves' starts meanwhile.
LEFTOVER_TIMEOUT = 10.0


class MoveJanitor(MoveRecords):
    """Leases, take-over of orphaned moves, and clean-up of leftovers."""

    @functools.cached_property
    def _move_leases(self) -> LeaseWatch:
        """What this replica last saw of each active move's lease, and since when."""
        return LeaseWatch()

    def _lease_ran_out(self, move_id: str, rec: dict) -> bool:
        """Whether the driver of move ``move_id`` (its record ``rec``) has left its lease unrenewed
        for `LEASE_S` of this replica's looks. Its ``lease_until`` is the driver's wall clock, so
        not compared with this one's (review 37: a replica 10 s ahead took every move over from
        the live one driving it, and a controller restarted with its clock stepped back an hour
        left the move its crash cut asleep, its VM unwakeable, for that hour): a restarted
        controller, a new instance, settles its last run's moves `LEASE_S` after its first look."""
        return self._move_leases.ran_out(move_id, seen(rec.get("owner"), rec.get("lease_until"), rec.get("lease_n")))

    def _claim(self, move_id: str) -> dict | None:
        """Take over an active move whose lease ran out (row-locked, so two
        replicas never both take it). Returns the row, or None."""
        with self.store.tx() as c:
            q = select(moves_t).where(moves_t.c.id == move_id)
            if not self.store.is_sqlite:
                q = q.with_for_update()
            row = c.execute(q).mappings().first()
            if row is None or row["state"] not in ACTIVE:
                return None
            rec = dict(row["record"] or {})
            if rec.get("owner") != self.ctl.instance and not self._lease_ran_out(move_id, rec):
                return None
            # (the stamp for older replicas and for operators; the count, changed, is the renewal here)
            rec.update(owner=self.ctl.instance, lease_until=time.time() + LEASE_S, lease_n=rec.get("lease_n", 0) + 1)
            c.execute(update(moves_t).where(moves_t.c.id == move_id).values(record=rec))
            return dict(row, record=rec)

    def _renew_and_recover(self, claim: bool = True) -> None:
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(moves_t).where(moves_t.c.state.in_(ACTIVE))).mappings()]
        self._move_leases.keep(r["id"] for r in rows)
        now = time.time()
        for row in rows:
            mine = (row["record"] or {}).get("owner") == self.ctl.instance
            running = row["id"] in self._tasks and not self._tasks[row["id"]].done()
            if not mine:
                # (every pass looks, claiming or not: the time a lease goes unrenewed is counted
                # through the blind period's wait below too, so both end together)
                self._lease_ran_out(row["id"], row["record"] or {})
            if mine and running:
                with self.store.tx() as c:  # renew (the row read again, locked: another replica may
                    # have taken the move over since the read above, and its claim must stand)
                    q = select(moves_t).where(moves_t.c.id == row["id"])
                    now_row = c.execute(q if self.store.is_sqlite else q.with_for_update()).mappings().first()
                    if now_row is not None and (now_row["record"] or {}).get("owner") == self.ctl.instance:
                        rec = dict(now_row["record"], lease_until=now + LEASE_S,
                                   lease_n=now_row["record"].get("lease_n", 0) + 1)
                        c.execute(update(moves_t).where(moves_t.c.id == row["id"]).values(record=rec))
            elif not running and (claim or mine) and (claimed := self._claim(row["id"])) is not None:
                log.warning("move %s: taking over from %s", row["id"], (row["record"] or {}).get("owner"))
                self._tasks[row["id"]] = asyncio.create_task(self._recover(claimed))

    async def _janitor_loop(self) -> None:
        """Renew leases, recover orphaned moves, and retry what a failed or
        finished move could not tidy at once."""
        tick = 0
        looked = trust_at = None  # (monotonic) the last pass that read the store; when claims may resume
        while True:
            now = time.monotonic()
            if looked is not None and now - looked > BLIND_S:
                # A lease that ran out while this replica could not look either is no sign its driver
                # died: a database outage kept it from renewing as it kept this one from seeing (review
                # 36: an 8 s stall of PostgreSQL, and a live replica's move was taken over and failed).
                # Its driver gets a lease's time to renew once the store answers again.
                trust_at = now + LEASE_S
            try:
                self._renew_and_recover(claim=trust_at is None or now >= trust_at)
                looked = now
                self.renew_drains()
                self.resume_drains(takeover=True)  # (a replica that died mid-drain)
                passes.ok("move leases")
            except Exception as exc:  # the store may blip; try again next second
                passes.failed("move leases", exc)
            await asyncio.sleep(1)
            tick += 1
            # The clean-up waits on hosts (a hung one for its whole timeout): it runs
            # beside this loop, so the leases are renewed every second meanwhile.
            if tick % 2 == 0 and (self._tidying is None or self._tidying.done()):
                self._tidying = asyncio.create_task(self._tidy_safely())

    async def _tidy_safely(self) -> None:
        try:
            await self._tidy()
            passes.ok("move clean-up")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a store blip or an odd reply must not end the clean-up
            passes.failed("move clean-up", exc)

    def _untidy(self) -> list[dict]:
        """The moves whose clean-up may be left: failed ones with a target copy to abort or their
        source to wake, done ones whose source copy is not removed yet. Picked by the store (the
        JSON path operators SQLite and PostgreSQL both have), not by reading every move ever made
        each pass, one more read each (review 36: ~1.5 % of a core per 100 moves kept, most of an
        idle controller's time at 900, and its event loop held meanwhile)."""
        def flag(key: str):  # (a field absent, or null: false)
            return func.coalesce(moves_t.c.record[key].as_boolean(), false())

        with self.store.read() as c:
            rows = c.execute(select(moves_t).where(or_(
                and_(moves_t.c.state == "failed", or_(flag("cleanup_pending") == true(),
                                                      flag("source_wake_pending") == true())),
                and_(moves_t.c.state == "done", flag("source_removed") == false())))
                .order_by(moves_t.c.created_at)).mappings().all()
        return [dict(r) for r in rows]

    async def _tidy(self) -> None:
        """Retry what a failed or finished move could not tidy at once."""
        for m in self._untidy():
            row = self._row(m["id"])  # (as it is now: an earlier one's clean-up waited on its hosts)
            rec = row["record"] or {}
            try:
                if row["state"] == "failed" and rec.get("cleanup_pending"):
                    await self._abort_target(row)
                    self._set(row["id"], cleanup_pending=False, target_clear=True)
                elif row["state"] == "done" and not rec.get("source_removed") and await self._remove_source(row):
                    self._set(row["id"], source_removed=True)
                if (row["state"] == "failed" and rec.get("source_wake_pending")
                        and time.time() >= rec.get("source_wake_next", 0)):
                    await self._retry_wake(row)
            except FuseError:
                pass

    async def _clear_leftovers(self, name: str, source: str, to: str | None) -> dict[str, str]:
        """Remove now what failed moves of vm ``name`` left on their targets (an
        incoming copy whose abort did not get through: ``cleanup_pending``), on
        ``to`` or, for best fit, on any host; the janitor would do the same within
        2 s. Returns each host whose copy is still there -> why, so that host is
        refused before the VM is put to sleep (its arrival there would fail with
        "already exists" and bring the VM home again).

        Removing it here rather than refusing at once: the usual cause is a target
        that was unreachable while the move failed, and a move asked again once it
        answers should just go. Refusing when the removal fails keeps the VM
        running and untouched; the move can be asked again once the host answers."""
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(moves_t).where(
                moves_t.c.vm == name, moves_t.c.state == "failed", moves_t.c.target != source)).mappings()]
        left: dict[str, str] = {}
        for row in sorted(rows, key=lambda r: r["created_at"]):
            if not (row["record"] or {}).get("cleanup_pending") or (to is not None and row["target"] != to):
                continue
            target = row["target"]
            if target in left:
                continue  # (a host that did not clear one copy is not waited on again for the next)
            view = self.fleet.views.get(target)
            try:
                if view is None or not view.connected:
                    raise HostUnreachable(f"host {target} is not connected")
                await self._abort_target(row, timeout=LEFTOVER_TIMEOUT)
            except FuseError as exc:
                left[target] = (f"still holds the incoming copy of vm {name} that failed move {row['id']} left "
                                f"there, not removed yet ({exc.message}); the controller retries the removal "
                                "every 2 s: move the vm again once it is gone")
                continue
            log.info("move %s: removed its leftover copy of vm %s from %s", row["id"], name, target)
            self._set(row["id"], cleanup_pending=False, target_clear=True)
        return left
