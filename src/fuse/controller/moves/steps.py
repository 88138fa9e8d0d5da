"""The move itself: sleep on the source, copy, install and wake on the target,
remove the source copy.

`MoveSteps._run` drives one move through its states (see the package docstring
for the table), persisting each before its step runs. Any failure is turned into
a reason an operator can act on (`_failure`: which host did not answer, in what
limit) and handed to rollback (`MoveRollback._recover`), which brings the VM home
or, when the target already runs it, finishes the move forward.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.exc import DBAPIError

from ...errors import FuseError, HostUnreachable
from ..store import vms as vms_t
from ..store.outage import db_unreachable
from ..vms import state_wait_s
from . import hooks
from .records import ACTIVE, DRIVING, IO_TIMEOUT, QUICK_TIMEOUT, MoveRecords, TakenOver, log, timed_out


class MoveSteps(MoveRecords):
    """The steps of a move, in the order `_run` takes them."""

    async def _run(self, move_id: str) -> None:
        DRIVING.set(move_id)  # (this task's context: what it starts inherits it)
        try:
            await self._drive(move_id)
        except TakenOver as exc:
            log.warning("%s", exc)
        except Exception:  # (a fault of the controller's own: said here, not as a task's unread error;
            # the janitor settles the move, whose driver has ended, as a dead one's)
            log.exception("move %s: its driver ended on an unexpected error; the move is settled as a dead "
                          "driver's", move_id)

    async def _drive(self, move_id: str) -> None:
        row = await self._read(move_id)
        if row["state"] not in ("starting", "pending"):
            return
        step = "sleeping"
        woken = False  # whether the target has been asked to wake the VM
        try:
            await hooks.pause_point("starting")
            row = await self._write(move_id, "sleeping")
            hooks.crash_point("sleeping")
            await self._sleep(row)
            hooks.crash_point("slept")
            await hooks.pause_point("slept")
            step = "copying"
            row = await self._write(move_id, "copying")
            await self._copy(row)
            hooks.crash_point("copied")
            await hooks.pause_point("copied")
            hooks.fail_point("copied")
            step = "waking"
            row = await self._write(move_id, "waking")
            await self._install(row)
            hooks.crash_point("installed")
            hooks.fail_point("installed")
            woken = True
            await self._wake_target(row)
            hooks.crash_point("woke")
            hooks.fail_point("woke")
            await hooks.pause_point("woke")
            await self._finish(row)
            return
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # this controller stops (close): the move is settled now, as the next run would
            # settle it, rather than left with its VM asleep until some controller starts
            asyncio.current_task().uncancel()
            try:
                row = self._row(move_id)
                if row["state"] in ACTIVE and not woken:
                    self._set(move_id, reason=f"the controller stopped during {row['state']}")
            except DBAPIError as exc:
                if not db_unreachable(exc):
                    raise
                # (nothing can be settled without it: the next controller to reach it settles the move)
                log.warning("move %s: the controller stops with its database out of reach; the next controller "
                            "settles the move", move_id)
                return
            log.warning("move %s: the controller stops during %s; settling it", move_id, row["state"])
            await self._recover(self._row(move_id))
            return
        except TakenOver:
            raise  # (the replica that took it over settles it: nothing more is written here)
        except Exception as exc:
            reason, target_hung = await self._failure(await self._read(move_id), step, exc)
            log.warning("move %s failed: %s", move_id, reason)
            # (a target that hung before it was asked to wake holds no copy that could run:
            # the VM goes home without waiting on it again, and the janitor aborts its side)
            await self._write(move_id, reason=reason, **({"target_hung": True} if target_hung else {}))
            if step == "waking" and not woken:
                # the install failed (or its answer was lost) and the target was never asked to
                # wake: whatever it took in cannot run (only this move's wake runs it), so the
                # VM goes home now, as after a failed copy, instead of asleep on its source
                # until that target answers again (maybe never); its side is aborted, now or by
                # the janitor once it answers
                await self._write(move_id, "rolling_back")
        await self._recover(await self._read(move_id))

    async def _failure(self, row: dict, step: str, exc: Exception) -> tuple[str, bool]:
        """The reason a move failed at ``step``, and whether it was the target that
        stopped answering before it was asked to wake. A host that did not answer in
        time is named with its role and the limit it had ("target host h2 did not
        answer within 30 s during copying"), not with the OS error that ended the
        wait: an operator reads which host to look at."""
        if isinstance(exc, DBAPIError) and db_unreachable(exc):  # (a store call no step waits out)
            return f"the controller lost its database during {step}: {' '.join(str(exc.orig or exc).split())}", False
        if not isinstance(exc, FuseError):  # a fault of the controller's own: its traceback is logged
            log.error("move %s: an unexpected error during %s", row["id"], step, exc_info=exc)
            return (f"the controller failed during {step} on an unexpected error ({type(exc).__name__}: {exc}); "
                    "its log has the details"), False
        hung = getattr(exc, "hung", None)
        if hung is None and step == "copying" and timed_out(exc):
            # The bulk copy's sockets ran out of time, which does not say which end stopped: a host
            # whose poller is failing while the other's is not is the one; else both are asked.
            ends = [row["target"], row["source"]]
            quiet = [h for h in ends if (v := self.fleet.views.get(h)) is None or v.failures or not v.connected]
            if len(quiet) != 1:
                quiet = await self._not_answering(ends)
            if not quiet:
                # (bytes may have moved all along, on a slow link: what is known is that one chunk
                # took longer than its limit, not that nothing moved; review 36)
                return (f"the copy from {row['source']} to {row['target']} was too slow: a 4 MiB chunk did not "
                        f"get through within {IO_TIMEOUT:g} s (FUSE_MOVE_IO_TIMEOUT), though both hosts answer",
                        False)
            hung = (quiet[0], IO_TIMEOUT)
        if hung is None:
            host = getattr(exc, "host", None)
            if isinstance(exc, HostUnreachable) and host in (row["source"], row["target"]):
                # (a dropped connection named an address: the operator reads which host, in which role)
                return f"{'target' if host == row['target'] else 'source'} host {host}: {exc.message}", False
            return exc.message, False
        host, secs = hung
        role = "target" if host == row["target"] else "source"
        return (f"{role} host {host} did not answer within {secs:g} s during {step}",
                role == "target" and step in ("sleeping", "copying"))

    async def _not_answering(self, hosts: list[str], timeout: float = 2.0) -> list[str]:
        """Those of ``hosts`` that do not answer ``GET /v1/host`` within ``timeout``
        (asked side by side, so this costs ``timeout`` at most)."""
        async def answers(h: str) -> bool:
            try:
                return (await self._host(h, "GET", "/v1/host", ok=(200,), timeout=timeout)).status_code == 200
            except FuseError:
                return False
        ok = await asyncio.gather(*(answers(h) for h in hosts))
        return [h for h, good in zip(hosts, ok) if not good]

    @staticmethod
    def _state_wait(row: dict) -> float:
        """Seconds a host may take to sleep, install or wake the VM of move ``row``:
        ``state_wait_s`` of its memory, from the VM's record the move was asked with."""
        vm = (row.get("record") or {}).get("vm")
        shape = vm.get("shape") if isinstance(vm, dict) else None
        return state_wait_s(shape.get("mem_mib") if isinstance(shape, dict) else None)

    async def _sleep(self, row: dict) -> None:
        vm = await self._host(row["source"], "POST", f"/v1/host/vms/{row['vm']}/sleep", json={"move_id": row["id"]},
                              timeout=self._state_wait(row))
        rec = self._answer(vm, row["source"], f"the sleep of vm {row['vm']}")
        files = rec.get("files", [])
        if not files:
            raise FuseError(f"vm {row['vm']} slept without state files")
        # Whether it wakes on the target (and at home, should the move fail) is what the source
        # says now, not what it was when the move was asked for: a sleep or a wake the owner
        # sent in between was answered, and stands. The source keeps room for the VM it put to
        # sleep for this move (``return_room``); a VM it found asleep, it only marked.
        was_running = bool(rec.get("return_room", row["record"].get("was_running", True)))
        await self._write(row["id"], files=files, total_bytes=sum(f["size"] for f in files), vm=rec,
                          was_running=was_running)

    async def _install(self, row: dict) -> None:
        """Have the target take in the copied files as the VM (sleeping, still marked)."""
        await self._host(row["target"], "POST", f"/v1/host/incoming/{row['id']}/install",
                         timeout=self._state_wait(row))

    async def _wake_target(self, row: dict) -> None:
        if row["record"].get("was_running", True):
            vm = await self._host(row["target"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                  json={"move_id": row["id"]}, timeout=self._state_wait(row))
        else:  # a sleeping VM stays asleep, now on the target and unmarked
            vm = await self._host(row["target"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                  json={"move_id": row["id"], "clear_mark": True}, timeout=60)
        woke = self._answer(vm, row["target"], f"the wake of vm {row['vm']}")
        await self._outlast(f"move {row['id']}", lambda: self._reassign(row, woke))

    def _reassign(self, row: dict, vm: dict) -> None:
        with self.store.tx() as c:
            c.execute(vms_t.delete().where(vms_t.c.host == row["source"], vms_t.c.name == row["vm"]))
        self.fleet.upsert_vms(row["target"], [vm])

    async def _finish(self, row: dict) -> None:
        """The target runs the VM: remove the source copy while the move is
        still `waking`, then record `done` (seed 004: "done: the source copy
        is removed"). A source that does not answer does not hold the move
        up: it is `done` with `source_removed` false, and the janitor removes
        the copy once the source answers. A crash before `done` is settled
        from `waking`: the target runs the VM, so the move finishes forward
        (the removal answers 404 if it had happened)."""
        removed = await self._remove_source(row)
        hooks.crash_point("removed")
        if removed:
            # the source's figures as they are now, not at its last poll: a move back to it
            # right after was refused by its agent's max_vms for up to a poll interval
            with contextlib.suppress(FuseError, DBAPIError):
                await self.fleet.refresh(row["source"])
        # (a reason a step left on the way, a wake's lost reply say, does not outlive the
        # move's success: `reason` says why a move failed)
        await self._write(row["id"], "done", source_removed=removed, reason="")

    async def _remove_source(self, row: dict) -> bool:
        """Delete the source copy this move holds; False if the source did not answer."""
        try:
            # (a sleeping copy's files to remove: quick; a source that does not answer in that
            # time is left to the clean-up, the move done, as the README says, not held 60 s)
            await self._host(row["source"], "DELETE", f"/v1/host/vms/{row['vm']}", ok=(204, 404),
                             params={"move_id": row["id"]}, timeout=QUICK_TIMEOUT)
            return True
        except FuseError as exc:
            log.warning("move %s: source copy not removed yet: %s", row["id"], exc.message)
            return False
