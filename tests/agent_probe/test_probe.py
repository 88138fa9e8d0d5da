"""The probe reads the real machine; vendor-tool parsers are checked on
recorded output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    # the free space of the state dir's file system (the foundation issue), not its size
    st = os.statvfs(tmp_path)
    assert abs(facts["storage_gb"] - st.f_bavail * st.f_frsize // 2**30) <= 1
    assert facts["arch"] in ("amd64", "arm64")
    assert facts["kvm"] == probe.kvm_device_answers()
    assert facts["firecracker_pinned"].startswith("v")


def machine(tmp: Path, proc_self_cgroup: str, files: dict[str, str]) -> Path:
    """A fake / holding a recorded /proc/self/cgroup and cgroup files."""
    (tmp / "proc/self").mkdir(parents=True)
    (tmp / "proc/self/cgroup").write_text(proc_self_cgroup)
    (tmp / "sys/fs/cgroup").mkdir(parents=True)
    for rel, text in files.items():
        (tmp / "sys/fs/cgroup" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "sys/fs/cgroup" / rel).write_text(text)
    return tmp


V1_LINES = """12:pids:/user.slice
4:memory:/docker/abc
3:cpu,cpuacct:/docker/abc
0::/docker/abc
"""

CGROUPS = {
    "v2, quota on the agent's own cgroup": (
        "0::/system.slice/fuse-agent.service\n",
        {"cpu.max": "max 100000\n", "system.slice/cpu.max": "max 100000\n",
         "system.slice/fuse-agent.service/cpu.max": "150000 100000\n"}, 2),
    "v2, a parent's quota is tighter than the leaf's": (
        "0::/system.slice/fuse-agent.service\n",
        {"system.slice/cpu.max": "100000 100000\n", "system.slice/fuse-agent.service/cpu.max": "400000 100000\n"}, 1),
    "v2, no quota anywhere": (
        "0::/user.slice/session-1.scope\n",
        {"cpu.max": "max 100000\n", "user.slice/cpu.max": "max 100000\n"}, None),
    "v2 in a cgroup namespace, the mount shows only the container": (
        "0::/\n", {"cpu.max": "300000 100000\n"}, 3),
    "v2 on a hybrid host, under unified": (
        "1:name=systemd:/\n0::/fuse.slice\n", {"unified/fuse.slice/cpu.max": "50000 100000\n"}, 1),
    "v1, cpu,cpuacct quota on the agent's cgroup": (
        V1_LINES, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
                   "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                   "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3),
    "v1, unlimited (-1)": (
        V1_LINES, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
                   "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, None),
    "v1, a separate cpu mount": (
        "2:cpuacct:/job\n1:cpu:/job\n0::/\n",
        {"cpu/job/cpu.cfs_quota_us": "400000\n", "cpu/job/cpu.cfs_period_us": "100000\n"}, 4),
    "v1 in a container, the mount shows only its own subtree": (
        V1_LINES, {"cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 2),
    "v1 and v2 both limit, the tighter wins": (
        V1_LINES, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "600000\n",
                   "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                   "docker/abc/cpu.max": "200000 100000\n"}, 2),
    "a quota below one CPU still leaves one": (
        "0::/tiny\n", {"tiny/cpu.max": "10000 100000\n"}, 1),
    "the cgroup path leaves the namespace": (
        "0::/../../other\n", {"cpu.max": "200000 100000\n", "other/cpu.max": "100000 100000\n"}, 2),
}


@pytest.mark.parametrize("proc,files,limit", CGROUPS.values(), ids=CGROUPS.keys())
def test_cgroup_cpu_limit_reads_the_processs_own_cgroup(tmp_path, proc, files, limit):
    assert probe.cgroup_cpu_limit(machine(tmp_path, proc, files)) == limit


def test_cgroup_quota_caps_cpus(tmp_path):
    root = machine(tmp_path, "0::/agent\n", {"agent/cpu.max": "100000 100000\n"})
    assert probe.usable_cpus(root) == 1
    (root / "sys/fs/cgroup/agent/cpu.max").write_text("max 100000\n")
    assert probe.usable_cpus(root) == len(os.sched_getaffinity(0))


def test_no_procfs_reads_the_cgroup_mount(tmp_path):
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("100000 100000\n")
    assert probe.cgroup_cpu_limit(tmp_path) == 1


# Recorded on two A100-80GB in MIG mode with instances already created: on
# GPU 0 four 1g.10gb and one 2g.20gb exist, GPU 1 is untouched; the second
# line of each profile (CE, JPEG, OFA) must not count.
LGIP_IN_USE = """+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     1/7        9.50       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     0/1        9.50       No     14     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.20gb       14     0/3        19.50      No     28     1     0   |
|                                                             2     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     0/1        79.25      No     98     5     0   |
|                                                             7     1     1   |
+-----------------------------------------------------------------------------+
|   1  MIG 1g.10gb       19     7/7        9.50       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   1  MIG 2g.20gb       14     3/3        19.50      No     28     1     0   |
|                                                             2     0     0   |
+-----------------------------------------------------------------------------+
"""


def test_mig_profiles_count_total_instances_not_free_ones():
    assert probe.parse_mig_profiles(LGIP_IN_USE) == {"1g.10gb": 14, "1g.10gb+me": 1, "2g.20gb": 6, "7g.80gb": 1}


def test_nvidia_smi_and_mig_parsers():
    gpus = probe.parse_nvidia_gpus(NVIDIA_CSV)
    assert [g["uuid"] for g in gpus] == ["GPU-5c1a", "GPU-7d2b"] and gpus[0]["memory_mb"] == 81920
    assert probe.gpu_kind_label(gpus[0]["model"]) == "nvidia:A100"
    assert probe.parse_mig_profiles(LGIP) == {"1g.10gb": 14, "1g.10gb+me": 1, "7g.80gb": 1}


GPU_LABELS = [
    ("NVIDIA A100-SXM4-80GB", "nvidia:A100"), ("NVIDIA L40", "nvidia:L40"), ("NVIDIA L40S", "nvidia:L40S"),
    ("NVIDIA L4", "nvidia:L4"), ("NVIDIA GH200 480GB", "nvidia:GH200"), ("NVIDIA H200", "nvidia:H200"),
    ("NVIDIA H100 80GB HBM3", "nvidia:H100"), ("NVIDIA A10G", "nvidia:A10G"), ("NVIDIA A10", "nvidia:A10"),
    ("Tesla T4", "nvidia:T4"), ("Tesla V100-SXM2-16GB", "nvidia:V100"), ("NVIDIA B200", "nvidia:B200"),
    ("NVIDIA RTX A6000", "nvidia:NVIDIA RTX A6000"), ("", ""),
]


@pytest.mark.parametrize("model,label", GPU_LABELS,
                         ids=[f"{m or 'no model'} is labelled {l or 'nothing'}" for m, l in GPU_LABELS])
def test_gpu_kind_label_matches_whole_model_names(model, label):
    assert probe.gpu_kind_label(model) == label


def test_firecracker_absent_reports_empty_release(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert probe.firecracker_release() == ""


def stand_in(tmp: Path, monkeypatch, name: str, script: str) -> None:
    """`name` on PATH as a shell script, ahead of any real one."""
    (tmp / "bin").mkdir(exist_ok=True)
    (tmp / "bin" / name).write_text("#!/bin/sh\n" + script)
    (tmp / "bin" / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp / 'bin'}:{os.environ['PATH']}")


MISMATCH = 'echo "Failed to initialize NVML: Driver/library version mismatch"; echo "NVML library version: 550.90"; exit 18\n'
KNOWN = {"gpus": 2, "gpu_kind": "nvidia:A100", "gpu_devices": probe.parse_nvidia_gpus(NVIDIA_CSV),
         "mig_profiles": {"1g.10gb": 14}, "firecracker": "v1.10.1"}


def test_a_failing_nvidia_smi_is_not_a_machine_without_gpus(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, "nvidia-smi", MISMATCH)
    said = ("nvidia-smi exited with status 18 (Failed to initialize NVML: Driver/library version mismatch): ")
    # At start-up nothing is known: none, but said (was: none, in silence).
    facts = probe.probe(tmp_path)
    assert (facts["gpus"], facts["gpu_kind"], facts["gpu_devices"], facts["mig_profiles"]) == (0, "", [], {})
    assert facts["probe_warnings"] == [said + "no GPUs are reported until it answers"]
    # A later probe keeps what an earlier one read (was: gpus 0 over the 2 the machine has).
    facts = probe.probe(tmp_path, KNOWN)
    assert {k: facts[k] for k in probe.NO_GPUS} == {k: KNOWN[k] for k in probe.NO_GPUS}
    assert facts["probe_warnings"] == [said + "the GPU facts stay those an earlier probe read (gpus 2, "
                                              "gpu_kind nvidia:A100)"]


def test_a_failing_mig_listing_keeps_the_gpus_nvidia_smi_listed(tmp_path, monkeypatch):
    """(diff review 29: a failing `nvidia-smi mig -lgip` threw away the GPUs the first call listed:
    0 GPUs at start-up, where the release before reported them)"""
    csv = tmp_path / "gpus.csv"
    csv.write_text(NVIDIA_CSV)
    stand_in(tmp_path, monkeypatch, "nvidia-smi", f'[ "$1" = mig ] && {{ echo "Insufficient Permissions" >&2; exit 4; }}\n'
                                                  f'cat {csv}\n')
    said = "nvidia-smi mig -lgip exited with status 4 (Insufficient Permissions): the GPUs it listed stand; "
    facts = probe.probe(tmp_path)
    assert (facts["gpus"], facts["gpu_kind"], len(facts["gpu_devices"]), facts["mig_profiles"]) == \
        (2, "nvidia:A100", 2, {})
    assert facts["probe_warnings"] == [said + "their MIG profiles are not reported until it answers"]
    facts = probe.probe(tmp_path, KNOWN)
    assert (facts["gpus"], facts["mig_profiles"]) == (2, {"1g.10gb": 14})
    assert facts["probe_warnings"] == [said + "their MIG profiles stay {'1g.10gb': 14}, as an earlier probe read them"]


def test_a_failing_firecracker_keeps_the_release_an_earlier_probe_read(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, "firecracker", 'echo "error: cannot open /dev/kvm" >&2; exit 1\n')
    facts = probe.probe(tmp_path, KNOWN)
    assert facts["firecracker"] == "v1.10.1"
    assert facts["probe_warnings"] == ["firecracker --version exited with status 1 (error: cannot open /dev/kvm): "
                                       "the Firecracker release stays v1.10.1, as an earlier probe read it"]


def test_a_tool_past_its_time_is_named_with_the_time_and_its_first_line(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, "nvidia-smi", 'echo "waiting for the GPUs to initialise" >&2; sleep 5\n')
    with pytest.raises(probe.ToolFailed) as exc:
        probe._run(["nvidia-smi", "--query-gpu=name", "--format=csv"], timeout=0.5)
    assert str(exc.value) == "nvidia-smi did not answer within 0.5 s (waiting for the GPUs to initialise)"


def test_tools_not_installed_are_none_without_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(probe.shutil, "which", lambda name: None)
    facts = probe.probe(tmp_path, KNOWN)
    assert (facts["gpus"], facts["firecracker"], facts["qemu_version"], facts["probe_warnings"]) == (0, "", "", [])
