"""Fleet usage: the same metering query on every host, rows tagged with the
host, totals summed exactly (decimal, bytes as integers), a host registered
under two names counted once (same agent identity), and the hosts that did
not answer listed in `unreachable`."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

from ..errors import FuseError, HostUnreachable


def _dec(v: Any) -> Decimal:
    return Decimal(str(v))


class UsageService:
    def __init__(self, ctl):
        self.ctl = ctl

    async def usage(self, start: str | None, end: str | None) -> dict[str, Any]:
        rows = self.ctl.store.list_hosts()
        # One query per machine: hosts that share an agent identity are one.
        by_agent: dict[str, list[str]] = {}
        for r in rows:
            by_agent.setdefault(r["agent_id"] or f"host:{r['id']}", []).append(r["id"])
        groups = [sorted(ids) for ids in by_agent.values()]
        params = {k: v for k, v in (("from", start), ("to", end)) if v not in (None, "")}

        async def one(host: str):
            try:
                resp = await self.ctl.fleet.conn(host).request("GET", "/v1/host/usage", params=params, timeout=15)
            except HostUnreachable as exc:
                return host, None, exc.message
            if resp.status_code == 400:
                raise FuseError(resp.json()["error"]["message"], code="invalid_argument").with_status(400)
            if resp.status_code != 200:
                return host, None, f"host answered {resp.status_code}"
            return host, resp.json(), ""

        results = await asyncio.gather(*(one(g[0]) for g in groups))
        vms, unreachable = [], []
        totals: dict[str, Decimal | int] = {}
        aliases = {g[0]: g[1:] for g in groups if len(g) > 1}
        for host, data, err in sorted(results, key=lambda x: x[0]):
            if data is None:
                unreachable.append({"host": host, "reason": err})
                continue
            for row in data.get("vms", []):
                vms.append({"host": host, **row})
            for k, v in (data.get("totals") or {}).items():
                if isinstance(v, int) and not isinstance(v, bool):
                    totals[k] = int(totals.get(k, 0)) + v
                elif isinstance(v, float):
                    totals[k] = _dec(totals.get(k, 0)) + _dec(v)
        return {"from": start, "to": end, "vms": vms,
                "totals": {k: (float(v) if isinstance(v, Decimal) else v) for k, v in sorted(totals.items())},
                "hosts": sorted(h for g in groups for h in g[:1]), "aliases": aliases, "unreachable": unreachable}
