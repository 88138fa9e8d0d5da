"""First-fit decreasing: the baseline, the fallback, and the "never worse" check.

What Karpenter-style packers do: take the items largest first (a ``together``
group is one item of its whole size), put each into the first machine with
room in the preference order — own devices, running cloud hosts (cheapest
extra first), machines already opened by this plan — and when none has room,
open the offer with the lowest billed cost per VM it can take of what is left,
within every cap. It never looks back, which is why the exact planner beats it.
"""

from __future__ import annotations

import heapq

import numpy as np

from fuse.controller.pool.model import (
    NO_LIMIT,
    PlanModel,
    billed_secs,
    fits_per_machine,
    host_reject,
    host_slots,
    host_vcpus,
    offer_reject,
    offer_vcpus,
)
from fuse.controller.pool.solution import Machine, Solution, cost_usd, violations


class _Bins:
    """Free room of every machine the packer may use, as numpy arrays (first-fit scans them).
    ``cpu``, ``mem`` and ``slots`` are views of the first ``n`` cells of buffers that double
    when full, so opening a machine costs O(1), not a copy of every array."""

    def __init__(self, model: PlanModel, start: Solution):
        c = model.constraints
        # Own devices first (free), then running cloud hosts, cheapest per hour first.
        order = sorted(range(len(model.hosts)), key=lambda h: (not model.hosts[h].own, model.hosts[h].usd_per_hour, h))
        self.kind = ["host"] * len(order)
        self.index = list(order)
        size = max(16, 2 * (len(order) + len(start.machines)))
        self._cpu, self._mem, self._slots = (np.zeros(size, dtype=np.int64) for _ in range(3))
        self.n = len(order)
        self._cpu[:self.n] = [host_vcpus(model.hosts[h], c) for h in order]
        self._mem[:self.n] = [model.hosts[h].mem_mib for h in order]
        # VMs it may still take by count: a host's vm_count policy, one on a one-VM sandbox
        self._slots[:self.n] = [host_slots(model.hosts[h]) for h in order]
        pos = {h: b for b, h in enumerate(order)}
        for (g, h), k in start.on_hosts.items():
            self.cpu[pos[h]] -= k * model.groups[g].cpus
            self.mem[pos[h]] -= k * model.groups[g].mem_mib
            self.slots[pos[h]] -= k

    @property
    def cpu(self) -> np.ndarray:
        return self._cpu[:self.n]

    @property
    def mem(self) -> np.ndarray:
        return self._mem[:self.n]

    @property
    def slots(self) -> np.ndarray:
        return self._slots[:self.n]

    def open(self, model: PlanModel, machine: int, t: int) -> int:
        o = model.offers[t]
        if self.n == len(self._cpu):
            self._cpu, self._mem, self._slots = (np.concatenate([a, np.zeros_like(a)])
                                                 for a in (self._cpu, self._mem, self._slots))
        self.kind.append("new")
        self.index.append(machine)
        self._cpu[self.n] = offer_vcpus(o, model.constraints)
        self._mem[self.n] = o.mem_mib
        self._slots[self.n] = 1 if o.one_space else NO_LIMIT
        self.n += 1
        return self.n - 1


