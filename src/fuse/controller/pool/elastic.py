"""The elastic pool's machines: linked clouds, the hosts added in them, the budget (seed 001).

An elastic host is a cloud machine this controller bought. Its life is the
table below; each transition is stored with a timestamped history entry and
emits an ``elastic_host`` event. A machine *joins* when its host agent
answers: the controller registers it like any host (probing it, never
guessing), under the host's pool name (``aws-1``), so placement, moves and
drain treat it like the operator's own hosts — it only costs money.

Cost accounting (what ``ElasticBudget`` shows and the caps check):
a host is billed from ``started`` in whole billing steps, at least the
minimum: ``billed = max(min, ceil(elapsed / step) · step)``, elapsed counted
up to ``ended`` for a gone host (at least one second, so a machine is paid
for its first step the moment it starts). ``paid_until = started + billed``.
``month_usd`` is the part of every host's billed time inside this calendar
month (UTC) times its price. Caps of 0 mean "no cap".
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ...errors import Conflict, FuseError, InvalidArgument, NotFound
from ...models.pool import ElasticBudget, ElasticBudgetUpdate, ElasticHost, ElasticRemoved
from ..store import clouds as clouds_t, elastic_hosts as hosts_t
from .catalogue import default_catalogue
from .model import Constraints, Offer, ceil_to

log = logging.getLogger("fuse.controller.pool")

# state -> states it may move to, and what moves it there.
TRANSITIONS: dict[str, frozenset[str]] = {
    "creating": frozenset({
        "booting",   # the cloud accepted the machine: it has the cloud's id
        "gone",      # the cloud refused it
    }),
    "booting": frozenset({
        "joined",    # its agent answered and registered as a host
        "offline",   # it did not join within its boot time and the grace
        "gone",      # removed, or the cloud ended it
    }),
    "joined": frozenset({
        "cordoned",  # scale-in (the others have room) or its TTL came
        "offline",   # its agent stopped answering
        "gone",      # removed
    }),
    "cordoned": frozenset({
        "joined",    # uncordoned: its room is wanted again
        "offline",   # its agent stopped answering
        "gone",      # removed once empty
    }),
    "offline": frozenset({
        "joined",    # its agent answers again
        "gone",      # removed, or the cloud ended it
    }),
    "gone": frozenset(),  # terminal: the machine is terminated
}
LIVE = ("creating", "booting", "joined", "cordoned", "offline")
CREATE_TIMEOUT_SECS = 600  # a create call unanswered this long: its controller stopped in it
JOIN_GRACE_SECS = 300  # beyond the type's boot time before a silent machine is offline
DEFAULT_TTL_HOURS = 24  # hosts added by hand end on their own after this
RECONCILE_EVERY_SECS = 60  # scale-in passes of the loop (autoscale on; TTLs end either way)
MAX_ADD = 20  # machines one cloud_add_host may ask for
BUDGET_KEY = "pool_budget"
CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
DEFAULT_BUDGET = {"autoscale": False, "max_usd_per_hour": 0.0, "monthly_usd": 0.0, "max_new_hosts": 0,
                  "warm": True, "allow_metal": True}


def _uncapped(options: dict[str, Any]) -> dict[str, Any]:
    """A cloud's link options but its caps (quotas, limits): what its hosts' ids depend on."""
    from .providers.base import CAP_OPTIONS
    return {k: v for k, v in (options or {}).items() if k not in CAP_OPTIONS}


class IllegalTransition(FuseError):
    """A bug: the lifecycle table forbids it."""


class BudgetExceeded(Conflict):
    code = "budget_exceeded"


def billed_secs(row: dict, now: float) -> int:
    """Seconds billed so far (see the module docstring)."""
    elapsed = max((row["ended"] or now) - row["started"], 1)
    return max(int(row["billing_min_secs"]), ceil_to(elapsed, int(row["billing_step_secs"]) or 1))


def paid_until(row: dict, now: float) -> float:
    return row["started"] + billed_secs(row, now)


def month_start(now: float) -> float:
    d = datetime.fromtimestamp(now, timezone.utc)
    return datetime(d.year, d.month, 1, tzinfo=timezone.utc).timestamp()


def month_usd(row: dict, now: float) -> float:
    """USD of ``row``'s billed time inside this calendar month (nothing for a
    machine the cloud never accepted: it has no cloud id)."""
    if not row["cloud_id"] and row["state"] == "gone":
        return 0.0
    lo, hi = max(row["started"], month_start(now)), paid_until(row, now)
    return max(0.0, hi - lo) * row["usd_per_hour"] / 3600


def committed_until(row: dict, now: float) -> float:
    """Until when a live host is paid for whatever runs on it: its billed time so far,
    and beyond it, a host added by hand until its TTL (the scaler never removes it
    earlier), a plan's machine until its planned work ends (``record.planned_until``)."""
    end = row["expires"] or (row["record"] or {}).get("planned_until", 0)
    return max(paid_until(row, now), end)


