"""Thirty-second session (review: concurrency): a move asked while its VM was deleted. The
VM was checked once, before the (slow) target was asked; a delete answered 204 meanwhile,
and the move was then recorded (202) for no VM, ran its sleep on nothing and read `failed`
("failed" means the VM is home: it was gone); a drain reported the deleted VM stuck. A move
that lost the race under the lock said `move_in_progress` ("left host ... ask again") for a
VM no move holds. Both are `409 not_movable` now, and a drain lists the VM as finished."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import fuse
from support import wait_until


def _vm(client, name, host):
    client.vms.create({"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": host})


@pytest.fixture
def three(fleet):
    """a1 (the VM's), a2 (the best fit, to be frozen), a3 (holding a filler: a2 fits best)."""
    agents = {h: fleet.agent(h) for h in ("a1", "a2", "a3")}
    for h, a in agents.items():
        fleet.add(h, a)
    _vm(fleet.client, "filler", "a3")
    return agents


def _frozen_while(agent, seconds: float, work) -> dict:
    """Run ``work`` (a dict of name -> (delay, call)) while ``agent`` is SIGSTOPped for ``seconds``:
    {name: answer or ApiError}."""
    out: dict = {}

    def run(key, delay, call):
        time.sleep(delay)
        try:
            out[key] = call()
        except fuse.ApiError as err:
            out[key] = err

    threads = [threading.Thread(target=run, args=(k, d, c)) for k, (d, c) in work.items()]
    os.kill(agent.popen.pid, signal.SIGSTOP)
    try:
        for t in threads:
            t.start()
        time.sleep(seconds)
    finally:
        os.kill(agent.popen.pid, signal.SIGCONT)
    for t in threads:
        t.join(60)
    return out


def _no_move_of(client, name):
    assert [m for m in client.moves.list() if m["vm"] == name] == []


def test_a_best_fit_move_whose_vm_was_deleted_while_its_target_was_asked_is_not_movable(fleet, three):
    _vm(fleet.client, "mx", "a1")
    out = _frozen_while(three["a2"], 4, {"move": (0, lambda: fleet.client.moves.create("mx")),
                                         "delete": (1, lambda: fleet.client.vms.delete("mx", host="a1"))})
    assert out["delete"] is None  # (204)
    # (was: 202, then the move `failed` on a VM that no longer was)
    assert isinstance(out["move"], fuse.ApiError) and out["move"].code == "not_movable", out["move"]
    assert "deleted" in out["move"].message
    _no_move_of(fleet.client, "mx")


def test_a_move_to_a_named_target_that_lost_the_race_to_a_delete_is_not_movable(fleet, three):
    _vm(fleet.client, "gone1", "a1")
    out = _frozen_while(three["a2"], 3, {"move": (0, lambda: fleet.client.moves.create("gone1", to="a2")),
                                         "delete": (0.3, lambda: fleet.client.vms.delete("gone1"))})
    assert out["delete"] is None
    # (was: move_in_progress, "vm gone1 left host a1 while this move was asked: ask again")
    assert isinstance(out["move"], fuse.ApiError) and out["move"].code == "not_movable", out["move"]
    _no_move_of(fleet.client, "gone1")


def test_a_drain_lists_a_vm_deleted_during_it_as_finished_not_stuck(fleet, three):
    _vm(fleet.client, "dx", "a1")
    out = _frozen_while(three["a2"], 4, {"drain": (0, lambda: fleet.client.hosts.drain("a1")),
                                         "delete": (1, lambda: fleet.client.vms.delete("dx", host="a1"))})
    assert out["delete"] is None
    report = out["drain"]
    # (was: stuck [{"vm": "dx", "code": "move_failed", "reason": "host a1: no vm named dx ..."}])
    assert [s for s in report["stuck"] if s["vm"] == "dx"] == [], report
    wait_until(lambda: fleet.client.vms.list(host="a1") == [], timeout=10, what="a1 empty")
    _no_move_of(fleet.client, "dx")
