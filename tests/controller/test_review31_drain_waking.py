"""Review 31: a drain resumed after a controller crash at its move's wake (the VM woken on
the target, recorded there, the move not yet settled) reported `moved: [] stuck: []`: the VM
was in no list of the report. The resumed drain waits for such a move and reports it."""

from __future__ import annotations

import signal
import threading
import time

import fuse
from support import agent_states, wait_until


def test_a_drain_resumed_with_its_move_unsettled_at_the_wake_reports_that_vm(fleet):
    old, new = fleet.agent("old"), fleet.agent("new")
    fleet.add("old", old, ram_mb=8192)
    fleet.add("new", new, ram_mb=8192)
    fleet.client.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 512}, "entry": "count", "host": "old"})
    fleet.restart(env={"FUSE_TEST_CRASH_AT": "woke"})  # the move kills the controller once the target woke it
    wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), what="the controller sees the hosts")

    def drain():
        try:
            fuse.Client(fleet.ctl.url).hosts.drain("old")
        except Exception:
            pass  # the controller died under the call
    t = threading.Thread(target=drain)
    t.start()
    wait_until(lambda: fleet.ctl.popen.poll() is not None, timeout=60, what="the controller to crash at the wake")
    t.join(timeout=30)
    assert agent_states(new) == {"v1": "running"}
    new.popen.send_signal(signal.SIGSTOP)  # the move cannot settle at once: the drain resumes first
    try:
        fleet.restart()
        time.sleep(3)
    finally:
        new.popen.send_signal(signal.SIGCONT)
    report = wait_until(lambda: [e for e in fleet.client.events.list(0, limit=500)["events"]
                                 if e["type"] == "host_drain_report"], timeout=90, what="the resumed drain's report")
    assert [m["vm"] for m in report[0]["moved"]] == ["v1"] and report[0]["stuck"] == [], report
    assert agent_states(new) == {"v1": "running"} and agent_states(old) == {}