def committed_usd(row: dict, now: float) -> float:
    """USD a live host is still set to cost beyond its billed time so far
    (``committed_until``). The monthly cap counts it as spent already."""
    return (committed_until(row, now) - paid_until(row, now)) * row["usd_per_hour"] / 3600


def ends_on_its_own(row: dict, now: float) -> float:
    """When the host ends unless someone ends it first (``ElasticHost.expires``). A host
    with a TTL (added by hand): then. A machine a plan or autoscale bought has none: scale-in
    keeps it until its planned work ends, then removes it, once idle, at the end of the paid
    time that holds then; so, recomputed at every read, it follows the billed time while VMs
    keep the host busy. A gone host: when its paid time ended."""
    if row["expires"]:
        return row["expires"]
    return paid_until(row, max(now, (row["record"] or {}).get("planned_until", 0)))


def to_record(row: dict, now: float | None = None) -> ElasticHost:
    now = time.time() if now is None else now
    return ElasticHost(
        name=row["name"], provider=row["provider"], type_name=row["type_name"], region=row["region"],
        id=row["cloud_id"], machine=row["name"] if (row["record"] or {}).get("joined") and row["state"] != "gone" else "",
        state=row["state"], started=int(row["started"]), expires=int(ends_on_its_own(row, now)),
        usd_per_hour=row["usd_per_hour"], billing_step_secs=row["billing_step_secs"],
        billing_min_secs=row["billing_min_secs"], pinned=bool(row["pinned"]))


def _wait_for_joins(result, snapshot: list[dict]) -> None:
    """A plan that puts work on hosts bought and not joined yet (``joins_in_secs`` in the
    snapshot) is ready only once they join: ``ready_in_secs`` and their explain lines say
    so, and the ``json`` answer gains ``joining`` (host -> seconds). The model has no field
    for it: a re-solve of that model (``fuse pool plan --model``) sees them as running hosts."""
    joins = {h["name"]: h for h in snapshot if h.get("joins_in_secs") is not None}
    used = sorted({a.host for a in result.assignments if a.host in joins})
    if not used:
        return
    result.ready_in_secs = max([result.ready_in_secs] + [int(joins[n]["joins_in_secs"]) for n in used])
    for i, line in enumerate(result.explain):
        for n in used:
            if f" on {n} (running cloud host" in line:
                result.explain[i] = line.replace(
                    f" on {n} (running cloud host", f" on {n} (cloud host still {joins[n].get('state', 'booting')}, "
                                                    f"joins in about {int(joins[n]['joins_in_secs'])} s", 1)
    body = json.loads(result.json) if result.json else {}
    body["plan"] = result.model_dump(mode="json", exclude={"json"})
    body["joining"] = {n: int(joins[n]["joins_in_secs"]) for n in used}
    result.json = json.dumps(body, sort_keys=True)


