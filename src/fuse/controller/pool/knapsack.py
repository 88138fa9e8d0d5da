"""The 0/1 knapsack passes under the planner's pricing and cuts, compiled (numba).

A table f over (vCPUs, memory units, VMs) holds the most value of a machine of each
size; one pass takes one item copy of weight (cw, mw, sw) and value v:

    f(c, m, s) ← max(f(c, m, s), f(c − cw, m − mw, s − sw) + v)

for every cell, reading the table as it was before the pass. Cells are visited with
c descending: a copy weighs at least one vCPU, so each row reads a row below it that
the pass has not written yet, and the row's own loop is free of dependencies (LLVM
vectorises it). numpy did the same pass as four array operations and two temporary
tables; this is one sweep (2–3× less time on the tables of 96-vCPU machines, where
the planner spends much of its time). ``masks[p]`` records where copy p improved a
cell by more than 10⁻¹² (for walking the choices back); pass an empty array to skip.

Only the cells a machine can fill are worked out (``row_limits``): no copy takes more memory
per vCPU than the most any of them takes, r, so a set of copies within c vCPUs holds at most
⌊r·c⌋ memory units, and every cell (c, m) with m past that holds what (c, ⌊r·c⌋) holds. Row c
is computed up to its limit only, a read past a row's limit is a read at it (``at``), and
walking the choices back clamps the same way. The answers are the whole table's, to the bit
(prices, patterns and bounds compared on the bench models); on the 1,000-VM bench models
(machines of up to 96 vCPUs and 8 GiB a vCPU, VMs of at most 4 GiB a vCPU) a plan takes ~11 %
less CPU time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

def _compiled(f):
    """``f`` compiled on first call, kept in numba's cache (beside this file, else the user's
    cache dir) so that later processes load it; compiled per process when neither is writable."""
    try:
        return njit(cache=True, nogil=True, boundscheck=False)(f)
    except RuntimeError:  # (numba: "cannot cache function ...: no locator available")
        return njit(nogil=True, boundscheck=False)(f)


NO_MASKS2, NO_MASKS3 = np.zeros((0, 1, 1), dtype=np.bool_), np.zeros((0, 1, 1, 1), dtype=np.bool_)


@_compiled
def _passes2(f, cws, mws, vals, masks, lims):  # pragma: no cover - compiled; run() is the entry
    record = masks.shape[0] > 0
    for p in range(cws.shape[0]):
        cw, mw, v = cws[p], mws[p], vals[p]
        for i in range(f.shape[0] - 1, cw - 1, -1):
            src, dst = f[i - cw], f[i]
            hi, held = lims[i] + 1, lims[i - cw]  # this row's cells; the last one of the row read
            mid = min(hi, held + mw + 1)  # columns from mid on read the row's last cell (past it)
            if record:
                mk = masks[p, i]
                for j in range(mw, mid):
                    c, o = src[j - mw] + v, dst[j]
                    mk[j] = c > o + 1e-12
                    dst[j] = c if c > o else o
                c = src[held] + v
                for j in range(mid, hi):
                    o = dst[j]
                    mk[j] = c > o + 1e-12
                    dst[j] = c if c > o else o
            else:
                for j in range(mw, mid):
                    c, o = src[j - mw] + v, dst[j]
                    dst[j] = c if c > o else o
                c = src[held] + v
                for j in range(mid, hi):
                    o = dst[j]
                    dst[j] = c if c > o else o


@_compiled
def _passes3(f, cws, mws, sws, vals, masks):  # pragma: no cover - compiled; run() is the entry
    rows, cols, depth = f.shape
    record = masks.shape[0] > 0
    for p in range(cws.shape[0]):
        cw, mw, sw, v = cws[p], mws[p], sws[p], vals[p]
        for i in range(rows - 1, cw - 1, -1):
            for j in range(mw, cols):
                for s in range(sw, depth):
                    c, o = f[i - cw, j - mw, s - sw] + v, f[i, j, s]
                    if record:
                        masks[p, i, j, s] = c > o + 1e-12
                    f[i, j, s] = c if c > o else o


def row_limits(f: np.ndarray, copies: list[tuple]) -> np.ndarray:
    """The last memory column each row of ``f`` needs for ``copies`` [(cw, mw, …)] (every copy
    that will ever be passed to ``f``): ⌊r·c⌋ for row c, r the most memory per vCPU of any copy,
    at most the table's last column (module docstring). Rows past the limit are never read
    but through ``at``; a table with a VM-count dimension is worked out whole."""
    rows, cols = f.shape[0], f.shape[1]
    if f.ndim == 3 and f.shape[2] > 1:
        return np.full(rows, cols - 1, dtype=np.int64)
    num, den = 0, 1  # r = num / den, compared exactly
    for c in copies:
        if c[1] * den > num * c[0]:
            num, den = c[1], c[0]
    return np.minimum(np.arange(rows, dtype=np.int64) * num // den, cols - 1)


def at(lims: np.ndarray, c: int, m: int) -> int:
    """The column that holds cell (c, m)'s value: m, or the row's limit when m is past it."""
    return min(m, int(lims[c]))


def run(f: np.ndarray, copies: list[tuple[int, int, int, float]], record: bool = False,
        lims: np.ndarray | None = None) -> np.ndarray:
    """Apply the passes of ``copies`` [(cw, mw, sw, value)] to ``f`` (shape (C+1, M+1, S+1),
    float64, in place), in order. With ``record``: masks of shape (len(copies), C+1, M+1,
    S+1), ``masks[p][cell]`` true where copy p improved the cell (false below its weight).
    ``lims``: ``row_limits`` of ``f`` (every cell of each row when not given), which the
    reads of ``f`` and of the masks must then go through (``at``)."""
    n = len(copies)
    masks = np.zeros((n,) + f.shape, dtype=np.bool_) if record else NO_MASKS3
    if not n:
        return masks
    w = np.array([c[:3] for c in copies], dtype=np.int64).reshape(n, 3)
    vals = np.array([c[3] for c in copies], dtype=np.float64)
    if min(w[:, 0]) < 1:
        raise ValueError("a knapsack item copy weighs no vCPU")
    if f.shape[2] == 1:
        if lims is None:
            lims = np.full(f.shape[0], f.shape[1] - 1, dtype=np.int64)
        _passes2(f.reshape(f.shape[:2]), w[:, 0].copy(), w[:, 1].copy(), vals,
                 masks.reshape(masks.shape[:3]) if record else NO_MASKS2, lims)
    else:
        _passes3(f, w[:, 0].copy(), w[:, 1].copy(), w[:, 2].copy(), vals, masks)
    return masks


def warm() -> None:
    """Compile (or load from numba's cache) both kernels, before any clock starts."""
    for depth in (1, 2):
        f = np.zeros((3, 3, depth))
        run(f, [(1, 1, depth - 1, 1.0)], record=True)
        run(f, [(1, 1, depth - 1, 1.0)], lims=row_limits(f, [(1, 1)]))
