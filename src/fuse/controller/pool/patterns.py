"""The whole-machine pattern model (Gilmore–Gomory), solved by column generation.

A *pattern* j of type t and billing class k is what one new machine holds:
a_gj VMs of each group g allowed on t with d_g ≤ δ_k, within the machine's
vCPUs and memory (``together`` groups all or nothing, one VM on a one-VM
sandbox). It costs κ_tk = r_t·b_tk/3600 USD. Machines are whole, so unlike the
aggregate model every answer here packs as it is.

Each existing host h is a type of its own with at most one machine: its
patterns are what it can hold, costing κ_hk = r_h·extra_secs(h, δ_k)/3600
(0 on own devices), so hosts are modelled exactly, never by a capacity sum.
A host with a VM-count limit S_h (its vm_count policy) holds at most S_h VMs
in a pattern. Classes whose cost equals the next longer class's are merged into it.

Master (``pattern_master``; rows written as ≤ for HiGHS; duals y ≤ 0, π_g = −y_cover,g ≥ 0):
  min  Σ_j κ_j λ_j
  s.t. Σ_j a_gj λ_j ≥ p_g                     (cover; together: unit u)
       Σ_g p_g ≥ target,  p_g ≤ n_g
       Σ_{j∈h} λ_j ≤ 1 for each existing host h
       caps: Σ_{j∈t} λ_j ≤ limit_t, Σ λ_j ≤ max_new_hosts, Σ r_t λ_j ≤ max_usd/h,
             Σ_{t∈f} vcpus_t λ_j ≤ quota_f, cost ≤ monthly_usd_left
  λ_j ∈ ℕ (integer in the final solve; ≥ 0 in the LP).

Pricing (``pattern_pricing``): the reduced cost of a pattern is κ_tk + μ_tk − Σ_g π_g a_g, with
μ_tk ≥ 0 the caps' duals times the column's cap coefficients. The best pattern
per type is a two-dimensional bounded knapsack (vCPUs × memory in units of
the groups' common divisor; a third dimension, VMs, only on a host whose
S_h is below the VMs its room could hold, so the limit binds), solved by one
numpy dynamic programme per type;
groups enter in order of duration, so the programme's value after the groups
of class k is that class's best pattern. A cheap fractional bound skips types
that cannot price out.

Bound (``column_generation``): at any iteration, with y ≤ 0 the restricted LP's row prices (clipped),
rc = c − Aᵀy and U_tk an upper bound on the machines of (t, k),
LB = y·b + Σ_g rc_g·(p_g at the bound rc favours) + Σ_tk min(0, rc_tk)·U_tk is a
valid lower bound on every integer plan (Lagrangian / Farley argument), with
rc_tk the least reduced cost of any pattern of (t, k): over the master's
columns and, for the rest, the pricing DP's optimum or the fractional screen's
bound. It is computed from y (``lagrangian_bound``), never read from HiGHS,
so LP tolerances cannot make it invalid, only weaker; when no column prices
out it is the LP optimum of the full pattern model.

Plans and the search (module ``search``): the best of residual rounding (the LP's whole machines, the rest by
first fit), the fill (the LP's whole machines, the rest placed exactly on its
machine counts rounded up, one CP-SAT variable per group and machine),
fix-and-solve (fix the whole machines, re-price, repeat, then the integer
master over the remainder), the integer master over every generated pattern,
and the FFD plan. Then branch-and-price, best bound first with depth-first
dives, branching on a machine count N_tk = Σ_{j∈(t,k)} λ_j (or a placed count
p_g): rows of the caps' shape, so pricing is unchanged and every pattern is
valid in every node. A node whose counts are all integral is filled: a plan on
exactly those machines costs at most its LP value, which closes the node.
The bound is then the least bound of the open nodes and of the nodes closed
within 10⁻⁶ USD of the plan in hand (each node's own Lagrangian bound; every
integer plan lies in one of them or in a node no cheaper than the plan); the
plan is proven optimal when its cost meets it (within 10⁻⁶ USD).

This module holds the machine types (``machine_types``) and what a pattern column
puts on machines (``take_pattern``, ``prefer_existing``); the pieces above are in the
modules named, HiGHS is called through ``highs``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuse.controller.pool.model import (
    PlanModel,
    billed_secs,
    extra_secs,
    fits_per_machine,
    host_fits,
    host_reject,
    host_slots,
    host_vcpus,
    offer_reject,
    offer_vcpus,
)
from fuse.controller.pool.solution import Machine, Solution, cost_usd


@dataclass
class MachineType:
    """A new-machine type, or one existing host (``host`` set, ``ub`` = 1)."""

    t: int  # offer index, or host index when ``host``
    deltas: list[int]  # class durations, ascending; equal-cost classes merged into the longest
    kappa: list[float]  # USD per machine per class
    groups: list[int]  # allowed groups, by duration then index
    q: dict[int, int]  # VMs of g one machine holds
    cap_cpu: int
    cap_mem: int
    ub: int  # machines of the type any useful plan could use
    host: bool = False
    cls: dict[int, int] | None = None  # group -> its class: the first δ_k ≥ d_g
    slots: int | None = None  # VMs one machine may hold by count, when that binds (a host's max_vms)
    # the groups its rules admit, whatever their size, by duration then index: types with
    # the same ones share one pricing DP (``_price_shared``)
    ruled: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return ("h" if self.host else "t", self.t)

    def one_space(self, model: PlanModel) -> bool:
        return not self.host and model.offers[self.t].one_space


def _classes(durations: list[int], kappa_of) -> tuple[list[int], list[float]]:
    """Billing classes: the distinct durations, dropping one whose cost equals the
    next longer one's (a machine of the longer class holds all the same work)."""
    ds = sorted(set(durations))
    keep = [d for i, d in enumerate(ds) if i + 1 == len(ds) or kappa_of(ds[i + 1]) > kappa_of(d) + 1e-12]
    return keep, [kappa_of(d) for d in keep]


