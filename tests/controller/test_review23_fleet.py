"""Twenty-third session: the fleet's record of VMs an agent no longer has."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from support import being_created, wait_until


def shape(mem=256, vcpus=1, **kw):
    return {"shape": {"vcpus": vcpus, "mem_mib": mem}, "entry": "echo hi", **kw}


def test_vms_dropped_for_a_new_agent_identity_leave_a_vm_lost_event(fleet):
    """(was: the VMs another agent at the host's address did not have left the list with no
    event: the stream never said where they went)"""
    a = fleet.agent("a1")
    port = int(a.url.rsplit(":", 1)[1])
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="keep-me", entry="sleep 600"))
    cursor = fleet.client.events.list(0)["next_cursor"]
    a.stop()
    fresh = fleet.agent("a1-wiped", port=port)  # another state dir at the same address
    ident = httpx.get(fresh.url + "/v1/host", headers={"Authorization": f"Bearer {fresh.token}"}).json()["agent_id"]
    wait_until(lambda: fleet.client.vms.list() == [], timeout=40, what="the VM dropped")
    lost = [e for e in fleet.client.events.list(cursor)["events"] if e["type"] == "vm_lost"]
    assert [(e["vm"], e["host"], e["was"]) for e in lost] == [("keep-me", "h1", "running")], lost
    assert "another agent answers at host h1" in lost[0]["reason"]
    assert fleet.client.hosts.get("h1").agent_id == ident


def test_a_vm_deleted_on_its_agent_is_not_called_lost(fleet):
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="gone", entry="sleep 600"))
    cursor = fleet.client.events.list(0)["next_cursor"]
    httpx.delete(a.url + "/v1/host/vms/gone", headers={"Authorization": f"Bearer {a.token}"},
                 timeout=30).raise_for_status()
    wait_until(lambda: fleet.client.vms.list() == [], timeout=40, what="the VM dropped")
    assert not [e for e in fleet.client.events.list(cursor)["events"] if e["type"] == "vm_lost"]


def test_a_host_whose_agent_is_gone_is_removed_with_force_and_its_vms_forgotten(fleet):
    """(was: no way out: a host whose agent was gone for good could not be deregistered while
    its VMs were recorded, and their delete needed the agent)"""
    import os
    import subprocess

    import fuse
    from support import FUSE

    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.add("h2", fleet.agent("a2"))
    fleet.client.vms.create(shape(name="orphan", host="h1", entry="sleep 600"))
    fleet.client.vms.create(shape(name="other", host="h2", entry="sleep 600"))
    # while the agent answers, force is refused and nothing changes
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.hosts.deregister("h1", force=True)
    assert (info.value.status, info.value.code) == (409, "conflict")
    assert "its agent answers" in info.value.message and "delete or drain its VMs" in info.value.message
    assert {v["name"] for v in fleet.client.vms.list()} == {"orphan", "other"}
    cursor = fleet.client.events.list(0)["next_cursor"]
    a.stop()
    wait_until(lambda: not fleet.client.hosts.get("h1").connected, what="h1 disconnected")
    with pytest.raises(fuse.ApiError) as info:  # without force, as the seed says
        fleet.client.hosts.deregister("h1")
    assert (info.value.status, info.value.code, info.value.message) == (
        409, "conflict", "host h1 still has vm orphan assigned")
    r = subprocess.run(FUSE + ["controller", "hosts", "remove", "h1", "--force", "--json"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "FUSE_URL": fleet.ctl.url})
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == {"id": "h1", "action": "remove", "ok": True}
    assert [h.id for h in fleet.client.hosts.list()] == ["h2"]
    assert [v["name"] for v in fleet.client.vms.list()] == ["other"]
    events = fleet.client.events.list(cursor)["events"]
    lost = [e for e in events if e["type"] == "vm_lost"]
    assert [(e["vm"], e["host"], e["was"]) for e in lost] == [("orphan", "h1", "running")]
    assert "removed with force" in lost[0]["reason"]
    removed = [e for e in events if e["type"] == "host_removed"]
    assert len(removed) == 1 and removed[0]["forgotten_vms"] == ["orphan"]
    # the name is free again: a VM of that name can be created elsewhere
    assert fleet.client.vms.create(shape(name="orphan", host="h2"))["host"] == "h2"


def test_force_on_a_host_that_refuses_the_token_is_refused(fleet):
    import fuse

    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="v", entry="sleep 600"))
    port = int(a.url.rsplit(":", 1)[1])
    a.stop()
    fleet.agent("a1", port=port, token="another-token")  # the same agent, its token rotated
    wait_until(lambda: not fleet.client.hosts.get("h1").connected, what="h1 disconnected")
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.hosts.deregister("h1", force=True)
    assert info.value.code == "conflict" and "refuses the controller's token" in info.value.message
    assert [v["name"] for v in fleet.client.vms.list()] == ["v"]



def move_held_after_copy(fleet, gone: str) -> tuple[dict, dict, str]:
    """Hosts a and b (agents a1, a2), vm v1 moving from a to b held after its copy, and the
    agent at the ``gone`` end ("source" or "target") stopped and seen disconnected:
    (the agents by host, the move, that host)."""
    agents = {"a": fleet.agent("a1"), "b": fleet.agent("a2")}
    fleet.add("a", agents["a"])
    fleet.add("b", agents["b"])
    fleet.restart(env={"FUSE_TEST_PAUSE_AT": "copied:120"})  # the move holds after its copy
    fleet.client.vms.create(shape(name="v1", host="a", entry="sleep 600"))
    move = fleet.client.moves.create("v1", to="b")
    wait_until(lambda: (m := fleet.client.moves.get(move["id"]))["state"] == "copying"
               and 0 < m["copied_bytes"] == m["total_bytes"], what="the copy through (the move waits at the pause)")
    dead = "b" if gone == "target" else "a"
    agents[dead].stop()
    wait_until(lambda: not fleet.client.hosts.get(dead).connected, what=f"{dead} disconnected")
    return agents, move, dead


@pytest.mark.parametrize("gone", ["target", "source"])
def test_force_settles_a_move_whose_host_is_gone_for_good(fleet, gone):
    """(was: the move waited on the dead host for good, the VM held by it, and the force
    deregister refused with 409 move_in_progress: no way out)"""
    import fuse

    agents, move, dead = move_held_after_copy(fleet, gone)
    with pytest.raises(fuse.ApiError) as info:  # without force: the move needs it
        fleet.client.hosts.deregister(dead)
    assert info.value.code in ("conflict", "move_in_progress")
    fleet.client.hosts.deregister(dead, force=True)
    assert [h.id for h in fleet.client.hosts.list()] == (["a"] if gone == "target" else ["b"])
    m = fleet.client.moves.get(move["id"])
    assert m["state"] == "failed", m
    if gone == "target":  # home: the source woke it
        assert [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()] == [("v1", "a", "running")]
    else:  # its only copy went with the source: lost, and said so
        assert fleet.client.vms.list() == []
        lost = [e for e in fleet.client.events.list(0, limit=500)["events"] if e["type"] == "vm_lost"]
        assert [(e["vm"], e["host"]) for e in lost] == [("v1", "a")]
        wait_until(lambda: _incoming(agents["b"]) == [], what="the target's copy aborted")


def _incoming(agent) -> list:
    r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return [v["name"] for v in r.json()["vms"]]


def test_an_unanswered_creates_name_stays_held_across_a_controller_restart(fleet):
    """(was: held in the controller's memory only: after a restart the name was placed again
    on another host, and the VM ran on both once the first host came back)"""
    import os
    import signal

    import fuse

    a1 = fleet.agent("a1")
    fleet.add("h1", a1)
    fleet.add("h2", fleet.agent("a2"))
    os.kill(a1.popen.pid, signal.SIGSTOP)
    try:
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.vms.create(shape(name="k", host="h1", entry="sleep 600"))
        assert (info.value.status, info.value.code) == (502, "host_unreachable")
        fleet.restart()
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.vms.create(shape(name="k", entry="sleep 600"))
        assert info.value.code == "vm_exists" and "being created on host h1" in info.value.message
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.vms.get("k")
        assert (info.value.status, info.value.code, info.value.details.get("host")) == (409, "conflict", "h1")
        assert info.value.details.get("being_created") is True
    finally:
        os.kill(a1.popen.pid, signal.SIGCONT)
    # the host, back, says whether the create it was sent ran (it reads it once it resumes, unless
    # the sender's hang-up came first): the name is then free, or k's on h1 — never on two hosts
    wait_until(lambda: not being_created(fleet.client, "k"), timeout=60, what="the host's word on vm k")
    if [v["host"] for v in fleet.client.vms.list()] == ["h1"]:  # (the create landed late, on h1)
        with pytest.raises(fuse.ApiError) as info:
            fleet.client.vms.create(shape(name="k"))
        assert info.value.code == "vm_exists"
    else:
        assert fleet.client.vms.create(shape(name="k"))["name"] == "k"
    assert [v["name"] for v in fleet.client.vms.list()] == ["k"]



def test_an_entry_past_the_limit_is_refused_by_the_controller_before_any_host(fleet):
    """(was: placed, and a 50 MB entry sent on to the host, whose admission refused it)"""
    import fuse

    fleet.add("h1", fleet.agent("a1"))
    cursor = fleet.client.events.list(0)["next_cursor"]
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.vms.create(shape(name="big", entry="x" * 1301))
    assert (info.value.status, info.value.code, info.value.message) == (
        400, "invalid_argument", "entry is longer than 1300 bytes")
    assert [e["type"] for e in fleet.client.events.list(cursor)["events"]] == []
    assert fleet.client.vms.create(shape(name="ok", entry="x" * 1300))["name"] == "ok"


def test_a_move_to_an_agent_just_back_is_not_refused_on_a_stale_view(fleet):
    """(was: 409 host_unreachable "target host b is not connected" though its agent answered,
    until its poller, backing off, tried it again)"""
    fleet.add("a", fleet.agent("a1"))
    b = fleet.agent("a2")
    port = int(b.url.rsplit(":", 1)[1])
    fleet.add("b", b)
    fleet.client.vms.create(shape(name="v", host="a", entry="sleep 600"))
    b.stop()
    wait_until(lambda: not fleet.client.hosts.get("b").connected, what="b disconnected")
    time.sleep(8)  # (the poller backs off: 1, 2, 4 s...)
    fleet.agent("a2", port=port)
    m = fleet.client.moves.create("v", to="b")
    done = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                      timeout=60, what="the move")
    assert done["state"] == "done", done


def test_a_vm_moved_back_through_a_second_name_keeps_its_past_events_tags(fleet):
    """(was: its events from its first stay on the machine, under the first name, handed out
    already, were retagged with the second name, and that stay's usage moved with them)"""
    import fuse

    a = fleet.agent("a1")
    fleet.add("ha", a)
    fleet.add("hb", fleet.agent("a2"))
    fleet.client.vms.create(shape(name="v", host="ha", entry="sleep 600"))

    def tags():
        return {e["id"]: e["host"] for e in fleet.client.events.list(0, limit=500)["events"]
                if e.get("vm") == "v" and "host_event_id" in e}
    wait_until(lambda: tags(), what="v's events")
    before = tags()
    assert set(before.values()) == {"ha"}
    fleet.client.hosts.register(fuse.RegisterHostRequest(
        id="ha2", url=f"unix://{a.socket}", token=a.token, backend="qemu",
        capacity=fuse.HostCapacity(vm_count=10, ram_mb=4096, cpus=4)))
    for to in ("hb", "ha2"):
        m = fleet.client.moves.create("v", to=to)
        done = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                          timeout=60, what=f"the move to {to}")
        assert done["state"] == "done", done
    assert fleet.client.vms.get("v")["host"] == "ha2"
    time.sleep(2.5)  # (the pollers read the machine's log again)
    after = tags()
    assert {i: after[i] for i in before} == before
    assert "ha2" in after.values()  # its events since it came back are the new name's


