"""Moves between real agent processes (fake backend: stand-in VMs that
count, with a memory image copied in 4 MiB chunks), including the
controller-crash matrix and the failure cases that must bring a VM home."""

from __future__ import annotations

import time

import httpx
import pytest

import fuse
from support import reap, start_agent, start_controller, wait_until


class Fleet:
    def __init__(self, tmp):
        self.tmp, self.procs, self.agents = tmp, [], {}
        self.ctl = start_controller(tmp)
        self.client = fuse.Client(self.ctl.url)

    def agent(self, host_id, **kw):
        a = start_agent(self.tmp, backend="fake", name=f"agent-{host_id}", **kw)
        self.procs.append(a)
        self.agents[host_id] = a
        return a

    def add(self, host_id, vm_count=10, **kw):
        a = self.agents.get(host_id) or self.agent(host_id, **kw)
        self.client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=a.url, token=a.token, backend="qemu",
                                                            capacity=fuse.HostCapacity(vm_count=vm_count)))

    def restart_controller(self, env=None):
        self.client.close()
        self.ctl.stop()
        self.ctl = start_controller(self.tmp, env=env)
        self.client = fuse.Client(self.ctl.url)

    def host_vms(self, host_id):
        a = self.agents[host_id]
        try:
            r = httpx.get(a.url + "/v1/host/vms", headers={"Authorization": f"Bearer {a.token}"}, timeout=10)
        except httpx.ConnectError:
            return {}  # a stopped agent runs nothing (its VMs' processes are reaped at the end)
        return {v["name"]: v for v in r.json()["vms"]}

    def incoming(self, host_id):
        a = self.agents[host_id]
        return httpx.get(a.url + "/v1/host/incoming", headers={"Authorization": f"Bearer {a.token}"}, timeout=10).json()

    def running_copies(self, name):
        return [h for h in self.agents if self.host_vms(h).get(name, {}).get("state") == "running"]

    def counter(self, name):
        text = self.client.vms.console(name)["text"]
        nums = [int(l) for l in text.splitlines() if l.strip().isdigit()]
        return nums

    def wait_move(self, move_id, timeout=60):
        return wait_until(lambda: (m := self.client.moves.get(move_id))["state"] in ("done", "failed") and m,
                          timeout=timeout, what=f"move {move_id}")

    def close(self):
        self.client.close()
        self.ctl.stop()
        for p in self.procs:
            p.stop()
        reap(self.tmp)


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def vm_body(name, mem=1024, **kw):
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}


def test_a_vm_moves_there_and_straight_back_by_name_alone(fleet):
    """Once the target woke it the VM is on the target only: the source's
    sleeping copy, until it is removed, never makes the name ambiguous,
    however many times the pollers see it."""
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    fleet.restart_controller(env={"FUSE_TEST_PAUSE_AT": "woke:4"})  # hold each move between wake and removal
    for to, away in (("dst", "src"), ("src", "dst")):
        m = fleet.client.moves.create("job1", to=to)
        wait_until(lambda: fleet.client.moves.get(m["id"])["state"] == "waking"
                   and fleet.host_vms(to).get("job1", {}).get("state") == "running", timeout=30, what="target woke")
        assert fleet.host_vms(away)["job1"]["state"] == "sleeping"  # the source copy is still there...
        time.sleep(2.0)  # ...while the pollers see both hosts at least once
        assert fleet.client.vms.get("job1")["host"] == to
        assert fleet.wait_move(m["id"])["state"] == "done"
    assert fleet.running_copies("job1") == ["src"]


def test_a_counting_vm_moves_and_carries_on(fleet):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    time.sleep(1.0)
    before = max(fleet.counter("job1"))
    m = fleet.client.moves.create("job1", to="dst")
    assert m["state"] in ("pending", "sleeping", "copying", "waking", "done") and m["to"] == "dst"
    m = fleet.wait_move(m["id"])
    assert m["state"] == "done", m
    assert m["total_bytes"] > 3 * 4 * 1024 * 1024 and m["copied_bytes"] == m["total_bytes"]
    assert m["copy_path"] == "bulk" and m["copy_secs"] > 0 and m["verify_secs"] > 0
    assert fleet.running_copies("job1") == ["dst"]
    assert "job1" not in fleet.host_vms("src")
    assert fleet.client.vms.get("job1")["host"] == "dst"
    time.sleep(1.0)
    after = fleet.counter("job1")  # the target's console: it carries on from where it slept
    assert after and min(after) > before and min(after) <= before + 10
    states = [e["to"] for e in fleet.client.events.list(0, limit=500)["events"]
              if e["type"] == "move_state" and e["move"] == m["id"]]
    assert states == ["pending", "sleeping", "copying", "waking", "done"]
    assert [x["id"] for x in fleet.client.moves.list()] == [m["id"]]


def test_best_fit_target_when_none_is_named(fleet):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    assert fleet.wait_move(fleet.client.moves.create("job1")["id"])["to"] == "dst"


