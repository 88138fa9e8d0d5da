"""The elastic pool's scale-out: plans over its hosts and clouds, buying their machines.

``ScaleOutMixin`` is the part of ``ElasticPool`` (``elastic``) that solves a plan
(``cloud_plan``) under the budget and buys the machines it adds, all or none, and
finds a machine for a create no host took (``host_for``): a cordoned host reopened,
a machine joining already, or one bought and waited for. The solve itself is the
planner's (``planner.plan``); the hosts' lives are ``elastic``'s.
"""

from __future__ import annotations

import json
import math
import time

from ...errors import Conflict, FuseError, InvalidArgument
from ...models.pool import ElasticHost
from .elastic_budget import BudgetExceeded
from .elastic_host import CREATE_LEASE_SECS, JOIN_GRACE_SECS
from .model import Constraints


def _wait_for_joins(result, snapshot: list[dict], late: dict[str, tuple[int, int]] | None = None) -> None:
    """A plan that puts work on hosts bought and not joined yet (``joins_in_secs`` in the
    snapshot) is ready only once they join: ``ready_in_secs`` and their explain lines say
    so, and the ``json`` answer gains ``joining`` (host -> seconds). A host past its boot
    time (``late``: host -> (seconds past it, seconds until it is given up)) has no honest
    estimate: its line says it is late, and its figure is the latest it may still join (it
    is given up then: offline, or gone if the cloud never answered its create); the
    ``json`` answer lists it under ``late`` too (host -> seconds past its boot time). The
    model has no field for it: a re-solve of that model (``fuse pool plan --model``) sees
    them as running hosts."""
    late = late or {}
    joins = {h["name"]: h for h in snapshot if h.get("joins_in_secs") is not None}
    used = sorted({a.host for a in result.assignments if a.host in joins})
    if not used:
        return
    secs = {n: late[n][1] if n in late else int(joins[n]["joins_in_secs"]) for n in used}
    result.ready_in_secs = max([result.ready_in_secs] + list(secs.values()))
    for i, line in enumerate(result.explain):
        for n in used:
            if f" on {n} (running cloud host" in line:
                when = (f"{late[n][0]} s late (past its boot time): joins once its agent answers, "
                        f"given up in {late[n][1]} s if not" if n in late else f"joins in about {secs[n]} s")
                result.explain[i] = line.replace(
                    f" on {n} (running cloud host", f" on {n} (cloud host still {joins[n].get('state', 'booting')}, "
                                                    f"{when}", 1)
    body = json.loads(result.json) if result.json else {}
    body["plan"] = result.model_dump(mode="json", exclude={"json"})
    body["joining"] = secs
    if late_used := {n: late[n][0] for n in used if n in late}:
        body["late"] = late_used
    result.json = json.dumps(body, sort_keys=True)