def test_a_request_body_past_16_mib_is_413_and_not_read(fleet):
    """(was: a 200 MiB body was read whole into the controller's memory)"""
    big = b"x" * (16 * 1024 * 1024 + 1)
    transport = httpx.HTTPTransport(uds=str(fleet.ctl.socket))
    with httpx.Client(transport=transport, base_url="http://c", timeout=60) as c:
        r = c.post("/v1/vms", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "invalid_argument"
        assert "at most 16777216" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it comes
            for _ in range(17):
                yield b" " * (1024 * 1024)
        r = c.post("/v1/vms", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert c.get("/v1/healthz").status_code == 200  # and it serves on


def test_an_entry_with_a_nul_is_refused_before_any_host(fleet):
    """(was: each fake-backend host answered 500 and kept a record stuck creating, which
    blocked its deregister; the create tried every host and said fleet_full)"""
    import fuse

    a = fleet.agent("a1")
    fleet.add("h1", a)
    with pytest.raises(fuse.ApiError) as info:
        fleet.client.vms.create(shape(name="n", entry="echo a\x00b"))
    assert (info.value.status, info.value.code) == (400, "invalid_argument")
    assert info.value.message == "entry: holds a NUL character, which no command line can"
    r = httpx.post(a.url + "/v1/host/vms", json=shape(name="n", entry="echo a\x00b"),
                   headers={"Authorization": f"Bearer {a.token}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    assert httpx.get(a.url + "/v1/host/vms", headers={"Authorization": f"Bearer {a.token}"}).json()["vms"] == []
    fleet.client.hosts.deregister("h1")


def test_registration_reads_the_hardware_as_it_is_now_not_at_the_agents_start(fleet):
    """(was: the agent reported the facts it probed at its start: a registration after the
    agent was pinned to one CPU still stored two, a Firecracker upgraded meanwhile the old
    release)"""
    import os
    from pathlib import Path

    import fuse

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to pin the agent to one of them")
    a = fleet.agent("a1")
    pid = a.popen.pid
    for tid in os.listdir(f"/proc/{pid}/task"):  # every thread of the agent: to one CPU
        os.sched_setaffinity(int(tid), {min(os.sched_getaffinity(0))})
    host = fleet.client.hosts.register(fuse.RegisterHostRequest(
        id="h1", url=a.url, token=a.token, backend="qemu", capacity=fuse.HostCapacity(vm_count=4)))
    assert host.capacity.cpus == 1, host.capacity
    assert Path(f"/proc/{pid}").exists()


def test_a_declared_gpu_kind_may_name_any_of_a_mixed_machines_gpus():
    """(was: a machine with an H100 and an A100 was labelled by its first, and declaring
    its A100 was a "differs from probed" warning)"""
    from fuse.controller.hosts import _same_gpu

    devices = [{"model": "NVIDIA H100 80GB HBM3"}, {"model": "NVIDIA A100-SXM4-80GB"}]
    for declared in ("A100", "nvidia:A100", "a100", "NVIDIA A100-SXM4-80GB", "H100"):
        assert _same_gpu(declared, "nvidia:H100", devices), declared
    assert not _same_gpu("L4", "nvidia:H100", devices)


def test_force_right_after_the_agent_died_is_not_refused_on_the_last_poll(fleet):
    """(was: 409 "its agent answered within the last seconds" for a few seconds after it
    died, though the fresh read had just been refused)"""
    a = fleet.agent("a1")
    fleet.add("h1", a)
    fleet.client.vms.create(shape(name="v", entry="sleep 600"))
    a.stop()
    fleet.client.hosts.deregister("h1", force=True)
    assert fleet.client.hosts.list() == [] and fleet.client.vms.list() == []
