"""A prewarm whose machines the cloud keeps ending (spot reclaim, a provider that ends them
at once) or refusing backs its purchases off: the first early end is rebought at once, each
next one in a row waits 30 s, doubling, at most 30 min; the prewarm says so
(``backoff_until``/``backoff_reason``, a ``prewarm_backoff`` event); hosts with room still
take its VMs meanwhile; a machine that lives ``LIVED_SECS`` starts the count again. A
machine removed on purpose is nobody's fault. In process first (the machines' rows written
by hand, the solve stubbed), then a real controller whose `local` cloud's machines die."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import fuse
from fuse.controller.fleet import Fleet
from fuse.controller.pool import prewarm as prewarm_mod
from fuse.controller.service import Controller
from fuse.controller.store import elastic_hosts, prewarms
from fuse.errors import FleetFull, FuseError
from support import start_agent, start_controller, wait_until

PW = "pw-1"
SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}


def test_the_backoff_doubles_from_the_second_early_end_and_is_capped():
    assert [prewarm_mod.backoff_secs(n) for n in range(1, 11)] == [0, 30, 60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert prewarm_mod.backoff_secs(10_000) == prewarm_mod.BACKOFF_MAX_SECS


# ---- in process ------------------------------------------------------------------------
class Cloud:
    """The stubbed solve of prewarm ``pw-1``: each purchase writes a machine's row (booting);
    ``refuse`` makes the cloud refuse them; without ``buy`` nothing has room."""

    def __init__(self, ctl: Controller):
        self.ctl, self.calls, self.refuse, self.n = ctl, [], False, 0

    async def place(self, on, image, kind, cpus, mem, count, ttl, opts, buy=True, exclude=None, pw_id=None):
        self.calls.append(buy)
        if not buy:
            raise FleetFull("prewarm refused, nothing bought: no host has room")
        if self.refuse:
            raise FuseError("dev did not create local.small", code="cloud_error")
        self.n += 1
        name = f"dev-{self.n}"
        machine(self.ctl, name, "booting", started=time.time())
        return {name: count}, [name]

    async def ends(self, name: str, after: float, by_cloud: bool = True) -> None:
        """The cloud ends ``name`` ``after`` seconds after it was bought (``by_cloud`` False:
        removed on purpose), as the pool's loop tells the prewarms."""
        row = self.ctl.pool.row(name)
        rec = dict(row["record"]) | ({"ended_by_cloud": True} if by_cloud else {})
        with self.ctl.store.tx() as c:
            c.execute(elastic_hosts.update().where(elastic_hosts.c.name == name).values(
                state="gone", ended=row["started"] + after, record=rec))
        await self.ctl.prewarm.release_host(name, gone=by_cloud)


def machine(ctl: Controller, name: str, state: str, started: float) -> None:
    with ctl.store.tx() as conn:
        conn.execute(elastic_hosts.insert().values(
            name=name, provider="dev", type_name="local.small", region="local", cloud_id=name, state=state,
            started=started, ended=None, expires=0, usd_per_hour=0.36, billing_step_secs=1, billing_min_secs=60,
            boot_secs=1, pinned=0, token="t", record={}, updated_at=started))


@pytest.fixture
def ctl(tmp_path):
    """A controller (not started) with prewarm ``pw-1`` of one VM, placed on ``dev-0``, a
    machine bought for it that is booting."""
    c = Controller(tmp_path / "ctl")
    c.fleet = Fleet(c)  # (its pollers never start: no machine answers, so no VM is created)
    now = time.time()
    machine(c, "dev-0", "booting", started=now)
    rec = {"id": PW, "image": "linux", "kind": "microvm", "cpus": 1, "memory_mb": 512, "count": 1, "on": "auto",
           "ttl_secs": 3600, "expires_at": int(now + 3600), "next": 2, "new_hosts": ["dev-0"],
           "placements": {"dev-0": 1}}
    with c.store.tx() as conn:
        conn.execute(prewarms.insert().values(id=PW, record=rec, created_at=now))
    yield c
    c.store.close()


