"""A replica that stalls past its move's lease (a frozen process) and then resumes: the
replica that took the move over and settled it keeps its word; the stalled one stops
driving the move, writing nothing (it overwrote the reason with "illegal transition
failed -> copying" and its task died with an unretrieved traceback)."""

from __future__ import annotations

import signal
import time

import pytest

import fuse
from support import reap, start_agent, start_controller, wait_until
from test_moves import register_src_dst, vm_body

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


def test_a_replica_frozen_past_its_move_lease_stops_driving_the_move_the_other_settled(tmp_path, postgres):
    db = postgres.create_db("fuse_moves_takeover")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_PAUSE_AT": "slept:12"})
    b = start_controller(tmp_path, db=db, name="ctl-b")
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            register_src_dst(ca, cb, agents)
            ca.vms.create(vm_body("job", host="src"))
            m = ca.moves.create("job", to="dst")
            wait_until(lambda: "test hook: held at slept" in a.logs(), timeout=30, what="the move held at slept")
            a.popen.send_signal(signal.SIGSTOP)
            try:
                settled = wait_until(lambda: (x := cb.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                                     timeout=60, what="replica b to take the move over and settle it")
            finally:
                a.popen.send_signal(signal.SIGCONT)
            assert settled["state"] == "failed", settled
            wait_until(lambda: "stops driving it" in a.logs(), timeout=30, what="replica a to stop driving the move")
            time.sleep(1)
            after = cb.moves.get(m["id"])
            assert (after["state"], after["reason"]) == ("failed", settled["reason"]), after
            assert "illegal transition" not in a.logs() and "Task exception" not in a.logs()
            vm = cb.vms.get("job")
            assert (vm["host"], vm["state"]) == ("src", "running")
    finally:
        for p in (a, b, *agents):
            p.stop()
        reap(tmp_path)
