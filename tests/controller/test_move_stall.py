"""A target that stops reading mid-copy (its agent SIGSTOPped: its kernel still
takes some bytes into its buffers) fails the bulk copy's step after
FUSE_MOVE_IO_TIMEOUT, not after twice that: a splice into a socket waits in
several steps, each of which may take the socket's whole timeout."""

from __future__ import annotations

import os
import signal
import time

import pytest

from support import wait_until

IO = 6.0


@pytest.mark.timeout(180)
def test_a_target_that_stops_reading_fails_the_copy_after_the_io_timeout(fleet):
    old, new = fleet.agent("old"), fleet.agent("new")
    fleet.restart(env={"FUSE_MOVE_IO_TIMEOUT": str(IO), "FUSE_TEST_CHUNK_DELAY": "0.3"})
    fleet.add("old", old, ram_mb=8192)
    fleet.add("new", new, ram_mb=8192)
    fleet.client.vms.create({"name": "v", "host": "old", "shape": {"vcpus": 1, "mem_mib": 2048}, "entry": "count"})
    move = fleet.client.moves.create("v", to="new")
    wait_until(lambda: fleet.client.moves.get(move["id"])["copied_bytes"] >= 8 << 20, timeout=60,
               what="the copy under way")
    os.kill(new.popen.pid, signal.SIGSTOP)
    try:
        seen = {"bytes": -1, "at": time.monotonic()}

        def ended() -> bool:
            m = fleet.client.moves.get(move["id"])
            if m["copied_bytes"] != seen["bytes"]:  # (the target's buffers take a chunk or two first)
                seen.update(bytes=m["copied_bytes"], at=time.monotonic())
            return m["rolling_back"] or m["state"] == "failed"

        wait_until(ended, timeout=60, interval=0.1, what="the copy's step to fail")
        stalled = time.monotonic() - seen["at"]
        # (the old code took 2 × IO + ~0.4 s; the reason may ask both hosts for up to 2 s more)
        assert stalled < IO + 4.5, f"the step failed {stalled:.1f} s after the last chunk got through"
        assert f"did not answer within {IO:g} s during copying" in fleet.client.moves.get(move["id"])["reason"]
    finally:
        os.kill(new.popen.pid, signal.SIGCONT)
    wait_until(lambda: fleet.client.moves.get(move["id"])["state"] == "failed", timeout=90, what="the move's end")
    wait_until(lambda: fleet.client.vms.get("v")["state"] == "running", timeout=60, what="the vm home, awake")
    assert fleet.client.vms.get("v")["host"] == "old"
