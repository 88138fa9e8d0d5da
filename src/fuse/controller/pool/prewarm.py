"""Prewarm (seed 001): VMs of one shape kept booted and waiting, so the next
creates of that shape start in a fraction of a second.

A prewarm is a target: ``count`` standby VMs (``standby: true`` on the host
agent: booted, the guest waiting for its entry) spread over ``placements``
that the elastic pool's solve chose — the same solve as a create ``on auto``,
under the budget and the pins, buying machines when it has to. Nothing is
bought when the solve cannot place all of them: the request is refused.

A create whose shape (vCPUs, MiB, bundle) matches a ready standby VM *claims*
it (``POST /v1/host/vms/{name}/claim``: the agent renames it and hands the
guest its entry), and the pool refills the prewarm in the background while
the budget's ``warm`` switch is on. Standby VMs are named ``<prewarm id>-<n>``;
a prewarm ends at its TTL or when removed, and its standby VMs go with it.

Only a standby VM on a host that answers and takes work counts as ready (and
is claimed): one on a host that stopped answering may be there again in a
moment, so its placement stays and waits (nothing is bought for a blip) — for
``AWAY_SECS`` (``FUSE_PREWARM_AWAY_S``): a host silent longer is away, and the refill
places its VMs again through the prewarm's solve (``_off_away``); the standby VMs
left there are deleted once it answers (``_trim_returned``). So is a machine the pool
bought that never joined and went ``offline`` (silent for its boot time and the join
grace: no plan offers it any more), at once; one bought for the prewarm then has no
work planned and scale-in ends it as any idle machine. A
host cordoned (by the operator or scale-in; or its machine, cordoned or
draining under another of its names) gives its standby VMs to no create:
the refill places them again on hosts that take work (never that one;
buying nothing for a host scale-in cordoned, which it did as the other
hosts have room for them) and only then deletes them there; while nothing
has room for them they stay, ready again should the host be uncordoned. (A
placement on a host scale-in cordoned whose VMs are still to be created is
room like any, as for a create: creating them there uncordons it.) A host that will not
come back — removed, its TTL ended, its machine ended by the cloud, or no longer
registered — is *lost*: its standby VMs go (forgotten, when its machine went
with them) and its placements are dropped, and the refill places the VMs again
through the prewarm's own solve, as it does when a claim leaves a host full.

A standby VM whose run ended (its hypervisor died: ``failed``; ``exited``;
``deleted``) is not ready and holds no place: the refill deletes it from its
host and creates another. A prewarm removed (or at its TTL) takes its own
standby VMs only; a machine bought for it goes with it only when nothing else
is there — another prewarm's standby VMs or placement keep it, and scale-in
decides once it is idle.

A prewarm's shape is one a VM create takes (``VmShape``: bounds, memory floor),
checked when it is set (400, nothing bought): every standby create of any other
shape is refused. One stored before the check ends at the next refill.

Backoff. The refill rebuys a machine the cloud ended, and each purchase starts
a billing minimum; a cloud that keeps ending them (spot reclaim, a provider
that ends them at once) or refusing them would be paid a machine per pass,
held back by the budget alone. So the machines bought for a prewarm that the
cloud ends before they lived ``LIVED_SECS`` (or refuses to create), and those that
never joined (``_off_away``), are counted in a row: after the first (a one-off,
rebought at once) its refill buys no machine for ``backoff_secs`` — 30 s,
doubling with each, at most 30 min — and
says so (``Prewarm.backoff_until``/``backoff_reason``, a ``prewarm_backoff``
event). Hosts with room still take its VMs meanwhile. A machine bought after
the last early end that lives ``LIVED_SECS`` starts the count again.

Waiting for room. A standby create that finds no room on its placement's host (a
prewarm pinned to a full host; on auto, with no room elsewhere either) is tried
there again after ``ROOM_RETRY_FIRST_S``, doubling, at most ``ROOM_RETRY_MAX_S``,
and said once for the wait: each pass tried it again, a warning and a VM name each
time. Placing VMs there again (the solve sees room) ends the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, insert, select, update

from ...envsettings import seconds
from ...errors import FleetFull, FuseError, InvalidArgument, NotFound
from ...models.pool import U32, U64, ElasticPlanRequest, Prewarm, PrewarmOptions, PrewarmPlacement
from ...models.vm import VmShape
from ..hosts import FINISHED, machine_names
from ..store import prewarms as prewarms_t, vms as vms_t
from ..target import parse_on
from .elastic_budget import BudgetExceeded
from .request import kind_of_image, learned_shape

log = logging.getLogger("fuse.controller.pool")

# On a store replicas share, how long after its purchase a machine bought for a prewarm no
# replica stores is taken for an orphan (another may still be buying for it: ``end_orphaned``)
ORPHAN_GRACE_S = 600.0
DEFAULT_TTL_SECS = 3600
JOIN_WAIT_SECS = 600  # a machine bought for a prewarm may take this long to join
REFILL_WAIT_S = 30.0  # a create waits this long at most for a refill's standby creates of its shape
LIVED_SECS = 600  # a machine the cloud ends sooner after it was bought did not live (see Backoff)
BACKOFF_FIRST_SECS = 30  # no purchase for this long after the second early end in a row, doubling after
BACKOFF_MAX_SECS = 1800
SHAPE_FIELDS = {"vcpus": "cpus", "mem_mib": "memory_mb"}  # the create shape's names -> the prewarm's
FILL_LEASE_KEY, FILL_LEASE_S = "prewarm_fill_lease", 30.0  # one replica fills at a time (``_leads_fill``)
# a placement whose host had no room for a standby create is tried again after this long,
# doubling with each such try in a row, at most ROOM_RETRY_MAX_S (``_full_at``)
ROOM_RETRY_FIRST_S, ROOM_RETRY_MAX_S = 2.0, 30.0
# a host not answering this long is away, not a blip: its placements go elsewhere (``_off_away``)
AWAY_SECS = seconds("FUSE_PREWARM_AWAY_S", 120.0)


class FillTakenOver(Exception):
    """This replica's fill pass stalled past the fill lease (a pause, a frozen process) and
    another replica took the lease meanwhile: the pass stops, creating and placing nothing
    more (the holder fills what the prewarms lack)."""


def backoff_secs(early_ends: int) -> int:
    """How long a prewarm's refill buys no machine after ``early_ends`` machines bought for it
    in a row ended early: none after the first, then ``BACKOFF_FIRST_SECS`` doubling, at most
    ``BACKOFF_MAX_SECS``."""
    if early_ends < 2:
        return 0
    return min(BACKOFF_MAX_SECS, BACKOFF_FIRST_SECS * 2 ** min(early_ends - 2, 32))


def check_shape(cpus: int, mem: int, learned: str = "") -> None:
    """InvalidArgument unless a VM create takes ``cpus`` vCPUs and ``mem`` MiB. The create
    shape (``VmShape``) is the one check, so a prewarm and a create never disagree: a prewarm
    of a shape every create of which is refused would ask its hosts again at every pass.
    ``learned``: the fields taken from earlier VMs of the image, for the message."""
    try:
        VmShape(vcpus=cpus, mem_mib=mem)
    except ValidationError as exc:
        whys = []
        for err in exc.errors():
            field = SHAPE_FIELDS.get(err["loc"][0]) if err["loc"] else None
            rule = f" ({VmShape.model_fields['mem_mib'].description})" if field == "memory_mb" else ""
            whys.append(f"{field}: {err['msg']}{rule}" if field else err["msg"])
        source = f" ({learned} learned from earlier VMs of the image: give them)" if learned else ""
        raise InvalidArgument(f"cpus {cpus} and memory_mb {mem}{source} is not a shape a VM create takes, so none "
                              f"of the prewarm's VMs could ever be created: {'; '.join(whys)}") from None


def _ready(v: dict) -> bool:
    """A standby VM whose guest waits for its entry now (the host saw its standby mark)."""
    return v["state"] == "running" and bool((v["record"] or {}).get("ready"))


class PrewarmService:
    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self._fill_lock = asyncio.Lock()
        # placing a prewarm's VMs and recording where they go, one at a time: two prewarms
        # placed at once each read the room the other was about to take (both accepted on a
        # host with room for one, and one never got ready)
        self._room_lock = asyncio.Lock()
        self._no_room: dict[str, str] = {}  # per prewarm: why its refill last found no room (said once)
        # (prewarm, host) -> (when its next standby create there may be tried: monotonic s, the wait
        # that was): a placement whose host had no room (``_full_at``). Every pass tried again,
        # logging a warning and using a VM name each time, about once a second (review 35)
        self._full: dict[tuple[str, str], tuple[float, float]] = {}
        self._creating: dict[tuple, int] = {}  # (vcpus, MiB, bundle, host) -> standby creates under way
        self._starting: set[str] = set()  # prewarms being placed in this replica, not stored yet
        self._since = time.time()  # (a host this controller has not heard from yet: away since it started)
        self._filling = False  # a fill pass runs (under ``_fill_lock``): it creates and places under the lease

    # ---- records ---------------------------------------------------------------
    def _records(self) -> list[dict[str, Any]]:
        with self.store.read() as c:
            return [dict(r["record"]) for r in c.execute(select(prewarms_t).order_by(prewarms_t.c.created_at)).mappings()]

    def _get(self, pw_id: str) -> dict[str, Any] | None:
        with self.store.read() as c:
            r = c.execute(select(prewarms_t.c.record).where(prewarms_t.c.id == pw_id)).first()
        return dict(r[0]) if r else None

    def live_ids(self) -> set[str]:
        return {r["id"] for r in self._records() if r["expires_at"] > time.time()}

    def _standby(self, pw_id: str, *, ended: bool = False) -> list[dict]:
        """The standby VMs of prewarm ``pw_id`` (controller store rows). ``ended``: also those
        whose run ended (failed: their hypervisor died; exited; deleted), which hold no place
        in it: the refill deletes and replaces them (``_clear_ended``)."""
        return [v for v in self.store.list_vms()
                if v["name"].startswith(pw_id + "-") and (v["record"] or {}).get("standby")
                and (ended or v["state"] not in FINISHED)]

    def _save(self, rec: dict[str, Any]) -> None:
        with self.store.tx() as c:
            c.execute(update(prewarms_t).where(prewarms_t.c.id == rec["id"]).values(record=rec))

    # ---- the hosts' say ----------------------------------------------------------
    def _lost(self, host: str) -> bool:
        """``host`` will not come back: a machine the pool bought that is gone, or else a
        host no longer registered. A machine still booting (not registered yet) and a
        host that stopped answering (it may answer again) are not lost."""
        row = self.ctl.pool.row(host)
        if row is not None:
            return row["state"] == "gone"
        return self.store.get_host(host) is None

    def _away(self, host: str) -> bool:
        """``host`` has not answered for ``AWAY_SECS``: more than a blip (it may still come back);
        or it never joined and is offline (``_never_joined``)."""
        view = self.ctl.fleet.views.get(host) if self.ctl.fleet else None
        if view is None:
            return self._never_joined(host)
        if view.connected or self._lost(host):
            return False
        return time.time() - max(view.seen_at, self._since) >= AWAY_SECS

    def _never_joined(self, host: str) -> bool:
        """``host`` is a machine the pool bought (for a prewarm, a plan or by hand) whose agent
        never registered and that went ``offline``: silent for its boot time and the join grace,
        longer than any blip, and no longer offered to plans (review 32: its placements stayed
        there, never ready, and a machine bought for them was kept idle to the prewarm's TTL).
        It may still join late: then it is a host like any."""
        row = self.ctl.pool.row(host)
        return row is not None and row["state"] == "offline" and self.store.get_host(host) is None

    def _answers(self, host: str) -> bool:
        """Its standby VMs are there to claim: the host answers, and is not lost
        (the cloud may end a machine before its agent's last poll fails)."""
        view = self.ctl.fleet.views.get(host) if self.ctl.fleet else None
        return view is not None and view.connected and not self._lost(host)

    def _work_states(self) -> dict[str, tuple[str, str]]:
        """Each registered host's state as placement weighs it, and the name that has it: its
        own, or, when its machine is registered under other names too (one agent identity) and
        one of those is cordoned or draining, that one's: a machine takes no work under any of
        its names then (``VmService.arrays``; review 34: its standby VM was claimed through the
        name still active)."""
        rows = self.store.list_hosts()
        state = {r["id"]: r["state"] for r in rows}
        out = {}
        for host, names in machine_names(rows).items():
            alias = next((n for n in names if state[n] != "active"), host)
            out[host] = (state[host], host) if state[host] != "active" else (state[alias], alias)
        return out

    def _claimable(self, host: str, states: dict[str, tuple[str, str]] | None = None) -> bool:
        """Its standby VMs are there to claim: it answers and takes work (a claim is a
        placement, which a cordoned or draining machine takes none of: ``candidates``)."""
        state = (states if states is not None else self._work_states()).get(host)
        return state is not None and state[0] == "active" and self._answers(host)

    def view(self, rec: dict[str, Any]) -> Prewarm:
        vms = self._standby(rec["id"])
        placements = []
        states = self._work_states()
        for host, want in rec["placements"].items():
            on = [v for v in vms if v["host"] == host] if self._claimable(host, states) else []
            placements.append(PrewarmPlacement(host=host, machine=self._machine(host), count=want,
                                               ready=sum(_ready(v) for v in on)))
        backoff = rec.get("buy_after", 0) > time.time()
        return Prewarm(id=rec["id"], image=rec["image"], kind=rec["kind"], cpus=rec["cpus"],
                       memory_mb=rec["memory_mb"], count=rec["count"], ready=sum(p.ready for p in placements),
                       placements=placements, expires_at=rec["expires_at"], new_hosts=rec["new_hosts"],
                       backoff_until=int(rec["buy_after"]) if backoff else 0,
                       backoff_reason=rec.get("backoff", "") if backoff else "")

    def _machine(self, host: str) -> str:
        """``local`` for the host agent on the controller's own machine (its address a unix
        socket, as ``fuse up`` registers it, or on loopback), else the host's id. A machine
        the pool bought is a machine of its own (``ElasticHost.machine``), also when a
        ``local`` cloud runs its agent on loopback here."""
        from ...transport import on_this_machine
        if self.ctl.pool.row(host) is not None:
            return host
        row = self.store.get_host(host)
        return "local" if row and on_this_machine(row["url"]) else host

    def _images(self) -> set[str]:
        """Guest bundles the registered hosts reported, and those a linked cloud's machines get."""
        fleet = self.ctl.fleet
        hosts = {b.get("name") for h in self.store.list_hosts()
                 for b in (fleet.live(h["id"]).get("bundles") or []) if isinstance(b, dict)} if fleet else set()
        return (hosts - {None}) | self.ctl.pool.images()

    def list(self) -> list[Prewarm]:
        return [self.view(r) for r in self._records()]

    # ---- prewarm -----------------------------------------------------------------
    async def prewarm(self, image: str, opts: PrewarmOptions) -> Prewarm:
        if not image:
            raise InvalidArgument("image is required")
        kind = (opts.kind or kind_of_image(image)).lower()
        # fuse hosts run every kind as a VM; the kind decides where it may go, as in a
        # plan (a microvm or vm needs KVM, a container runs on any host: ``KVM_KINDS``)
        if kind not in ("container", "vm", "microvm"):
            raise InvalidArgument(f"kind must be container, vm or microvm, not {opts.kind!r}")
        if opts.on == "":  # (as a create's: a value that names nothing is no default)
            raise InvalidArgument("on must name where the VMs may go: auto, local, a linked cloud's name or "
                                  "host:NAME (leave it out for auto)")
        target = parse_on(opts.on)  # (host: with no machine is 400, as on a create)
        on = opts.on or "auto"
        # what `on` names must exist before the image is looked for there
        if target.kind == "host":
            if self.store.get_host(target.name) is None:
                raise NotFound(f"host {target.name} not found")
        elif target.kind == "cloud":
            self.ctl.pool.provider(target.name)  # a linked cloud, or 400 saying so
        images = self._images()
        if image not in images:  # no VM of it could ever get ready: refused before anything is bought
            raise InvalidArgument(f"no host or linked cloud has image {image!r} (a guest bundle; there are: "
                                  f"{', '.join(sorted(images)) or 'none'})")
        shape = learned_shape(image, self.ctl.vms.shape_history())
        cpus = opts.cpus or (shape[0] if shape else 1)
        mem = opts.memory_mb or (shape[1] if shape else 1024)
        # before anything is bought: hosts would refuse every standby create of another shape
        learned = [n for n, given in (("cpus", opts.cpus), ("memory_mb", opts.memory_mb)) if shape and given is None]
        check_shape(cpus, mem, " and ".join(learned))
        count = opts.count or 1
        ttl = DEFAULT_TTL_SECS if opts.ttl_secs is None else opts.ttl_secs  # (at least 1: PrewarmOptions)
        async with self._room_lock:
            pw_id = "pw-" + secrets.token_hex(3)
            self._starting.add(pw_id)  # (its machines are bought before it is stored: not orphans)
            try:
                placements, new_hosts = await self._place(on, image, kind, cpus, mem, count, ttl, opts, pw_id=pw_id)
            finally:
                self._starting.discard(pw_id)
            rec = {"id": pw_id, "image": image, "kind": kind, "cpus": cpus, "memory_mb": mem, "count": count,
                   "on": on, "ttl_secs": ttl, "expires_at": min(U64, int(time.time()) + ttl),
                   "placements": placements, "new_hosts": new_hosts, "next": 1, "instance_type": opts.instance_type,
                   "region": opts.region}
            with self.store.tx() as c:
                c.execute(insert(prewarms_t).values(id=pw_id, record=rec, created_at=time.time()))
                # (``prewarm`` names it on the wire, where the event's own ``id`` replaces this one)
                self.store.add_event("prewarm_added", {"id": pw_id, "prewarm": pw_id, "image": image,
                                                       "count": count, "placements": placements,
                                                       "new_hosts": new_hosts}, conn=c)
        asyncio.get_running_loop().create_task(self.fill())
        return self.view(rec)

    async def _place(self, on: str, image: str, kind: str, cpus: int, mem: int, count: int, ttl: int,
                     opts: PrewarmOptions, buy: bool = True, exclude: str | None = None, pw_id: str | None = None
                     ) -> tuple[dict[str, int], list[str]]:
        """Where the standby VMs go (host -> count), and the hosts bought for them
        (``buy`` False: none, only hosts already there; ``exclude``: a host they leave;
        ``pw_id``: the prewarm they are for, which the machines bought keep in their record)."""
        target = parse_on(on)
        if target.kind == "host":
            host = target.name
            # the room the live prewarms' VMs still to come will take is theirs, as on the solve's
            # path (review 33: a second prewarm pinned there was accepted on the first's room while
            # no pass had created its VMs yet, and never got ready)
            snap = {h["name"]: h for h in self._unreserved(self.ctl.pool_snapshot())}
            if host not in snap:
                raise NotFound(f"host {host} not found")
            h = snap[host]
            # (its other pins hold on a host as on a plan's choice: a machine of that type, in that region)
            if opts.instance_type and h.get("type_name") != opts.instance_type:
                raise FleetFull(f"host {host} is not a {opts.instance_type} machine "
                                f"({'a ' + h['type_name'] if h.get('type_name') else 'an own host'})")
            if opts.region and h.get("region") != opts.region:
                raise FleetFull(f"host {host} is not in region {opts.region} "
                                f"(its region: {h.get('region') or 'none'})")
            if h.get("bundles") is not None and image not in h["bundles"]:
                raise InvalidArgument(f"host {host} has no image {image!r} (its guest bundles: "
                                      f"{', '.join(sorted(h['bundles'])) or 'none'}): its VMs would never get ready")
            if h.get("state") == "unavailable":  # (why, as a create pinned there is told: cordoned, say)
                why = self.ctl.vms.arrays(only=host)[1].get(host) or "host takes no work"
                raise FleetFull(f"host {host}: {why}; no VM of the prewarm can be placed there")
            fits = min(h["free_mem_mib"] // mem, h["free_vm_slots"])
            if fits < count:
                free = next(x for x in self.ctl.pool_snapshot() if x["name"] == host)
                held = (" (the rest of its room is held for other prewarms' VMs still to be created)"
                        if min(free["free_mem_mib"] // mem, free["free_vm_slots"]) > fits else "")
                raise FleetFull(f"host {host} has room for {max(fits, 0)} of {count} VMs of {cpus} vCPUs and "
                                f"{mem} MiB{held}")
            return {host: count}, []
        pool = self.ctl.pool
        # with no cloud linked nothing can be bought: the operator's own hosts only
        local = on == "local" or not pool.cloud_names()
        # (a plan's duration is a u32: past 136 years its choice is the same)
        req = ElasticPlanRequest(count=count, image=image, kind=kind, cpus=cpus, memory_mb=mem,
                                 duration_secs=min(ttl, U32),
                                 instance_type=opts.instance_type, region=opts.region,
                                 devices_only=True if local else None, no_scale=None if buy else True,
                                 provider=on if on not in ("auto", "local") else None)
        if on not in ("auto", "local"):
            pool.provider(on)  # a linked cloud, or 400
        snapshot = [h for h in self._unreserved(self.ctl.pool_snapshot()) if h["name"] != exclude]
        if on not in ("auto", "local"):  # on a cloud: only its hosts count as already there
            snapshot = [h for h in snapshot if h.get("provider") == on]
        plan = await pool.plan(req, snapshot)
        if plan.unplaced:
            why = "; ".join(f"{u.count} VMs: {u.reason}" for u in plan.unplaced)
            # the budget's fault (or a cloud quota's or type limit's) when the same solve without them places them all
            free = await pool.plan(req, snapshot, unbounded=True)
            cls = BudgetExceeded if not free.unplaced else FleetFull
            b = pool.budget()  # the caps as the operator set them, and what runs against them
            caps = ", ".join(f"{k}={v}" for k, v in (("max_new_hosts", b.max_new_hosts), ("max_usd_per_hour",
                             b.max_usd_per_hour), ("monthly_usd", b.monthly_usd)) if v)
            raise cls(f"prewarm refused, nothing bought: {why}" + (
                f" (the budget: {caps}; {b.hosts} elastic hosts running, ${b.running_usd_per_hour:.4f}/h, "
                f"${b.month_usd:.2f} spent this month)" if cls is BudgetExceeded and caps else ""))
        if any(h.one_space for h in plan.new_hosts):
            raise FleetFull("prewarm refused, nothing bought: the plan needs one-VM sandboxes, not hosts")
        names = [a.name for a in await pool.buy(plan.new_hosts, bought_for=pw_id)] if plan.new_hosts else []
        added = names
        placements: dict[str, int] = {}
        for a in plan.assignments:
            host = a.host or names[a.new_index]
            placements[host] = placements.get(host, 0) + a.count
        return placements, added

    def _unreserved(self, snapshot: list[dict]) -> list[dict]:
        """The pool snapshot less the room the live prewarms' standby VMs still to be
        created will take (a machine bought for one prewarm is not another's room). One
        being created now (placed, its host's answer awaited) is not among them: the
        snapshot's free room has it taken already (``VmService.arrays`` counts what is being
        placed), and taken again here, a prewarm made while a fill pass created another's
        VMs was refused on a host with room for it, or bought a machine it did not need
        (review 35)."""
        placing = self._placing()
        pending: dict[str, list[int]] = {}
        for rec in self._records():
            have = self._standby(rec["id"])
            stored = {(v["host"], v["name"]) for v in have}
            for host, want in rec["placements"].items():
                creating = sum(h == host and n.rsplit("-", 1)[0] == rec["id"] for h, n in placing - stored)
                short = want - sum(v["host"] == host for v in have) - creating
                if short > 0:
                    pending.setdefault(host, []).extend([rec["memory_mb"]] * short)
        out = []
        for h in snapshot:
            if h["name"] in pending:
                taken = pending[h["name"]]
                h = h | {"free_mem_mib": max(0, h["free_mem_mib"] - sum(taken)),
                         "free_vm_slots": max(0, h["free_vm_slots"] - len(taken))}
            out.append(h)
        return out

    def _placing(self) -> set[tuple[str, str]]:
        """(host, VM name) of the creates being placed now, whose room ``VmService.arrays``
        takes: this replica's (reserved, the host's answer awaited) and the other replicas'
        (their rows in the store)."""
        vms = self.ctl.vms
        return set(vms.placing()) | {(h, n) for h, n, _, kind in vms._others() if kind == "create"}

    # ---- filling -------------------------------------------------------------------
    def _leads_fill(self) -> bool:
        """Whether this replica fills the prewarms now. Replicas sharing a store fill one at a
        time, whoever holds the lease (taken when free or lapsed, renewed by each of its fills,
        lapsing FILL_LEASE_S after its last): two filling at once each saw the same VMs missing
        and made them (a prewarm of 3 kept 5, then 8, and machines were bought for the extra).
        A claim through another replica is refilled by the holder's next pass."""
        if self.store.is_sqlite:
            return True  # (an SQLite store is one controller's)
        now, me = time.time(), self.ctl.instance
        with self.store.tx() as c:  # (the write lock: replicas read and take it in turn)
            lease = self.store.get_setting(FILL_LEASE_KEY, {}, conn=c)
            if lease.get("holder") not in (None, me) and lease.get("until", 0) > now:
                return False
            self.store.put_setting(FILL_LEASE_KEY, {"holder": me, "until": now + FILL_LEASE_S}, conn=c)
        return True

    def _keep_fill(self) -> None:
        """Before each standby create or placing of a fill pass: the lease is still this
        replica's (renewed then, so a pass longer than the lease keeps it), else FillTakenOver.
        Checked at a pass's start only, a replica that stalled past the lease mid-pass went on
        creating what it had planned after another had taken the lease and made the same VMs
        (review 34: a prewarm of 4 kept 7). A drain's hand-over is no fill pass (its own lock)."""
        if not self._filling or self.store.is_sqlite:
            return
        now, me = time.time(), self.ctl.instance
        with self.store.tx() as c:  # (the write lock, as ``_leads_fill``)
            lease = self.store.get_setting(FILL_LEASE_KEY, {}, conn=c)
            if lease.get("holder") not in (None, me):
                raise FillTakenOver(f"replica {lease['holder']} took over the prewarm fill lease while this one "
                                    "stalled past it: this one stops its pass, and that one fills the prewarms")
            self.store.put_setting(FILL_LEASE_KEY, {"holder": me, "until": now + FILL_LEASE_S}, conn=c)

    async def fill(self) -> None:
        """Create the standby VMs every live prewarm still lacks (one pass)."""
        if self._fill_lock.locked():
            return
        async with self._fill_lock:
            if not self._leads_fill():
                return
            self._filling = True
            try:
                await self._fill_pass()
            except FillTakenOver as exc:
                log.warning("prewarm refill: %s", exc)
            finally:
                self._filling = False

    async def _fill_pass(self) -> None:
        """``fill``'s pass, under the lease (each create and placing checks it: ``_keep_fill``)."""
        now = time.time()
        warm = self.ctl.pool.budget().warm
        for rec in self._records():
            if now >= rec["expires_at"]:
                await self.remove(rec["id"], reason="its TTL ended")
                continue
            try:  # (one set before the shape was checked: no VM of it can ever be created)
                check_shape(rec["cpus"], rec["memory_mb"])
            except InvalidArgument as exc:
                log.warning("prewarm %s ends: %s", rec["id"], exc.message)
                await self.remove(rec["id"], reason=exc.message)
                continue
            rec = self._drop_lost(rec)
            await self._clear_ended(rec)
            rec = await self._trim_returned(rec)
            if "early_ends" in rec and self._lived(rec, now):
                rec = self._get(rec["id"]) or rec
                self._reset_backoff(rec)
                self._save(rec)
                log.info("prewarm %s: a machine bought for it lived %d s: its purchases back off no more",
                         rec["id"], LIVED_SECS)
            initial = rec.get("next", 1) - 1 < rec["count"]  # never filled yet: warm or not
            if not (warm or initial):
                continue
            if (missing := rec["count"] - sum(rec["placements"].values())) > 0:
                # VMs a lost host held: all at once where they fit together, else one
                # (a budget with room for one more machine keeps some ready)
                placed = await self._place_again(rec, missing, say=missing == 1)
                if placed is None and missing > 1:
                    placed = await self._place_again(rec, 1)
                if placed is not None and placed[0] is None:
                    continue  # it ended meanwhile
                rec = placed[0] if placed is not None else rec
            # (a draining host's are the drain's to hand over, once the VMs with work have moved:
            # placed again at once, they took the room those needed on the drain's targets)
            rec = await self._off_cordoned(rec)
            if rec is None:
                continue  # it ended meanwhile
            rec = await self._off_away(rec)
            if rec is None:
                continue
            await self._fill_places(rec)

    async def hand_over(self, host: str) -> None:
        """A drain's last step: the standby VMs on draining ``host`` are placed again elsewhere
        (created there, the budget's ``warm`` on or off: the prewarm's count is unchanged) and
        removed from it, as off a cordoned host; those nothing has room for stay."""
        async with self._fill_lock:
            for rec in self._records():
                if rec["expires_at"] <= time.time() or parse_on(rec["on"]).kind == "host":
                    continue
                if not any(v["host"] == host for v in self._standby(rec["id"])):
                    continue
                moved = await self._leave(rec, host)
                if moved is not None and moved is not rec:
                    await self._fill_places(moved, {h: n - rec["placements"].get(h, 0)
                                                    for h, n in moved["placements"].items()})

    async def _fill_places(self, rec: dict, only: dict[str, int] | None = None) -> None:
        """Create the standby VMs ``rec``'s placements lack (``only``: at most that many a host)."""
        have = self._standby(rec["id"])
        for host, want in list(rec["placements"].items()):
            short = want - sum(v["host"] == host for v in have)
            if only is not None:
                short = min(short, only.get(host, 0))
            for _ in range(max(0, short)):
                if not await self._create_one(rec, host):
                    break

    async def _off_cordoned(self, rec: dict) -> dict | None:
        """Prewarm ``rec``'s standby VMs leave the cordoned hosts, and those whose machine is
        cordoned or draining under another name (``_leave``); the record then, None when the
        prewarm ended meanwhile. A pinned prewarm's wait there."""
        if parse_on(rec["on"]).kind == "host":
            return rec
        have = self._standby(rec["id"])
        states = self._work_states()
        for host in [h for h in rec["placements"] if any(v["host"] == h for v in have)]:
            state, name = states.get(host, ("", host))
            # (a machine draining under another name: that drain hands over the VMs listed under it only)
            if state == "cordoned" or (state == "draining" and name != host):
                rec = await self._leave(rec, host)
                if rec is None:
                    return None
        return rec

    async def _leave(self, rec: dict, host: str) -> dict | None:
        """Place prewarm ``rec``'s VMs on cordoned ``host`` again elsewhere (its own solve,
        within its ``on``, never ``host``), then delete its standby VMs there. The record as
        stored then (unchanged when nothing has room: they stay), None when the prewarm
        ended meanwhile."""
        from .reconcile import scaler_cordoned

        n = rec["placements"].get(host, 0)
        if n <= 0:
            return rec
        # scale-in cordoned it as the other hosts have room for them: nothing is bought for them
        placed = await self._place_again(rec, n, off=host, buy=host not in scaler_cordoned(self.ctl.pool, time.time()))
        if placed is None:
            return rec  # no room: they stay, and the next pass tries again
        if placed[0] is None:
            return None
        rec = placed[0]
        left = 0
        for v in [v for v in self._standby(rec["id"]) if v["host"] == host][:n]:
            try:
                await self.ctl.vms.delete(v["name"], host)
            except NotFound:
                pass  # (gone already: another delete, or the host, removed it first)
            except FuseError as exc:
                left += 1
                log.warning("prewarm %s: removing %s from cordoned %s: %s", rec["id"], v["name"], host, exc.message)
        if left and (stored := self._get(rec["id"])) is not None:  # (deleted once it answers: ``_trim_returned``)
            rec = self._left_on(stored, host, left)
        log.info("prewarm %s: %d VMs leave cordoned host %s for %s", rec["id"], n, host, ", ".join(placed[1]) or "-")
        return rec

    async def _off_away(self, rec: dict) -> dict | None:
        """Prewarm ``rec``'s placements on hosts away (``_away``) go where its own solve puts
        them now (buying under the budget, as for a lost host's): a prewarm is VMs ready now,
        and such a host's are not. Its standby VMs stay listed there; the ones it no longer
        holds a place for are deleted when it answers again (``_trim_returned``). A pinned
        prewarm's wait for their host. The record then, None when the prewarm ended."""
        if parse_on(rec["on"]).kind == "host":
            return rec
        for host in [h for h in rec["placements"] if self._away(h)]:
            n = rec["placements"].get(host, 0)
            if self._never_joined(host) and host in rec["new_hosts"] and not rec.get("never_joined", {}).get(host):
                # a machine bought for it that never joined ended early as surely as one its cloud
                # ended (a broken image or network would have one bought after another): counted
                # once for the backoff, stored before the placing reads it
                rec = self._get(rec["id"]) or rec
                rec["never_joined"] = {**rec.get("never_joined", {}), host: True}
                row = self.ctl.pool.row(host)
                self._early_end(rec, f"{host}, {row['type_name']} in cloud {row['provider']}, never joined "
                                     "(offline past its boot time and the join grace)")
                self._save(rec)
            placed = await self._place_again(rec, n, off=host)
            if placed is None:
                # no room elsewhere: they wait there, and the next pass tries again; a machine that
                # never joined holds them for nothing (and may be what fills a cap): see _unplan
                self._unplan(rec, host)
                continue
            if placed[0] is None:
                return None
            rec = self._left_on(placed[0], host, n)
            if self._never_joined(host):
                log.warning("prewarm %s: machine %s never joined (offline): its %d VMs are placed again on %s",
                            rec["id"], host, n, ", ".join(placed[1]) or "-")
                self._unplan(rec, host)
                continue
            log.warning("prewarm %s: host %s has not answered for %d s: its %d VMs are placed again on %s", rec["id"],
                        host, AWAY_SECS, n, ", ".join(placed[1]) or "-")
        return rec

    def _unplan(self, rec: dict, host: str) -> None:
        """A machine bought for prewarm ``rec`` that never joined (``_never_joined``) has no work
        planned any more: scale-in ends it as any idle machine (it was kept, and paid, to the
        prewarm's TTL). Placed elsewhere, its VMs are; when nothing had room (a cap it counts
        against), once it is gone they are lost and the refill buys for them within the caps."""
        if host not in rec["new_hosts"] or not self._never_joined(host):
            return
        row = self.ctl.pool.row(host)
        if (row["record"] or {}).get("planned_until", 0) > time.time():
            self.ctl.pool.work_ended(host)
            log.warning("prewarm %s: machine %s, bought for it, never joined: it goes once scale-in finds it idle",
                        rec["id"], host)

    def _left_on(self, rec: dict, host: str, n: int) -> dict:
        """``rec`` (stored so) with ``n`` more of its standby VMs left on ``host`` to delete once
        it answers (``_trim_returned``)."""
        away = rec.setdefault("away_left", {})
        away[host] = away.get(host, 0) + n
        self._save(rec)
        return rec

    async def _trim_returned(self, rec: dict) -> dict:
        """A host ``_off_away`` moved prewarm ``rec``'s placements off answers again: its standby
        VMs beyond the place it still holds go (the ones not ready first). One lost meanwhile
        has nothing left to trim."""
        if not rec.get("away_left"):
            return rec
        for host, n in list(rec["away_left"].items()):
            if not self._lost(host) and not self._answers(host):
                continue
            there = [v for v in self._standby(rec["id"]) if v["host"] == host]
            extra = min(n, len(there) - rec["placements"].get(host, 0))
            for v in sorted(there, key=_ready)[:max(0, extra)]:
                try:
                    await self.ctl.vms.delete(v["name"], host)
                except FuseError as exc:
                    log.warning("prewarm %s: removing %s from %s, back: %s", rec["id"], v["name"], host, exc.message)
            stored = self._get(rec["id"])
            if stored is None:
                return rec
            rec = stored
            rec.get("away_left", {}).pop(host, None)
            self._save(rec)
        return rec

    def _drop_lost(self, rec: dict) -> dict:
        """``rec`` with no placement on a lost host (stored so): the VMs it held are
        missing now, for the refill to place again; what the store still lists of
        them on a machine that is gone is forgotten."""
        lost = [h for h in rec["placements"] if self._lost(h)]
        if not lost:
            return rec
        rec = self._get(rec["id"]) or rec  # (as stored now: a claim's refill may have moved one)
        for host in lost:
            self._forget(host, rec["id"])
            if rec["placements"].pop(host, 0):
                log.warning("prewarm %s: host %s will not come back: its VMs are placed again", rec["id"], host)
                self._host_ended(rec, host)
        self._save(rec)
        return rec

    async def _clear_ended(self, rec: dict) -> None:
        """Delete prewarm ``rec``'s standby VMs whose run ended (a guest crash, its QEMU
        killed): none of them is ready or claimed again, and the refill, counting only the
        others, replaces them. One on a host away now is deleted by a later pass."""
        for v in self._standby(rec["id"], ended=True):
            if v["state"] in FINISHED and self._answers(v["host"]):
                try:
                    await self.ctl.vms.delete(v["name"], v["host"])
                    log.warning("prewarm %s: standby VM %s on %s ended (%s): replaced", rec["id"], v["name"],
                                v["host"], v["state"])
                except FuseError as exc:
                    log.warning("prewarm %s: removing ended %s: %s", rec["id"], v["name"], exc.message)

    # ---- backoff (see the module docstring) ----------------------------------------
    def _host_ended(self, rec: dict, host: str) -> None:
        """Prewarm ``rec`` (changed in place: the caller stores it) lost ``host``. When the
        cloud ended that machine: an early end if it had not lived ``LIVED_SECS`` since it was
        bought, else a machine that lived (the count starts again). A host removed on purpose
        (by hand, scale-in, its TTL) or one of the operator's own is nobody's fault; one not
        bought for this prewarm (added by hand, or bought for other work) is not its purchase
        (review 33: a hand-added machine counted, and the first one bought was not rebought)."""
        row = self.ctl.pool.row(host)
        if row is None or row["state"] != "gone" or not (row["record"] or {}).get("ended_by_cloud"):
            return
        if host not in rec.get("new_hosts", ()) and (row["record"] or {}).get("prewarm") != rec["id"]:
            return
        lived = (row["ended"] or time.time()) - row["started"]
        if lived >= LIVED_SECS:
            self._reset_backoff(rec)
        else:
            self._early_end(rec, f"{host}, {row['type_name']} in cloud {row['provider']}, ended by the cloud "
                                 f"{lived:.0f} s after it was bought")

    def _early_end(self, rec: dict, why: str) -> None:
        """Count one more early end of a machine bought for prewarm ``rec`` (changed in place:
        the caller stores it), ``why``; from the second in a row, its refill buys nothing for
        ``backoff_secs``, and says so (a warning, a ``prewarm_backoff`` event)."""
        now = time.time()
        n = rec.get("early_ends", 0) + 1
        rec["early_ends"], rec["last_early_end"] = n, now
        wait = backoff_secs(n)
        if not wait:
            return
        until = now + wait
        rec["buy_after"] = until
        rec["backoff"] = (f"{n} machines bought for it in a row ended early (the last: {why}): no machine is "
                          f"bought for it for {wait} s, until {time.strftime('%H:%M:%S UTC', time.gmtime(until))}")
        log.warning("prewarm %s: %s", rec["id"], rec["backoff"])
        self.store.add_event("prewarm_backoff", {"prewarm": rec["id"], "early_ends": n, "until": int(until),
                                                 "reason": rec["backoff"]})

    def _lived(self, rec: dict, now: float) -> bool:
        """A machine bought after the last early end of prewarm ``rec`` holds some of its VMs
        and has run ``LIVED_SECS``: the cloud keeps machines again."""
        since = rec.get("last_early_end", now)
        for host in rec["placements"]:
            row = self.ctl.pool.row(host)
            if (row is not None and row["state"] in ("joined", "cordoned") and row["started"] >= since
                    and now - row["started"] >= LIVED_SECS):
                return True
        return False

    @staticmethod
    def _reset_backoff(rec: dict) -> None:
        for key in ("early_ends", "last_early_end", "buy_after", "backoff"):
            rec.pop(key, None)

    def _forget(self, host: str, pw_id: str | None = None) -> None:
        """Drop the store's rows of the standby VMs on ``host``, a machine that is gone
        (they went with it), of prewarm ``pw_id`` or of any."""
        gone = [v["name"] for v in self.store.vms_on(host) if (v["record"] or {}).get("standby")
                and (pw_id is None or v["name"].startswith(pw_id + "-"))]
        with self.store.tx() as c:
            for name in gone:
                c.execute(vms_t.delete().where(vms_t.c.host == host, vms_t.c.name == name))
                self.store.add_event("vm_removed", {"vm": name, "id": host}, host=host, conn=c)

    def _take_number(self, pw_id: str) -> int | None:
        """The next standby VM's number in prewarm ``pw_id`` (taken: stored at once), None once it ended."""
        rec = self._get(pw_id)
        if rec is None:
            return None
        n = rec.get("next", 1)
        self._save(rec | {"next": n + 1})
        return n

    async def _create_standby(self, body: dict) -> None:
        """A standby VM's create, counted by its shape while it is under way (``refilled``)."""
        self._keep_fill()
        key = (body["shape"]["vcpus"], body["shape"]["mem_mib"], body["bundle"], body["host"])
        self._creating[key] = self._creating.get(key, 0) + 1
        try:
            await self.ctl.vms.create(body)
        finally:
            self._creating[key] -= 1
            if not self._creating[key]:
                del self._creating[key]

    async def refilled(self, vcpus: int, mem_mib: int, bundle: str, among: set[str] | None,
                       timeout: float = REFILL_WAIT_S) -> None:
        """Once no standby VM of this shape is being created on a host of ``among`` (None: any;
        ``timeout`` at most). A create that found no room while a claim's refill was creating VMs
        of its shape in the room the claim freed claims one of those (it was ``fleet_full``, the
        room going to VMs it could have claimed a moment later)."""
        def under_way() -> bool:
            return any(k[:3] == (vcpus, mem_mib, bundle) and (among is None or k[3] in among) for k in self._creating)
        deadline = time.monotonic() + timeout
        while under_way() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _create_one(self, rec: dict, host: str) -> bool:
        view = self.ctl.fleet.views.get(host) if self.ctl.fleet else None
        if view is None or not view.connected:
            return False  # a machine still joining, or a host away for a moment: the next pass
        if (full := self._full.get((rec["id"], host))) and time.monotonic() < full[0]:
            return False  # its host had no room a moment ago: tried again once the wait is over
        n = self._take_number(rec["id"])
        if n is None:
            return False
        rec["next"] = n + 1
        body = {"name": f"{rec['id']}-{n}", "standby": True, "bundle": rec["image"],
                "shape": {"vcpus": rec["cpus"], "mem_mib": rec["memory_mb"]}}
        try:
            await self._create_standby(body | {"host": host})
            self._no_room.pop(rec["id"], None)
            self._room_again(rec["id"], host)
            return not await self._unless_removed(rec["id"], body["name"], host)
        except FuseError as exc:
            full = exc.code in ("fleet_full", "host_full")
            if parse_on(rec["on"]).kind == "host" and full:  # (pinned: it waits for room there)
                self._full_at(rec["id"], host, (exc.details or {}).get("hosts", {}).get(host) or exc.message)
                return False
            if parse_on(rec["on"]).kind == "host" or not full:
                # (said once for the same reason: every pass asks again)
                why = f"on {host}: {exc.message}"
                if self._no_room.get(rec["id"]) != why:
                    log.warning("prewarm %s %s", rec["id"], why)
                    self._no_room[rec["id"]] = why
                return False
        # a claim left its VM running where the standby one was: the refill goes where
        # the same solve as the prewarm's puts it (within its ``on``: auto, local, a
        # cloud), and the placement follows it
        placed = await self._place_again(rec, 1, off=host)
        if placed is None:
            self._full_at(rec["id"], host)  # (no room elsewhere either: the placing said why)
            return False
        if placed[0] is None:
            return False
        rec, where, bought = placed
        if bought:
            return False  # a machine joining: the next pass creates the VM there
        (to,) = where
        try:
            await self._create_standby(body | {"host": to})
        except FuseError as exc:
            log.warning("prewarm %s on %s: %s", rec["id"], to, exc.message)
            return False
        return not await self._unless_removed(rec["id"], body["name"], to)

    def _full_at(self, pw_id: str, host: str, why: str | None = None) -> None:
        """Prewarm ``pw_id``'s standby create on ``host`` found no room (``why``: the host's
        answer, said once for the episode; None: said by the placing): its next try there
        waits ROOM_RETRY_FIRST_S, doubling with each such try in a row, at most
        ROOM_RETRY_MAX_S; placing VMs there again (the solve sees room) ends the wait."""
        last = self._full.get((pw_id, host))
        wait = min(ROOM_RETRY_MAX_S, last[1] * 2) if last else ROOM_RETRY_FIRST_S
        self._full[pw_id, host] = (time.monotonic() + wait, wait)
        if last is None and why is not None:
            log.warning("prewarm %s: host %s has no room for its standby VMs (%s): they wait for room there, "
                        "the create tried again after %g s, backing off to once every %g s", pw_id, host, why,
                        wait, ROOM_RETRY_MAX_S)

    def _room_again(self, pw_id: str, host: str) -> None:
        """A standby create of prewarm ``pw_id`` on ``host`` found room: its wait there ends."""
        if self._full.pop((pw_id, host), None) is not None:
            log.info("prewarm %s: host %s had room again for its standby VMs", pw_id, host)

    async def _place_again(self, rec: dict, n: int, off: str | None = None, say: bool = True, buy: bool = True
                           ) -> tuple[dict | None, dict[str, int], list[str]] | None:
        self._keep_fill()  # (a placing may buy machines)
        async with self._room_lock:  # (as a new prewarm's placing: ``_room_lock``)
            return await self._placed_again(rec, n, off, say, buy)

    async def _placed_again(self, rec: dict, n: int, off: str | None, say: bool, buy: bool
                            ) -> tuple[dict | None, dict[str, int], list[str]] | None:
        """Place ``n`` VMs of prewarm ``rec`` where its own solve puts them (buying under
        the budget and pins when no host has room, unless ``buy`` is False), taking them
        off host ``off``, which the solve leaves out (None: VMs no placement holds, their
        host lost). The record as stored then, where the
        VMs go and the machines bought; None when there is no room (``say``: logged,
        once for the same reason, as every pass retries), the record None when the
        prewarm ended meanwhile."""
        opts = PrewarmOptions(on=rec["on"], instance_type=rec.get("instance_type"), region=rec.get("region"))
        stored = self._get(rec["id"]) or rec  # (as stored: a loss noted since rec was read sets a backoff)
        buy = buy and time.time() >= stored.get("buy_after", 0)  # backing off: hosts already there only
        args = (rec["on"], rec["image"], rec["kind"], rec["cpus"], rec["memory_mb"], n,
                max(1, int(rec["expires_at"] - time.time())), opts)
        try:
            where, bought = await self._place(*args, buy=buy, exclude=off, pw_id=rec["id"])
        except FuseError as exc:
            if buy and exc.code == "cloud_error" and (stored := self._get(rec["id"])) is not None:
                # the cloud refused the machine: as one it ended at once (the next pass would ask again)
                self._early_end(stored, f"the cloud refused it: {exc.message}")
                self._save(stored)
            why = exc.message if buy else f"{exc.message} ({stored.get('backoff', 'backing off')})"
            if say and self._no_room.get(rec["id"]) != why:
                log.warning("prewarm %s: no room to refill: %s", rec["id"], why)
                self._no_room[rec["id"]] = why
            return None
        self._no_room.pop(rec["id"], None)
        pw_id = rec["id"]
        for to in where:  # (the solve sees room there: a wait for room on it is over)
            self._full.pop((pw_id, to), None)
        rec = self._get(pw_id)
        if rec is None:  # ended meanwhile: what was bought for it goes as it would have
            for name in bought:
                with contextlib.suppress(FuseError):
                    await self.ctl.pool.remove(name, f"its prewarm {pw_id} ended", prewarm=pw_id)
            return None, where, bought
        moved = dict(rec["placements"])
        if off is not None:
            moved[off] = moved.get(off, 0) - n
        for to, k in where.items():
            moved[to] = moved.get(to, 0) + k
        rec["placements"] = {h: c for h, c in moved.items() if c > 0}
        rec["new_hosts"] = list(rec["new_hosts"]) + list(bought)
        self._save(rec)
        return rec, where, bought

    async def _unless_removed(self, pw_id: str, name: str, host: str) -> bool:
        """A standby VM whose prewarm ended while it booted goes at once (True)."""
        if self._get(pw_id) is not None:
            return False
        try:
            await self.ctl.vms.delete(name, host)
        except FuseError as exc:
            log.warning("prewarm %s ended: removing %s: %s", pw_id, name, exc.message)
        return True

    # ---- claiming ------------------------------------------------------------------
    def candidates(self, vcpus: int, mem_mib: int, bundle: str, among: set[str] | None) -> list[dict]:
        """Standby VMs of a live prewarm with this shape (controller store rows), ready ones first,
        on hosts placement may use: a claim is a placement, so a host cordoned or draining (by
        the operator, a drain or scale-in; under any name of its machine) gives none of its standby
        VMs to a create, which takes one elsewhere or boots one anew."""
        records = self._records()
        live = {r["id"] for r in records if r["expires_at"] > time.time()}
        trimming = {(r["id"], h) for r in records for h in r.get("away_left", {})}  # (``_trim_returned``'s)
        active = {h for h, (state, _) in self._work_states().items() if state == "active"}
        answers: dict[str, bool] = {}  # (a host away or lost would leave the create waiting on it)
        out = []
        for v in self.store.list_vms():
            rec = v["record"] or {}
            pw = v["name"].rsplit("-", 1)[0]
            if (rec.get("standby") and v["state"] == "running" and pw in live and v["vcpus"] == vcpus
                    and v["mem_mib"] == mem_mib and rec.get("bundle", "linux") == bundle
                    and (among is None or v["host"] in among) and v["host"] in active
                    and (pw, v["host"]) not in trimming
                    and answers.setdefault(v["host"], self._answers(v["host"]))):
                out.append(v)
        return sorted(out, key=lambda v: not _ready(v))  # a booting one makes its claim wait for the boot

    # ---- ending --------------------------------------------------------------------
    async def remove(self, pw_id: str, reason: str = "removed") -> bool:
        """End prewarm ``pw_id``: its standby VMs go, and the machines bought for it
        go too when nothing else is there (a VM, another prewarm's standby VMs or
        placement: then scale-in decides once it is idle). False: no such prewarm."""
        rec = self._get(pw_id)
        if rec is None:
            return False
        for key in [k for k in self._full if k[0] == pw_id]:
            del self._full[key]
        with self.store.tx() as c:
            c.execute(delete(prewarms_t).where(prewarms_t.c.id == pw_id))
            self.store.add_event("prewarm_removed", {"id": pw_id, "prewarm": pw_id, "reason": reason}, conn=c)
        for v in self._standby(pw_id, ended=True):
            try:
                await self.ctl.vms.delete(v["name"], v["host"])
            except FuseError as exc:
                log.warning("prewarm %s: removing %s: %s", pw_id, v["name"], exc.message)
        for host in rec["new_hosts"]:
            try:  # (only when nothing else is there: another prewarm's standby VMs keep it)
                await self.ctl.pool.remove(host, f"its prewarm {pw_id} ended", prewarm=pw_id)
            except FuseError as exc:
                log.info("prewarm %s ended: its machine %s stays: %s", pw_id, host, exc.message)
                self.ctl.pool.work_ended(host)
        return True

    def end_orphaned(self, now: float) -> list[str]:
        """Machines bought for a prewarm that is no more, still planned for its work: their
        planned time ends now (``work_ended``), so scale-in removes them once idle. A
        controller killed while it ended the prewarm (its row goes first), or while it bought
        for one not stored yet, left them idle and billed until the prewarm's TTL (10 days,
        or for good) with nothing left to end them. On a store shared by replicas another
        may be placing one right now: there, a machine is an orphan ORPHAN_GRACE_S after
        it was bought. The names whose time was ended."""
        with self.store.read() as c:
            live = {r[0] for r in c.execute(select(prewarms_t.c.id))}
        grace = 0.0 if self.store.is_sqlite else ORPHAN_GRACE_S
        ended = []
        for r in self.ctl.pool.rows():
            rec = r["record"] or {}
            pw = rec.get("prewarm")
            if (not pw or pw in live or pw in self._starting or r["state"] == "gone" or r["expires"]
                    or rec.get("planned_until", 0) <= now or now - r["started"] < grace):
                continue
            log.warning("elastic host %s was bought for prewarm %s, which is no more: it goes once idle",
                        r["name"], pw)
            self.ctl.pool.work_ended(r["name"])
            ended.append(r["name"])
        return ended

    def pinned_to(self, host: str) -> list[str]:
        """The prewarms pinned to ``host`` (``on: host:NAME``): their VMs go nowhere else."""
        return sorted(r["id"] for r in self._records()
                      if (t := parse_on(r["on"])).kind == "host" and t.name == host)

    def left_on(self, host: str) -> set[str]:
        """The prewarms whose standby VMs on ``host`` were placed again elsewhere and wait there
        to be deleted once it answers (``_left_on``)."""
        return {r["id"] for r in self._records() if (r.get("away_left") or {}).get(host, 0) > 0}

    def room_hosts(self, pw_id: str) -> frozenset[str] | None:
        """The hosts prewarm ``pw_id``'s VMs may be placed on again: those its ``on`` allows (the
        host it is pinned to; on auto every registered host) that list its image. None when
        there is no such prewarm."""
        rec = self._get(pw_id)
        if rec is None:
            return None
        target = parse_on(rec["on"])
        if target.kind == "host":
            return frozenset({target.name})
        try:
            among = self.ctl.vms._among(rec["on"])
        except FuseError:  # (its cloud unlinked since: none of its hosts are left)
            return frozenset()
        views = self.ctl.fleet.views if self.ctl.fleet else {}
        hosts = among if among is not None else {h["id"] for h in self.store.list_hosts()}
        return frozenset(h for h in hosts if (v := views.get(h)) is None or v.summary.get("bundles") is None
                         or rec["image"] in {b.get("name") for b in v.summary["bundles"]})

    def placed_on(self, host: str) -> set[str]:
        """The prewarms with a placement on ``host`` (its VMs there, or still to come)."""
        return {r["id"] for r in self._records() if r["placements"].get(host, 0) > 0}

    async def release_host(self, host: str, gone: bool = False) -> None:
        """Before ``host`` goes (removed, its TTL ended), or once its machine is ``gone``
        (the cloud ended it): its standby VMs go — forgotten when the machine went with
        them, there being nobody to ask — and no prewarm keeps a placement there: the
        next refill places those VMs again through the prewarm's solve."""
        if gone:
            self._forget(host)
            for pw_id in self.pinned_to(host):  # (they could never be ready again)
                await self.remove(pw_id, f"the host it is pinned to, {host}, is gone")
        for v in self.store.vms_on(host):
            if (v["record"] or {}).get("standby"):
                try:
                    await self.ctl.vms.delete(v["name"], host)
                except FuseError:
                    pass
        for rec in self._records():
            if host in rec["placements"]:
                rec["placements"].pop(host)
                if gone:
                    self._host_ended(rec, host)
                self._save(rec)
                log.warning("prewarm %s: host %s goes: its VMs are placed again", rec["id"], host)
        self.ctl.pool.wake()  # (its pass refills them)
