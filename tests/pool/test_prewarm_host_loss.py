"""Prewarm when a host goes away (seed 001: a prewarm keeps VMs *ready now*, and is refilled).

A host that stopped answering may answer again in a moment: its standby VMs do not
count as ready (nor are they claimed) meanwhile, and its placement stays. A host
that will not come back (removed, its TTL ended, its machine ended by the cloud,
or no longer registered) is lost: the prewarm places its VMs again through its
own solve. In-process checks of each kind of host first, then real agents on a
`local` cloud (fake VM backend) and an own host."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import fuse
from fuse.controller.fleet import Fleet, HostView
from fuse.controller.service import Controller
from fuse.controller.store import elastic_hosts, prewarms, vms as vms_t
from support import start_agent, start_controller, wait_until

PW = "pw-1"
SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}


# ---- in process: which hosts' standby VMs are ready, and which placements move ----
@pytest.fixture
def ctl(tmp_path):
    """A controller (not started) with one host of each kind, a standby VM of prewarm
    ``pw-1`` ready on each registered one, and the prewarm placed on all of them:

    up      own host, answering            blip   own host, not answering (a moment)
    dev-1   bought, the cloud ended it     dev-2  bought, still booting (not registered)
    old     own host, deregistered since
    """
    c = Controller(tmp_path / "ctl")
    c.fleet = Fleet(c)  # (its pollers never start: the views say who answers)
    now = time.time()
    with c.store.tx() as conn:
        for host in ("up", "blip", "dev-1"):
            c.store.put_host(conn, dict(id=host, url="http://10.0.0.9:7070", token="", backend="fake", agent_id="",
                                        state="active", capacity={"ram_mb": 2048, "cpus": 2, "vm_count": 8},
                                        last_seen=now, created_at=now, updated_at=now))
            conn.execute(vms_t.insert().values(name=f"{PW}-{host}", host=host, vcpus=1, mem_mib=256, state="running",
                                               record={"standby": True, "ready": True, "bundle": "linux"},
                                               created_at=now))
        for name, state in (("dev-1", "gone"), ("dev-2", "booting")):
            conn.execute(elastic_hosts.insert().values(
                name=name, provider="dev", type_name="local.small", region="local", cloud_id=name, state=state,
                started=now, ended=now if state == "gone" else None, expires=0, usd_per_hour=0.1,
                billing_step_secs=1, billing_min_secs=60, boot_secs=1, pinned=0, token="t", record={},
                updated_at=now))
    c.fleet.views.update({"up": HostView(connected=True), "blip": HostView(connected=False),
                          "dev-1": HostView(connected=True)})  # (the cloud ended it before a poll failed)
    rec = {"id": PW, "image": "linux", "kind": "microvm", "cpus": 1, "memory_mb": 256, "count": 5, "on": "auto",
           "ttl_secs": 600, "expires_at": int(now + 600), "next": 6, "new_hosts": ["dev-1", "dev-2"],
           "placements": {"up": 1, "blip": 1, "dev-1": 1, "dev-2": 1, "old": 1}}
    with c.store.tx() as conn:
        conn.execute(prewarms.insert().values(id=PW, record=rec, created_at=now))
    yield c
    c.store.close()


def placements(c: Controller) -> dict[str, tuple[int, int]]:
    """host -> (count, ready) as the API shows the prewarm."""
    (pw,) = c.prewarm.list()
    return {p.host: (p.count, p.ready) for p in pw.placements}


@pytest.mark.parametrize("host, lost", [
    ("up", False), ("blip", False), ("dev-2", False), ("dev-1", True), ("old", True),
], ids=["a host that answers is not lost", "a host not answering for a moment is not lost",
        "a machine still booting is not lost", "a machine the cloud ended is lost",
        "a host no longer registered is lost"])
def test_which_hosts_a_prewarm_counts_as_lost(ctl, host, lost):
    assert ctl.prewarm._lost(host) is lost


def test_only_standby_vms_on_a_host_that_answers_count_as_ready_or_are_claimed(ctl):
    assert placements(ctl) == {"up": (1, 1), "blip": (1, 0), "dev-1": (1, 0), "dev-2": (1, 0), "old": (1, 0)}
    (pw,) = ctl.prewarm.list()
    assert pw.ready == 1
    assert [v["host"] for v in ctl.prewarm.candidates(1, 256, "linux", None)] == ["up"]


async def test_a_refill_places_the_vms_of_lost_hosts_again_through_the_prewarms_solve(ctl, monkeypatch):
    solved, created = [], []

    async def place(on, image, kind, cpus, mem, count, ttl, opts, buy=True, exclude=None, pw_id=None):
        solved.append((on, count))
        return {"up": count}, []

    async def create(body):
        created.append((body["name"], body["host"]))
        return body

    monkeypatch.setattr(ctl.prewarm, "_place", place)
    monkeypatch.setattr(ctl.vms, "create", create)
    await ctl.prewarm.fill()
    assert solved == [("auto", 2)]  # dev-1's and old's VM, in one solve
    # the host away for a moment keeps its placement; the booting machine keeps its own
    assert placements(ctl) == {"up": (3, 1), "blip": (1, 0), "dev-2": (1, 0)}
    assert created == [(f"{PW}-6", "up"), (f"{PW}-7", "up")]
    # what the store listed on the machine the cloud ended went with it
    assert [v["name"] for v in ctl.store.vms_on("dev-1")] == []
    assert [v["name"] for v in ctl.store.vms_on("blip")] == [f"{PW}-blip"]


async def test_releasing_a_host_moves_its_placements_and_forgets_what_went_with_its_machine(ctl):
    await ctl.prewarm.release_host("dev-1", gone=True)
    assert "dev-1" not in placements(ctl) and ctl.store.vms_on("dev-1") == []


# ---- real agents --------------------------------------------------------------------
def prewarm(client, pw_id: str) -> fuse.Prewarm:
    return next(p for p in client.pool.prewarms() if p.id == pw_id)


def ready_on(client, pw_id: str, n: int, not_on: str, timeout: float = 90) -> fuse.Prewarm:
    """Until prewarm ``pw_id`` has ``n`` ready VMs, none of them placed on ``not_on``."""
    def done():
        pw = prewarm(client, pw_id)
        return pw if pw.ready == n and not_on not in {p.host for p in pw.placements} else None
    return wait_until(done, timeout=timeout, interval=0.3, what=f"{n} ready VMs in {pw_id}, not on {not_on}")


def prewarm_on_edge(client, edge) -> fuse.Prewarm:
    """Own host ``edge`` registered, a ``local`` cloud linked, and a prewarm of one VM, placed
    on edge (nothing bought) and ready."""
    client.hosts.register(fuse.RegisterHostRequest(id="edge", url=edge.url, token=edge.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=4, ram_mb=2048, cpus=2)))
    wait_until(lambda: client.hosts.get("edge").connected, timeout=30, what="edge connected")
    client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
    pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, ttl_secs=600))
    assert pw.new_hosts == [] and [p.host for p in pw.placements] == ["edge"]
    wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="1 ready")
    return pw


def claims(client, pw_id: str, name: str) -> dict:
    """A create of the prewarm's shape, which claims one of its VMs."""
    vm = client.vms.create(name=name, shape={"vcpus": 1, "mem_mib": 512}, entry="sleep 600")
    (placed,) = [e for e in client.events.list(0, limit=500)["events"] if e["type"] == "placed" and e.get("vm") == name]
    assert (placed.get("prewarmed") or "").startswith(pw_id + "-"), placed
    return vm


