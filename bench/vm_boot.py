"""VM boot through the host agent vs bare QEMU, and sleep/wake vs state size.

Measured in one run on this machine:

1. create-to-entry-running: from the request to the guest's
   ``FUSE-ENTRY-START`` line (printed by fuse's init just before the entry
   runs), through a real agent process (`fuse host serve`, HTTP, admission,
   daemonized QEMU, console read back over the API) against a bare
   ``qemu-system-x86_64`` started on the same bundle and command line, console
   polled from the file. Rounds alternate so drift hits both. Target: the
   agent adds at most 10%.
2. sleep and wake wall time (HTTP round trip) against the state file size,
   the guest having filled part of its memory with non-zero data (zero pages
   are not written, so guest size alone would not move the figure).

    python bench/vm_boot.py [--rounds 5] [--out bench/results/vm_boot.txt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import start_agent  # noqa: E402  (the tests' real-agent launcher)

from fuse.agent.backends.base import BootSpec  # noqa: E402
from fuse.agent.backends.qemu import QemuBackend  # noqa: E402
from fuse.agent.bundle import build_bundle, get_bundle  # noqa: E402

MARK = "FUSE-ENTRY-START"
POLL = 0.025  # both sides; a tight HTTP poll would itself steal CPU from the TCG guest


def bare_qemu(bundle, work: Path, backend: QemuBackend, i: int) -> float:
    """Seconds from spawning QEMU (same bundle and command line as the agent,
    minus -daemonize/-qmp/-pidfile) to the entry marker on the console."""
    spec = BootSpec(name=f"bare{i}", vm_dir=work / f"bare{i}", vcpus=1, mem_mib=128, entry="sleep 600",
                    kernel=bundle.vmlinux, initrd=bundle.initrd, platform=backend.platform())
    spec.vm_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(backend.argv(spec, daemon=False), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (spec.console.exists() and MARK in spec.console.read_text(errors="replace")):
            time.sleep(POLL)
        return time.perf_counter() - t0
    finally:
        proc.kill()
        proc.wait()


def via_agent(c: httpx.Client, i: int) -> float:
    t0 = time.perf_counter()
    r = c.post("/v1/host/vms", json={"name": f"agent{i}", "shape": {"vcpus": 1, "mem_mib": 128},
                                     "entry": "sleep 600"})
    r.raise_for_status()
    try:
        while MARK not in c.get(f"/v1/host/vms/agent{i}/console").json()["text"]:
            time.sleep(POLL)
        return time.perf_counter() - t0
    finally:
        c.delete(f"/v1/host/vms/agent{i}")


def sleep_wake(c: httpx.Client, fill_mib: int, mem_mib: int) -> tuple[int, float, float]:
    name = f"sw{fill_mib}"
    # Random bytes into the initramfs root (RAM): pages that are neither zero
    # nor compressible, so the state file grows with them.
    entry = (f"dd if=/dev/urandom of=/fill bs=1M count={fill_mib} 2>/dev/null; echo filled; "
             "while true; do sleep 1; done")
    c.post("/v1/host/vms", json={"name": name, "shape": {"vcpus": 1, "mem_mib": mem_mib},
                                 "entry": entry}).raise_for_status()
    try:
        while "filled" not in c.get(f"/v1/host/vms/{name}/console").json()["text"]:
            time.sleep(0.05)
        t0 = time.perf_counter()
        vm = c.post(f"/v1/host/vms/{name}/sleep").json()
        t_sleep = time.perf_counter() - t0
        size = sum(f["size"] for f in vm["files"])
        t0 = time.perf_counter()
        assert c.post(f"/v1/host/vms/{name}/wake").json()["state"] == "running"
        return size, t_sleep, time.perf_counter() - t0
    finally:
        c.delete(f"/v1/host/vms/{name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/vm_boot.txt")
    args = ap.parse_args()

    home = Path(os.environ.get("FUSE_TEST_BUNDLES", "/tmp/fuse-test-bundles"))
    build_bundle(home, "linux", progress=lambda _m: None)
    bundle = get_bundle(home, "linux")
    work = Path(tempfile.mkdtemp(prefix="fuse-bench-"))
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    agent = None
    try:
        dest = work / "agent/bundles/linux"
        dest.mkdir(parents=True)
        for f in bundle.path.iterdir():
            os.link(f, dest / f.name)
        agent = start_agent(work)
        backend = QemuBackend()
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"},
                          timeout=120) as c:
            host = c.get("/v1/host").json()
            say(f"# vm_boot bench — {time.strftime('%Y-%m-%d %H:%M:%S')}, {host['cpus']} cpus, "
                f"qemu {host['qemu_version']}, accel {host.get('accel')}, kernel {bundle.kernel}, "
                f"bundle {bundle.fingerprint[:12]}")
            say("# create-to-entry-running (s), 1 vcpu / 128 MiB, microvm + vmlinux; rounds alternate")
            bare, agent_t = [], []
            for i in range(args.rounds):
                pair = [("bare", lambda: bare_qemu(bundle, work, backend, i)), ("agent", lambda: via_agent(c, i))]
                for kind, run in (pair if i % 2 == 0 else pair[::-1]):
                    (bare if kind == "bare" else agent_t).append(run())
                say(f"round {i}: bare {bare[-1]:.3f}  agent {agent_t[-1]:.3f}")
            mb, ma = statistics.median(bare), statistics.median(agent_t)
            say(f"median: bare qemu {mb:.3f} s, through agent {ma:.3f} s, ratio {ma / mb:.3f} "
                f"(agent adds {100 * (ma / mb - 1):+.1f}%; target <= +10%)")
            paired = statistics.median(a / b for a, b in zip(agent_t, bare))
            say(f"paired: median of per-round ratios {paired:.3f} (each round's two boots share the "
                "machine's load)")
            say(f"best:   bare qemu {min(bare):.3f} s, through agent {min(agent_t):.3f} s, "
                f"ratio {min(agent_t) / min(bare):.3f}")
            say(f"load average during the run: {os.getloadavg()[0]:.2f} (TCG boots are CPU-bound: "
                "other work on the machine widens the spread)")
            say()
            say("# sleep / wake vs state size (HTTP round trip; exec: migration to a file)")
            say(f"{'filled MiB':>10} {'guest MiB':>9} {'state MiB':>9} {'sleep s':>8} {'wake s':>7}")
            for fill, mem in ((0, 256), (32, 256), (64, 256), (128, 384)):
                size, ts, tw = sleep_wake(c, fill, mem)
                say(f"{fill:>10} {mem:>9} {size / 2**20:>9.1f} {ts:>8.3f} {tw:>7.3f}")
    finally:
        if agent:
            agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
