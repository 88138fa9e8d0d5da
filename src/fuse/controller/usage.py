"""Fleet usage: the same metering query on every host, rows tagged with the
host, totals summed exactly (decimal, bytes as integers), a host registered
under two names counted once (same agent identity), and the hosts that did
not answer listed by name in `unreachable` (why, in `unreachable_reasons`).

The window is fixed here, once, and every host is asked for that same
[from, to): the report echoes it as unix seconds, as a host does."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

from ..agent.metering import window
from ..errors import FuseError, HostUnreachable

# What a host's metering totals (fuse.agent.metering): seconds are exact
# decimals, bytes are integers. Every report carries all four, zeros included.
DECIMAL_TOTALS = ("cpu_seconds", "mem_mib_seconds", "wall_seconds")
INTEGER_TOTALS = ("state_bytes_written",)


def _dec(v: Any) -> Decimal:
    return Decimal(str(v))




class UsageService:
    def __init__(self, ctl):
        self.ctl = ctl

    async def usage(self, start: str | None, end: str | None) -> dict[str, Any]:
        t0, t1 = window(start, end)
        rows = self.ctl.store.list_hosts()
        # One query per machine: hosts that share an agent identity are one.
        by_agent: dict[str, list[str]] = {}
        for r in rows:
            by_agent.setdefault(r["agent_id"] or f"host:{r['id']}", []).append(r["id"])
        groups = [sorted(ids) for ids in by_agent.values()]
        params = {"from": repr(t0), "to": repr(t1)}

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
        vms: list[dict[str, Any]] = []
        reasons: dict[str, str] = {}
        totals: dict[str, Decimal | int] = {k: Decimal(0) for k in DECIMAL_TOTALS} | {k: 0 for k in INTEGER_TOTALS}
        aliases = {g[0]: g[1:] for g in groups if len(g) > 1}
        for host, data, err in sorted(results, key=lambda x: x[0]):
            if data is None:
                reasons[host] = err
                continue
            for row in data.get("vms", []):
                vms.append({"host": host, **row})
            for k, v in (data.get("totals") or {}).items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                if isinstance(v, int) and isinstance(totals.get(k, 0), int):
                    totals[k] = int(totals.get(k, 0)) + v
                else:
                    totals[k] = _dec(totals.get(k, 0)) + _dec(v)
        return {"from": t0, "to": t1, "vms": vms,
                "totals": {k: (float(v) if isinstance(v, Decimal) else v) for k, v in sorted(totals.items())},
                "hosts": sorted(h for g in groups for h in g[:1]), "aliases": aliases,
                "unreachable": sorted(reasons), "unreachable_reasons": reasons}
