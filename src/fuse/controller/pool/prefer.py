"""The preference order among plans of equal cost, applied to a chosen plan.

Issue 6 puts VMs on "the operator's own hosts first, then running cloud hosts with
room, then new cloud machines". The solvers' cost objective orders these whenever
prices differ; TIE (``planner``'s docstring) orders them when they do not, but only
the aggregate model's stage 3 applies it. ``prefer_order`` is a last, cheap and
deterministic pass on whichever plan was chosen:

  (a) VMs on running cloud hosts and new machines move onto own devices with room
      (the rules of ``host_reject``: KVM, arch, pins, devices_only; capacity and
      VM slots). Work taken off a machine only lowers what it bills.
  (b) A new machine whose VMs all fit on existing hosts with room is emptied and
      dropped when the plan's cost does not rise: a running host's extra billed
      time may equal the machine's price, and then the plan is ready sooner.

  (c) Under a ``hosts`` pin the new machines of one type are evened out: a VM moves
      from the fullest to the emptiest while they differ by two or more and the
      move changes no bill (the operator asked for N machines: 4, 4 and 4 VMs,
      not 10, 1 and 1, at the same cost).

``together`` groups stay where they are (they must share one machine), and a
``hosts`` pin (``exact_new_hosts``) keeps every new machine. The pass never raises
``cost_usd`` and never breaks a constraint: when its plan does (``violations``),
places a different number of VMs, or costs more, the original is returned.
"""

from __future__ import annotations

import bisect
import time

from fuse.controller.pool.model import (
    PlanModel,
    billed_secs,
    extra_secs,
    host_reject,
    host_slots,
    host_vcpus,
    offer_vcpus,
)
from fuse.controller.pool.solution import Machine, Solution, cost_usd, violations

EPS = 1e-9
EVEN_OUT_S = 2.0  # the most (c) takes (a safety bound: 2,000 machines even out well within it)


