"""A create through the controller that claims a prewarmed VM vs one that boots cold.

Measured in one run on this machine: a real controller and one real host agent
(QEMU) on loopback, driven through the SDK, each round:

1. cold: ``client.vms.create(...)`` of a shape 4 MiB larger than the prewarm's, which
   no standby VM matches (a create pinned to the host would claim one there too), with
   the entry ``echo ready-marker``, until the console shows ``ready-marker``;
2. prewarmed: the same create unpinned while a prewarm of that shape has a VM
   ready (waited for, not timed): it claims it; until the same marker.

The rounds alternate the order so drift hits both; a refill (the prewarm booting
its next VM) is waited out before the next timing. Medians, and the ratio
prewarmed / cold: what a prewarm buys the caller of ``vms.create``.

    python bench/prewarm_create.py [--rounds 5] [--out bench/results/prewarm_create.txt]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import install_bundle, real_bundle_dir, reap, start_agent, start_controller  # noqa: E402

import fuse  # noqa: E402

SHAPE = {"vcpus": 1, "mem_mib": 128}
COLD_SHAPE = {"vcpus": 1, "mem_mib": 132}  # no standby VM is of this shape: it boots cold
MARK = "ready-marker"


def until(pred, timeout: float = 120, poll: float = 0.01):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(poll)


def timed_create(client: fuse.Client, name: str, shape: dict) -> float:
    t0 = time.perf_counter()
    client.vms.create(name=name, shape=shape, entry=f"echo {MARK}")
    until(lambda: MARK in client.vms.console(name)["text"])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prewarm_create.txt")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fuse-bench-prewarm-"))
    install_bundle(real_bundle_dir(), tmp / "real")
    agent = start_agent(tmp, backend="qemu", name="real")
    ctl = start_controller(tmp)
    cold, warm = [], []
    try:
        with fuse.Client(ctl.url) as client:
            client.hosts.register(fuse.RegisterHostRequest(
                id="real", url=agent.url, token=agent.token, backend="qemu",
                capacity=fuse.HostCapacity(vm_count=8, ram_mb=2048, cpus=2)))
            until(lambda: client.hosts.get("real").connected, timeout=30)
            pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=128, on="local"))

            def ready() -> bool:
                return next(p for p in client.pool.prewarms() if p.id == pw.id).ready == 1

            for r in range(args.rounds):
                for kind in (("cold", "warm") if r % 2 == 0 else ("warm", "cold")):
                    until(ready, timeout=120, poll=0.2)
                    time.sleep(1.0)  # the standby guest settles (printed FUSE-STANDBY, idle)
                    name = f"{kind}-{r}"
                    if kind == "cold":
                        cold.append(timed_create(client, name, COLD_SHAPE))
                        assert ready(), "the cold create claimed the standby VM: not a cold boot"
                    else:
                        warm.append(timed_create(client, name, SHAPE))
                    client.vms.delete(name)
            client.pool.remove_prewarm(pw.id)
    finally:
        ctl.stop()
        agent.stop()
        reap(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    mc, mw = statistics.median(cold), statistics.median(warm)
    lines = [
        f"prewarm through the controller ({args.rounds} alternating rounds, {time.strftime('%Y-%m-%d')}, "
        f"shape {SHAPE['vcpus']} vCPU / {SHAPE['mem_mib']} MiB, one real QEMU host)",
        f"cold create -> entry output:      median {mc:.3f} s  ({', '.join(f'{x:.3f}' for x in cold)})",
        f"prewarmed create -> entry output: median {mw:.3f} s  ({', '.join(f'{x:.3f}' for x in warm)})",
        f"ratio prewarmed / cold: {mw / mc:.3f}  ({mc / mw:.1f}x faster)",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