class ElasticPool:
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
        self.reconcile_every = RECONCILE_EVERY_SECS

    # ---- clouds --------------------------------------------------------------
    def _cloud_dir(self, name: str):
        return self.ctl.state_dir / "clouds" / name

    def clouds(self) -> list[dict[str, Any]]:
        from .providers import public_options
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(clouds_t).order_by(clouds_t.c.name)).mappings()]
        return [{"name": r["name"], "kind": r["kind"], "options": public_options(r["kind"], r["options"]),
                 "types": sorted({o.type_name for o in self.provider(r["name"]).offers()})} for r in rows]

    async def link(self, name: str, kind: str, options: dict[str, Any]) -> dict[str, Any]:
        """Link (or re-link with new options) a cloud: its offers join the plans."""
        from .providers import link
        if not CLOUD_NAME.match(name or ""):
            raise InvalidArgument(f"cloud name {name!r}: lower-case letters, digits and '-', starting with a letter")
        from .providers.base import CAP_OPTIONS
        options = dict(options or {})
        if kind == "local":  # its machines' dir, the same for every replica on this machine
            options.setdefault("dir", str(self._cloud_dir(name).resolve()))
        live = [r["name"] for r in self.rows() if r["provider"] == name and r["state"] in LIVE]
        was = self._cloud_row(name)
        if live and not (was is not None and was["kind"] == kind and _uncapped(was["options"]) == _uncapped(options)):
            # its hosts' ids mean something only to the cloud as it was linked; its caps
            # (quotas, limits) are the pool's own, so they may change under running hosts
            raise Conflict(f"cloud {name} has hosts ({', '.join(live)}): remove them before re-linking it "
                           f"(only its {' and '.join(sorted(CAP_OPTIONS))} may change while it has hosts)")
        provider = link(kind, name, options, self._cloud_dir(name))
        with self.store.tx() as c:
            c.execute(delete(clouds_t).where(clouds_t.c.name == name))
            c.execute(insert(clouds_t).values(name=name, kind=kind, options=dict(options or {}),
                                              created_at=time.time()))
        old = self._providers.pop(name, None)
        if old is not None:
            provider.adopt(old)  # (its hosts live on: what it knows of their machines carries over)
            await old.close()
        self._providers[name] = provider
        self.store.add_event("cloud_linked", {"cloud": name, "kind": kind})
        return next(c for c in self.clouds() if c["name"] == name)

    async def unlink(self, name: str) -> None:
        if self._cloud_row(name) is None:
            raise NotFound(f"no linked cloud {name!r}")
        live = [r["name"] for r in self.rows() if r["provider"] == name and r["state"] in LIVE]
        if live:
            raise Conflict(f"cloud {name} still has hosts ({', '.join(live)}): remove them first")
        with self.store.tx() as c:
            c.execute(delete(clouds_t).where(clouds_t.c.name == name))
        old = self._providers.pop(name, None)
        if old is not None:
            await old.close()
        self.store.add_event("cloud_unlinked", {"cloud": name})

    def _cloud_row(self, name: str) -> dict | None:
        with self.store.read() as c:
            row = c.execute(select(clouds_t).where(clouds_t.c.name == name)).mappings().first()
        return dict(row) if row else None

    def provider(self, name: str):
        """The linked cloud ``name`` (re-linked from the store on another replica or after a restart)."""
        p = self._providers.get(name)
        if p is None:
            from .providers import link
            row = self._cloud_row(name)
            if row is None:
                raise InvalidArgument(f"no linked cloud {name!r}" + (
                    f" (linked: {', '.join(self.cloud_names())})" if self.cloud_names() else
                    "; link one with PUT /v1/pool/clouds/{name} (fuse pool cloud link)"))
            p = self._providers[name] = link(row["kind"], name, row["options"], self._cloud_dir(name))
        return p

    def images(self) -> set[str]:
        """The guest bundles a machine of some linked cloud would have."""
        return set().union(*(self.provider(n).images() for n in self.cloud_names()))

    def cloud_names(self) -> list[str]:
        with self.store.read() as c:
            return [r[0] for r in c.execute(select(clouds_t.c.name).order_by(clouds_t.c.name))]

    def offers(self, image: str | None = None) -> list[Offer]:
        """What the linked clouds can add; with none linked, the shipped catalogue
        (plans then answer "what if", and nothing can be bought). With ``image``, only
        the offers of clouds whose machines get that guest bundle (a machine bought for
        an image it does not have refuses the VMs: "host has no bundle")."""
        names = self.cloud_names()
        if not names:
            return list(default_catalogue())
        _, machines = self.in_use()
        # a type's limit is on the machines of it the cloud runs: those running already count
        return [o if o.limit is None else o.model_copy(update={
                    "limit": max(0, o.limit - machines[(o.provider, o.type_name)])})
                for n in names if image is None or image in self.provider(n).images()
                for o in self.provider(n).offers()]

    def in_use(self) -> tuple[Counter, Counter]:
        """What the live hosts (creating to offline: every one the cloud runs, and bills) take
        of the clouds' caps: vCPUs per quota family, and machines per (cloud, type)."""
        vcpus: Counter = Counter()
        machines: Counter = Counter()
        for r in self.rows():
            if r["state"] not in LIVE:
                continue
            machines[(r["provider"], r["type_name"])] += 1
            try:
                o = self.provider(r["provider"]).offer(r["type_name"], r["region"])
            except FuseError:  # (its cloud no longer offers the type: no family to count it in)
                continue
            vcpus[o.quota_family] += o.vcpus
        return vcpus, machines

    def quotas_left(self) -> dict[str, int]:
        """vCPUs each linked cloud's quota families leave for new machines (``Constraints.quotas``)."""
        used, _ = self.in_use()
        return {family: max(0, n - used[family]) for c in self.cloud_names()
                for family, n in sorted(self.provider(c).quotas.items())}

    # ---- budget --------------------------------------------------------------
    def _budget_settings(self) -> dict[str, Any]:
        return DEFAULT_BUDGET | self.store.get_setting(BUDGET_KEY, {})

    def budget(self) -> ElasticBudget:
        now = time.time()
        rows = self.rows()
        live = [r for r in rows if r["state"] in LIVE]
        return ElasticBudget(**self._budget_settings(), month_usd=round(sum(month_usd(r, now) for r in rows), 6),
                             running_usd_per_hour=round(sum(r["usd_per_hour"] for r in live), 6), hosts=len(live))

    def update_budget(self, update_: ElasticBudgetUpdate) -> ElasticBudget:
        given = update_.model_dump(exclude_none=True)  # the record refuses negative, NaN and unknown caps
        if given:  # an empty update reads the budget: nothing is written
            self.store.put_setting(BUDGET_KEY, self._budget_settings() | given)
            self.store.add_event("budget_set", given)
        return self.budget()

    def constraints(self) -> Constraints:
        """The budget's caps and the clouds' quotas less what the running elastic hosts already use."""
        b = self.budget()
        return Constraints(
            max_usd_per_hour=max(0.0, b.max_usd_per_hour - b.running_usd_per_hour) if b.max_usd_per_hour else None,
            max_new_hosts=max(0, b.max_new_hosts - b.hosts) if b.max_new_hosts else None,
            monthly_usd_left=max(0.0, b.monthly_usd - b.month_usd - self._committed()) if b.monthly_usd else None,
            allow_metal=b.allow_metal, quotas=self.quotas_left())

    def _check_budget(self, offer: Offer, count: int, usd_each: float) -> None:
        """BudgetExceeded unless ``count`` more machines of ``offer`` (each
        projected to cost ``usd_each``) stay within every cap."""
        self._check_caps([(offer, usd_each)] * count)

    def _check_caps(self, machines: list[tuple[Offer, float]]) -> None:
        """BudgetExceeded unless all of ``machines`` (offer, projected USD) together
        stay within every cap: a purchase is checked whole, before anything is bought."""
        b = self.budget()
        what = ", ".join(sorted({o.type_name for o, _ in machines}))
        metal = sorted({o.type_name for o, _ in machines if o.metal})
        if metal and not b.allow_metal:
            raise BudgetExceeded(f"{', '.join(metal)} is a metal type and the budget's allow_metal is off")
        count = len(machines)
        if b.max_new_hosts and b.hosts + count > b.max_new_hosts:
            raise BudgetExceeded(f"{count} more hosts would make {b.hosts + count}; the budget allows "
                                 f"{b.max_new_hosts} (max_new_hosts)")
        add = sum(o.usd_per_hour for o, _ in machines)
        if b.max_usd_per_hour and b.running_usd_per_hour + add > b.max_usd_per_hour + 1e-9:
            raise BudgetExceeded(f"{count} × {what} adds ${add:.4f}/h to ${b.running_usd_per_hour:.4f}/h "
                                 f"running; the budget allows ${b.max_usd_per_hour:.4f}/h (max_usd_per_hour)")
        spent, cost = b.month_usd + self._committed(), sum(u for _, u in machines)
        if b.monthly_usd and spent + cost > b.monthly_usd + 1e-9:
            raise BudgetExceeded(f"{count} × {what} would cost ${cost:.2f} with ${spent:.2f} spent or committed "
                                 f"this month; the budget allows ${b.monthly_usd:.2f} (monthly_usd)")
        self._check_cloud_caps(machines)

    def _check_cloud_caps(self, machines: list[tuple[Offer, float]]) -> None:
        """BudgetExceeded unless ``machines`` stay within their clouds' quotas and type limits,
        counted with the machines the clouds run already (``in_use``)."""
        vcpus, running = self.in_use()
        add_vcpus: Counter = Counter()
        add_machines: Counter = Counter()
        quotas, limits = {}, {}
        for o, _ in machines:
            add_vcpus[o.quota_family] += o.vcpus
            add_machines[(o.provider, o.type_name)] += 1
            limits[(o.provider, o.type_name)] = o.limit
            quotas[o.quota_family] = (o.provider, self.provider(o.provider).quotas.get(o.quota_family))
        for (cloud, type_name), n in sorted(add_machines.items()):
            limit = limits[(cloud, type_name)]
            if limit is not None and running[(cloud, type_name)] + n > limit:
                raise BudgetExceeded(f"{n} more {type_name} would make {running[(cloud, type_name)] + n} in cloud "
                                     f"{cloud}; its limit for the type is {limit} (limits)")
        for family, n in sorted(add_vcpus.items()):
            cloud, quota = quotas[family]
            if quota is not None and vcpus[family] + n > quota:
                raise BudgetExceeded(f"{n} more vCPUs of quota family {family.partition(':')[2]} would make "
                                     f"{vcpus[family] + n} in cloud {cloud}; its quota is {quota} vCPUs (quotas)")

    def _committed(self) -> float:
        now = time.time()
        return sum(committed_usd(r, now) for r in self.rows() if r["state"] in LIVE)

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

    def _new_name(self, provider: str) -> str:
        with self.store.read() as c:
            names = [r[0] for r in c.execute(select(hosts_t.c.name).where(hosts_t.c.provider == provider))]
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
                        billed: int | None = None, planned_secs: int | None = None) -> list[ElasticHost]:
        """Buy ``count`` machines of one type (all within the budget, or none).
        ``pinned``: added by hand — the scaler never removes them; each ends at
        its TTL (default 24 h). A plan's machines (``pinned`` False) have no TTL:
        scale-in removes them once idle; ``billed`` is the seconds the plan
        bills each for its work (what the monthly cap is checked against)."""
        count = 1 if count is None else count
        if not 1 <= count <= MAX_ADD:
            raise InvalidArgument(f"count must be 1 to {MAX_ADD}, not {count}")
        if ttl_hours is not None and ttl_hours < 1:
            raise InvalidArgument(f"ttl_hours must be at least 1, not {ttl_hours}")
        offer = self.find_offer(provider, instance_type, region)
        ttl = (ttl_hours or DEFAULT_TTL_HOURS) * 3600 if pinned or ttl_hours else 0
        usd_each = offer.usd_per_hour * (billed if billed is not None else max(
            offer.billing_min_secs, ceil_to(ttl or 3600, offer.billing_step_secs))) / 3600
        names = []
        async with self._lock:
            self._check_budget(offer, count, usd_each)
            now = time.time()
            for _ in range(count):
                for _attempt in range(20):
                    name = self._new_name(provider)
                    try:
                        with self.store.tx() as c:
                            c.execute(insert(hosts_t).values(
                                name=name, provider=provider, type_name=offer.type_name, region=offer.region,
                                cloud_id="", state="creating", started=now, ended=None,
                                expires=int(now + ttl) if ttl else 0, usd_per_hour=offer.usd_per_hour,
                                billing_step_secs=offer.billing_step_secs, billing_min_secs=offer.billing_min_secs,
                                boot_secs=offer.boot_secs, pinned=int(pinned), token=secrets.token_urlsafe(24),
                                record={"history": [{"state": "creating", "time": now, "reason": ""}],
                                        "planned_until": now + (billed or 0 if planned_secs is None
                                                                else planned_secs)},
                                updated_at=now))
                            self.store.add_event("elastic_host", {"host": name, "from": "", "to": "creating",
                                                                  "type": offer.type_name}, host=name, conn=c)
                        break
                    except IntegrityError:  # another replica took the name
                        continue
                names.append(name)
        errors = []
        for name in names:
            try:
                await self._create(name)
            except FuseError as exc:
                errors.append(f"{name}: {exc.message}")
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
        self._transition(name, "booting", "the cloud accepted it", cloud_id=machine.id)

    async def remove_hosts(self, names: list[str], reason: str = "removed by hand") -> ElasticRemoved:
        out = ElasticRemoved()
        for name in names:
            try:
                await self.remove(name, reason)
                out.removed.append(name)
            except FuseError as exc:
                out.failed.append(f"{name}: {exc.message}")
        return out

    async def remove(self, name: str, reason: str) -> None:
        """Terminate one elastic host. Refused while VMs (other than prewarmed
        ones, which go with it) are on it: nothing is lost."""
        row = self.row(name)
        if row is None:
            raise NotFound("not a host this pool added")
        if row["state"] == "gone":
            raise Conflict("already gone")
        if row["state"] == "creating":
            raise Conflict("the cloud is still creating it: remove it once it is booting")
        registered = self.store.get_host(name)
        was = (registered or {}).get("state")
        if registered is not None and was == "active":
            self.ctl.hosts.set_state(name, "cordoned")  # first: no placement lands while it is looked at
        if busy := self._work_on(name):
            if registered is not None and was == "active":
                self.ctl.hosts.set_state(name, "active")
            raise Conflict(busy)
        prewarm = getattr(self.ctl, "prewarm", None)
        if prewarm is not None:
            await prewarm.release_host(name)
        for v in self.store.vms_on(name):  # ended VMs end with their machine
            await self.ctl.vms.delete(v["name"], name)
        if row["cloud_id"]:
            await self.provider(row["provider"]).terminate(row["cloud_id"])
        if self.store.get_host(name) is not None:
            await self.ctl.deregister_host(name)
        self._transition(name, "gone", reason)

    def _work_on(self, name: str) -> str | None:
        """Why ``name`` may not go now (VMs with work on it, or being placed there), or None."""
        from .reconcile import WORK_STATES
        vms = [v["name"] for v in self.store.vms_on(name)
               if v["state"] in WORK_STATES and not (v["record"] or {}).get("standby")]
        if vms:
            return (f"{len(vms)} VM{'s' if len(vms) > 1 else ''} on it ({', '.join(vms[:5])}): "
                    "drain it first (fuse controller hosts drain)")
        if self.ctl.vms.pending_on(name).count:
            return "a VM is being placed on it"
        return None

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
            elif r["state"] == "creating" and now - r["updated_at"] > CREATE_TIMEOUT_SECS:
                # the create call never answered here (a controller stopped in it): nothing to follow
                self._transition(r["name"], "gone", f"the cloud's answer never came; look for a machine tagged "
                                                    f"Name={r['name']} in {r['provider']}")
        for cloud, rows in by_cloud.items():
            try:
                provider = self.provider(cloud)
                seen = await provider.describe([r["cloud_id"] for r in rows])
            except FuseError as exc:
                log.warning("cloud %s: %s", cloud, exc.message)
                continue
            for r in rows:
                m = seen.get(r["cloud_id"])
                try:
                    await self._follow(r, m, provider, now)
                except FuseError as exc:
                    log.warning("elastic host %s: %s", r["name"], exc.message)

    async def _follow(self, r: dict, m, provider, now: float) -> None:
        name, state = r["name"], r["state"]
        if m is None or m.state == "terminated":
            if self.store.get_host(name) is not None and (self.store.get_host(name) or {}).get("state") == "active":
                self.ctl.hosts.set_state(name, "cordoned")
            try:  # whatever of it is left (a local machine's VMs outlive its agent)
                await provider.terminate(r["cloud_id"])
            except FuseError:
                pass
            # (marked: a prewarm tells a machine the cloud keeps ending from one removed on purpose)
            rec = dict((self.row(name) or r)["record"] or {}) | {"ended_by_cloud": True}
            self._transition(name, "gone", "the cloud ended the machine", record=rec)
            prewarm = getattr(self.ctl, "prewarm", None)
            if prewarm is not None:  # its standby VMs went with it: their prewarms place them again
                await prewarm.release_host(name, gone=True)
            return
        view = self.ctl.fleet.views.get(name) if self.ctl.fleet else None
        if state == "booting":
            if m.state == "running" and m.address:
                await self._join(r, m.address, provider)
            elif now > r["started"] + r["boot_secs"] + JOIN_GRACE_SECS:
                self._transition(name, "offline", f"no agent answered within {r['boot_secs'] + JOIN_GRACE_SECS} s")
        elif state in ("joined", "cordoned") and view is not None and not view.connected and view.failures >= 3:
            self._transition(name, "offline", f"its agent stopped answering: {view.error}")
        elif state == "cordoned" and (self.store.get_host(name) or {}).get("state") == "active":
            self._transition(name, "joined", "uncordoned")
        elif state == "offline":
            if view is not None and view.connected:
                self._transition(name, "joined", "its agent answers again")
            elif self.store.get_host(name) is None and m.state == "running" and m.address:
                await self._join(r, m.address, provider)

    async def _join(self, r: dict, address: str, provider) -> None:
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
            return
        rec = dict(self.row(r["name"])["record"] or {}) | {"joined": True}
        self._transition(r["name"], "joined", f"its agent answered at {address}", record=rec)

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
        self._task = asyncio.create_task(self._loop(), name="fuse-elastic-pool")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
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
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad pass must not end the loop
                log.exception("elastic pool pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    # ---- plans ----------------------------------------------------------------
    async def plan(self, body, snapshot: list[dict] | None = None, history: list[dict] | None = None,
                   unbounded: bool = False):
        """cloud_plan: one solve over the pool's hosts and the linked clouds'
        offers under the budget; with ``apply``, buy the machines it adds."""
        from starlette.concurrency import run_in_threadpool

        from .planner import plan
        from .request import DEFAULT_IMAGE, model_from_request
        names = self.cloud_names()
        if body.apply and not names:
            raise InvalidArgument("apply buys machines in a linked cloud and none is linked: "
                                  "link one with PUT /v1/pool/clouds/{name} (fuse pool cloud link)")
        snapshot = self.ctl.pool_snapshot() if snapshot is None else snapshot
        image = body.image or DEFAULT_IMAGE
        offers = self.offers(image)
        # (``unbounded``: without the budget's caps, to tell whether they are in the way; the
        # clouds' quotas are no budget and hold either way)
        model = model_from_request(body, snapshot, offers=offers, history=history, constraints=(
            Constraints(quotas=self.quotas_left()) if unbounded else self.constraints()))
        result = await run_in_threadpool(plan, model)
        _wait_for_joins(result, snapshot)
        # what was ruled out before the solve, for want of the image: say so
        lacking = sorted(h["name"] for h in snapshot if h.get("bundles") is not None and image not in h["bundles"])
        whys = ([f"no linked cloud's machines get image {image!r} (a guest bundle)"] if names and not offers else [])
        whys += [f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no image {image!r}"] if lacking else []
        for why in whys if result.unplaced else []:
            for u in result.unplaced:
                u.reason = f"{u.reason}; {why}"
            result.explain.append(why)
        if body.apply and result.new_hosts:
            result.added = await self.buy(result.new_hosts)
            result.explain.append("apply: added " + ", ".join(f"{a.name} ({a.type_name}, {a.state})" for a in result.added))
        return result

    def joining(self, snapshot: list[dict]) -> dict[str, int]:
        """The hosts of ``snapshot`` bought and not joined yet -> seconds until they are expected to."""
        return {h["name"]: int(h["joins_in_secs"]) for h in snapshot if h.get("joins_in_secs") is not None}

    async def buy(self, new_hosts: list, planned_secs: int | None = None) -> list[ElasticHost]:
        """Buy a plan's machines (``ElasticNewHost``s): all of them or none. The
        whole set is checked against the caps first; if the cloud fails one,
        those already bought are removed again and the error is raised."""
        machines = []
        for h in new_hosts:  # every machine's cloud is linked before anything is bought
            if h.one_space:
                raise InvalidArgument(f"{h.provider} {h.type_name} is a one-VM sandbox, not a host: it cannot be added")
            machines.append((self.find_offer(h.provider, h.type_name, h.region), h.usd_per_hour * h.billed_secs / 3600))
        async with self._buying:
            self._check_caps(machines)
            added: list[ElasticHost] = []
            try:
                for h in new_hosts:
                    added += await self.add_hosts(h.provider, h.type_name, h.region, 1, pinned=False,
                                                  billed=h.billed_secs, planned_secs=planned_secs)
                    if added[-1].state == "gone":
                        raise FuseError(f"{h.provider} did not create {h.type_name}", code="cloud_error").with_status(502)
            except FuseError:
                for a in added:
                    try:
                        await self.remove(a.name, "the plan's other machines could not be bought")
                    except FuseError:
                        pass
                raise
        return added

    def _reopen(self, mem_mib: int, image: str, provider: str | None) -> str | None:
        """Uncordon a host scale-in cordoned (not one whose TTL came) that has room for a VM
        of ``mem_mib`` and the image, on ``provider`` when given: its room is wanted again, and
        it is paid for already (a create pinned to a cloud bought a second machine beside one
        cordoned with room). Its name, or None."""
        from .reconcile import scaler_cordoned, uncordon

        for name, r in scaler_cordoned(self, time.time()).items():
            if provider is not None and r["provider"] != provider:
                continue
            live = self.ctl.fleet.live(name) if self.ctl.fleet else {}
            if not live.get("connected") or image not in {b.get("name") for b in live.get("bundles") or []}:
                continue
            fleet, _ = self.ctl.vms.arrays(only=name)
            if len(fleet.ids) and fleet.free_mem[0] >= mem_mib and fleet.vm_count[0] < fleet.vm_limit[0]:
                uncordon(self, name)
                return name
        return None

    async def host_for(self, vcpus: int, mem_mib: int, image: str, provider: str | None, timeout: float,
                       buy: bool = True) -> str | None:
        """Scale out for one VM that no host took (a create on auto, or on a
        cloud): the pool's solve for it, under the budget; when it adds a
        machine, buy it and wait until it joined; when it puts the VM on a machine
        bought earlier that has not joined yet, wait until that one joined. Its
        name, or None when the solve puts the VM on a host already there (room
        came free: place again). On a cloud, only that cloud's hosts count as
        already there. ``buy`` False (autoscale off): nothing is bought, only a
        machine joining is waited for; None when none has the room."""
        from ...models.pool import ElasticPlanRequest
        req = ElasticPlanRequest(count=1, image=image, cpus=vcpus, memory_mb=mem_mib, provider=provider,
                                 no_scale=None if buy else True)
        # One scale-out at a time, through the join: creates queued behind it plan
        # again and find the machine it bought (one machine for many, not one each).
        deadline = time.monotonic() + timeout
        async with self._scaling:
            if self._reopen(mem_mib, image, provider) is not None:
                return None  # a host the scaler cordoned has the room: place again
            while True:
                snapshot = self.ctl.pool_snapshot()
                if provider is not None:
                    snapshot = [h for h in snapshot if h.get("provider") == provider]
                result = await self.plan(req, snapshot)
                if result.unplaced and not buy:
                    return None  # no machine joining has the room either
                if result.unplaced:
                    raise BudgetExceeded(f"the elastic pool cannot add a machine for it: {result.unplaced[0].reason}")
                if result.new_hosts:
                    break
                # a machine bought earlier (by hand, a plan, a prewarm) that has not joined yet has
                # the room, paid for: wait for it as for one bought now, and buy nothing
                joining = self.joining(snapshot)
                name = next((a.host for a in result.assignments if a.host in joining), None)
                if name is None:
                    return None  # a host already there (room came free): place again
                try:
                    await self.wait_joined(name, max(1.0, deadline - time.monotonic()))
                except Conflict:
                    if (self.row(name) or {}).get("state") in ("gone", "offline") and time.monotonic() < deadline:
                        continue  # it will not join: solve again without it
                    raise
                return name
            # its VM is placed the moment it joins: the machine is kept for it only until then
            # (the VM's own life keeps it after; a default duration kept it idle an hour more)
            nh = result.new_hosts[0]
            boot = self.find_offer(nh.provider, nh.type_name, nh.region).boot_secs
            added = await self.buy(result.new_hosts[:1], planned_secs=int(boot + JOIN_GRACE_SECS))
            await self.wait_joined(added[0].name, timeout)
            return added[0].name
