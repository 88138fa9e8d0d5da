"""HiGHS, quiet: the solver calls the pattern model and the Benders cuts share.

HiGHS writes from C++ on the process's stdout (a banner from its first instance, a
debug line from its MIP), where ``fuse pool plan --json`` writes its answer; every
solve here goes through ``stdout_to_stderr``. ``highs_mip`` drives highspy directly
for what scipy's ``milp`` does not pass on (a cutoff, a start point, the points it
improved on, heuristics off); ``milp`` is scipy's, silenced. Its own module so that
the pattern model's master and the Benders master share one way of calling HiGHS.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from contextlib import contextmanager
from types import SimpleNamespace

import highspy
import numpy as np
from scipy.optimize import milp as _milp

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
