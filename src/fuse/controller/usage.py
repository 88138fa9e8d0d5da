"""Fleet usage: the same metering query on every host, rows tagged with the
host, totals summed exactly (decimal, bytes as integers), a host registered
under two names counted once (same agent identity), and the hosts that did
not answer listed by name in `unreachable` (why, in `unreachable_reasons`).

A machine under several names is asked once, through the first of them that is
connected (the first at all when none is), and each of its VMs is reported
under the name the store records it under — the one it was created or moved
through, as `GET /v1/vms` lists it — or, for a VM the store no longer lists
there (deleted since, or moved away), under the name its newest event on the
machine carries (the name it ran under there), else the name asked.

A row is one VM, as a host reports it: its name and its `created_at`, so a VM
deleted and another created under its name are two rows, and only the row of
the VM the store holds (same `created_at`) takes the name it records.

The window is fixed here, once, and every host is asked for that same
[from, to): the report echoes it as unix seconds, as a host does.

Figures stay exact end to end: a host's reply is read with its numbers as
decimals, summed as decimals, and the route writes them as exact JSON number
literals (``fuse.agent.metering.exact_json``), so the fleet's totals are the
sums of the rows the report lists, to the last digit."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from ..agent.metering import window
from ..errors import FuseError, HostUnreachable
from .store import vms as vms_t
from .vms import TOKEN_REJECTED

# What a host's metering totals (fuse.agent.metering): seconds are exact
# decimals, bytes are integers. Every report carries all four, zeros included.
DECIMAL_TOTALS = ("cpu_seconds", "mem_mib_seconds", "wall_seconds")
INTEGER_TOTALS = ("state_bytes_written",)


def _dec(v: Decimal | int) -> Decimal:
    return v if isinstance(v, Decimal) else Decimal(v)


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
        asked = {g[0]: self._ask(g) for g in groups}
        params = {"from": repr(t0), "to": repr(t1)}

        async def one(host: str):
            try:
                resp = await self.ctl.fleet.conn(host).request("GET", "/v1/host/usage", params=params, timeout=15)
            except HostUnreachable as exc:
                return host, None, exc.message
            if resp.status_code == 400 and (said := _agent_refusal(resp)) is not None:
                raise FuseError(said, code="invalid_argument").with_status(400)
            if resp.status_code == 401:
                return host, None, TOKEN_REJECTED
            if resp.status_code != 200:  # (a 400 too that is not the agent's: a proxy's page)
                return host, None, f"host answered {resp.status_code}"
            data, problem = _report(resp.content)
            if problem:
                return host, None, f"the host's usage report (GET /v1/host/usage) is not a fuse agent's: {problem}"
            return host, data, ""

        results = await asyncio.gather(*(one(asked[g[0]]) for g in groups))
        names = {h: g for g in groups for h in g}
        recorded = self._recorded(groups)
        vms: list[dict[str, Any]] = []
        reasons: dict[str, str] = {}
        totals: dict[str, Decimal | int] = {k: Decimal(0) for k in DECIMAL_TOTALS} | {k: 0 for k in INTEGER_TOTALS}
        aliases = {g[0]: g[1:] for g in groups if len(g) > 1}
        last = self._last_tagged(results, names, recorded)
        for host, data, err in sorted(results, key=lambda x: x[0]):
            if data is None:
                reasons[host] = err
                continue
            group = names[host]
            for row in data.get("vms", []):
                vm = row.get("vm")
                rec = recorded.get((group[0], vm))
                if len(group) == 1:
                    tag = host
                elif _is_recorded(rec, row):
                    tag = rec[0]
                else:  # a VM the store no longer records there, or an earlier VM of a name it records
                    # again: the name it ran under, by its own events
                    tag = self._ran_under(row, group) or last.get((group[0], vm), host)
                vms.append({"host": tag, **row})
            for k, v in (data.get("totals") or {}).items():
                if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
                    continue
                if isinstance(v, int) and isinstance(totals.get(k, 0), int):
                    totals[k] = int(totals.get(k, 0)) + v
                else:
                    totals[k] = _dec(totals.get(k, 0)) + _dec(v)
        return {"from": t0, "to": t1, "vms": vms,
                "totals": dict(sorted(totals.items())),
                "hosts": sorted(h for g in groups for h in g[:1]), "aliases": aliases,
                "unreachable": sorted(reasons), "unreachable_reasons": reasons}

    def _ask(self, names: list[str]) -> str:
        """The name to ask a machine under ``names`` (sorted) through: the first connected."""
        views = getattr(self.ctl.fleet, "views", {})
        return next((h for h in names if (v := views.get(h)) is not None and v.connected), names[0])

    def _last_tagged(self, results, names: dict[str, list[str]],
                     recorded: dict[tuple[str, str], tuple[str, str | None]]) -> dict[tuple[str, str], str]:
        """(the machine's first name, VM) -> the name the newest stored event of the VM on
        that machine carries, for the VMs of machines under several names that the store no
        longer lists there (deleted, or moved away): the name it ran under there, as its
        events keep it (``fleet._last_tagged``), not the name the machine was asked through."""
        from .fleet import _last_tagged

        out: dict[tuple[str, str], str] = {}
        with self.ctl.store.read() as c:
            for host, data, _ in results:
                group = names[host]
                if data is None or len(group) < 2:
                    continue
                gone = {row.get("vm") for row in data.get("vms", []) if isinstance(row.get("vm"), str)
                        and (group[0], row.get("vm")) not in recorded}
                out.update({(group[0], vm): h for vm, h in _last_tagged(c, gone, group).items()})
        return out

    def _ran_under(self, row: dict[str, Any], group: list[str]) -> str | None:
        """The name of a machine under several names that an earlier VM of a name now used again
        ran under there: the name its first event since it was created carries (review 31: it
        was reported under the name asked, so a past window's rows moved with a later create)."""
        from .fleet import _tagged_since

        try:
            since = datetime.fromisoformat(str(row.get("created_at"))).timestamp()
        except (TypeError, ValueError):
            return None
        with self.ctl.store.read() as c:
            return _tagged_since(c, str(row.get("vm")), group, since)

    def _recorded(self, groups: list[list[str]]) -> dict[tuple[str, str], tuple[str, str | None]]:
        """(the machine's first name, VM) -> (the machine's name the store records the VM under,
        the VM's ``created_at``), for machines under several names (one name: that name is
        the only answer)."""
        first = {h: g[0] for g in groups if len(g) > 1 for h in g}
        if not first:
            return {}
        out: dict[tuple[str, str], tuple[str, str | None]] = {}
        with self.ctl.store.read() as c:
            q = select(vms_t.c.name, vms_t.c.host, vms_t.c.record).where(vms_t.c.host.in_(sorted(first)))
            for name, host, record in sorted(c.execute(q), key=lambda r: (r[0], r[1])):
                created = record.get("created_at") if isinstance(record, dict) else None
                out.setdefault((first[host], name), (host, created))
        return out


def _agent_refusal(resp) -> str | None:
    """The message of a host agent's JSON error body (its 400 for a window it refuses), or None
    for any other body: a proxy's or gateway's page is that host's failure, not the caller's."""
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError, RecursionError):
        return None
    msg = err.get("message") if isinstance(err, dict) else None
    return msg if isinstance(msg, str) and msg else None


def _report(content: bytes) -> tuple[dict[str, Any] | None, str]:
    """A host's usage answer, its numbers read as decimals, or (None, what makes it no fuse
    agent's report). One host's odd answer (a proxy's 200 page, a JSON list) must not fail
    the whole fleet's report (it was a 500): that host reads as out of reach, with why."""
    try:
        data = json.loads(content, parse_float=Decimal)
    except (ValueError, RecursionError):  # (not JSON, or not UTF-8, or nested past reading)
        return None, "it is not JSON"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("vms"), list):
        return None, "it has no list of vms"
    if any(not isinstance(r, dict) or not isinstance(r.get("vm"), str) for r in data["vms"]):
        return None, "its vms hold an entry that is not a VM's row"
    if not isinstance(data.get("totals"), dict):
        return None, "it has no totals object"
    return data, ""


def _is_recorded(recorded: tuple[str, str | None] | None, row: dict[str, Any]) -> bool:
    """Whether a usage row is of the VM the store records (``recorded``: its name there, its
    ``created_at``), reported under that name; a row or record without ``created_at`` matches
    by name, as from an agent that keyed rows by name alone."""
    if recorded is None:
        return False
    created = recorded[1]
    return None in (created, row.get("created_at")) or created == row.get("created_at")