@pytest.fixture
def cloud(ctl, monkeypatch) -> Cloud:
    cloud = Cloud(ctl)
    monkeypatch.setattr(ctl.prewarm, "_place", cloud.place)
    return cloud


def status(ctl: Controller) -> fuse.Prewarm:
    (pw,) = ctl.prewarm.list()
    return pw


def backoff(ctl: Controller) -> float:
    """Seconds the prewarm's purchases back off from now (0: none)."""
    pw = status(ctl)
    return pw.backoff_until - time.time() if pw.backoff_until else 0


def wait_over(ctl: Controller) -> None:
    """As if its backoff had run out (rather than sleeping through it)."""
    rec = ctl.prewarm._get(PW)
    ctl.prewarm._save(rec | {"buy_after": time.time() - 1})


async def test_machines_the_cloud_keeps_ending_are_rebought_ever_later_up_to_a_cap(ctl, cloud):
    await cloud.ends("dev-0", after=5)  # the first early end: rebought at once, in the loop's first pass
    waits = []
    for i in range(9):
        if i:
            wait_over(ctl)
        await ctl.prewarm.fill()
        assert cloud.calls[-1] is True and status(ctl).placements[0].host == f"dev-{i + 1}"  # rebought
        await cloud.ends(f"dev-{i + 1}", after=5)
        waits.append(round(backoff(ctl) / 10) * 10)  # (to the 10 s)
        # the refill buys nothing meanwhile, pass after pass, and says why
        for _ in range(3):
            await ctl.prewarm.fill()
        assert cloud.calls[-3:] == [False] * 3 and cloud.n == i + 1 and status(ctl).placements == []
        pw = status(ctl)
        assert f"{i + 2} machines bought for it in a row ended early" in pw.backoff_reason, pw
        assert f"dev-{i + 1}, local.small in cloud dev, ended by the cloud 5 s after it was bought" in pw.backoff_reason
    assert waits == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]
    events = [e["data"] for e in ctl.store.events_after(0) if e["type"] == "prewarm_backoff"]
    assert [e["early_ends"] for e in events] == list(range(2, 11))


async def test_the_first_early_end_is_rebought_at_once_and_the_second_backs_off(ctl, cloud):
    await cloud.ends("dev-0", after=3)
    assert backoff(ctl) == 0
    await ctl.prewarm.fill()
    assert cloud.calls == [True] and cloud.n == 1
    await cloud.ends("dev-1", after=3)
    assert 28 < backoff(ctl) <= 30
    await ctl.prewarm.fill()
    assert cloud.calls == [True, False] and cloud.n == 1


async def test_a_machine_that_lives_starts_the_count_again(ctl, cloud):
    await cloud.ends("dev-0", after=3)
    await ctl.prewarm.fill()
    await cloud.ends("dev-1", after=3)
    assert backoff(ctl) > 0
    wait_over(ctl)
    await ctl.prewarm.fill()  # dev-2 bought: it lives LIVED_SECS (its row started that long ago)
    with ctl.store.tx() as c:
        c.execute(elastic_hosts.update().where(elastic_hosts.c.name == "dev-2").values(
            state="joined", started=time.time() - prewarm_mod.LIVED_SECS - 1))
    rec = ctl.prewarm._get(PW)
    ctl.prewarm._save(rec | {"last_early_end": time.time() - prewarm_mod.LIVED_SECS - 2})
    await ctl.prewarm.fill()
    assert "early_ends" not in ctl.prewarm._get(PW) and backoff(ctl) == 0
    # so the next early end is a first one again: rebought at once
    await cloud.ends("dev-2", after=3)
    assert backoff(ctl) == 0


async def test_a_machine_the_cloud_ends_after_it_lived_is_no_early_end(ctl, cloud):
    await cloud.ends("dev-0", after=3)
    await ctl.prewarm.fill()
    await cloud.ends("dev-1", after=prewarm_mod.LIVED_SECS + 60)  # a spot reclaim after a long life
    assert backoff(ctl) == 0 and "early_ends" not in ctl.prewarm._get(PW)
    await ctl.prewarm.fill()
    assert cloud.calls == [True, True]


