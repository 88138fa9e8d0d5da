"""Realise the aggregate answer: split VM counts over ``N`` identical machines.

The exact planner decides, per machine type and billing class, *how many*
machines (N) and *how many* VMs of each group (z_g) go on them, with capacity
summed over the N machines. That is a relaxation: it ignores that a VM cannot
straddle two machines. This module finds the per-machine split, first by
first-fit decreasing (almost always enough when VMs are small against the
machine), then by a small exact CP-SAT feasibility model over the N machines.
When both fail the aggregate optimum is not packable and the planner repairs.

Every machine may also cap how many VMs it holds (``max_vms``: 1 on a one-VM
sandbox; a host's vm_count policy would be the same cap), whatever room is left.
"""

from __future__ import annotations

from fuse.controller.pool.model import NO_LIMIT


def _orders(items: list[tuple[int, int, int, int]], cap_cpu: int, cap_mem: int) -> list[list]:
    """Orders to try, largest first: by the larger share of a machine an item takes
    (the usual rule), by vCPUs, by memory. By vCPUs alone is exact when the sizes
    divide each other and the machine (1, 2, 4, 8 into 64) and memory is not tight."""
    def size(it, wc: float, wm: float) -> float:
        k = -it[1] if it[1] < 0 else 1
        return k * max(wc * it[2] / max(cap_cpu, 1), wm * it[3] / max(cap_mem, 1))
    out = []
    for wc, wm in ((1.0, 1.0), (1.0, 0.0), (0.0, 1.0)):
        order = sorted(items, key=lambda it: (-size(it, wc, wm), -it[2], -it[3], it[0]))
        if order not in out:
            out.append(order)
    return out


def _ffd(items: list[tuple[int, int, int, int]], n_bins: int, cap_cpu: int, cap_mem: int,
         max_vms: int | None, partial: bool = False) -> list[dict[int, int]] | None:
    """items: (group, count, cpus, mem) with count<0 meaning one together item of -count VMs.
    ``partial``: place what fits and return the bins instead of None. Each order of
    ``_orders`` is tried in turn; ``partial`` keeps the one placing the most VMs."""
    best, best_left = None, None
    for order in _orders(items, cap_cpu, cap_mem):
        bins, left = _first_fit(order, n_bins, cap_cpu, cap_mem, max_vms)
        if left == 0:
            return bins
        if best_left is None or left < best_left:
            best, best_left = bins, left
    return best if partial else None


def _first_fit(order: list[tuple[int, int, int, int]], n_bins: int, cap_cpu: int, cap_mem: int,
               max_vms: int | None) -> tuple[list[dict[int, int]], int]:
    """First fit of the items in ``order``: (bins, VMs left out)."""
    free_cpu, free_mem = [cap_cpu] * n_bins, [cap_mem] * n_bins
    slots = [NO_LIMIT if max_vms is None else max_vms] * n_bins
    bins: list[dict[int, int]] = [dict() for _ in range(n_bins)]
    out = 0
    for g, count, cpu, mem in order:
        if count < 0:  # together: the whole group in one bin
            k = -count
            for b in range(n_bins):
                if free_cpu[b] >= k * cpu and free_mem[b] >= k * mem and slots[b] >= k:
                    free_cpu[b] -= k * cpu
                    free_mem[b] -= k * mem
                    slots[b] -= k
                    bins[b][g] = k
                    break
            else:
                out += k
            continue
        left = count
        for b in range(n_bins):
            k = min(left, free_cpu[b] // cpu, free_mem[b] // mem, slots[b])
            if k > 0:
                free_cpu[b] -= k * cpu
                free_mem[b] -= k * mem
                slots[b] -= k
                bins[b][g] = bins[b].get(g, 0) + k
                left -= k
                if left == 0:
                    break
        out += left
    return bins, out


def _exact(items: list[tuple[int, int, int, int]], n_bins: int, cap_cpu: int, cap_mem: int,
           max_vms: int | None, time_limit: float, seed: int) -> list[dict[int, int]] | None:
    from ortools.sat.python import cp_model  # the solver is imported only where it is used

    m = cp_model.CpModel()
    a: dict[tuple[int, int], cp_model.IntVar] = {}
    for i, (g, count, cpu, mem) in enumerate(items):
        k = abs(count)
        col = []
        for b in range(n_bins):
            if count < 0:
                use = m.new_bool_var(f"t{i}_{b}")
                a[i, b] = use  # 1: the together group is on bin b
                col.append(use)
            else:
                a[i, b] = m.new_int_var(0, min(k, cap_cpu // cpu, cap_mem // mem,
                                               NO_LIMIT if max_vms is None else max_vms), f"a{i}_{b}")
                col.append(a[i, b])
        m.add(sum(col) == (1 if count < 0 else k))
    for b in range(n_bins):
        vms = [a[i, b] * (abs(it[1]) if it[1] < 0 else 1) for i, it in enumerate(items)]
        m.add(sum(v * it[2] for v, it in zip(vms, items)) <= cap_cpu)
        m.add(sum(v * it[3] for v, it in zip(vms, items)) <= cap_mem)
        if max_vms is not None:
            m.add(sum(vms) <= max_vms)
    # the bins are identical: order them by how many of the first item they hold
    for b in range(n_bins - 1):
        m.add(a[0, b] >= a[0, b + 1])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 0.01)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    bins: list[dict[int, int]] = [dict() for _ in range(n_bins)]
    for (i, b), var in a.items():
        v = solver.value(var)
        if v:
            g, count = items[i][0], items[i][1]
            bins[b][g] = bins[b].get(g, 0) + (abs(count) if count < 0 else v)
    return bins


def pack(items: list[tuple[int, int, int, int]], n_bins: int, cap_cpu: int, cap_mem: int, *,
         max_vms: int | None = None, time_limit: float = 0.2, seed: int = 0) -> list[dict[int, int]] | None:
    """Split the items over ``n_bins`` machines of (cap_cpu, cap_mem), each holding at
    most ``max_vms`` VMs (None: no count limit), or None if it cannot.

    ``items`` are (group, count, cpus each, MiB each); a negative count is one
    ``together`` group of ``-count`` VMs that must share a machine. Returns one
    {group: count} per machine (some may be empty).
    """
    if n_bins == 0:
        return [] if not any(it[1] for it in items) else None
    got = _ffd(items, n_bins, cap_cpu, cap_mem, max_vms)
    if got is None and n_bins <= 64:
        got = _exact(items, n_bins, cap_cpu, cap_mem, max_vms, time_limit, seed)
    return got


def pack_partial(items: list[tuple[int, int, int, int]], n_bins: int, cap_cpu: int, cap_mem: int, *,
                 max_vms: int | None = None) -> list[dict[int, int]]:
    """First-fit what fits of the items into ``n_bins`` machines; the rest is left out."""
    return _ffd(items, n_bins, cap_cpu, cap_mem, max_vms, partial=True) or []