@pytest.mark.parametrize("case,code", [
    ("unknown target", "unknown_host"), ("same host", "same_host"), ("exited vm", "not_movable"),
    ("second move", "move_in_progress"), ("no other host", "no_target"), ("target down", "host_unreachable"),
    ("other bundle", "arch_mismatch"),
], ids=lambda x: x if " " in str(x) else None)
def test_refusals(fleet, tmp_path, case, code):
    fleet.add("src")
    if case != "no other host":
        fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    kw = {"to": "dst"}
    if case == "unknown target":
        kw = {"to": "nowhere"}
    elif case == "same host":
        kw = {"to": "src"}
    elif case == "exited vm":
        fleet.client.vms.create(vm_body("quick", host="src"))
        # Kill the stand-in's process: the agent sees it exit.
        import os, signal
        pid = fleet.host_vms("src")["quick"]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: fleet.host_vms("src")["quick"]["state"] in ("exited", "failed"), what="vm exit")
        wait_until(lambda: fleet.client.vms.get("quick")["state"] in ("exited", "failed"), what="controller sees exit")
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.moves.create("quick", to="dst")
        assert (info.value.status, info.value.code) == (409, code)
        return
    elif case == "second move":
        fleet.client.moves.create("job1", to="dst")
    elif case == "no other host":
        kw = {}
    elif case == "target down":
        fleet.agents["dst"].stop()
        wait_until(lambda: not fleet.client.hosts.get("dst").connected, what="disconnect")
    elif case == "other bundle":
        from support import fake_bundle
        fleet.agents["dst"].stop()
        fake_bundle(fleet.agents["dst"].state_dir, fingerprint="another-bundle")
        port = int(fleet.agents["dst"].url.rsplit(":", 1)[1])
        fleet.procs.append(start_agent(tmp_path, backend="fake", name="agent-dst", port=port))
        wait_until(lambda: fleet.client.hosts.get("dst").connected and
                   fleet.client.hosts.get("dst").bundles[0]["fingerprint"] == "another-bundle", timeout=30,
                   what="reconnect with the other bundle")
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.moves.create("job1", **kw)
    assert (info.value.status, info.value.code) == (409, code)
    if case == "second move":  # the first move goes on undisturbed
        first = fleet.client.moves.list()[0]
        assert fleet.wait_move(first["id"])["state"] == "done"
        assert fleet.running_copies("job1") == ["dst"]
    else:
        assert fleet.running_copies("job1") == ["src"]


def _check_home_or_moved(fleet, name, expect=None):
    copies = fleet.running_copies(name)
    assert len(copies) == 1, f"vm {name} runs on {copies}"
    if expect:
        assert copies == [expect]
    for h in fleet.agents:
        assert fleet.incoming(h)["incoming"] == []
    return copies[0]


@pytest.mark.parametrize("point", ["slept", "chunk:1", "chunk:3", "copied", "woke"])
def test_controller_crash_at_every_step_completes_or_rolls_back(fleet, point):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    fleet.restart_controller(env={"FUSE_TEST_CRASH_AT": point})
    m = fleet.client.moves.create("job1", to="dst")
    wait_until(lambda: fleet.ctl.popen.poll() is not None, timeout=60, what=f"controller to crash at {point}")
    fleet.ctl = start_controller(fleet.tmp)  # no crash hook now
    fleet.client.close()
    fleet.client = fuse.Client(fleet.ctl.url)
    m = fleet.wait_move(m["id"])
    where = _check_home_or_moved(fleet, "job1")
    assert where == ("dst" if m["state"] == "done" else "src")
    if point == "woke":
        assert m["state"] == "done"
    if point in ("slept", "chunk:1", "chunk:3"):
        assert m["state"] == "failed" and "restarted" in m["reason"]
    wait_until(lambda: all(v["name"] != "job1" or h == where for h in fleet.agents
                           for v in fleet.host_vms(h).values()), timeout=20, what="source copy removed")
    assert fleet.client.vms.get("job1")["host"] == where


def test_a_controller_stopped_mid_copy_exits_at_once_and_the_next_one_brings_the_vm_home(fleet):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src", mem=4096))  # 64 MiB image: 16 chunks
    fleet.restart_controller(env={"FUSE_TEST_CHUNK_DELAY": "0.5"})  # 8 s of copying
    m = fleet.client.moves.create("job1", to="dst")
    wait_until(lambda: fleet.client.moves.get(m["id"])["copied_bytes"] > 0, timeout=30, what="copy started")
    t0 = time.monotonic()
    fleet.ctl.stop(timeout=30)
    assert fleet.ctl.popen.returncode == 0 and time.monotonic() - t0 < 5  # not held by the copying thread
    fleet.ctl = start_controller(fleet.tmp)
    fleet.client.close()
    fleet.client = fuse.Client(fleet.ctl.url)
    m = fleet.wait_move(m["id"])
    assert m["state"] == "failed" and "restarted" in m["reason"], m
    _check_home_or_moved(fleet, "job1", expect="src")


