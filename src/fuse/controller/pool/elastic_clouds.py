"""The elastic pool's linked clouds: linking, their providers, what they offer and what is used of it.

``CloudsMixin`` is the part of ``ElasticPool`` (``elastic``) that keeps the clouds
linked in the store and a provider for each (re-linked on another replica or after a
restart), and reads their offers, images and quotas for the plans and the caps. It
uses the pool's store, state dir and host rows (``ElasticPool.rows``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from sqlalchemy import delete, insert, select

from ...errors import Conflict, FuseError, InvalidArgument, NotFound
from ..store import clouds as clouds_t
from .catalogue import default_catalogue
from .elastic_host import LIVE
from .model import Offer

CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def _uncapped(options: dict[str, Any]) -> dict[str, Any]:
    """A cloud's link options but its caps (quotas, limits): what its hosts' ids depend on."""
    from .providers.base import CAP_OPTIONS
    return {k: v for k, v in (options or {}).items() if k not in CAP_OPTIONS}


class CloudsMixin:
    """Linked clouds: part of ``ElasticPool``."""

    def _cloud_dir(self, name: str):
        return self.ctl.state_dir / "clouds" / name

    def clouds(self) -> list[dict[str, Any]]:
        from .providers import public_options
        with self.store.read() as c:
            rows = [dict(r) for r in c.execute(select(clouds_t).order_by(clouds_t.c.name)).mappings()]
        return [{"name": r["name"], "kind": r["kind"], "options": public_options(r["kind"], r["options"]),
                 "types": sorted({o.type_name for o in self.provider(r["name"]).offers()})} for r in rows]

    async def link(self, name: str, kind: str, options: dict[str, Any]) -> dict[str, Any]:
        """Link (or re-link with new options) a cloud: its offers join the plans. The cloud
        is asked first (``Provider.check``: an aws cloud's AMIs, its endpoint and credentials);
        a link it refuses stores nothing. What is stored is the options as the check resolved
        them (an aws ``image_id`` as ``{arch: AMI}``), so a re-link from the store asks nothing."""
        from .providers import link
        if not CLOUD_NAME.fullmatch(name or ""):
            raise InvalidArgument(f"cloud name {name!r}: lower-case letters, digits and '-', starting with a letter")
        if name in ("auto", "local"):  # (`on` reads these as its keywords: such a cloud could never be chosen)
            raise InvalidArgument(f"cloud name {name!r} is one of on's keywords (auto, local): choose another")
        from .providers.base import CAP_OPTIONS
        options = dict(options or {})
        if kind == "local":  # its machines' dir, the same for every replica on this machine
            options.setdefault("dir", str(self._cloud_dir(name).resolve()))
        asked = link(kind, name, options, self._cloud_dir(name))  # (the options checked first: no call)
        try:
            options = await asked.check(options)
        finally:
            await asked.close()
        # the provider a re-link from the store makes (its offers narrowed by what the check found)
        provider = link(kind, name, options, self._cloud_dir(name))
        live = [r["name"] for r in self.rows() if r["provider"] == name and r["state"] in LIVE]
        was = self._cloud_row(name)
        if live and not (was is not None and was["kind"] == kind and _uncapped(was["options"]) == _uncapped(options)):
            # its hosts' ids mean something only to the cloud as it was linked; its caps
            # (quotas, limits) are the pool's own, so they may change under running hosts
            raise Conflict(f"cloud {name} has hosts ({', '.join(live)}): remove them before re-linking it "
                           f"(only its {' and '.join(sorted(CAP_OPTIONS))} may change while it has hosts)")
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

    def caps_running(self) -> tuple[dict[str, int], dict[str, int]]:
        """What the live hosts take of each quota (vCPUs) and type limit (machines, by
        "provider/type_name"), at most all of it: an answer says the cap as set, what they
        leave (``quotas_left``, an offer's ``limit``) and this summed (``Constraints.quota_running``)."""
        vcpus, machines = self.in_use()
        quotas, limits = {}, {}
        for c in self.cloud_names():
            provider = self.provider(c)
            quotas |= {f: min(n, vcpus[f]) for f, n in provider.quotas.items() if vcpus[f]}
            limits |= {f"{o.provider}/{o.type_name}": min(o.limit, machines[(o.provider, o.type_name)])
                       for o in provider.offers() if o.limit is not None and machines[(o.provider, o.type_name)]}
        return quotas, limits
