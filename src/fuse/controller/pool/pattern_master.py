"""The pattern model's master problem (``patterns``): its rows, its columns, its solves.

``Master`` holds the restricted master as columns come (placed counts, patterns,
artificials) and rows (cover, target, the caps, branching rows of a ``Node``); ``lp``
re-solves it warm with HiGHS as column generation adds patterns, ``mip`` solves it
whole, ``counts_mip`` with whole machine counts and fractional patterns. ``extract``
reads a plan from a solution of it. Column generation and its bound on the master
are in ``column_generation``, the search over it in ``search``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import highspy
import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import csc_matrix

from fuse.controller.pool.highs import _new_highs, highs_mip, milp
from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.patterns import MachineType, take_pattern
from fuse.controller.pool.solution import Solution

COUNTS_GAP = 0.0  # the counts MIP's relative gap: it looks for a plan, the proof comes after


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
