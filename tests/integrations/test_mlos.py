"""`FuseVMService` against a real controller and agent (fake backend): the
service called directly, then the real `mlos_bench` CLI for a few trials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

import pytest

mlos_bench = pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

import fuse  # noqa: E402
from mlos_bench.environments.remote.host_env import HostEnv  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402
from mlos_bench.services.types.host_provisioner_type import SupportsHostProvisioning  # noqa: E402
from mlos_bench.tunables.tunable_groups import TunableGroups  # noqa: E402

from fuse.integrations import mlos as mlos_module  # noqa: E402
from fuse.integrations.mlos import OP_KEY, OP_KIND_KEY, FuseVMService  # noqa: E402
from support import reap, start_agent, start_controller, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(150)

CTL_TOKEN = "controller-token-for-mlos"


@pytest.fixture
def fleet(tmp_path):
    # Also on TCP with a token, for the tests of how the token is supplied.
    ctl = start_controller(tmp_path, listen=True, token=CTL_TOKEN)
    agent = start_agent(tmp_path, backend="fake", name="a1")
    client = fuse.Client(ctl.url)
    client.hosts.register(fuse.RegisterHostRequest(id="h1", url=agent.url, token=agent.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=8, ram_mb=4096, cpus=4)))
    yield type("Fleet", (), {"ctl": ctl, "agent": agent, "client": client, "tmp": tmp_path})
    client.close()
    agent.stop()
    ctl.stop()
    reap(tmp_path)


def vms(client) -> list[tuple[str, str, int, int]]:
    return sorted((v["name"], v["state"], v["shape"]["vcpus"], v["shape"]["mem_mib"]) for v in client.vms.list())


def placed(client) -> list[tuple[str, int, int]]:
    return [(e["vm"], e["vcpus"], e["mem_mib"]) for e in client.events.list(0, limit=500)["events"]
            if e["type"] == "placed"]


def service(fleet, **config) -> FuseVMService:
    return FuseVMService({"url": fleet.ctl.url, "pollInterval": 0.05, "pollTimeout": 30, **config})


def provision(svc, params) -> tuple[Status, dict]:
    status, out = svc.provision_host(params)
    if status.is_pending():
        assert OP_KEY in out
        status, out = svc.wait_host_deployment(out, is_setup=True)
    return status, out


def test_it_is_a_host_provisioner_that_host_env_accepts(fleet):
    svc = service(fleet)
    assert isinstance(svc, SupportsHostProvisioning)
    env = HostEnv(name="fuse", config={"const_args": {"vmName": "env1", "vcpus": 1, "memMiB": 128}},
                  tunables=TunableGroups(), service=svc)
    with svc, env:
        assert env.setup(TunableGroups())
        assert vms(fleet.client) == [("env1", "running", 1, 128)]
        env.teardown()
    assert vms(fleet.client) == []


def test_provision_is_idempotent_and_recreates_on_a_new_shape(fleet):
    svc = service(fleet)
    with svc:
        p = {"vmName": "bench", "vcpus": 1, "memMiB": 128}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        # Same shape again: nothing to do, answered at once.
        # Seed 002: "The result is always {}" (only PENDING carries a handle).
        assert svc.provision_host(p) == (Status.SUCCEEDED, {})
        # Tunables as strings (command-line overrides) are the same shape.
        assert svc.provision_host({"vmName": "bench", "vcpus": "1", "memMiB": "128"})[0] == Status.SUCCEEDED
        assert placed(fleet.client) == [("bench", 1, 128)]
        # A new shape: the VM is recreated with it.
        status, out = provision(svc, {**p, "vcpus": 2, "memMiB": 256})
        assert status == Status.SUCCEEDED and out["vmState"] == "running" and OP_KEY not in out
        assert vms(fleet.client) == [("bench", "running", 2, 256)]
        assert placed(fleet.client) == [("bench", 1, 128), ("bench", 2, 256)]


def test_provision_keeps_a_running_vms_entry_when_the_params_name_none(fleet):
    # A VM created elsewhere (or with vmEntry before) runs its own job: a trial
    # whose params leave vmEntry out must not replace it with the default.
    fleet.client.vms.create({"name": "job", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 1000"})
    svc = service(fleet)
    with svc:
        p = {"vmName": "job", "vcpus": 1, "memMiB": 128}
        assert svc.provision_host(p) == (Status.SUCCEEDED, {})
        assert placed(fleet.client) == [("job", 1, 128)]  # not recreated
        # Naming another entry does recreate it, with that entry.
        assert provision(svc, {**p, "vmEntry": "sleep 2000"})[0] == Status.SUCCEEDED
        assert fleet.client.vms.get("job")["entry"] == "sleep 2000"
        assert placed(fleet.client) == [("job", 1, 128), ("job", 1, 128)]


@pytest.mark.parametrize("params", [None, [], "vm"], ids=["None", "a list", "a string"])
def test_params_that_are_not_a_dict_are_failed_not_raised(fleet, caplog, params):
    svc = service(fleet)
    with svc:
        assert svc.provision_host(params) == (Status.FAILED, {})
        assert svc.deprovision_host(params) == (Status.FAILED, {})
        assert svc.deallocate_host(params) == (Status.FAILED, {})
        for is_setup in (True, False):
            assert svc.wait_host_deployment(params, is_setup=is_setup) == (Status.FAILED, {})
    assert "params must be a dict" in caplog.text


def test_deallocate_sleeps_the_vm_and_provision_wakes_it(fleet):
    svc = service(fleet)
    with svc:
        p = {"vmName": "sleepy", "vcpus": 1, "memMiB": 128}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
        assert vms(fleet.client) == [("sleepy", "sleeping", 1, 128)]
        assert svc.deallocate_host(p)[0] == Status.SUCCEEDED  # already asleep: still fine
        assert provision(svc, p)[0] == Status.SUCCEEDED
        assert vms(fleet.client) == [("sleepy", "running", 1, 128)]
        assert placed(fleet.client) == [("sleepy", 1, 128)]  # woken, not recreated


def test_deprovision_deletes_and_tolerates_a_missing_vm(fleet):
    svc = service(fleet)
    with svc:
        p = {"vmName": "gone", "vcpus": 1, "memMiB": 128}
        assert provision(svc, p)[0] == Status.SUCCEEDED
        for _ in range(2):  # seed 002: "The result is always {}"; done when it answers
            assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})
            assert vms(fleet.client) == []
        # Without an operation handle, wait polls the VM itself.
        assert svc.wait_host_deployment(p, is_setup=False)[0] == Status.SUCCEEDED
        assert svc.deallocate_host(p)[0] == Status.FAILED  # nothing to sleep


def test_expected_failures_are_statuses_not_exceptions(fleet, tmp_path):
    svc = service(fleet)
    with svc:
        assert svc.provision_host({"vmName": "x"}) == (Status.FAILED, {})  # no shape
        assert provision(svc, {"vmName": "huge", "vcpus": 1, "memMiB": 1_048_576}) == (Status.FAILED, {})
        assert provision(svc, {"vmName": "pinned", "vcpus": 1, "memMiB": 128, "vmHost": "nope"})[0] == Status.FAILED
    nowhere = FuseVMService({"url": f"unix://{tmp_path}/none.sock", "pollInterval": 0.05})
    assert nowhere.provision_host({"vmName": "x", "vcpus": 1, "memMiB": 128}) == (Status.FAILED, {})


def test_a_bad_url_is_failed_from_every_call_never_an_exception(caplog):
    # The url is only read when the first call needs the controller.
    svc = FuseVMService({"url": "ftp://x", "pollInterval": 0.05, "pollTimeout": 5})
    p = {"vmName": "x", "vcpus": 1, "memMiB": 128}
    with svc:
        assert svc.provision_host(p) == (Status.FAILED, {})
        assert svc.deprovision_host(p) == (Status.FAILED, {})
        assert svc.wait_host_deployment(p, is_setup=True) == (Status.FAILED, {})
        assert svc.wait_host_deployment(p, is_setup=False) == (Status.FAILED, {})
        assert svc.deallocate_host(p) == (Status.FAILED, {})
    assert "must be unix:///path or http(s)://host:port" in caplog.text


@pytest.mark.parametrize("vcpus, mem", [(1.5, 128), (1, "128.5"), ("two", 128), (0, 128), (True, 128), (1, True)],
                         ids=["a fractional vCPU count", "a fractional memory size", "a word", "zero vCPUs",
                              "a boolean vCPU count", "a boolean memory size"])
def test_a_shape_that_is_not_a_whole_number_is_failed_with_the_reason(fleet, caplog, vcpus, mem):
    svc = service(fleet)
    with svc:
        assert svc.provision_host({"vmName": "frac", "vcpus": vcpus, "memMiB": mem}) == (Status.FAILED, {})
    assert "must be a whole number" in caplog.text
    assert vms(fleet.client) == []  # not truncated and created


@pytest.mark.parametrize("key", ["pollInterval", "pollTimeout", "requestTimeout"])
def test_a_boolean_time_in_the_config_is_refused_even_where_the_schema_is_not_checked(key):
    class Unchecked(FuseVMService):  # a subclass: FuseVMService's own schema is not checked
        pass

    with pytest.raises(ValueError, match=f"{key} must be a number of seconds, not True"):
        Unchecked({"url": "unix:///nonexistent.sock", key: True})
    with pytest.raises(Exception, match="True is not of type"):
        FuseVMService({"url": "unix:///nonexistent.sock", key: True})
    assert Unchecked({"url": "unix:///nonexistent.sock", key: "2.5"}) is not None  # a numeric string is fine


def test_whole_numbers_given_as_floats_or_strings_are_accepted(fleet):
    svc = service(fleet)
    with svc:
        assert provision(svc, {"vmName": "w", "vcpus": 2.0, "memMiB": "128.0"})[0] == Status.SUCCEEDED
    assert vms(fleet.client) == [("w", "running", 2, 128)]


def test_a_failed_deallocate_is_logged_as_a_deallocate(fleet, caplog):
    svc = service(fleet)
    with svc:
        assert svc.deallocate_host({"vmName": "absent"}) == (Status.FAILED, {})
    assert "deallocate of vm absent failed: vm absent not found" in caplog.text
    assert "deprovision" not in caplog.text


# ---- operations: handles, runtime info, deadlines ----------------------------

def test_wait_answers_with_the_operations_runtime_and_checks_its_kind(fleet, caplog):
    svc = service(fleet)
    p = {"vmName": "timed", "vcpus": 1, "memMiB": 128}
    with svc:
        status, handle = svc.provision_host(p)
        assert status == Status.PENDING and handle[OP_KIND_KEY] == "provision"
        # A provision waited on as a teardown: FAILED with the reason, and the
        # operation is left for the right wait.
        assert svc.wait_host_deployment(handle, is_setup=False) == (Status.FAILED, {})
        assert "given a provision handle for vm timed; a provision is waited on with is_setup=True" in caplog.text
        status, info = svc.wait_host_deployment(handle, is_setup=True)
        assert status == Status.SUCCEEDED
        assert {k: info[k] for k in ("operation", "vmName", "vmHost", "vmState")} == {
            "operation": "provision", "vmName": "timed", "vmHost": "h1", "vmState": "running"}
        assert 0 <= info["elapsedSecs"] < 30 and OP_KEY not in info

        assert svc.deprovision_host(p) == (Status.SUCCEEDED, {})
        handle = {**p, OP_KIND_KEY: "deprovision"}  # (a handle it held no longer: it watches the VM)
        assert svc.wait_host_deployment(handle, is_setup=True) == (Status.FAILED, {})
        status, info = svc.wait_host_deployment(handle, is_setup=False)
        assert status == Status.SUCCEEDED
        assert {k: info[k] for k in ("operation", "vmName", "vmState")} == {
            "operation": "deprovision", "vmName": "timed", "vmState": "deleted"}


def test_a_handle_outlives_the_service_that_issued_it(fleet):
    # mlos_bench restarted between provision and wait: a new service instance
    # does not hold the operation, so it watches the VM the handle names.
    first = service(fleet)
    with first:
        status, handle = first.provision_host({"vmName": "kept", "vcpus": 1, "memMiB": 128})
        assert first.wait_host_deployment(handle, is_setup=True)[0] == Status.SUCCEEDED
    second = service(fleet)
    with second:
        status, info = second.wait_host_deployment(handle, is_setup=True)
        assert status == Status.SUCCEEDED and (info["operation"], info["vmState"]) == ("provision", "running")
        assert second.wait_host_deployment(handle, is_setup=False) == (Status.FAILED, {})  # still a provision


class GatedProxy:
    """An HTTP proxy in front of the controller's socket that holds the calls a
    test names until it lets them through: a controller call that hangs, on
    demand, with a real controller behind it."""

    def __init__(self, sock: Path):
        self.gates: dict[tuple[str, str], tuple[threading.Event, threading.Event]] = {}
        upstream = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://c", timeout=120)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def forward(self):
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else None
                gate = proxy.gates.get((self.command, self.path.split("?")[0]))
                if gate is not None:
                    gate[0].set()  # arrived
                    gate[1].wait(90)  # released
                resp = upstream.request(self.command, self.path, content=body,
                                        headers={"content-type": self.headers.get("content-type", "")})
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = do_PUT = do_DELETE = forward

            def log_message(self, *args):
                pass

        self.upstream = upstream
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold(self, method: str, path: str) -> threading.Event:
        """Hold `method path` until `release`; the event says one arrived."""
        arrived, released = threading.Event(), threading.Event()
        self.gates[(method, path)] = (arrived, released)
        return arrived

    def release(self) -> None:
        for _, released in self.gates.values():
            released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()


@pytest.fixture
def gate(fleet):
    proxy = GatedProxy(fleet.ctl.socket)
    yield proxy
    proxy.close()


def gated(gate, **config) -> FuseVMService:
    return FuseVMService({"url": gate.url, "pollInterval": 0.05, "pollTimeout": 1.0, **config})


def test_poll_timeout_bounds_the_whole_operation_and_drops_it(fleet, gate):
    # margins wide enough for a loaded machine: a deadline counted from the
    # call ends near 3 s, one counted from the late wait near 5.5 s
    svc = gated(gate, pollTimeout=3.0)
    p = {"vmName": "held", "vcpus": 1, "memMiB": 128}
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
        arrived = gate.hold("DELETE", "/v1/vms/held")
        started = time.monotonic()
        status, handle = svc.provision_host({**p, "memMiB": 256})  # a new shape: delete, then create
        assert status == Status.PENDING
        assert arrived.wait(10)
        time.sleep(2.5)  # the caller comes back late: its wait still ends at the operation's deadline
        assert svc.wait_host_deployment(handle, is_setup=True) == (Status.TIMED_OUT, {})
        assert 3.0 <= time.monotonic() - started < 4.5  # not 2.5 + a whole pollTimeout
        assert handle[OP_KEY] not in svc._ops  # the pending table does not keep it

        # Queued behind the hung call, the next operation shares the bound
        # (counted from its own call) and, timed out, never starts.
        status, later = svc.provision_host({"vmName": "later", "vcpus": 1, "memMiB": 128})
        assert status == Status.PENDING
        started = time.monotonic()
        assert svc.wait_host_deployment(later, is_setup=True) == (Status.TIMED_OUT, {})
        assert time.monotonic() - started < 4.5 and svc._ops == {}
        gate.release()
        wait_until(lambda: not svc._busy(), what="the worker to finish the released call")
        assert vms(fleet.client) == []  # the held delete landed; no create after it, "later" never created


@pytest.mark.parametrize("kind, held, after", [
    ("deprovision", ("DELETE", "/v1/vms/slow"), []),
    ("deallocate", ("POST", "/v1/vms/slow/sleep"), [("slow", "sleeping", 1, 128)]),
])
def test_a_teardown_that_outlasts_poll_timeout_is_pending_with_its_handle(fleet, gate, kind, held, after):
    svc = gated(gate)
    p = {"vmName": "slow", "vcpus": 1, "memMiB": 128}
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
        arrived = gate.hold(*held)
        status, handle = getattr(svc, f"{kind}_host")(p)
        # The call reached the controller and goes on there: PENDING (seed 002
        # allows no TIMED_OUT for either), with the handle to wait on.
        assert arrived.is_set()
        assert status == Status.PENDING and handle[OP_KIND_KEY] == kind and OP_KEY in handle
        assert vms(fleet.client) == [("slow", "running", 1, 128)]
        assert svc.wait_host_deployment(handle, is_setup=True) == (Status.FAILED, {})  # not a provision
        gate.release()
        status, info = svc.wait_host_deployment(handle, is_setup=False)
        assert status == Status.SUCCEEDED and (info["operation"], info["vmState"]) == (kind, after[0][1] if after
                                                                                        else "deleted")
        assert vms(fleet.client) == after


def test_deallocate_that_timed_out_before_asking_for_the_sleep_is_failed(fleet, gate, caplog):
    svc = gated(gate)
    p = {"vmName": "awake", "vcpus": 1, "memMiB": 128}
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
        gate.hold("GET", "/v1/vms/awake")  # its look-up before the sleep hangs
        assert svc.deallocate_host(p) == (Status.FAILED, {})
        assert "deallocate of vm awake failed: it timed out before asking the controller" in caplog.text
        gate.release()
        wait_until(lambda: not svc._busy(), what="the worker to finish the released call")
        assert vms(fleet.client) == [("awake", "running", 1, 128)]  # abandoned: it never slept the VM


def test_the_services_exit_does_not_wait_for_a_hung_call(fleet, gate, monkeypatch):
    monkeypatch.setattr(mlos_module, "EXIT_JOIN_S", 0.5, raising=False)
    svc = gated(gate, pollTimeout=60)
    p = {"vmName": "stuck", "vcpus": 1, "memMiB": 128}
    svc.__enter__()
    assert provision(svc, p)[0] == Status.SUCCEEDED
    arrived = gate.hold("DELETE", "/v1/vms/stuck")
    assert svc.provision_host({**p, "memMiB": 256})[0] == Status.PENDING  # a new shape: delete, then create
    assert arrived.wait(10)
    assert svc.provision_host({"vmName": "queued", "vcpus": 1, "memMiB": 128})[0] == Status.PENDING
    started = time.monotonic()
    svc.__exit__(None, None, None)
    assert time.monotonic() - started < 10  # the join gives up at 0.5 s; the hung call would hold it 60 s
    gate.release()
    wait_until(lambda: not any(t.name == "fuse-mlos" and t.is_alive() for t in threading.enumerate()),
               what="the worker thread to end once its call returned")
    assert vms(fleet.client) == []  # the delete in flight landed, no create after it; the queued one was cancelled


# ---- waiting without a handle -------------------------------------------------

def _sleeping(svc, p):
    assert provision(svc, p)[0] == Status.SUCCEEDED
    assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
    return p, True


def _never_created(svc, p):
    return {"vmName": "zz", OP_KEY: "abc", OP_KIND_KEY: "provision"}, True


def _other_shape(svc, p):
    assert provision(svc, p)[0] == Status.SUCCEEDED
    return {**p, "memMiB": 256}, True


def _not_deleted(svc, p):
    assert provision(svc, p)[0] == Status.SUCCEEDED
    return p, False


def _not_asleep(svc, p):
    assert provision(svc, p)[0] == Status.SUCCEEDED
    return {**p, OP_KIND_KEY: "deallocate"}, False


@pytest.mark.parametrize("arrange, why", [
    (_sleeping, "the vm is sleeping on h1"),
    (_never_created, "the vm is gone"),
    (_other_shape, "the vm is running on h1 but not as asked (shape 1x128 MiB -> 1x256 MiB)"),
    (_not_deleted, "the vm is running on h1"),
    (_not_asleep, "the vm is running on h1"),
], ids=["a setup wait on a vm deallocate put to sleep is failed at once",
        "a setup wait on a vm that does not exist, with a handle this service never issued, is failed at once",
        "a setup wait on a vm running with another shape is failed at once",
        "a teardown wait on a vm nothing deletes is failed at once",
        "a deallocate's wait on a vm nothing sleeps is failed at once"])
def test_a_wait_with_nothing_under_way_answers_at_once(fleet, caplog, arrange, why):
    # Nothing of this service's is queued or running and no move is under
    # way: the VM will stay as it is, so waiting out pollTimeout could only
    # end in TIMED_OUT.
    svc = service(fleet, pollTimeout=10)
    with svc:
        params, is_setup = arrange(svc, {"vmName": "still", "vcpus": 1, "memMiB": 128})
        started = time.monotonic()
        assert svc.wait_host_deployment(params, is_setup=is_setup) == (Status.FAILED, {})
        assert time.monotonic() - started < 3  # not pollTimeout
    assert f"{why}, and nothing is under way to change that" in caplog.text


def test_a_wait_without_a_handle_watches_while_an_operation_is_under_way(fleet, gate):
    svc = gated(gate, pollTimeout=10)
    p = {"vmName": "coming", "vcpus": 1, "memMiB": 128}
    with svc:
        arrived = gate.hold("POST", "/v1/vms")
        status, handle = svc.provision_host(p)
        assert status == Status.PENDING and arrived.wait(10)
        # The vm does not exist yet, but the create is under way: the wait
        # watches it rather than answer FAILED.
        threading.Timer(0.5, gate.release).start()
        started = time.monotonic()
        status, info = svc.wait_host_deployment({k: v for k, v in handle.items() if k != OP_KEY}, is_setup=True)
        assert status == Status.SUCCEEDED and info["vmState"] == "running"
        assert 0.4 <= time.monotonic() - started < 8
        assert svc.wait_host_deployment(handle, is_setup=True)[0] == Status.SUCCEEDED


def test_a_wait_without_a_handle_times_out_when_what_is_under_way_outlasts_poll_timeout(fleet, gate, caplog):
    svc = gated(gate, pollTimeout=1.0)
    p = {"vmName": "never", "vcpus": 1, "memMiB": 128}
    with svc:
        arrived = gate.hold("POST", "/v1/vms")
        status, handle = svc.provision_host(p)
        assert status == Status.PENDING and arrived.wait(10)
        started = time.monotonic()
        assert svc.wait_host_deployment(p, is_setup=True) == (Status.TIMED_OUT, {})
        assert 0.9 <= time.monotonic() - started < 5
        assert "provision of vm never timed out after pollTimeout (1 s); the vm is gone" in caplog.text
        gate.release()
        wait_until(lambda: not svc._busy(), what="the worker to finish the released call")


# ---- how url and token reach the service ------------------------------------

def test_url_and_token_come_from_globals_by_their_key_names(fleet, monkeypatch, caplog):
    # mlos_bench builds every service this way: the config's keys are filled
    # from the globals of the same name; "$name" is not expanded there.
    from mlos_bench.services.config_persistence import ConfigPersistenceService
    monkeypatch.delenv("FUSE_URL", raising=False)
    monkeypatch.delenv("FUSE_TOKEN", raising=False)
    tcp = f"http://127.0.0.1:{fleet.ctl.extra['port']}"
    loader = ConfigPersistenceService()

    def build(config: dict, global_config: dict):
        return loader.build_service({"class": "fuse.integrations.mlos.FuseVMService",
                                     "config": {"pollInterval": 0.05, "pollTimeout": 30, **config}}, global_config)

    p = {"vmName": "tok", "vcpus": 1, "memMiB": 128}
    svc = build({"url": "", "token": ""}, {"url": tcp, "token": CTL_TOKEN, "unrelated": 1})
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
    assert vms(fleet.client) == [("tok", "running", 1, 128)]

    # No global: no token reaches the controller, which refuses; FAILED.
    bare = build({"url": tcp, "token": ""}, {})
    with bare:
        assert bare.provision_host(p) == (Status.FAILED, {})
    assert "401" in caplog.text

    # "$fuseToken" would be sent as the token itself: refused when built,
    # saying how to supply it.
    with pytest.raises(ValueError, match='expands no \\$names.*"token": "".*globals'):
        build({"url": tcp, "token": "$fuseToken"}, {"fuseToken": CTL_TOKEN})


def test_config_is_checked_against_the_services_own_schema(fleet):
    with pytest.raises(Exception, match="urll"):
        FuseVMService({"urll": fleet.ctl.url})


# ---- the real mlos_bench CLI -------------------------------------------------

PROBE = """\
import json, os, fuse
with fuse.Client() as c:
    vms = [{k: v[k] for k in ("name", "host", "state")} | v["shape"] for v in c.vms.list()]
