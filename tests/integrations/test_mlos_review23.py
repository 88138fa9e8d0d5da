"""Twenty-third session's review of `FuseVMService` (real controller, real agents on the
fake backend): a teardown never calls a VM whose create is still in flight deleted; a
sleeping VM's reshape does not count a slot it does not hold; times past a year are
refused when the service is built; a controller restart mid-operation is waited out."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

import fuse  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402

from fuse.integrations.mlos import FuseVMService  # noqa: E402
from support import being_created, start_controller, wait_until  # noqa: E402
from test_mlos import provision  # noqa: E402
from test_mlos_review import make_fleet, service, where  # noqa: E402,F401

pytestmark = pytest.mark.timeout(180)


def test_a_teardown_while_the_vms_create_is_in_flight_waits_for_it_and_deletes_it(make_fleet):
    """(was: deprovision_host answered SUCCEEDED at once, the controller's 404 read as gone,
    and the VM the create then made ran on with nothing to remove it)"""
    fleet = make_fleet()
    agent = fleet.agents[0]
    os.kill(agent.popen.pid, signal.SIGSTOP)  # h1 holds the create unanswered
    resumed = False
    try:
        with service(fleet) as a, service(fleet) as b:
            status, handle = a.provision_host({"vmName": "late", "vcpus": 1, "memMiB": 128, "vmHost": "h1"})
            assert status == Status.PENDING

            wait_until(lambda: being_created(fleet.client, "late"), what="the controller's 409 for a VM being created")
            with pytest.raises(fuse.ApiError) as info:
                fleet.client.vms.delete("late")
            assert (info.value.status, info.value.code, info.value.details["host"]) == (409, "conflict", "h1")
            answer: dict = {}
            teardown = threading.Thread(target=lambda: answer.update(r=b.deprovision_host({"vmName": "late"})))
            teardown.start()
            teardown.join(2.0)
            assert teardown.is_alive(), answer  # it waits for the create: there is nothing to delete yet
            os.kill(agent.popen.pid, signal.SIGCONT)
            resumed = True
            teardown.join(60)
            assert answer["r"] == (Status.SUCCEEDED, {})
            assert where(fleet.client) == []
            a.wait_host_deployment(handle, is_setup=True)  # (whatever it says, the VM is gone for good)
            time.sleep(2)
            assert where(fleet.client) == []
    finally:
        if not resumed:
            os.kill(agent.popen.pid, signal.SIGCONT)


def test_a_watch_for_a_teardown_does_not_call_a_vm_being_created_gone(make_fleet):
    fleet = make_fleet()
    agent = fleet.agents[0]
    os.kill(agent.popen.pid, signal.SIGSTOP)
    try:
        with service(fleet) as a, service(fleet, pollTimeout=3) as b:
            assert a.provision_host({"vmName": "late", "vcpus": 1, "memMiB": 128, "vmHost": "h1"})[0] \
                == Status.PENDING
            wait_until(lambda: fleet.client.vms.list() == [] and being_created(fleet.client, "late"),
                       what="the create in flight")
            status, _ = b.wait_host_deployment({"vmName": "late"}, is_setup=False)
            assert status == Status.TIMED_OUT  # (was: SUCCEEDED, vmState deleted)
    finally:
        os.kill(agent.popen.pid, signal.SIGCONT)



def test_a_sleeping_vms_reshape_on_a_full_host_keeps_it_asleep(make_fleet, caplog):
    """(was: the check counted a slot the sleeping VM would free, but it held none: the VM
    was deleted, its saved state with it, and the create then refused for the vm_count policy)"""
    fleet = make_fleet()
    with service(fleet) as svc:
        p = {"vmName": "sl1", "vcpus": 1, "memMiB": 128, "vmHost": "h1"}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        for i in range(8):  # h1's vm_count policy is 8: its slots all taken while sl1 sleeps
            fleet.client.vms.create({"name": f"f{i}", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x",
                                     "host": "h1"})
        assert provision(svc, {**p, "memMiB": 160})[0] == Status.FAILED
        assert "vmHost h1 is at its VM limit (vm_count policy 8 VMs" in caplog.text
        assert ("sl1", "h1", "sleeping") in where(fleet.client)


@pytest.mark.parametrize("key", ["pollTimeout", "requestTimeout", "pollInterval"])
def test_a_time_past_a_year_is_refused_when_the_service_is_built(key):
    """(was: pollTimeout 1e10 was taken, then every wait failed with an OverflowError)"""
    with pytest.raises(ValueError, match=f"{key} must be at most 31536000 seconds \\(a year\\), not 10000000000.0"):
        FuseVMService({"url": "unix:///nonexistent.sock", key: 1e10})
    assert FuseVMService({"url": "unix:///nonexistent.sock", key: 31536000}) is not None


def test_a_controller_restart_during_a_provision_is_waited_out(make_fleet, tmp_path):
    """(was: FAILED at once, "unreachable", with most of pollTimeout left and the
    controller back two seconds later)"""
    fleet = make_fleet()
    with service(fleet) as svc:
        assert provision(svc, {"vmName": "r0", "vcpus": 1, "memMiB": 128})[0] == Status.SUCCEEDED
        fleet.ctl.stop()
        status, handle = svc.provision_host({"vmName": "r1", "vcpus": 1, "memMiB": 128})
        assert status == Status.PENDING
        time.sleep(1.5)
        fleet.ctl = start_controller(tmp_path)  # (the same state dir and socket)
        status, info = svc.wait_host_deployment(handle, is_setup=True)
        assert status == Status.SUCCEEDED and info["vmState"] == "running"
        with fuse.Client(fleet.ctl.url) as c:
            assert sorted(v["name"] for v in c.vms.list()) == ["r0", "r1"]
            fleet.client = c
            # and a teardown through a second restart
            fleet.ctl.stop()
            answer: dict = {}
            t = threading.Thread(target=lambda: answer.update(r=svc.deprovision_host({"vmName": "r1"})))
            t.start()
            time.sleep(1.5)
            fleet.ctl = start_controller(tmp_path)
            t.join(60)
            assert answer["r"] == (Status.SUCCEEDED, {})
        with fuse.Client(fleet.ctl.url) as c:
            assert [v["name"] for v in c.vms.list()] == ["r0"]
            fleet.client = fuse.Client(fleet.ctl.url)
