"""The probe reads the real machine; vendor-tool parsers are checked on
recorded output."""

from __future__ import annotations

import os
from pathlib import Path

from fuse.agent import probe

NVIDIA_CSV = """NVIDIA A100-SXM4-80GB, GPU-5c1a, 00000000:07:00.0, 81920, 550.54.15, Enabled
NVIDIA A100-SXM4-80GB, GPU-7d2b, 00000000:0F:00.0, 81920, 550.54.15, Enabled
"""
LGIP = """+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     7/7        9.50       No     14     0     0   |
|   0  MIG 1g.10gb+me    20     1/1        9.50       No     14     1     0   |
|   0  MIG 7g.80gb        0     1/1        79.00      No     98     5     0   |
|   1  MIG 1g.10gb       19     7/7        9.50       No     14     0     0   |
+-----------------------------------------------------------------------------+
"""


def test_real_machine_facts(tmp_path):
    facts = probe.probe(tmp_path)
    assert facts["cpus"] == probe.usable_cpus() and 1 <= facts["cpus"] <= os.cpu_count()
    meminfo_kib = int(next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")).split()[1])
    assert facts["ram_mb"] == meminfo_kib // 1024
    assert facts["storage_gb"] == os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize // 2**30
    assert facts["arch"] in ("amd64", "arm64")
    assert facts["kvm"] == probe.kvm_device_answers()
    assert facts["firecracker_pinned"].startswith("v")


def test_cgroup_quota_caps_cpus(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert probe.usable_cpus(tmp_path) == min(len(os.sched_getaffinity(0)), 2)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert probe.usable_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_nvidia_smi_and_mig_parsers():
    gpus = probe.parse_nvidia_gpus(NVIDIA_CSV)
    assert [g["uuid"] for g in gpus] == ["GPU-5c1a", "GPU-7d2b"] and gpus[0]["memory_mb"] == 81920
    assert probe.gpu_kind_label(gpus[0]["model"]) == "nvidia:A100"
    assert probe.parse_mig_profiles(LGIP) == {"1g.10gb": 14, "1g.10gb+me": 1, "7g.80gb": 1}


def test_firecracker_absent_reports_empty_release(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert probe.firecracker_release() == ""
