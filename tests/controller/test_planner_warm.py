"""A controller loads the planner's solver libraries in the background as it starts
(the first plan's time limit is the solve's), unless FUSE_PLANNER_WARM=0 leaves them
to the first plan; either way a plan answers. Seen from outside: the libraries the
process has mapped."""

from __future__ import annotations

import time
from pathlib import Path

import fuse
from support import start_controller, wait_until


def solver_loaded(pid: int) -> bool:
    return "ortools" in Path(f"/proc/{pid}/maps").read_text()


def test_the_solver_libraries_load_at_start_by_default_and_at_the_first_plan_when_told(tmp_path):
    warm = start_controller(tmp_path, name="warm", env={"FUSE_PLANNER_WARM": "1"})
    cold = start_controller(tmp_path, name="cold", env={"FUSE_PLANNER_WARM": "0"})
    try:
        wait_until(lambda: solver_loaded(warm.popen.pid), timeout=60, interval=0.2, what="the solver loaded")
        time.sleep(2)
        assert not solver_loaded(cold.popen.pid)
        with fuse.Client(cold.url) as c:
            plan = c.pool.cloud_plan(fuse.ElasticPlanRequest(count=3, cpus=1, memory_mb=512))
        assert plan.solver == "exact", plan
        assert solver_loaded(cold.popen.pid)
    finally:
        warm.stop()
        cold.stop()
