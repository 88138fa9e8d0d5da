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

The filter and score run as numpy array operations over all hosts at once;
`bench/placement.py` compares them with the same rule written as a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .resources import Resources


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


@dataclass(frozen=True)
class Decision:
    order: list[str]             # candidates, best first
    reasons: dict[str, str]      # every rejected host -> why


def rank(fleet: FleetArrays, ask: Resources, unusable_reasons: dict[str, str] | None = None) -> Decision:
    """Filter and score every host for `ask`; returns candidates best first."""
    unusable_reasons = unusable_reasons or {}
    fits_mem = fleet.free_mem >= ask.mem_mib
    fits_count = fleet.vm_count < fleet.vm_limit
    ok = fleet.usable & fits_mem & fits_count
    cap_v = np.maximum(fleet.cap_vcpus, 1)
    cap_m = np.maximum(fleet.cap_mem, 1)
    # CPU is time-shared: negative free vCPUs only lower the rank.
    score = (ask.vcpus / cap_v) * (np.maximum(fleet.free_vcpus, 0) / cap_v) + (ask.mem_mib / cap_m) * (fleet.free_mem / cap_m)
    idx = np.flatnonzero(ok)
    # Highest score first; ties to the host with fewer VMs, then by id for determinism.
    keys = np.lexsort((idx, fleet.vm_count[idx], -score[idx]))
    order = [fleet.ids[i] for i in idx[keys]]
    reasons: dict[str, str] = {}
    for i in np.flatnonzero(~ok):
        hid = fleet.ids[i]
        if not fleet.usable[i]:
            reasons[hid] = unusable_reasons.get(hid, "not accepting placements")
        elif not fits_mem[i]:
            reasons[hid] = f"needs {ask.mem_mib} MiB of memory, {int(fleet.free_mem[i])} MiB free"
        else:
            reasons[hid] = f"vm_count policy {int(fleet.vm_limit[i])} reached"
    return Decision(order=order, reasons=reasons)


def rank_loop(hosts: list[dict], ask: Resources) -> list[str]:
    """The same rule as `rank`, one host at a time: the benchmark's baseline."""
    scored = []
    for h in hosts:
        if not h["usable"] or h["free_mem"] < ask.mem_mib or h["vm_count"] >= h["vm_limit"]:
            continue
        cv, cm = max(h["cap_vcpus"], 1), max(h["cap_mem"], 1)
        s = (ask.vcpus / cv) * (max(h["free_vcpus"], 0) / cv) + (ask.mem_mib / cm) * (h["free_mem"] / cm)
        scored.append((-s, h["vm_count"], h["i"], h["id"]))
    scored.sort()
    return [x[3] for x in scored]
