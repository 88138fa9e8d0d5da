"""`MoveService`: the move service the controller holds (``ctl.moves``), put together.

It composes the parts, each in its own module and each a `MoveRecords`:
`MoveTargets` (where to), `MoveSteps` and `MoveCopy` (the move), `MoveRollback`
(forward or home), `MoveJanitor` (leases, take-over, clean-up) and `MoveDrains`.
What stays here is what ties them together: starting a move (checks, target,
the persisted row, the task that drives it) and the service's lifecycle
(`resume` at the controller's start, `close` at its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy import insert, select

from ...errors import FuseError, HostUnreachable, InvalidArgument, NotFound
from ...models.moves import MoveRequest
from ...tasks import cancel_and_wait
from ..store import moves as moves_t
from ..store import vms as vms_t
from .copying import MoveCopy
from .drain import MoveDrains
from .janitor import MoveJanitor
from .records import ACTIVE, LEASE_S, QUICK_TIMEOUT, STOP_SETTLE_S, log

FORGET_SETTLE_S = 60.0  # a force deregister waits this long for the moves that need the host to settle
from .rollback import MoveRollback
from .steps import MoveSteps
from .targets import MoveTargets, refuse


class MoveService(MoveDrains, MoveJanitor, MoveRollback, MoveSteps, MoveCopy, MoveTargets):
    """Moves and drains for one controller: start them, follow them, and settle
    the ones a crash or a dead replica left."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self._tasks: dict[str, asyncio.Task] = {}
        self._drains: dict[str, asyncio.Task] = {}  # per host: the drain in progress, which a second call joins
        self._held_drains: set[str] = set()  # the hosts whose drain lease this replica holds (drain.py)
        self._lock = asyncio.Lock()
        self._janitor: asyncio.Task | None = None
        self._tidying: asyncio.Task | None = None
        self._stopping = False  # close() began: a move cut short settles now (`_run`)
        self._gone: set[str] = set()  # hosts a force deregister declared gone: they hold nothing (`_host`)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidArgument("body needs vm: the name of the VM to move")
        try:  # (the route has checked it already; other callers, the drain, the MCP tool, have not)
            req = MoveRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            msg = first["msg"].removeprefix("Value error, ")
            raise InvalidArgument(f"{where}: {msg}" if where else msg) from None
        name = req.vm or req.flashvm
        if name is None:
            raise InvalidArgument("body needs vm: the name of the VM to move")
        to, pin = req.to, req.host
        # The source side first, outside the service's lock: a source that does not answer
        # (frozen, up to its 10 s) holds up this request only, not every move and drain's
        # (the lock is for choosing a target and recording the move, checked again there).
        try:
            source = self.ctl.vms.locate(name, pin)
        except NotFound as exc:  # seed 004's replies: nothing to move is not_movable
            err = refuse("not_movable", exc.message)
            err.vm_state = "deleted"  # (a drain's VM deleted since its round listed it: nothing to move)
            raise err from None
        if self.active_for(name, source) is not None:
            raise refuse("move_in_progress", f"vm {name} is already moving")
        self._not_acted_on(name, source)
        await self.fleet.first_polls([source], 6.0)
        src_view = self.fleet.views.get(source)
        if src_view is None or not src_view.connected:
            raise refuse("host_unreachable", f"source host {source} is not connected")
        try:
            vm = (await self.ctl.vms._call(source, "GET", f"/v1/host/vms/{name}")).json()
        except HostUnreachable as exc:
            raise refuse("host_unreachable", f"source host {source} did not answer: {exc.message}") from None
        except FuseError as exc:
            if exc.code == "not_found":  # gone from its host since the last poll
                raise refuse("not_movable", f"vm {name} not found on host {source}") from None
            raise
        if vm.get("move_id"):
            raise refuse("move_in_progress", f"vm {name} is held by move {vm['move_id']}")
        if vm["state"] not in ("running", "sleeping"):
            err = refuse("not_movable", f"vm {name} is {vm['state']}; only a running or sleeping vm moves")
            err.vm_state = vm["state"]  # (fresh from its host: a drain tells a finished VM from a stuck one)
            raise err
        if vm.get("standby"):  # (its host refuses to sleep it: the move was 202, then failed at its sleep)
            raise refuse("not_movable", f"vm {name} is a prewarm's standby VM (no entry yet): it is not moved; "
                                        "a create of its shape claims it, or delete it")
        silent = None  # (a named target's silence, said once its own checks pass: a cordoned one says so first)
        if to is not None and self.store.get_host(to) is not None:
            # A named target is asked outside the lock too (a frozen one held every move up)
            await self.fleet.first_polls([to], 6.0)
            if not getattr(self.fleet.views.get(to), "connected", False):
                # a named target its poller saw fail may be back already (an agent restarted: the
                # poller backs off up to 30 s): asked once now rather than refused on a stale view
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.fleet.refresh(to), 5.0)
            try:
                await self._answers(to)
            except FuseError as exc:
                silent = exc
        async with self._lock:
            if self.active_for(name, source) is not None:  # (one begun while this one looked)
                raise refuse("move_in_progress", f"vm {name} is already moving")
            self._still_there(name, pin, source)  # (and not moved away by one that began and ended meanwhile)
            if to is not None and self.store.get_host(to) is None:  # (no poller to wait on: 6 s under the lock)
                raise refuse("unknown_host", f"host {to} is not registered")
            if to is None:
                # just after a start the pollers have not answered yet: every host's first
                # poll decides whether it is connected (a named target's was waited above)
                await self.fleet.first_polls([r["id"] for r in self.store.list_hosts()], 6.0)
            # Before anything touches the VM: a copy of it an earlier failed move left on a
            # host (cleanup pending) would fail this move's arrival there after the sleep.
            leftovers = await self._clear_leftovers(name, source, to)
            target = self._target(name, source, vm, to, leftovers)
            if silent is not None:
                raise silent
            if to is None:  # (a named one was asked above)
                target = await self._answering(name, source, vm, target, leftovers)
                # (a slow target's answer took seconds: a delete that ended meanwhile was answered
                # 204, and a move recorded now would be 202 for no VM, then `failed`)
                self._still_there(name, pin, source)
            move_id = f"mv-{secrets.token_hex(6)}"
            now = time.time()
            # (no await from here to the record: a create of the name on the target either holds
            # it already, and is seen here, or sees this move: ``VmService.create``)
            if creating := self.ctl.vms._creating(name, target):
                raise refuse("no_target", f"a vm named {name} is being created on host {creating[0]}")
            with self.store.tx() as c:
                # (again, in the write transaction: a replica sharing the store may have
                # started a move of it since the look above, and one VM has one move)
                if (other := self.active_for(name, source, c)) is not None:
                    raise refuse("move_in_progress", f"vm {name} is already moving ({other.id})")
                self._not_acted_on(name, source)  # (again: a delete may have begun since the look above)
                c.execute(insert(moves_t).values(
                    id=move_id, vm=name, source=source, target=target, state="starting", created_at=now, updated_at=now,
                    record={"was_running": vm["state"] == "running", "copied_bytes": 0, "total_bytes": 0,
                            "history": [{"state": "starting", "time": now}], "vm": vm,
                            # chosen by best fit: a target refusing the VM at its arrival gives way
                            # to the next candidate (`_begin`); a named one is the caller's choice
                            "best_fit": to is None,
                            "owner": self.ctl.instance, "lease_until": now + LEASE_S}))
                self.store.add_event("move_state", {"move": move_id, "vm": name, "to": "starting", "target": target},
                                     host=source, conn=c)
            self.fleet.changed.set()
        self._spawn(move_id)
        return self.get(move_id)

    def _still_there(self, name: str, pin: str | None, source: str) -> None:
        """409 unless the VM is still the controller's on ``source``: ``not_movable`` when it
        was deleted while the move was asked (seed 004: nothing to move), ``move_in_progress``
        when another move took it elsewhere meanwhile."""
        try:
            moved = self.ctl.vms.locate(name, pin) != source
        except NotFound:
            err = refuse("not_movable", f"vm {name} is no longer on host {source}: it was deleted while "
                                        "this move was asked")
            err.vm_state = "deleted"  # (a drain leaves it out: nothing there to move)
            raise err from None
        except FuseError:
            moved = True
        if moved:
            raise refuse("move_in_progress", f"vm {name} left host {source} while this move was asked: ask again")

    def _not_acted_on(self, name: str, host: str) -> None:
        """409 ``not_movable`` while a delete, sleep or wake of the VM through this controller
        waits on its host: a move begun under a delete read ``failed`` with the VM gone."""
        if (doing := self.ctl.vms.acting_on(name, host)) is not None:
            word = {"delete": "deleted", "sleep": "put to sleep", "wake": "woken"}.get(doing, doing)
            err = refuse("not_movable", f"vm {name} is being {word} on {host}: ask again once that has answered")
            err.acting = doing  # (a drain waits for it and asks again)
            raise err

    def active_for(self, name: str, host: str, conn=None):
        """The active move (its ``id`` and ``target``) of VM ``name`` from ``host``, or None."""
        q = select(moves_t.c.id, moves_t.c.target).where(
            moves_t.c.vm == name, moves_t.c.source == host, moves_t.c.state.in_(ACTIVE))
        if conn is not None:
            return conn.execute(q).first()
        with self.store.read() as c:
            return c.execute(q).first()

    def moving_to(self, name: str, conn=None) -> dict[str, str]:
        """The hosts an active move is taking VM ``name`` to, each to its move's id: the name is
        theirs from the move's 202 on (a create of it there would fail the move at its copy).
        Not a move going back home (``rolling_back``): its target keeps no copy for it."""
        q = select(moves_t.c.target, moves_t.c.id).where(
            moves_t.c.vm == name, moves_t.c.state.in_([s for s in ACTIVE if s != "rolling_back"]))
        if conn is not None:
            return {r.target: r.id for r in conn.execute(q)}
        with self.store.read() as c:
            return {r.target: r.id for r in c.execute(q)}

    def _spawn(self, move_id: str) -> None:
        if move_id in self._tasks and not self._tasks[move_id].done():
            return
        self._tasks[move_id] = asyncio.create_task(self._run(move_id))

    async def resume(self) -> None:
        """Start renewing leases and recovering moves whose driver is gone
        (a previous run of this controller, or a replica that died), and resume
        the drain of every host left draining (`drain`)."""
        self._janitor = asyncio.create_task(self._janitor_loop())
        self.resume_drains()

    @contextlib.asynccontextmanager
    async def forgetting(self, host_id: str, timeout: float = FORGET_SETTLE_S):
        """For a force deregister of ``host_id``, whose agent is gone for good: the moves
        that need it are settled as if it held nothing (each of its calls answers 404 from
        here on): a move whose target is gone goes home (its source wakes the VM), one whose
        source is gone ends `failed` unless its target already runs the VM (then `done`); a
        failed move's clean-up there and a done move's source removal there are dropped.
        The body (the deregister) runs once they are; a move another replica drives, or one
        not settled within ``timeout`` (its other host does not answer), is left for the
        deregister's own check to refuse (409 move_in_progress)."""
        self._gone.add(host_id)
        try:
            with self.store.read() as c:
                rows = [dict(r) for r in c.execute(select(moves_t).where(
                    (moves_t.c.source == host_id) | (moves_t.c.target == host_id))).mappings()]
            settling = []
            for row in rows:
                rec = row["record"] or {}
                if row["state"] == "failed" and rec.get("cleanup_pending") and row["target"] == host_id:
                    self._set(row["id"], cleanup_pending=False, target_clear=True,
                              cleanup_reason=f"host {host_id} was removed with force: its copy went with it")
                elif row["state"] == "done" and not rec.get("source_removed") and row["source"] == host_id:
                    self._set(row["id"], source_removed=True)
                elif row["state"] in ACTIVE:
                    task = self._tasks.get(row["id"])
                    if task is not None and not task.done():
                        task.cancel()  # (its call to the gone host may wait for minutes)
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                    elif self._claim(row["id"]) is None:
                        continue  # another replica drives it
                    moved = self._row(row["id"])
                    if moved["state"] in ACTIVE:
                        self._set(row["id"], reason=(moved["record"] or {}).get("reason") or
                                  f"host {host_id} was removed with force during {moved['state']}")
                        task = asyncio.create_task(self._recover(self._row(row["id"])))
                        self._tasks[row["id"]] = task
                        settling.append(task)
            if settling:
                await asyncio.wait(settling, timeout=timeout)
            yield
        finally:
            self._gone.discard(host_id)

    async def settle_strays(self, host_id: str) -> list[str]:
        """What moves settled while ``host_id``'s agent was away for good (removed with force:
        each of its calls answered "it holds nothing") left on it, now that it is registered
        again: a copy a move was bringing there (received or installed) is aborted; a VM a
        failed move held asleep there goes home as any failed move's does (woken, unless it was
        asleep before the move or another host has a VM of its name now: then only its mark is
        dropped); the source copy of a done move is removed. Each was refused to every caller
        (409 ``move_in_progress``, naming a move long over) and held its room for good. Moves
        still active, and moves this controller does not know, are left alone. The moves
        settled, as ``"<move id>: what was done"``."""
        try:
            vms = (await self._host(host_id, "GET", "/v1/host/vms", timeout=30)).json()["vms"]
            incoming = (await self._host(host_id, "GET", "/v1/host/incoming", timeout=30)).json()["incoming"]
        except (FuseError, KeyError, ValueError, TypeError):
            return []  # (not answering now: nothing is touched; the next registration asks again)
        marked = {v["move_id"]: v for v in vms if v.get("move_id")}
        out = await self._remove_doubles(host_id, vms)
        for move_id in sorted(set(marked) | {e["move_id"] for e in incoming}):
            with self.store.read() as c:
                found = c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().first()
            if found is None or found["state"] in ACTIVE:
                continue
            row = dict(found)
            vm = marked.get(move_id)
            try:
                if vm is None or vm.get("move_role") == "target" or vm["state"] == "incoming":
                    await self._abort_target(row | {"target": host_id})
                    out.append(f"{move_id}: its copy of vm {row['vm']} aborted")
                elif row["state"] == "done":
                    await self._remove_source(row | {"source": host_id})
                    out.append(f"{move_id}: its source copy of vm {row['vm']} removed")
                else:
                    elsewhere = any(r["host"] != host_id and not self._same_machine(r["host"], host_id)
                                    for r in self.store.vms_named(row["vm"]))
                    home = row | {"source": host_id}
                    if elsewhere:
                        home["record"] = dict(row["record"] or {}, was_running=False)  # (the mark only)
                    await self._wake_source(home)
                    out.append(f"{move_id}: vm {row['vm']} " + ("unmarked, asleep (its name is on another "
                               "host now)" if elsewhere or not (row["record"] or {}).get("was_running", True)
                               else "woken at home"))
            except FuseError as exc:
                log.warning("move %s: what it left on %s stays for now: %s", move_id, host_id, exc.message)
        for line in out:
            log.info("host %s registered again: move %s", host_id, line)
        if out:
            self.fleet.changed.set()
        return out

    async def _remove_doubles(self, host_id: str, vms: list[dict]) -> list[str]:
        """Copies a move woke on ``host_id`` after the move was settled ``failed`` without it
        (its target removed with force while it woke there, the VM woken at its source: "failed"
        means the VM is home): each such copy, the one the VM's record no longer names, is stopped
        and removed, with a ``vm_lost`` event for it on this host, or the VM would run twice. A
        copy's first history entry names the move that brought it in."""
        out = []
        for v in vms:
            first = (v.get("history") or [{}])[0]
            move_id = first.get("move_id") if first.get("state") == "incoming" else None
            if not move_id or v.get("move_id") or v.get("state") in ("deleted", "incoming"):
                continue  # (a copy still marked is an arrival the loop below settles)
            with self.store.read() as c:
                found = c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().first()
            if found is None or found["state"] != "failed" or found["target"] != host_id or found["vm"] != v["name"]:
                continue
            try:
                await self._host(host_id, "DELETE", f"/v1/host/vms/{v['name']}", ok=(204, 404), timeout=QUICK_TIMEOUT)
            except FuseError as exc:
                log.warning("move %s: the copy of vm %s it woke on %s stays for now: %s", move_id, v["name"],
                            host_id, exc.message)
                continue
            with self.store.tx() as c:
                c.execute(vms_t.delete().where(vms_t.c.host == host_id, vms_t.c.name == v["name"]))
                self.store.add_event("vm_lost", {
                    "vm": v["name"], "id": host_id, "was": v.get("state"), "move": move_id,
                    "reason": f"move {move_id} woke it here after it failed (its target was removed with force) "
                              f"and the VM was woken at {found['source']}: this copy was stopped and removed, "
                              "so the VM runs in one place"}, host=host_id, conn=c)
            out.append(f"{move_id}: the copy of vm {v['name']} it woke here after it failed, stopped and removed")
        return out

    async def close(self) -> None:
        """Stop: the drains and the janitor at once; each move this controller drives is
        cut short and settled as the next run would settle it (forward when the target may
        run the VM, else home), within STOP_SETTLE_S: a stop does not leave a VM asleep
        mid-copy until some controller starts again. What is not settled by then is."""
        self._stopping = True
        others = [*self._drains.values(), *(t for t in (self._janitor, self._tidying) if t is not None)]
        moves = [t for t in self._tasks.values() if not t.done()]
        for t in [*others, *moves]:
            t.cancel()
        if moves:
            _, late = await asyncio.wait(moves, timeout=STOP_SETTLE_S)
            for t in late:
                t.cancel()  # (a host that does not answer: the next run settles it, as before)
        await cancel_and_wait([*others, *moves])
