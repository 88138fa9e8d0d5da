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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from sqlalchemy import delete, insert, select, update

from ...errors import FleetFull, FuseError, InvalidArgument, NotFound
from ...models.pool import ElasticPlanRequest, Prewarm, PrewarmOptions, PrewarmPlacement
from ..store import prewarms as prewarms_t
from ..target import parse_on
from .elastic import BudgetExceeded
from .request import kind_of_image, learned_shape, history_from_vms

log = logging.getLogger("fuse.controller.pool")
DEFAULT_TTL_SECS = 3600
JOIN_WAIT_SECS = 600  # a machine bought for a prewarm may take this long to join


def _ready(v: dict) -> bool:
    """A standby VM whose guest waits for its entry now (the host saw its standby mark)."""
    return v["state"] == "running" and bool((v["record"] or {}).get("ready"))


class PrewarmService:
    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self._fill_lock = asyncio.Lock()
        self._no_room: dict[str, str] = {}  # per prewarm: why its refill last found no room (said once)

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

    def _standby(self, pw_id: str) -> list[dict]:
        """The standby VMs of prewarm ``pw_id`` (controller store rows)."""
        return [v for v in self.store.list_vms()
                if v["name"].startswith(pw_id + "-") and (v["record"] or {}).get("standby")]

    def view(self, rec: dict[str, Any]) -> Prewarm:
        vms = self._standby(rec["id"])
        placements = []
        for host, want in rec["placements"].items():
            on = [v for v in vms if v["host"] == host]
            placements.append(PrewarmPlacement(host=host, machine=self._machine(host), count=want,
                                               ready=sum(_ready(v) for v in on)))
        return Prewarm(id=rec["id"], image=rec["image"], kind=rec["kind"], cpus=rec["cpus"],
                       memory_mb=rec["memory_mb"], count=rec["count"], ready=sum(p.ready for p in placements),
                       placements=placements, expires_at=rec["expires_at"], new_hosts=rec["new_hosts"])

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
        # plan (a microvm needs KVM, a container or vm runs on any host)
        if kind not in ("container", "vm", "microvm"):
            raise InvalidArgument(f"kind must be container, vm or microvm, not {opts.kind!r}")
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
        shape = learned_shape(image, history_from_vms(self.ctl.vms.list()))
        cpus = opts.cpus or (shape[0] if shape else 1)
        mem = opts.memory_mb or (shape[1] if shape else 1024)
        count = opts.count or 1
        ttl = DEFAULT_TTL_SECS if opts.ttl_secs is None else opts.ttl_secs  # (at least 1: PrewarmOptions)
        placements, new_hosts = await self._place(on, image, kind, cpus, mem, count, ttl, opts)
        pw_id = "pw-" + secrets.token_hex(3)
        rec = {"id": pw_id, "image": image, "kind": kind, "cpus": cpus, "memory_mb": mem, "count": count, "on": on,
               "ttl_secs": ttl, "expires_at": int(time.time() + ttl), "placements": placements,
               "new_hosts": new_hosts, "next": 1, "instance_type": opts.instance_type, "region": opts.region}
        with self.store.tx() as c:
            c.execute(insert(prewarms_t).values(id=pw_id, record=rec, created_at=time.time()))
            self.store.add_event("prewarm_added", {"id": pw_id, "image": image, "count": count,
                                                   "placements": placements, "new_hosts": new_hosts}, conn=c)
        asyncio.get_running_loop().create_task(self.fill())
        return self.view(rec)

    async def _place(self, on: str, image: str, kind: str, cpus: int, mem: int, count: int, ttl: int,
                     opts: PrewarmOptions) -> tuple[dict[str, int], list[str]]:
        """Where the standby VMs go (host -> count), and the hosts bought for them."""
        target = parse_on(on)
        if target.kind == "host":
            host = target.name
            snap = {h["name"]: h for h in self.ctl.pool_snapshot()}
            if host not in snap:
                raise NotFound(f"host {host} not found")
            h = snap[host]
            if h.get("bundles") is not None and image not in h["bundles"]:
                raise InvalidArgument(f"host {host} has no image {image!r} (its guest bundles: "
                                      f"{', '.join(sorted(h['bundles'])) or 'none'}): its VMs would never get ready")
            fits = min(h["free_mem_mib"] // mem, h["free_vm_slots"])
            if h.get("state") == "unavailable" or fits < count:
                raise FleetFull(f"host {host} has room for {max(fits, 0) if h.get('state') != 'unavailable' else 0} "
                                f"of {count} VMs of {cpus} vCPUs and {mem} MiB")
            return {host: count}, []
        pool = self.ctl.pool
        # with no cloud linked nothing can be bought: the operator's own hosts only
        local = on == "local" or not pool.cloud_names()
        req = ElasticPlanRequest(count=count, image=image, kind=kind, cpus=cpus, memory_mb=mem, duration_secs=ttl,
                                 instance_type=opts.instance_type, region=opts.region,
                                 devices_only=True if local else None,
                                 provider=on if on not in ("auto", "local") else None)
        if on not in ("auto", "local"):
            pool.provider(on)  # a linked cloud, or 400
        snapshot = self._unreserved(self.ctl.pool_snapshot())
        if on not in ("auto", "local"):  # on a cloud: only its hosts count as already there
            snapshot = [h for h in snapshot if h.get("provider") == on]
        plan = await pool.plan(req, snapshot)
        if plan.unplaced:
            why = "; ".join(f"{u.count} VMs: {u.reason}" for u in plan.unplaced)
            # the budget's fault when the same solve without its caps places them all
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
        names = [a.name for a in await pool.buy(plan.new_hosts)] if plan.new_hosts else []
        added = names
        placements: dict[str, int] = {}
        for a in plan.assignments:
            host = a.host or names[a.new_index]
            placements[host] = placements.get(host, 0) + a.count
        return placements, added

    def _unreserved(self, snapshot: list[dict]) -> list[dict]:
        """The pool snapshot less the room the live prewarms' standby VMs still to be
        created will take (a machine bought for one prewarm is not another's room)."""
        pending: dict[str, list[int]] = {}
        for rec in self._records():
            have = self._standby(rec["id"])
            for host, want in rec["placements"].items():
                short = want - sum(v["host"] == host for v in have)
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

    # ---- filling -------------------------------------------------------------------
    async def fill(self) -> None:
        """Create the standby VMs every live prewarm still lacks (one pass)."""
        if self._fill_lock.locked():
            return
        async with self._fill_lock:
            now = time.time()
            warm = self.ctl.pool.budget().warm
            for rec in self._records():
                if now >= rec["expires_at"]:
                    await self.remove(rec["id"], reason="its TTL ended")
                    continue
                have = self._standby(rec["id"])
                initial = rec.get("next", 1) - 1 < rec["count"]  # never filled yet: warm or not
                if not (warm or initial):
                    continue
                for host, want in list(rec["placements"].items()):
                    short = want - sum(v["host"] == host for v in have)
                    for _ in range(max(0, short)):
                        if not await self._create_one(rec, host):
                            break

    async def _create_one(self, rec: dict, host: str) -> bool:
        view = self.ctl.fleet.views.get(host) if self.ctl.fleet else None
        if view is None or not view.connected:
            return False  # a machine still joining: the next pass
        n = rec.get("next", 1)
        rec["next"] = n + 1
        with self.store.tx() as c:
            c.execute(update(prewarms_t).where(prewarms_t.c.id == rec["id"]).values(record=rec))
        body = {"name": f"{rec['id']}-{n}", "standby": True, "bundle": rec["image"],
                "shape": {"vcpus": rec["cpus"], "mem_mib": rec["memory_mb"]}}
        try:
            await self.ctl.vms.create(body | {"host": host})
            return not await self._unless_removed(rec["id"], body["name"], host)
        except FuseError as exc:
            if rec["on"] != "auto" or exc.code not in ("fleet_full", "host_full"):
                log.warning("prewarm %s on %s: %s", rec["id"], host, exc.message)
                return False
        # a claim left its VM running where the standby one was: the refill goes where
        # the same solve as the prewarm's puts it (buying under the budget and pins when
        # no host has room), and the placement follows it
        opts = PrewarmOptions(on=rec["on"], instance_type=rec.get("instance_type"), region=rec.get("region"))
        try:
            where, bought = await self._place(rec["on"], rec["image"], rec["kind"], rec["cpus"], rec["memory_mb"],
                                              1, max(1, int(rec["expires_at"] - time.time())), opts)
        except FuseError as exc:
            if self._no_room.get(rec["id"]) != exc.message:  # (every pass retries: said once)
                log.warning("prewarm %s: no room to refill: %s", rec["id"], exc.message)
            self._no_room[rec["id"]] = exc.message
            return False
        self._no_room.pop(rec["id"], None)
        (to,) = where
        pw_id = rec["id"]
        rec = self._get(pw_id)
        if rec is None:  # ended meanwhile: what was bought for it goes as it would have
            for name in bought:
                with contextlib.suppress(FuseError):
                    await self.ctl.pool.remove(name, f"its prewarm {pw_id} ended")
            return False
        moved = dict(rec["placements"])
        moved[host] = moved.get(host, 0) - 1
        moved[to] = moved.get(to, 0) + 1
        rec["placements"] = {h: c for h, c in moved.items() if c > 0}
        rec["new_hosts"] = list(rec["new_hosts"]) + list(bought)
        with self.store.tx() as c:
            c.execute(update(prewarms_t).where(prewarms_t.c.id == rec["id"]).values(record=rec))
        if bought:
            return False  # a machine joining: the next pass creates the VM there
        try:
            await self.ctl.vms.create(body | {"host": to})
        except FuseError as exc:
            log.warning("prewarm %s on %s: %s", rec["id"], to, exc.message)
            return False
        return not await self._unless_removed(rec["id"], body["name"], to)

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
        """Standby VMs of a live prewarm with this shape (controller store rows), ready ones first."""
        live = {r["id"] for r in self._records() if r["expires_at"] > time.time()}
        out = []
        for v in self.store.list_vms():
            rec = v["record"] or {}
            pw = v["name"].rsplit("-", 1)[0]
            if (rec.get("standby") and v["state"] == "running" and pw in live and v["vcpus"] == vcpus
                    and v["mem_mib"] == mem_mib and rec.get("bundle", "linux") == bundle
                    and (among is None or v["host"] in among)):
                out.append(v)
        return sorted(out, key=lambda v: not _ready(v))  # a booting one makes its claim wait for the boot

    # ---- ending --------------------------------------------------------------------
    async def remove(self, pw_id: str, reason: str = "removed") -> bool:
        """End prewarm ``pw_id``: its standby VMs go, and the machines bought for it
        go too once nothing else runs there. False: no such prewarm."""
        rec = self._get(pw_id)
        if rec is None:
            return False
        with self.store.tx() as c:
            c.execute(delete(prewarms_t).where(prewarms_t.c.id == pw_id))
            self.store.add_event("prewarm_removed", {"id": pw_id, "reason": reason}, conn=c)
        for v in self._standby(pw_id):
            try:
                await self.ctl.vms.delete(v["name"], v["host"])
            except FuseError as exc:
                log.warning("prewarm %s: removing %s: %s", pw_id, v["name"], exc.message)
        for host in rec["new_hosts"]:
            try:
                await self.ctl.pool.remove(host, f"its prewarm {pw_id} ended")
            except FuseError:
                pass  # it runs other VMs now (or is gone): scale-in decides
        return True

    async def release_host(self, host: str) -> None:
        """Before ``host`` goes: its standby VMs go (their prewarms refill elsewhere)."""
        for v in self.store.vms_on(host):
            if (v["record"] or {}).get("standby"):
                try:
                    await self.ctl.vms.delete(v["name"], host)
                except FuseError:
                    pass