class _Room:
    """Free vCPUs, MiB, VM slots and longest work duration of every existing host under ``sol``."""

    def __init__(self, model: PlanModel, on_hosts: dict[tuple[int, int], int]):
        c = model.constraints
        self.cpu = [host_vcpus(h, c) for h in model.hosts]
        self.mem = [h.mem_mib for h in model.hosts]
        self.slots = [host_slots(h) for h in model.hosts]
        self.dur = [0] * len(model.hosts)
        for (g, h), k in on_hosts.items():
            if k > 0:
                self.add(model, g, h, k)

    def fits(self, model: PlanModel, g: int, h: int) -> int:
        grp = model.groups[g]
        return max(0, min(self.cpu[h] // grp.cpus, self.mem[h] // grp.mem_mib, self.slots[h]))

    def add(self, model: PlanModel, g: int, h: int, k: int) -> None:
        grp = model.groups[g]
        self.cpu[h] -= k * grp.cpus
        self.mem[h] -= k * grp.mem_mib
        self.slots[h] -= k
        self.dur[h] = max(self.dur[h], grp.duration_secs)


def _allowed(model: PlanModel) -> list[list[bool]]:
    """allowed[g][h]: group g may use host h by the rules (size is checked against the room)."""
    c = model.constraints
    return [[not grp.together and host_reject(grp, host, c, size=False) is None for host in model.hosts]
            for grp in model.groups]


def _move(model: PlanModel, room: _Room, allowed: list[list[bool]], on_hosts: dict[tuple[int, int], int],
          g: int, k: int, targets: list[int]) -> int:
    """Put up to ``k`` VMs of g on ``targets`` in order (first fit); returns how many were put."""
    left = k
    for h in targets:
        if left == 0:
            break
        if not allowed[g][h]:
            continue
        n = min(left, room.fits(model, g, h))
        if n > 0:
            room.add(model, g, h, n)
            on_hosts[g, h] = on_hosts.get((g, h), 0) + n
            left -= n
    return k - left


def _to_own(model: PlanModel, sol: Solution, allowed: list[list[bool]]) -> Solution:
    """(a): VMs of new machines, then of running cloud hosts, onto own devices with room."""
    hosts, c = model.hosts, model.constraints
    own = [h for h in range(len(hosts)) if hosts[h].own]
    on_hosts = {gh: k for gh, k in sol.on_hosts.items() if k > 0}
    machines = [Machine(offer=m.offer, counts={g: k for g, k in m.counts.items() if k > 0}) for m in sol.machines]
    if not own:
        return Solution(on_hosts=on_hosts, machines=machines)
    room = _Room(model, on_hosts)
    if c.exact_new_hosts is None:  # (the hosts pin keeps every machine: leave them whole)
        # the machines holding least first: those are the likeliest to empty
        for m in sorted(machines, key=lambda m: sum(m.counts.values())):
            own = [h for h in own if room.cpu[h] > 0 and room.mem[h] > 0 and room.slots[h] > 0]
            if not own:
                break  # (the own devices are full)
            for g in sorted(m.counts):
                m.counts[g] -= _move(model, room, allowed, on_hosts, g, m.counts[g], own)
                if m.counts[g] == 0:
                    del m.counts[g]
    own = [h for h in own if room.cpu[h] > 0 and room.mem[h] > 0 and room.slots[h] > 0]
    for (g, h) in sorted(on_hosts) if own else ():
        if hosts[h].own or not allowed[g][h]:
            continue  # (a rule-breaking or together entry stays: violations judges the plan)
        k = on_hosts[g, h]
        moved = _move(model, room, allowed, on_hosts, g, k, own)
        if moved:
            on_hosts[g, h] = k - moved
            if on_hosts[g, h] == 0:
                del on_hosts[g, h]
    return Solution(on_hosts=on_hosts, machines=[m for m in machines if m.counts])


def _empty_new(model: PlanModel, sol: Solution, allowed: list[list[bool]]) -> Solution:
    """(b): drop each new machine whose VMs all fit on existing hosts, when the cost does not rise.
    The room is kept across machines and each try is priced by what it changes (the machine's
    bill against the extra billed time of the hosts it touches), so the pass stays linear."""
    hosts = model.hosts
    if model.constraints.exact_new_hosts is not None or not hosts or not sol.machines:
        return sol
    on_hosts = dict(sol.on_hosts)
    room = _Room(model, on_hosts)
    kept = []
    order: dict[int, list[int]] = {}  # work duration -> the hosts in the order tried (until room changes)
    can: dict[int, int] = {}  # group -> VMs of it the hosts' room holds in all (until room changes)
    smallest = (min(g.cpus for g in model.groups), min(g.mem_mib for g in model.groups))
    for i, m in enumerate(sol.machines):
        if not any(room.cpu[h] >= smallest[0] and room.mem[h] >= smallest[1] and room.slots[h] > 0
                   for h in range(len(hosts))):
            kept.extend(sol.machines[i:])  # (no host has room for any VM: the rest stay as they are)
            break
        if any(model.groups[g].together for g in m.counts):
            kept.append(m)
            continue
        for g in m.counts:
            if g not in can:
                can[g] = sum(room.fits(model, g, h) for h in range(len(hosts)) if allowed[g][h])
        if any(can[g] < k for g, k in m.counts.items()):
            kept.append(m)  # (not room enough for it: the common case, decided without a try)
            continue
        d = max(model.groups[g].duration_secs for g in m.counts)
        # own devices first (free), then the running hosts this work adds the least to
        if d not in order:
            order[d] = sorted(range(len(hosts)), key=lambda h: (
                not hosts[h].own, hosts[h].usd_per_hour * extra_secs(hosts[h], max(room.dur[h], d)), h))
        targets = order[d]
        saved = (room.cpu[:], room.mem[:], room.slots[:], room.dur[:])
        trial: dict[tuple[int, int], int] = {}
        whole = all(_move(model, room, allowed, trial, g, k, targets) == k for g, k in sorted(m.counts.items()))
        touched = {h for _, h in trial}
        o = model.offers[m.offer]
        delta = sum(hosts[h].usd_per_hour * (extra_secs(hosts[h], room.dur[h]) - extra_secs(hosts[h], saved[3][h]))
                    for h in touched) - o.usd_per_hour * billed_secs(o, d)
        if whole and delta <= EPS * 3600:
            for gh, n in trial.items():
                on_hosts[gh] = on_hosts.get(gh, 0) + n
            order.clear()  # (the hosts' room and longest work changed: so may these)
            can.clear()
        else:
            room.cpu, room.mem, room.slots, room.dur = saved
            kept.append(m)
    return Solution(on_hosts=on_hosts, machines=kept)


def _even_out(model: PlanModel, sol: Solution) -> Solution:
    """(c): the hosts pin's machines of each type, evened out at the same bills, for
    ``EVEN_OUT_S`` at most (a cosmetic pass: the plan's cost and bills are settled)."""
    if model.constraints.exact_new_hosts is None or len(sol.machines) < 2:
        return sol
    deadline = time.monotonic() + EVEN_OUT_S
    c, groups = model.constraints, model.groups
    machines = [Machine(offer=m.offer, counts=dict(m.counts)) for m in sol.machines]
    by_offer: dict[int, list[Machine]] = {}
    for m in machines:
        by_offer.setdefault(m.offer, []).append(m)
    for t, same in by_offer.items():
        o = model.offers[t]
        if len(same) < 2 or o.one_space:
            continue
        cap_cpu, cap_mem = offer_vcpus(o, c), o.mem_mib

        def movable(high: Machine, low: Machine) -> tuple[int, int] | None:
            """A group of ``high`` whose VMs ``low`` takes at the same bill, and how many of
            them it has room for (at least one); or None."""
            low_dur = max(groups[g].duration_secs for g in low.counts)
            cpu_free = cap_cpu - sum(groups[g].cpus * k for g, k in low.counts.items())
            mem_free = cap_mem - sum(groups[g].mem_mib * k for g, k in low.counts.items())
            g = next((g for g in sorted(high.counts) if not groups[g].together
                      and groups[g].cpus <= cpu_free and groups[g].mem_mib <= mem_free
                      and billed_secs(o, max(low_dur, groups[g].duration_secs)) == billed_secs(o, low_dur)), None)
            if g is None:
                return None
            fit = min(cpu_free // groups[g].cpus if groups[g].cpus else high.counts[g],
                      mem_free // groups[g].mem_mib if groups[g].mem_mib else high.counts[g])
            return g, fit

        # (load, index) of each machine, emptiest first, kept sorted by bisection: a move
        # re-places two entries, not a sort of them all (20,000 machines: thousands of moves)
        order = sorted((sum(m.counts.values()), i) for i, m in enumerate(same))
        for _ in range(sum(load for load, _ in order)):  # each move narrows the spread
            if time.monotonic() >= deadline:
                break  # (each move kept every bill: the plan so far stands)
            move = _fullest_to_emptiest(same, order, movable, deadline)
            if move is None:
                break
            hi, lo, (g, fit) = move
            (top, h), (bottom, low) = order[hi], order[lo]
            # as many as bring the two within one of each other, in one step (one VM a step
            # was a step a VM: 100,000 VMs over 20,000 machines did not end in seconds)
            k = max(1, min((top - bottom) // 2, same[h].counts[g], fit))
            same[h].counts[g] -= k
            if same[h].counts[g] == 0:
                del same[h].counts[g]
            same[low].counts[g] = same[low].counts.get(g, 0) + k
            del order[hi]  # (hi > lo: the later one first)
            del order[lo]
            bisect.insort(order, (top - k, h))
            bisect.insort(order, (bottom + k, low))
    return Solution(on_hosts=dict(sol.on_hosts), machines=machines)


def _fullest_to_emptiest(same: list[Machine], order: list[tuple[int, int]], movable, deadline: float):
    """Positions in ``order`` ((load, index in ``same``), emptiest first) of the fullest machine
    and of the emptiest that can take VMs of it at the same bill, with (the group, how many
    fit); None when no two differing by two or more can. The emptiest itself may hold work
    billed shorter: the next is tried. Only pairs two or more apart are looked at (review 34:
    every pair was, and 100,000 machines of one VM each took 37 minutes to find there was none)."""
    least = order[0][0]
    for hi in range(len(order) - 1, 0, -1):
        top, h = order[hi]
        if top - least < 2:
            return None  # (sorted: no fuller machine is left)
        for lo in range(hi):
            bottom, low = order[lo]
            if top - bottom < 2 or time.monotonic() >= deadline:
                break
            if (got := movable(same[h], same[low])) is not None:
                return hi, lo, got
    return None


def prefer_order(model: PlanModel, sol: Solution, *, exact: bool = False) -> Solution:
    """``sol`` with its VMs moved up the preference order at no extra cost; ``sol`` itself
    when the result would break a constraint, place a different number of VMs, cost more,
    or (``exact``: ``sol`` was proven least-cost) cost less, which would mean a wrong proof."""
    allowed = _allowed(model)
    try:
        out = _even_out(model, _empty_new(model, _to_own(model, sol, allowed), allowed) if model.hosts else sol)
    except (ArithmeticError, IndexError, KeyError, ValueError):  # a guard: the plan stands as it is
        return sol
    before, after = cost_usd(model, sol), cost_usd(model, out)
    n = len(model.groups)
    if (after > before + EPS or (exact and after < before - EPS) or out.placed(n) != sol.placed(n)
            or violations(model, out)):
        return sol
    return out
