"""Read a host's hardware facts from the machine itself.

Every figure here comes from the kernel or a vendor tool, never from
configuration: the controller trusts these over an operator's guess.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import math
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# The Firecracker release this agent's firecracker backend is written and
# tested against (its API calls, snapshot format). Live migration needs the
# same release on both hosts.
FIRECRACKER_PINNED = "v1.10.1"

log = logging.getLogger(__name__)

# What a read of /proc or of the agent's own files fails with when the process or machine
# is short of something for a moment (file descriptors, kernel memory), not because the
# file says anything: the answer is "cannot tell now", never "none" (review 37).
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def transient(exc: OSError) -> bool:
    """Whether ``exc`` says the read could not be made now (say, at the fd limit), rather
    than anything of what was read."""
    return exc.errno in _TRANSIENT


_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_KVM_GET_API_VERSION = 0xAE00


def agent_affinity() -> set[int]:
    """The CPUs this process may run on: its main thread's mask, the one `taskset -p PID`
    sets. (Not the calling thread's own, `sched_getaffinity(0)`: a thread keeps the mask
    it was made with, so a worker made before the pin still has the old one.)"""
    return os.sched_getaffinity(os.getpid())


def usable_cpus(root: Path = Path("/")) -> int:
    """CPUs this process may use: its affinity mask (`agent_affinity`), capped by
    the tightest CPU quota of its own cgroup (see `cgroup_cpu_limit`)."""
    n = len(agent_affinity())
    limit = cgroup_cpu_limit(root)
    return n if limit is None else min(n, limit)


def cgroup_cpu_limit(root: Path = Path("/")) -> int | None:
    """The tightest CPU quota on this process, rounded up to whole CPUs
    (at least 1), or None when no quota is set.

    The cgroup is the process's own, read from /proc/self/cgroup: cgroup v2
    (`0::/path`) has `cpu.max` under /sys/fs/cgroup (or /sys/fs/cgroup/unified
    on hybrid hosts); cgroup v1's cpu controller line has `cpu.cfs_quota_us`
    and `cpu.cfs_period_us` under /sys/fs/cgroup/cpu,cpuacct or
    /sys/fs/cgroup/cpu. A quota binds on every ancestor too, so each level
    up to the mount is read; walking up also finds the limit in a container
    whose cgroup mount shows only its own subtree. `root` stands for / so
    tests can point it at recorded files.
    """
    fs = root / "sys/fs/cgroup"
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        if transient(exc):  # (read as no procfs, the quota would go unseen: more CPUs than there are)
            raise
        lines = ["0::/"]  # no procfs: at least the cgroup the mount shows
    quotas: list[float] = []
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, cgroup = rest.partition(":")
        if controllers == "":
            quotas += [q for d in _levels((fs, fs / "unified"), cgroup) if (q := _v2_quota(d)) is not None]
        elif "cpu" in controllers.split(","):
            mounts = (fs / controllers, fs / "cpu,cpuacct", fs / "cpu")
            quotas += [q for d in _levels(mounts, cgroup) if (q := _v1_quota(d)) is not None]
    if not quotas:
        return None
    return max(1, math.ceil(min(quotas)))


def _levels(mounts: tuple[Path, ...], cgroup: str) -> list[Path]:
    """The cgroup's directory and each ancestor's, under every mount that
    exists (mounts listed twice, e.g. through a symlink, count once)."""
    parts = [p for p in cgroup.strip().split("/") if p]
    if ".." in parts:  # a cgroup outside this namespace: only the mount's own view is ours
        parts = []
    seen, out = set(), []
    for mount in mounts:
        if not mount.is_dir() or (key := mount.resolve()) in seen:
            continue
        seen.add(key)
        out += [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return out


def _v2_quota(d: Path) -> float | None:
    """cpu.max is "<quota> <period>" or "max <period>"."""
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except OSError as exc:
        if transient(exc):
            raise
        return None
    except (ValueError, ZeroDivisionError):
        return None


def _v1_quota(d: Path) -> float | None:
    """cpu.cfs_quota_us is -1 when unlimited."""
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except OSError as exc:
        if transient(exc):
            raise
        return None
    except (ValueError, ZeroDivisionError):
        return None


def ram_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    return _meminfo_kib(meminfo, "MemTotal") // 1024


def mem_available_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    return _meminfo_kib(meminfo, "MemAvailable") // 1024


# (meminfo path, key) -> its last figure read, and the keys whose reads fail now
_last_meminfo: dict[tuple[str, str], int] = {}
_meminfo_unread: set[tuple[str, str]] = set()


def _meminfo_kib(meminfo: Path, key: str) -> int:
    """``key``'s figure in ``meminfo``. A read that cannot be made now (``transient``: an
    agent at its fd limit) gives the last figure read, logged once until a read works again:
    review 37 found ``GET /v1/host`` answering 500 then, which a controller's poller takes
    for a host gone (its creates in flight reported failed); with no figure read yet it raises."""
    at = (str(meminfo), key)
    try:
        text = meminfo.read_text()
    except OSError as exc:
        if not transient(exc) or at not in _last_meminfo:
            raise
        if at not in _meminfo_unread:
            _meminfo_unread.add(at)
            log.warning("%s cannot be read now (%s): its %s stays %d kB, as last read, until it can",
                        meminfo, exc.strerror or exc, key, _last_meminfo[at])
        return _last_meminfo[at]
    for line in text.splitlines():
        if line.startswith(key + ":"):
            if at in _meminfo_unread:
                _meminfo_unread.discard(at)
                log.info("%s is read again", meminfo)
            _last_meminfo[at] = value = int(line.split()[1])
            return value
    raise RuntimeError(f"{key} missing from {meminfo}")


def storage_gb(state_dir: Path) -> int:
    """Free space (GiB) of the file system holding the state dir, as the
    foundation issue says: the room VM images and snapshots have there."""
    return shutil.disk_usage(state_dir).free // 2**30


def arch() -> str:
    m = platform.machine()
    return _GOARCH.get(m, m)


def kvm_device_answers(dev: str = "/dev/kvm") -> bool:
    """True when /dev/kvm opens and answers KVM_GET_API_VERSION (12). Whether
    a stock guest kernel actually boots under it is the backend's boot probe
    (nested PVM KVMs answer here yet cannot run ordinary kernels)."""
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, _KVM_GET_API_VERSION) == 12
    except OSError:
        return False
    finally:
        os.close(fd)


class ToolFailed(Exception):
    """An installed vendor tool that exited non-zero or did not answer in time. What it
    reports is then unknown, not none: a machine whose nvidia-smi fails (a driver and
    library of two versions) still has its GPUs."""

    def __init__(self, cmd: list[str], how: str, output: str | bytes | None):
        if isinstance(output, bytes):  # (a timeout's partial output comes as bytes, text or not)
            output = output.decode(errors="replace")
        first = next((line.strip() for line in (output or "").splitlines() if line.strip()), "")
        # The tool as a person would type it: its options up to the first one with a value
        # (nvidia-smi's --query-gpu=... list says nothing the tool's name does not).
        shown = " ".join(cmd[:next((i for i, a in enumerate(cmd) if "=" in a), len(cmd))])
        super().__init__(f"{shown} {how}" + (f" ({first[:200]})" if first else ""))


def _run(cmd: list[str], timeout: float = 10) -> str | None:
    """The tool's output; None when it is not installed (the machine has none of what it
    reports). An installed one that fails or runs past ``timeout`` raises ToolFailed."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        # (what a tool prints is read, not checked: a stray byte that is not UTF-8 — a GPU's name in
        # another encoding, a locale's message — is U+FFFD, where a decode error ended the agent's
        # start and made a registration's fresh probe 500; so is a NUL, which PostgreSQL cannot store)
        out = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace",
                             timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ToolFailed(cmd, f"did not answer within {timeout:g} s", exc.stderr or exc.output) from None
    except OSError as exc:  # (on PATH and executable, yet it does not start: a bad interpreter line)
        raise ToolFailed(cmd, "could not be started", str(exc)) from None
    if out.returncode < 0:
        raise ToolFailed(cmd, f"was killed by signal {-out.returncode}", out.stderr or out.stdout)
    if out.returncode != 0:
        raise ToolFailed(cmd, f"exited with status {out.returncode}", out.stderr or out.stdout)
    return out.stdout.replace("\x00", "\ufffd")