class ScaleOutMixin:
    """Plans and buying their machines: part of ``ElasticPool``."""

    async def plan(self, body, snapshot: list[dict] | None = None, history: list[dict] | None = None,
                   unbounded: bool = False):
        """cloud_plan: one solve over the pool's hosts and the linked clouds'
        offers under the budget; with ``apply``, buy the machines it adds."""
        from starlette.concurrency import run_in_threadpool

        from .planner import plan
        from .request import DEFAULT_IMAGE, model_from_request
        from .solution import rejson
        names = self.cloud_names()
        if body.apply and not names:
            raise InvalidArgument("apply buys machines in a linked cloud and none is linked: "
                                  "link one with PUT /v1/pool/clouds/{name} (fuse pool cloud link)")
        snapshot = self.ctl.pool_snapshot() if snapshot is None else snapshot
        image = body.image or DEFAULT_IMAGE
        offers = self.offers(image)
        self._check_cloud_has(body, image, offers, snapshot)
        # (``unbounded``: without the budget's caps nor the clouds' quotas and type limits, to
        # tell whether they are in the way: a purchase past any of them is budget_exceeded)
        if unbounded:
            offers = [o.model_copy(update={"limit": None}) for o in offers]
        model = model_from_request(body, snapshot, offers=offers, history=history, constraints=(
            Constraints() if unbounded else self.constraints()))
        result = await run_in_threadpool(plan, model)
        _wait_for_joins(result, snapshot, self._late(snapshot))
        # what was ruled out before the solve, for want of the image: say so
        lacking = sorted(h["name"] for h in snapshot if h.get("bundles") is not None and image not in h["bundles"])
        whys = ([f"no linked cloud's machines get image {image!r} (a guest bundle)"] if names and not offers else [])
        whys += [f"{', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no image {image!r}"] if lacking else []
        whys += [away] if result.unplaced and (away := self._away(model, snapshot, set(lacking))) else []
        for why in whys if result.unplaced else []:
            for u in result.unplaced:
                u.reason = f"{u.reason}; {why}"
            result.explain.append(why)
        if body.apply and result.new_hosts:
            result.added = await self.buy(result.new_hosts)
            result.explain.append("apply: added " + ", ".join(f"{a.name} ({a.type_name}, {a.state})" for a in result.added))
        return rejson(result)

    def _away(self, model, snapshot: list[dict], lacking: set[str]) -> str:
        """The hosts of ``snapshot`` that take no work now (disconnected, cordoned...), which the
        model leaves out, and that the request's rules would admit, by name with why ("" when
        none): a devices_only plan's own device away was named nowhere in its reason."""
        from .model import host_reject
        from .request import UNUSABLE_STATES, host_from_snapshot

        grp, c = model.groups[0], model.constraints
        away = []
        for h in snapshot:
            if h["name"] in lacking or str(h.get("state", "")).lower() not in UNUSABLE_STATES:
                continue
            host = host_from_snapshot({**h, "state": "active"})
            if host is not None and host_reject(grp, host, c, size=False) is None:
                away.append(h["name"])
        if not away:
            return ""
        vms = getattr(self.ctl, "vms", None)
        reasons = vms.arrays(among=set(away))[1] if vms is not None else {}
        said = [f"{n} ({reasons.get(n, 'unavailable')})" for n in away[:3]]
        more = f" and {len(away) - 3} more" if len(away) > 3 else ""
        return f"taking no work now: {', '.join(said)}{more}"

    def _check_cloud_has(self, body, image: str, offers: list, snapshot: list[dict]) -> None:
        """400 naming the image when the plan is pinned to a linked cloud (``provider``) whose
        machines do not get it, and no host of that cloud already there runs it: only clouds
        whose machines get the image offer machines, so the pin would otherwise read as
        naming no linked cloud at all (the cloud is linked: it lacks the image)."""
        cloud = body.provider
        if not cloud or body.devices_only or cloud not in self.cloud_names():
            return
        if any(o.provider == cloud for o in offers) or any(
                h.get("provider") == cloud and (h.get("bundles") is None or image in h["bundles"]) for h in snapshot):
            return
        has = sorted(self.provider(cloud).images())
        raise InvalidArgument(f"cloud {cloud!r} is linked, but its machines do not get image {image!r} (a guest "
                              f"bundle; they get: {', '.join(has) or 'none'}), so nothing of it can go there")

    def _late(self, snapshot: list[dict]) -> dict[str, tuple[int, int]]:
        """The hosts of ``snapshot`` bought, not joined, and past their boot time -> (seconds
        past it, seconds until the pool gives them up: offline after the join grace, gone when
        a create call's lease runs out, its controller stopped: ``ElasticPool._settle``)."""
        now, out = time.time(), {}
        for h in snapshot:
            row = self.row(h["name"]) if h.get("joins_in_secs") is not None else None
            if row is None or now <= row["started"] + row["boot_secs"]:
                continue
            end = (row["updated_at"] + CREATE_LEASE_SECS if row["state"] == "creating"
                   else row["started"] + row["boot_secs"] + JOIN_GRACE_SECS)
            out[h["name"]] = (int(now - row["started"] - row["boot_secs"]), max(1, math.ceil(end - now)))
        return out

    def joining(self, snapshot: list[dict]) -> dict[str, int]:
        """The hosts of ``snapshot`` bought and not joined yet -> seconds until they are expected to."""
        return {h["name"]: int(h["joins_in_secs"]) for h in snapshot if h.get("joins_in_secs") is not None}

    async def buy(self, new_hosts: list, planned_secs: int | None = None,
                  bought_for: str | None = None) -> list[ElasticHost]:
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
                                                  billed=h.billed_secs, planned_secs=planned_secs,
                                                  bought_for=bought_for)
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