def _finish(ty: MachineType, groups) -> MachineType:
    ty.cls = {g: next(k for k, d in enumerate(ty.deltas) if d >= groups[g].duration_secs) for g in ty.groups}
    return ty


def machine_types(model: PlanModel, kept: list[int]) -> list[MachineType]:
    c, groups = model.constraints, model.groups
    out = []
    total = sum(g.count for g in groups)
    for t in kept:
        o = model.offers[t]
        ok = [g for g, grp in enumerate(groups) if offer_reject(grp, o, c) is None and grp.count > 0]
        if not ok:
            continue
        ok.sort(key=lambda g: (groups[g].duration_secs, g))
        deltas, kappa = _classes([groups[g].duration_secs for g in ok],
                                 lambda d, o=o: o.usd_per_hour * billed_secs(o, d) / 3600)
        cap_cpu = offer_vcpus(o, c)
        q = {g: 1 if o.one_space else fits_per_machine(groups[g], cap_cpu, o.mem_mib) for g in ok}
        ub = min(total, sum(groups[g].count for g in ok))
        for lim in (o.limit, None if o.one_space else c.max_new_hosts):
            if lim is not None:
                ub = min(ub, lim)
        ruled = tuple(sorted((g for g, grp in enumerate(groups) if grp.count > 0 and offer_reject(grp, o, c, size=False) is None),
                             key=lambda g: (groups[g].duration_secs, g)))
        out.append(_finish(MachineType(t, deltas, kappa, ok, q, cap_cpu, o.mem_mib, ub, ruled=ruled), groups))
    # each existing host is a type of its own with at most one machine: its
    # patterns are exact (no capacity relaxation) and its cost is the extra
    # billed time of the longest work it takes (0 on own devices)
    for h, host in enumerate(model.hosts):
        ok = [g for g, grp in enumerate(groups) if grp.count > 0 and host_reject(grp, host, c) is None]
        if not ok:
            continue
        ok.sort(key=lambda g: (groups[g].duration_secs, g))
        deltas, kappa = _classes([groups[g].duration_secs for g in ok],
                                 lambda d, host=host: host.usd_per_hour * extra_secs(host, d) / 3600)
        cap_cpu = host_vcpus(host, c)
        q = {g: host_fits(groups[g], host, c) for g in ok}
        # the VM-count limit needs its own DP dimension only when the room alone admits more VMs
        room = sum(groups[g].count if groups[g].together else min(groups[g].count, q[g]) for g in ok)
        room = min(room, cap_cpu // min(groups[g].cpus for g in ok), host.mem_mib // min(groups[g].mem_mib for g in ok))
        slots = host.max_vms if host.max_vms is not None and host.max_vms < room else None
        ruled = tuple(sorted((g for g, grp in enumerate(groups) if grp.count > 0 and host_reject(grp, host, c, size=False) is None),
                             key=lambda g: (groups[g].duration_secs, g)))
        out.append(_finish(MachineType(h, deltas, kappa, ok, q, cap_cpu, host.mem_mib, 1, host=True, slots=slots, ruled=ruled),
                           groups))
    return out


def take_pattern(model: PlanModel, sol: Solution, kind: tuple, left: list[int]) -> None:
    """One machine of pattern column ``kind`` into ``sol`` (a new machine, or its host),
    holding of each group at most what ``left`` still wants (a together group all or
    none); ``left`` is decreased by what it holds."""
    groups, counts = model.groups, {}
    for g, n in sorted(kind[3].items()):
        take = min(n, left[g])
        if groups[g].together and take < groups[g].count:
            take = 0
        if take:
            counts[g] = take
            left[g] -= take
    if counts and kind[0] == "host":
        for g, n in counts.items():
            sol.on_hosts[g, kind[1]] = n
    elif counts:
        sol.machines.append(Machine(offer=kind[1], counts=counts))


def prefer_existing(model: PlanModel, sol: Solution) -> Solution:
    """Move VMs from new machines onto existing hosts when that costs nothing more
    (own devices first, then running hosts within the time their work already
    bills): the preference order among plans of equal cost. A machine left empty
    is dropped, which only lowers the cost."""
    c, groups, hosts = model.constraints, model.groups, model.hosts
    if not hosts or not sol.machines:
        return sol
    free_cpu = [host_vcpus(h, c) for h in hosts]
    free_mem = [h.mem_mib for h in hosts]
    slots = [host_slots(h) for h in hosts]
    dur = [0] * len(hosts)
    for (g, h), n in sol.on_hosts.items():
        free_cpu[h] -= groups[g].cpus * n
        free_mem[h] -= groups[g].mem_mib * n
        slots[h] -= n
        dur[h] = max(dur[h], groups[g].duration_secs)
    order = sorted(range(len(hosts)), key=lambda h: (not hosts[h].own, hosts[h].usd_per_hour, h))
    allowed = [[host_reject(grp, host, c, size=False) is None for host in hosts] for grp in groups]
    on_hosts = dict(sol.on_hosts)
    machines = [Machine(offer=m.offer, counts=dict(m.counts)) for m in sol.machines]
    for m in machines:
        for g in sorted(m.counts):
            grp = groups[g]
            if grp.together:
                continue
            for h in order:
                if m.counts.get(g, 0) == 0:
                    break
                host = hosts[h]
                if not allowed[g][h] or free_cpu[h] < grp.cpus or free_mem[h] < grp.mem_mib or slots[h] <= 0:
                    continue
                if extra_secs(host, max(dur[h], grp.duration_secs)) > extra_secs(host, dur[h]) and host.usd_per_hour > 0:
                    continue
                k = min(m.counts[g], free_cpu[h] // grp.cpus, free_mem[h] // grp.mem_mib, slots[h])
                if k <= 0:
                    continue
                free_cpu[h] -= k * grp.cpus
                free_mem[h] -= k * grp.mem_mib
                slots[h] -= k
                dur[h] = max(dur[h], grp.duration_secs)
                on_hosts[g, h] = on_hosts.get((g, h), 0) + k
                m.counts[g] -= k
            if m.counts.get(g) == 0:
                del m.counts[g]
    out = Solution(on_hosts=on_hosts, machines=[m for m in machines if m.counts])
    # moving work off a machine can lower its billed class; never raise the cost
    return out if cost_usd(model, out) <= cost_usd(model, sol) + 1e-9 else sol