@pytest.mark.timeout(240)
def test_a_prewarm_whose_machine_is_removed_places_its_vms_again_and_a_create_claims_one(tmp_path, procs):
    procs.append(ctl_ := start_controller(tmp_path))
    with fuse.Client(ctl_.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=2, cpus=1, memory_mb=512, ttl_secs=600))
        (first,) = pw.new_hosts
        wait_until(lambda: prewarm(client, pw.id).ready == 2, timeout=60, interval=0.3, what="2 ready")

        # its standby VMs do not hold the machine: removing it (as its TTL's end does) goes ahead
        assert client.pool.cloud_remove_host([first]).removed == [first]
        pw = ready_on(client, pw.id, 2, not_on=first)
        assert len(pw.new_hosts) == 2 and pw.new_hosts[0] == first  # one machine bought for both
        assert sum(p.count for p in pw.placements) == 2
        assert not [v for v in client.vms.list() if v["host"] == first]

        vm = claims(client, pw.id, "job")
        assert vm["host"] == pw.new_hosts[1]
        assert client.pool.remove_prewarm(pw.id)
        client.vms.delete("job")
        client.pool.cloud_remove_host([h.name for h in client.pool.cloud_hosts()])


@pytest.mark.timeout(240)
def test_a_prewarm_whose_machine_the_cloud_ends_stops_counting_it_and_places_its_vms_again(tmp_path, procs):
    procs.append(ctl_ := start_controller(tmp_path))
    with fuse.Client(ctl_.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        client.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True))
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, ttl_secs=600))
        (first,) = pw.new_hosts
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="1 ready")

        # the machine ends under the pool (its agent dies: the local cloud says terminated)
        (machine,) = (ctl_.state_dir / "clouds" / "dev").glob(f"**/{first}/machine.json")
        os.kill(json.loads(machine.read_text())["pid"], signal.SIGKILL)
        wait_until(lambda: [h.state for h in client.pool.cloud_hosts(include_gone=True) if h.name == first] == ["gone"],
                   timeout=60, interval=0.2, what=f"{first} gone")
        pw_now = prewarm(client, pw.id)
        assert all(p.ready == 0 for p in pw_now.placements if p.host == first), pw_now
        assert not [v for v in client.vms.list() if v["host"] == first]  # its standby VM went with it

        pw = ready_on(client, pw.id, 1, not_on=first)
        assert len(pw.new_hosts) == 2
        vm = claims(client, pw.id, "job")  # claimed: nothing more is bought for it
        assert vm["host"] == pw.new_hosts[1]
        assert {h.name for h in client.pool.cloud_hosts()} == {pw.new_hosts[1]}
        assert client.pool.remove_prewarm(pw.id)
        client.vms.delete("job")


