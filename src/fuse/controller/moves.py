"""Moving a running (or sleeping) VM between hosts (seed 004), crash-safe.

A move is a persisted state machine; every transition is written to the
store before the step it names runs, and emits a `move_state` event:

    starting ─► sleeping ─► copying ─► waking ─► done
       │           │           │         │
       └───────────┴───────────┴─────────┴──► (rolling back) ─► failed

    starting      → sleeping      the move starts
    sleeping      → copying       the source slept, marked with the move id
    copying       → waking        every file copied (4 MiB chunks) and verified
    waking        → done          the target installed and woke the VM, and the
                                  source copy went (or the janitor removes it
                                  once an unanswering source is back)
    any but done  → rolling back  a step failed (or the controller restarted
                                  before the target woke the VM)
    rolling back  → failed        target side aborted, VM woken on the source

The wire shows the seed's six states only: while a failed move brings the VM
home its state stays at the step that failed, with `rolling_back: true` and
the `reason` (a `move_rolling_back` event marks the start); `failed` is
reported once the VM is back, so `failed` always means "home again".

The one-place rule: the source copy is asleep and marked from `sleeping` on,
and the target only wakes after every file verified, so at no instant do two
copies run. Once the target may have been asked to wake (`waking`), only the
target's own answer decides: its incoming side is aborted (which waits for a
wake under way and never touches a woken VM) and, if the VM runs there, the
move finishes forward; the source wakes only when the target holds no copy.
A target or source that cannot be reached is retried, never guessed. After a
controller crash the same settling runs for every move the crash left
behind. A target that cannot be reached for the abort of an unwoken copy is
remembered (`cleanup`) and retried until it answers, so no reservation or
half-copied file outlives the move.

Several controller replicas may share one store: each move carries its
driver (`owner`) and a lease the driver renews every second. Recovery takes
over only moves whose lease ran out, under a row lock, so a live replica's
move is never rolled back by another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy import insert, select, update

from ..errors import Conflict, FuseError, HostUnreachable, InvalidArgument, NotFound
from ..models.moves import MoveRequest
from .hosts import FINISHED  # the registry's: VMs whose run is over, which deregister lets go with the host
from .store import ACTIVE_MOVES, moves as moves_t, vms as vms_t
from .vms import agent_not_found

log = logging.getLogger("fuse.controller.moves")
CHUNK = 4 * 1024 * 1024
# Per-request limit while copying: a target whose network vanished must fail
# the move (and bring the VM home) in bounded time, not hang it.
IO_TIMEOUT = float(os.environ.get("FUSE_MOVE_IO_TIMEOUT", "30"))
# The limit for the calls on a moving VM's path that do little on the host: the
# target beginning its incoming side (an admission check and a reservation) and
# aborting one that was never woken (removing files). They answer in milliseconds;
# one not answered in this long means a hung or cut-off host, and the VM, asleep
# meanwhile, is better brought home than kept down for IO_TIMEOUT (or the 60 s a
# begin used to have). A chunk, a verify (hashing every file) or a wake may take
# long on a healthy host and keep their own limits.
QUICK_TIMEOUT = float(os.environ.get("FUSE_MOVE_QUICK_TIMEOUT", "10"))
# How a target says no to an arriving VM before taking anything (the agent's
# ``POST /v1/host/incoming``): its admission (memory, its --max-vms VM-count policy,
# pressure), a VM of that name already there, another bundle or platform. Nothing was
# copied then, so a target chosen by best fit gives way to the next candidate.
TARGET_REFUSALS = frozenset({"host_full", "vm_exists", "bundle_mismatch", "platform_mismatch"})
# A drain that finds a VM in a move (the one a controller crash left, another
# drain's, an operator's) waits this long at most for it to end before it reports
# the VM stuck.
DRAIN_MOVE_WAIT_S = 900.0
# A chunk read changes nothing, so one that met a dropped connection (an agent
# closes a kept-alive one after ~5 s idle, as slow chunks leave them) is sent
# again this many times before it fails the move. Nothing else is retried.
CHUNK_READ_RETRIES = 3
# A new move removes what a failed move of the same VM left on a host (its
# abort did not get through) before it starts; it waits this long for the host,
# holding up other moves' starts meanwhile.
LEFTOVER_TIMEOUT = 10.0
# every state but done and failed ("pending": an earlier version's "starting")
ACTIVE = ACTIVE_MOVES
STATES = ("starting", "sleeping", "copying", "waking", "done", "failed")  # the wire's (seed 004)
# A move belongs to the controller that drives it for as long as it renews
# its lease; with several replicas on one PostgreSQL store, a replica takes
# over (finishes or rolls back) only moves whose driver stopped renewing.
LEASE_S = float(os.environ.get("FUSE_MOVE_LEASE_S", "5"))

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


class MoveRefused(Conflict):
    pass


def refuse(code: str, message: str) -> MoveRefused:
    return MoveRefused(message, code=code)


def _timed_out(exc: BaseException) -> bool:
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


def _crash_point(point: str) -> None:
    """Test hook: FUSE_TEST_CRASH_AT=<point> kills the controller right there
    (no clean-up), so tests can restart it at every step of a move."""
    if os.environ.get("FUSE_TEST_CRASH_AT") == point:
        os._exit(137)


def _fail_point(point: str) -> None:
    """Test hook: FUSE_TEST_FAIL_AT=<point> makes the step right there fail as
    if a host's reply were lost (the host did the work; the controller does
    not know it)."""
    if os.environ.get("FUSE_TEST_FAIL_AT") == point:
        raise HostUnreachable(f"test hook: the reply at {point} was lost")


async def _pause_point(point: str) -> None:
    """Test hook: FUSE_TEST_PAUSE_AT=<point>:<seconds> holds the move there
    while the rest of the controller (pollers, API) carries on."""
    where, _, secs = os.environ.get("FUSE_TEST_PAUSE_AT", "").partition(":")
    if where == point:
        await asyncio.sleep(float(secs or 1))




class MoveService:
    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self._tasks: dict[str, asyncio.Task] = {}
        self._drains: dict[str, asyncio.Task] = {}  # per host: the drain in progress, which a second call joins
        self._lock = asyncio.Lock()
        self._janitor: asyncio.Task | None = None
        self._tidying: asyncio.Task | None = None

    @property
    def fleet(self):
        return self.ctl.fleet

    # ---- records -------------------------------------------------------------
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
                "reason": rec.get("reason", ""), "created_at": row["created_at"], "updated_at": row["updated_at"],
                "history": rec.get("history", [])}

    def _row(self, move_id: str) -> dict:
        with self.store.read() as c:
            return dict(c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().one())

    def _set(self, move_id: str, state: str | None = None, **rec: Any) -> dict:
        """Persist a transition (checked against the table) and/or record fields."""
        with self.store.tx() as c:
            row = dict(c.execute(select(moves_t).where(moves_t.c.id == move_id)).mappings().one())
            record = dict(row["record"] or {}, **rec)
            if record.get("owner") == self.ctl.instance:
                record["lease_until"] = time.time() + LEASE_S
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

    # ---- start ---------------------------------------------------------------
    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidArgument("body needs vm: the name of the VM to move")
        try:  # (the route has checked it already; other callers, the drain, the MCP tool, have not)
            req = MoveRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            raise InvalidArgument(f"{where}: {first['msg'].removeprefix('Value error, ')}" if where
                                  else first["msg"]) from None
        name = req.vm or req.flashvm
        if name is None:
            raise InvalidArgument("body needs vm: the name of the VM to move")
        to, pin = req.to, req.host
        async with self._lock:
            try:
                source = self.ctl.vms.locate(name, pin)
            except NotFound as exc:  # seed 004's replies: nothing to move is not_movable
                raise refuse("not_movable", exc.message) from None
            if self._active_for(name, source):
                raise refuse("move_in_progress", f"vm {name} is already moving")
            await self.fleet.first_poll(source)
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
            # just after a start the pollers have not answered yet: the target's (or, for
            # best fit, every host's) first poll decides whether it is connected
            await asyncio.gather(*(self.fleet.first_poll(h) for h in ([to] if to is not None
                                                                         else [r["id"] for r in self.store.list_hosts()])))
            # Before anything touches the VM: a copy of it an earlier failed move left on a
            # host (cleanup pending) would fail this move's arrival there after the sleep.
            leftovers = await self._clear_leftovers(name, source, to)
            target = self._target(name, source, vm, to, leftovers)
            move_id = f"mv-{secrets.token_hex(6)}"
            now = time.time()
            with self.store.tx() as c:
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

    def _active_for(self, name: str, host: str) -> bool:
        with self.store.read() as c:
            return c.execute(select(moves_t.c.id).where(moves_t.c.vm == name, moves_t.c.source == host,
                                                        moves_t.c.state.in_(ACTIVE))).first() is not None

    def compatible(self, vm: dict, source: str, target: str) -> str | None:
        """Why `target` cannot take `vm` from `source` (platform, bundle,
        Firecracker release), or None."""
        s, t = self.fleet.views[source].summary, self.fleet.views[target].summary
        if s.get("platform") != t.get("platform"):
            return f"platform differs: {s.get('platform')} on {source}, {t.get('platform')} on {target}"
        fps = {b.get("fingerprint") for b in t.get("bundles", [])}
        if vm.get("bundle_fingerprint") not in fps:
            return f"host {target} lacks bundle {vm.get('bundle')} with fingerprint {vm.get('bundle_fingerprint', '')[:12]}"
        # (only a Firecracker VM's state depends on the release: seed 000 has it "" on qemu hosts,
        # and a qemu agent that merely finds a firecracker binary on PATH must not block a move)
        if ("firecracker" in (s.get("backend"), t.get("backend"))
                and s.get("firecracker", "") != t.get("firecracker", "")):
            return f"firecracker release differs: {s.get('firecracker') or 'none'} vs {t.get('firecracker') or 'none'}"
        mine = vm.get("platform") or {}
        if t.get("accel") and mine.get("accel") and mine["accel"] != t["accel"]:
            return f"accelerator differs: {mine['accel']} vs {t['accel']}"
        return None

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

    def _target(self, name: str, source: str, vm: dict, to: str | None,
                leftovers: dict[str, str] | None = None) -> str:
        """The host the VM goes to: ``to``, checked, or the best fit. ``leftovers``:
        hosts that still hold a copy of the VM a failed move left (``_clear_leftovers``)."""
        from .placement import rank
        from .resources import Resources
        ask = Resources.vm(vm["shape"]["vcpus"], vm["shape"]["mem_mib"])
        named = {r["host"] for r in self.store.vms_named(name) if r["host"] != source}

        def name_taken(h: str) -> bool:  # (a host's own VMs, or the same machine's under another id)
            return any(t == h or self._same_machine(t, h) for t in named)

        if to is not None:
            host = self.store.get_host(to)
            if host is None:
                raise refuse("unknown_host", f"host {to} is not registered")
            if to == source:
                raise refuse("same_host", f"vm {name} is already on {to}")
            if self._same_machine(source, to):
                raise refuse("same_host", f"host {to} is the same machine as {source} (the same agent, "
                                          f"registered under another id): vm {name} is already there")
            if host["state"] != "active":
                raise refuse("no_target", f"host {to} is {host['state']}: it takes no new VMs")
            if name_taken(to):
                raise refuse("no_target", f"host {to} already has a vm named {name}")
            view = self.fleet.views.get(to)
            if view is None or not view.connected:
                raise refuse("host_unreachable", f"target host {to} is not connected")
            if to in (leftovers or {}):
                raise refuse("no_target", f"host {to} {leftovers[to]}")
            if why := self.compatible(vm, source, to):
                raise refuse("arch_mismatch", why)
            # The same filter an automatic target passes (memory, vm_count
            # policy and its agent's own max_vms, memory pressure), so a target
            # without room is refused now, with its reason, not by its admission
            # halfway through.
            fleet, reasons = self._arrays(only=to)
            decision = rank(fleet, ask, reasons)
            if to not in decision.order:
                raise refuse("no_target", f"host {to} has no room for vm {name}: "
                                          f"{decision.reasons.get(to, 'not accepting placements')}")
            return to
        host, passed = self._best_fit(name, source, vm, leftovers or {})
        if host is not None:
            return host
        if not passed:
            raise refuse("no_target", f"no other host can take vm {name}: {source} is the only host registered")
        raise MoveRefused(f"no other host can take vm {name}: "
                          + "; ".join(f"{h}: {why}" for h, why in sorted(passed.items())),
                          code="no_target", details={"hosts": dict(sorted(passed.items()))})

    def _arrays(self, only: str | None = None):
        """The fleet as placement sees it, each host's VM-count limit lowered to its
        agent's own ``max_vms`` where its summary reports a lower one."""
        from .placement import with_agent_limits
        fleet, reasons = self.ctl.vms.arrays(only=only)
        limits = {h: v.summary.get("max_vms") for h, v in self.fleet.views.items()}
        return with_agent_limits(fleet, limits), reasons

    def _best_fit(self, name: str, source: str, vm: dict, leftovers: dict[str, str],
                  exclude: dict[str, str] | None = None) -> tuple[str | None, dict[str, str]]:
        """The best-fit target for ``vm`` (None when no host can take it), and every
        other host -> why it is not the target (as fleet_full says). ``exclude``:
        hosts already out, with their reasons (targets that refused the VM)."""
        from .placement import rank
        from .resources import Resources
        ask = Resources.vm(vm["shape"]["vcpus"], vm["shape"]["mem_mib"])
        named = {r["host"] for r in self.store.vms_named(name) if r["host"] != source}
        exclude = exclude or {}
        fleet, reasons = self._arrays()
        decision = rank(fleet, ask, reasons)
        passed: dict[str, str] = {}
        for h in decision.order:
            if h == source:
                continue
            if h in exclude:
                passed[h] = exclude[h]
            elif self._same_machine(source, h):
                passed[h] = f"the same machine as {source} (the same agent under another id)"
            elif self.fleet.views.get(h) is None:
                passed[h] = "host is disconnected"
            elif why := self.compatible(vm, source, h):
                passed[h] = why
            elif any(t == h or self._same_machine(t, h) for t in named):
                passed[h] = f"has room, but a vm named {name} already there"
            elif h in leftovers:
                passed[h] = leftovers[h]
            else:
                return h, passed
        passed |= {h: why for h, why in decision.reasons.items() if h != source}
        return None, passed | {h: why for h, why in exclude.items() if h != source}

    def _same_machine(self, a: str, b: str) -> bool:
        """Whether two host ids reach one agent (its identity, as usage counts
        machines): a move between them would only put the VM to sleep."""
        def ident(host_id: str) -> str:
            view = self.fleet.views.get(host_id)
            row = self.store.get_host(host_id) or {}
            return (view.summary.get("agent_id", "") if view else "") or row.get("agent_id", "")
        return bool(ident(a)) and ident(a) == ident(b)

    def _spawn(self, move_id: str) -> None:
        if move_id in self._tasks and not self._tasks[move_id].done():
            return
        self._tasks[move_id] = asyncio.create_task(self._run(move_id))

    # ---- the move ------------------------------------------------------------
    async def _host(self, host: str, method: str, path: str, ok=(200, 201, 204), **kw):
        try:
            resp = await self.fleet.conn(host).request(method, path, **kw)
        except HostUnreachable as exc:
            if _timed_out(exc) and kw.get("timeout"):
                exc.hung = (host, kw["timeout"])  # (for the move's reason: `_failure`)
            raise
        if resp.status_code == 404 and 404 in ok and not agent_not_found(resp):
            # a 404 read as "the host holds nothing" must be the agent's own word: a proxy or
            # gateway in the way (a cut link's traffic can end at one) answering 404 would have
            # a move roll back while the target's copy runs, or leave its files for good
            raise HostUnreachable(f"host {host} did not answer {method} {path}: a 404 came back that is "
                                  "not the host agent's (no fuse error body), so whether it holds the "
                                  "vm is not known")
        if resp.status_code not in ok:
            from .vms import host_error
            raise host_error(resp, host)
        return resp

    async def _run(self, move_id: str) -> None:
        row = self._row(move_id)
        if row["state"] not in ("starting", "pending"):
            return
        step = "sleeping"
        try:
            row = self._set(move_id, "sleeping")
            _crash_point("sleeping")
            await self._sleep(row)
            _crash_point("slept")
            await _pause_point("slept")
            step = "copying"
            row = self._set(move_id, "copying")
            await self._copy(row)
            _crash_point("copied")
            await _pause_point("copied")
            _fail_point("copied")
            step = "waking"
            row = self._set(move_id, "waking")
            await self._host(row["target"], "POST", f"/v1/host/incoming/{row['id']}/install", timeout=120)
            _crash_point("installed")
            _fail_point("installed")
            await self._wake_target(row)
            _crash_point("woke")
            _fail_point("woke")
            await _pause_point("woke")
            await self._finish(row)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason, target_hung = await self._failure(self._row(move_id), step, exc)
            log.warning("move %s failed: %s", move_id, reason)
            # (a target that hung before it was asked to wake holds no copy that could run:
            # the VM goes home without waiting on it again, and the janitor aborts its side)
            self._set(move_id, reason=reason, **({"target_hung": True} if target_hung else {}))
        await self._recover(self._row(move_id))

    async def _failure(self, row: dict, step: str, exc: Exception) -> tuple[str, bool]:
        """The reason a move failed at ``step``, and whether it was the target that
        stopped answering before it was asked to wake. A host that did not answer in
        time is named with its role and the limit it had ("target host h2 did not
        answer within 30 s during copying"), not with the OS error that ended the
        wait: an operator reads which host to look at."""
        if not isinstance(exc, FuseError):
            return f"{type(exc).__name__}: {exc}", False
        hung = getattr(exc, "hung", None)
        if hung is None and step == "copying" and _timed_out(exc):
            # The bulk copy's sockets ran out of time, which does not say which end stopped: a host
            # whose poller is failing while the other's is not is the one; else both are asked.
            ends = [row["target"], row["source"]]
            quiet = [h for h in ends if (v := self.fleet.views.get(h)) is None or v.failures or not v.connected]
            if len(quiet) != 1:
                quiet = await self._not_answering(ends)
            if not quiet:
                return (f"the copy from {row['source']} to {row['target']} stalled: nothing moved for "
                        f"{IO_TIMEOUT:g} s, though both hosts answer", False)
            hung = (quiet[0], IO_TIMEOUT)
        if hung is None:
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
                return (await self.fleet.conn(h).request("GET", "/v1/host", timeout=timeout)).status_code == 200
            except FuseError:
                return False
        ok = await asyncio.gather(*(answers(h) for h in hosts))
        return [h for h, good in zip(hosts, ok) if not good]

    async def _sleep(self, row: dict) -> None:
        vm = await self._host(row["source"], "POST", f"/v1/host/vms/{row['vm']}/sleep", json={"move_id": row["id"]},
                              timeout=120)
        files = vm.json().get("files", [])
        if not files:
            raise FuseError(f"vm {row['vm']} slept without state files")
        self._set(row["id"], files=files, total_bytes=sum(f["size"] for f in files), vm=vm.json())

    async def _copy(self, row: dict) -> None:
        """Begin the target's incoming side, copy every file in 4 MiB chunks
        (the bulk protocol where both hosts speak it, else HTTP), then have
        the target hash what it holds and check each SHA-256 against the
        source's."""
        row = await self._begin(row)
        rec = row["record"]
        src, dst = self._bulk_endpoint(row["source"]), self._bulk_endpoint(row["target"])
        self._set(row["id"], copy_path="bulk" if src and dst else "http")
        t0 = time.monotonic()
        if src and dst:
            await self._copy_bulk(row, src, dst)
        else:
            await self._copy_http(row)
        t1 = time.monotonic()
        got = (await self._host(row["target"], "POST", f"/v1/host/incoming/{row['id']}/verify",
                                timeout=120)).json()
        theirs = {f["name"]: f for f in got["files"]}
        for f in rec["files"]:
            have = theirs.get(f["name"], {})
            if have.get("size") != f["size"] or have.get("sha256") != f["sha256"]:
                raise FuseError(f"file {f['name']} does not match on {row['target']}: {have.get('size')} bytes "
                                f"sha256 {str(have.get('sha256'))[:12]}, the source's {f['size']} bytes "
                                f"sha256 {f['sha256'][:12]}")
        self._set(row["id"], copy_secs=round(t1 - t0, 4), verify_secs=round(time.monotonic() - t1, 4))

    async def _begin(self, row: dict) -> dict:
        """Have the target begin its incoming side: its admission takes the VM and
        reserves its room, or refuses before a byte is copied. A target chosen by
        best fit that refuses (`TARGET_REFUSALS`: its --max-vms policy, memory, a VM
        of the name) gives way to the next candidate, as a create does (seed 004: "a
        refusal moves on to the next host"); the move's ``to`` becomes that host.
        Only when no host accepts does the move fail, its reason naming each host's
        answer, and the VM go home. A named target's refusal fails the move: the
        caller chose that host. Returns the row (its target as it now is)."""
        rec = row["record"]
        vm = rec["vm"]
        refused: dict[str, str] = {}
        while True:
            try:
                await self._host(row["target"], "POST", "/v1/host/incoming", timeout=QUICK_TIMEOUT, json={
                    "move_id": row["id"], "platform": vm.get("platform") or {}, "files": rec["files"],
                    "vm": {"name": row["vm"], "shape": vm["shape"], "entry": vm["entry"], "bundle": vm["bundle"],
                           "bundle_fingerprint": vm["bundle_fingerprint"], "created_at": vm.get("created_at")}})
                return row
            except FuseError as exc:
                if not rec.get("best_fit") or exc.code not in TARGET_REFUSALS:
                    raise
                refused[row["target"]] = exc.message.removeprefix(f"host {row['target']}: ")
            log.info("move %s: target %s refused vm %s (%s); trying the next host", row["id"], row["target"],
                     row["vm"], refused[row["target"]])
            async with self._lock:  # (as at the move's start: each choice sees the room the others hold)
                host, passed = self._best_fit(row["vm"], row["source"], vm, {}, exclude=refused)
                if host is None:
                    others = {h: why for h, why in passed.items() if h not in refused}
                    raise FuseError(f"no host accepted vm {row['vm']}: "
                                    + "; ".join(f"{h}: {why}" for h, why in refused.items())
                                    + (("; no other host can take it: " + "; ".join(
                                        f"{h}: {why}" for h, why in sorted(others.items()))) if others else ""),
                                    code="no_target")
                row = self._retarget(row, host, refused)

    def _retarget(self, row: dict, host: str, refused: dict[str, str]) -> dict:
        """Point a move whose target refused the VM at ``host``, persisted (with the
        refusals) before anything is asked of it: recovery after a crash settles the
        move with the target it reads, and the room the move holds moves along."""
        with self.store.tx() as c:
            cur = dict(c.execute(select(moves_t).where(moves_t.c.id == row["id"])).mappings().one())
            record = dict(cur["record"] or {}, refused=dict(refused))
            c.execute(update(moves_t).where(moves_t.c.id == row["id"]).values(
                target=host, record=record, updated_at=time.time()))
            self.store.add_event("move_retargeted", {"move": row["id"], "vm": row["vm"], "from": cur["target"],
                                                    "to": host, "refused": dict(refused)},
                                 host=row["source"], conn=c)
        if self.fleet:
            self.fleet.changed.set()
        return self._row(row["id"])

    def _bulk_endpoint(self, host: str):
        """Operators behind something that passes only HTTP can set
        FUSE_MOVE_COPY_PATH=http; the default takes the bulk protocol wherever
        both hosts speak it."""
        from .bulk import endpoint
        if os.environ.get("FUSE_MOVE_COPY_PATH", "auto") == "http":
            return None
        view = self.fleet.views.get(host)
        return endpoint(host, self.fleet.conn(host), view.summary if view else {})

    def _chunks(self) -> tuple[int, float]:
        """Test hooks: the chunk to damage in flight, and a pause after each
        chunk (so a test can act while a copy is under way)."""
        return (int(os.environ.get("FUSE_TEST_CORRUPT_CHUNK", "-1")),
                float(os.environ.get("FUSE_TEST_CHUNK_DELAY", "0")))

    async def _copy_bulk(self, row: dict, src, dst) -> None:
        from .bulk import copy_file
        corrupt_at, delay = self._chunks()
        count = {"chunks": 0, "bytes": 0}

        sockets: list[socket.socket] = []
        stop = threading.Event()

        def opened(sock: socket.socket) -> None:
            sockets.append(sock)
            if stop.is_set():
                sock.close()
                raise FuseError("the copy was stopped")

        def on_chunk(n: int) -> None:
            if stop.is_set():
                raise FuseError("the copy was stopped")
            count["chunks"] += 1
            count["bytes"] += n
            if os.environ.get("FUSE_TEST_CRASH_AT"):
                self._set(row["id"], copied_bytes=count["bytes"])
            _crash_point(f"chunk:{count['chunks']}")
            if delay:
                time.sleep(delay)

        def run() -> None:
            for f in row["record"]["files"]:
                copy_file(src, dst, vm=row["vm"], move=row["id"], file=f["name"], size=f["size"],
                          timeout=IO_TIMEOUT, on_chunk=on_chunk, opened=opened,
                          corrupt=lambda n: count["chunks"] + 1 == corrupt_at)

        job = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=0.25)
                self._set(row["id"], copied_bytes=count["bytes"])
                if done:
                    try:
                        return job.result()
                    except OSError as exc:  # (one while a copy connection opens comes unwrapped)
                        raise HostUnreachable(f"copying from {row['source']} to {row['target']} failed: "
                                              f"{exc}") from exc
        except asyncio.CancelledError:
            stop.set()
            for sock in sockets:  # the copying thread's splice fails at once, so shutdown does not wait on it
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            raise

    async def _copy_http(self, row: dict) -> None:
        rec = row["record"]
        plan = [(f, off, min(CHUNK, f["size"] - off)) for f in rec["files"] for off in range(0, f["size"], CHUNK)]
        corrupt, delay = self._chunks()

        async def fetch(i: int) -> bytes:
            f, offset, length = plan[i]
            data = (await self._host(row["source"], "GET", f"/v1/host/vms/{row['vm']}/files/{f['name']}",
                                     params={"offset": offset, "length": length}, timeout=IO_TIMEOUT,
                                     retries=CHUNK_READ_RETRIES)).content
            if len(data) != length:
                raise FuseError(f"short read of {f['name']} at {offset}: {len(data)} of {length} bytes")
            return data

        # Read chunk n+1 from the source while chunk n goes to the target.
        ahead = asyncio.create_task(fetch(0)) if plan else None
        copied, saved_at = 0, time.monotonic()
        try:
            for i, (f, offset, length) in enumerate(plan):
                data = await ahead
                ahead = asyncio.create_task(fetch(i + 1)) if i + 1 < len(plan) else None
                if i + 1 == corrupt:  # test hook: a chunk damaged in flight
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                await self._host(row["target"], "PUT", f"/v1/host/incoming/{row['id']}/files/{f['name']}",
                                 params={"offset": offset}, content=data, timeout=IO_TIMEOUT)
                copied += length
                if time.monotonic() - saved_at > 0.25 or i + 1 == len(plan) or os.environ.get("FUSE_TEST_CRASH_AT"):
                    self._set(row["id"], copied_bytes=copied)
                    saved_at = time.monotonic()
                _crash_point(f"chunk:{i + 1}")
                if delay:
                    await asyncio.sleep(delay)
        finally:
            if ahead is not None:
                ahead.cancel()

    async def _wake_target(self, row: dict) -> None:
        if row["record"].get("was_running", True):
            vm = await self._host(row["target"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                  json={"move_id": row["id"]}, timeout=120)
        else:  # a sleeping VM stays asleep, now on the target and unmarked
            vm = await self._host(row["target"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                  json={"move_id": row["id"], "clear_mark": True}, timeout=60)
        self._reassign(row, vm.json())

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
        _crash_point("removed")
        self._set(row["id"], "done", source_removed=removed)

    async def _remove_source(self, row: dict) -> bool:
        """Delete the source copy this move holds; False if the source did not answer."""
        try:
            await self._host(row["source"], "DELETE", f"/v1/host/vms/{row['vm']}", ok=(204, 404),
                             params={"move_id": row["id"]}, timeout=60)
            return True
        except FuseError as exc:
            log.warning("move %s: source copy not removed yet: %s", row["id"], exc.message)
            return False

    async def _settle(self, row: dict) -> None:
        """Bring a move that cannot go on to rest: forward when the target
        already runs the VM, else home. Raises when a host must answer first
        (the caller retries): the source never wakes while the target might
        run the VM, and `failed` is set only once the VM is home."""
        move_id = row["id"]
        reason = row["record"].get("reason") or (
            f"the controller driving the move stopped (restarted or died) during {row['state']}")
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
            with contextlib.suppress(FuseError):
                await self._host(row["source"], "POST", f"/v1/host/vms/{row['vm']}/wake",
                                 json={"move_id": move_id, "clear_mark": True}, timeout=30)
            reason += f"; the vm is asleep on {row['source']}: waking it failed: {exc.message}"
        self._set(move_id, "failed", reason=reason)

    async def _abort_target(self, row: dict, timeout: float = IO_TIMEOUT) -> None:
        await self._host(row["target"], "DELETE", f"/v1/host/incoming/{row['id']}", ok=(204, 404), timeout=timeout)

    async def _on_target(self, row: dict) -> dict | None:
        """The VM as the target holds it once the move is through (running, or
        asleep and unmarked for a sleeping VM's move), or None."""
        resp = await self._host(row["target"], "GET", f"/v1/host/vms/{row['vm']}", ok=(200, 404), timeout=30)
        if resp.status_code == 404:
            return None
        vm = resp.json()
        want = "running" if row["record"].get("was_running", True) else "sleeping"
        return vm if vm["state"] == want and not vm.get("move_id") else None

    async def _wake_source(self, row: dict) -> None:
        """Wake the source copy if this move holds it. The agent takes the VM's
        lock, so a sleep still being written finishes first; an unmarked VM
        (the sleep never happened) is left as it is."""
        src = row["source"]
        clear = not row["record"].get("was_running", True)
        resp = await self._host(src, "POST", f"/v1/host/vms/{row['vm']}/wake", ok=(200, 404), timeout=120,
                                json={"move_id": row["id"], "clear_mark": clear, "if_marked": True})
        if resp.status_code == 404:
            raise NotFound(f"vm {row['vm']} not found on {src}")
        self.fleet.upsert_vms(src, [resp.json()])

    # ---- after a restart -----------------------------------------------------
    async def resume(self) -> None:
        """Start renewing leases and recovering moves whose driver is gone
        (a previous run of this controller, or a replica that died), and resume
        the drain of every host left draining (`drain`)."""
        self._janitor = asyncio.create_task(self._janitor_loop())
        self.resume_drains()

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
            if rec.get("owner") != self.ctl.instance and rec.get("lease_until", 0) > time.time():
                return None
            rec.update(owner=self.ctl.instance, lease_until=time.time() + LEASE_S)
            c.execute(update(moves_t).where(moves_t.c.id == move_id).values(record=rec))
            return dict(row, record=rec)

    def _renew_and_recover(self) -> None:
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(moves_t).where(moves_t.c.state.in_(ACTIVE))).mappings()]
        now = time.time()
        for row in rows:
            mine = (row["record"] or {}).get("owner") == self.ctl.instance
            running = row["id"] in self._tasks and not self._tasks[row["id"]].done()
            if mine and running:
                with self.store.tx() as c:  # renew
                    rec = dict(row["record"], lease_until=now + LEASE_S)
                    c.execute(update(moves_t).where(moves_t.c.id == row["id"]).values(record=rec))
            elif not running and (claimed := self._claim(row["id"])) is not None:
                log.warning("move %s: taking over from %s", row["id"], (row["record"] or {}).get("owner"))
                self._tasks[row["id"]] = asyncio.create_task(self._recover(claimed))

    async def _recover(self, row: dict) -> None:
        """Settle a move, retrying while a host it needs does not answer
        (bounded here; the janitor takes the move up again after that)."""
        move_id = row["id"]
        for _ in range(600):  # ~10 minutes
            try:
                await self._settle(row)
                return
            except FuseError as exc:
                log.warning("move %s: settling waits for a host: %s", move_id, exc.message)
            await asyncio.sleep(1)
            row = self._row(move_id)
            if row["state"] not in ACTIVE:
                return

    async def _janitor_loop(self) -> None:
        """Renew leases, recover orphaned moves, and retry what a failed or
        finished move could not tidy at once."""
        tick = 0
        while True:
            try:
                self._renew_and_recover()
            except Exception:  # the store may blip; try again next second
                log.exception("move leases")
            await asyncio.sleep(1)
            tick += 1
            # The clean-up waits on hosts (a hung one for its whole timeout): it runs
            # beside this loop, so the leases are renewed every second meanwhile.
            if tick % 2 == 0 and (self._tidying is None or self._tidying.done()):
                self._tidying = asyncio.create_task(self._tidy_safely())

    async def _tidy_safely(self) -> None:
        try:
            await self._tidy()
        except asyncio.CancelledError:
            raise
        except Exception:  # a store blip or an odd reply must not end the clean-up
            log.exception("move clean-up")

    async def _tidy(self) -> None:
        """Retry what a failed or finished move could not tidy at once."""
        for m in self.list():
            row = self._row(m["id"])
            rec = row["record"] or {}
            try:
                if row["state"] == "failed" and rec.get("cleanup_pending"):
                    await self._abort_target(row)
                    self._set(row["id"], cleanup_pending=False, target_clear=True)
                elif row["state"] == "done" and not rec.get("source_removed") and await self._remove_source(row):
                    self._set(row["id"], source_removed=True)
            except FuseError:
                pass

    async def close(self) -> None:
        tasks = [*self._drains.values(), *self._tasks.values(),
                 *(t for t in (self._janitor, self._tidying) if t is not None)]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    # ---- drain ---------------------------------------------------------------
    async def drain(self, host_id: str) -> dict[str, Any]:
        """Move every VM off a draining host, one after another, by best fit.
        VMs that cannot move are reported, never killed. A VM whose run is over
        (`FINISHED`: exited, failed) has nothing to move and needs nothing: it is
        reported in ``finished``, not ``stuck``, since it does not keep the host
        from being deregistered (it goes with the host). A drain of a host whose
        drain is in progress joins it and answers its report. A VM found in a move
        (one a crash interrupted, an operator's, a replica's drain's) is waited for:
        moved, it is reported moved; back home, the drain moves it.

        A drain outlives the controller that ran it: the host's ``draining`` state is
        the record that it is wanted, and a controller that starts resumes the drain
        of every draining host (`resume`), as an operator who drained a host expects
        it to end empty, not half-drained because the controller restarted. The move
        a crash interrupted is settled first (it rolls back, or finishes forward), and
        its VM is then moved again. A resumed drain has no caller to answer: it emits
        ``host_drain_resumed`` and, at the end, ``host_drain_report`` with its report;
        a drain asked meanwhile joins it and answers that report. ``uncordon`` ends it
        as it ends any drain."""
        return await asyncio.shield(self._drain_task(host_id))

    def _drain_task(self, host_id: str, resumed: bool = False) -> asyncio.Task:
        task = self._drains.get(host_id)
        if task is None or task.done():
            task = self._drains[host_id] = asyncio.create_task(
                self._resumed_drain(host_id) if resumed else self._drain(host_id))
            task.add_done_callback(lambda t: self._drains.pop(host_id, None) if self._drains.get(host_id) is t else None)
        return task

    def resume_drains(self) -> list[str]:
        """Resume the drain of every host left ``draining`` (a controller's start)."""
        hosts = sorted(r["id"] for r in self.store.list_hosts() if r["state"] == "draining")
        for host_id in hosts:
            log.warning("host %s is draining: resuming its drain", host_id)
            self._drain_task(host_id, resumed=True)
        return hosts

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
        moved, stuck, finished = [], [], []
        left = []
        for vm in self.ctl.vms.list(host_id):
            if vm["state"] in FINISHED:
                finished.append({"vm": vm["name"], "state": vm["state"]})
            else:
                left.append(vm)
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
                break
            if not any(r["host"] == host_id for r in self.store.vms_named(vm["name"])):
                # gone since the list was read: moved by another drain (a replica's) or a move,
                # or deleted (nothing to report then)
                if (last := self._last_move(vm["name"], host_id)) is not None and last["state"] == "done":
                    moved.append({"vm": vm["name"], "move": last["id"], "to": last["target"]})
                continue
            m, err = await self._drain_move(vm["name"], host_id)
            if err is not None:
                if getattr(err, "vm_state", None) in FINISHED:  # its run ended since the store last heard
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
        return {"host": host_id, "moved": moved, "stuck": stuck,
                "finished": sorted(finished, key=lambda f: f["vm"])}

    async def _drain_move(self, name: str, host_id: str) -> tuple[dict | None, FuseError | None]:
        """Start moving vm ``name`` off ``host_id``: (the move, None) or (None, the refusal).
        A move of it already under way (the one a controller crash interrupted, which
        recovery settles; another drain's; an operator's) is waited for: done, that is the
        VM's move; failed, the VM is home again and this one starts."""
        try:
            return await self.create({"vm": name, "host": host_id}), None
        except FuseError as exc:
            if exc.code != "move_in_progress" or (last := await self._await_moves(name, host_id)) is None:
                return None, exc
        if last["state"] == "done":
            return self.get(last["id"]), None
        try:
            return await self.create({"vm": name, "host": host_id}), None
        except FuseError as exc:
            return None, exc

    def _last_move(self, name: str, host_id: str) -> dict | None:
        with self.store.read() as c:
            row = c.execute(select(moves_t).where(moves_t.c.vm == name, moves_t.c.source == host_id)
                            .order_by(moves_t.c.created_at.desc())).mappings().first()
        return dict(row) if row is not None else None

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
