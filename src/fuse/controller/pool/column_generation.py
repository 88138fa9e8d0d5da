"""Column generation on the pattern model's master, and the bounds it gives (``patterns``).

``generate`` alternates the master's LP (``pattern_master``) and pricing
(``pattern_pricing``) until no pattern prices out or time runs out. At every round
``lagrangian_bound`` turns the LP's row prices into a lower bound on every integer
plan of the master's node, computed here rather than read from HiGHS so that LP
tolerances cannot make it invalid; ``class_limits`` turns that bound into
reduced-cost fixing of the machine counts (``search``, ``benders``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.pattern_master import Master
from fuse.controller.pool.pattern_pricing import price_all
from fuse.controller.pool.patterns import MachineType


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