@pytest.mark.timeout(240)
def test_a_host_away_for_a_moment_keeps_its_placement_and_counts_as_ready_again_when_back(tmp_path, procs):
    # nothing is bought for a blip: the VMs there simply do not count (nor are claimed) until it answers
    procs.append(edge := start_agent(tmp_path, backend="fake", name="edge"))
    procs.append(ctl_ := start_controller(tmp_path))
    with fuse.Client(ctl_.url) as client:
        pw = prewarm_on_edge(client, edge)

        port = int(edge.url.rsplit(":", 1)[1])
        edge.kill()  # (its VMs outlive it, as on a real host)
        wait_until(lambda: not client.hosts.get("edge").connected, timeout=30, interval=0.2, what="edge away")
        away = prewarm(client, pw.id)
        assert away.ready == 0 and [(p.host, p.count) for p in away.placements] == [("edge", 1)]
        time.sleep(3)  # (a few refill passes)
        assert client.pool.cloud_hosts() == [] and [(p.host, p.count) for p in prewarm(client, pw.id).placements] == [
            ("edge", 1)]

        procs.append(start_agent(tmp_path, backend="fake", name="edge", port=port))
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready again")
        assert client.pool.cloud_hosts() == []
        assert client.pool.remove_prewarm(pw.id)


@pytest.mark.timeout(240)
def test_a_host_away_past_the_grace_has_its_vms_placed_again_and_its_extras_go_when_it_is_back(tmp_path, procs):
    """Review 27/28: a prewarm whose host stopped answering stayed at 0 ready however long it
    was away. Past ``FUSE_PREWARM_AWAY_S`` its placement goes where the prewarm's solve puts
    it now (a machine bought here); the host back, its standby VM it holds no place for goes."""
    procs.append(edge := start_agent(tmp_path, backend="fake", name="edge"))
    procs.append(ctl_ := start_controller(tmp_path, env={"FUSE_PREWARM_AWAY_S": "4"}))
    with fuse.Client(ctl_.url) as client:
        pw = prewarm_on_edge(client, edge)
        (standby,) = [v["name"] for v in client.vms.list() if v["host"] == "edge"]

        port = int(edge.url.rsplit(":", 1)[1])
        edge.kill()  # (its VMs outlive it, as on a real host)
        away_at = time.monotonic()
        pw_now = ready_on(client, pw.id, 1, not_on="edge")
        assert time.monotonic() - away_at >= 4  # (not before the grace)
        (bought,) = pw_now.new_hosts
        assert [(p.host, p.count) for p in pw_now.placements] == [(bought, 1)]
        # the VM on the host away is still listed there: nothing can delete it yet
        assert standby in [v["name"] for v in client.vms.list() if v["host"] == "edge"]

        procs.append(start_agent(tmp_path, backend="fake", name="edge", port=port))
        wait_until(lambda: not [v for v in client.vms.list() if v["host"] == "edge"], timeout=60, interval=0.3,
                   what="the extra standby VM gone from edge")
        pw_now = prewarm(client, pw.id)
        assert pw_now.ready == 1 and [(p.host, p.count) for p in pw_now.placements] == [(bought, 1)]
        assert client.pool.remove_prewarm(pw.id)


async def test_standby_vms_a_cordoned_host_away_could_not_delete_go_once_it_answers(ctl, monkeypatch):
    """Review 28: placed again off a cordoned host that did not answer, its standby VM could
    not be deleted there and was never deleted after (no placement left to look at)."""
    from fuse.errors import HostUnreachable

    with ctl.store.tx() as conn:
        row = ctl.store.get_host("blip")
        ctl.store.put_host(conn, dict(row, state="cordoned"))
    deleted, answers = [], False

    async def place(on, image, kind, cpus, mem, count, ttl, opts, buy=True, exclude=None, pw_id=None):
        return {"up": count}, []

    async def create(body):
        return body

    async def delete(name, host):
        if not answers:
            raise HostUnreachable(f"host {host} did not answer")
        deleted.append((name, host))
        with ctl.store.tx() as conn:
            conn.execute(vms_t.delete().where(vms_t.c.name == name))

    monkeypatch.setattr(ctl.prewarm, "_place", place)
    monkeypatch.setattr(ctl.vms, "create", create)
    monkeypatch.setattr(ctl.vms, "delete", delete)
    await ctl.prewarm.fill()
    assert "blip" not in placements(ctl) and deleted == []
    assert [v["name"] for v in ctl.store.vms_on("blip")] == [f"{PW}-blip"]  # (it could not be deleted)
    answers = True
    ctl.fleet.views["blip"] = HostView(connected=True)
    await ctl.prewarm.fill()
    assert deleted == [(f"{PW}-blip", "blip")]
    assert "away_left" not in ctl.prewarm._get(PW) or not ctl.prewarm._get(PW)["away_left"]
