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

Master (rows written as ≤ for HiGHS; duals y ≤ 0, π_g = −y_cover,g ≥ 0):
  min  Σ_j κ_j λ_j
  s.t. Σ_j a_gj λ_j ≥ p_g                     (cover; together: unit u)
       Σ_g p_g ≥ target,  p_g ≤ n_g
       Σ_{j∈h} λ_j ≤ 1 for each existing host h
       caps: Σ_{j∈t} λ_j ≤ limit_t, Σ λ_j ≤ max_new_hosts, Σ r_t λ_j ≤ max_usd/h,
             Σ_{t∈f} vcpus_t λ_j ≤ quota_f, cost ≤ monthly_usd_left
  λ_j ∈ ℕ (integer in the final solve; ≥ 0 in the LP).

Pricing: the reduced cost of a pattern is κ_tk + μ_tk − Σ_g π_g a_g, with
μ_tk ≥ 0 the caps' duals times the column's cap coefficients. The best pattern
per type is a two-dimensional bounded knapsack (vCPUs × memory in units of
the groups' common divisor; a third dimension, VMs, only on a host whose
S_h is below the VMs its room could hold, so the limit binds), solved by one
numpy dynamic programme per type;
groups enter in order of duration, so the programme's value after the groups
of class k is that class's best pattern. A cheap fractional bound skips types
that cannot price out.

Bound: at any iteration, with y ≤ 0 the restricted LP's row prices (clipped),
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
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

import highspy
import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.optimize import milp as _milp
from scipy.sparse import csc_matrix

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

_STDOUT = threading.RLock()  # (re-entered: the offline CLI holds it around a whole plan)


@contextmanager
def stdout_to_stderr(discard: bool = False):
    """HiGHS's MIP solver can print a debug line on the process's stdout from C++,
    past scipy's ``disp=False``; ``fuse pool plan --json`` writes its answer there.
    For the solve, file descriptor 1 points at stderr (one solve at a time); with
    ``discard``, at /dev/null (HiGHS's banner: noise to an operator, and it has no
    final newline, so the CLI's next line of stderr ran on after it)."""
    with _STDOUT:
        try:
            sys.stdout.flush()
            saved = os.dup(1)
        except (OSError, ValueError):  # no stdout to protect
            yield
            return
        sink = os.open(os.devnull, os.O_WRONLY) if discard else 2
        try:
            os.dup2(sink, 1)
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            if discard:
                os.close(sink)


def _new_highs():
    """A silent HiGHS instance (the first one in a process prints a banner on stdout)."""
    with stdout_to_stderr(discard=True):
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def highs_mip(cost, integrality, lo, hi, a, rlo, rhi, *, gap: float, time_limit: float,
              cutoff: float | None = None, presolve: bool = True, save: bool = False,
              lean: bool = False, start: np.ndarray | None = None) -> SimpleNamespace:
    """HiGHS on min cost·x, rlo ≤ a·x ≤ rhi (``a`` dense or sparse), lo ≤ x ≤ hi, x_j integer
    where ``integrality[j]``; ``cutoff``: HiGHS's objective bound (no node whose bound
    reaches it is explored). The answer: ``status`` 0 (optimal), 1 (out of time with a
    point), 2 (no point below the cutoff, or infeasible), 3 (no answer); ``x`` (or None)
    and ``mip_dual_bound``; with ``save``, ``saved``: the points HiGHS improved on the way,
    as (objective, x). ``lean``: without the sub-MIP and jump heuristics (RINS, RENS, the
    root reduced-cost one, feasibility jump), which took most of a small master's time
    with the cutoff already pruning (on 18 masters saved from two 1,000-VM models: 3.4 s
    of solves with them, 2.3 s without). ``start``: a point to begin from (HiGHS keeps it
    as its first incumbent when it is feasible and below the cutoff)."""
    from scipy.sparse import csr_matrix

    n = len(cost)
    h = _new_highs()
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("time_limit", max(time_limit, 0.01))
    h.setOptionValue("random_seed", 0)
    if not presolve:
        h.setOptionValue("presolve", "off")
    if save:
        h.setOptionValue("mip_improving_solution_save", True)
    if lean:
        for heuristic in ("rins", "rens", "root_reduced_cost", "feasibility_jump"):
            h.setOptionValue(f"mip_heuristic_run_{heuristic}", False)
    if cutoff is not None and cutoff < math.inf:
        h.setOptionValue("objective_bound", cutoff)
    inf = highspy.kHighsInf
    idx = np.arange(n, dtype=np.int32)
    h.addVars(n, np.asarray(lo, dtype=float), np.where(np.isinf(hi), inf, hi).astype(float))
    h.changeColsCost(n, idx, np.asarray(cost, dtype=float))
    h.changeColsIntegrality(n, idx, np.where(np.asarray(integrality) > 0, highspy.HighsVarType.kInteger,
                                             highspy.HighsVarType.kContinuous))
    m = csr_matrix(a)
    m.eliminate_zeros()
    rlo, rhi = np.asarray(rlo, dtype=float), np.asarray(rhi, dtype=float)
    h.addRows(m.shape[0], np.where(np.isinf(rlo), -inf, rlo), np.where(np.isinf(rhi), inf, rhi),
              m.nnz, m.indptr[:-1].astype(np.int32), m.indices.astype(np.int32), m.data.astype(float))
    if start is not None:
        point = highspy.HighsSolution()
        point.col_value = [float(v) for v in start]
        point.value_valid = True
        h.setSolution(point)
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    S = highspy.HighsModelStatus
    if status in (S.kInfeasible, S.kObjectiveBound):
        return SimpleNamespace(status=2, x=None, mip_dual_bound=math.inf)
    if info.primal_solution_status != 2:  # no feasible point
        return SimpleNamespace(status=3, x=None, mip_dual_bound=info.mip_dual_bound)
    saved = [(s.objective, np.array(s.col_value)) for s in h.getSavedMipSolutions()] if save else []
    return SimpleNamespace(status=0 if status == S.kOptimal else 1, x=np.array(h.getSolution().col_value),
                           mip_dual_bound=info.mip_dual_bound, saved=saved)


