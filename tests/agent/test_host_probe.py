"""What a host says of itself: `GET /v1/host` and `fuse host probe` report
usable KVM (what the backend's boot probe settled on), the raw /dev/kvm
answer apart, and the bundles built here. The device and the boot probe are
stood in for, so the answers do not depend on this machine's KVM."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from agent_support import install_bundle
from fuse.agent import probe
from fuse.agent.app import AgentConfig, create_app
from fuse.agent.backends.qemu import QemuBackend
from fuse.cli.main import app as cli

CASES = [  # /dev/kvm answers, a KVM guest boots -> kvm, accel
    (True, True, True, "kvm"),
    (True, False, False, "tcg"),  # a nested PVM KVM: the device answers, the kernel never boots
    (False, False, False, "tcg"),
]
IDS = ["a device that boots a guest is usable KVM", "a device that answers but boots nothing is not",
       "no device is no KVM"]


@pytest.fixture
def machine(tmp_path, monkeypatch, bundle_dir):
    """``machine(device, boots)`` -> a state dir with the real bundle, on a
    stand-in machine; returns the list the boot probe records its runs in."""
    monkeypatch.setenv("FUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSE_QEMU_ACCEL", raising=False)
    state = tmp_path / "state"
    install_bundle(bundle_dir, state)
    probes: list[str] = []

    def setup(device: bool, boots: bool):
        monkeypatch.setattr(probe, "kvm_device_answers", lambda dev="/dev/kvm": device)
        monkeypatch.setattr(QemuBackend, "_boot_probe", lambda self, b: probes.append(b.name) or boots)
        return state, probes
    return setup


@pytest.mark.parametrize("device, boots, kvm, accel", CASES, ids=IDS)
def test_the_host_api_reports_usable_kvm_and_the_device_apart(machine, device, boots, kvm, accel):
    state, probes = machine(device, boots)
    with TestClient(create_app(AgentConfig(state_dir=state, backend="qemu"))) as c:
        host = c.get("/v1/host").json()
    assert (host["kvm"], host["kvm_device"], host["accel"]) == (kvm, device, accel)
    assert [b["name"] for b in host["bundles"]] == ["linux"]
    assert probes == (["linux"] if device else [])  # nothing to try without a device


@pytest.mark.parametrize("device, boots, kvm, accel", CASES, ids=IDS)
def test_host_probe_prints_what_the_agent_reports_without_serving(machine, device, boots, kvm, accel):
    state, probes = machine(device, boots)
    r = CliRunner().invoke(cli, ["host", "probe", "--state-dir", str(state), "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.output)
    assert (facts["kvm"], facts["kvm_device"], facts["accel"], facts["backend"]) == (kvm, device, accel, "qemu")
    assert [b["name"] for b in facts["bundles"]] == ["linux"] and len(facts["bundles"][0]["fingerprint"]) == 64
    assert facts["cpus"] == probe.usable_cpus()

    # The answer is the agent's cached one: the next probe (or agent) boots nothing.
    with TestClient(create_app(AgentConfig(state_dir=state, backend="qemu"))) as c:
        assert c.get("/v1/host").json()["kvm"] == kvm
    r = CliRunner().invoke(cli, ["host", "probe", "--state-dir", str(state)])
    assert r.exit_code == 0 and "linux (" in r.output, r.output
    assert probes == (["linux"] if device else [])