with open(os.environ["PROBE_LOG"], "a") as f:
    f.write(json.dumps({"vcpus": int(os.environ["vcpus"]), "memMiB": int(os.environ["memMiB"]), "vms": vms}) + "\\n")
print("score = 1.0")
"""

TRIALS = [{"vcpus": 1, "memMiB": 128}, {"vcpus": 1, "memMiB": 128}, {"vcpus": 2, "memMiB": 256},
          {"vcpus": 1, "memMiB": 128}]


def write_configs(cfg: Path, probe_log: Path, fuse_url: str, tcp_url: str) -> None:
    files = {
        "cli.jsonc": {
            "config_path": [str(cfg)],
            "environment": "env.jsonc",
            "optimizer": "opt.jsonc",
            "storage": "storage.jsonc",
            "experiment_id": "fuse-mlos-test",
            # The controller's url and token reach the fuse service through
            # globals: mlos_bench fills its config's "url" and "token" keys.
            "globals": ["globals.jsonc"],
            "trial_config_repeat_count": 1,
            "teardown": True,
            "log_file": str(cfg / "mlos.log"),
            "log_level": "INFO",
        },
        "env.jsonc": {
            "name": "fuse bench",
            "class": "mlos_bench.environments.CompositeEnv",
            "include_tunables": ["tunables.jsonc"],
            # All services at the root: mlos_bench enters a service shared by two
            # composite services twice, and fails, so children include none.
            "include_services": ["services/local/local_exec_service.jsonc", "fuse-service.jsonc"],
            "config": {
                "tunable_params": ["fuse-vm"],
                "const_args": {"vmName": "bench-vm"},
                "children": [
                    {"name": "fuse vm", "class": "mlos_bench.environments.remote.HostEnv",
                     "config": {"tunable_params": ["fuse-vm"], "required_args": ["vmName"]}},
                    {"name": "probe", "class": "mlos_bench.environments.local.LocalEnv",
                     # LocalEnv's scripts get only the environment it is given.
                     "config": {"tunable_params": ["fuse-vm"],
                                "const_args": {"FUSE_URL": fuse_url, "PROBE_LOG": str(probe_log)},
                                "shell_env_params": ["vcpus", "memMiB", "FUSE_URL", "PROBE_LOG"],
                                "run": [f"{sys.executable} {cfg / 'probe.py'}"],
                                "results_stdout_pattern": "(\\w+) = (\\S+)"}},
                ],
            },
        },
        "fuse-service.jsonc": {"class": "fuse.integrations.mlos.FuseVMService",
                               "config": {"url": "", "token": "", "pollInterval": 0.1, "pollTimeout": 60}},
        # mlos_bench expands $NAME in globals from the environment.
        "globals.jsonc": {"url": tcp_url, "token": "$FUSE_TEST_CONTROLLER_TOKEN"},
        "tunables.jsonc": {"fuse-vm": {"cost": 1, "params": {
            "vcpus": {"type": "int", "default": 1, "range": [1, 4]},
            "memMiB": {"type": "int", "default": 128, "range": [64, 1024]},
        }}},
        "opt.jsonc": {"class": "mlos_bench.optimizers.ManualOptimizer",
                      "config": {"max_cycles": 1, "tunable_values_cycle": TRIALS}},
        "storage.jsonc": {"class": "mlos_bench.storage.sql.storage.SqlStorage",
                          "config": {"drivername": "sqlite", "database": str(cfg / "mlos.sqlite")}},
    }
    for name, doc in files.items():
        (cfg / name).write_text(json.dumps(doc, indent=2))
    (cfg / "probe.py").write_text(PROBE)
    # mlos_bench records the config's git origin and commit with each experiment.
    git = ["git", "-C", str(cfg), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["remote", "add", "origin", "https://example.com/fuse-bench.git"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "bench configs"], check=True)


def test_mlos_bench_cli_runs_trials_on_fuse_vms(fleet, tmp_path):
    cfg = tmp_path / "bench"
    cfg.mkdir()
    probe_log = tmp_path / "probe.jsonl"
    write_configs(cfg, probe_log, fleet.ctl.url, f"http://127.0.0.1:{fleet.ctl.extra['port']}")
    env = {k: v for k, v in os.environ.items() if k not in ("FUSE_URL", "FUSE_TOKEN")}
    env |= {"FUSE_TEST_CONTROLLER_TOKEN": CTL_TOKEN,
            # mlos_bench's schema lists only its own service classes.
            "MLOS_BENCH_SKIP_SCHEMA_VALIDATION": "true"}
    run = subprocess.run([sys.executable, "-m", "mlos_bench.run", "--config", str(cfg / "cli.jsonc")],
                         cwd=cfg, env=env, capture_output=True, text=True, timeout=120)
    log = (cfg / "mlos.log").read_text() if (cfg / "mlos.log").exists() else ""
    assert run.returncode == 0, run.stderr[-3000:] + log[-3000:]

    # Each trial ran on exactly one VM, running, with that trial's shape.
    trials = [json.loads(line) for line in probe_log.read_text().splitlines()]
    assert [{"vcpus": t["vcpus"], "memMiB": t["memMiB"]} for t in trials] == TRIALS
    for t in trials:
        assert t["vms"] == [{"name": "bench-vm", "host": "h1", "state": "running",
                             "vcpus": t["vcpus"], "mem_mib": t["memMiB"]}]

    # One placement per change of shape: trial 2 reused trial 1's VM.
    assert placed(fleet.client) == [("bench-vm", 1, 128), ("bench-vm", 2, 256), ("bench-vm", 1, 128)]
    # The calls mlos_bench made, in order, and teardown deleted the VM.
    calls = [line.split("fuse: ", 1)[1].split(" ")[0:2] for line in log.splitlines() if "fuse: " in line]
    assert calls == [["created", "vm"], ["vm", "bench-vm"], ["recreating", "vm"], ["created", "vm"],
                                  ["recreating", "vm"], ["created", "vm"], ["deleted", "vm"]], log[-3000:]
    assert vms(fleet.client) == []


@pytest.mark.parametrize("agent_args, ram_mb, fillers", [
    (["--max-vms", "2"], 4096, [128, 128]),  # h3's own admission takes two VMs at a time
    ([], 256, [256]),  # its agent would admit it, but h3 was registered with 256 MiB: the controller says no
], ids=["its host's admission is full", "its host's declared room is taken"])
def test_a_deallocated_vm_wakes_on_another_host_when_its_own_is_full(fleet, agent_args, ram_mb, fillers):
    other = start_agent(fleet.tmp, backend="fake", name="a3", extra=agent_args)
    try:
        fleet.client.hosts.register(fuse.RegisterHostRequest(
            id="h3", url=other.url, token=other.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=8, ram_mb=ram_mb, cpus=4)))
        svc = service(fleet)
        with svc:
            p = {"vmName": "roamer", "vcpus": 1, "memMiB": 128, "vmHost": "h3"}
            assert provision(svc, p)[0] == Status.SUCCEEDED
            assert svc.deallocate_host(p) == (Status.SUCCEEDED, {})
            for i, mem in enumerate(fillers):  # while it sleeps, its host fills up
                fleet.client.vms.create({"name": f"filler{i}", "shape": {"vcpus": 1, "mem_mib": mem},
                                         "entry": "x", "host": "h3"})
            status, out = provision(svc, {k: v for k, v in p.items() if k != "vmHost"})
            assert status == Status.SUCCEEDED, out
            vm = fleet.client.vms.get("roamer")
            assert (vm["host"], vm["state"]) == ("h1", "running")
            assert placed(fleet.client).count(("roamer", 1, 128)) == 1  # moved and woken, not recreated
            assert [m["state"] for m in fleet.client.moves.list()] == ["done"]
            assert fleet.client.hosts.get("h3").allocated.ram_mb == sum(fillers)  # never past its room
    finally:
        other.stop()


@pytest.mark.parametrize("kind, held, after", [
    ("deprovision", ("DELETE", "/v1/vms/slow"), "deleted"),
    ("deallocate", ("POST", "/v1/vms/slow/sleep"), "sleeping"),
])
def test_a_pending_handle_waited_on_by_another_service_follows_the_call_it_names(fleet, gate, kind, held, after):
    """(review 27: a service that never held the operation answered FAILED at once, "nothing is
    under way", while the call its handle names was still under way at the controller)"""
    import threading
    svc = gated(gate)
    p = {"vmName": "slow", "vcpus": 1, "memMiB": 128}
    with svc:
        assert provision(svc, p)[0] == Status.SUCCEEDED
        gate.hold(*held)
        status, handle = getattr(svc, f"{kind}_host")(p)
        assert status == Status.PENDING and handle.get("fuseOperationHost"), handle
    releaser = threading.Timer(1.0, gate.release)
    releaser.start()
    try:
        with service(fleet, pollTimeout=20) as other:  # built after: it never held the operation
            status, info = other.wait_host_deployment(handle, is_setup=False)
        assert status == Status.SUCCEEDED and info["vmState"] == after, (status, info)
    finally:
        releaser.cancel()
        gate.release()