def milp(*args, **kwargs):
    """scipy's ``milp`` with nothing written on stdout."""
    with stdout_to_stderr():
        return _milp(*args, **kwargs)


COUNTS_GAP = 0.0  # the counts MIP's relative gap: it looks for a plan, the proof comes after
MAX_CELLS = 2_000_000  # DP table cells per type; beyond it the pattern model is not used
EPS = 1e-9


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


@dataclass
class Node:
    """A branch-and-price node: bounds on the machine counts N_tk and on placed p_g."""

    n: dict[tuple[tuple[str, int], int], tuple[float, float]] = field(default_factory=dict)
    p: dict[int, tuple[float, float]] = field(default_factory=dict)
    bound: float = 0.0
    origin: tuple | None = None  # (what was branched on, "down"/"up", the step, the parent's bound)

    def __lt__(self, other: Node) -> bool:
        return self.bound < other.bound


class Master:
    """Columns and rows of the master; ``lp``/``mip`` solve it with HiGHS."""

    def __init__(self, model: PlanModel, types: list[MachineType], target: int, node: Node | None = None,
                 big_m: float = 0.0):
        self.model, self.types, self.target = model, types, target
        node = node or Node()
        c, groups = model.constraints, model.groups
        G = len(groups)
        self.rows: list[str] = []
        self.b: list[float] = []
        self.cols_c: list[float] = []
        self.bounds: list[tuple[float, float]] = []
        self.integral: list[int] = []
        self.kind: list[tuple] = []
        self._nz: tuple[list[int], list[int], list[float]] = ([], [], [])
        self.p_col: dict[int, int] = {}  # group -> its placed-count column
        self.by_class: dict[tuple, list[int]] = {}  # (type key, class) -> its pattern columns
        self.class_hi: dict[tuple, float] = {}  # (type key, class) -> the node's upper bound on N_tk
        # the cost of a plan in hand placing the target: the bound need only hold for plans
        # no costlier (the answer's bound is never above that plan's cost)
        self.cost_cap = math.inf
        self._highs = None  # the LP, kept between ``lp`` calls
        row = self._row

        self.cover = [row(f"cover{g}", 0.0) for g in range(G)]
        self.target_row = row("target", -float(target))
        # placed p_g (together: n_g·u_g)
        for g, grp in enumerate(groups):
            col = {self.cover[g]: 1.0, self.target_row: -1.0}
            lo, hi = node.p.get(g, (0, 1 if grp.together else grp.count))
            if grp.together:
                self.p_col[g] = self._col(0.0, {r: v * grp.count for r, v in col.items()}, (lo, hi), 1, ("p", g))
            else:
                self.p_col[g] = self._col(0.0, col, (lo, hi), 1, ("p", g))
        if big_m:  # artificial: a node whose branching rows or target cannot be met prices at ≥ big_m
            self._col(big_m, {self.target_row: -1.0}, (0, math.inf), 0, ("art",))
        # caps: rows whose coefficients depend only on (t, k)
        self.caps: list[tuple[int, dict[tuple, float]]] = []
        hosts = [ty for ty in types if ty.host]
        offers = [ty for ty in types if not ty.host]
        for ty in hosts:  # one machine: at most one pattern
            self.caps.append((row(f"host{ty.t}", 1.0), {(ty.key, k): 1.0 for k in range(len(ty.deltas))}))
        for ty in offers:
            o = model.offers[ty.t]
            if o.limit is not None:
                self.caps.append((row(f"limit{ty.t}", o.limit), {(ty.key, k): 1.0 for k in range(len(ty.deltas))}))
        if c.max_new_hosts is not None:
            self.caps.append((row("max_new_hosts", c.max_new_hosts), {
                (ty.key, k): 1.0 for ty in offers if not model.offers[ty.t].one_space for k in range(len(ty.deltas))}))
        if c.max_usd_per_hour is not None:
            self.caps.append((row("max_usd", c.max_usd_per_hour + 1e-9), {
                (ty.key, k): model.offers[ty.t].usd_per_hour for ty in offers for k in range(len(ty.deltas))}))
        for fam, quota in sorted(c.quotas.items()):
            self.caps.append((row(f"quota{fam}", quota), {
                (ty.key, k): model.offers[ty.t].vcpus for ty in offers
                if model.offers[ty.t].quota_family == fam for k in range(len(ty.deltas))}))
        self.monthly = row("monthly", c.monthly_usd_left + 1e-7) if c.monthly_usd_left is not None else None
        self.patterns: set[tuple[int, int, tuple[int, ...]]] = set()
        self._branch_rows(node, big_m)

    def _row(self, name: str, rhs: float) -> int:
        self.rows.append(name)
        self.b.append(rhs)
        return len(self.rows) - 1

    def _branch_rows(self, node: Node, big_m: float) -> None:
        """Branching on N_tk = Σ_{j∈(t,k)} λ_j: rows of the caps' shape, with the columns
        already in the master entered in them."""
        for (key, k), (lo, hi) in sorted(node.n.items()):
            self.class_hi[key, k] = min(hi, self.class_hi.get((key, k), math.inf))
            for sign, rhs, name in ((1.0, hi, "<="), (-1.0, -lo, ">=")):
                if (sign > 0 and hi == math.inf) or (sign < 0 and lo <= 0):
                    continue
                r = self._row(f"N{key}{k}{name}", rhs)
                self.caps.append((r, {(key, k): sign}))
                for j in self.by_class.get((key, k), ()):
                    self._nz[0].append(r)
                    self._nz[1].append(j)
                    self._nz[2].append(sign)
                if sign < 0 and big_m:  # artificial: a node whose rows cannot be met prices at ≥ big_m
                    self._col(big_m, {r: -1.0}, (0, math.inf), 0, ("art",))

    def with_node(self, node: Node, big_m: float) -> Master:
        """This master (built without a node: no branching rows, the target's artificial
        column if ``big_m``) for ``node``: its placed-count bounds and its branching rows,
        every column already generated kept. Copies lists instead of re-adding columns."""
        m = object.__new__(Master)
        m.__dict__.update(self.__dict__)
        m.rows, m.b, m.cols_c, m.bounds = list(self.rows), list(self.b), list(self.cols_c), list(self.bounds)
        m.integral, m.kind, m.caps = list(self.integral), list(self.kind), list(self.caps)
        m._nz = (list(self._nz[0]), list(self._nz[1]), list(self._nz[2]))
        m.patterns = set(self.patterns)
        m._highs = None  # its own LP: the branching rows differ
        m.by_class = {key: list(cols) for key, cols in self.by_class.items()}
        m.class_hi = dict(self.class_hi)
        for g, bounds in node.p.items():
            m.bounds[m.p_col[g]] = bounds
        m._branch_rows(node, big_m)
        return m

    def _col(self, cost: float, a: dict[int, float], bounds, integral: int, kind: tuple) -> int:
        j = len(self.cols_c)
        for r, v in a.items():  # the matrix's triplets, kept as columns come (built once per LP)
            self._nz[0].append(r)
            self._nz[1].append(j)
            self._nz[2].append(v)
        self.cols_c.append(cost)
        self.bounds.append(bounds)
        self.integral.append(integral)
        self.kind.append(kind)
        return len(self.cols_c) - 1

    def add_pattern(self, ty: MachineType, k: int, counts: dict[int, int]) -> bool:
        key = (ty.key, k, tuple(sorted((g, n) for g, n in counts.items() if n)))
        if not key[2] or key in self.patterns:
            return False
        self.patterns.add(key)
        col: dict[int, float] = {self.cover[g]: -float(n) for g, n in counts.items() if n}
        for r, coef in self.caps:
            if coef.get((ty.key, k)):
                col[r] = coef[ty.key, k]
        if self.monthly is not None and ty.kappa[k]:
            col[self.monthly] = ty.kappa[k]
        j = self._col(ty.kappa[k], col, (0, math.inf), 1, ("host" if ty.host else "pat", ty.t, k, dict(counts)))
        self.by_class.setdefault((ty.key, k), []).append(j)
        return True

    def _matrix(self):
        rows, cols, data = self._nz
        return csc_matrix((data, (rows, cols)), shape=(len(self.rows), len(self.cols_c)))

    def lp(self):
        """The LP relaxation, by HiGHS's simplex kept between calls: columns priced since
        the last call join the model and the solve starts from the last basis (column
        generation adds a few columns a round; a solve from scratch cost ~10× more).
        A result with ``status`` (0: optimal), ``x``, ``fun`` and ``ineqlin.marginals``
        (the rows' duals, ≤ 0 for these ≤ rows of a minimisation), as scipy's ``linprog``."""
        h = self._highs
        n = len(self.cols_c)
        if h is None:
            h = self._highs = _new_highs()
            h.addRows(len(self.rows), np.full(len(self.rows), -highspy.kHighsInf), np.array(self.b, dtype=float),
                      0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
            self._in_highs, self._nz_in_highs, self._bounds_in_highs = 0, 0, []
        if n > self._in_highs:  # the new columns, whose entries are the triplets added since
            rows, cols, vals = (np.asarray(v[self._nz_in_highs:]) for v in self._nz)
            order = np.argsort(cols, kind="stable")
            rows, cols, vals = rows[order], cols[order], vals[order]
            starts = np.searchsorted(cols, np.arange(self._in_highs, n)).astype(np.int32)
            new = self.bounds[self._in_highs:]
            h.addCols(n - self._in_highs, np.array(self.cols_c[self._in_highs:], dtype=float),
                      np.array([b[0] for b in new], dtype=float), np.array([b[1] for b in new], dtype=float),
                      len(vals), starts, rows.astype(np.int32), vals.astype(float))
            self._bounds_in_highs.extend(new)
            self._in_highs, self._nz_in_highs = n, len(self._nz[0])
        if self.bounds != self._bounds_in_highs:  # a dive fixed some columns' lower bounds
            for j, (was, now) in enumerate(zip(self._bounds_in_highs, self.bounds)):
                if was != now:
                    h.changeColBounds(j, float(now[0]), float(now[1]))
            self._bounds_in_highs = list(self.bounds)
        h.run()
        ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        sol = h.getSolution()
        return SimpleNamespace(status=0 if ok else 2, x=np.array(sol.col_value) if ok else None,
                               fun=h.getInfo().objective_function_value if ok else None,
                               ineqlin=SimpleNamespace(marginals=np.array(sol.row_dual) if ok else None))

    def mip(self, time_limit: float):
        lo = np.array([b[0] for b in self.bounds], dtype=float)
        hi = np.array([b[1] for b in self.bounds], dtype=float)
        return milp(np.array(self.cols_c), integrality=np.array(self.integral),
                    bounds=Bounds(lo, hi),
                    constraints=LinearConstraint(self._matrix(), -np.inf, np.array(self.b)),
                    options={"time_limit": max(time_limit, 0.05), "disp": False, "mip_rel_gap": 0.0})


    def counts_mip(self, time_limit: float, limits: dict | None = None, cutoff: float | None = None):
        """The master with whole machine counts and fractional patterns: N_tk ≥ Σ_{j∈(t,k)} λ_j
        integer and costing κ_tk (the caps on N), λ ≥ 0 fractional and free. Rounding the
        LP's counts up is a solution, so HiGHS has one at once. Its answer (the λ part,
        or None) has ⌈Σ λ⌉ machines of each (type, class) within integral counts, which
        ``search._fill`` places on whole machines. ``limits``: upper bounds on N_tk
        (``class_limits``: a class at 0 drops out); ``cutoff``: only answers cheaper
        than it (the plans in hand) are looked for."""
        from scipy.sparse import diags, hstack, vstack

        keys = sorted({(("h" if kd[0] == "host" else "t", kd[1]), kd[2]) for kd in self.kind if kd[0] in ("pat", "host")})
        if not keys:
            return None
        at = {key: i for i, key in enumerate(keys)}
        kappa = {(ty.key, k): v for ty in self.types for k, v in enumerate(ty.kappa)}
        n, nk = len(self.cols_c), len(keys)
        cap_rows = [r for r, _ in self.caps] + ([self.monthly] if self.monthly is not None else [])
        keep = np.ones(len(self.rows))
        keep[cap_rows] = 0.0
        a_lam = diags(keep) @ self._matrix()  # the caps move to the counts
        rows, cols, vals = [], [], []
        for r, coef in self.caps:
            for key, v in coef.items():
                if key in at and v:
                    rows.append(r)
                    cols.append(at[key])
                    vals.append(v)
        if self.monthly is not None:
            for key, i in at.items():
                rows.append(self.monthly)
                cols.append(i)
                vals.append(kappa[key])
        a_n = csc_matrix((vals, (rows, cols)), shape=(len(self.rows), nk))
        rows, cols, vals = [], [], []
        for j, kd in enumerate(self.kind):
            if kd[0] in ("pat", "host"):
                rows.append(at[("h" if kd[0] == "host" else "t", kd[1]), kd[2]])
                cols.append(j)
                vals.append(1.0)
        link = hstack([csc_matrix((vals, (rows, cols)), shape=(nk, n)), -diags(np.ones(nk))])
        a = vstack([hstack([a_lam, a_n]), link]).tocsc()
        limits = limits or {}
        lo = np.array([b[0] for b in self.bounds] + [0.0] * nk)
        hi = np.array([b[1] for b in self.bounds] + [limits.get(key, np.inf) for key in keys])
        for j, kd in enumerate(self.kind):
            if kd[0] in ("pat", "host") and limits.get((("h" if kd[0] == "host" else "t", kd[1]), kd[2])) == 0:
                hi[j] = 0.0
        integral = [0 if kd[0] in ("pat", "host") else i for kd, i in zip(self.kind, self.integral)] + [1] * nk
        cost = np.concatenate([[0.0 if kd[0] in ("pat", "host") else c for kd, c in zip(self.kind, self.cols_c)],
                               [kappa[key] for key in keys]])
        res = highs_mip(cost, integral, lo, hi, a, np.full(len(self.rows) + nk, -np.inf),
                        np.concatenate([self.b, np.zeros(nk)]), gap=COUNTS_GAP, time_limit=max(time_limit, 0.02),
                        cutoff=cutoff)
        return None if res.x is None else res.x[:n]


def _frac_bound(vals: list[tuple[float, int, int, int, int]], cap_cpu: int, cap_mem: int,
                cap_vms: int | None = None) -> float:
    """An upper bound on Σ π a: the least of the one-resource fractional knapsacks
    (vCPUs, memory, and VMs by count when ``cap_vms`` is given).
    ``vals``: (value, vCPUs, MiB, units available, VMs per unit)."""
    best = math.inf
    dims = [(1, cap_cpu), (2, cap_mem)] + ([(4, cap_vms)] if cap_vms is not None else [])
    for dim, cap in dims:
        left, v = float(cap), 0.0
        for it in sorted(vals, key=lambda it: -it[0] / (it[dim] or 1e-12)):
            val, u, w = it[0], it[3], it[dim]
            take = min(u, left / w) if w else u
            v += take * val
            left -= take * w
            if left <= 0:
                break
        best = min(best, v)
    return best


def _price(model: PlanModel, ty: MachineType, pi: np.ndarray, mu: list[float],
           floor: list[float] | None = None) -> list[tuple[float, int, dict[int, int]]]:
    """(reduced cost, class, pattern) of the best pattern of each class of ``ty`` that prices out.
    ``floor[k]`` is set to a lower bound on the reduced cost of every pattern of class k
    (exact where the DP ran, the fractional bound where the screen stopped it)."""
    groups = model.groups
    out = []
    floor = floor if floor is not None else [0.0] * len(ty.deltas)
    if ty.one_space(model):
        for k, delta in enumerate(ty.deltas):
            cand = [(pi[g], g) for g in ty.groups if ty.cls[g] <= k and ty.q[g] >= 1
                    and (not groups[g].together or groups[g].count == 1)]
            floor[k] = math.inf
            if cand:
                v, g = max(cand)
                rc = ty.kappa[k] + mu[k] - v
                floor[k] = rc
                if rc < -1e-7:
                    out.append((rc, k, {g: 1}))
        return out
    # cheap screen: can any class price out?
    items = knapsack_items(groups, ty.groups, pi, ty.q)
    promising = []
    for k, delta in enumerate(ty.deltas):
        vals = [(v, wc, wm, u, mult) for g, v, wc, wm, u, mult in items if ty.cls[g] <= k]
        floor[k] = ty.kappa[k] + mu[k] - (_frac_bound(vals, ty.cap_cpu, ty.cap_mem, ty.slots) if vals else 0.0)
        if vals and floor[k] < -1e-7:
            promising.append(k)
    if not promising:
        return out
    unit = 0
    for _, _, _, wm, _, _ in items:
        unit = math.gcd(unit, wm)
    unit = math.gcd(unit, ty.cap_mem) or 1
    # S: the VM-count dimension, of size 1 (always 0 VMs counted) when no limit binds
    C, M, S = ty.cap_cpu, ty.cap_mem // unit, ty.slots or 0
    if (C + 1) * (M + 1) * (S + 1) > MAX_CELLS:
        raise TooBig
    f = np.zeros((C + 1, M + 1, S + 1))
    copies: list[tuple[int, int, int, int, int, np.ndarray]] = []  # (g, VMs, wc, wm, ws, taken mask)
    stage_end = {}
    last_k = max(promising)
    for k, delta in enumerate(ty.deltas):
        if k > last_k:
            break
        for g, v, wc, wm, u, mult in items:
            if ty.cls[g] != k:
                continue
            for n, cw, mw, sw in split(u, wc, wm // unit, mult if ty.slots is not None else 0, C, M, S):
                cand = f[:C + 1 - cw, :M + 1 - mw, :S + 1 - sw] + v * n
                mask = np.zeros(f.shape, dtype=bool)
                sub = f[cw:, mw:, sw:]
                mask[cw:, mw:, sw:] = cand > sub + 1e-12
                np.maximum(sub, cand, out=sub)
                copies.append((g, n * mult, cw, mw, sw, mask))
        stage_end[k] = len(copies)
    for k in promising:
        counts = _backtrack(copies[:stage_end[k]], C, M, S)
        val = sum(pi[g] * n for g, n in counts.items())
        rc = ty.kappa[k] + mu[k] - val
        floor[k] = max(floor[k], rc)  # the DP's optimum: exact
        if rc < -1e-7 and counts:
            out.append((rc, k, counts))
    return out


def price_all(model: PlanModel, types: list[MachineType], pi: np.ndarray, mus: dict[tuple, list[float]],
              floors: dict | None = None) -> list[tuple[MachineType, float, int, dict[int, int]]]:
    """Price every type of ``types`` at prices π, with μ_t = ``mus[t.key]`` (per class):
    [(type, reduced cost, class, pattern)] of the best pattern of each class that prices
    out. Types admitting the same groups share one DP (``_price_shared``); a VM-count
    dimension or a one-VM sandbox is priced alone (``_price``). ``floors`` gets each
    class's lower bound on the reduced cost of its patterns."""
    shared: dict[tuple, list] = {}
    found: list[tuple] = []
    kept: list[tuple[MachineType, list[float]]] = []
    for ty in types:
        floor = [0.0] * len(ty.deltas)
        kept.append((ty, floor))
        if ty.slots is None and not ty.one_space(model):
            shared.setdefault(ty.ruled, []).append((ty, mus[ty.key], floor))
        else:
            found.extend((ty, rc, k, counts) for rc, k, counts in _price(model, ty, pi, mus[ty.key], floor))
    for ruled, tys in shared.items():
        found.extend(_price_shared(model, ruled, tys, pi))
    if floors is not None:
        for ty, floor in kept:
            for k, v in enumerate(floor):
                floors[ty.key, k] = v
    return found


def _price_shared(model: PlanModel, ruled: tuple[int, ...], tys: list[tuple[MachineType, list[float], list[float]]],
                  pi: np.ndarray) -> list[tuple[MachineType, float, int, dict[int, int]]]:
    """``_price`` for several types whose rules admit the same groups ``ruled`` (no VM-count
    dimension, not one-VM sandboxes), by one DP: ``tys`` holds (type, μ, floor) as
    ``_price`` takes them. Each type's fractional screen runs first; one DP over the
    largest machine among the classes that pass it then serves them all, since a
    table's cell (C_t, M_t) is type t's own optimum (a group too big for t fits in
    none of its cells) and groups enter by duration, so the table after the groups of
    duration ≤ δ_k is class k's. [(type, reduced cost, class, pattern)] that price out."""
    groups = model.groups
    promising = []
    for ty, mu, floor in tys:
        items = knapsack_items(groups, ty.groups, pi, ty.q)
        for k in range(len(ty.deltas)):
            vals = [(v, wc, wm, u, mult) for g, v, wc, wm, u, mult in items if ty.cls[g] <= k]
            floor[k] = ty.kappa[k] + mu[k] - (_frac_bound(vals, ty.cap_cpu, ty.cap_mem) if vals else 0.0)
            if vals and floor[k] < -1e-7:
                promising.append((ty, mu, floor, k))
    if not promising:
        return []
    items = knapsack_items(groups, ruled, pi)  # by duration (``ruled``'s order), bounded by counts
    unit = 0
    for it in items:
        unit = math.gcd(unit, it[3])
    C = max(ty.cap_cpu for ty, *_ in promising)
    M = max(ty.cap_mem for ty, *_ in promising) // unit
    if (C + 1) * (M + 1) > MAX_CELLS:
        raise TooBig
    last = max(ty.deltas[k] for ty, _, _, k in promising)
    f = np.zeros((C + 1, M + 1))
    copies: list[tuple[int, int, int, int, np.ndarray]] = []  # (g, VMs, wc, wm, improved cells from (wc, wm))
    ends: dict[int, int] = {}  # duration -> copies after its groups
    for g, v, wc, wm, u, mult in items:
        d = groups[g].duration_secs
        if d > last:
            break
        for n, cw, mw, _ in split(u, wc, wm // unit, 0, C, M, 0):
            cand = f[:C + 1 - cw, :M + 1 - mw] + v * n
            sub = f[cw:, mw:]
            improved = cand > sub + 1e-12
            np.maximum(sub, cand, out=sub)
            copies.append((g, n * mult, cw, mw, improved))
        ends[d] = len(copies)
    out = []
    for ty, mu, floor, k in promising:
        stage = max((n for d, n in ends.items() if d <= ty.deltas[k]), default=0)
        c, m, counts = ty.cap_cpu, ty.cap_mem // unit, {}
        for g, n, cw, mw, improved in reversed(copies[:stage]):
            if c >= cw and m >= mw and improved[c - cw, m - mw]:
                counts[g] = counts.get(g, 0) + n
                c -= cw
                m -= mw
        rc = ty.kappa[k] + mu[k] - sum(pi[g] * n for g, n in counts.items())
        floor[k] = max(floor[k], rc)  # the DP's optimum: exact
        if rc < -1e-7 and counts:
            out.append((ty, rc, k, counts))
    return out


def knapsack_items(groups, gs, pi: np.ndarray, q: dict[int, int] | None = None) -> list[tuple]:
    """The items of the pricing knapsack over groups ``gs`` at prices π: (group, value,
    vCPUs, MiB, copies, VMs per copy); a together group is one item of its whole size,
    a group priced at 0 is left out. Copies are bounded by the group's count, and by
    ``q[g]`` (VMs one machine holds) when given."""
    items = []
    for g in gs:
        grp = groups[g]
        if pi[g] <= EPS:
            continue
        if grp.together:
            items.append((g, pi[g] * grp.count, grp.cpus * grp.count, grp.mem_mib * grp.count, 1, grp.count))
        else:
            u = grp.count if q is None else min(q[g], grp.count)
            if u > 0:
                items.append((g, pi[g], grp.cpus, grp.mem_mib, u, 1))
    return items


def split(u: int, wc: int, wm: int, ws: int, C: int, M: int, S: int):
    """The binary split of an item bounded by ``u`` copies into 1, 2, 4, … (the rest
    last), each as (copies, vCPUs, memory units, VMs), while it fits the (C, M, S) table:
    any count up to u is a sum of some of them, so a 0/1 DP over them is the bounded one."""
    m = 1
    while u > 0:
        n = min(m, u)
        u -= n
        m *= 2
        if wc * n > C or wm * n > M or ws * n > S:
            return
        yield n, wc * n, wm * n, ws * n


def _backtrack(copies, C: int, M: int, S: int) -> dict[int, int]:
    """The pattern the DP took at (C, M, S) using the first ``len(copies)`` item copies.

    mask_i marks the states where copy i improved the table at its stage; walking
    the copies backwards from the full machine replays those choices."""
    c, m, s, counts = C, M, S, {}
    for g, n, cw, mw, sw, mask in reversed(copies):
        if mask[c, m, s]:
            counts[g] = counts.get(g, 0) + n
            c -= cw
            m -= mw
            s -= sw
    return counts


class TooBig(Exception):
    pass


def generate(model: PlanModel, master: Master, types: list[MachineType], pool: list, deadline: float):
    """Column generation on ``master``: (last LP result or None, Lagrangian bound, converged).
    New patterns join ``pool``."""
    lb, res = -math.inf, None
    while time.monotonic() < deadline:
        res = master.lp()
        if res.status != 0:
            return None, lb, False
        y = np.minimum(res.ineqlin.marginals, 0.0)  # ≤ 0 (clipped: the bound holds for any y ≤ 0)
        pi = np.array([-y[r] for r in master.cover])
        new, floors = 0, {}
        closed = {key for key, hi in master.class_hi.items() if hi <= 0}  # N_tk ≤ 0 in this node
        mus = {}
        for ty in types:
            if all((ty.key, k) in closed for k in range(len(ty.deltas))):
                for k in range(len(ty.deltas)):
                    floors[ty.key, k] = 0.0  # no machine of the type here: its term in the bound is 0
                continue
            mus[ty.key] = class_prices(master, ty, y)
        found = price_all(model, [ty for ty in types if ty.key in mus], pi, mus, floors)
        for ty, rc, k, counts in found:
            if (ty.key, k) not in closed and master.add_pattern(ty, k, counts):
                new += 1
                pool.append((ty, k, counts))
        lb = max(lb, lagrangian_bound(master, types, y, floors))
        if new == 0:
            return res, lb, True
    return res, lb, False


def class_prices(master: Master, ty: MachineType, y: np.ndarray) -> list[float]:
    """μ_tk per class of ``ty``: the caps' row prices y (≤ 0) times the class's coefficients."""
    mu = []
    for k in range(len(ty.deltas)):
        v = sum(-y[r] * coef.get((ty.key, k), 0.0) for r, coef in master.caps)
        if master.monthly is not None:
            v += -y[master.monthly] * ty.kappa[k]
        mu.append(v)
    return mu


def lagrangian_bound(master: Master, types: list[MachineType], y: np.ndarray, floors: dict) -> float:
    """A lower bound on every plan the master's node admits, from any row prices y ≤ 0.

    For a plan x (Ax ≤ b): c·x ≥ y·b + Σ_j rc_j x_j with rc = c − Aᵀy. Placed
    counts p_g sit in their bounds; the patterns of (t, k) sum to N_tk ≤ U_tk (the
    type's limit, the node's, and ⌊cost_cap/κ_tk⌋: only plans no costlier than one
    in hand matter, since the answer's bound never exceeds that plan's cost), so
    theirs is at least min(0, least rc of the class)·U_tk, the least rc taken over
    the master's columns and ``floors`` (a lower bound for the patterns not in
    it, from pricing). Computed here from y, not read from the LP solver, so its
    tolerances do not enter; artificial columns are in no plan.

    The same holds for θ·y, any θ ∈ [0, 1], and costs nothing more to evaluate:
    every pattern of (t, k) costs κ_tk, so its least reduced cost at θ·y is
    κ_tk − θ·(κ_tk − rc*_tk), pricing's fractional screen included (linear in the
    prices). Before column generation settles, y overprices the work and a θ
    below 1 gives a far better bound (Farley's); at the LP optimum θ = 1 wins."""
    a = master._matrix()
    cost = np.array(master.cols_c)
    ay = a.T @ y
    rc1 = cost - ay
    yb = float(y @ np.array(master.b))
    worst = dict(floors)
    p_cols, lo_cols = [], []
    for j, kind in enumerate(master.kind):
        if kind[0] == "p":
            p_cols.append(j)
        elif kind[0] in ("pat", "host"):
            key = (("h" if kind[0] == "host" else "t", kind[1]), kind[2])
            worst[key] = min(worst.get(key, 0.0), rc1[j])
            if master.bounds[j][0] > 0:
                lo_cols.append(j)
    kap, val, most, keys = [], [], [], []
    for ty in types:
        for k in range(len(ty.deltas)):
            key = (ty.key, k)
            u = min(ty.ub, master.class_hi.get(key, math.inf))
            if ty.kappa[k] > 0 and master.cost_cap < math.inf:  # a plan costing at most cost_cap
                u = min(u, math.floor(master.cost_cap / ty.kappa[k] + 1e-9))  # has at most cost_cap/κ of them
            keys.append(key)
            kap.append(ty.kappa[k])
            val.append(ty.kappa[k] - worst.get(key, 0.0))  # V_tk: rc*(θ) = κ − θ·V
            most.append(u)
    thetas = np.concatenate([np.linspace(0.0, 1.0, 41)])[:, None]
    bound = thetas[:, 0] * yb
    if p_cols:
        lo = np.array([master.bounds[j][0] for j in p_cols], dtype=float)
        hi = np.array([master.bounds[j][1] for j in p_cols], dtype=float)
        r = cost[p_cols][None, :] - thetas * ay[p_cols][None, :]
        bound = bound + np.where(r < 0, r * hi, r * lo).sum(axis=1)
    if lo_cols:
        lo = np.array([master.bounds[j][0] for j in lo_cols], dtype=float)
        r = cost[lo_cols][None, :] - thetas * ay[lo_cols][None, :]
        bound = bound + (np.maximum(r, 0.0) * lo).sum(axis=1)
    if keys:
        r = np.array(kap)[None, :] - thetas * np.array(val)[None, :]
        bound = bound + (np.minimum(r, 0.0) * np.array(most, dtype=float)[None, :]).sum(axis=1)
    best = int(np.argmax(bound))
    theta = float(thetas[best, 0])
    # kept for reduced-cost fixing (``class_limits``): every plan in the node costs at
    # least bound + Σ_tk max(0, rc*_tk)·N_tk, with rc*_tk its least reduced cost at θ·y
    master.last_bound = float(bound[best])
    master.class_rc = {key: kp - theta * v for key, kp, v in zip(keys, kap, val)}
    return master.last_bound


def class_limits(master: Master, cost: float) -> dict[tuple, int]:
    """Reduced-cost fixing: machine counts no plan cheaper than ``cost`` in the master's
    node can exceed. From the last ``lagrangian_bound`` (row prices y, bound L, least
    reduced cost rc*_tk of each type and class): a plan x in the node costs at least
    L + Σ_tk rc*_tk·N_tk where rc*_tk > 0, so costing under ``cost`` needs
    N_tk ≤ ⌊(cost − L)/rc*_tk⌋. {(type key, class): that limit} where it is finite."""
    out = {}
    slack = cost - getattr(master, "last_bound", -math.inf)
    if slack == math.inf or slack < 0:
        return out
    for key, rc in getattr(master, "class_rc", {}).items():
        if rc > 1e-9:
            out[key] = math.floor(slack / rc + 1e-9)
    return out


def extract(model: PlanModel, master: Master, x: np.ndarray) -> Solution:
    """The plan of a master solution ``x`` (columns priced after it count as 0)."""
    groups = model.groups
    x = np.concatenate([np.asarray(x, dtype=float), np.zeros(max(0, len(master.kind) - len(x)))])
    want = [0] * len(groups)
    sol = Solution()
    for j, kind in enumerate(master.kind):
        v = int(round(x[j]))
        if kind[0] == "p":
            want[kind[1]] = v * (groups[kind[1]].count if groups[kind[1]].together else 1)
    left = list(want)
    # existing hosts first, so a surplus (cover rows are ≥) lands on new machines, which are dropped
    order = sorted(range(len(master.kind)), key=lambda j: master.kind[j][0] != "host")
    for j in order:
        kind = master.kind[j]
        v = int(round(x[j]))
        if kind[0] not in ("pat", "host") or not v:
            continue
        for _ in range(v if kind[0] == "pat" else 1):
            take_pattern(model, sol, kind, left)
    return sol


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
