"""Scale-in (seed 001 ``cloud_reconcile``): one pass over the elastic hosts.

``decide`` is pure: hosts, the VMs on them and the room elsewhere in, one
``ElasticDecision`` per live elastic host out. The rules, in order:

1. A host whose TTL (``expires``) has come goes: ``remove`` when empty, else
   ``cordon`` (its VMs have to be moved or end first). Hosts added by hand
   (``pinned``) end only so: the scaler never removes them. Standby VMs are no
   VMs here: they go with it, and a prewarm pinned to it ends with it
   (``ElasticPool.remove``), as when its cloud ends it.
2. An idle host (no VMs; prewarmed VMs do not count as use once their prewarm
   is gone) goes at the end of its paid time: ``remove`` when that end is
   within ``horizon`` seconds (the next pass would be too late: another billing
   step would start), else ``keep`` until then. ``saves_usd`` is what keeping
   it one more billing step would cost. A machine a plan bought is kept until
   the work it was bought for was planned to end (``record.planned_until``:
   boot plus the plan's billed time), so "apply, then create on auto" finds it
   (also when that end is within the horizon, until a VM was placed on it: its
   VMs may not exist yet; ``record.used``).
3. Of the hosts with VMs, the least used (by memory) is cordoned when the
   other hosts (the operator's own included) have room for all its VMs and
   for those of the hosts already cordoned (by an earlier pass, or for their
   TTL): first fit of all those VMs, largest first, into the free memory and
   VM slots of the hosts that take work. A cordoned host is not room. One
   host per pass, and the room counted is not promised twice: each earlier
   cordon holds the room its VMs need until they are gone. The standby VMs
   of a live prewarm count here as VMs (use, and room wanted elsewhere): a
   cordoned host's are no longer claimed, and the prewarm places them again
   on a host that takes work (``PrewarmService.fill``) — one within its ``on``
   that has its image (``PrewarmService.room_hosts``): room elsewhere is none
   for them.
4. Anything else is kept, and says why.

A host scale-in cordoned (not for its TTL; ``scaler_cordoned``) is still a
running, paid host: the plans count it as one with room, and a create that
finds no other host uncordons it (``uncordon``) before anything is bought.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...models.pool import ElasticDecision
from ..hosts import FINISHED
from .elastic_host import paid_until

HORIZON_SECS = 120  # an idle host this close to its next billing step goes now


@dataclass(frozen=True)
class Load:
    """What is on one elastic host: VM memory sizes, prewarmed VMs, its size."""
    vms: tuple[int, ...] = ()  # MiB of each VM (not prewarmed)
    prewarmed: int = 0
    mem_mib: int = 0  # its memory capacity
    standby: tuple[int, ...] = ()  # MiB of each prewarmed VM (of a live prewarm)
    # the hosts each prewarmed VM may be placed on again (its prewarm's ``on`` and image);
    # None (or none given): any
    standby_on: tuple[frozenset[str] | None, ...] = ()

    @property
    def held(self) -> tuple[int, ...]:
        """MiB of every VM that needs room elsewhere should the host be cordoned."""
        return self.vms + self.standby

    @property
    def items(self) -> list[tuple[int, frozenset[str] | None]]:
        """``held`` with where each may go: (MiB, the hosts it may take room on, None: any)."""
        on = list(self.standby_on) + [None] * (len(self.standby) - len(self.standby_on))
        return [(mem, None) for mem in self.vms] + list(zip(self.standby, on))


def _clock(t: float, now: float | None = None) -> str:
    """``t`` as UTC time of day, with its date when that is not ``now``'s (a machine kept
    for work planned 10 days out read "until 16:26:43 UTC", a time already past today)."""
    import time
    day = time.gmtime(t)[:3] == time.gmtime(now)[:3] if now is not None else True
    return time.strftime("%H:%M:%S UTC" if day else "%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _fits(vms: list[tuple[int, frozenset[str] | None]], room: dict[str, tuple[int, int]]) -> bool:
    """First fit decreasing of VMs (MiB, the hosts they may go to or None: any) into the
    hosts' (free MiB, free slots)."""
    bins = {h: list(r) for h, r in room.items()}
    # those with the fewest hosts to go to first (a VM that may go anywhere took the one
    # host a standby VM may use), each kind largest first
    for mem, allowed in sorted(vms, key=lambda v: (math.inf if v[1] is None else len(v[1]), -v[0])):
        for h, b in bins.items():
            if (allowed is None or h in allowed) and b[0] >= mem and b[1] >= 1:
                b[0] -= mem
                b[1] -= 1
                break
        else:
            return False
    return True


