"""The controller's bulk copy gives each 4 MiB chunk its timeout in all (review 17).

A stopped target agent's kernel still takes a few bytes now and then, and each
socket call that moves a few bytes starts the socket's timeout again: a move to a
SIGSTOPped target went home only after ~96 s, its reason saying "within 30 s".
Real sockets: a source that sends at once, a target that takes ~1 MiB/s: each socket
call moves bytes within its 2 s, no 4 MiB chunk gets through in 2 s."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from fuse.agent.bulk import MAGIC
from fuse.controller.bulk import CHUNK, Endpoint, copy_file
from fuse.controller.moves.records import timed_out
from fuse.errors import HostUnreachable


def _serve(then, stop: threading.Event) -> tuple[Endpoint, threading.Thread]:
    """A one-connection bulk peer on loopback TCP: it reads the request line, says ok,
    then ``then(conn, request, stop)``."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        with conn:
            line = b""
            while not line.endswith(b"\n"):
                line += conn.recv(1)
            request = json.loads(line[len(MAGIC):])
            conn.sendall(b'{"ok": true}\n')
            then(conn, request, stop)
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return Endpoint(f"port {srv.getsockname()[1]}", socket.AF_INET, srv.getsockname(), None), t


def _send_all(conn, request, stop):
    data = b"x" * request["length"]
    try:
        conn.sendall(data)
        stop.wait(30)
    except OSError:
        pass


def _trickle(conn, request, stop):
    while not stop.is_set():
        try:
            if not conn.recv(256 * 1024):
                return
        except OSError:
            return
        time.sleep(0.25)


def test_a_target_that_takes_a_trickle_fails_the_chunk_within_its_timeout():
    stop = threading.Event()
    (src, t1), (dst, t2) = _serve(_send_all, stop), _serve(_trickle, stop)
    threads = [t1, t2]
    outcome: dict = {}

    def copy():
        t0 = time.monotonic()
        try:
            copy_file(src, dst, vm="v", move="m", file="state.bin", size=4 * CHUNK, timeout=2.0,
                      on_chunk=lambda n: None)
        except Exception as exc:  # noqa: BLE001 - the outcome is the point
            outcome["error"] = exc
        outcome["secs"] = time.monotonic() - t0

    worker = threading.Thread(target=copy, daemon=True)
    worker.start()
    worker.join(20)
    stop.set()
    assert not worker.is_alive(), "the copy went on taking a trickle for 20 s"
    for t in threads:
        t.join(5)
    err = outcome.get("error")
    assert isinstance(err, HostUnreachable), outcome
    assert timed_out(err)  # read as a host that stopped answering: the move names which one
    assert outcome["secs"] < 8.0, outcome  # (14 s before: each socket call moved a little)


@pytest.mark.parametrize("size", [1, CHUNK + 5])
def test_a_copy_at_full_speed_is_whole(size):
    got = bytearray()

    def receive(conn, request, stop):
        while len(got) < request["length"]:
            got.extend(conn.recv(1 << 20))
        conn.sendall(json.dumps({"written": len(got)}).encode() + b"\n")

    stop = threading.Event()
    (src, t1), (dst, t2) = _serve(_send_all, stop), _serve(receive, stop)
    threads = [t1, t2]
    chunks = []
    copy_file(src, dst, vm="v", move="m", file="state.bin", size=size, timeout=5.0, on_chunk=chunks.append)
    stop.set()
    for t in threads:
        t.join(5)
    assert bytes(got) == b"x" * size and sum(chunks) == size
