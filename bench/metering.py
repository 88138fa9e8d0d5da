"""Benchmark the agent's metering save against the history the host keeps.

    python bench/metering.py [--sizes 500,5000,50000] [--running 10] [--saves 50]

The agent saves its metering up to once a second while VMs run (``PERSIST_S``), on
its event loop. For each size it builds a state dir whose metering holds that many
ended segments (and a state write per ten), as ``fuse.agent.metering`` keeps them
(appended to ``metering.jsonl``), starts ``--running`` VMs' open segments, then
times ``Metering.save`` after a fresh CPU reading, ``--saves`` times (median).
Ratios are against the same save with no history, measured in this run: 1.0 means
a save costs what it costs on a new host.

For scale, the last columns time what a save cost before the archive: the whole
history written to one file and renamed over it (``whole-file save``), and the
start-up read of the files (``load``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fuse.agent.metering import Metering  # noqa: E402

CREATED = "2026-12-07T00:00:00Z"


def history(n: int, t0: float = 1_700_000_000.0) -> tuple[list[dict], list[dict]]:
    """``n`` ended segments (one VM lifetime a minute) and a state write per ten."""
    segments = [{"vm": f"vm-{i % 200}", "created_at": CREATED, "start": t0 + 60 * i, "end": t0 + 60 * i + 45.5,
                 "mem_mib": 512, "pid": 10_000 + i % 30_000, "cpu_s": 12.345678, "seen": t0 + 60 * i + 45.0}
                for i in range(n)]
    writes = [{"vm": f"vm-{i % 200}", "created_at": CREATED, "time": t0 + 60 * i + 30, "bytes": 268_435_456 + i}
              for i in range(0, n, 10)]
    return segments, writes


def build(d: Path, n: int, running: int) -> Metering:
    segments, writes = history(n)
    with open(d / "metering.jsonl", "w") as f:
        f.writelines(json.dumps({"segment": s}) + "\n" for s in segments)
        f.writelines(json.dumps({"write": w}) + "\n" for w in writes)
    m = Metering(d / "metering.json")
    for i in range(running):
        m.start(f"live-{i}", 1024, None, now=time.time() - 100, created_at=CREATED)
    return m


def time_saves(m: Metering, saves: int) -> float:
    """Median seconds of a save after a CPU reading changed (what the monitor's does)."""
    took = []
    for k in range(saves):
        for seg in m._hot_segments:
            seg["cpu_s"] = k * 0.01
            seg["seen"] = time.time()
        t = time.perf_counter()
        m.save()
        took.append(time.perf_counter() - t)
    return statistics.median(took)


def time_whole_file(d: Path, m: Metering, saves: int) -> float:
    """Median seconds of the save before the archive: every record, one file, renamed over."""
    path, tmp = d / "whole.json", d / "whole.tmp"
    took = []
    for _ in range(max(3, saves // 10)):
        t = time.perf_counter()
        with open(tmp, "w") as f:
            f.write(json.dumps({"segments": m.segments, "writes": m.writes}))
        os.replace(tmp, path)
        took.append(time.perf_counter() - t)
    return statistics.median(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="500,5000,50000", help="archived segments, comma-separated")
    ap.add_argument("--running", type=int, default=10, help="VMs running (open segments) at every size")
    ap.add_argument("--saves", type=int, default=50, help="saves timed per size (the median is shown)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"# metering save vs history: {args.running} VMs running, median of {args.saves} saves; "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'archived':>9} {'save ms':>8} {'ratio':>6} {'metering.json B':>16} {'metering.jsonl B':>17} "
          f"{'whole-file save ms':>19} {'load ms':>8}")
    base = None
    for n in [0] + sizes:
        with tempfile.TemporaryDirectory(prefix="bench-metering-") as tmp:
            d = Path(tmp)
            build(d, n, args.running)
            t = time.perf_counter()
            m = Metering(d / "metering.json")  # (as a restarted agent reads it)
            load = time.perf_counter() - t
            assert len(m.segments) == n + args.running and m.damaged is None
            save = time_saves(m, args.saves)
            base = save if base is None else base
            whole = time_whole_file(d, m, args.saves)
            hot = (d / "metering.json").stat().st_size
            cold = (d / "metering.jsonl").stat().st_size if n else 0
            print(f"{n:>9,} {save * 1e3:>8.3f} {save / base:>6.2f} {hot:>16,} {cold:>17,} "
                  f"{whole * 1e3:>19.2f} {load * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
