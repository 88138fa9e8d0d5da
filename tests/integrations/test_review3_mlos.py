"""`FuseVMService` against seed 002's sentences, from a third review:
provision_host, deprovision_host and deallocate_host answer `(Status, {})`
("The result is always {}"), PENDING included; wait_host_deployment follows
the operation from the plain params, and from the `{}` itself, which is what
mlos_bench's `HostEnv` passes it. A real controller and agent (fake backend)."""

from __future__ import annotations

import pytest

pytest.importorskip("mlos_bench", reason="mlos_bench is not installed (pip install 'fuse-fleet[mlos]')")

from mlos_bench.environments.remote.host_env import HostEnv  # noqa: E402
from mlos_bench.environments.status import Status  # noqa: E402
from mlos_bench.tunables.tunable_groups import TunableGroups  # noqa: E402

from fuse.integrations.mlos import FuseVMService  # noqa: E402
# the shared builders of the service's tests: a controller and a fake-backend agent, a gated proxy
import test_mlos as shared  # noqa: E402

fleet, gate = shared.fleet, shared.gate  # (fixtures, found by name in this module)
gated, service, vms = shared.gated, shared.service, shared.vms

pytestmark = pytest.mark.timeout(150)

P = {"vmName": "r3", "vcpus": 1, "memMiB": 128}


def test_every_operation_answers_an_empty_result_whatever_its_status(fleet):
    svc = service(fleet)
    with svc:
        assert svc.provision_host(P) == (Status.PENDING, {})            # it was the params plus a handle
        status, info = svc.wait_host_deployment(P, is_setup=True)       # the plain params are enough
        assert status == Status.SUCCEEDED and (info["operation"], info["vmName"], info["vmState"]) == (
            "provision", "r3", "running")
        assert svc.provision_host(P) == (Status.SUCCEEDED, {})
        assert svc.provision_host({**P, "memMiB": 256}) == (Status.PENDING, {})
        assert svc.wait_host_deployment({**P, "memMiB": 256}, is_setup=True)[0] == Status.SUCCEEDED
        assert svc.deallocate_host(P) == (Status.SUCCEEDED, {})
        assert svc.provision_host(P) == (Status.PENDING, {})            # recreated as 1 x 128 (it slept as 1 x 256)
        assert svc.wait_host_deployment(P, is_setup=True)[0] == Status.SUCCEEDED
        assert svc.deprovision_host(P) == (Status.SUCCEEDED, {})
        assert svc.deallocate_host(P) == (Status.FAILED, {})
        assert svc.provision_host({"vmName": "r3"}) == (Status.FAILED, {})
        assert svc.provision_host({**P, "memMiB": 1_048_576}) == (Status.PENDING, {})
        assert svc.wait_host_deployment({**P, "memMiB": 1_048_576}, is_setup=True) == (Status.FAILED, {})


def test_a_wait_given_the_empty_result_follows_the_operation_that_returned_it(fleet):
    # mlos_bench's HostEnv.setup: `(status, params) = provision_host(...)`, then, when
    # PENDING, `wait_host_deployment(params, is_setup=True)` with those params: {}.
    svc = service(fleet)
    with svc:
        status, out = svc.provision_host(P)
        assert (status, out) == (Status.PENDING, {})
        status, info = svc.wait_host_deployment(out, is_setup=True)
        assert status == Status.SUCCEEDED and (info["vmName"], info["vmHost"], info["vmState"]) == (
            "r3", "h1", "running")
        assert vms(fleet.client) == [("r3", "running", 1, 128)]


def test_a_wait_given_nothing_to_follow_is_failed_with_the_reason(fleet, caplog):
    svc = service(fleet)
    with svc:
        assert svc.wait_host_deployment({}, is_setup=True) == (Status.FAILED, {})
    assert "params lack vmName, and this service was asked for no operation to wait for" in caplog.text


def test_a_wait_of_the_other_kind_on_the_empty_result_is_failed_and_leaves_the_operation(fleet, caplog):
    svc = service(fleet)
    with svc:
        assert svc.provision_host(P) == (Status.PENDING, {})
        assert svc.wait_host_deployment({}, is_setup=False) == (Status.FAILED, {})
        assert "for vm r3, whose last operation here is a provision" in caplog.text
        assert svc.wait_host_deployment({}, is_setup=True)[0] == Status.SUCCEEDED


@pytest.mark.parametrize("kind, held, after", [
    ("deprovision", ("DELETE", "/v1/vms/r3"), []),
    ("deallocate", ("POST", "/v1/vms/r3/sleep"), [("r3", "sleeping", 1, 128)]),
], ids=["a deprovision past pollTimeout is waited on from its empty result",
        "a deallocate past pollTimeout is waited on from its empty result, as a deallocate"])
def test_a_teardown_pending_past_poll_timeout_is_followed_from_its_empty_result(fleet, gate, kind, held, after):
    # HostEnv.teardown: deprovision_host, then wait_host_deployment(its result, is_setup=False).
    svc = gated(gate)
    with svc:
        assert svc.provision_host(P) == (Status.PENDING, {})
        assert svc.wait_host_deployment({}, is_setup=True)[0] == Status.SUCCEEDED
        arrived = gate.hold(*held)
        status, out = getattr(svc, f"{kind}_host")(P)
        assert (status, out) == (Status.PENDING, {}) and arrived.is_set()
        gate.release()
        status, info = svc.wait_host_deployment(out, is_setup=False)
        assert status == Status.SUCCEEDED and (info["operation"], info["vmName"], info["vmState"]) == (
            kind, "r3", after[0][1] if after else "deleted")
        assert vms(fleet.client) == after


class Recording(FuseVMService):
    """The service, noting what mlos_bench hands its waits."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.waited: list[tuple[dict, bool]] = []

    def wait_host_deployment(self, params: dict, *, is_setup: bool):
        self.waited.append((dict(params), is_setup))
        return super().wait_host_deployment(params, is_setup=is_setup)


def test_host_env_sets_up_and_tears_down_through_the_empty_result(fleet):
    svc = Recording({"url": fleet.ctl.url, "pollInterval": 0.05, "pollTimeout": 30})
    env = HostEnv(name="fuse", config={"const_args": P}, tunables=TunableGroups(), service=svc)
    with svc, env:
        assert env.setup(TunableGroups())
        assert svc.waited == [({}, True)]  # provision was PENDING: HostEnv waited on its {}
        assert vms(fleet.client) == [("r3", "running", 1, 128)]
        env.teardown()
    assert vms(fleet.client) == []
