"""The elastic pool's machines: linked clouds, the hosts added in them, the budget (seed 001).

An elastic host is a cloud machine this controller bought; its lifecycle table and
billing are ``elastic_host``'s. A machine *joins* when its host agent
answers: the controller registers it like any host (probing it, never
guessing), under the host's pool name (``aws-1``), so placement, moves and
drain treat it like the operator's own hosts — it only costs money.

``ElasticPool`` is one object per controller, its parts by responsibility:

    elastic_host       lifecycle table, billing, the API record (pure functions of a row)
    elastic_clouds     linked clouds, their offers, images and quotas  (CloudsMixin)
    elastic_budget     the budget, its caps, BudgetExceeded            (BudgetMixin)
    elastic_scale_out  plans, buying their machines, host_for          (ScaleOutMixin)
    elastic            the hosts: add, remove, cordon, join; the loop  (ElasticPool)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from typing import Any

from sqlalchemy import delete, insert, select, update

from ...errors import Conflict, FuseError, InvalidArgument, NotFound
from ...models.pool import ElasticHost, ElasticRemoved
from ...tasks import cancel_and_wait, wait_event
from ..store import elastic_hosts as hosts_t, settings as settings_t
from ..store.outage import PassLog
from .elastic_budget import BudgetMixin
from .elastic_clouds import CloudsMixin
from .elastic_host import CREATE_LEASE_SECS, JOIN_GRACE_SECS, LIVE, TRANSITIONS, IllegalTransition, to_record
from .elastic_scale_out import ScaleOutMixin
from .model import Offer, ceil_to

REMOVING = "pool-removing:"  # a setting per host a removal cordoned, while it runs
REMOVING_LEFT_SECS = 900.0  # on a store replicas share, a removal's mark this old is one a stopped replica left

log = logging.getLogger("fuse.controller.pool")
passes = PassLog(log)  # (the database out of reach: a line, not a traceback a pass)

DEFAULT_TTL_HOURS = 24  # hosts added by hand end on their own after this
RECONCILE_EVERY_SECS = 60  # scale-in passes of the loop (autoscale on; TTLs end either way)
MAX_ADD = 20  # machines one cloud_add_host may ask for


class ElasticPool(CloudsMixin, BudgetMixin, ScaleOutMixin):
    """Clouds, elastic hosts and the budget of one controller (its store is shared by replicas)."""

    def __init__(self, ctl, interval: float = 1.0):
        self.ctl = ctl
        self.store = ctl.store
        self.interval = interval
        self._providers: dict[str, Any] = {}
        self._lock = asyncio.Lock()  # names and budget checks: one add at a time in this replica
        self._buying = asyncio.Lock()  # a plan's machines are bought whole, one plan at a time
        self._scaling = asyncio.Lock()  # creates that scale out: one machine bought at a time
        self._task: asyncio.Task | None = None
        self._last_reconcile = 0.0
        self._wake = asyncio.Event()  # a purchase or a join wait asks for the next pass now
        self._creating: set[str] = set()  # hosts this replica is creating (their lease: ``_hold``)
        self.reconcile_every = RECONCILE_EVERY_SECS

    # ---- hosts ---------------------------------------------------------------
    def rows(self) -> list[dict]:
        with self.store.read() as c:
            return [dict(r) for r in c.execute(select(hosts_t).order_by(hosts_t.c.started, hosts_t.c.name)).mappings()]

    def row(self, name: str) -> dict | None:
        with self.store.read() as c:
            r = c.execute(select(hosts_t).where(hosts_t.c.name == name)).mappings().first()
        return dict(r) if r else None

    def hosts(self, include_gone: bool = False) -> list[ElasticHost]:
        return [to_record(r) for r in self.rows() if include_gone or r["state"] != "gone"]

    def live_rows(self) -> dict[str, dict]:
        """Live elastic hosts by name, for the pool snapshot: those registered as hosts (joined,
        cordoned, offline, or registered as their join completes) are the cloud hosts among them."""
        return {r["name"]: r for r in self.rows() if r["state"] in LIVE}

    def _transition(self, name: str, to: str, reason: str = "", **values: Any) -> dict:
        with self.store.tx() as c:
            row = c.execute(select(hosts_t).where(hosts_t.c.name == name)).mappings().first()
            if row is None:
                raise NotFound(f"no elastic host {name}")
            row = dict(row)
            if to == row["state"] == "gone":
                return row  # (terminal: a second end, a race's, changes nothing of the first)
            if to != row["state"] and to not in TRANSITIONS[row["state"]]:
                raise IllegalTransition(f"elastic host {name}: {row['state']} -> {to} is not a transition")
            rec = dict(values.pop("record", None) or row["record"] or {})
            rec["history"] = [*rec.get("history", []), {"state": to, "time": time.time(), "reason": reason}]
            if reason:
                rec["reason"] = reason
            if to == "gone":
                values.setdefault("ended", time.time())
            c.execute(update(hosts_t).where(hosts_t.c.name == name)
                      .values(state=to, record=rec, updated_at=time.time(), **values))
            if to != row["state"]:
                self.store.add_event("elastic_host", {"host": name, "from": row["state"], "to": to,
                                                      "reason": reason}, host=name, conn=c)
            return row | values | {"state": to, "record": rec}

    def _new_name(self, provider: str, taken: list[str] = ()) -> str:
        """The next free ``<provider>-<n>`` (``taken``: names this transaction holds already)."""
        with self.store.read() as c:
            names = [r[0] for r in c.execute(select(hosts_t.c.name).where(hosts_t.c.provider == provider))]
        names += list(taken)
        taken = [int(m.group(1)) for n in names if (m := re.fullmatch(re.escape(provider) + r"-(\d+)", n))]
        return f"{provider}-{max(taken, default=0) + 1}"

    def find_offer(self, provider: str, instance_type: str, region: str | None) -> Offer:
        offers = [o for o in self.provider(provider).offers() if o.type_name == instance_type]
        if not offers:
            raise InvalidArgument(f"cloud {provider} has no machine type {instance_type!r}")
        if region:
            offers = [o for o in offers if o.region == region]
            if not offers:
                raise InvalidArgument(f"cloud {provider} has no {instance_type} in region {region!r}")
        return offers[0]

    async def add_hosts(self, provider: str, instance_type: str, region: str | None = None, count: int | None = None,
                        ttl_hours: int | None = None, *, pinned: bool = True,
                        billed: int | None = None, planned_secs: int | None = None,
                        bought_for: str | None = None) -> list[ElasticHost]:
        """Buy ``count`` machines of one type (all within the budget, or none).
        ``pinned``: added by hand — the scaler never removes them; each ends at
        its TTL (default 24 h). A plan's machines (``pinned`` False) have no TTL:
        scale-in removes them once idle; ``billed`` is the seconds the plan
        bills each for its work (what the monthly cap is checked against). ``bought_for``:
        the prewarm it is bought for, kept in its record (``PrewarmService.end_orphaned``)."""
        count = 1 if count is None else count
        if not 1 <= count <= MAX_ADD:
            raise InvalidArgument(f"count must be 1 to {MAX_ADD}, not {count}")
        if ttl_hours is not None and ttl_hours < 1:
            raise InvalidArgument(f"ttl_hours must be at least 1, not {ttl_hours}")
        offer = self.find_offer(provider, instance_type, region)
        ttl = (ttl_hours or DEFAULT_TTL_HOURS) * 3600 if pinned or ttl_hours else 0
        usd_each = offer.usd_per_hour * (billed if billed is not None else max(
            offer.billing_min_secs, ceil_to(ttl or 3600, offer.billing_step_secs))) / 3600
        names: list[str] = []
        async with self._lock:
            now = time.time()
            # The caps checked and the machines recorded (``creating``) in one write transaction:
            # replicas sharing a store take its write lock in turn, so the second sees the first's
            # machines (two purchases through two replicas at once both passed a $/h cap)
            with self.store.tx() as c:
                self._check_budget(offer, count, usd_each)
                for _ in range(count):
                    name = self._new_name(provider, taken=names)
                    c.execute(insert(hosts_t).values(
                        name=name, provider=provider, type_name=offer.type_name, region=offer.region,
                        cloud_id="", state="creating", started=now, ended=None,
                        expires=int(now + ttl) if ttl else 0, usd_per_hour=offer.usd_per_hour,
                        billing_step_secs=offer.billing_step_secs, billing_min_secs=offer.billing_min_secs,
                        boot_secs=offer.boot_secs, pinned=int(pinned), token=secrets.token_urlsafe(24),
                        record={"history": [{"state": "creating", "time": now, "reason": ""}],
                                "planned_until": now + (billed or 0 if planned_secs is None else planned_secs),
                                "budgeted_until": now + (billed or 0),
                                **({"prewarm": bought_for} if bought_for else {})},
                        updated_at=now))
                    # (``type_name``: an event's ``type`` is its own, "elastic_host")
                    self.store.add_event("elastic_host", {"host": name, "from": "", "to": "creating",
                                                          "type_name": offer.type_name}, host=name, conn=c)
                    names.append(name)
            self._creating.update(names)
        errors = []
        holder = asyncio.create_task(self._hold(names))
        try:
            for name in names:
                try:
                    await self._create(name)
                except FuseError as exc:
                    errors.append(f"{name}: {exc.message}")
        finally:  # (cancelled too: what is still creating is settled once its lease runs out)
            holder.cancel()
            self._creating.difference_update(names)
        if errors and len(errors) == len(names):
            raise FuseError("; ".join(errors), code="cloud_error").with_status(502)
        if errors:  # some were bought: they are answered, the others' reasons logged and in their records
            log.warning("cloud_add_host: %s", "; ".join(errors))
        self.wake()
        return [to_record(self.row(n)) for n in names]

    async def _create(self, name: str) -> None:
        row = self.row(name)
        try:
            machine = await self.provider(row["provider"]).create(
                host_name=name, type_name=row["type_name"], region=row["region"], agent_token=row["token"])
        except FuseError as exc:
            self._transition(name, "gone", f"the cloud refused it: {exc.message}")
            raise
        except Exception as exc:  # a provider bug must not leave a machine "creating" for ever
            self._transition(name, "gone", f"creating it failed: {exc!r}")
            raise FuseError(f"creating {name} failed: {exc}", code="cloud_error").with_status(502) from exc
        if self.row(name)["state"] != "creating":  # settled meanwhile: this replica's lease lapsed
            await self.provider(row["provider"]).terminate(machine.id)
            raise FuseError(f"{name} was given up while the cloud created it; its machine {machine.id} is "
                            "terminated", code="cloud_error").with_status(502)
        self._transition(name, "booting", "the cloud accepted it", cloud_id=machine.id)

    async def _hold(self, names: list[str]) -> None:
        """Renew the lease (``updated_at``) of the hosts ``names`` this replica is creating, so
        that no replica takes them for ones a stopped controller left (``_settle``)."""
        while True:
            await asyncio.sleep(CREATE_LEASE_SECS / 3)
            try:
                with self.store.tx() as c:
                    c.execute(update(hosts_t).where(hosts_t.c.name.in_(names), hosts_t.c.state == "creating")
                              .values(updated_at=time.time()))
                passes.ok("renewing the lease of elastic hosts being created")
            except Exception as exc:  # the store may blip: the next renewal is in time
                passes.failed("renewing the lease of elastic hosts being created", exc)

    def _left_creating(self, row: dict, now: float) -> bool:
        """``row`` was left ``creating`` by a controller that stopped in the cloud's create
        call (or gave it up): not this replica's, and its lease ran out."""
        return (row["state"] == "creating" and row["name"] not in self._creating
                and now - row["updated_at"] > CREATE_LEASE_SECS)

    async def _settle(self, row: dict) -> bool:
        """Settle a host left ``creating`` (``_left_creating``). Its cloud id was never stored,
        so the cloud is asked for the machines started under its name (``Provider.find``:
        the local provider's dir, AWS's ``Name`` tag); they are terminated, nothing being
        left to bill unseen, and the host is gone. Taken first, as a lease (another replica
        may settle it too). False: another replica took it; a cloud that cannot be asked
        raises, and the host waits for the next pass."""
        name = row["name"]
        with self.store.tx() as c:
            took = c.execute(update(hosts_t).where(hosts_t.c.name == name, hosts_t.c.state == "creating",
                                                   hosts_t.c.updated_at == row["updated_at"])
                             .values(updated_at=time.time())).rowcount
        if not took:
            return False
        why = "its controller stopped while the cloud created it"
        self._creating.add(name)
        try:
            try:
                provider = self.provider(row["provider"])
            except FuseError:
                self._transition(name, "gone", f"{why}; its cloud {row['provider']} is linked no more: look for a "
                                               f"machine tagged Name={name} there")
                return True
            found = await provider.find(name)
            for m in found:
                await provider.terminate(m.id)
        finally:
            self._creating.discard(name)
        if found:
            self._transition(name, "gone", f"{why}: its machine {', '.join(m.id for m in found)}, found by its "
                                           "name, is terminated", cloud_id=found[0].id)
        else:
            self._transition(name, "gone", f"{why}: the cloud has no machine of its name")
        log.warning("elastic host %s: %s", name, (self.row(name)["record"] or {}).get("reason"))
        return True

    async def remove_hosts(self, names: list[str], reason: str = "removed by hand") -> ElasticRemoved:
        out = ElasticRemoved()
        # each name once: a name given twice was removed, not "already gone" as well
        for name in dict.fromkeys(names):
            try:
                await self.remove(name, reason)
                out.removed.append(name)
            except FuseError as exc:
                out.failed.append(f"{name}: {exc.message}")
        return out

    async def remove(self, name: str, reason: str, *, prewarm: str | None = None) -> None:
        """Terminate one elastic host. Refused while VMs (other than prewarmed
        ones, which go with it) are on it: nothing is lost. ``prewarm``: it goes as
        that prewarm, which bought it, ended; then refused while anything else is
        there, other prewarms' standby VMs and places included (scale-in decides
        once it is idle): the machine was that prewarm's, not what it holds now."""
        row = self.row(name)
        if row is None:
            raise NotFound("not a host this pool added")
        if row["state"] == "gone":
            raise Conflict("already gone")
        if row["state"] == "creating":
            if self._left_creating(row, time.time()) and await self._settle(row):
                return  # (a controller stopped in its create: what the cloud started is terminated)
            raise Conflict("the cloud is still creating it: remove it once it is booting")
        registered = self.store.get_host(name)
        was = (registered or {}).get("state")
        if registered is None or was != "active":
            return await self._remove(name, row, reason, prewarm, [])
        # first: no placement lands while it is looked at; a removal that fails (a host that does
        # not answer the delete of its standby VM, a cloud that refuses to end it) or a controller
        # stopped in it puts it back in placement (review 31: it stayed cordoned for good while
        # the pool bought new machines), the latter at the next start (``resume_removals``)
        self.store.put_setting(REMOVING + name, {"since": time.time()})
        self.ctl.hosts.set_state(name, "cordoned")
        ending: list[bool] = []
        try:
            await self._remove(name, row, reason, prewarm, ending)
        except BaseException:
            if not ending and self.store.get_host(name) is not None:
                self.ctl.hosts.set_state(name, "active")
            raise
        finally:
            self._removed(name)

    async def _remove(self, name: str, row: dict, reason: str, prewarm: str | None, ending: list[bool]) -> None:
        """``remove``'s steps; a refusal or failure before ``ending`` is marked leaves the machine
        running (``remove`` then puts a host it cordoned back in placement). Past its TTL the
        prewarms pinned to it end with it (they could never be ready again), as when its cloud
        ends it; before, they keep it (the operator removes them first)."""
        pinned = getattr(self.ctl, "prewarm", None) and self.ctl.prewarm.pinned_to(name)
        # (review 33: a hand-added machine's TTL refused for its pinned prewarm left it running,
        # billed and back in placement, for as long as the prewarm lived: for good, maybe)
        ttl_ended = bool(row["expires"]) and time.time() >= row["expires"]
        if busy := (self._work_on(name) or (prewarm is not None and self._held_but_by(name, prewarm))
                    or (pinned and not ttl_ended and f"prewarm {', '.join(pinned)} is pinned to it "
                                                     f"(on host:{name}): remove the prewarm first")):
            raise Conflict(busy)
        prewarm = getattr(self.ctl, "prewarm", None)
        if prewarm is not None:
            for pw_id in pinned or ():
                await prewarm.remove(pw_id, f"the host it is pinned to, {name}, ended at its TTL")
            await prewarm.release_host(name)
        if busy := self._work_on(name):  # (a VM with work got there meanwhile: it stays, and so does its host)
            raise Conflict(busy)
        for v in self.store.vms_on(name):  # ended VMs end with their machine
            with contextlib.suppress(NotFound):  # (its host no longer had it: gone, its row too)
                await self.ctl.vms.delete(v["name"], name)
        ending.append(True)  # (from here its machine may be ending: it is not put back, nor at a start)
        if self.store.get_setting(REMOVING + name) is not None:
            self.store.put_setting(REMOVING + name, {"since": time.time(), "ending": True})
        if row["cloud_id"]:
            await self.provider(row["provider"]).terminate(row["cloud_id"])
        if self.store.get_host(name) is not None:
            await self.ctl.deregister_host(name)
        self._transition(name, "gone", reason)

    def _removed(self, name: str) -> None:
        with self.store.tx() as c:
            c.execute(delete(settings_t).where(settings_t.c.key == REMOVING + name))

    def resume_removals(self) -> None:
        """At the start: a host a removal cordoned when the controller stopped in it, still
        registered and not gone, is put back in placement (``remove``)."""
        shared = getattr(getattr(self.ctl, "vms", None), "_shared", False)
        with self.store.read() as c:
            marks = list(c.execute(select(settings_t.c.key, settings_t.c.value).where(
                settings_t.c.key.like(REMOVING + "%"))))
        for key, value in marks:
            name = key[len(REMOVING):]
            if shared and time.time() - float((value or {}).get("since", 0)) < REMOVING_LEFT_SECS:
                continue  # (another replica's removal may be under way)
            host = self.store.get_host(name)
            if (value or {}).get("ending"):
                pass  # (its machine was being ended: the pool's pass finds it gone and lets the host go)
            elif host is not None and host.get("state") == "cordoned" and (self.row(name) or {}).get("state") != "gone":
                log.warning("elastic host %s: its removal was cut short (the controller stopped): back in "
                            "placement", name)
                self.ctl.hosts.set_state(name, "active")
            self._removed(name)

    async def remove_forced(self, name: str) -> None:
        """A host this pool added whose agent is gone for good: deregistered with force (its VMs'
        records dropped, refused while the agent answers: ``Controller.deregister_host``), then its
        machine is terminated (it would bill on, running nothing). A cloud that fails to end it
        leaves it for ``remove_hosts`` to try again (the host is already deregistered)."""
        if self.store.get_host(name) is not None:
            await self.ctl.deregister_host(name, force=True)
        row = self.row(name)
        if row is None or row["state"] == "gone":
            return
        if row["cloud_id"]:
            try:
                await self.provider(row["provider"]).terminate(row["cloud_id"])
            except FuseError as exc:
                raise FuseError(f"host {name} was removed with force, but its machine was not ended: {exc.message}; "
                                f"end it with fuse pool remove-host {name}", code="cloud_error").with_status(502)
        self._transition(name, "gone", "removed with force: its agent was gone for good")

    def used(self, name: str) -> None:
        """A VM was placed on ``name`` (``record.used``): from now on, idle near the end of its
        planned work, its work is over (scale-in, ``reconcile.decide``)."""
        row = self.row(name)
        if row is None or row["state"] == "gone" or (row["record"] or {}).get("used"):
            return
        with self.store.tx() as c:
            found = c.execute(select(hosts_t.c.record).where(hosts_t.c.name == name)).first()
            if found is not None:
                c.execute(update(hosts_t).where(hosts_t.c.name == name).values(record=dict(found[0] or {}, used=True)))

    def work_ended(self, name: str) -> None:
        """The work machine ``name`` was bought for is over (its prewarm ended) while something
        else keeps it: its planned time ends now, so scale-in removes it once it is idle (it
        kept it idle, and the monthly cap counted it, until the prewarm's TTL would have come)."""
        now = time.time()
        with self.store.tx() as c:
            row = c.execute(select(hosts_t).where(hosts_t.c.name == name)).mappings().first()
            if row is None or row["state"] == "gone" or row["expires"]:
                return  # (a machine added by hand ends at its TTL, whatever ran there)
            rec = dict(row["record"] or {})
            rec["planned_until"] = min(rec.get("planned_until", 0), now)
            rec["budgeted_until"] = min(rec.get("budgeted_until", 0), now)
            c.execute(update(hosts_t).where(hosts_t.c.name == name).values(record=rec))

    def _work_on(self, name: str) -> str | None:
        """Why ``name`` may not go now (VMs with work on it, or being placed there), or None."""
        from .reconcile import WORK_STATES
        vms = [v["name"] for v in self.store.vms_on(name)
               if v["state"] in WORK_STATES and not (v["record"] or {}).get("standby")]
        if vms:
            return (f"{len(vms)} VM{'s' if len(vms) > 1 else ''} on it ({', '.join(vms[:5])}): "
                    "drain it first (fuse controller hosts drain)")
        # (a create claiming a prewarmed VM there counts: its standby VM becomes a VM with work)
        placing = self.ctl.vms.placing_names(name)
        if self.ctl.vms.pending_on(name).count or placing:
            return "a VM is being placed on it" + (f" ({', '.join(placing[:5])})" if placing else "")
        return None

    def _held_but_by(self, name: str, pw_id: str) -> str | None:
        """Why ``name`` is not prewarm ``pw_id``'s alone (another prewarm has standby VMs or
        a placement there, or a VM of anyone's is left there), or None."""
        prewarm = getattr(self.ctl, "prewarm", None)
        others = (prewarm.placed_on(name) if prewarm is not None else set()) | {
            v["name"].rsplit("-", 1)[0] for v in self.store.vms_on(name) if (v["record"] or {}).get("standby")}
        others.discard(pw_id)
        if not others:
            return None
        return (f"it keeps VMs of {'prewarms' if len(others) > 1 else 'prewarm'} {', '.join(sorted(others))} "
                "ready: scale-in removes it once it is idle")

    async def cordon(self, name: str, reason: str) -> None:
        """No new VMs on ``name``; what runs there carries on (scale-in, TTL)."""
        row = self.row(name)
        if self.store.get_host(name) is not None and (self.store.get_host(name) or {}).get("state") == "active":
            self.ctl.hosts.set_state(name, "cordoned")
        if row["state"] == "joined":
            self._transition(name, "cordoned", reason)

    async def reconcile(self) -> list:
        from .reconcile import reconcile
        self._last_reconcile = time.monotonic()
        return await reconcile(self)

    # ---- joining: one pass over the machines not yet (or no longer) hosts ----
    async def tick(self) -> None:
        now = time.time()
        by_cloud: dict[str, list[dict]] = {}
        for r in self.rows():
            if r["state"] in ("booting", "joined", "cordoned", "offline") and r["cloud_id"]:
                by_cloud.setdefault(r["provider"], []).append(r)
            elif self._left_creating(r, now):
                try:
                    await self._settle(r)
                except FuseError as exc:
                    log.warning("elastic host %s, left creating: %s", r["name"], exc.message)
        for cloud, rows in by_cloud.items():
            provider, seen, unasked = None, {}, ""
            try:
                provider = self.provider(cloud)
                seen = await provider.describe([r["cloud_id"] for r in rows])
            except FuseError as exc:
                # the cloud cannot say what became of its machines: nothing is ended or joined on
                # its word this pass, but their clocks run on (a machine silent past its boot and
                # grace goes offline, so plans stop offering it as room)
                log.warning("cloud %s: %s", cloud, exc.message)
                unasked = exc.message
            for r in rows:
                try:
                    if unasked:
                        self._follow_unasked(r, now, unasked)
                    else:
                        await self._follow(r, seen.get(r["cloud_id"]), provider, now)
                except FuseError as exc:
                    log.warning("elastic host %s: %s", r["name"], exc.message)

    def _lose_vms(self, host: str, why: str) -> None:
        """Mark every VM of ``host`` whose run was not over ``failed`` (its machine is gone),
        one ``vm_lost`` event each."""
        from ..hosts import FINISHED
        from ..store import vms as vms_t

        with self.store.tx() as c:
            for v in self.store.vms_on(host, c):
                if v["state"] in FINISHED:
                    continue
                record = dict(v["record"] or {}) | {"state": "failed", "error": why}
                c.execute(update(vms_t).where(vms_t.c.host == host, vms_t.c.name == v["name"])
                          .values(state="failed", record=record))
                self.store.add_event("vm_lost", {"vm": v["name"], "id": host, "was": v["state"], "reason": why},
                                     host=host, conn=c)

    def _follow_unasked(self, r: dict, now: float, why: str) -> None:
        """``_follow`` for a machine whose cloud could not be asked (``why``): only what
        needs no word from the cloud, a booting machine's join timeout."""
        if r["state"] == "booting" and now > r["started"] + r["boot_secs"] + JOIN_GRACE_SECS:
            self._transition(r["name"], "offline", f"no agent answered within {r['boot_secs'] + JOIN_GRACE_SECS} s "
                                                   f"(and its cloud cannot be asked: {why})")

    async def _follow(self, r: dict, m, provider, now: float) -> None:
        name, state = r["name"], r["state"]
        stopped = m is not None and m.state == "stopping"
        if m is None or m.state == "terminated" or stopped:
            if (self.row(name) or {}).get("state", "gone") == "gone":
                # removed while the cloud was asked (``r`` was read before): its end is the
                # removal's, not the cloud's (it was marked ended by the cloud, ``gone`` again)
                return
            if self.store.get_host(name) is not None and (self.store.get_host(name) or {}).get("state") == "active":
                self.ctl.hosts.set_state(name, "cordoned")
            if stopped:
                # stopped outside the pool (or shutting down): it runs nothing yet bills on, and
                # counts against the caps, until terminated. Terminate it now; should the cloud
                # refuse, the error ends this pass for it and the next pass tries again
                await provider.terminate(r["cloud_id"])
            else:
                try:  # whatever of it is left (a local machine's VMs outlive its agent)
                    await provider.terminate(r["cloud_id"])
                except FuseError:
                    pass
            # (marked: a prewarm tells a machine the cloud keeps ending from one removed on purpose)
            rec = dict((self.row(name) or r)["record"] or {}) | {"ended_by_cloud": True}
            self._transition(name, "gone", "the cloud stopped the machine; the pool terminated it" if stopped
                             else "the cloud ended the machine", record=rec)
            prewarm = getattr(self.ctl, "prewarm", None)
            if prewarm is not None:  # its standby VMs went with it: their prewarms place them again
                await prewarm.release_host(name, gone=True)
            if self.store.get_host(name) is not None:
                # its host is no more, as on every other way to gone (a cordoned, disconnected host
                # left registered would stay for good, there being no machine to answer). The VMs
                # that ran there went with the machine: each is failed (``vm_lost``), and goes
                # with the host as a finished VM does. A create waiting on the machine's answer or
                # a move through it still holds it: say so
                self._lose_vms(name, "the cloud ended its machine")
                try:
                    await self.ctl.deregister_host(name)
                except FuseError as exc:
                    log.warning("elastic host %s: the cloud ended the machine; its host stays registered: %s",
                                name, exc.message)
            return
        view = self.ctl.fleet.views.get(name) if self.ctl.fleet else None
        if state == "booting":
            joined = m.state == "running" and m.address and await self._join(r, m.address, provider)
            if not joined and now > r["started"] + r["boot_secs"] + JOIN_GRACE_SECS:
                # (running at an address whose agent does not answer is not joined either: it
                # stayed booting for good, offered to plans as "still booting")
                why = (r.get("record") or {}).get("last_error") if m.state == "running" else None
                self._transition(name, "offline", f"no agent answered within {r['boot_secs'] + JOIN_GRACE_SECS} s"
                                 + (f" (last: {why})" if why else ""))
        elif state in ("joined", "cordoned") and view is not None and not view.connected and view.failures >= 3:
            self._transition(name, "offline", f"its agent stopped answering: {view.error}")
        elif state == "cordoned" and (self.store.get_host(name) or {}).get("state") == "active":
            self._transition(name, "joined", "uncordoned")
        elif state == "offline":
            if view is not None and view.connected:
                self._transition(name, "joined", "its agent answers again")
            elif self.store.get_host(name) is None and m.state == "running" and m.address:
                await self._join(r, m.address, provider)

    async def _join(self, r: dict, address: str, provider) -> bool:
        """Register the machine's agent as a host: True once it answered, else False with
        why kept in the row (``last_error``) for the next pass."""
        from ...models.hosts import BACKENDS, HostCapacity, RegisterHostRequest
        # the registry knows the real hypervisors; the local cloud's test stand-in runs VMs the qemu way
        backend = provider.backend if provider.backend in BACKENDS else "qemu"
        req = RegisterHostRequest(id=r["name"], url=address, token=r["token"], region=r["region"],
                                  backend=backend, labels={"fuse-pool": r["provider"]},
                                  capacity=HostCapacity(**provider.capacity(r["type_name"])))
        try:
            await self.ctl.register_host(req)
        except FuseError as exc:  # not up yet: the next pass tries again
            rec = dict(r["record"] or {}) | {"last_error": exc.message}
            with self.store.tx() as c:
                c.execute(update(hosts_t).where(hosts_t.c.name == r["name"]).values(record=rec))
            r["record"] = rec
            return False
        rec = dict(self.row(r["name"])["record"] or {}) | {"joined": True}
        self._transition(r["name"], "joined", f"its agent answered at {address}", record=rec)
        return True

    async def wait_joined(self, name: str, timeout: float) -> dict:
        """Until ``name`` joined (its row), or Conflict when it went another way or took too long."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.row(name)
            if row["state"] == "joined" and self.ctl.fleet.views.get(name) and self.ctl.fleet.views[name].connected:
                return row
            if row["state"] in ("gone", "offline"):
                raise Conflict(f"elastic host {name} did not join: {(row['record'] or {}).get('reason', row['state'])}")
            if time.monotonic() > deadline:
                raise Conflict(f"elastic host {name} did not join within {timeout:.0f} s "
                               f"(last: {(row['record'] or {}).get('last_error', row['state'])})")
            self.wake()
            await asyncio.sleep(0.2)

    # ---- the loop ---------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        try:
            self.resume_removals()
        except Exception as exc:  # (the store out of reach: the next start looks again)
            log.warning("could not look for removals cut short: %s", exc)
        self._task = asyncio.create_task(self._loop(), name="fuse-elastic-pool")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        for p in self._providers.values():
            try:
                await p.close()
            except Exception:
                pass

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
                if time.monotonic() - self._last_reconcile >= self.reconcile_every:
                    await self.reconcile()
                hook = getattr(self.ctl, "pool_tick", None)
                if hook is not None:
                    await hook()
                passes.ok("elastic pool pass failed")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad pass must not end the loop
                passes.failed("elastic pool pass failed", exc)
            await wait_event(self._wake, self.interval)
            self._wake.clear()
