"""Host registry, from review 29 (issue 2): a vendor tool that is installed but fails or
times out (nvidia-smi after a driver upgrade, a slow `firecracker --version`) is not a
machine without GPUs or Firecracker. The agent keeps what an earlier probe read, or none
at its start, and the registration says so in a warning naming the tool."""

from __future__ import annotations

import contextlib
import os

import httpx

import fuse
from fuse import HostCapacity
from support import start_agent, start_controller, wait_until

# Each stand-in reads marker files the test touches: "fail" or "slow" (past the probe's 10 s).
NVIDIA_SMI = """#!/bin/sh
if [ -e "{dir}/fail" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"; echo "NVML library version: 550.90"; exit 18
fi
if [ -e "{dir}/slow" ]; then sleep 11; fi
echo "NVIDIA A100-SXM4-80GB, GPU-aaaa, 00000000:07:00.0, 81920, 535.104.05, Disabled"
"""
FIRECRACKER = """#!/bin/sh
if [ -e "{dir}/slow" ]; then sleep 11; fi
echo "Firecracker v1.10.1"
"""
MISMATCH = "nvidia-smi exited with status 18 (Failed to initialize NVML: Driver/library version mismatch)"


def machine(tmp_path, **tools: str) -> dict[str, str]:
    """The agent's environment, with each stand-in tool on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in tools.items():
        (bin_dir / name.replace("_", "-")).write_text(script.format(dir=tmp_path))
        (bin_dir / name.replace("_", "-")).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "FUSE_FRESH_PROBE_S": "1"}


@contextlib.contextmanager
def fleet(tmp_path, **tools: str):
    """(agent, client): a fake-backend agent with the stand-in ``tools`` and a controller."""
    agent = start_agent(tmp_path, backend="fake", name="a1", env=machine(tmp_path, **tools))
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        yield agent, client
    finally:
        client.close()
        ctl.stop()
        agent.stop()


def register(client, agent, backend="qemu"):
    return client.hosts.register(fuse.RegisterHostRequest(
        id="h1", url=agent.url, token=agent.token, backend=backend, capacity=HostCapacity(vm_count=2)))


def ended_with_warnings(agent) -> list[str]:
    """The agent's facts once a background probe has ended with a warning (none before)."""
    return httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"},
                     timeout=5).json().get("probe_warnings")


def test_a_failing_nvidia_smi_keeps_the_gpus_and_says_why(tmp_path):
    with fleet(tmp_path, nvidia_smi=NVIDIA_SMI) as (agent, client):
        assert register(client, agent).capacity.gpus == 1
        (tmp_path / "fail").touch()
        # (was: gpus 0, gpu_kind "", no devices, and no warning)
        host = register(client, agent)
        assert (host.capacity.gpus, host.capacity.gpu_kind, len(host.capacity.gpu_devices)) == (1, "nvidia:A100", 1)
        assert f"the host agent at {agent.url}: {MISMATCH}: the GPU facts stay those an earlier probe read " \
               "(gpus 1, gpu_kind nvidia:A100)" in host.warnings, host.warnings
        (tmp_path / "fail").unlink()
        host = register(client, agent)
        assert host.capacity.gpus == 1 and not [w for w in host.warnings if "nvidia-smi" in w], host.warnings


def test_an_nvidia_smi_failing_from_the_start_registers_no_gpus_with_a_warning(tmp_path):
    (tmp_path / "fail").touch()
    with fleet(tmp_path, nvidia_smi=NVIDIA_SMI) as (agent, client):
        host = register(client, agent)
        assert host.capacity.gpus == 0
        assert f"the host agent at {agent.url}: {MISMATCH}: no GPUs are reported until it answers" in host.warnings
        (tmp_path / "fail").unlink()
        host = register(client, agent)  # (the fresh probe reads them once it answers)
        assert host.capacity.gpus == 1 and not [w for w in host.warnings if "nvidia-smi" in w], host.warnings


def test_a_background_probe_past_nvidia_smis_time_keeps_the_start_up_gpus(tmp_path):
    with fleet(tmp_path, nvidia_smi=NVIDIA_SMI) as (agent, client):
        (tmp_path / "slow").touch()
        host = register(client, agent)  # overruns 1 s: the start-up facts, said
        assert host.capacity.gpus == 1
        assert [w for w in host.warnings if "facts probed when the agent started" in w], host.warnings
        # (was: that probe timed out on nvidia-smi and wrote gpus 0 into the agent's facts)
        said = wait_until(lambda: ended_with_warnings(agent), timeout=30, what="the background probe")
        assert said == ["nvidia-smi did not answer within 10 s: the GPU facts stay those an earlier probe read "
                        "(gpus 1, gpu_kind nvidia:A100)"]
        host = register(client, agent)  # overruns again: the facts of the probe that ended
        assert (host.capacity.gpus, host.capacity.gpu_kind) == (1, "nvidia:A100")
        assert f"the host agent at {agent.url}: {said[0]}" in host.warnings, host.warnings
        # (was: "these are the facts probed when the agent started", which they no longer were)
        assert [w for w in host.warnings if "facts of its last probe to finish" in w], host.warnings
        assert not [w for w in host.warnings if "when the agent started" in w], host.warnings


def test_a_slow_firecracker_version_keeps_the_release(tmp_path):
    with fleet(tmp_path, firecracker=FIRECRACKER) as (agent, client):
        assert register(client, agent, backend="firecracker").capacity.firecracker == "v1.10.1"
        (tmp_path / "slow").touch()
        assert register(client, agent, backend="firecracker").capacity.firecracker == "v1.10.1"
        said = wait_until(lambda: ended_with_warnings(agent), timeout=30, what="the background probe")
        # (was: "" once that probe ended, which moves compare across hosts)
        host = register(client, agent, backend="firecracker")
        assert host.capacity.firecracker == "v1.10.1"
        assert said == ["firecracker --version did not answer within 10 s: the Firecracker release stays v1.10.1, "
                        "as an earlier probe read it"]
        assert f"the host agent at {agent.url}: {said[0]}" in host.warnings, host.warnings
