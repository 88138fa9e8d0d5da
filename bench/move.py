"""Move time, VM downtime and copy throughput against the state size, with
real QEMU VMs on two real agents; the copy rate is compared with a raw
loopback TCP copy of the same number of bytes measured in the same run.

    python bench/move.py [--sizes 256,512,1024] [--repeat 3]

Each size moves the VM there and back ``--repeat`` times: move time and
downtime are medians, the copy is the best run, as the raw copies are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuse  # noqa: E402
from support import install_bundle, real_bundle_dir, reap, start_agent, start_controller, wait_until  # noqa: E402

CHUNK = 4 * 1024 * 1024


def raw_loopback_copy(nbytes: int, where: Path) -> tuple[float, float]:
    """Seconds for two raw copies of ``nbytes`` through loopback TCP:

    file: a file of that size (random bytes, in the page cache like a state
        file just written) sent with ``sendfile`` and spliced into a file by
        the receiver, the fastest way to copy a file over a socket with no
        one in between: the baseline of the ratio;
    socket: the same number of bytes from memory to a receiver that drops
        them: what loopback TCP alone moves, for scale.
    """
    src, dst = where / "raw-src.bin", where / "raw-dst.bin"
    with open(src, "wb") as f:
        for off in range(0, nbytes, CHUNK):
            f.write(os.urandom(min(CHUNK, nbytes - off)))

    def once(send, receive) -> float:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def sink():
            conn, _ = srv.accept()
            receive(conn)
            conn.close()

        t = threading.Thread(target=sink)
        t.start()
        t0 = time.perf_counter()
        with socket.create_connection(srv.getsockname()) as c:
            send(c)
        t.join()
        srv.close()
        return time.perf_counter() - t0

    def send_file(c):
        with open(src, "rb") as f:
            off = 0
            while off < nbytes:
                off += os.sendfile(c.fileno(), f.fileno(), off, nbytes - off)

    def write_file(conn):
        r, w = os.pipe()
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while n := os.splice(conn.fileno(), w, 1 << 20):
                while n:
                    n -= os.splice(r, fd, n)
        finally:
            for x in (r, w, fd):
                os.close(x)

    def send_memory(c):
        payload, left = b"\x5a" * CHUNK, nbytes
        while left > 0:
            c.sendall(payload[:min(CHUNK, left)])
            left -= CHUNK

    def drop(conn):
        buf = memoryview(bytearray(1 << 20))
        while conn.recv_into(buf):
            pass

    file_s = min(once(send_file, write_file) for _ in range(3))
    socket_s = min(once(send_memory, drop) for _ in range(3))
    src.unlink()
    dst.unlink()
    return file_s, socket_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,512,1024")
    ap.add_argument("--repeat", type=int, default=3, choices=(1, 2, 3), help="moves per size (there and back)")
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
                entry = f"dd if=/dev/urandom of=/fill bs=1M count={mem // 3} 2>/dev/null; echo ready; sleep 3600"
                c.vms.create({"name": vm, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": entry, "host": "a"})
                wait_until(lambda: "ready" in c.vms.console(vm)["text"], timeout=180, what="guest ready")
                moves = []
                for to in ("b", "a", "b")[:args.repeat]:  # there and back: the best copy, as for the raw copy
                    t0 = time.perf_counter()
                    m = c.moves.create(vm, to=to)
                    m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                                   timeout=300)
                    h = {e["state"]: e["time"] for e in m["history"]}
                    moves.append((m, time.perf_counter() - t0, (h.get("done") or h["failed"]) - h["sleeping"]))
                m = min(moves, key=lambda x: x[0].get("copy_secs") or 1e9)[0]
                total = statistics.median(x[1] for x in moves)
                downtime = statistics.median(x[2] for x in moves)
                raw_file, raw_socket = raw_loopback_copy(m["total_bytes"], tmp)
                rows.append((mem, m["state"], m["copy_path"], m["total_bytes"], total, downtime, m["copy_secs"],
                             m["verify_secs"], raw_file, raw_socket))
                c.vms.delete(vm)
    finally:
        ctl.stop()
        for a in agents:
            a.stop()
        reap(tmp)
        shutil.rmtree(tmp, ignore_errors=True)  # (the VMs' images: hundreds of MiB a run)
    print("move: real QEMU VMs between two agents on loopback; the copy against a raw loopback copy of as many "
          "bytes, same run")
    print("  copy: the controller moving every file in 4 MiB chunks (path: bulk protocol or HTTP); verify: the "
          "target hashing what it holds, checked against the source's SHA-256")
    print("  raw file: sendfile -> loopback TCP -> splice into a file, no one in between (the ratio's baseline); "
          "raw socket: memory -> loopback TCP -> dropped (for scale)")
    print(f"{'mem MiB':>8} {'state':>6} {'path':>5} {'state MiB':>10} {'move s':>7} {'downtime s':>11} "
          f"{'copy s':>7} {'verify s':>8} {'copy MiB/s':>11} {'raw file':>9} {'ratio':>6} {'raw socket':>11} "
          f"{'ratio':>6}")
    for mem, st, path, nbytes, total, down, copy_s, verify_s, raw_file, raw_socket in rows:
        mib = nbytes / 2**20
        print(f"{mem:>8} {st:>6} {path:>5} {mib:>10.1f} {total:>7.2f} {down:>11.2f} {copy_s:>7.3f} "
              f"{verify_s:>8.3f} {mib / copy_s:>11.1f} {mib / raw_file:>9.1f} {raw_file / copy_s:>6.3f} "
              f"{mib / raw_socket:>11.1f} {raw_socket / copy_s:>6.3f}")


if __name__ == "__main__":
    main()
