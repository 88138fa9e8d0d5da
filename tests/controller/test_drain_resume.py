"""A drain outlives the controller running it: killed mid-drain (mid-copy of
a move), the controller that starts on the same state settles the move it
left (the VM comes home) and resumes the drain of the host, which stays
``draining``, until every VM is off it; then it deregisters."""

from __future__ import annotations

import threading

import fuse
from support import agent_states, wait_until


def vm_body(name, mem=2048):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", "host": "old"}


def test_a_drain_cut_by_a_controller_crash_is_resumed_by_the_next_controller(fleet):
    old, new = fleet.agent("old"), fleet.agent("new")
    fleet.add("old", old, ram_mb=8192)
    fleet.add("new", new, ram_mb=8192)
    for n in ("a", "b", "c"):
        fleet.client.vms.create(vm_body(n))  # 32 MiB images: 8 chunks each
    fleet.restart(env={"FUSE_TEST_CRASH_AT": "chunk:2"})  # the first move kills the controller mid-copy
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="the controller sees the hosts")
    got = {}

    def drain():
        try:
            got["report"] = fuse.Client(fleet.ctl.url).hosts.drain("old")
        except Exception as exc:  # the controller died under the call
            got["error"] = exc
    t = threading.Thread(target=drain)
    t.start()
    wait_until(lambda: fleet.ctl.popen.poll() is not None, timeout=60, what="the controller to crash mid-move")
    t.join(timeout=30)
    assert "report" not in got, got
    [first] = _moves(fleet.ctl.state_dir)  # (read from its store: no controller runs)
    assert agent_states(old)[first] == "sleeping" and agent_states(new) == {first: "incoming"}

    fleet.restart()  # same state dir, no test hook: it settles the move and resumes the drain
    wait_until(lambda: sorted(agent_states(new)) == ["a", "b", "c"] and agent_states(old) == {}, timeout=120,
               what="the resumed drain to empty the host")
    assert all(s == "running" for s in agent_states(new).values()), agent_states(new)
    assert fleet.client.hosts.get("old").state == "draining"
    moves = fleet.client.moves.list()
    crashed = [m for m in moves if m["state"] == "failed"]
    assert len(crashed) == 1 and crashed[0]["vm"] == first and "restarted" in crashed[0]["reason"], moves
    assert sorted(m["vm"] for m in moves if m["state"] == "done") == ["a", "b", "c"], moves
    types = [e["type"] for e in fleet.client.events.list(0, limit=500)["events"]]
    assert "host_drain_resumed" in types
    report = wait_until(lambda: [e for e in fleet.client.events.list(0, limit=500)["events"]
                                 if e["type"] == "host_drain_report"], timeout=30, what="the resumed drain's report")
    assert sorted(m["vm"] for m in report[0]["moved"]) == ["a", "b", "c"] and report[0]["stuck"] == [], report
    # a drain asked now finds nothing left, and the host goes
    assert fleet.client.hosts.drain("old")["moved"] == []
    fleet.client.hosts.deregister("old")


def _moves(state_dir):
    """The VMs of the moves in a stopped controller's SQLite store."""
    import sqlite3
    with sqlite3.connect(state_dir / "fuse.db") as c:
        return [vm for (vm,) in c.execute("select vm from moves")]
