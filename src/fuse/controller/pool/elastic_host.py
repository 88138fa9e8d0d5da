"""One elastic host's rules, without I/O: its lifecycle, its billing, its record (seed 001).

An elastic host is a cloud machine this controller bought. Its life is the
table below; each transition is stored with a timestamped history entry and
emits an ``elastic_host`` event (``ElasticPool._transition``).

Cost accounting (what ``ElasticBudget`` shows and the caps check):
a host is billed from ``started`` in whole billing steps, at least the
minimum: ``billed = max(min, ceil(elapsed / step) · step)``, elapsed counted
up to ``ended`` for a gone host (at least one second, so a machine is paid
for its first step the moment it starts). ``paid_until = started + billed``.
``month_usd`` is the part of every host's billed time inside this calendar
month (UTC) times its price. Caps of 0 mean "no cap".

Functions of a host's stored row and the time, apart from the pool (``elastic``) so
that the budget, scale-in (``reconcile``) and the controller read them without it.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ...envsettings import seconds
from ...errors import FuseError
from ...models.pool import ElasticHost
from .model import ceil_to

# state -> states it may move to, and what moves it there.
TRANSITIONS: dict[str, frozenset[str]] = {
    "creating": frozenset({
        "booting",   # the cloud accepted the machine: it has the cloud's id
        "gone",      # the cloud refused it, or its controller stopped in the create (settled)
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
JOIN_GRACE_SECS = 300  # beyond the type's boot time before a silent machine is offline


def __getattr__(name: str) -> float:
    """``CREATE_LEASE_SECS``: a replica renews ``updated_at`` of the hosts it is creating every
    third of this; one not renewed this long was left ``creating`` by a controller that stopped
    (``ElasticPool._settle``). Read from FUSE_POOL_CREATE_LEASE_S when the pool's modules take
    it, not as this one loads: clients import this module too (``fuse pool plan``, through the
    controller's service), and a controller's setting in their environment stopped them
    (review 33); ``fuse controller serve`` checks it before it starts."""
    if name == "CREATE_LEASE_SECS":
        return seconds("FUSE_POOL_CREATE_LEASE_S", 30.0)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class IllegalTransition(FuseError):
    """A bug: the lifecycle table forbids it."""


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
    """USD of ``row``'s billed time inside this calendar month: spent, so nothing for a
    machine the cloud has not accepted (no cloud id yet, or never: a create a stopped
    controller left is settled ``gone``; counted, then taken back, the month's spend went
    down). The caps count such a machine all the same (``pending_usd``)."""
    if not row["cloud_id"]:
        return 0.0
    return _month_part(row, now)


def pending_usd(row: dict, now: float) -> float:
    """What ``month_usd`` leaves out of a live machine the cloud has not accepted yet: its
    billed time so far, which the monthly cap counts as committed until the cloud answers."""
    return _month_part(row, now) if not row["cloud_id"] and row["state"] in LIVE else 0.0


def _month_part(row: dict, now: float) -> float:
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
    (``committed_until``), and at least what the solve that bought it priced
    (``record.budgeted_until``: a machine autoscale bought for one VM is kept for it only
    until it joined, yet the VM's work runs on it the VM's duration). The monthly cap
    counts it as spent already."""
    until = max(committed_until(row, now), (row["record"] or {}).get("budgeted_until", 0))
    return (until - paid_until(row, now)) * row["usd_per_hour"] / 3600


def ends_on_its_own(row: dict, now: float) -> float:
    """When the host ends unless someone ends it first (``ElasticHost.expires``). A host
    with a TTL (added by hand): then. A machine a plan or autoscale bought has none: scale-in
    keeps it until its planned work ends, then removes it, once idle, at the end of the paid
    time that holds then; so, recomputed at every read, it follows the billed time while VMs
    keep the host busy. A gone host: when its paid time ended."""
    if row["expires"] and row["state"] != "gone":  # (gone: its paid time ended, TTL or none)
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
