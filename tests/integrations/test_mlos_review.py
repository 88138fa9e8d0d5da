"""`FuseVMService` on a fleet of two hosts (real controller, real agents on the
fake backend): sleeping VMs are woken or kept, never recreated; moves are
waited out; a VM follows vmHost; a hung controller is TIMED_OUT by
pollTimeout; a deprovision's wait says where the VM was; bad times are
refused when the service is built."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

import fuse  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402

from fuse.integrations.mlos import OP_KEY, OP_KIND_KEY, FuseVMService  # noqa: E402
from support import reap, start_agent, start_controller, wait_until  # noqa: E402
from test_mlos import GatedProxy, placed, provision  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def make_fleet(tmp_path):
    """A controller (its environment `env`) and agents a1, a2 registered as
    h1, h2, each declaring `ram_mb` of memory."""
    made = []

    def make(ram_mb: int = 4096, env: dict | None = None):
        ctl = start_controller(tmp_path, env=env)
        agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
        client = fuse.Client(ctl.url)
        fleet = type("Fleet", (), {"ctl": ctl, "agents": agents, "client": client})
        made.append(fleet)
        for i, agent in enumerate(agents, 1):
            client.hosts.register(fuse.RegisterHostRequest(
                id=f"h{i}", url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=8, ram_mb=ram_mb, cpus=4)))
        return fleet

    yield make
    for fleet in made:
        fleet.client.close()
        for agent in fleet.agents:
            agent.stop()
        fleet.ctl.stop()
    reap(tmp_path)


def service(fleet, url: str | None = None, **config) -> FuseVMService:
    return FuseVMService({"url": url or fleet.ctl.url, "pollInterval": 0.05, "pollTimeout": 30, **config})


def where(client) -> list[tuple[str, str, str]]:
    return sorted((v["name"], v["host"], v["state"]) for v in client.vms.list())


def test_a_sleeping_vm_that_can_wake_nowhere_is_failed_and_kept_asleep(make_fleet, caplog):
    fleet = make_fleet(ram_mb=512)
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 256, "vmHost": "h2"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        # While it sleeps both hosts fill up: 212 MiB left on each, it needs 256.
        for host in ("h1", "h2"):
            fleet.client.vms.create({"name": f"fill-{host}", "shape": {"vcpus": 1, "mem_mib": 300}, "entry": "x",
                                     "host": host})
        unpinned = {k: v for k, v in p.items() if k != "vmHost"}
        assert provision(svc, unpinned) == (Status.FAILED, {})
        # Not deleted to be recreated (its saved state would be lost, and the
        # create would be fleet_full anyway): still asleep where it was.
        assert ("keep", "h2", "sleeping") in where(fleet.client)
        assert "it is kept asleep there" in caplog.text
        # Once room frees, the next provision wakes it: the same VM, not a new one.
        fleet.client.vms.delete("fill-h2")
        assert provision(svc, unpinned)[0] == Status.SUCCEEDED
        assert ("keep", "h2", "running") in where(fleet.client)
        assert placed(fleet.client).count(("keep", 1, 256)) == 1


@pytest.mark.parametrize("env, when", [
    ({"FUSE_TEST_CHUNK_DELAY": "1.0"}, "copying"),  # each copied chunk pauses a second
    # (review 21: before the move slept it, the VM still showed running on its source and the
    # provision answered SUCCEEDED at once; the trial then ran while it slept and moved)
    ({"FUSE_TEST_PAUSE_AT": "starting:3"}, "starting"),
], ids=["while the move copies", "as the move starts, the vm still running"])
def test_a_provision_while_the_controller_moves_the_vm_waits_for_the_move(make_fleet, env, when):
    fleet = make_fleet(env=env)
    svc = service(fleet)
    with svc:
        p = {"vmName": "mv", "vcpus": 1, "memMiB": 128}
        assert provision(svc, {**p, "vmHost": "h1"})[0] == Status.SUCCEEDED
        move = fleet.client.moves.create("mv", to="h2")
        wait_until(lambda: fleet.client.moves.get(move["id"])["state"] == when, timeout=30,
                   what=f"the move at {when}")
        if when == "starting":
            assert fleet.client.vms.get("mv")["state"] == "running"
        status, info = provision(svc, p)
        assert status == Status.SUCCEEDED, info
        assert info["vmHost"] == "h2"  # where the move took it, woken by the move
        assert fleet.client.moves.get(move["id"])["state"] == "done"
        assert where(fleet.client) == [("mv", "h2", "running")]  # one VM, not one per host
        assert placed(fleet.client) == [("mv", 1, 128)]  # never deleted and recreated
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})
    assert where(fleet.client) == []


def test_a_new_vm_host_replaces_the_vm_there_and_teardown_leaves_nothing(make_fleet):
    fleet = make_fleet()
    svc = service(fleet)
    with svc:
        p = {"vmName": "pin", "vcpus": 1, "memMiB": 128}
        assert provision(svc, {**p, "vmHost": "h1"})[0] == Status.SUCCEEDED
        # The previous trial's VM is found on h1 and replaced on h2, not left running.
        status, info = provision(svc, {**p, "vmHost": "h2"})
        assert status == Status.SUCCEEDED and info["vmHost"] == "h2"
        assert where(fleet.client) == [("pin", "h2", "running")]
        assert svc.provision_host({**p, "vmHost": "h2"}) == (Status.SUCCEEDED, {})
        # A sleeping one keeps its state: moved to the new host and woken there.
        assert svc.deallocate_host({**p, "vmHost": "h2"}) == (Status.SUCCEEDED, {})
        status, info = provision(svc, {**p, "vmHost": "h1"})
        assert status == Status.SUCCEEDED and info["vmHost"] == "h1"
        assert where(fleet.client) == [("pin", "h1", "running")]
        assert placed(fleet.client) == [("pin", 1, 128), ("pin", 1, 128)]  # the move created nothing
        assert [m["state"] for m in fleet.client.moves.list()] == ["done"]
        # A teardown naming the old host still finds and deletes it.
        assert svc.deprovision_host({**p, "vmHost": "h2"}) == (Status.SUCCEEDED, {})
    assert where(fleet.client) == []


def test_a_hung_controller_is_timed_out_at_poll_timeout_not_request_timeout(make_fleet, caplog):
    fleet = make_fleet()
    p = {"vmName": "hang", "vcpus": 1, "memMiB": 128}
    svc = service(fleet, pollTimeout=2, requestTimeout=20)
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
        os.kill(fleet.ctl.popen.pid, signal.SIGSTOP)
        try:
            # A wait without a handle watches the VM: its reads end at pollTimeout.
            started = time.monotonic()
            assert svc.wait_host_deployment(p, is_setup=False) == (Status.TIMED_OUT, {})
            assert 1.8 <= time.monotonic() - started < 6
            # provision's own look is bounded too: PENDING by then, and its wait TIMED_OUT.
            started = time.monotonic()
            status, handle = svc.provision_host({**p, "memMiB": 256})
            assert status == Status.PENDING and OP_KEY in handle
            assert svc.wait_host_deployment(handle, is_setup=True) == (Status.TIMED_OUT, {})
            assert 1.8 <= time.monotonic() - started < 6
        finally:
            os.kill(fleet.ctl.popen.pid, signal.SIGCONT)
    assert "did not answer GET" in caplog.text
    assert where(fleet.client) == [("hang", "h1", "running")]  # nothing was sent to change it


def test_a_deprovision_wait_says_which_host_the_vm_was_deleted_from(make_fleet):
    fleet = make_fleet()
    gate = GatedProxy(fleet.ctl.socket)
    try:
        svc = service(fleet, url=gate.url, pollTimeout=1.0)
        p = {"vmName": "slow", "vcpus": 1, "memMiB": 128}
        with svc:
            assert provision(svc, {**p, "vmHost": "h2"})[0] == Status.SUCCEEDED
            arrived = gate.hold("DELETE", "/v1/vms/slow")
            status, handle = svc.deprovision_host(p)
            assert arrived.is_set() and status == Status.PENDING and handle[OP_KIND_KEY] == "deprovision"
            gate.release()
            # A service that never held the operation (mlos_bench restarted) and this one both know.
            with service(fleet) as other:
                status, info = other.wait_host_deployment(handle, is_setup=False)
                assert status == Status.SUCCEEDED
                assert (info["vmHost"], info["vmState"]) == ("h2", "deleted")
            status, info = svc.wait_host_deployment(handle, is_setup=False)
            assert status == Status.SUCCEEDED
            assert (info["operation"], info["vmHost"], info["vmState"]) == ("deprovision", "h2", "deleted")
        assert where(fleet.client) == []
    finally:
        gate.close()


@pytest.mark.parametrize("config, message", [
    ({"pollTimeout": 0}, "pollTimeout must be a finite number of seconds above 0, not 0"),
    ({"pollTimeout": -5}, "pollTimeout must be a finite number of seconds above 0, not -5"),
    ({"pollTimeout": "0"}, "pollTimeout must be a finite number of seconds above 0, not '0'"),
    ({"pollTimeout": "nan"}, "pollTimeout must be a finite number of seconds above 0, not 'nan'"),
    ({"pollInterval": -0.5}, "pollInterval must be a finite number of seconds of at least 0, not -0.5"),
    ({"requestTimeout": 0}, "requestTimeout must be a finite number of seconds above 0, not 0"),
], ids=["a zero pollTimeout", "a negative pollTimeout", "a zero pollTimeout as a string", "a pollTimeout of nan",
        "a negative pollInterval", "a zero requestTimeout"])
def test_times_that_cannot_work_are_refused_when_the_service_is_built(config, message):
    with pytest.raises(ValueError, match=message):
        FuseVMService({"url": "unix:///nonexistent.sock", **config})


def test_a_zero_poll_interval_is_accepted():
    assert FuseVMService({"url": "unix:///nonexistent.sock", "pollInterval": 0}) is not None


def test_a_recreate_no_host_could_take_keeps_the_running_vm(make_fleet, caplog):
    """A new vmHost that is not registered, or does not answer, or a new shape no
    host has the memory for: the create would fail after the delete, leaving the
    trial with no VM at all; the running VM is kept and the provision FAILED."""
    fleet = make_fleet()
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert provision(svc, {**p, "vmHost": "rack-typo"})[0] == Status.FAILED
        assert "not a registered host" in caplog.text
        assert provision(svc, {**p, "memMiB": 900000})[0] == Status.FAILED
        assert "900000 MiB asked" in caplog.text
        assert provision(svc, {k: v for k, v in p.items() if k != "vmHost"} | {"memMiB": 900000})[0] == Status.FAILED
        fleet.agents[1].stop()
        wait_until(lambda: not fleet.client.hosts.get("h2").connected, timeout=30)
        assert provision(svc, {**p, "vmHost": "h2"})[0] == Status.FAILED
        assert "h2 is not answering" in caplog.text
        assert where(fleet.client) == [("keep", "h1", "running")]
        assert placed(fleet.client) == [("keep", 1, 128)]  # never deleted, never recreated
        # A shape that fits, counting the memory the old VM gives back on its own host, is recreated.
        status, info = provision(svc, {**p, "memMiB": 4096 - 128})
        assert (status, info["vmHost"]) == (Status.SUCCEEDED, "h1"), caplog.text
        assert placed(fleet.client) == [("keep", 1, 128), ("keep", 1, 4096 - 128)]
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})


@pytest.mark.parametrize("change, says", [
    ({"vcpus": 65}, "shape.vcpus"),
    ({"vcpus": 32}, "below the floor of 160 MiB"),  # 32 vCPUs at 128 MiB
    ({"vmBundle": "nosuch"}, "bundle nosuch is on no active host"),
    ({"vmEntry": "x" * 1400}, "entry is longer than 1300 bytes"),
], ids=["more vCPUs than a VM may have", "memory below the floor for its vCPUs", "a bundle no host has",
        "an entry too long for the kernel command line"])
@pytest.mark.parametrize("asleep", [False, True], ids=["running", "sleeping"])
def test_a_recreate_the_controller_would_refuse_keeps_the_vm(make_fleet, caplog, change, says, asleep):
    """Review 21: the old VM was deleted and then the create refused (400), leaving the
    trial no VM; a sleeping one lost its saved state with it."""
    fleet = make_fleet()
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        if asleep:
            assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        before = where(fleet.client)
        assert provision(svc, {**p, **change})[0] == Status.FAILED
        assert says in caplog.text and "is kept" in caplog.text
        assert where(fleet.client) == before == [("keep", before[0][1], "sleeping" if asleep else "running")]
        assert placed(fleet.client) == [("keep", 1, 128)]  # never deleted, never recreated
        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})


def test_a_recreate_onto_a_host_at_its_vm_count_policy_keeps_the_vm(make_fleet, caplog):
    fleet = make_fleet()
    svc = service(fleet)
    with svc:
        p = {"vmName": "keep", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        for i in range(8):  # h2's vm_count policy is 8
            fleet.client.vms.create({"name": f"f{i}", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x",
                                     "host": "h2"})
        assert provision(svc, {**p, "vmHost": "h2"})[0] == Status.FAILED
        assert "vmHost h2 is at its VM limit (vm_count policy 8 VMs" in caplog.text
        assert ("keep", "h1", "running") in where(fleet.client)
        # on its own host the old VM's slot is counted free: a new shape there is recreated
        status, info = provision(svc, {**p, "memMiB": 256})
        assert (status, info["vmHost"]) == (Status.SUCCEEDED, "h1"), caplog.text


def test_a_recreate_onto_a_full_host_with_a_prewarmed_vm_of_its_shape_takes_that_vm(make_fleet, caplog):
    """(review 27: FAILED "vmHost h2 is at its vm_count policy", where the controller's own
    create of that VM claimed h2's standby VM at once: it needs no room)"""
    fleet = make_fleet()
    fleet.client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="host:h2"))
    wait_until(lambda: any(v.get("standby") and v["state"] == "running" for v in fleet.client.vms.list()),
               timeout=60, what="the standby VM")
    for i in range(7):  # h2's vm_count policy is 8: 7 and the standby VM
        fleet.client.vms.create({"name": f"f{i}", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "host": "h2"})
    svc = service(fleet)
    with svc:
        p = {"vmName": "bench", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        status, info = provision(svc, {**p, "vmHost": "h2", "memMiB": 256})
        assert (status, info["vmHost"]) == (Status.SUCCEEDED, "h2"), caplog.text
        assert ("bench", "h2", "running") in where(fleet.client)
