"""Best-fit placement (seed 004), vectorised over the fleet.

    hosts ──► filter ──────────────────────────► score ──► order ──► reserve
              connected? active? pressure?        ask·free / cap²     ties: fewer VMs
              free memory ≥ ask? vm_count?        (dot product of the ask and
              bundle present?                      free room, both normalised
                                                   by the host's capacity)

Memory is the hard limit; CPU, being time-shared, only ranks. A host's
figures are believed only within its own declared capacity: free room is the
smaller of what the host reports and capacity minus what the controller has
assigned or reserved there. Every rejected host keeps its reason, so a
`fleet_full` reply says why each host said no.

The score of host h for an ask (v vCPUs, m MiB) is

    score(h) = v · max(free_vcpus_h, 0) / cap_vcpus_h²  +  m · free_mem_h / cap_mem_h²

and the two ask-independent columns are computed once per `FleetArrays`, so
a decision costs a handful of array operations, not a Python step per host.

The hot path is `Decision.best()`: a `FleetArrays` keeps its hosts sorted by
free memory, so the memory filter is a binary search that cuts the array to
the hosts that fit, and the best host is one `argmax` over that slice (ties
resolved exactly as the full order would). The full `order` and the
per-host `reasons` are computed only when a caller reads them — a
`fleet_full` reply, a move's candidate list, a test.
`bench/placement.py` compares this with the same rule written as a loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Iterable, Mapping

import numpy as np

from .resources import Resources

# Filtered-out hosts score this in the hot path; a kept host scores >= 0.
_OUT = -1.0


@dataclass(frozen=True)
class FleetArrays:
    """Column arrays, one entry per host (same order as `ids`)."""
    ids: list[str]
    cap_vcpus: np.ndarray
    cap_mem: np.ndarray
    free_vcpus: np.ndarray
    free_mem: np.ndarray
    vm_count: np.ndarray
    vm_limit: np.ndarray
    usable: np.ndarray  # connected, active, not under memory pressure (reasons kept separately)
    # where the host agent's own VM-count limit (its --max-vms) is the lower one (`with_agent_limits`)
    agent_limited: np.ndarray | None = None
    # a host registered under several names (one agent) -> them all: its VM count is the machine's
    machine_names: dict[str, list[str]] | None = None

    # Ask-independent work, done once per fleet snapshot and shared by every decision on it.
    @cached_property
    def cpu_room(self) -> np.ndarray:
        """max(free_vcpus, 0) / cap_vcpus²: negative free vCPUs only lower the rank."""
        cap = np.maximum(self.cap_vcpus, 1)
        return np.maximum(self.free_vcpus, 0) / (cap * cap)

    @cached_property
    def mem_room(self) -> np.ndarray:
        """free_mem / cap_mem²."""
        cap = np.maximum(self.cap_mem, 1)
        return self.free_mem / (cap * cap)

    @cached_property
    def open(self) -> np.ndarray:
        """The ask-independent filters: usable and below the vm_count policy."""
        return self.usable & (self.vm_count < self.vm_limit)

    @cached_property
    def by_free_mem(self) -> "_Sorted":
        return _Sorted.of(self)

    @cached_property
    def index(self) -> dict[str, int]:
        return {h: i for i, h in enumerate(self.ids)}

    def score(self, ask: Resources) -> np.ndarray:
        return ask.vcpus * self.cpu_room + ask.mem_mib * self.mem_room


@dataclass(frozen=True)
class _Sorted:
    """The fleet's hot-path columns, permuted by free memory (ascending), filtered hosts scoring `_OUT`.

    `buf` and `tmp` are scratch space for scores, reused by every decision on this snapshot
    (no allocation on the hot path): a snapshot is ranked by one thread at a time.
    """
    perm: np.ndarray      # sorted position -> fleet index
    pos: np.ndarray       # fleet index -> sorted position
    free_mem: np.ndarray
    cpu_room: np.ndarray
    mem_room: np.ndarray
    buf: np.ndarray
    tmp: np.ndarray

    @classmethod
    def of(cls, f: FleetArrays) -> "_Sorted":
        n = len(f.ids)
        perm = np.argsort(f.free_mem, kind="stable")
        pos = np.empty(n, dtype=np.int64)
        pos[perm] = np.arange(n)
        out = ~f.open[perm]
        cpu, mem = f.cpu_room[perm], f.mem_room[perm]
        cpu[out] = _OUT
        mem[out] = _OUT
        return cls(perm, pos, np.ascontiguousarray(f.free_mem[perm]), cpu, mem, np.empty(n), np.empty(n))


class Decision:
    """The outcome of ranking a fleet for one ask.

    `best()` is the hot path; `order` (every candidate, best first) and
    `reasons` (every rejected host -> why) are computed on first read.
    """

    def __init__(self, fleet: FleetArrays, ask: Resources, unusable_reasons: dict[str, str] | None = None):
        self.fleet, self.ask = fleet, ask
        self._unusable = unusable_reasons or {}

    def best(self, exclude: Iterable[str] = ()) -> str | None:
        """The best candidate not in `exclude` (the same host `order` would name first), or None."""
        f, ask = self.fleet, self.ask
        n = len(f.ids)
        if not n:
            return None
        if ask.vcpus <= 0 and ask.mem_mib <= 0:  # every score is 0: let the full order break the tie
            skip = set(exclude)
            return next((h for h in self.order if h not in skip), None)
        skip_idx = [i for i in (f.index.get(h) for h in exclude) if i is not None] if exclude else []
        # A snapshot ranked once is cheaper to mask (O(n)) than to sort (O(n log n)); from the
        # second decision on, sort it by free memory and cut instead of masking.
        f.__dict__["_decisions"] = uses = f.__dict__.get("_decisions", 0) + 1
        if uses == 1 and "by_free_mem" not in f.__dict__:
            score = f.score(ask)
            score[~(f.open & (f.free_mem >= ask.mem_mib))] = _OUT
            score[skip_idx] = _OUT
            return self._winner(score, None, 0)
        s = f.by_free_mem
        lo = int(s.free_mem.searchsorted(ask.mem_mib))  # hosts [lo:] have the memory
        score = s.buf[: n - lo]
        tmp = s.tmp[: n - lo]
        np.multiply(s.cpu_room[lo:], ask.vcpus, score)
        np.multiply(s.mem_room[lo:], ask.mem_mib, tmp)
        np.add(score, tmp, score)
        if skip_idx:
            p = s.pos[skip_idx] - lo
            score[p[p >= 0]] = _OUT
        return self._winner(score, s.perm, lo)

    def _winner(self, score: np.ndarray, perm: np.ndarray | None, lo: int) -> str | None:
        """Highest score >= 0; a tie goes to fewer VMs, then fleet order (as `order` does)."""
        f = self.fleet
        if not len(score):
            return None
        j = int(score.argmax())
        top = score[j]
        if top < 0:
            return None
        # One pass finds every host on the top score; usually just j. A tie goes to fewer VMs,
        # then fleet order.
        tied = np.flatnonzero(score == top)
        if len(tied) == 1:
            return f.ids[int(perm[lo + j]) if perm is not None else j]
        tied += lo
        tied = perm[tied] if perm is not None else tied
        return f.ids[int(tied[np.lexsort((tied, f.vm_count[tied]))[0]])]

    @cached_property
    def _fits_mem(self) -> np.ndarray:
        return self.fleet.free_mem >= self.ask.mem_mib

    @cached_property
    def order(self) -> list[str]:
        """Every candidate, best first: highest score, then fewer VMs, then fleet order."""
        f = self.fleet
        idx = np.flatnonzero(f.open & self._fits_mem)
        score = f.score(self.ask)[idx]
        keys = np.lexsort((idx, f.vm_count[idx], -score))
        return [f.ids[i] for i in idx[keys]]

    @cached_property
    def reasons(self) -> dict[str, str]:
        """Every rejected host -> why."""
        f, ask = self.fleet, self.ask
        out: dict[str, str] = {}
        for i in np.flatnonzero(~(f.open & self._fits_mem)):
            hid = f.ids[i]
            if not f.usable[i]:
                out[hid] = self._unusable.get(hid, "not accepting placements")
            elif not self._fits_mem[i]:
                # (free room below 0 — more assigned than declared, reserved or not — reads as none,
                # as GET /v1/hosts shows it)
                out[hid] = f"needs {ask.mem_mib} MiB of memory, {max(int(f.free_mem[i]), 0)} MiB free"
            elif f.agent_limited is not None and f.agent_limited[i]:
                out[hid] = f"its agent's max_vms {int(f.vm_limit[i])} reached"
            else:
                out[hid] = f"vm_count policy {int(f.vm_limit[i])} reached"
                if names := (f.machine_names or {}).get(hid):  # (the count is not this name's alone)
                    under = ", ".join([hid, *(n for n in names if n != hid)])
                    out[hid] += f" (the VMs of this machine count, under {under})"
        return out


def with_agent_limits(fleet: FleetArrays, max_vms: Mapping[str, int | None]) -> FleetArrays:
    """``fleet`` with each host's VM-count limit lowered to its agent's own, where that
    is lower: ``max_vms`` maps host id -> the ``max_vms`` its ``GET /v1/host`` summary
    reports (the agent's ``--max-vms``; None: no limit of its own). The registered
    ``vm_count`` is the operator's policy at the controller; the agent's admission
    refuses past its own limit whatever that says, so a host the summary shows full
    is left out here (with its reason) instead of being asked and refusing. The
    summary may be a second old: the host's admission still has the final word."""
    lim = fleet.vm_limit.copy()
    by_agent = np.zeros(len(fleet.ids), dtype=bool)
    for host, limit in max_vms.items():
        i = fleet.index.get(host)
        if i is not None and isinstance(limit, int) and limit < lim[i]:
            lim[i], by_agent[i] = limit, True
    return replace(fleet, vm_limit=lim, agent_limited=by_agent)


def rank(fleet: FleetArrays, ask: Resources, unusable_reasons: dict[str, str] | None = None) -> Decision:
    """Filter and score every host for `ask`; `.best()` is the winner, `.order` all candidates best first."""
    return Decision(fleet, ask, unusable_reasons)


def rank_loop(hosts: list[dict], ask: Resources) -> list[str]:
    """The same rule as `rank`, one host at a time: the benchmark's baseline."""
    scored = []
    for h in hosts:
        if not h["usable"] or h["free_mem"] < ask.mem_mib or h["vm_count"] >= h["vm_limit"]:
            continue
        cv, cm = max(h["cap_vcpus"], 1), max(h["cap_mem"], 1)
        s = ask.vcpus * (max(h["free_vcpus"], 0) / (cv * cv)) + ask.mem_mib * (h["free_mem"] / (cm * cm))
        scored.append((-s, h["vm_count"], h["i"], h["id"]))
    scored.sort()
    return [x[3] for x in scored]
