"""Claiming a standby VM vs creating one cold, on one real agent.

Measured in one run on this machine, through a real agent process (`fuse
host serve` on loopback, HTTP, daemonized QEMU, console read back over the
API), each round:

1. cold: ``POST /v1/host/vms`` with the entry ``echo ready-marker``, until the
   console shows ``ready-marker``;
2. claim: a standby VM created beforehand (and waited for until its guest
   printed ``FUSE-STANDBY``, not timed), ``POST /v1/host/vms/{name}/claim``
   with the same entry, until the console shows ``ready-marker``; the claim's
   own HTTP round trip is reported too.

Rounds alternate the order so drift hits both. Medians, and the ratio
claim / cold (what prewarm buys a create).

    python bench/prewarm.py [--rounds 5] [--out bench/results/prewarm.txt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support import install_bundle, real_bundle_dir, start_agent  # noqa: E402  (the tests' launchers)

ENTRY = "echo ready-marker"
MARK = "ready-marker"
SHAPE = {"vcpus": 1, "mem_mib": 128}
POLL = 0.01  # fine enough for a figure in tens of ms; an idle guest does not mind


def wait_console(c: httpx.Client, name: str, mark: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while mark not in c.get(f"/v1/host/vms/{name}/console").json()["text"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"vm {name} never showed {mark}")
        time.sleep(POLL)


def cold(c: httpx.Client, i: int) -> float:
    name = f"cold{i}"
    t0 = time.perf_counter()
    c.post("/v1/host/vms", json={"name": name, "shape": SHAPE, "entry": ENTRY}).raise_for_status()
    try:
        wait_console(c, name, MARK)
        return time.perf_counter() - t0
    finally:
        c.delete(f"/v1/host/vms/{name}")


def claimed(c: httpx.Client, i: int) -> tuple[float, float]:
    """(seconds to the marker, seconds the claim call took)."""
    standby, name = f"pw{i}", f"claimed{i}"
    c.post("/v1/host/vms", json={"name": standby, "shape": SHAPE, "standby": True}).raise_for_status()
    try:
        wait_console(c, standby, "FUSE-STANDBY")
        t0 = time.perf_counter()
        c.post(f"/v1/host/vms/{standby}/claim", json={"name": name, "entry": ENTRY}).raise_for_status()
        t_reply = time.perf_counter() - t0
        wait_console(c, name, MARK)
        return time.perf_counter() - t0, t_reply
    finally:
        for n in (name, standby):
            c.delete(f"/v1/host/vms/{n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/prewarm.txt")
    args = ap.parse_args()

    bundle = real_bundle_dir()
    work = Path(tempfile.mkdtemp(prefix="fuse-bench-"))
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    agent = None
    try:
        install_bundle(bundle, work / "agent")
        agent = start_agent(work)
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"},
                          timeout=120) as c:
            host = c.get("/v1/host").json()
            say(f"# prewarm bench — {time.strftime('%Y-%m-%d %H:%M:%S')}, {host['cpus']} cpus, "
                f"qemu {host['qemu_version']}, accel {host.get('accel')}, "
                f"bundle {host['bundles'][0]['fingerprint'][:12]}")
            say(f"# request to '{MARK}' on the console (s), 1 vcpu / 128 MiB; rounds alternate")
            cold_t, claim_t, reply_t = [], [], []
            for i in range(args.rounds):
                runs = [lambda: cold_t.append(cold(c, i)),
                        lambda: [x.append(v) for x, v in zip((claim_t, reply_t), claimed(c, i))]]
                for run in runs if i % 2 == 0 else runs[::-1]:
                    run()
                say(f"round {i}: cold {cold_t[-1]:.3f}  claim {claim_t[-1]:.3f} "
                    f"(claim call {reply_t[-1]:.3f})")
            mc, mk, mr = (statistics.median(x) for x in (cold_t, claim_t, reply_t))
            say(f"median: cold create {mc:.3f} s, claim {mk:.3f} s (claim call {mr:.3f} s), "
                f"ratio claim/cold {mk / mc:.3f} ({mc / mk:.0f}x faster)")
            say(f"load average during the run: {os.getloadavg()[0]:.2f} (TCG boots are CPU-bound: "
                "other work on the machine slows the cold side most)")
    finally:
        if agent:
            agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
