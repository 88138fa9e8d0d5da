"""VMs through the controller: best-fit placement with reservations, and
the per-VM calls forwarded to the host that has the VM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any, Optional

import numpy as np
from pydantic import ValidationError

from ..envsettings import seconds
from ..errors import (AmbiguousVm, Conflict, FleetFull, FuseError, HostFull, HostUnreachable, InvalidArgument,
                      NotFound, VmExists)
from ..models.vm import MAX_ENTRY_BYTES, CreateVmRequest
from ..tasks import cancel_and_wait
from .hosts import _said, machine_names
from .placement import FleetArrays, rank, with_agent_limits
from .pool.request import history_from_vms
from .resources import Resources
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.engine import Connection

from .store import vms as vms_t
from .store.outage import PassLog, db_busy, db_unreachable

log = logging.getLogger("fuse.controller.vms")
CREATE_TIMEOUT_SECS = 180  # a host's answer to a create, at most (a slow boot)
CREATE_WATCH_SECS = 1.0  # how often a create waiting on its host checks the poller's verdict on it
SHAPE_HISTORY = 1000  # placed events a VM shape is learned from (``shape_history``)
JOIN_WAIT_SECS = 600  # a machine bought for a create may take this long to join
# A create its host may have got but did not answer keeps the host tied (no
# deregister, no new url) until the host says whether the VM is there: at most
# this long, should the host never answer again.
UNANSWERED_SECS = seconds("FUSE_CREATE_UNANSWERED_S", 600.0)
UNANSWERED_POLL_LATE_S = 10.0  # past UNANSWERED_SECS, an unanswered create's host is asked this often
FIRST_POLL_WAIT_S = 6.0  # a create waits at most this for hosts not yet polled once (a poll's timeout is 5 s)
# before a create is refused for want of room: the hosts short of it polled again (``_recheck_full``)
RECHECK_HOSTS, RECHECK_WAIT_S = 8, 2.0
# The host says it has no such VM twice, this far apart: the create never
# reached it, or will not land now (two reads, so a request still on its way
# when the first was answered has had time to be admitted).
ABSENT_CONFIRM_SECS = 2.0
# A replica's placing rows (shared PostgreSQL store) outlive it by at most this long: each
# is renewed every quarter of it while its create or wake waits on the host
PLACING_LEASE_SECS = seconds("FUSE_PLACING_LEASE_S", 60.0)
# A replica takes over, every quarter of that lease (as its rows are renewed), the creates
# another one sent and left unanswered when it died (``adopt_unanswered``): this many a pass
ADOPT_BATCH = 100
# A sleep writes the guest's memory out and a wake reads it back, so the wait for either
# (and for a move's install, which hashes the copied state again where its verify no
# longer stands) grows with the VM's memory: a fixed 120 s would roll back every move of a
# 16 GiB guest on a busy host. Measured (review 38, QEMU under TCG, 2 cores): a 2 GiB guest
# (1.7 GB of state) slept in 25 s and woke in up to 48 s at load 28 (~24 s a GiB); a 4 GiB
# one took 12 s and 20 s at load 4. So the first 2 GiB get 120 s (2.5 times the worst
# seen) and each GiB past them 30 s more (1.25 times the worst rate seen): 180 s for
# 4 GiB, 540 s for 16 GiB. A host that hangs holds a big VM's move that much longer
# before it rolls back: the price of not rolling back every move of it.
STATE_WAIT_S = 120.0
STATE_WAIT_PER_GIB_S = 30.0
STATE_WAIT_FREE_GIB = 2
MAX_MEM_MIB = 1_048_576  # (the largest shape a VM may have: ``VmShape``)


def state_wait_s(mem_mib: Any) -> float:
    """Seconds the controller waits for a host to sleep, wake or (moved) install a VM of
    ``mem_mib`` MiB: ``STATE_WAIT_S``, and ``STATE_WAIT_PER_GIB_S`` more for each GiB of its
    memory past ``STATE_WAIT_FREE_GIB`` (pro rata). A size not known (not a whole number of
    MiB: a record older than its shape, say) gets ``STATE_WAIT_S``."""
    if isinstance(mem_mib, bool) or not isinstance(mem_mib, int):
        mem_mib = 0
    past = max(0.0, min(mem_mib, MAX_MEM_MIB) / 1024 - STATE_WAIT_FREE_GIB)
    return STATE_WAIT_S + STATE_WAIT_PER_GIB_S * past


def pressure_reason(summary: dict) -> str:
    """Why a host's agent says it is under memory pressure, in its words (its summary's
    ``memory_pressure_reason``: its reserve above what the machine has available, or the
    kernel's PSI figures), so an operator who over-reserved is not sent looking for memory
    stalls there are none of (review 38). An agent older than the reason: the flag's words."""
    why = summary.get("memory_pressure_reason")
    if isinstance(why, str) and (why := " ".join(why.split())[:300]):  # (one line, bounded: a host's text)
        return why
    return "host is under memory pressure"


class ControllerCreateVm(CreateVmRequest):
    """The host's create body, plus where the VM may go: ``host`` pins it;
    ``on`` is ``auto`` (default: any host, a prewarmed VM first; with a cloud linked,
    the operator's own hosts before the pool's, as the pool's solve orders them; with the
    budget's autoscale on, a machine the elastic pool buys when none has room, and
    whatever the autoscale, one bought earlier that is still booting with room for it),
    ``local`` (the operator's own hosts only), a linked cloud's name (only its
    hosts; autoscale may buy one there) or ``host:<machine>`` (= ``host``)."""
    host: Optional[str] = None
    on: Optional[str] = None


AWAY_READ_S = 3.0  # a read of a host its poller holds disconnected (``VmService._read_timeout``)


def host_error(resp, host: str) -> FuseError:
    """Re-raise a host's error answer as ours, keeping its code; but the agent refusing
    the controller's token (restarted with another --token) is 502 `unauthorized` naming
    the host, as at registration: the caller's own credentials were fine. An error answer
    without the agent's error body is not the agent's: `not_agents`."""
    if resp.status_code == 401:
        return HostUnreachable(f"host {host}: {TOKEN_REJECTED}", code="unauthorized")
    if (err := agent_error(resp)) is None:
        return not_agents(resp, host)
    msg = err.get("message")
    e = FuseError(f"host {host}: {msg if isinstance(msg, str) else err['code']}", code=err["code"])
    e.http_status = resp.status_code
    return e


def agent_error(resp) -> dict | None:
    """The host agent's own error in ``resp``: its JSON error body's ``error``, an object
    with a code. None for any other body (an HTML page, a proxy's own JSON, none at all)."""
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # (not JSON, or nested past reading)
        return None
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) and isinstance(err.get("code"), str) else None


def vm_record(resp, name: str) -> dict | None:
    """The record of vm ``name`` in ``resp`` as its host agent sends one (a JSON object
    with that name, a state and a shape of whole vCPUs and MiB), or None."""
    try:
        vm = resp.json()
    except (ValueError, RecursionError):
        return None
    from .fleet import vm_record_problem

    return vm if vm_record_problem(vm) is None and vm["name"] == name else None


def not_agents(resp, host: str, expected: int | None = None, body: str = "VM record") -> HostUnreachable:
    """``host``'s answer ``resp`` that is not its agent's (an error status without the agent's
    error body, a status the agent does not answer with, ``expected`` without its ``body``):
    something in the way (a proxy, a gateway, a load balancer) answered in the agent's place,
    and may have passed the request on first. So it is no answer: 502 host_unreachable that
    may have been sent (a create tries no other host, a delete, sleep or wake "may still"),
    quoting the status and a JSON error body's message at most, never the body itself."""
    status = resp.status_code
    what = (" with no fuse error body" if status >= 400 else f" with no {body}" if status == expected
            else f" where its agent answers {expected}" if expected else "")
    err = HostUnreachable(f"host {host} answered HTTP {status}{_said(resp)}{what}, which is not its agent's "
                          "answer: a proxy or gateway in the way may have sent it", details={"host": host})
    err.maybe_sent = True
    return err


def lacks_bundle(resp) -> bool:
    """A host's 400 for a guest bundle it does not have (the agent names it in ``details``):
    that host's refusal, not the request's fault (it listed the bundle at its last poll)."""
    if resp.status_code != 400:
        return False
    try:
        details = resp.json()["error"].get("details")
    except Exception:
        return False
    return isinstance(details, dict) and "bundle" in details


# Why a host's agent answered the controller 401 (vms, usage and the poller say it alike).
TOKEN_REJECTED = ("its host agent rejected the controller's token (register the host again with the agent's "
                  "current token)")


async def _may_still(action: str, name: str, host: str, call):
    """Await ``call``, a delete, sleep or wake of VM ``name`` sent to ``host``. A host that
    may have got it but did not answer (a timeout, a dropped connection) may still carry it
    out when it answers again: the 502 says so, as a create's does (a caller reading it as
    "nothing happened" found its VM deleted or asleep later)."""
    try:
        return await call
    except HostUnreachable as exc:
        if not getattr(exc, "maybe_sent", True) or exc.code != "host_unreachable":
            raise
        raise HostUnreachable(
            f"host {host} did not answer the {action} of vm {name} ({exc.message}); it may still "
            f"{action} it when it answers again (GET /v1/vms/{name} then shows what it did)",
            details={"host": host, "vm": name}) from None


def agent_not_found(resp) -> bool:
    """Whether a 404 is the host agent saying it holds no such thing: its JSON error
    body with code ``not_found``, not any 404 something on the way sent."""
    err = agent_error(resp)
    return err is not None and err["code"] == "not_found"