@pytest.mark.parametrize("path", ["bulk", "http"])
def test_a_corrupted_chunk_brings_the_vm_home(fleet, path):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src"))
    fleet.restart_controller(env={"FUSE_TEST_CORRUPT_CHUNK": "2", "FUSE_MOVE_COPY_PATH": "auto" if path == "bulk" else path})
    m = fleet.wait_move(fleet.client.moves.create("job1", to="dst")["id"])
    assert m["state"] == "failed" and "sha256" in m["reason"] and "does not match" in m["reason"], m
    assert m["copied_bytes"] == m["total_bytes"]  # every chunk arrived; the check caught the damaged one
    _check_home_or_moved(fleet, "job1", expect="src")


def test_target_agent_dying_mid_copy_brings_the_vm_home_and_cleans_up_later(fleet, tmp_path):
    fleet.add("src")
    fleet.add("dst")
    fleet.client.vms.create(vm_body("job1", host="src", mem=4096))  # 64 MiB image: 16 chunks
    fleet.restart_controller(env={"FUSE_TEST_CHUNK_DELAY": "0.2"})  # the agent dies while chunks still flow
    m = fleet.client.moves.create("job1", to="dst")
    wait_until(lambda: fleet.client.moves.get(m["id"])["copied_bytes"] > 0, timeout=30, what="copy started")
    dst = fleet.agents["dst"]
    dst.kill()
    m = fleet.wait_move(m["id"])
    assert m["state"] == "failed"
    assert fleet.running_copies("job1") == ["src"] or \
        [h for h in ("src",) if fleet.host_vms(h)["job1"]["state"] == "running"] == ["src"]
    port = int(dst.url.rsplit(":", 1)[1])
    fleet.procs.append(start_agent(tmp_path, backend="fake", name="agent-dst", port=port))
    wait_until(lambda: fleet.incoming("dst")["incoming"] == [], timeout=40, what="target's incoming cleaned")
    assert "job1" not in fleet.host_vms("dst")


def test_drain_empties_a_host_and_then_deregister_succeeds(fleet):
    fleet.add("old")
    fleet.add("new")
    for n in ("a", "b", "c"):
        fleet.client.vms.create(vm_body(n, host="old", mem=256))
    report = fleet.client.hosts.drain("old")
    assert sorted(m["vm"] for m in report["moved"]) == ["a", "b", "c"] and report["stuck"] == [], report
    assert fleet.client.hosts.get("old").state == "draining"
    assert fleet.host_vms("old") == {}
    assert sorted(fleet.host_vms("new")) == ["a", "b", "c"]
    fleet.client.hosts.deregister("old")


def test_drain_reports_vms_that_cannot_move_and_uncordon_ends_it(fleet):
    fleet.add("only")
    fleet.client.vms.create(vm_body("a", host="only", mem=256))
    report = fleet.client.hosts.drain("only")
    assert report["moved"] == [] and [s["vm"] for s in report["stuck"]] == ["a"]
    assert report["stuck"][0]["code"] == "no_target"
    assert fleet.running_copies("a") == ["only"]  # reported, not killed
    fleet.client.hosts.uncordon("only")
    assert fleet.client.hosts.get("only").state == "active"


def test_replicas_on_postgresql_leave_a_live_move_alone_and_take_over_a_dead_ones(tmp_path, postgres):
    db = postgres.create_db("fuse_moves_replicas")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_CRASH_AT": "chunk:2"})
    # b copies slowly (a pause after each chunk), so its move is still under way as c starts.
    b = start_controller(tmp_path, db=db, name="ctl-b", env={"FUSE_TEST_CHUNK_DELAY": "0.1"})
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    extra = []
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            for h, ag in zip(("src", "dst"), agents):
                ca.hosts.register(fuse.RegisterHostRequest(id=h, url=ag.url, token=ag.token, backend="qemu",
                                                           capacity=fuse.HostCapacity(vm_count=4)))
            wait_until(lambda: all(h.connected for h in cb.hosts.list()), what="replica b sees the hosts")
            ca.vms.create(vm_body("job1", host="src"))
            m = ca.moves.create("job1", to="dst")  # replica a drives it, and dies at chunk 2
            wait_until(lambda: a.popen.poll() is not None, timeout=60, what="replica a to die mid-copy")
            m = wait_until(lambda: (x := cb.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=60,
                           what="replica b to take the move over")
            assert m["state"] == "failed" and "stopped" in m["reason"]
            vm = cb.vms.get("job1")
            assert (vm["host"], vm["state"]) == ("src", "running")
            # A replica starting while another drives a move leaves it alone.
            cb.vms.create(vm_body("big", host="src", mem=16384))  # a 256 MiB image: 64 chunks, 6 s or more
            m2 = cb.moves.create("big", to="dst")
            c = start_controller(tmp_path, db=db, name="ctl-c")
            extra.append(c)
            assert cb.moves.get(m2["id"])["state"] not in ("done", "failed")  # still under way as c starts
            m2 = wait_until(lambda: (x := cb.moves.get(m2["id"]))["state"] in ("done", "failed") and x, timeout=90)
            assert m2["state"] == "done", m2
    finally:
        for p in (a, b, *agents, *extra):
            p.stop()
        reap(tmp_path)
