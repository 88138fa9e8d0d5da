"""The probe, from review 31 (finding 1): a vendor tool that prints a byte that is not
UTF-8 (a GPU's name in another encoding) is read, not a crash; and `firecracker --version`
printed without its `v` (`Firecracker 1.12.0`) is that release, not none."""

from __future__ import annotations

import os

import httpx
import pytest

import fuse
from fuse import HostCapacity
from fuse.agent import probe
from support import start_agent, start_controller

# The stand-in reads a marker file the test touches: "bad" makes it print a byte that is not UTF-8.
NVIDIA_SMI = """#!/bin/sh
[ "$1" = mig ] && exit 0
if [ -e "{dir}/bad" ]; then
  printf 'NVIDIA A100\\377, GPU-aaaa, 00000000:07:00.0, 81920, 535.54.03, Disabled\\n'; exit 0
fi
echo "NVIDIA A100-SXM4-80GB, GPU-aaaa, 00000000:07:00.0, 81920, 535.54.03, Disabled"
"""


def stand_in(tmp_path, name: str, script: str) -> dict[str, str]:
    """The environment with ``name`` on PATH as the shell ``script``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script.format(dir=tmp_path))
    (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def test_an_agent_starts_when_nvidia_smi_prints_a_byte_that_is_not_utf8(tmp_path):
    (tmp_path / "bad").touch()
    # (was: `fuse host serve` exited 1 with a UnicodeDecodeError traceback)
    agent = start_agent(tmp_path, backend="fake", name="a1", env=stand_in(tmp_path, "nvidia-smi", NVIDIA_SMI))
    try:
        facts = httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"},
                          timeout=10).json()
        assert (facts["gpus"], facts["gpu_kind"], facts["probe_warnings"]) == (1, "nvidia:A100", [])
        assert facts["gpu_devices"][0]["model"] == "NVIDIA A100\ufffd"
    finally:
        agent.stop()


def test_a_registration_reads_an_nvidia_smi_that_turned_to_print_a_byte_that_is_not_utf8(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1", env=stand_in(tmp_path, "nvidia-smi", NVIDIA_SMI))
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        (tmp_path / "bad").touch()
        # (was: the fresh probe answered 500, and the controller said "not a fuse agent": 502)
        host = client.hosts.register(fuse.RegisterHostRequest(
            id="h1", url=agent.url, token=agent.token, backend="qemu", capacity=HostCapacity(vm_count=2)))
        assert (host.capacity.gpus, host.capacity.gpu_kind) == (1, "nvidia:A100")
        assert host.capacity.gpu_devices[0].model == "NVIDIA A100\ufffd"
        assert agent.popen.poll() is None
    finally:
        client.close()
        ctl.stop()
        agent.stop()


@pytest.mark.parametrize("printed, release", [
    ("Firecracker v1.10.1", "v1.10.1"),
    ("Firecracker 1.12.0", "v1.12.0"),
    ("Firecracker v1.13.0-dev\\n\\nSupported snapshot data format versions: v1.0.0", "v1.13.0-dev"),
], ids=["the usual form", "a release printed without its v is that release",
        "the first release printed is the binary's"])
def test_firecracker_version_forms(tmp_path, monkeypatch, printed, release):
    monkeypatch.setenv("PATH", stand_in(tmp_path, "firecracker", f'#!/bin/sh\nprintf "{printed}\\n"\n')["PATH"])
    # (was: "" for `Firecracker 1.12.0`, without a word)
    facts = probe.probe(tmp_path)
    assert (facts["firecracker"], facts["probe_warnings"]) == (release, [])


def test_a_firecracker_that_prints_no_release_keeps_the_one_an_earlier_probe_read(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", stand_in(tmp_path, "firecracker", '#!/bin/sh\necho "Firecracker (dev build)"\n')["PATH"])
    facts = probe.probe(tmp_path, {"firecracker": "v1.10.1"})
    assert facts["firecracker"] == "v1.10.1"
    assert facts["probe_warnings"] == ["firecracker --version printed no release number (Firecracker (dev build)): "
                                       "the Firecracker release stays v1.10.1, as an earlier probe read it"]


def test_a_nul_a_tool_prints_is_read_as_a_replacement_character(tmp_path, monkeypatch):
    """(PostgreSQL stores no NUL: a GPU name holding one would fail the host's row)"""
    monkeypatch.setenv("PATH", stand_in(tmp_path, "nvidia-smi", """#!/bin/sh
printf 'NVIDIA A100\\000X, GPU-aaaa, 00000000:07:00.0, 81920, 535.54.03, Disabled\\n'
""")["PATH"])
    assert probe.probe_gpus()["gpu_devices"][0]["model"] == "NVIDIA A100\ufffdX"