class VmService:
    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self._lock = asyncio.Lock()
        self._pending: dict[str, Resources] = {}
        # the names creates are placing right now: (host, vm name) -> how many (a create
        # holds its name from its reservation, or its claim of a prewarmed VM, to the
        # host's answer), so a create of the same name meanwhile is vm_exists at once
        self._naming: dict[tuple[str, str], int] = {}
        self._waking: set[tuple[str, str]] = set()
        self._acting: dict[tuple[str, str], list[str]] = {}  # (host, vm name) -> deletes, sleeps, wakes under way
        self._wake_rows: dict[tuple[str, str], str | None] = {}  # (host, vm name) -> its placing row  # (host, vm name): wakes reserved and waiting on the host
        # creates a host did not answer, until it says whether the VM landed: ticket ->
        # (host, vm name, shape); each with the task that asks the host (_settle_unanswered)
        self._unanswered: dict[object, tuple[str, str, Resources]] = {}
        self._unanswered_since: dict[object, float] = {}  # ticket -> when (unix s) the create went unanswered
        self._settling: set[asyncio.Task] = set()
        self._tickets: dict[object, str | None] = {}  # an unanswered create's placing row
        # Replicas sharing a PostgreSQL store each count what the others are placing: a
        # create's or wake's reservation is also a row of the store's ``placing`` table,
        # written in the same write transaction (the replicas' write lock) as the placement
        # read that chose the host, so two replicas never both give away the same room
        self._shared = not self.store.is_sqlite
        self.replica = secrets.token_hex(8)
        self._rows: dict[str, str] = {}  # this replica's rows in the store: id -> host
        self._renewer: asyncio.Task | None = None
        self._adopter: asyncio.Task | None = None

    @property
    def fleet(self):
        return self.ctl.fleet

    # ---- placement -----------------------------------------------------------
    def arrays(self, only: str | None = None, bundle: str | None = None, among: set[str] | None = None,
               others: list[tuple[str, str, Resources, str]] | None = None) -> tuple[FleetArrays, dict[str, str]]:
        """The fleet as placement weighs it; ``others``: what other replicas are placing
        (read here when not given)."""
        every = self.store.list_hosts()
        elsewhere: dict[str, Resources] = {}
        others = self._others() if others is None else others
        for h, _, ask, _ in others:
            elsewhere[h] = elsewhere.get(h, Resources()) + ask
        rows = every
        if only is not None:
            rows = [r for r in rows if r["id"] == only]
        if among is not None:
            rows = [r for r in rows if r["id"] in among]
        alloc = self.store.allocated()
        machine = machine_names(every)
        state_of = {r["id"]: r["state"] for r in every}
        zero, none = Resources(), {}
        pending = dict(self._pending)  # per host: what this replica and the others are placing there
        for h, res in elsewhere.items():
            pending[h] = pending.get(h, zero) + res
        for (h, _), res in self._unanswered_held(others).items():
            pending[h] = pending.get(h, zero) + res  # (and creates unanswered, whichever replica sent them)
        views = self.fleet.views if self.fleet else {}
        cv, cm, fv, fm, cnt, lim, usable = [], [], [], [], [], [], []
        reasons: dict[str, str] = {}
        agent_limits: dict[str, int | None] = {}  # the agents' own --max-vms, from their summaries
        shared: dict[str, list[str]] = {}  # the hosts one machine has under several names -> those names
        for r in rows:  # (one pass of plain lists: at 10,000 hosts this loop is the snapshot's cost)
            hid, cap = r["id"], r["capacity"]
            # One machine under several names (one agent identity): what any of its names
            # holds or is placing takes room from every name's declared capacity, so that
            # each name's capacity is not room on top of the others' (seed 004: a host's
            # figures are believed only within its declared capacity).
            names = machine[hid]
            if len(names) == 1:
                a, p = alloc.get(hid, none), pending.get(hid, zero)
            else:
                a = {k: sum(alloc.get(h, none).get(k, 0) for h in names) for k in ("cpus", "ram_mb", "vm_count")}
                p = sum((pending.get(h, zero) for h in names), zero)
                shared[hid] = names
            view = views.get(hid)
            s = view.summary if view else none
            c_cpus, c_mem = cap.get("cpus", 0), cap.get("ram_mb", 0)
            cv.append(c_cpus)
            cm.append(c_mem)
            # Believe the host only within its declared capacity.
            fv.append(min(s.get("free_vcpus", 0), c_cpus - a.get("cpus", 0)) - p.vcpus)
            fm.append(min(s.get("free_mem_mib", 0), c_mem - a.get("ram_mb", 0)) - p.mem_mib)
            cnt.append(max(s.get("vm_count", 0), a.get("vm_count", 0)) + p.count)
            lim.append(cap.get("vm_count", 0))
            agent_limits[hid] = s.get("max_vms")
            if r["state"] != "active":
                reasons[hid] = f"host is {r['state']}"
            elif len(names) > 1 and (alias := next((h for h in names if state_of.get(h, "active") != "active"),
                                                   None)):
                # one machine: cordoned (or draining) under one name, it takes no work under another
                reasons[hid] = f"host is {state_of[alias]} (as {alias}: the same machine)"
            elif view is None or not view.connected:
                reasons[hid] = "host is disconnected" + (f": {view.error}" if view and view.error else "")
            elif s.get("memory_pressure"):
                reasons[hid] = pressure_reason(s)
            elif bundle and s.get("bundles") is not None and bundle not in {b.get("name") for b in s["bundles"]}:
                reasons[hid] = f"host has no bundle {bundle}"
            usable.append(hid not in reasons)
        cols = {k: np.array(v, dtype=np.int64) for k, v in
                (("cv", cv), ("cm", cm), ("fv", fv), ("fm", fm), ("cnt", cnt), ("lim", lim))}
        usable = np.array(usable, dtype=bool)
        fleet = FleetArrays([r["id"] for r in rows], cols["cv"], cols["cm"], cols["fv"], cols["fm"], cols["cnt"],
                            cols["lim"], usable, machine_names=shared)
        # a host whose agent's own VM-count limit is reached is left out with that reason
        # rather than asked and refusing (its admission still has the final word)
        return with_agent_limits(fleet, agent_limits), reasons

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            req = ControllerCreateVm.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidArgument(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        if req.entry is not None and len(req.entry.encode()) > MAX_ENTRY_BYTES:  # (the host's own rule, said
            raise InvalidArgument(f"entry is longer than {MAX_ENTRY_BYTES} bytes")  # before any host is asked)
        if req.on == "":  # (as host "" is: a value that names nothing is no default)
            raise InvalidArgument("on must name where the VM may go: auto, local, a linked cloud's name or "
                                  "host:NAME (leave it out for auto)")
        on = req.on or "auto"
        if on.startswith("host:"):
            if req.host is not None and req.host != on[5:]:
                raise InvalidArgument(f"host {req.host} and on {on} disagree")
            req.host = on[5:]
            on = "auto"
        among = self._among(on)
        if req.host == "":
            raise InvalidArgument("host must name a host (leave it out and placement chooses)")
        if req.host is not None and self.store.get_host(req.host) is None:
            raise NotFound(f"host {req.host} not found")
        if req.host is not None and among is not None and req.host not in among:
            raise InvalidArgument(f"host {req.host} and on {on} disagree: {req.host} is {self._outside(on)}")
        name = req.name or f"vm-{secrets.token_hex(4)}"
        if req.host is not None and (taken := self._taken_on(name, req.host)):
            # The pinned host is the chosen one: its name clash is the answer,
            # whatever placement would say of its room (a full host included).
            raise VmExists(taken)
        self._check_naming(name, req.host)
        # the hosts a move of the name is taking it to: theirs from the move's 202 on (read again
        # where the name is held, below: a create there would fail the move at its copy)
        moving_to = self.ctl.moves.moving_to(name) if req.name else {}
        if self.fleet is not None:  # (a controller just started: its hosts read once first)
            await self.fleet.first_polls([req.host] if req.host else [r["id"] for r in self.store.list_hosts()],
                                         FIRST_POLL_WAIT_S)
        if req.bundle:
            self._check_bundle(req.bundle, req.host, among, on)
        claim_among = among if req.host is None else {req.host}  # (pinned: a standby VM on that host)
        if not req.standby and (vm := await self._claim(req, name, claim_among, moving_to)) is not None:
            return vm
        ask = Resources.vm(req.shape.vcpus, req.shape.mem_mib)
        host_body = req.model_dump(mode="json", exclude={"host", "on"}) | {"name": name}
        reasons: dict[str, str] = {}  # hosts that refused or did not answer -> why
        decisions = []
        tried: set[str] = set()
        lacking: set[str] = set()  # hosts that refused the create for want of its bundle
        reopened: set[str] = set()
        scaled = False
        rechecked = False
        cloud_hosts = self._cloud_hosts(req, on)
        while True:
            async with self._lock:
                with self._placing_tx() as conn:  # (one step fleet-wide: see ``_shared``)
                    others = self._others(conn)
                    # (again: another create of the name may have begun while this one waited,
                    # and its reservation must not read as room taken before it reads as the name)
                    self._check_naming(name, req.host, [o for o in others if o[3] == "create"])
                    # (and a move of the name recorded while this one waited: ``MoveService.create``
                    # checks for this create's hold the same way, with no await before its record)
                    moving_to |= self.ctl.moves.moving_to(name, conn) if req.name else {}
                    if req.host in moving_to:
                        raise VmExists(f"a vm named {name} is moving to host {req.host} "
                                       f"(move {moving_to[req.host]})")
                    for h, m in moving_to.items():  # (passed by as a host whose VM of that name is there)
                        reasons.setdefault(h, f"a vm named {name} is moving here (move {m})")
                    fleet, unusable = self.arrays(only=req.host, bundle=req.bundle, among=among, others=others)
                    decision = rank(fleet, ask, unusable)
                    decisions.append(decision)  # its per-host reasons are worked out only for a fleet_full reply
                    out = tried | moving_to.keys()
                    host = decision.best(exclude=out)
                    if host is not None and host in cloud_hosts:  # the pool's order: your own hosts first
                        host = next((h for h in decision.order if h not in out and h not in cloud_hosts), host)
                    row = self._hold(conn, host, name, ask, "create") if host is not None else None
                if host is not None:  # (committed: only now this replica's own book-keeping, which
                    # a failed commit would otherwise leave holding the room and the name for good)
                    self._held(row, host)
                    self._pending[host] = self._pending.get(host, Resources()) + ask
                    self._name(host, name, +1)
                if host is None and self._reopen(req, ask, among, reopened):
                    decisions.pop()  # (it said the host is cordoned: no longer so)
                    continue  # a host scale-in cordoned has the room: place again
            if host is None and not rechecked:
                rechecked = True
                if await self._recheck_full(fleet, ask, out):
                    decisions.pop()
                    continue  # fresh figures: place again
            if host is None:
                if lacking and req.bundle:  # (hosts that listed the bundle said they have it no more:
                    # when no other host has it, the answer is the bundle's 400, as before placement)
                    self._check_bundle(req.bundle, req.host, among, on, lacking)
                why_not = None if scaled else self._no_scale(req, on)
                if scaled or why_not == "":
                    break
                scaled = True
                try:  # the elastic pool buys a machine for it (outside the lock: it takes a while);
                    # with autoscale off it buys nothing, but a machine bought earlier that is
                    # still booting with room for it is waited for all the same
                    await self.ctl.pool.host_for(req.shape.vcpus, req.shape.mem_mib, req.bundle or "linux",
                                                 None if on == "auto" else on, timeout=JOIN_WAIT_SECS,
                                                 buy=why_not is None)
                except FuseError as exc:
                    reasons["elastic pool"] = exc.message
                    if among is not None and req.host is None and (fresh := self._fresh_among(on, among)):
                        among = fresh  # (a machine another create bought meanwhile: weighed, not called outside)
                        continue
                    break
                if why_not:
                    reasons["elastic pool"] = why_not  # (the answer, should no host have room still)
                if among is not None:  # the cloud's hosts now include the one bought (by this create or another)
                    among = self._among(on)
                continue
            tried.add(host)
            flying = self._in_flight(host, name, ask)
            try:  # (the reservation and the name go back on every way out, in the finally)
                try:
                    read = self._summary(host)  # (the host's figures before it got the create)
                    resp = await self._create_on(host, host_body)
                    created = await self._created(resp, host, name)  # (an answer not the agent's is none)
                except HostUnreachable as exc:
                    if getattr(exc, "maybe_sent", True):
                        flying = None  # (its record is the unanswered create's from here)
                        # the request may have reached the host, which may still carry it out: a try on
                        # another host could leave the VM in two places (a host that got it late
                        # created it after a fleet_full reply). The VM list shows it if it lands; until
                        # the host says, it stays tied as while the create waited (recorded before the
                        # reservation goes, so a deregister never slips in between).
                        self._unanswered_create(host, name, ask)
                        raise HostUnreachable(
                            f"host {host} did not answer the create of vm {name} ({exc.message}); it may still "
                            "create it (the VM list shows it once the host answers), so no other host was tried",
                            details={"host": host, "vm": name}) from None
                    reasons[host] = exc.message  # (never sent: the connection failed)
                    self._landed(host, name, flying)  # (nothing can land: its record goes)
                    flying = None
                    continue
                taken_over = self._landed(host, name, flying)  # the host answered: no longer in flight
                flying = None
                # a 5xx: the boot that failed leaves the host a `failed` record, removed here; one the
                # host runs all the same (its answer was about something else) is the create's VM there
                landed = await self._clear_failed(host, name) if created is None and resp.status_code >= 500 else None
                if created is not None or landed is not None:
                    vm = created or landed
                    try:
                        if not taken_over:  # (else recorded, and said, by the replica that took it over)
                            self._record(host, vm)
                            self._take_room(host, vm, read)
                            self.store.add_event("placed", {"vm": name, "id": host, "vcpus": ask.vcpus,
                                                            "mem_mib": ask.mem_mib,
                                                            "bundle": vm.get("bundle") or req.bundle}, host=host)
                    except DBAPIError as exc:
                        self._unrecorded(exc, host, name, ask)
                    if not req.standby and (pool := getattr(self.ctl, "pool", None)) is not None:
                        pool.used(host)  # (scale-in: a machine a plan bought has had its work)
                    self.fleet.changed.set()
                    return vm | {"host": host}
                err = host_error(resp, host)
                if err.code == "vm_exists":
                    raise VmExists(self._taken_on(name, host) or f"a vm named {name} already exists on host {host}")
                if lacks_bundle(resp):
                    lacking.add(host)  # (the next host may have it)
                elif resp.status_code == 400:
                    raise err
                reasons[host] = err.message.split(": ", 1)[-1]
            finally:
                if flying is not None:  # (left by a way out with no answer: a cancelled request may have
                    self._unanswered_create(host, name, ask, since=flying)  # reached the host all the same)
                self._release(host, ask, name, row)
        if not req.standby and (prewarm := getattr(self.ctl, "prewarm", None)) is not None:
            # a claim's refill may have created VMs of this shape, or be creating them, in the
            # room this create needed: one of those is this create's to claim (it was fleet_full
            # on a host with room for it)
            await prewarm.refilled(req.shape.vcpus, req.shape.mem_mib, req.bundle or "linux", claim_among)
            if (vm := await self._claim(req, name, claim_among, moving_to)) is not None:
                return vm
        filtered: dict[str, str] = {}  # the first reason each host was filtered out, refusals on top
        for d in decisions:
            for h, why in d.reasons.items():
                filtered.setdefault(h, why)
        pool = f"; {reasons['elastic pool']}" if "elastic pool" in reasons else ""  # e.g. the budget's cap
        if among is not None and req.host is None:  # the hosts ``on`` left out say so too
            registered = [r["id"] for r in self.store.list_hosts()]
            for h in registered:
                if h not in among:
                    filtered.setdefault(h, self._outside(on))
            if on != "local" and not among.intersection(registered):
                pool = f"; cloud {on} has no hosts{pool}"
        raise FleetFull(f"no host can take vm {name} ({ask.vcpus} vCPUs, {ask.mem_mib} MiB){pool}",
                        details={"hosts": dict(sorted((filtered | reasons).items()))})

    def _check_bundle(self, bundle: str, host: str | None, among: set[str] | None, on: str,
                      lacking: set[str] = frozenset()) -> None:
        """400 invalid_argument when no host the create may go to has guest bundle ``bundle``
        (nor would a machine the elastic pool buys for it): the agent's own answer to a bundle
        it lacks, given before placement turns it into each host's fleet_full reason. Hosts
        whose agents have not said which bundles they have are not ruled out. ``lacking``:
        hosts whose agents refused the create for want of it since they listed it."""
        # (unpinned: the hosts placement may choose, active ones; a cordoned host whose agent
        # never said which bundles it has turned the answer into fleet_full)
        names = [host] if host is not None else [r["id"] for r in self.store.list_hosts()
                                                 if (among is None or r["id"] in among) and r["state"] == "active"]
        if not names:
            return  # (no host at all: fleet_full says so)
        have: set[str] = set()
        asked = 0
        for h in names:
            view = self.fleet.views.get(h) if self.fleet else None
            if host is None and view is not None and not view.connected:
                continue  # (placement passes a disconnected host by: it is no host the create may go to)
            listed = view.summary.get("bundles") if view is not None else None
            if listed is None:
                return  # (it did not say: its admission decides)
            have |= {b.get("name") for b in listed if isinstance(b, dict)} - ({bundle} if h in lacking else set())
            asked += 1
        buys = host is None and on != "local" and bool(self.ctl.pool.cloud_names())
        if not asked and host is None and not buys:
            return  # (none connected and nothing to buy: fleet_full says so, host by host)
        if buys:
            have |= self.ctl.pool.images()  # (what a machine bought for it would have)
        if bundle not in have:
            what = f"host {host} has no bundle {bundle}" if host is not None else f"no host has bundle {bundle}"
            raise InvalidArgument(f"{what} (a guest bundle; there are: {', '.join(sorted(b for b in have if b)) or 'none'})")

    def _among(self, on: str) -> set[str] | None:
        """The hosts ``on`` allows (None: any)."""
        if on == "auto":
            return None
        elastic = {r["name"]: r for r in self.ctl.pool.rows()}
        if on == "local":
            return {r["id"] for r in self.store.list_hosts() if r["id"] not in elastic}
        self.ctl.pool.provider(on)  # a linked cloud, or 400
        return {n for n, r in elastic.items() if r["provider"] == on}

    def _fresh_among(self, on: str, among: set[str]) -> set[str] | None:
        """The hosts ``on`` allows now, when they are more than ``among`` (read as the create
        began), else None: a create that found no room must not answer that a machine of
        the cloud another create bought meanwhile is "not a host of" it."""
        try:
            fresh = self._among(on)
        except FuseError:  # (the cloud unlinked meanwhile: nothing new in it)
            return None
        return fresh if fresh is not None and fresh - among else None

    def _outside(self, on: str) -> str:
        """Why a host is not among those ``on`` allows."""
        return "an elastic host (on local: your own hosts only)" if on == "local" else f"not a host of cloud {on}"

    def _cloud_hosts(self, req: ControllerCreateVm, on: str) -> set[str]:
        """The hosts a create on auto takes only when none of the operator's own has room,
        as the pool's solve orders them (seed 001: your devices first, then hosts with
        room): with a cloud linked, the ones the elastic pool added. Empty when the create
        is pinned, on one cloud or local, or no cloud is linked (best fit alone decides)."""
        if on != "auto" or req.host is not None or not self.ctl.pool.cloud_names():
            return set()
        return {r["name"] for r in self.ctl.pool.rows()}

    def _no_scale(self, req: ControllerCreateVm, on: str) -> str | None:
        """Whether a create no host took may have the elastic pool buy a machine (None: it
        may): not pinned, not local, a cloud linked and the budget's autoscale on. Else why
        not, for the fleet_full answer: the budget's autoscale when it alone is in the way
        ("" when the create never asked for a machine, or no cloud is linked)."""
        if req.host is not None or on == "local" or req.standby or not self.ctl.pool.cloud_names():
            return ""
        if not self.ctl.pool.budget().autoscale:
            return ("autoscale is off: no machine is bought for it (turn it on with the budget's autoscale, "
                    "or add a host by hand)")
        return None

    def _reopen(self, req: ControllerCreateVm, ask: Resources, among: set[str] | None, done: set[str]) -> bool:
        """Uncordon a host scale-in cordoned that has room for the VM, among the hosts the
        create allows (its ``host`` pin, ``on``): its room is wanted again and it is paid
        for already. Whatever the budget's autoscale: nothing is bought (a plan counts such
        a host as one with room, and a prewarm it placed there creates its VMs pinned to it).
        Each host once per create (``done``). Called under the placement lock."""
        import time

        from .pool.reconcile import scaler_cordoned, uncordon
        for name in sorted(scaler_cordoned(self.ctl.pool, time.time())):
            if name in done or (req.host is not None and name != req.host) or (among is not None and name not in among):
                continue
            view = self.fleet.views.get(name) if self.fleet else None
            s = view.summary if view is not None else {}
            if view is None or not view.connected or s.get("memory_pressure") or (
                    req.bundle and s.get("bundles") is not None
                    and req.bundle not in {b.get("name") for b in s["bundles"]}):
                continue
            fleet, _ = self.arrays(only=name)
            if len(fleet.ids) and fleet.free_mem[0] >= ask.mem_mib and fleet.vm_count[0] < fleet.vm_limit[0]:
                done.add(name)
                uncordon(self.ctl.pool, name)
                return True
        return False

    async def _claim(self, req: ControllerCreateVm, name: str, among: set[str] | None,
                     moving_to: dict[str, str]) -> dict | None:
        """Take a prewarmed VM of this shape: its host renames it and gives the
        guest the entry (tens of ms). None when no ready one takes it. Not on a host
        a move of the name is taking it to (``moving_to``: the move would fail there)."""
        from .moves.hooks import pause_point  # (test hook; the moves package imports this module)

        prewarm = getattr(self.ctl, "prewarm", None)
        if prewarm is None:
            return None
        for v in prewarm.candidates(req.shape.vcpus, req.shape.mem_mib, req.bundle or "linux", among):
            host = v["host"]
            if host in moving_to or any(r["host"] == host for r in self.store.vms_named(name)):
                continue
            self._check_naming(name, req.host)  # (one began while this one claimed another that failed)
            self._name(host, name, +1)  # a claim names the VM as a create's reservation does
            try:
                await pause_point("claim")
                try:
                    resp = await self.fleet.conn(host).request("POST", f"/v1/host/vms/{v['name']}/claim",
                                                               json={"name": name, "entry": req.entry}, timeout=90)
                    vm = self._claim_answer(resp, host, name)  # (an answer not the agent's is none)
                except HostUnreachable as exc:
                    if not getattr(exc, "maybe_sent", True):
                        continue  # (never sent: the connection failed; the next one may take it)
                    # the host may have claimed it, and may still (review 36: a claim that landed late
                    # on one host, and another claim or a create on the next, ran the VM twice). Unless
                    # the host says it runs the VM under this name, it stays held as an unanswered
                    # create's (recorded before the name goes below, so a deregister never slips in).
                    if (vm := await self._claimed_there(host, name)) is None:
                        self._unanswered_create(host, name, Resources.vm(req.shape.vcpus, req.shape.mem_mib))
                        raise HostUnreachable(
                            f"host {host} did not answer the claim of its standby vm {v['name']} for vm {name} "
                            f"({exc.message}); it may still claim it (the VM list shows vm {name} once the host "
                            "answers), so no other standby vm or host was tried",
                            details={"host": host, "vm": name}) from None
                if vm is None:  # its agent's refusal: another create took it first, or it is gone
                    continue
                with self.store.tx() as c:
                    c.execute(vms_t.delete().where(vms_t.c.host == host, vms_t.c.name == v["name"]))
                self.fleet.upsert_vms(host, [vm])  # it holds the room its standby self held
            finally:
                self._name(host, name, -1)  # (claimed: the store has the name from here)
            self.store.add_event("placed", {"vm": name, "id": host, "vcpus": req.shape.vcpus,
                                            "mem_mib": req.shape.mem_mib, "prewarmed": v["name"],
                                            "bundle": vm.get("bundle") or req.bundle}, host=host)
            if (pool := getattr(self.ctl, "pool", None)) is not None:
                pool.used(host)
            self.fleet.changed.set()
            asyncio.get_running_loop().create_task(prewarm.fill())  # refill it in the background
            return vm | {"host": host}
        return None

    @staticmethod
    def _claim_answer(resp, host: str, name: str) -> dict | None:
        """What ``host`` answered the claim of a standby VM as vm ``name``: the VM's record (its
        200), or None for its agent's refusal (an error status with the agent's error body: the
        VM gone or claimed by another create; or its 401). Any other answer is not the agent's
        (review 36: a page taken for a refusal had the next host run the VM too; a 200 page was
        a 500): `not_agents`, a claim the host may have carried out."""
        if resp.status_code == 401 or (resp.status_code >= 400 and agent_error(resp) is not None):
            return None
        if resp.status_code == 200 and (vm := vm_record(resp, name)) is not None:
            return vm
        raise not_agents(resp, host, 200)

    async def _claimed_there(self, host: str, name: str) -> dict | None:
        """The record of vm ``name`` on ``host`` when the host says it runs it, claimed (no longer
        standby: a claim renames its VM before the entry goes in, and renames it back if the guest
        does not take it), else None (it says otherwise, or does not say)."""
        vm = await self._asked(host, name)
        return vm if vm is not None and vm["state"] == "running" and not vm.get("standby") else None

    async def _asked(self, host: str, name: str) -> dict | None:
        """Vm ``name``'s record as ``host``'s agent sends it, or None: the agent says it has no
        such VM, or the host does not say (no answer, or one that is not its agent's)."""
        try:
            asked = await self.fleet.conn(host).request("GET", f"/v1/host/vms/{name}", timeout=10)
        except HostUnreachable:
            return None
        return vm_record(asked, name) if asked.status_code == 200 else None

    def pending_on(self, host: str) -> Resources:
        """What is being placed on ``host`` right now (reserved, not yet answered)."""
        return self._pending.get(host, Resources())

    def placing_on(self, host: str) -> Resources:
        """What may yet land on ``host``: creates and wakes waiting on its answer, and
        creates it did not answer whose VM it has not yet said it has or lacks. The
        registry keeps the host (no deregister, no new url) while this counts any."""
        out = self.pending_on(host)
        others = self._others()
        for h, ask in [*((h, ask) for (h, _), ask in self._unanswered_held(others).items()),
                       *((o[0], o[2]) for o in others)]:
            if h == host:
                out = out + ask
        return out

    def _holding(self) -> list[tuple[str, str, Resources]]:
        """The unanswered creates that still hold their host (room, deregister): for
        UNANSWERED_SECS. Their VM's name stays held until the host says (``_creating``)."""
        young = time.time() - UNANSWERED_SECS
        return [u for t, u in self._unanswered.items() if self._unanswered_since.get(t, 0) > young]

    def placing_names(self, host: str) -> list[str]:
        """The names of the VMs ``placing_on`` counts: creates under way on ``host`` and
        creates it did not answer (a wake's VM is in the store, assigned there already)."""
        others = self._others()
        names = {n for h, n in self._naming if h == host}
        names |= {n for h, n in self._unanswered_held(others) if h == host}
        names |= {n for h, n, _, kind in others if h == host and kind == "create"}
        return sorted(names)

    def _unanswered_held(self, others: list[tuple[str, str, Resources, str]]) -> dict[tuple[str, str], Resources]:
        """(host, vm name) -> room of the creates a host has not answered that hold it (its room,
        deregistering it) and nothing else counts (this replica's reservations, the other replicas'
        placing rows, ``others``): this replica's unanswered ones (``_holding``) and every one the
        store records, whichever replica sent it, for UNANSWERED_SECS from its ``since``. A replica
        that died with creates in flight leaves their records, not their rows, which lapse after
        PLACING_LEASE_SECS (review 35: the host was held 60 s, deregistered, and the VM then landed
        there untracked). A VM the store lists is counted by its own row from then on."""
        held = {(h, n): ask for h, n, ask in self._holding()}
        young = time.time() - UNANSWERED_SECS
        for u in self.store.unanswered():
            if u["since"] > young:
                held.setdefault((u["host"], u["name"]), Resources.vm(u["vcpus"], u["mem_mib"]))
        for key in [*self._naming, *((o[0], o[1]) for o in others if o[3] == "create")]:
            held.pop(key, None)
        if held:
            q = select(vms_t.c.host, vms_t.c.name).where(vms_t.c.name.in_(sorted({n for _, n in held})))
            with self.store.read() as c:
                for h, n in c.execute(q):
                    held.pop((h, n), None)
        return held

    def _unrecorded(self, exc: DBAPIError, host: str, name: str, ask: Resources) -> None:
        """A VM ``host`` created that the store did not take (its database out of reach): 503
        saying the VM is there, not "try again" (review 28: a retried create without a name
        made a second VM); held and recorded, with its ``placed`` (``unanswered: true``), once
        the database answers, as a create whose host did not answer is."""
        if not db_unreachable(exc):
            raise exc
        self._unanswered_create(host, name, ask)
        raise FuseError(f"vm {name} was created on host {host}, but the controller could not record it "
                        f"({_db_why(exc)}): the VM list shows it once the database is back, so do not "
                        "create it again", code="db_unavailable",
                        details={"host": host, "vm": name}).with_status(503) from None

    def _in_flight(self, host: str, name: str, ask: Resources) -> float | None:
        """Record a create about to be sent to ``host`` as an unanswered one, before it is sent:
        a controller killed while the host makes the VM (or while the host is out of reach) holds
        the name when it starts again, until the host says (review 31: on SQLite nothing was
        recorded, and the name was placed again elsewhere: the VM ran twice). Its time (None:
        the store did not take it)."""
        since = time.time()
        try:
            self.store.add_unanswered(host, name, ask.vcpus, ask.mem_mib, since)
        except Exception as exc:  # (the create goes on: held in memory, as before)
            log.warning("vm %s: could not record its create on %s before sending it: %s", name, host, exc)
            return None
        return since

    def _landed(self, host: str, name: str, flying: float | None) -> bool:
        """The host answered the create sent at ``flying``: its in-flight record goes (before the
        VM's own is written: a controller killed in between finds the VM in the host's list).
        Whether another replica took that record over meanwhile (this one stalled past its placing
        lease): that one has recorded the VM and said ``placed``, from a later read of the host,
        which this older answer must not overwrite nor say twice (a standby VM's ``ready``, read
        by it, was lost so)."""
        if flying is not None:
            try:
                return not self.store.drop_unanswered(host, name)
            except Exception as exc:  # (the next start asks the host, which says)
                log.warning("vm %s: could not remove the in-flight record of its create on %s: %s", name, host, exc)
        return False

    def _unanswered_create(self, host: str, name: str, ask: Resources, since: float | None = None,
                           row: str | None = None) -> None:
        """Hold the create ``host`` did not answer until the host says whether the VM landed:
        recorded in the store (``since`` given: read back from it at a start), so the
        name stays held across a restart and for every replica. ``row``: its placing row,
        written already (``_adopt``'s claim)."""
        loop = asyncio.get_running_loop()  # (first: with none, nothing is held that no task settles)
        ticket = object()
        self._unanswered[ticket] = (host, name, ask)
        self._unanswered_since[ticket] = since or time.time()
        if since is None:
            try:
                self.store.add_unanswered(host, name, ask.vcpus, ask.mem_mib, self._unanswered_since[ticket])
            except Exception as exc:  # (held in memory all the same)
                log.warning("vm %s: could not record its unanswered create on %s: %s", name, host, exc)
        # (read back from the store, by a start or a takeover: it is recorded, whatever the store
        # says later — the replica that sent it may drop it meanwhile, having said `placed` itself)
        task = loop.create_task(self._settle_unanswered(ticket, recorded=True if since is not None else None))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        if row is not None:
            self._tickets[ticket] = self._held(row, host)
        elif self._shared:  # (held for the other replicas too, until the host says)
            try:
                with self.store.tx() as conn:
                    row = self._hold(conn, host, name, ask, "create")
                self._tickets[ticket] = self._held(row, host)
            except Exception as exc:  # (this replica still holds it; the others cannot see it)
                log.warning("vm %s: could not record its unanswered create on %s for the other replicas: %s",
                            name, host, exc)

    async def _settle_unanswered(self, ticket: object, recorded: bool | None = None) -> None:
        """Ask the host of an unanswered create for the VM until it says: there (it is
        recorded, so the host is held by an assigned VM from then on) or absent twice
        ABSENT_CONFIRM_SECS apart. Then, or after UNANSWERED_SECS without a word, or
        once the host is deregistered (by another replica), the host is let go."""
        host, name, ask = self._unanswered[ticket]
        absent_at, warned = None, False

        def placed(vm: dict) -> None:  # (the stream says where it went, as for a create answered)
            if self.store.drop_unanswered(host, name) or not recorded:  # (one replica says it)
                self.store.add_event("placed", {"vm": name, "id": host, "vcpus": ask.vcpus, "mem_mib": ask.mem_mib,
                                                "bundle": vm.get("bundle") or "linux", "unanswered": True}, host=host)
        # ``recorded``: whether the store holds it (None: read once the database answers)
        try:
            while True:
                if recorded is None:
                    try:
                        recorded = self.store.has_unanswered(host, name)
                    except DBAPIError:
                        await asyncio.sleep(1)  # (the database out of reach: its VM is recorded once it answers)
                        continue
                old = time.time() - self._unanswered_since[ticket] >= UNANSWERED_SECS
                if old and not warned:
                    warned = True
                    log.warning("vm %s: %s did not say in %.0f s whether its unanswered create landed; the "
                                "host is no longer held for it, its name is until it says", name, host,
                                UNANSWERED_SECS)
                await asyncio.sleep(UNANSWERED_POLL_LATE_S if old else 1)  # (first: it has just not answered)
                try:
                    if recorded and not self.store.has_unanswered(host, name):
                        return  # settled by another replica, or its host removed
                    if row := next((r for r in self.store.vms_named(name) if r["host"] == host), None):
                        placed(row.get("record") or {})  # recorded meanwhile (the host's poller read its VM list)
                        return
                except DBAPIError:
                    continue  # (the database out of reach: asked again)
                try:
                    resp = await self.fleet.conn(host).request("GET", f"/v1/host/vms/{name}", timeout=10)
                except HostUnreachable:
                    resp = None
                if resp is not None and resp.status_code == 200:
                    try:
                        self.fleet.upsert_vms(host, [resp.json()])
                        placed(resp.json())
                    except DBAPIError:
                        continue  # (the database out of reach: recorded once it answers)
                    log.warning("vm %s landed on %s after its create went unanswered: recorded", name, host)
                    return
                if resp is not None and resp.status_code == 404 and agent_not_found(resp):  # the agent's word
                    absent_at = absent_at or time.monotonic()
                    if time.monotonic() - absent_at >= ABSENT_CONFIRM_SECS:
                        self.store.drop_unanswered(host, name)
                        return
                else:  # unreachable or an odd answer: absence counts only from answers in a row
                    absent_at = None
        except NotFound:
            self.store.drop_unanswered(host, name)  # the host was deregistered: nothing left to hold
        except asyncio.CancelledError:
            # (this replica stops: the host may still make the VM, so the others go on counting
            # it until its row expires, rather than from now)
            self._rows.pop(self._tickets.pop(ticket, None), None)
            raise
        finally:
            self._unanswered.pop(ticket, None)
            self._unanswered_since.pop(ticket, None)
            self._unhold(self._tickets.pop(ticket, None))

    def start(self) -> None:
        """At the controller's start: take over the creates the store records as unanswered
        (``adopt_unanswered``); with replicas, go on doing so every quarter of
        PLACING_LEASE_SECS, for those of a replica that dies meanwhile."""
        self.adopt_unanswered()
        if self._shared:
            self._adopter = asyncio.get_running_loop().create_task(self._adopt_loop())

    def adopt_unanswered(self, most: int | None = None) -> int:
        """Go on holding, and asking about, the creates a host did not answer that the store
        still records and no replica holds (``most`` of them at most): at a start, those a
        restart forgot (the name was placed again elsewhere, and the VM ran twice once the
        host came back); with replicas, those of a replica that died, once its placing rows
        have lapsed (review 35: no running replica took them over, so the host was held 60 s,
        not UNANSWERED_SECS, a VM that landed had no ``placed``, and a create of a name that
        never landed was 409 vm_exists until some replica started). How many it took."""
        mine = {(h, n) for h, n, _ in self._unanswered.values()} | self._flying(self._others())
        taken = 0
        for u in self.store.unanswered():
            if most is not None and taken >= most:
                break
            if (u["host"], u["name"]) not in mine and self._adopt(u):
                taken += 1
        return taken

    def _adopt(self, u: dict) -> bool:
        """Take over the store's record ``u`` of an unanswered create (``_unanswered_create``).
        With replicas, one alone does: its claim (``Store.claim_unanswered``) writes this
        replica's placing row for it only while no live one is there. Whether it took it."""
        asyncio.get_running_loop()  # (first: with none, nothing is claimed that no task settles)
        host, name, ask = u["host"], u["name"], Resources.vm(u["vcpus"], u["mem_mib"])
        row = None
        if self._shared:
            row = secrets.token_hex(8)
            u = self.store.claim_unanswered(host, name, self._placing_row(row, host, name, ask, "create"))
            if u is None:
                return False
            log.warning("vm %s: the replica that sent its create to host %s stopped holding it before the host "
                        "answered; this replica asks the host whether it landed", name, host)
        self._unanswered_create(host, name, ask, since=u["since"], row=row)
        return True

    async def _adopt_loop(self) -> None:
        """``adopt_unanswered`` every quarter of PLACING_LEASE_SECS, ADOPT_BATCH a pass (the
        rest at the next), until the controller stops."""
        passes = PassLog(log)
        while True:
            await asyncio.sleep(PLACING_LEASE_SECS / 4)
            try:
                self.adopt_unanswered(ADOPT_BATCH)
                passes.ok("unanswered creates")
            except Exception as exc:  # (the next pass tries again)
                passes.failed("unanswered creates", exc)

    def _flying(self, others: list[tuple[str, str, Resources, str]]) -> set[tuple[str, str]]:
        """(host, name) of the creates in flight now, this replica's and the others' (their placing
        rows): their store records are theirs to settle, not an unanswered create's to ask about."""
        return set(self._naming) | {(o[0], o[1]) for o in others if o[3] == "create"}

    def forget_unanswered(self, host: str) -> None:
        """A force deregister of ``host`` (its agent gone for good): its unanswered creates
        will never land; their names are free."""
        for ticket, (h, n, _) in list(self._unanswered.items()):
            if h == host:
                self.store.drop_unanswered(h, n)
                self._unanswered.pop(ticket, None)
        for u in self.store.unanswered():
            if u["host"] == host:
                self.store.drop_unanswered(host, u["name"])

    async def close(self) -> None:
        await cancel_and_wait(list(self._settling) + [t for t in (self._renewer, self._adopter) if t])
        if self._rows:  # (what this replica still held: the others need not wait for it to expire)
            self._unhold(*self._rows)

    # ---- room being placed, seen by every replica ----------------------------
    @contextlib.contextmanager
    def _placing_tx(self):
        """A placement's read, decision and reservation as one step fleet-wide: on a
        shared PostgreSQL store, one write transaction (the replicas' write lock, so no
        other replica reads or reserves room meanwhile), in which the reservation's row is
        written; with SQLite (one controller) the caller's lock is all it takes (None)."""
        if not self._shared:
            yield None
            return
        with self.store.tx() as conn:
            yield conn

    def _others(self, conn: Connection | None = None) -> list[tuple[str, str, Resources, str]]:
        """(host, vm name, room, kind: ``create`` or ``wake``) of what the other replicas
        are placing now."""
        if not self._shared:
            return []
        rows = self.store.placing_of_others(self.replica, conn)
        if rows:
            # A VM its host has answered for is counted by its own row from then on: a create's
            # or wake's reservation left by a replica killed after the host made the VM counted
            # the room twice until its lease ran out (a full-size create refused ~60 s).
            q = select(vms_t.c.host, vms_t.c.name, vms_t.c.state).where(
                vms_t.c.name.in_(sorted({r["name"] for r in rows})))
            with contextlib.ExitStack() as stack:
                c = conn if conn is not None else stack.enter_context(self.store.read())
                recorded = {(h, n): st for h, n, st in c.execute(q)}
            rows = [r for r in rows if not (
                (r["kind"] == "create" and (r["host"], r["name"]) in recorded)
                or (r["kind"] == "wake" and recorded.get((r["host"], r["name"])) == "running"))]
        return [(r["host"], r["name"], Resources.vm(r["vcpus"], r["mem_mib"]), r["kind"]) for r in rows]

    def _hold(self, conn: Connection | None, host: str, name: str, ask: Resources, kind: str) -> str | None:
        """Write this reservation (a ``create`` or a ``wake``) in ``conn`` for the other
        replicas to count: its row id, which ``_held`` takes once the transaction has
        committed; None alone (SQLite)."""
        if not self._shared or conn is None:
            return None
        row = secrets.token_hex(8)
        self.store.add_placing(conn, self._placing_row(row, host, name, ask, kind))
        return row

    def _placing_row(self, row: str, host: str, name: str, ask: Resources, kind: str) -> dict:
        return {"id": row, "replica": self.replica, "host": host, "name": name, "kind": kind,
                "vcpus": ask.vcpus, "mem_mib": ask.mem_mib, "expires": time.time() + PLACING_LEASE_SECS}

    def _held(self, row: str | None, host: str) -> str | None:
        """A committed row of ``_hold``'s, renewed from now on until ``_unhold``."""
        if row is not None:
            self._rows[row] = host
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.get_running_loop().create_task(self._renew())
        return row

    def _unhold(self, *rows: str | None) -> None:
        ids = [r for r in rows if r is not None]
        for r in ids:
            self._rows.pop(r, None)
        if ids:
            try:
                self.store.drop_placing(ids)
            except Exception as exc:  # (its lease ends it all the same)
                log.warning("could not remove placing rows %s (they expire within %g s): %s", ids,
                            PLACING_LEASE_SECS, exc)

    async def _renew(self) -> None:
        """Keep this replica's rows alive while their creates and wakes wait."""
        while self._rows:
            await asyncio.sleep(PLACING_LEASE_SECS / 4)
            if self._rows:
                try:
                    await asyncio.to_thread(self.store.renew_placing, list(self._rows),
                                            time.time() + PLACING_LEASE_SECS)
                except Exception as exc:
                    log.warning("could not renew this replica's placing rows: %s", exc)

    def _release(self, host: str, ask: Resources, name: str | None = None, row: str | None = None) -> None:
        self._unhold(row)
        left = self._pending.get(host, Resources()) - ask
        if left.count <= 0:
            self._pending.pop(host, None)
        else:
            self._pending[host] = left
        if name is not None:
            self._name(host, name, -1)

    def placing(self) -> list[tuple[str, str]]:
        """(host, vm name) of every create under way that has not had the host's reply."""
        return list(self._naming)

    def _name(self, host: str, name: str, step: int) -> None:
        """Count a create placing vm ``name`` on ``host`` in (+1) or out (-1)."""
        n = self._naming.get((host, name), 0) + step
        if n > 0:
            self._naming[(host, name)] = n
        else:
            self._naming.pop((host, name), None)

    def _check_naming(self, name: str, host: str | None = None,
                      others: list[tuple[str, str, Resources, str]] | None = None) -> None:
        """409 vm_exists when another create is placing vm ``name`` on ``host`` (pinned) or,
        for a create placement chooses the host of (``host`` None), anywhere: reserved and
        waiting on the host's answer, or sent and not answered (the host may yet make it).
        Seed 004: a name used on the chosen host is vm_exists; that create's reservation
        is the name first, and room only after (a pinned host says vm_exists before any
        refusal for room, as it does for a VM it already has)."""
        mine = self._creating(name, host, others)
        if mine:
            raise VmExists(f"a vm named {name} is already being created on host {mine[0]} (another create of "
                           "that name waits on the host's answer, or on the host saying whether it landed)")

    def _creating(self, name: str, host: str | None = None,
                  others: list[tuple[str, str, Resources, str]] | None = None) -> list[str]:
        """The hosts (sorted) where a create of vm ``name`` is under way (waiting on the host's
        answer) or unanswered (the host may yet make it): on ``host`` alone when given.
        ``others``: the other replicas' (read here when None)."""
        placing = [h for h, n in self._naming if n == name]
        placing += [h for h, n, _ in self._unanswered.values() if n == name]
        theirs = self._others() if others is None else others
        placing += [o[0] for o in theirs if o[1] == name and o[3] == "create"]
        if others is None:  # (and those the store records: another replica's, an earlier run's)
            mine = {(h, n) for h, n, _ in self._unanswered.values()} | self._flying(theirs)
            for u in self.store.unanswered():
                if u["name"] == name:
                    placing.append(u["host"])
                    if (u["host"], name) not in mine:  # (its replica may be gone: this one asks too,
                        with contextlib.suppress(RuntimeError):  # or the name stayed held for good)
                            self._adopt(u)
        return sorted({h for h in placing if host is None or h == host})

    def _taken_on(self, name: str, host: str) -> str | None:
        """Why a create of vm ``name`` on ``host`` is vm_exists, when the store lists a VM of that
        name on ``host``'s machine (None: it lists none): the host named is the one the VM is
        listed under, and reached through (``?host=``). One machine under several names holds
        one VM of a name (seed 004): listed under another of them, the 409 named the host asked
        for, whose ``GET /v1/vms/NAME?host=`` was 404 (review 34)."""
        rows = self.store.vms_named(name)
        if not rows:  # (the common case: no registry read)
            return None
        names = machine_names(self.store.list_hosts()).get(host, [host])
        listed = sorted(r["host"] for r in rows if r["host"] in names)
        if not listed:
            return None
        if host in listed:
            return f"a vm named {name} already exists on host {host}"
        return f"a vm named {name} already exists on host {listed[0]} (the same machine as {host})"

    def _summary(self, host: str) -> dict | None:
        """The summary the poller last read of ``host`` (each poll stores a new one)."""
        view = self.fleet.views.get(host)
        return view.summary if view is not None else None

    def _record(self, host: str, vm: dict) -> None:
        """Store a VM ``host`` just created."""
        self.fleet.upsert_vms(host, [vm])

    def _take_room(self, host: str, vm: dict, read: dict | None) -> None:
        """Take the room of a VM ``host`` just created off the host's last summary until
        the next poll says otherwise: only off ``read``, the summary the poller had read
        before the create was sent. One the poller read since, while the host made
        the VM, counts it already, and taking it off again counted it twice (a back-to-back
        create was refused by the vm_count policy with a slot free, and a prewarm bought a
        machine for it). One read since that does not count it yet is believed until the
        next poll: the stored VM counts toward the vm_count policy and the declared capacity
        all the same (``arrays``), and the host's own admission has the last word."""
        view = self.fleet.views.get(host)
        if view is not None and view.summary is read:  # until the next poll says otherwise
            s = view.summary
            s["free_mem_mib"] = s.get("free_mem_mib", 0) - vm["shape"]["mem_mib"]
            s["free_vcpus"] = s.get("free_vcpus", 0) - vm["shape"]["vcpus"]
            s["vm_count"] = s.get("vm_count", 0) + 1

    # ---- one VM --------------------------------------------------------------
    def locate(self, name: str, host: str | None = None) -> str:
        if host == "":  # (as on the list and a create: a value that names nothing is no default)
            raise InvalidArgument("host must name a host (leave it out and the vm is looked for on every host)")
        rows = self.store.vms_named(name)
        if host is not None:
            rows = [r for r in rows if r["host"] == host]
        if not rows and (creating := self._creating(name, host)):
            # not recorded yet, but a create of it may still land: not "not found", which a
            # caller would take for gone (a teardown answered done, and the VM then ran on)
            raise Conflict(f"vm {name} is being created on host {creating[0]} (the host has not answered its "
                           "create yet): ask again once it has", details={"host": creating[0], "being_created": True})
        if not rows:
            unknown = host is not None and self.store.get_host(host) is None  # (a misspelt host, say so)
            raise NotFound(f"vm {name} not found" + (f" on host {host}" if host else "")
                           + (f": no host {host} is registered" if unknown else ""))
        if len(rows) > 1:
            raise AmbiguousVm(f"vm {name} is on several hosts ({', '.join(sorted(r['host'] for r in rows))}); "
                              "pick one with host", details={"hosts": sorted(r["host"] for r in rows)})
        return rows[0]["host"]

    async def _create_on(self, host: str, body: dict):
        """POST the create to ``host``, waiting up to ``CREATE_TIMEOUT_SECS`` for its answer
        (a boot may be slow) unless the poller finds the host gone first: an agent that
        stopped answering (frozen, or its machine lost) fails the create as soon as its polls
        do (~``DISCONNECT_AFTER`` polls), not after the whole wait. Either way the host may
        have the request: HostUnreachable with ``maybe_sent``."""
        call = asyncio.ensure_future(self.fleet.conn(host).request("POST", "/v1/host/vms", json=body,
                                                                   timeout=CREATE_TIMEOUT_SECS))
        view = self.fleet.views.get(host)
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=CREATE_WATCH_SECS)
                if done:
                    return call.result()
                if view is not None and not view.connected and view.failures:
                    err = HostUnreachable(f"host {host} stopped answering while it was asked to create the vm "
                                          f"({view.error or 'its polls failed'})", details={"host": host})
                    err.maybe_sent = True
                    raise err
        finally:
            if not call.done():
                call.cancel()

    def shape_history(self) -> list[dict]:
        """What the planner and prewarm learn a VM's shape from (``request.learned_shape``):
        the VMs listed now and those placed through this controller since (its ``placed``
        events, the newest ``SHAPE_HISTORY`` of them), so a deleted VM still teaches."""
        return history_from_vms(self.list(), self.store.events_of("placed", SHAPE_HISTORY))

    def list(self, host: str | None = None) -> list[dict]:
        out = []
        for r in self.store.list_vms():
            if host is None or r["host"] == host:
                out.append((r["record"] or {}) | {"name": r["name"], "host": r["host"], "state": r["state"]})
        return out

    async def _created(self, resp, host: str, name: str) -> dict | None:
        """What ``host`` answered the create of vm ``name``: the VM's record (its 201), or None
        for its agent's refusal (an error status with the agent's error body, or its 401). Any
        other answer is not the agent's: something in the way sent it, maybe after passing the
        create on (review 36: a 200 or 404 page taken for a refusal had the VM made on the next
        host too; a 201 that is not JSON was a 500 while the VM ran). The host is asked then,
        as after a 5xx: a VM it is booting or running is the create's; else `not_agents`, a
        create the host may have got (no other host is tried)."""
        if resp.status_code == 401 or (resp.status_code >= 400 and agent_error(resp) is not None):
            return None
        if resp.status_code == 201 and (vm := vm_record(resp, name)) is not None:
            return vm
        if (vm := await self._asked(host, name)) is not None and vm["state"] in ("creating", "running"):
            return vm
        raise not_agents(resp, host, 201)

    async def _clear_failed(self, host: str, name: str) -> dict | None:
        """After ``host`` answered a create with a 5xx: remove the record it left there (its
        agent keeps a VM that failed to boot as ``failed``) before the create tries another
        host, where the name would otherwise be twice (``ambiguous_vm`` for every later call)
        or stay taken after a ``fleet_full`` answer. A VM the host has all the same, booting or
        running, is returned: it is the create's (another host would run it a second time)."""
        try:
            resp = await self.fleet.conn(host).request("GET", f"/v1/host/vms/{name}", timeout=10)
            if resp.status_code != 200:
                return None
            vm = resp.json()
            if vm.get("state") in ("creating", "running"):
                return vm
            if vm.get("state") in ("failed", "exited"):
                await self._call(host, "DELETE", f"/v1/host/vms/{name}", timeout=60)
                with self.store.tx() as c:  # (the poller may have listed it meanwhile)
                    c.execute(vms_t.delete().where(vms_t.c.host == host, vms_t.c.name == name))
        except Exception as exc:  # (the VM list shows it, and a delete with ?host= removes it)
            log.warning("host %s: the failed create of vm %s left a record there: %s", host, name, exc)
        return None

    async def _call(self, host: str, method: str, path: str, ok: int | None = None, **kw):
        """``host``'s answer to the call; its error answer raised (`host_error`), and so is
        a success status other than ``ok`` (when given): not the agent's (`not_agents`)."""
        resp = await self.fleet.conn(host).request(method, path, **kw)
        if resp.status_code >= 400:
            raise host_error(resp, host)
        if ok is not None and resp.status_code != ok:
            raise not_agents(resp, host, ok)
        return resp

    async def _vm_call(self, host: str, name: str, method: str, path: str, **kw) -> dict:
        """The record of vm ``name`` that ``host`` answers the call with (a get, sleep or wake:
        200); an answer that is not the agent's raises `not_agents` (a page in its place was
        a 500 JSONDecodeError, though a sleep may have been carried out: review 36)."""
        resp = await self._call(host, method, path, ok=200, **kw)
        if (vm := vm_record(resp, name)) is None:
            raise not_agents(resp, host, 200)
        return vm

    def _read_timeout(self, host: str) -> dict:
        """A read (a VM, its console) of a host its poller holds disconnected waits
        ``AWAY_READ_S``, not the full 10 s: the poller already found it silent, and a host
        back since (before its backed-off poll) answers a read at once."""
        view = self.fleet.views.get(host) if self.fleet is not None else None
        return {"timeout": AWAY_READ_S} if view is not None and not view.connected and view.error else {}

    async def get(self, name: str, host: str | None = None) -> dict:
        host = self.locate(name, host)
        vm = await self._vm_call(host, name, "GET", f"/v1/host/vms/{name}", **self._read_timeout(host))
        self.fleet.upsert_vms(host, [vm])
        return vm | {"host": host}

    def _not_moving(self, name: str, host: str) -> None:
        """409 ``move_in_progress`` while a move holds the VM on ``host``, from its 202
        on: its source marks the VM only at the move's sleep step, and a sleep, wake or
        delete let through before that would be undone by the move or end it `failed`
        with the VM gone (``failed`` means the VM is home)."""
        if (row := self.ctl.moves.active_for(name, host)) is not None:
            raise Conflict(f"vm {name} is held by move {row.id} (from {host} to {row.target}): "
                           "wait for it to end", code="move_in_progress")

    def acting_on(self, name: str, host: str) -> str | None:
        """The delete, sleep or wake of VM ``name`` on ``host`` this controller is asking its
        host for right now, or None: a move does not start under one (``MoveService.create``)."""
        doing = self._acting.get((host, name))
        return doing[-1] if doing else None

    @contextlib.contextmanager
    def _act_on(self, name: str, host: str, action: str):
        """Checked and marked in one step (no await between): a move recorded after the check
        sees the mark and is refused; one recorded before is seen by the check (409)."""
        self._not_moving(name, host)
        doing = self._acting.setdefault((host, name), [])
        doing.append(action)
        try:
            yield
        finally:
            doing.remove(action)
            if not doing:
                self._acting.pop((host, name), None)

    async def delete(self, name: str, host: str | None = None) -> None:
        host = self.locate(name, host)
        with self._act_on(name, host, "delete"):
            try:
                await _may_still("delete", name, host, self._call(host, "DELETE", f"/v1/host/vms/{name}",
                                                                  ok=204, timeout=60))
            except FuseError as exc:
                if exc.code != "not_found":
                    raise
                # The host has no such VM: this call deleted nothing. Another delete (through
                # this replica or another) got there first and writes the one vm_removed, or the
                # host lost it: 404, as a delete just after is, and no event (review 34: three
                # deletes at once each answered 204 and wrote a vm_removed). A row still listed
                # goes (the VM list no longer shows what its host does not have).
                with self.store.tx() as c:
                    c.execute(vms_t.delete().where(vms_t.c.host == host, vms_t.c.name == name))
                raise NotFound(f"vm {name} not found on host {host}: the host no longer has it (another delete, "
                               "or the host itself, removed it first)") from None
            try:
                self._removed(host, name)
            except DBAPIError as exc:
                self._catch_up(self._removed, host, name)
                self._done_unrecorded(exc, host, name, "delete")
        await self._refresh_room(host)

    def _removed(self, host: str, name: str) -> None:
        """Record the delete ``host`` did: the VM's row goes, with its ``vm_removed``, in one write.
        Written whether or not the row was still there (the poller may have dropped it first): the
        host answered this call's delete, and it answers one delete of a VM so (the others: 404)."""
        with self.store.tx() as c:
            c.execute(vms_t.delete().where(vms_t.c.host == host, vms_t.c.name == name))
            self.store.add_event("vm_removed", {"vm": name, "id": host}, host=host, conn=c)

    def _catch_up(self, record, host: str, name: str) -> None:
        """Call ``record(host, name)`` once the database answers again, tried every second (a
        delete whose host did it while the database was away: its ``vm_removed`` is written then,
        whether or not the poller dropped the row first: the poller's drop emits no event). Held
        in this replica's memory only, as an unanswered create before it reaches the store."""
        async def retry() -> None:
            while True:
                await asyncio.sleep(1)
                try:
                    record(host, name)
                    return
                except DBAPIError as exc:
                    if not db_unreachable(exc):
                        log.warning("vm %s on %s: could not record what its host did: %s", name, host, exc)
                        return
        task = asyncio.get_running_loop().create_task(retry())
        self._settling.add(task)  # (cancelled by ``close``)
        task.add_done_callback(self._settling.discard)

    @staticmethod
    def _done_unrecorded(exc: DBAPIError, host: str, name: str, action: str) -> None:
        """A delete, sleep or wake ``host`` carried out that the store could not record (its
        database out of reach): 503 saying it is done, not "try again" (review 32: the retry
        was 404 or 409, as for a create `_unrecorded`). The record catches up once the database
        answers: the poller reads the host's VM list (a row dropped, a state changed), and a
        delete's ``vm_removed`` is written by ``_catch_up``."""
        if not db_unreachable(exc):
            raise exc
        did, shows = {"delete": ("deleted", "no longer lists it"), "sleep": ("put to sleep", "shows it sleeping"),
                      "wake": ("woken", "shows it running")}[action]
        raise FuseError(f"vm {name} was {did} on host {host}, but the controller could not record it "
                        f"({_db_why(exc)}): the VM list {shows} once the database is back, so do not "
                        f"{action} it again", code="db_unavailable",
                        details={"host": host, "vm": name, "done": action}).with_status(503) from None

    async def act(self, name: str, action: str, host: str | None = None, body: dict | None = None) -> dict:
        host = self.locate(name, host)
        row = next((r for r in self.store.vms_named(name) if r["host"] == host), None)
        wait = state_wait_s((row or {}).get("mem_mib"))  # (a big guest's sleep or wake takes longer)
        with self._act_on(name, host, action):
            ask = await self._wake_room(name, host) if action == "wake" else Resources()
            try:
                vm = await _may_still(action, name, host, self._vm_call(
                    host, name, "POST", f"/v1/host/vms/{name}/{action}", json=body or {}, timeout=wait))
                try:  # (before the reservation goes: the woken VM's row holds its room)
                    self.fleet.upsert_vms(host, [vm])
                except DBAPIError as exc:  # (the poller records the VM's state once the database answers)
                    self._done_unrecorded(exc, host, name, action)
            finally:
                if ask.count:
                    self._release(host, ask, row=self._wake_rows.pop((host, name), None))
                    self._waking.discard((host, name))
        await self._refresh_room(host)  # (a sleep gave room back, a wake took it)
        return vm | {"host": host}

    async def _recheck_full(self, fleet, ask: Resources, out: set[str]) -> bool:
        """Poll again the hosts (the ``RECHECK_HOSTS`` with the most memory free) that answer
        and lack the room for ``ask`` — its memory or a slot of their vm_count policy — by
        their poller's last summary, which may be a second old: a delete through another
        replica (whose own figures it refreshed) freed the room, and a create right after
        through this one was refused for it. Whether any was read again (``RECHECK_WAIT_S``
        at most: a host slow to answer keeps its figures)."""
        short = [i for i in range(len(fleet.ids)) if fleet.usable[i] and fleet.ids[i] not in out
                 and (fleet.free_mem[i] < ask.mem_mib or fleet.vm_count[i] >= fleet.vm_limit[i])]
        short.sort(key=lambda i: -float(fleet.free_mem[i]))
        ids = [fleet.ids[i] for i in short[:RECHECK_HOSTS]]
        if not ids:
            return False
        polls = [asyncio.ensure_future(self.fleet.poll_now(h)) for h in ids]  # (no registry read each)
        done, _ = await asyncio.wait(polls, timeout=RECHECK_WAIT_S)
        await cancel_and_wait(p for p in polls if p not in done)
        read = [not p.cancelled() and p.exception() is None for p in done]  # (every outcome retrieved)
        return any(read)

    async def _refresh_room(self, host: str) -> None:
        """Read the summary of ``host`` (and of its machine's other names) again after a
        delete, sleep or wake of ours changed its room, before answering: the poller's
        may be a second old, and a create right after would be refused for room the
        host has again (its VM count, its memory), or weigh room a wake took back as
        free. A host that does not answer keeps the figures it had: its poller's next
        answer brings them."""
        for h in machine_names(self.store.list_hosts()).get(host, [host]):
            try:
                await self.fleet.refresh(h)
            except Exception as exc:  # (the action is done: only the figures wait for the next poll)
                log.info("host %s: no fresh summary after an action there: %s", h, exc)

    async def _wake_room(self, name: str, host: str) -> Resources:
        """Reserve on ``host`` the memory a sleeping VM takes back when it wakes, or
        refuse (409 host_full): the host's agent admits by its own hardware, and the
        controller believes a host only within its declared capacity, which creates
        made since the VM slept may have filled (a wake then ran the host past it).
        The VM counts under the host's vm_count policy again too, as a create would.
        A VM whose room stayed reserved while it slept (a move's copies) needs none.

        A refusal stands only on fresh figures: the poller's last summary may still
        count the VM itself as running (read before it slept), or count a VM just
        created twice (read while it was created, then counted once more when its
        create was answered). So before refusing, the host is polled again and the
        room weighed once more; what the refusal says is what holds room then, the
        VM being woken never among it."""
        try:
            return self._reserve_wake(name, host)
        except HostFull as refused:
            try:
                await self.fleet.refresh(host)
            except Exception:  # no fresher figures to be had (the host does not answer): it stands
                raise refused from None
            return self._reserve_wake(name, host)

    def _reserve_wake(self, name: str, host: str) -> Resources:
        """`_wake_room`'s weighing on the figures at hand (no I/O)."""
        row = next((r for r in self.store.vms_named(name) if r["host"] == host), None)
        rec = (row or {}).get("record") or {}
        if row is None or row["state"] != "sleeping" or rec.get("return_room") or rec.get("reserved"):
            return Resources()  # (not sleeping: the host answers why it cannot wake)
        if (host, name) in self._waking:  # its own reservation is not room another VM holds
            raise Conflict(f"vm {name} is already being woken on host {host}")
        ask = Resources.vm(int(row["vcpus"] or 0), int(row["mem_mib"] or 0))
        with self._placing_tx() as conn:  # (one step fleet-wide, as a create's placement)
            fleet, _ = self.arrays(only=host, others=self._others(conn))
            free = int(fleet.free_mem[0]) if len(fleet.ids) else 0
            if free < ask.mem_mib:
                raise HostFull(f"host {host} has no room to wake vm {name}: it needs {ask.mem_mib} MiB of memory, "
                               f"{max(free, 0)} MiB free within the host's capacity")
            if len(fleet.ids) and fleet.vm_count[0] >= fleet.vm_limit[0]:
                raise HostFull(f"host {host} has no room to wake vm {name}: its vm_count policy "
                               f"{int(fleet.vm_limit[0])} is reached ({int(fleet.vm_count[0])} vms hold room there)")
            row = self._hold(conn, host, name, ask, "wake")
        # (committed: this replica's own book-keeping only now, as a create's)
        self._wake_rows[host, name] = self._held(row, host)
        self._pending[host] = self._pending.get(host, Resources()) + ask
        self._waking.add((host, name))
        return ask

    async def console(self, name: str, offset: int = 0, host: str | None = None) -> dict:
        host = self.locate(name, host)
        resp = await self._call(host, "GET", f"/v1/host/vms/{name}/console", ok=200, params={"offset": offset},
                                **self._read_timeout(host))
        try:
            out = resp.json()
        except (ValueError, RecursionError):
            out = None
        if not isinstance(out, dict):  # (a page in the agent's place)
            raise not_agents(resp, host, 200, "console output")
        return out


def _db_why(exc: DBAPIError) -> str:
    """Why the store did not take a write the host carried out, in a few words."""
    if db_busy(exc):
        return "its database was busy: a lock another transaction held was waited for too long"
    return "its database did not answer"
