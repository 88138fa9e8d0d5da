"""Scale-in (seed 001 ``cloud_reconcile``): one pass over the elastic hosts.

``decide`` is pure: hosts, the VMs on them and the room elsewhere in, one
``ElasticDecision`` per live elastic host out. The rules, in order:

1. A host whose TTL (``expires``) has come goes: ``remove`` when empty, else
   ``cordon`` (its VMs have to be moved or end first). Hosts added by hand
   (``pinned``) end only so: the scaler never removes them.
2. An idle host (no VMs; prewarmed VMs do not count as use once their prewarm
   is gone) goes at the end of its paid time: ``remove`` when that end is
   within ``horizon`` seconds (the next pass would be too late: another billing
   step would start), else ``keep`` until then. ``saves_usd`` is what keeping
   it one more billing step would cost. A machine a plan bought is kept until
   the work it was bought for was planned to end (``record.planned_until``:
   boot plus the plan's billed time), so "apply, then create on auto" finds it
   (also when that end is within the horizon: its VMs may not exist yet).
3. Of the hosts with VMs, the least used (by memory) is cordoned when the
   other hosts (the operator's own included) have room for all its VMs:
   first fit of its VMs, largest first, into their free memory and VM slots.
   One host per pass, so the room counted is not promised twice.
4. Anything else is kept, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...models.pool import ElasticDecision
from .elastic import paid_until

HORIZON_SECS = 120  # an idle host this close to its next billing step goes now


@dataclass(frozen=True)
class Load:
    """What is on one elastic host: VM memory sizes, prewarmed VMs, its size."""
    vms: tuple[int, ...] = ()  # MiB of each VM (not prewarmed)
    prewarmed: int = 0
    mem_mib: int = 0  # its memory capacity


def _clock(t: float) -> str:
    import time
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def _fits(vms: tuple[int, ...], room: list[tuple[int, int]]) -> bool:
    """First fit decreasing of VM memory sizes into (free MiB, free slots) bins."""
    bins = [list(r) for r in room]
    for mem in sorted(vms, reverse=True):
        for b in bins:
            if b[0] >= mem and b[1] >= 1:
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
        elif not used and (r["record"] or {}).get("planned_until", 0) > now:
            # (however near its end: the VMs it was bought for may not be created yet)
            until = (r["record"] or {})["planned_until"]
            out[name] = ElasticDecision(host=name, action="keep", until=int(until),
                                        reason=f"idle; bought for work planned until {_clock(until)}")
        elif not used:
            end = paid_until(r, now)
            step = max(int(r["billing_step_secs"]), 1)
            if end - now <= horizon:
                out[name] = ElasticDecision(host=name, action="remove", saves_usd=round(r["usd_per_hour"] * step / 3600, 6),
                                            reason=f"idle; its paid time ends at {_clock(end)}")
            else:
                out[name] = ElasticDecision(host=name, action="keep", until=int(end - horizon),
                                            reason=f"idle; paid until {_clock(end)}, removed then")
    busy = sorted((r for r in live if r["name"] not in out and r["state"] == "joined"),
                  key=lambda r: (sum(loads[r["name"]].vms) / max(loads[r["name"]].mem_mib, 1), r["name"]))
    if len(busy) > 0:
        r = busy[0]
        load = loads[r["name"]]
        # (not the hosts this pass removes or cordons: they take nothing)
        leaving = {h for h, d in out.items() if d.action in ("remove", "cordon")}
        others = [v for h, v in room.items() if h != r["name"] and h not in leaving]
        if _fits(load.vms, others):
            share = sum(load.vms) / max(load.mem_mib, 1)
            out[r["name"]] = ElasticDecision(
                host=r["name"], action="cordon", until=int(paid_until(r, now)),
                reason=f"least used ({share:.0%} of its memory); the other hosts have room for its "
                       f"{len(load.vms)} VMs")
    for r in live:
        if r["name"] not in out:
            n = len(loads.get(r["name"], Load()).vms)
            out[r["name"]] = ElasticDecision(host=r["name"], action="keep", until=int(paid_until(r, now)),
                                             reason=f"{n} VMs on it" if n else r["state"])
    return [out[r["name"]] for r in live]


WORK_STATES = frozenset({"creating", "running", "sleeping", "incoming"})  # VMs with work still to do


def loads_of(pool, rows: list[dict]) -> dict[str, Load]:
    """What is on each host: its VMs with work (and those being placed there),
    and the standby VMs of prewarms still live."""
    live = pool.ctl.prewarm.live_ids()
    out = {}
    for r in rows:
        vms = pool.store.vms_on(r["name"])
        host = pool.store.get_host(r["name"]) or {}
        pending = pool.ctl.vms.pending_on(r["name"])
        work = [v["mem_mib"] for v in vms if v["state"] in WORK_STATES and not (v["record"] or {}).get("standby")]
        out[r["name"]] = Load(
            vms=tuple(work + ([pending.mem_mib] if pending.count > 0 else [])),
            prewarmed=sum(1 for v in vms if (v["record"] or {}).get("standby")
                          and v["name"].rsplit("-", 1)[0] in live),
            mem_mib=int((host.get("capacity") or {}).get("ram_mb", 0)))
    return out


async def reconcile(pool, *, horizon: float = HORIZON_SECS) -> list[ElasticDecision]:
    """Decide (``decide``) and carry it out; a decision that fails comes back as
    ``keep`` saying why."""
    import time

    now = time.time()
    rows = [r for r in pool.rows() if r["state"] != "gone"]
    room = {h["name"]: (h["free_mem_mib"], h["free_vm_slots"]) for h in pool.ctl.pool_snapshot()
            if h.get("state") != "unavailable"}
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
