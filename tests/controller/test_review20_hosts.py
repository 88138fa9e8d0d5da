"""Host registry, from a black-box review of issue 2 (seed 000) against a real controller
and real agents (fake backend; a stand-in nvidia-smi on the agent's PATH where a GPU is
needed): the GPU inventory is what the agent reports, never a declared list; a declared
gpu_kind naming the probed GPU another way is no disagreement; a figure of 2.0 is refused
by the SDK as by the API; an uppercase scheme is a scheme; one action per call."""

from __future__ import annotations

import os

import httpx
import pytest
from pydantic import ValidationError

import fuse
from fuse import HostCapacity
from fuse.controller import hosts as registry
from fuse.transport import normalise_address
from support import start_agent, start_controller

FAKE_SMI = """#!/bin/sh
echo "NVIDIA A100-SXM4-80GB, GPU-aaaa, 00000000:07:00.0, 81920, 535.104.05, Disabled"
"""
DECLARED = {"gpu_devices": [{"model": "NVIDIA H100", "uuid": "GPU-declared"}],
            "mig_instances": [{"uuid": "MIG-1", "profile": "not-a-profile", "parent_gpu_uuid": "GPU-declared"}],
            "mig_instance_uuids": ["MIG-1"]}


@pytest.fixture
def gpu_fleet(tmp_path):
    """A controller and one agent whose machine has an A100 (by its nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    agent = start_agent(tmp_path, backend="fake", name="a1",
                        env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    yield agent, client, ctl
    client.close()
    ctl.stop()
    agent.stop()


def register(client, agent, host_id, backend, **cap):
    return client.hosts.register(fuse.RegisterHostRequest(
        id=host_id, url=agent.url, token=agent.token, backend=backend,
        capacity=HostCapacity.model_validate({"vm_count": 2, **cap})))


@pytest.mark.parametrize("backend", ["firecracker", "qemu"])
def test_a_declared_gpu_inventory_is_ignored_with_a_warning_and_the_probes_is_stored(gpu_fleet, backend):
    agent, client, _ = gpu_fleet
    host = register(client, agent, "h1", backend, **DECLARED)
    stored = client.hosts.get("h1").capacity
    # (was: the declared H100, MIG instance of no profile and allocated-side uuid, stored as given)
    assert [d.uuid for d in stored.gpu_devices] == (["GPU-aaaa"] if backend == "qemu" else [])
    assert stored.mig_instances == [] and stored.mig_instance_uuids == []
    said = sorted(w.split(":")[0] for w in host.warnings if "never declared" in w)
    assert said == ["capacity.gpu_devices", "capacity.mig_instance_uuids", "capacity.mig_instances"], host.warnings


@pytest.mark.parametrize("declared", ["A100", "nvidia:A100", "nvidia:a100", "NVIDIA A100-SXM4-80GB"])
def test_a_declared_gpu_kind_naming_the_probed_gpu_registers_without_a_warning(gpu_fleet, declared):
    agent, client, _ = gpu_fleet
    host = register(client, agent, "h1", "qemu", gpu_kind=declared)
    assert not [w for w in host.warnings if w.startswith("capacity.gpu_kind")], host.warnings
    assert client.hosts.get("h1").capacity.gpu_kind == declared  # (the declared label is kept)


def test_a_declared_gpu_kind_naming_another_gpu_still_warns(gpu_fleet):
    agent, client, _ = gpu_fleet
    host = register(client, agent, "h1", "qemu", gpu_kind="H100")
    assert [w for w in host.warnings if w.startswith("capacity.gpu_kind")] == [
        "capacity.gpu_kind: declared 'H100' differs from probed 'nvidia:A100'; keeping the declared value"]


def test_an_inventory_declared_for_an_unreachable_agent_is_not_stored():
    warnings: list[str] = []
    out = registry.merge_capacity(HostCapacity.model_validate({"vm_count": 2, "cpus": 2, "ram_mb": 512,
                                                               "storage_gb": 1, **DECLARED}), "qemu", None, warnings)
    assert out.gpu_devices == [] and out.mig_instances == [] and out.mig_instance_uuids == []
    assert len([w for w in warnings if "never declared" in w]) == 3, warnings


@pytest.mark.parametrize("field", ["cpus", "ram_mb", "storage_gb", "vm_count", "gpus"])
def test_the_sdk_refuses_a_figure_of_2_point_0_as_the_api_does(field):
    with pytest.raises(ValidationError):
        HostCapacity(**{field: 2.0})


def test_an_uppercase_scheme_is_the_scheme_and_is_stored_in_lower_case(gpu_fleet):
    agent, client, _ = gpu_fleet
    url = agent.url.replace("http://", "HTTP://")
    assert normalise_address(url) == agent.url
    host = client.hosts.register(fuse.RegisterHostRequest(id="h1", url=url, token=agent.token, backend="qemu",
                                                          capacity=HostCapacity(vm_count=2)))
    assert host.url == agent.url  # (was 400: "not an address")


def test_a_host_action_given_twice_is_refused_and_changes_nothing(gpu_fleet):
    agent, client, ctl = gpu_fleet
    register(client, agent, "h1", "qemu")
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://c", timeout=10)
    r = http.post("/v1/hosts/h1", params=[("action", "cordon"), ("action", "uncordon")])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text  # (was 204: the last won)
    assert client.hosts.get("h1").state == "active"