def decide(rows: list[dict], loads: dict[str, Load], room: dict[str, tuple[int, int]], now: float,
           horizon: float = HORIZON_SECS) -> list[ElasticDecision]:
    """One decision per live elastic host (``rows`` are ``elastic_hosts`` rows).
    ``room``: free (MiB, VM slots) of every usable host, elastic or own."""
    out: dict[str, ElasticDecision] = {}
    live = [r for r in rows if r["state"] != "gone"]
    for r in live:
        name, load = r["name"], loads.get(r["name"], Load())
        used = len(load.vms)
        if r["expires"] and now >= r["expires"]:
            step = max(int(r["billing_step_secs"]), 1)
            out[name] = (ElasticDecision(host=name, action="remove", reason="its TTL ended",
                                         saves_usd=round(r["usd_per_hour"] * step / 3600, 6))
                         if not used else
                         ElasticDecision(host=name, action="cordon", until=int(now + horizon),
                                         reason=f"its TTL ended with {used} VMs on it: move them or let them end"))
        elif r["state"] in ("creating", "booting"):
            out[name] = ElasticDecision(host=name, action="keep", until=int(now + horizon), reason=f"{r['state']}")
        elif r["pinned"]:
            out[name] = ElasticDecision(host=name, action="keep", until=int(r["expires"] or now + horizon),
                                        reason="added by hand: it ends at its TTL")
        elif load.prewarmed and not used:
            out[name] = ElasticDecision(host=name, action="keep", until=int(now + horizon),
                                        reason=f"keeps {load.prewarmed} prewarmed VMs ready")
        elif not used and (r["record"] or {}).get("planned_until", 0) > now and not (
                (r["record"] or {}).get("used") and r["record"]["planned_until"] - now <= horizon):
            # (however near its end while no VM has been placed on it: the VMs it was bought for
            # may not be created yet; once some came and went, its end within the horizon is
            # its paid step's: kept past it, the next step was billed for nothing)
            until = (r["record"] or {})["planned_until"]
            out[name] = ElasticDecision(host=name, action="keep", until=int(until),
                                        reason=f"idle; bought for work planned until {_clock(until, now)}")
        elif not used:
            end = paid_until(r, now)
            step = max(int(r["billing_step_secs"]), 1)
            if end - now <= horizon:
                out[name] = ElasticDecision(host=name, action="remove", saves_usd=round(r["usd_per_hour"] * step / 3600, 6),
                                            reason=f"idle; its paid time ends at {_clock(end, now)}")
            else:
                out[name] = ElasticDecision(host=name, action="keep", until=int(end - horizon),
                                            reason=f"idle; paid until {_clock(end, now)}, removed then")
    busy = sorted((r for r in live if r["name"] not in out and r["state"] == "joined"),
                  key=lambda r: (sum(loads[r["name"]].held) / max(loads[r["name"]].mem_mib, 1), r["name"]))
    if len(busy) > 0:
        r = busy[0]
        load = loads[r["name"]]
        # The hosts cordoned already (an earlier pass, or this one for their TTL) take nothing,
        # and their VMs are still to find room elsewhere: the room they need is promised to
        # them, not to this host's VMs (two hosts were cordoned against the same free MiB).
        cordoned = {x["name"] for x in live if x["state"] == "cordoned"
                    or (x["name"] in out and out[x["name"]].action == "cordon")}
        # (nor the hosts this pass removes: they take nothing either)
        leaving = cordoned | {h for h, d in out.items() if d.action == "remove"}
        others = {h: v for h, v in room.items() if h != r["name"] and h not in leaving}
        # (a VM no host may take — a prewarm pinned to its cordoned host — is owed no room; one
        # only this candidate may take keeps it: cordoned too, they would have nowhere to go)
        can = others.keys() | {r["name"]}
        owing = {h: [(mem, on) for mem, on in loads.get(h, Load()).items if on is None or on & can]
                 for h in sorted(cordoned)}
        held = [h for h, items in owing.items() if items]
        owed = [item for h in held for item in owing[h]]
        share = sum(load.held) / max(load.mem_mib, 1)
        mine = f"{len(load.vms)} VMs" + (f" and {len(load.standby)} prewarmed" if load.standby else "")
        if _fits(load.items + owed, others):
            also = f" and the {len(owed)} VMs of {', '.join(held)} (cordoned)" if held else ""
            out[r["name"]] = ElasticDecision(
                host=r["name"], action="cordon", until=int(paid_until(r, now)),
                reason=f"least used ({share:.0%} of its memory); the other hosts have room for its {mine}{also}")
        elif held and _fits(load.items, others):
            out[r["name"]] = ElasticDecision(
                host=r["name"], action="keep", until=int(paid_until(r, now)),
                reason=f"least used ({share:.0%} of its memory), but the room on the other hosts is held for the "
                       f"{len(owed)} VMs of {', '.join(held)} (cordoned): {mine} on it")
    for r in live:
        if r["name"] not in out:
            n = len(loads.get(r["name"], Load()).vms)
            on = f"{n} VMs on it" if n else r["state"]
            out[r["name"]] = ElasticDecision(host=r["name"], action="keep", until=int(paid_until(r, now)),
                                             reason=f"cordoned; {on}" if n and r["state"] == "cordoned" else on)
    return [out[r["name"]] for r in live]


