"""Review 35 (real controller, fake-backend agents).

A drain reported a VM deleted during the drain as moved, quoting a move of its name off the
host that had ended before the drain (the VM back on the host since): only a move not over
when the drain read the host's list took a VM of it off, so the VM is ``finished`` as
``deleted`` (README, Moves and drain).

A failed move whose source could not wake the VM goes on waking it "unless someone woke,
deleted or moved it meanwhile" (README): the retry woke the VM its owner had woken and put
back to sleep since, and a new VM the owner made under the same name."""

from __future__ import annotations

import threading

import httpx
import pytest

import fuse
from support import agent_states, wait_until


def vm_body(name, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600", **kw}


def on_agent(agent, name):
    r = httpx.get(agent.url + f"/v1/host/vms/{name}", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return r.json() if r.status_code == 200 else None


def moved(client, name, to):
    m = client.moves.create(name, to=to)
    m = wait_until(lambda: (x := client.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=60,
                   what=f"the move of {name} to {to}")
    assert m["state"] == "done", m
    return m


@pytest.mark.timeout(240)
@pytest.mark.parametrize("through", ["controller", "agent"])
def test_a_vm_deleted_during_the_drain_is_not_reported_moved_by_a_move_over_before_it(fleet, through):
    src, dst = fleet.agent("src"), fleet.agent("dst")
    fleet.add("src", src)
    fleet.add("dst", dst)
    old = set()
    for name in ("a", "b"):  # each moved off src and back before the drain
        fleet.client.vms.create(vm_body(name, host="src"))
        old.add(moved(fleet.client, name, "dst")["id"])
        old.add(moved(fleet.client, name, "src")["id"])
    fleet.restart({"FUSE_TEST_PAUSE_AT": "slept:4"})  # each move held between its sleep and its copy
    got = {}

    def drain():
        got["report"] = fuse.Client(fleet.ctl.url).hosts.drain("src")
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    wait_until(lambda: "sleeping" in agent_states(src).values(), timeout=30, what="the first move asleep")
    first = next(n for n, s in agent_states(src).items() if s == "sleeping")
    other = ({"a", "b"} - {first}).pop()
    if through == "controller":
        fleet.client.vms.delete(other)
    else:  # on its host, the controller told only by the host's events
        r = httpx.delete(src.url + f"/v1/host/vms/{other}", headers={"Authorization": f"Bearer {src.token}"},
                         timeout=30)
        assert r.status_code == 204, r.text
    t.join(timeout=120)
    report = got["report"]
    # (was: moved also held {"vm": other, "move": <its old move to dst>, "to": "dst"}, other gone everywhere)
    assert [m["vm"] for m in report["moved"]] == [first] and report["moved"][0]["move"] not in old, report
    assert report["finished"] == [{"vm": other, "state": "deleted"}] and report["stuck"] == [], report
    assert on_agent(dst, other) is None and on_agent(src, other) is None
    assert on_agent(dst, first)["state"] == "running"


def _left_asleep(fleet):
    """A failed move of z (src -> dst) whose source could not wake it (its bundle gone), and
    the janitor's retries under way: ``(src, move, restore)``, ``restore()`` putting the bundle
    back once the next retry is 16 s away (the fourth, backing off 2, 4, 8, 16 s)."""
    src, dst = fleet.agent("agent-src"), fleet.agent("agent-dst")
    fleet.restart(env={"FUSE_TEST_PAUSE_AT": "copied:3", "FUSE_TEST_FAIL_AT": "copied"})
    fleet.add("src", src)
    fleet.add("dst", dst)
    fleet.client.vms.create(vm_body("z", host="src"))
    m = fleet.client.moves.create("z", to="dst")
    wait_until(lambda: fleet.client.moves.get(m["id"])["state"] == "copying", timeout=30, what="the copy")
    bundle = src.state_dir / "bundles" / "linux"
    aside = bundle.with_name("linux.aside")
    bundle.rename(aside)  # the source cannot wake it: its bundle gone (a full disk did the same)
    m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] == "failed" and x, timeout=60,
                   what="the move fails")
    assert "the vm is asleep on src: waking it failed" in m["reason"], m["reason"]

    def restore():
        for n in range(3):  # each retry that fails records when the next one is due
            m["updated_at"] = wait_until(lambda: (u := fleet.client.moves.get(m["id"])["updated_at"]) != m["updated_at"]
                                         and u, timeout=30, what=f"retry {n + 1} of the wake")
        assert on_agent(src, "z")["state"] == "sleeping"
        aside.rename(bundle)
    return src, m, restore


def _next_retry_leaves_it(fleet, src, m):
    """Wait for the retry due next (it records that it is done), then check it left z alone."""
    wait_until(lambda: fleet.client.moves.get(m["id"])["updated_at"] != m["updated_at"], timeout=40,
               what="the next retry of the wake")
    assert on_agent(src, "z")["state"] == "sleeping"  # (was: running, woken by the failed move's retry)
    woken = [e for e in fleet.client.events.list(0, limit=500)["events"] if e["type"] == "move_source_woken"]
    assert woken == []


@pytest.mark.timeout(240)
def test_a_failed_moves_retry_does_not_undo_the_owners_sleep_after_a_wake(fleet):
    src, m, restore = _left_asleep(fleet)
    restore()
    assert fleet.client.vms.wake("z")["state"] == "running"  # the owner wakes it...
    assert fleet.client.vms.sleep("z")["state"] == "sleeping"  # ...and puts it to sleep on purpose
    _next_retry_leaves_it(fleet, src, m)


@pytest.mark.timeout(240)
def test_a_failed_moves_retry_does_not_wake_a_new_vm_of_the_name(fleet):
    src, m, restore = _left_asleep(fleet)
    before = on_agent(src, "z")["created_at"]
    restore()
    fleet.client.vms.delete("z")  # the owner deletes it, makes another of its name, and sleeps that
    fleet.client.vms.create(vm_body("z", host="src", entry="sleep 900"))
    assert fleet.client.vms.sleep("z")["state"] == "sleeping"
    assert on_agent(src, "z")["created_at"] != before
    _next_retry_leaves_it(fleet, src, m)


@pytest.mark.timeout(300)
def test_a_retry_an_older_controller_left_pending_still_wakes_the_vm(fleet):
    # the diff review: a failed move's row an older controller wrote has no `left_asleep`, and
    # the check that the VM is still the one the move left took that for "someone acted": the
    # retry was dropped, the VM asleep for good
    import json
    import sqlite3

    src, m, restore = _left_asleep(fleet)
    restore()
    fleet.ctl.stop()
    assert on_agent(src, "z")["state"] == "sleeping", "woken before the controller stopped: nothing to show"
    with sqlite3.connect(fleet.tmp / "controller" / "fuse.db") as c:
        (rec,) = c.execute("select record from moves where id = ?", (m["id"],)).fetchone()
        rec = json.loads(rec)
        assert rec.get("left_asleep") and rec.get("source_wake_pending"), rec
        del rec["left_asleep"]
        c.execute("update moves set record = ? where id = ?", (json.dumps(rec), m["id"]))
    fleet.restart()
    wait_until(lambda: on_agent(src, "z")["state"] == "running", timeout=90,
               what="the retry to wake z (was: dropped, z asleep for good)")
    # (said once the wake has answered the janitor: a moment after the agent runs it)
    wait_until(lambda: [e["vm"] for e in fleet.client.events.list(0, limit=500)["events"]
                        if e["type"] == "move_source_woken"] == ["z"], timeout=30, what="move_source_woken for z")
