"""Move time, VM downtime and copy throughput against the state size, with
real QEMU VMs on two real agents; the copy rate is compared with a raw
loopback TCP copy of the same number of bytes measured in the same run.

    python bench/move.py [--sizes 128,256,512]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuse  # noqa: E402
from support import install_bundle, real_bundle_dir, reap, start_agent, start_controller, wait_until  # noqa: E402

CHUNK = 4 * 1024 * 1024


def raw_loopback_copy(nbytes: int) -> float:
    """Seconds to push `nbytes` through a loopback TCP socket in 4 MiB writes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = [0]

    def sink():
        conn, _ = srv.accept()
        while (n := len(conn.recv(1 << 20))):
            got[0] += n
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    payload = b"\x5a" * CHUNK
    t0 = time.perf_counter()
    with socket.create_connection(srv.getsockname()) as c:
        left = nbytes
        while left > 0:
            c.sendall(payload[:min(CHUNK, left)])
            left -= CHUNK
    t.join()
    srv.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="128,256,512")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fuse-bench-move-"))
    bundle = real_bundle_dir()
    agents = []
    for name in ("a", "b"):
        install_bundle(bundle, tmp / f"agent-{name}")
        agents.append(start_agent(tmp, backend="qemu", name=f"agent-{name}"))
    ctl = start_controller(tmp)
    rows = []
    try:
        with fuse.Client(ctl.url) as c:
            for name, a in zip("ab", agents):
                c.hosts.register(fuse.RegisterHostRequest(id=name, url=a.url, token=a.token, backend="qemu",
                                                          capacity=fuse.HostCapacity(vm_count=4)))
            for mem in [int(x) for x in args.sizes.split(",")]:
                vm = f"m{mem}"
                # A guest that dirties its memory, so the state is not mostly zeros.
                entry = f"dd if=/dev/urandom of=/dev/shm/fill bs=1M count={mem // 3} 2>/dev/null; echo ready; sleep 3600"
                c.vms.create({"name": vm, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": entry, "host": "a"})
                wait_until(lambda: "ready" in c.vms.console(vm)["text"], timeout=180, what="guest ready")
                t0 = time.perf_counter()
                m = c.moves.create(vm, to="b")
                m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=300)
                total = time.perf_counter() - t0
                h = {e["state"]: e["time"] for e in m["history"]}
                downtime = h["done"] - h["sleeping"]
                copy_s = h["waking"] - h["copying"]
                raw = raw_loopback_copy(m["total_bytes"])
                rows.append((mem, m["state"], m["total_bytes"], total, downtime, copy_s,
                             m["total_bytes"] / copy_s / 2**20, m["total_bytes"] / raw / 2**20))
                c.vms.delete(vm)
    finally:
        ctl.stop()
        for a in agents:
            a.stop()
        reap(tmp)
    print("move: real QEMU (TCG) VMs between two agents on loopback; copy rate vs raw loopback TCP, same run")
    print(f"{'mem MiB':>8} {'state':>6} {'state MiB':>10} {'move s':>7} {'downtime s':>11} {'copy s':>7} "
          f"{'copy MiB/s':>11} {'raw MiB/s':>10} {'ratio':>6}")
    for mem, st, nbytes, total, down, copy_s, rate, raw in rows:
        print(f"{mem:>8} {st:>6} {nbytes / 2**20:>10.1f} {total:>7.2f} {down:>11.2f} {copy_s:>7.2f} "
              f"{rate:>11.1f} {raw:>10.1f} {rate / raw:>6.3f}")


if __name__ == "__main__":
    main()
