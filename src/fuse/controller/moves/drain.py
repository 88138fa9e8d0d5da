"""Draining a host: every VM on it moved off, one after another, by best fit.

A drain is a sequence of ordinary moves (`MoveService.create`), so it has no
states of its own: the host's ``draining`` state is its record, which is why a
controller that starts resumes the drain of every draining host. One drain runs
per host; a second call joins it. See `MoveDrains.drain` for what it reports.

Across replicas sharing a store, one runs a host's drain: it holds the drain's
lease (a ``settings`` row, renewed every second by the janitor beside the moves'
leases). A replica asked to drain a host another one drains waits for that drain
to end, then runs a round of its own (what is left, or arrived since); a
replica that dies mid-drain leaves its lease to run out, and another takes the
drain over (``host_drain_resumed``) where the moves left it. A lease runs out once
a replica has seen it unrenewed for `LEASE_S` on its own clock (leases.py), as a
move's does: its ``until`` is the holder's wall clock, not compared with this
one's. A drain that ended (its report given) marks its lease done, with its report: the next start of a
controller resumes it, as it resumes every draining host's drain, but a live
replica does not. A replica that stalled past its lease (a frozen process) stops
its drain once it sees the lease taken, and its callers wait for the drain of the
one that took it over: they get that one's report, with what this one had done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
import weakref
from typing import Any

from sqlalchemy import select

from ...envsettings import seconds
from ...errors import FuseError
from ..hosts import FINISHED  # the registry's: VMs whose run is over, which deregister lets go with the host
from ..store import moves as moves_t
from ..vms import CREATE_TIMEOUT_SECS
from .leases import LeaseWatch, seen
from .records import ACTIVE, LEASE_S, MoveRecords, log
from .targets import refuse

# A drain that finds a VM in a move (the one a controller crash left, another
# drain's, an operator's) waits this long at most for it to end before it reports
# the VM stuck.
DRAIN_MOVE_WAIT_S = 900.0
# A VM still booting on the host (``creating``: its create was placed there before the
# drain began, and the host has answered it) is waited for this long at most, then moved:
# as long as the controller waits on a host's answer to a create (a slow boot).
DRAIN_BOOT_WAIT_S = seconds("FUSE_DRAIN_BOOT_WAIT_S", float(CREATE_TIMEOUT_SECS))
# A prewarm's standby VMs are not moved (they have no entry yet): their prewarm places
# them again on other hosts and removes them here; the drain waits this long at most.
DRAIN_STANDBY_WAIT_S = seconds("FUSE_DRAIN_STANDBY_WAIT_S", 60.0)
STANDBY = "a prewarm's standby VM (no entry yet: not moved)"
STANDBY_STAYS = {  # why one stays, by what became of its prewarm
    "waits": f"{STANDBY}: its prewarm found no room for it on another host in time (it goes once one has "
             "room); remove the prewarm, or delete the VM",
    "pinned": f"{STANDBY}: its prewarm is pinned to this host (on host:...); remove the prewarm, or delete the VM",
    "nowhere": f"{STANDBY}: no other host within its prewarm's on has its image; remove the prewarm, or delete "
               "the VM",
    "ended": f"{STANDBY} of a prewarm that ended: delete the VM",
    "left": f"{STANDBY}: its prewarm placed it again on another host, but this host did not answer its delete "
            "(it goes once the host answers); deregister the host with force, or delete the VM then",
}


class MoveDrains(MoveRecords):
    """Draining hosts, and resuming the drains a controller restart left."""

    async def drain(self, host_id: str) -> dict[str, Any]:
        """Move every VM off a draining host, one after another, by best fit.
        VMs that cannot move are reported, never killed. A VM whose run is over
        (`FINISHED`: exited, failed) has nothing to move and needs nothing: it is
        reported in ``finished``, not ``stuck``, since it does not keep the host
        from being deregistered (it goes with the host). A drain of a host whose
        drain is in progress joins it and answers its report. A VM found in a move
        (one a crash interrupted, an operator's, a replica's drain's) is waited for:
        moved, it is reported moved; back home, the drain moves it. A VM still booting
        (``creating``: a create placed before the drain began) is waited for
        (DRAIN_BOOT_WAIT_S at most), then moved; a boot that failed is ``finished``.

        A drain outlives the controller that ran it: the host's ``draining`` state is
        the record that it is wanted, and a controller that starts resumes the drain
        of every draining host (`resume`), as an operator who drained a host expects
        it to end empty, not half-drained because the controller restarted. The move
        a crash interrupted is settled first (it rolls back, or finishes forward), and
        its VM is then moved again. A resumed drain has no caller to answer: it emits
        ``host_drain_resumed`` and, at the end, ``host_drain_report`` with its report;
        a drain asked meanwhile joins it and answers that report. ``uncordon`` ends it
        as it ends any drain.

        A drain another replica took over (this one stalled past its lease: `renew_drains`
        stops it) answers once that replica's drain ends: its report, with what this one
        moved before (review 34: the caller got a bare 500, the cancelled drain's
        CancelledError unhandled). Should that drain end with no report (its replica
        died too, or let it go), this replica runs the drain again, as a joiner does."""
        mine = None  # what this replica's drains did before another replica took them over
        while True:
            task = self._drain_task(host_id)
            try:
                report = await asyncio.shield(task)
            except asyncio.CancelledError:
                # (this replica stopping, or the request itself cancelled: that stop goes on)
                if self._stopping or not task.cancelled() or asyncio.current_task().cancelling():
                    raise
                report = None  # (stopped by `renew_drains`: the lease taken)
            part = self._drain_parts.get(task)  # (kept by `_leased_drain` only when the lease was taken)
            if report is not None and part is None:
                return _merged(mine, report)
            # Taken over: stopped, or ended before this replica saw the lease taken (a move it
            # drove was taken over with it) and so with a word on VMs the other one moves.
            mine = _merged(mine, report or part)
            theirs = await self._their_report(host_id)
            if theirs is not None:
                return _merged(mine, theirs)

    @functools.cached_property
    def _drain_leases(self) -> LeaseWatch:
        """What this replica last saw of each drain's lease, and since when."""
        return LeaseWatch()

    def _drain_held(self, key: str, lease: dict | None) -> bool:
        """Whether another replica holds drain lease ``lease`` (settings ``key``) live: not
        done, not let go (``until`` 0), and seen renewed within `LEASE_S` of this replica's
        looks. Its ``until`` is the holder's wall clock, not compared with this one's (review 37:
        a replica 10 s ahead took over the drain a live one ran, and the move it drove)."""
        if not lease or lease.get("done") or lease.get("owner") == self.ctl.instance or not lease.get("until"):
            return False
        return not self._drain_leases.ran_out(key, seen(lease.get("owner"), lease.get("until"), lease.get("n")))

    @functools.cached_property
    def _drain_parts(self) -> weakref.WeakKeyDictionary[asyncio.Task, dict[str, Any]]:
        """Per drain task: what its drain has done so far (`_drain` fills it), kept past its
        end only when another replica took the drain over, for its callers (`drain`)."""
        return weakref.WeakKeyDictionary()

    async def _their_report(self, host_id: str) -> dict[str, Any] | None:
        """Wait while another replica holds the drain of ``host_id`` (one that took it over
        from this one), then its report; None when it ended with none (it let the lease go
        or ran out of it: its replica stopped or died), for this replica to run the drain."""
        key = _drain_key(host_id)
        while True:
            lease = self.store.get_setting(key) or {}
            if lease.get("owner") == self.ctl.instance:
                return None
            if lease.get("done"):
                return lease.get("report")
            if not self._drain_held(key, lease):  # (let go, or run out)
                return None
            await asyncio.sleep(1)

    def _drain_task(self, host_id: str, resumed: bool = False) -> asyncio.Task:
        task = self._drains.get(host_id)
        if task is None or task.done():
            task = self._drains[host_id] = asyncio.create_task(self._leased_drain(host_id, resumed))
            task.add_done_callback(lambda t: self._drains.pop(host_id, None) if self._drains.get(host_id) is t else None)
        return task

    async def _leased_drain(self, host_id: str, resumed: bool) -> dict[str, Any]:
        """The drain, once this replica holds its lease: a drain asked here while another
        replica runs it waits for that one to end (the host left draining ends the wait)."""
        while not self._take_drain(host_id):
            await asyncio.sleep(1)
            host = self.store.get_host(host_id)
            if host is None or host["state"] != "draining":
                return {"host": host_id, "moved": [], "stuck": [], "finished": [], "prewarmed": []}
        done, report, held = True, None, True
        self._held_drains.add(host_id)
        try:
            report = await (self._resumed_drain(host_id) if resumed else self._drain(host_id))
            return report
        except asyncio.CancelledError:
            done = False  # (this replica stops: the lease is let go, for a live one to take the drain over)
            raise
        finally:
            self._held_drains.discard(host_id)
            try:
                held = self._end_drain(host_id, done, report)
            except Exception as exc:  # (the lease runs out by itself; a live replica then runs the drain again)
                log.warning("host %s: could not mark its drain %s: %s", host_id, "done" if done else "let go", exc)
            if held:  # (what it did is kept for its callers only when another replica took it over)
                self._drain_parts.pop(asyncio.current_task(), None)

    def resume_drains(self, takeover: bool = False) -> list[str]:
        """Resume the drain of every host left ``draining`` that no live replica drains (a
        controller's start); with ``takeover``, only those whose drain a replica ran and
        left unfinished, its lease run out (the janitor's, every second)."""
        hosts = []
        listed = self.store.list_hosts()
        self._drain_leases.keep(_drain_key(r["id"]) for r in listed if r["state"] == "draining")
        for r in listed:
            if r["state"] != "draining" or (r["id"] in self._drains and not self._drains[r["id"]].done()):
                continue
            lease = self.store.get_setting(_drain_key(r["id"]))
            if takeover and (not lease or lease.get("done") or lease.get("owner") == self.ctl.instance):
                continue
            if not self._take_drain(r["id"]):
                continue
            log.warning("host %s is draining%s: resuming its drain", r["id"],
                        f" and {lease.get('owner')} stopped renewing it" if takeover else "")
            self._drain_task(r["id"], resumed=True)
            hosts.append(r["id"])
        return hosts

    def _take_drain(self, host_id: str) -> bool:
        """Hold the drain's lease (in one write transaction: the replicas' write lock),
        unless another replica holds it live."""
        key = _drain_key(host_id)
        with self.store.tx() as c:
            lease = self.store.get_setting(key, conn=c)
            if self._drain_held(key, lease):
                return False
            # (``until`` for older replicas and operators; ``n``, renewed, is what replicas watch)
            self.store.put_setting(key, {"host": host_id, "owner": self.ctl.instance, "until": time.time() + LEASE_S,
                                         "n": (lease or {}).get("n", 0) + 1}, c)
        return True

    def _end_drain(self, host_id: str, done: bool = True, report: dict[str, Any] | None = None) -> bool:
        """Mark this replica's drain of ``host_id`` done with its report (for the callers of
        a replica it took the drain over from: `_their_report`), or let its lease go at once
        (the replica stops mid-drain: a live one takes it over). Whether the lease was still
        this replica's (else another took the drain over)."""
        key = _drain_key(host_id)
        with self.store.tx() as c:
            lease = self.store.get_setting(key, conn=c)
            if not lease or lease.get("owner") != self.ctl.instance:
                return not lease
            self.store.put_setting(key, lease | ({"done": True, "report": report} if done else {"until": 0}), c)
        return True

    def renew_drains(self) -> None:
        """Renew the lease of every drain this replica runs (the janitor, every second)."""
        now = time.time()
        for host_id, task in list(self._drains.items()):
            if task.done() or host_id not in self._held_drains:  # (one waiting for the lease holds none)
                continue
            key = _drain_key(host_id)
            with self.store.tx() as c:
                lease = self.store.get_setting(key, conn=c)
                if lease and lease.get("owner") == self.ctl.instance and not lease.get("done"):
                    self.store.put_setting(key, lease | {"until": now + LEASE_S, "n": lease.get("n", 0) + 1}, c)
                    continue
            if lease and lease.get("owner") not in (None, self.ctl.instance):
                # (another replica took the drain over while this one's renewals failed: one
                # drain of a host at a time, so this one stops; the move under way finishes,
                # and its callers wait for the other's report: `drain`)
                log.warning("host %s: replica %s took its drain over; stopping this one (its callers get that "
                            "replica's report)", host_id, lease.get("owner"))
                task.cancel()

    async def _resumed_drain(self, host_id: str) -> dict[str, Any]:
        self.store.add_event("host_drain_resumed", {"id": host_id}, host=host_id)
        report = await self._drain(host_id)
        log.warning("host %s: resumed drain moved %d vm(s), %d stuck", host_id, len(report["moved"]),
                    len(report["stuck"]))
        self.store.add_event("host_drain_report", report | {"resumed": True}, host=host_id)
        if self.fleet:
            self.fleet.changed.set()
        return report

    async def _drain(self, host_id: str) -> dict[str, Any]:
        """The drain's rounds: the VMs on the host are moved off; then the drain waits for
        what may still land there (a move into the host, a create placed before the
        drain began: both chose the host while it was active) and moves what did, until
        a round finds nothing new. The report accounts for every VM the host had while
        draining, not only those of its first list."""
        part = self._drain_parts[asyncio.current_task()] = {"host": host_id, "moved": [], "stuck": [],
                                                            "finished": [], "prewarmed": []}
        moved, stuck, finished, standby = part["moved"], part["stuck"], part["finished"], []
        seen: set[str] = set()
        while True:
            # (read before the list: a move off the host already over then did not take a VM of
            # the list off it, as it was there after; `_drain_round` counts none of them)
            over = self._moves_over(host_id)
            left = []
            for vm in self.ctl.vms.list(host_id):
                if vm["name"] in seen:
                    continue
                seen.add(vm["name"])
                if vm["state"] in FINISHED:
                    finished.append({"vm": vm["name"], "state": vm["state"]})
                elif vm.get("standby"):
                    standby.append(vm["name"])
                else:
                    left.append(vm)
            if not left:
                if await self._departures(host_id, seen, moved, stuck):
                    continue  # a move that failed brought its VM home: the next round's list says
                if await self._arrivals(host_id):
                    continue  # something landed, or did not: the next round's list says
                break
            if not await self._drain_round(host_id, left, moved, stuck, finished, over):
                break
        stays = await self._standby_left(host_id, standby) if standby else {}
        stuck += [{"vm": name, "code": "standby", "reason": STANDBY_STAYS[why]} for name, why in sorted(stays.items())]
        return {"host": host_id, "moved": moved, "stuck": stuck,
                "finished": sorted(finished, key=lambda f: f["vm"]),
                "prewarmed": sorted(set(standby) - set(stays))}

    async def _standby_left(self, host_id: str, names: list[str]) -> dict[str, str]:
        """Hand a prewarm's standby VMs on draining ``host_id`` to their prewarm (its refill
        places them again elsewhere, then deletes them here, as off a cordoned host) and wait
        (DRAIN_STANDBY_WAIT_S at most) while it does; those still here then, each with why
        (a ``STANDBY_STAYS`` key). Not waited for: those whose prewarm is pinned here, ended,
        or may go to no other host (``room_hosts``)."""
        deadline = time.monotonic() + DRAIN_STANDBY_WAIT_S
        pw = self.ctl.prewarm
        live, pinned = pw.live_ids(), set(pw.pinned_to(host_id))
        stay: dict[str, str] = {}
        for name in names:
            pw_id = name.rsplit("-", 1)[0]
            if pw_id not in live:
                stay[name] = "ended"
            elif pw_id in pinned:
                stay[name] = "pinned"
            elif (room := pw.room_hosts(pw_id)) is not None and not room - {host_id}:
                stay[name] = "nowhere"
        names = [n for n in names if n not in stay]
        while True:
            here = [n for n in names if any(r["host"] == host_id for r in self.store.vms_named(n))]
            host = self.store.get_host(host_id)
            if not here or host is None or host["state"] != "draining" or time.monotonic() >= deadline:
                left = pw.left_on(host_id)
                return stay | {n: "left" if n.rsplit("-", 1)[0] in left else "waits" for n in here}
            await pw.hand_over(host_id)  # (now: the VMs with work have taken the room they needed first)
            await asyncio.sleep(1.0)

    async def _departures(self, host_id: str, seen: set[str], moved: list, stuck: list) -> bool:
        """Wait for the moves off ``host_id`` under way whose VM no list of the drain had (one a
        controller crash interrupted at its wake, whose VM is recorded on its target: review 31,
        the resumed drain reported nothing of it): done, the VM is reported moved; failed, it is
        home again, and the next round moves it. Whether there were any."""
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(moves_t).where(
                moves_t.c.source == host_id, moves_t.c.state.in_(ACTIVE))).mappings()]
        rows = [r for r in rows if r["vm"] not in seen]
        for r in rows:
            last = await self._await_moves(r["vm"], host_id) or self._last_move(r["vm"], host_id) or r
            if last["state"] == "done":
                seen.add(r["vm"])
                moved.append({"vm": r["vm"], "move": last["id"], "to": last["target"]})
            elif last["state"] in ACTIVE:  # (not settled within the wait: said, not waited for again)
                seen.add(r["vm"])
                stuck.append({"vm": r["vm"], "code": "move_in_progress", "move": last["id"],
                              "reason": f"move {last['id']} of it is still {last['state']}"})
        return bool(rows)

    async def _arrivals(self, host_id: str) -> bool:
        """Wait (DRAIN_MOVE_WAIT_S at most) while a move into ``host_id`` is under way or a
        create placed there waits on its answer; whether there was any to wait for."""
        deadline = time.monotonic() + DRAIN_MOVE_WAIT_S
        waited = False
        while time.monotonic() < deadline:
            host = self.store.get_host(host_id)
            if host is None or host["state"] != "draining":
                return waited  # stopped: the next round reports what landed as not tried
            with self.store.read() as c:
                incoming = c.execute(select(moves_t.c.id).where(moves_t.c.target == host_id,
                                                                moves_t.c.state.in_(ACTIVE))).first()
            if incoming is None and self.ctl.vms.placing_on(host_id).count <= 0:
                return waited
            waited = True
            await asyncio.sleep(0.25)
        return waited

    async def _drain_round(self, host_id: str, left: list[dict], moved: list, stuck: list, finished: list,
                           over: set[str]) -> bool:
        """Move each VM of ``left`` off ``host_id`` in turn; False when the drain was
        stopped (every VM not tried is then reported stuck). A VM gone meanwhile was moved
        only by a move not in ``over`` (those already over when ``left`` was read: review 35,
        a VM deleted during the drain was reported moved by a move of its name that had
        ended before the drain, the VM back here since), else it was deleted."""
        booting: dict[str, float] = {}  # VMs found booting: when the drain's wait for each began
        while left:
            vm = left.pop(0)
            host = self.store.get_host(host_id)
            if host is None or host["state"] != "draining":
                # Uncordoned (or cordoned, or deregistered) meanwhile: the drain ends, and
                # every VM it did not try is reported stuck, so the report still accounts
                # for each VM the host had (the operator drains again to move them).
                state = "deregistered" if host is None else host["state"]
                why = f"the drain was stopped before it tried this vm: host {host_id} is {state} now"
                stuck += [{"vm": v["name"], "code": "drain_stopped", "reason": why} for v in (vm, *left)]
                return False
            if not any(r["host"] == host_id for r in self.store.vms_named(vm["name"])):
                # gone since the list was read: moved by another drain (a replica's) or a move,
                # or deleted (in ``finished`` as ``deleted``: the report accounts for every VM)
                if (last := self._last_move(vm["name"], host_id, over)) is not None and last["state"] == "done":
                    moved.append({"vm": vm["name"], "move": last["id"], "to": last["target"]})
                else:
                    finished.append({"vm": vm["name"], "state": "deleted"})
                continue
            m, err = await self._drain_move(vm["name"], host_id)
            if getattr(err, "vm_state", None) == "creating":
                # Booting: a create placed here before the drain began (the host has answered
                # it); it moves once it runs (review 32: it was reported stuck mid-boot). The
                # others go first, and the booting ones are waited for together, not in turn.
                since = booting.setdefault(vm["name"], time.monotonic())
                if any(v["name"] not in booting for v in left):
                    left.append(vm)
                    continue
                if (after := await self._once_booted(vm["name"], host_id, since + DRAIN_BOOT_WAIT_S)) is None:
                    left.insert(0, vm)  # the drain was stopped meanwhile: said as for any VM not tried
                    continue
                m, err = after
            if m is None and err is None:
                finished.append({"vm": vm["name"], "state": "deleted"})  # (deleted meanwhile)
                continue
            if err is not None:
                if getattr(err, "vm_state", None) == "deleted" and (
                        last := self._last_move(vm["name"], host_id, over)) is not None and last["state"] == "done":
                    # (gone from here by another move that ended since the look above: moved)
                    moved.append({"vm": vm["name"], "move": last["id"], "to": last["target"]})
                elif getattr(err, "vm_state", None) in FINISHED:  # its run ended since the store last heard
                    finished.append({"vm": vm["name"], "state": err.vm_state})
                else:
                    stuck.append({"vm": vm["name"], "code": err.code, "reason": err.message})
                continue
            if m["id"] in self._tasks:
                # One at a time, so each choice of target sees the room the last one took.
                await asyncio.shield(self._tasks[m["id"]])
            m = self.get(m["id"])
            if m["state"] == "done":
                moved.append({"vm": vm["name"], "move": m["id"], "to": m["to"]})
            else:
                stuck.append({"vm": vm["name"], "code": "move_failed", "reason": m["reason"], "move": m["id"]})
        return True

    async def _drain_move(self, name: str, host_id: str) -> tuple[dict | None, FuseError | None]:
        """Start moving vm ``name`` off ``host_id``: (the move, None), (None, the refusal), or
        (None, None) when a delete of it under way removed it.
        A move of it already under way (the one a controller crash interrupted, which
        recovery settles; another drain's; an operator's) is waited for: done, that is the
        VM's move; failed, the VM is home again and this one starts."""
        try:
            return await self.create({"vm": name, "host": host_id}), None
        except FuseError as exc:
            if getattr(exc, "acting", None):  # a delete, sleep or wake of it waits on the host: after it
                deadline = time.monotonic() + DRAIN_MOVE_WAIT_S
                while self.ctl.vms.acting_on(name, host_id) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                if not any(r["host"] == host_id for r in self.store.vms_named(name)):
                    return None, None  # deleted: nothing left to move
                try:
                    return await self.create({"vm": name, "host": host_id}), None
                except FuseError as again:
                    return None, again
            if exc.code != "move_in_progress" or (last := await self._await_moves(name, host_id)) is None:
                return None, exc
        if last["state"] == "done":
            return self.get(last["id"]), None
        try:
            return await self.create({"vm": name, "host": host_id}), None
        except FuseError as exc:
            return None, exc

    async def _once_booted(self, name: str, host_id: str,
                           deadline: float) -> tuple[dict | None, FuseError | None] | None:
        """Wait (until ``deadline``, asking at least once) while vm ``name`` boots on ``host_id``,
        then start its move as `_drain_move` does: running, it moves; its boot failed (or it is
        gone), the refusal says so (its ``vm_state``: finished, not stuck). Still booting then, a
        refusal that says so; None when the drain was stopped meanwhile (uncordoned, deregistered)."""
        while True:
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            host = self.store.get_host(host_id)
            if host is None or host["state"] != "draining":
                return None
            m, err = await self._drain_move(name, host_id)  # (asks the host: its state, fresh)
            state = getattr(err, "vm_state", None)
            if state == "creating":
                if time.monotonic() < deadline:
                    continue
                break
            if err is not None and err.code == "not_movable" and state is None and await self._gone(name, host_id):
                # (its host no longer has it, its row not yet gone: its boot failed and its create
                # removed it, or it was deleted) nothing to move, listed as ``MoveService`` does
                err = refuse("not_movable", f"vm {name} is no longer on host {host_id}")
                err.vm_state = "deleted"
            return m, err
        err = refuse("not_movable", f"vm {name} is still creating (its guest booting) after the drain waited "
                                    f"{DRAIN_BOOT_WAIT_S:g} s for it: drain again once it runs, or delete it")
        err.vm_state = "creating"
        return None, err

    async def _gone(self, name: str, host_id: str) -> bool:
        """Whether vm ``name`` is gone from ``host_id``, as a poll of the host now says."""
        with contextlib.suppress(Exception):  # (one that does not answer: the store's last word)
            await asyncio.wait_for(self.fleet.refresh(host_id), 10.0)
        return not any(r["host"] == host_id for r in self.store.vms_named(name))

    def _last_move(self, name: str, host_id: str, over: set[str] = frozenset()) -> dict | None:
        """The newest move of vm ``name`` off ``host_id``, leaving out those of ``over``."""
        with self.store.read() as c:
            rows = c.execute(select(moves_t).where(moves_t.c.vm == name, moves_t.c.source == host_id)
                             .order_by(moves_t.c.created_at.desc())).mappings()
            row = next((r for r in rows if r["id"] not in over), None)
        return dict(row) if row is not None else None

    def _moves_over(self, host_id: str) -> set[str]:
        """The ids of the moves off ``host_id`` over now (done or failed)."""
        with self.store.read() as c:
            return set(c.execute(select(moves_t.c.id).where(moves_t.c.source == host_id,
                                                            moves_t.c.state.not_in(ACTIVE))).scalars())

    async def _await_moves(self, name: str, host_id: str) -> dict | None:
        """Wait (DRAIN_MOVE_WAIT_S at most) until no move of vm ``name`` from ``host_id``
        is under way, and return the last one; None when none was under way (the VM is
        held otherwise) or the wait ran out."""
        deadline = time.monotonic() + DRAIN_MOVE_WAIT_S
        waited = False
        while time.monotonic() < deadline:
            last = self._last_move(name, host_id)
            if last is None or last["state"] not in ACTIVE:
                return last if waited else None
            waited = True
            await asyncio.sleep(0.5)
        return None


def _merged(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> dict[str, Any] | None:
    """A drain's report from what this replica did before another took the drain over
    (``mine``) and the report of the drain after (``theirs``), whose word on a VM is the
    later one: a VM this replica left stuck, that one may have moved."""
    if not mine or not theirs:
        return theirs or mine
    named = {e["vm"] for k in ("moved", "stuck", "finished") for e in theirs.get(k, [])}
    named |= set(theirs.get("prewarmed", []))
    out = dict(theirs)
    for k in ("moved", "stuck", "finished"):
        out[k] = [e for e in mine.get(k, []) if e["vm"] not in named] + list(theirs.get(k, []))
    out["finished"] = sorted(out["finished"], key=lambda f: f["vm"])
    out["prewarmed"] = sorted(set(mine.get("prewarmed", [])) - named | set(theirs.get("prewarmed", [])))
    return out


def _drain_key(host_id: str) -> str:
    """The settings key of a host's drain lease (a host id may be 255 characters, a key 64)."""
    return "drain:" + hashlib.sha1(host_id.encode()).hexdigest()