async def test_machines_removed_on_purpose_are_rebought_at_once(ctl, cloud):
    await cloud.ends("dev-0", after=3, by_cloud=False)
    await ctl.prewarm.fill()
    await cloud.ends("dev-1", after=3, by_cloud=False)
    await ctl.prewarm.fill()
    assert cloud.calls == [True, True] and backoff(ctl) == 0


async def test_a_cloud_that_refuses_the_machines_is_backed_off_too(ctl, cloud):
    await cloud.ends("dev-0", after=3, by_cloud=False)
    cloud.refuse = True
    await ctl.prewarm.fill()  # refused: a first early end, asked again at the next pass
    assert backoff(ctl) == 0
    await ctl.prewarm.fill()  # refused again: backing off
    assert 28 < backoff(ctl) <= 30 and "the cloud refused it: dev did not create" in status(ctl).backoff_reason
    for _ in range(3):
        await ctl.prewarm.fill()
    assert cloud.calls == [True, True, False, False, False]


# ---- a real controller: its `local` cloud's machines die as soon as they start ----------------
def prewarm(client, pw_id: str) -> fuse.Prewarm:
    return next(p for p in client.pool.prewarms() if p.id == pw_id)


def kill_machine(ctl_, name: str) -> None:
    """End machine ``name`` under the pool: its agent dies (the local cloud says terminated)."""
    (rec,) = (ctl_.state_dir / "clouds" / "dev").glob(f"**/{name}/machine.json")
    os.kill(json.loads(rec.read_text())["pid"], signal.SIGKILL)


def bought(client) -> list[str]:
    return [h.name for h in client.pool.cloud_hosts(include_gone=True)]


@pytest.mark.timeout(240)
def test_a_cloud_that_keeps_ending_the_machines_has_the_refill_back_off_and_say_why(tmp_path, procs):
    procs.append(ctl_ := start_controller(tmp_path))
    with fuse.Client(ctl_.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=512, ttl_secs=600))
        (first,) = pw.new_hosts

        kill_machine(ctl_, first)  # ended at once: rebought at once
        second = wait_until(lambda: (b := bought(client))[1:] and b[1], timeout=60, interval=0.2,
                            what="a second machine")
        assert prewarm(client, pw.id).backoff_until == 0
        kill_machine(ctl_, second)  # ended at once again: no machine is bought for it for 30 s
        wait_until(lambda: prewarm(client, pw.id).backoff_until, timeout=60, interval=0.2, what="a backoff")
        pw_now = prewarm(client, pw.id)
        assert 20 < pw_now.backoff_until - time.time() <= 30, pw_now
        assert "2 machines bought for it in a row ended early" in pw_now.backoff_reason
        assert f"{second}, local.small in cloud dev, ended by the cloud" in pw_now.backoff_reason
        (event,) = [e for e in client.events.list(0, limit=500)["events"] if e["type"] == "prewarm_backoff"]
        assert event["prewarm"] == pw.id and event["early_ends"] == 2 and event["until"] == pw_now.backoff_until
        time.sleep(4)  # (four passes of the pool's loop, each a refill)
        assert bought(client) == [first, second] and prewarm(client, pw.id).ready == 0

        # hosts with room still take its VMs meanwhile: nothing is bought for that
        procs.append(edge := start_agent(tmp_path, backend="fake", name="edge"))
        client.hosts.register(fuse.RegisterHostRequest(id="edge", url=edge.url, token=edge.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=4, ram_mb=2048, cpus=2)))
        wait_until(lambda: prewarm(client, pw.id).ready == 1, timeout=60, interval=0.3, what="ready on edge")
        assert [p.host for p in prewarm(client, pw.id).placements] == ["edge"]
        assert bought(client) == [first, second]
        assert client.pool.remove_prewarm(pw.id)