def qemu_version() -> str:
    out = _run(["qemu-system-x86_64", "--version"]) or ""
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else ""


def firecracker_release() -> str:
    """`firecracker --version` prints e.g. "Firecracker v1.10.1" (some builds "Firecracker
    1.12.0", read as v1.12.0: moves compare releases across hosts); "" when no binary is on
    PATH. ToolFailed when one is and fails, or prints no release: its release is unknown, not none."""
    cmd = ["firecracker", "--version"]
    out = _run(cmd)
    if out is None:
        return ""
    m = re.search(r"(?<![\w.])v?(\d+\.\d+\.\d+\S*)", out)
    if m is None:
        raise ToolFailed(cmd, "printed no release number", out)
    return "v" + m.group(1)


def parse_nvidia_gpus(csv: str) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=name,uuid,pci.bus_id,memory.total,
    driver_version,mig.mode.current --format=csv,noheader,nounits`."""
    gpus = []
    for line in csv.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        mig_mode = f[5] if f[5] not in ("[N/A]", "N/A") else ""
        gpus.append({
            "model": f[0], "uuid": f[1], "pci_bus_id": f[2],
            "memory_mb": int(float(f[3])) if f[3].replace(".", "").isdigit() else 0,
            "driver_version": f[4], "mig_capable": bool(mig_mode), "mig_mode": mig_mode,
        })
    return gpus


_MIG_PROFILE_LINE = re.compile(r"MIG\s+(\S+)\s+\d+\s+(\d+)/(\d+)")


def parse_mig_profiles(text: str) -> dict[str, int]:
    """Parse `nvidia-smi mig -lgip`: each profile line reads
    `|   0  MIG 1g.10gb       19     3/7        9.50 ...` (Free/Total).

    The count is the Total, summed across GPUs: how many instances of that
    profile the GPUs are partitioned for, which is capacity. Free is not: it
    drops as anyone creates instances, and registration reads it once.
    Profiles share the same slices, so their counts are alternatives (7 x
    1g.10gb or 1 x 7g.80gb on one A100), not a sum."""
    profiles: dict[str, int] = {}
    for m in _MIG_PROFILE_LINE.finditer(text):
        profiles[m.group(1)] = profiles.get(m.group(1), 0) + int(m.group(3))
    return profiles


# GPU models the labels name. A model must be a whole word of nvidia-smi's
# name ("NVIDIA L40" is L40, not L4; "NVIDIA GH200 480GB" is GH200, not
# H200), tried longest first.
GPU_MODELS = ("GB200", "GH200", "B200", "H200", "H100", "A100", "V100", "L40S", "A10G", "L40", "A40", "A30", "A10",
              "L4", "T4")
_GPU_MODEL = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(sorted(GPU_MODELS, key=len, reverse=True))
                        + r")(?![A-Za-z0-9])")


def gpu_kind_label(model: str) -> str:
    """"NVIDIA A100-SXM4-80GB" -> "nvidia:A100" (the label the catalogue uses)."""
    m = _GPU_MODEL.search(model)
    return f"nvidia:{m.group(1)}" if m else (f"nvidia:{model}" if model else "")


NO_GPUS: dict[str, Any] = {"gpus": 0, "gpu_kind": "", "gpu_devices": [], "mig_profiles": {}}


class MigUnread(ToolFailed):
    """The GPUs were listed, and only their MIG profiles could not be read: ``facts`` has
    the listing (its ``mig_profiles`` are an earlier probe's, or none)."""

    def __init__(self, failed: ToolFailed, facts: dict[str, Any]):
        Exception.__init__(self, str(failed))
        self.facts = facts


def probe_gpus() -> dict[str, Any]:
    """The GPU facts by nvidia-smi; none when it is not installed (ToolFailed when it is and
    fails; MigUnread when only its listing of MIG profiles does: the GPUs listed stand)."""
    csv = _run(["nvidia-smi", "--query-gpu=name,uuid,pci.bus_id,memory.total,driver_version,"
                "mig.mode.current", "--format=csv,noheader,nounits"])
    if not csv:
        return dict(NO_GPUS)
    devices = parse_nvidia_gpus(csv)
    listed = {"gpus": len(devices), "gpu_kind": gpu_kind_label(devices[0]["model"]) if devices else "",
              "gpu_devices": devices, "mig_profiles": {}}
    if any(d["mig_mode"] == "Enabled" for d in devices):
        try:
            listed["mig_profiles"] = parse_mig_profiles(_run(["nvidia-smi", "mig", "-lgip"]) or "")
        except ToolFailed as exc:  # (the GPUs it listed are there all the same)
            raise MigUnread(exc, listed) from None
    return listed


# Each vendor tool the probe runs: how its facts are read, what they are where it is not
# installed, and what a warning says of them when it fails (kept from an earlier probe, or
# none when there was none to keep).
_TOOLS = (
    (lambda: {"qemu_version": qemu_version()}, {"qemu_version": ""},
     "the QEMU version stays {qemu_version}, as an earlier probe read it",
     "no QEMU version is reported until it answers"),
    (lambda: {"firecracker": firecracker_release()}, {"firecracker": ""},
     "the Firecracker release stays {firecracker}, as an earlier probe read it",
     "no Firecracker release is reported until it answers"),
    (probe_gpus, NO_GPUS,
     "the GPU facts stay those an earlier probe read (gpus {gpus}, gpu_kind {gpu_kind})",
     "no GPUs are reported until it answers"),
)


def probe(state_dir: Path, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The static hardware facts of this machine.

    ``kvm_device`` is whether /dev/kvm answers. ``kvm`` (usable KVM) needs the
    backend's boot probe too, so here it is only the device's answer: the
    agent's summary and ``host_facts`` replace it with what the backend
    settled on.

    A vendor tool that is installed but fails or times out says nothing of the
    machine: its facts are the ones in ``known`` (an earlier probe's), none
    without it, and ``probe_warnings`` says so in a sentence each (empty when
    every tool answered)."""
    kvm_device = kvm_device_answers()
    facts = {
        "cpus": usable_cpus(),
        "ram_mb": ram_mb(),
        "storage_gb": storage_gb(state_dir),
        "arch": arch(),
        "kvm": kvm_device,
        "kvm_device": kvm_device,
        "firecracker_pinned": FIRECRACKER_PINNED,
    }
    warnings = []
    for read, none, kept_note, none_note in _TOOLS:
        try:
            facts.update(read())
        except MigUnread as exc:
            kept = (known or {}).get("mig_profiles") or {}
            facts.update(exc.facts, mig_profiles=kept)
            warnings.append(f"{exc}: the GPUs it listed stand; their MIG profiles "
                            + (f"stay {kept}, as an earlier probe read them" if kept else
                               "are not reported until it answers"))
        except ToolFailed as exc:
            kept = {k: (known or {}).get(k, v) for k, v in none.items()}
            facts.update(kept)
            warnings.append(f"{exc}: {kept_note.format(**kept) if kept != none else none_note}")
    facts["probe_warnings"] = warnings
    return facts


def host_facts(state_dir: Path, backend: str = "qemu") -> dict[str, Any]:
    """What ``GET /v1/host`` reports of this machine, without serving: the
    probe, the accelerator the backend settles on (by the agent's own boot
    probe and cache, so an answer this machine already has costs nothing),
    whether KVM is usable under it, and the bundles built in ``state_dir``."""
    from . import bundle as bundles
    from .backends.base import get_backend

    be = get_backend(backend, state_dir=state_dir)
    facts = probe(state_dir)
    device = facts["kvm_device"]
    if (settle := getattr(be, "probe_accel", None)) is not None:
        # The bundle the agent settles with when it starts (VmManager.start).
        asyncio.run(settle(bundles.get_bundle(state_dir, "linux", be.bundle_files), device))
    facts.update(backend=backend, accel=getattr(be, "accel", None), kvm=be.kvm_usable(device),
                 bundles=bundles.list_bundles(state_dir, be.bundle_files))
    return facts
