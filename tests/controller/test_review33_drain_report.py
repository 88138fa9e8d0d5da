"""Review 33: a VM deleted while a drain was under way (before its turn) was in none of the
report's lists (``moved``, ``stuck``, ``finished``, ``prewarmed``), though the report accounts for
every VM the host had (README): it is in ``finished`` as ``deleted``."""

from __future__ import annotations

import threading

import fuse
from support import agent_states, wait_until


def test_a_vm_deleted_during_the_drain_is_finished_as_deleted(fleet):
    src, dst = fleet.agent("src"), fleet.agent("dst")
    fleet.add("src", src)
    fleet.add("dst", dst)
    for name in ("a", "zd"):
        fleet.client.vms.create({"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600",
                                 "host": "src"})
    fleet.restart({"FUSE_TEST_PAUSE_AT": "slept:4"})  # each move held between its sleep and its copy
    got = {}

    def drain():
        got["report"] = fuse.Client(fleet.ctl.url).hosts.drain("src")
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    wait_until(lambda: "sleeping" in agent_states(src).values(), timeout=30, what="the first move asleep")
    first = next(n for n, s in agent_states(src).items() if s == "sleeping")
    other = ({"a", "zd"} - {first}).pop()
    fleet.client.vms.delete(other)  # (before the drain comes to it)
    t.join(timeout=120)
    report = got["report"]
    assert [m["vm"] for m in report["moved"]] == [first] and report["stuck"] == [], report
    assert {"vm": other, "state": "deleted"} in report["finished"], report  # (was: in no list)
