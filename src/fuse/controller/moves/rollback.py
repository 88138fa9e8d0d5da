"""Bringing a move that cannot go on to rest: forward when the target already
runs the VM, else home, with ``failed`` set only once the VM is back.

The one-place rule decides the order: once the target may have been asked to
wake the VM, only its own answer counts (its incoming side is aborted first, which
waits for a wake under way and never touches a woken VM), and the source wakes
only when the target holds no copy. A host that does not answer is retried
(`MoveRollback._recover`), never guessed; a target that cannot be reached to
remove an unwoken copy is left to the janitor (``cleanup_pending``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from sqlalchemy.exc import DBAPIError

from ...errors import FuseError, HostUnreachable, NotFound
from ..store.outage import db_unreachable
from .records import ACTIVE, DRIVING, IO_TIMEOUT, QUICK_TIMEOUT, MoveRecords, TakenOver, log, waits


WAKE_RETRY_FIRST_S, WAKE_RETRY_MAX_S = 2.0, 60.0  # a failed move's source wake, tried again (backing off)


class MoveRollback(MoveRecords):
    """Settling a failed or orphaned move, and the target/source calls it needs."""

    async def _settle(self, row: dict) -> None:
        """Bring a move that cannot go on to rest: forward when the target
        already runs the VM, else home. Raises when a host must answer first
        (the caller retries): the source never wakes while the target might
        run the VM, and `failed` is set only once the VM is home."""
        move_id = row["id"]
        reason = row["record"].get("reason") or (
            f"the controller driving the move stopped renewing its lease during {row['state']} (it restarted "
            "or died, or lost its database)")  # (review 28: a database outage read as a crash)
        if row["state"] == "waking":
            # The target may have been asked to wake. Aborting its incoming
            # side waits for a wake under way and never touches a woken VM;
            # then the target's own answer decides.
            await self._abort_target(row)
            if vm := await self._on_target(row):
                self._reassign(row, vm)
                await self._finish(row)
                return
        if row["state"] != "rolling_back":
            row = self._set(move_id, "rolling_back", reason=reason)
        if not row["record"].get("target_clear"):
            # Here the target was never asked to wake the VM (or, from `waking`, said above
            # that it holds no copy): its side can only be removed, so it is not waited on
            # long (QUICK_TIMEOUT), and not at all when it already failed to answer the move
            # (`target_hung`): the VM wakes home first, the janitor aborts the target's side
            # once it answers.
            try:
                if row["record"].get("target_hung"):
                    raise HostUnreachable(f"host {row['target']} did not answer the move: {reason}")
                await self._abort_target(row, timeout=QUICK_TIMEOUT)
                row = self._set(move_id, target_clear=True, cleanup_pending=False)
            except FuseError as exc:  # the janitor retries once the target answers
                row = self._set(move_id, cleanup_pending=True, cleanup_reason=exc.message)
        try:
            await self._wake_source(row)
        except NotFound as exc:  # nothing left to wake: say so, do not retry forever
            reason += f"; the vm is not on {row['source']} any more: {exc.message}"
        except FuseError as exc:
            tries = row["record"].get("source_wake_tries", 0) + 1
            self._set(move_id, source_wake_tries=tries, source_wake_error=exc.message)
            if isinstance(exc, HostUnreachable) or tries < 3:
                raise
            # The source answers but cannot wake it: leave it asleep, unmarked,
            # for the operator (nothing else could wake a VM held by a dead move).
            left = row["record"].get("vm")  # (as the move's sleep left it: its failed wakes change nothing)
            with contextlib.suppress(FuseError):
                left = (await self._host(row["source"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                         json={"move_id": move_id, "clear_mark": True}, timeout=30)).json()
            reason += f"; the vm is asleep on {row['source']}: waking it failed: {exc.message}"
            if row["record"].get("was_running", True):
                # it ran before the move: the janitor goes on waking it (a full disk freed, room
                # back), backing off, until it runs or someone else acted on it (``_retry_wake``;
                # with no answer telling what it left, by the move's mark alone, as before)
                self._set(move_id, source_wake_pending=True, source_wake_next=time.time() + WAKE_RETRY_FIRST_S,
                          left_asleep=_as_left(left) if left else None)
        self._set(move_id, "failed", reason=reason)

    async def _retry_wake(self, row: dict) -> None:
        """Wake, through the controller as a caller would, the VM a failed move left asleep
        at home when its source could not wake it; done when it runs or is no longer that
        asleep, unmarked VM as the move left it (woken or deleted by hand, or taken by another
        move; woken and put to sleep again by its owner, or deleted and a new VM of its name
        made: review 35, the retry woke those, undoing the owner's sleep or waking another VM)."""
        rec, name, src = row["record"], row["vm"], row["source"]
        resp = await self._host(src, "GET", f"/v1/host/vms/{name}", ok=(200, 404), timeout=30)
        vm = resp.json() if resp.status_code == 200 else None
        # (a row an older controller wrote holds no ``left_asleep``: the VM is judged as it judged it)
        left = rec.get("left_asleep")
        if vm is None or vm["state"] != "sleeping" or vm.get("move_id") or (left is not None and _as_left(vm) != left):
            self._set(row["id"], source_wake_pending=False)
            return
        try:
            await self.ctl.vms.act(name, "wake", src)
        except FuseError as exc:
            delay = min(WAKE_RETRY_MAX_S, 2 * rec.get("source_wake_delay", WAKE_RETRY_FIRST_S))
            self._set(row["id"], source_wake_error=exc.message, source_wake_delay=delay,
                      source_wake_next=time.time() + delay)
            return
        self._set(row["id"], source_wake_pending=False)
        self.store.add_event("move_source_woken", {"move": row["id"], "vm": name}, host=src)

    async def _abort_target(self, row: dict, timeout: float = IO_TIMEOUT) -> None:
        await self._host(row["target"], "DELETE", f"/v1/host/incoming/{row['id']}", ok=(204, 404), timeout=timeout)

    async def _on_target(self, row: dict) -> dict | None:
        """The VM as the target holds it once the move is through, or None. Called once its
        incoming side is aborted, which removes a copy this move never woke: a VM of its name
        there now, not held by this move, is the one this move woke (running, or asleep and
        unmarked for a sleeping VM's move), in whatever state it reached since — its entry
        ended, its process died, its owner slept or woke it. Any of those is the VM's life on
        the target; waking the source's copy would run it a second time from before the move."""
        resp = await self._host(row["target"], "GET", f"/v1/host/vms/{row['vm']}", ok=(200, 404), timeout=30)
        if resp.status_code == 404:
            return None
        vm = self._answer(resp, row["target"], f"the look at vm {row['vm']}")
        return vm if vm.get("move_id") != row["id"] else None

    async def _wake_source(self, row: dict) -> None:
        """Wake the source copy if this move holds it. The agent takes the VM's
        lock, so a sleep still being written finishes first; an unmarked VM
        (the sleep never happened) is left as it is."""
        src = row["source"]
        clear = not row["record"].get("was_running", True)
        resp = await self._host(src, "POST", f"/v1/host/vms/{row['vm']}/wake", ok=(200, 404),
                                timeout=self._state_wait(row),  # (a big VM's state takes longer to load)
                                json={"move_id": row["id"], "clear_mark": clear, "if_marked": True})
        if resp.status_code == 404:
            raise NotFound(f"vm {row['vm']} not found on {src}")
        self.fleet.upsert_vms(src, [self._answer(resp, src, f"the wake of vm {row['vm']}")])

    async def _recover(self, row: dict) -> None:
        """Settle a move, retrying while a host it needs does not answer
        (bounded here; the janitor takes the move up again after that)."""
        move_id = row["id"]
        driving = DRIVING.set(move_id)  # (a task of its own, or `_run`'s: either drives this move)
        try:
            for _ in range(600):  # ~10 minutes
                try:
                    await self._settle(row)
                    return
                except TakenOver as exc:  # (another replica settles it)
                    log.warning("%s", exc)
                    return
                except FuseError as exc:
                    log.warning("move %s: settling waits for a host: %s", move_id, exc.message)
                except DBAPIError as exc:  # (each step is taken again once it answers)
                    if not db_unreachable(exc):
                        raise
                    waits.failed(f"move {move_id}", exc)
                await asyncio.sleep(1)
                row = await self._read(move_id)
                if row["state"] not in ACTIVE:
                    return
        finally:
            DRIVING.reset(driving)


def _as_left(vm: dict) -> dict:
    """What tells the VM a failed move left asleep at home from what its host holds under
    that name later: the VM's ``created_at`` (a new VM of the name has its own) and the last
    change of state its host recorded, the move's sleep (a wake, a sleep, a move away and
    back each record another; a wake that failed records none)."""
    return {"created_at": vm.get("created_at"), "last": (vm.get("history") or [None])[-1]}