def greedy(model: PlanModel, start: Solution | None = None) -> Solution:
    """First-fit decreasing over a sorted model; respects every constraint of the model.

    ``start`` (feasible, not changed) is a partial plan to complete: the exact
    planner uses it to repair VMs its packing step could not fit.
    """
    c, groups = model.constraints, model.groups
    start = start or Solution()
    sol = Solution(on_hosts=dict(start.on_hosts))
    bins = _Bins(model, start)
    cap_hosts = min(x for x in (c.max_new_hosts, c.exact_new_hosts, 1 << 30) if x is not None)
    per_type = [0] * len(model.offers)
    family: dict[str, int] = {}
    usd_h = 0.0
    n_new = 0  # new hosts opened (one_space sandboxes are not hosts); kept, not recounted per offer
    for m in start.machines:
        o = model.offers[m.offer]
        sol.machines.append(Machine(offer=m.offer, counts=dict(m.counts)))
        b = bins.open(model, len(sol.machines) - 1, m.offer)
        for g, k in m.counts.items():
            bins.cpu[b] -= k * groups[g].cpus
            bins.mem[b] -= k * groups[g].mem_mib
            bins.slots[b] -= k
        per_type[m.offer] += 1
        family[o.quota_family] = family.get(o.quota_family, 0) + o.vcpus
        usd_h += o.usd_per_hour
        n_new += not o.one_space
    placed = start.placed(len(groups))

    host_ok = [[host_reject(grp, h, c, size=False) is None for h in model.hosts] for grp in groups]
    offer_ok = [[offer_reject(grp, o, c, size=False) is None for o in model.offers] for grp in groups]

    def allowed_bin(g: int, b: int) -> bool:
        if bins.kind[b] == "host":
            return host_ok[g][bins.index[b]]
        return offer_ok[g][sol.machines[bins.index[b]].offer]

    def within_budget(extra: float = 0.0) -> bool:
        return c.monthly_usd_left is None or cost_usd(model, sol) + extra <= c.monthly_usd_left + 1e-9

    def add(g: int, b: int, k: int) -> None:
        bins.cpu[b] -= k * groups[g].cpus
        bins.mem[b] -= k * groups[g].mem_mib
        bins.slots[b] -= k
        if bins.kind[b] == "host":
            key = (g, bins.index[b])
            sol.on_hosts[key] = sol.on_hosts.get(key, 0) + k
            if sol.on_hosts[key] == 0:  # an add undone (over the monthly budget) leaves no entry
                del sol.on_hosts[key]
        else:
            m = sol.machines[bins.index[b]]
            m.counts[g] = m.counts.get(g, 0) + k
            if m.counts[g] == 0:
                del m.counts[g]

    # no cap or budget a new machine could run into: the cheapest offer depends only on the group
    static = (cap_hosts >= 1 << 30 and not c.quotas and c.max_usd_per_hour is None and c.monthly_usd_left is None
              and all(o.limit is None for o in model.offers))
    items = sorted(range(len(groups)), key=lambda g: (
        -(groups[g].mem_mib * (groups[g].count if groups[g].together else 1)),
        -groups[g].cpus, groups[g].name))
    for g in items:
        grp = groups[g]
        left = grp.count - placed[g]
        unit = grp.count if grp.together else 1
        if left <= 0 or (grp.together and placed[g] > 0):
            continue
        fit = np.minimum(np.minimum(bins.cpu // grp.cpus, bins.mem // grp.mem_mib), bins.slots)
        for b in np.flatnonzero(fit >= unit):
            if left == 0:
                break
            if not allowed_bin(g, int(b)):
                continue
            k = min(left, int(fit[b])) if unit == 1 else unit
            add(g, int(b), k)
            if not within_budget():
                add(g, int(b), -k)  # the longer work would overrun the monthly budget
                continue
            left -= k
        # (offer, USD of one machine for g's duration, VMs of g it holds): fixed per group
        shop = [(t, o, o.usd_per_hour * billed_secs(o, grp.duration_secs) / 3600,
                 min(1 if o.one_space else grp.count, fits_per_machine(grp, offer_vcpus(o, c), o.mem_mib)))
                for t, o in enumerate(model.offers) if offer_ok[g][t]]
        most = max((fit for _, _, _, fit in shop), default=0)
        chosen = None  # without caps, the choice is the same while ``left`` fills any machine
        while left > 0:
            if static and chosen is not None and left >= most:
                best = chosen
            else:
                best = _cheapest(shop, left, unit) if static else None
            if not static:
                for t, o, usd, fit in shop:
                    if not o.one_space and n_new >= cap_hosts:
                        continue
                    if o.limit is not None and per_type[t] >= o.limit:
                        continue
                    if o.quota_family in c.quotas and family.get(o.quota_family, 0) + o.vcpus > c.quotas[o.quota_family]:
                        continue
                    if c.max_usd_per_hour is not None and usd_h + o.usd_per_hour > c.max_usd_per_hour + 1e-9:
                        continue
                    take = min(left, fit)
                    if take < unit:
                        continue
                    if not within_budget(usd):
                        continue
                    if best is None or usd / take < best[0] - 1e-12:
                        best = (usd / take, t, take)
            if best is None:
                break
            chosen = best
            _, t, take = best
            o = model.offers[t]
            sol.machines.append(Machine(offer=t))
            per_type[t] += 1
            family[o.quota_family] = family.get(o.quota_family, 0) + o.vcpus
            usd_h += o.usd_per_hour
            n_new += not o.one_space
            add(g, bins.open(model, len(sol.machines) - 1, t), take)
            left -= take
    sol = _meet_exact_hosts(model, sol)
    if violations(model, sol):
        # splitting for the hosts pin can break a cap: then the baseline adds nothing more
        sol = start if not violations(model, start) else Solution()
    return sol


def _cheapest(shop: list, left: int, unit: int) -> tuple[float, int, int] | None:
    """(USD per VM, offer, VMs taken) of the machine that takes the most of ``left`` VMs per
    dollar (a together group only whole, ``unit`` VMs), the first such offer on ties."""
    best = None
    for t, _, usd, fit in shop:
        take = min(left, fit)
        if take >= unit and (best is None or usd / take < best[0] - 1e-12):
            best = (usd / take, t, take)
    return best


def _meet_exact_hosts(model: PlanModel, sol: Solution) -> Solution:
    """The ``hosts`` pin asks for exactly N new hosts: split the fullest machines onto
    copies of their type until there are N, or give up (nothing new) when it cannot."""
    n = model.constraints.exact_new_hosts
    if n is None:
        return sol
    hosts_new = [m for m in sol.machines if not model.offers[m.offer].one_space]
    # the fullest first, the first of them on a tie: a heap of (−VMs, position), so N hosts
    # cost N log N, not N² (a 20,000-host pin had taken minutes past the time limit)
    heap = [(-sum(m.counts.values()), i) for i, m in enumerate(hosts_new)]
    heapq.heapify(heap)
    while len(hosts_new) < n:
        if not heap:
            break
        vms, i = heapq.heappop(heap)
        m = hosts_new[i]
        if -vms < 2:
            break
        # move one non-together VM to a fresh machine of the same type
        g = next((g for g, k in sorted(m.counts.items()) if k > 0 and not model.groups[g].together), None)
        if g is None:
            break
        m.counts[g] -= 1
        fresh = Machine(offer=m.offer, counts={g: 1})
        sol.machines.append(fresh)
        hosts_new.append(fresh)
        heapq.heappush(heap, (vms + 1, i))
        heapq.heappush(heap, (-1, len(hosts_new) - 1))
    if len(hosts_new) != n:
        return Solution(on_hosts=sol.on_hosts, machines=[])
    return sol