def scaler_cordoned(pool, now: float) -> dict[str, dict]:
    """The elastic hosts scale-in cordoned and may uncordon (``elastic_hosts`` rows by name):
    cordoned in the pool and in the registry, their TTL not come (a host cordoned for its TTL
    ends). A host an operator cordoned stays ``joined`` in the pool: not one of these."""
    out = {}
    for r in pool.rows():
        if r["state"] != "cordoned" or (r["expires"] and now >= r["expires"]):
            continue
        if (pool.store.get_host(r["name"]) or {}).get("state") == "cordoned":
            out[r["name"]] = r
    return out


def uncordon(pool, name: str) -> None:
    """Take a host scale-in cordoned back into placement: its room is wanted again."""
    pool.ctl.hosts.set_state(name, "active")
    pool._transition(name, "joined", "uncordoned: its room is wanted again")


WORK_STATES = frozenset({"creating", "running", "sleeping", "incoming"})  # VMs with work still to do


def loads_of(pool, rows: list[dict]) -> dict[str, Load]:
    """What is on each host: its VMs with work (and those being placed there),
    and the standby VMs of prewarms still live (not one whose run ended: the
    prewarm replaces it)."""
    live = pool.ctl.prewarm.live_ids()
    where: dict[str, frozenset[str] | None] = {}  # prewarm -> the hosts its VMs may go to
    out = {}
    for r in rows:
        vms = pool.store.vms_on(r["name"])
        host = pool.store.get_host(r["name"]) or {}
        pending = pool.ctl.vms.pending_on(r["name"])
        work = [v["mem_mib"] for v in vms if v["state"] in WORK_STATES and not (v["record"] or {}).get("standby")]
        standby = [v for v in vms if (v["record"] or {}).get("standby")
                   and v["name"].rsplit("-", 1)[0] in live and v["state"] not in FINISHED]
        out[r["name"]] = Load(
            vms=tuple(work + ([pending.mem_mib] if pending.count > 0 else [])),
            prewarmed=len(standby), standby=tuple(v["mem_mib"] for v in standby),
            standby_on=tuple(where[pw] if pw in where else where.setdefault(pw, pool.ctl.prewarm.room_hosts(pw))
                             for pw in (v["name"].rsplit("-", 1)[0] for v in standby)),
            mem_mib=int((host.get("capacity") or {}).get("ram_mb", 0)))
    return out


async def reconcile(pool, *, horizon: float = HORIZON_SECS) -> list[ElasticDecision]:
    """Decide (``decide``) and carry it out; a decision that fails comes back as
    ``keep`` saying why."""
    import time

    now = time.time()
    if (prewarm := getattr(pool.ctl, "prewarm", None)) is not None:
        prewarm.end_orphaned(now)  # (before the rows are read: their planned time ends now)
    rows = [r for r in pool.rows() if r["state"] != "gone"]
    # (a host the scaler cordoned is room for the plans, which uncordon it: not for scale-in;
    # nor is a machine still booting: its room is not there yet to take a cordoned host's VMs)
    room = {h["name"]: (h["free_mem_mib"], h["free_vm_slots"]) for h in pool.ctl.pool_snapshot()
            if h.get("state") != "unavailable" and not h.get("scaler_cordoned") and not h.get("joins_in_secs")}
    decisions = decide(rows, loads_of(pool, rows), room, now, horizon)
    out = []
    for d in decisions:
        try:
            if d.action == "remove":
                await pool.remove(d.host, f"reconcile: {d.reason}")
            elif d.action == "cordon":
                await pool.cordon(d.host, f"reconcile: {d.reason}")
        except Exception as exc:  # the host stays; the answer says why
            msg = getattr(exc, "message", str(exc))
            d = d.model_copy(update={"action": "keep", "saves_usd": 0.0,
                                     "reason": f"{d.action} failed: {msg}", "until": int(now + horizon)})
        out.append(d)
    acted = [d.model_dump() for d in out if d.action != "keep"]
    if acted:
        pool.store.add_event("reconciled", {"decisions": acted})
    return out
