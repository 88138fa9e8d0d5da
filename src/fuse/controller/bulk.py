"""The controller's side of the bulk copy protocol (``fuse.agent.bulk``).

A file goes from the source agent to the target agent through the controller
in 4 MiB chunks, each spliced from the source's socket into the target's
without entering Python (``splice`` through a pipe), so the controller stays
the one who copies, counts and can stop between chunks, at socket speed.
Runs on a thread: every call here blocks, bounded by the socket timeouts.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from ..agent.bulk import FEATURE, MAGIC, MAX_HEADER, pipe, set_io_timeout
from ..errors import FuseError, HostUnreachable
from ..transport import HostConnection, default_agent_socket

CHUNK = 4 * 1024 * 1024
SPLICE_WAIT = 0.5  # seconds one splice may wait on a socket (``_splice_exactly``)


@dataclass(frozen=True)
class Endpoint:
    """Where and how to open a bulk connection to one host."""
    host: str
    family: int
    address: Any
    token: str | None

    def connect(self, timeout: float) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self.address)
            sock.settimeout(None)
            set_io_timeout(sock, timeout)
        except OSError as exc:
            sock.close()
            raise HostUnreachable(f"cannot open a copy connection to host {self.host}: {exc}") from exc
        return sock


def endpoint(host: str, conn: HostConnection, summary: dict[str, Any]) -> Endpoint | None:
    """The bulk endpoint of a host reached over a plain transport whose agent
    speaks the protocol; None means copy over HTTP (TLS, SSH, older agents)."""
    if FEATURE not in (summary.get("features") or []):
        return None
    if conn.kind == "local":
        path = str(default_agent_socket()) if conn.addr == "local" else conn.addr[len("unix://"):]
        return Endpoint(host, socket.AF_UNIX, path, None)
    if conn.kind == "http" and conn.addr.startswith("http://"):
        u = urlsplit(conn.addr)
        if u.hostname is None:
            return None
        family = socket.AF_INET6 if ":" in u.hostname else socket.AF_INET
        return Endpoint(host, family, (u.hostname, u.port or 80), conn.token)
    return None


def _read_line(sock: socket.socket, host: str) -> dict[str, Any]:
    """One JSON reply line, consuming nothing after it."""
    while True:
        peek = sock.recv(MAX_HEADER, socket.MSG_PEEK)
        if not peek:
            raise HostUnreachable(f"host {host} closed the copy connection without a reply")
        end = peek.find(b"\n")
        if end >= 0:
            line = sock.recv(end + 1, socket.MSG_WAITALL)
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                # (something other than its agent answered there: a proxy, another service)
                raise HostUnreachable(f"host {host} answered the copy with a line that is not JSON, not a fuse "
                                      "agent's reply") from None
            if not isinstance(reply, dict):
                kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(reply), "number")
                raise HostUnreachable(f"host {host} answered the copy with a JSON {kind}, not the object a fuse "
                                      "agent replies with")
            return reply
        if len(peek) >= MAX_HEADER:
            raise HostUnreachable(f"host {host} sent a copy reply longer than {MAX_HEADER} bytes")
        # wait for more than what is there: a blocking peek of all of it and one byte more
        if len(sock.recv(len(peek) + 1, socket.MSG_PEEK | socket.MSG_WAITALL)) <= len(peek):
            raise HostUnreachable(f"host {host} closed the copy connection in the middle of its reply")


def _open(ep: Endpoint, request: dict[str, Any], timeout: float,
          opened: Callable[[socket.socket], None] = lambda s: None) -> tuple[socket.socket, dict[str, Any]]:
    sock = ep.connect(timeout)
    try:
        opened(sock)  # (before its reply is waited for: a copy stopped meanwhile shuts it down at once)
        sock.sendall(MAGIC + json.dumps({**request, "token": ep.token}).encode() + b"\n")
        reply = _read_line(sock, ep.host)
    except BaseException:
        sock.close()
        raise
    if not reply.get("ok"):
        sock.close()
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        status = reply.get("status")
        raise FuseError(f"host {ep.host}: {err.get('message') or 'refused the copy'}", code=err.get("code")
                        ).with_status(status if isinstance(status, int) and 400 <= status < 600 else 502)
    return sock, reply


def copy_file(src: Endpoint, dst: Endpoint, *, vm: str, move: str, file: str, size: int, timeout: float,
              on_chunk: Callable[[int], None], corrupt: Callable[[int], bool] = lambda n: False,
              opened: Callable[[socket.socket], None] = lambda s: None) -> None:
    """Copy one whole file, chunk by chunk; ``on_chunk(n)`` after each (it may
    raise to stop); ``corrupt(n)`` says whether to damage that chunk (a test
    hook: the target's verification must catch it). ``opened`` gets each
    socket, so whoever waits can shut them down to stop the copy at once."""
    s, _ = _open(src, {"op": "read", "vm": vm, "file": file, "offset": 0, "length": size}, timeout, opened)
    try:
        d, _ = _open(dst, {"op": "write", "move": move, "file": file, "offset": 0, "length": size}, timeout, opened)
    except BaseException:
        s.close()
        raise
    r, w = pipe()
    try:
        done = 0
        while done < size:
            n = min(CHUNK, size - done)
            # Each chunk has `timeout` in all: the sockets' timeouts bound one call, and a
            # host that takes a few bytes now and then (a stopped agent's kernel still
            # fills its buffers) would hold each call that long again and again
            deadline = time.monotonic() + timeout
            if corrupt(n):
                _arm(deadline, s, d)
                data = bytearray(s.recv(n, socket.MSG_WAITALL))
                if len(data) != n:
                    raise HostUnreachable(f"host {src.host} stopped sending {file} at {done + len(data)} of {size}")
                data[0] ^= 0xFF
                _arm(deadline, s, d)
                d.sendall(data)
            else:
                _splice_exactly(s, r, w, d, n, src.host, file, done, size, deadline)
            done += n
            on_chunk(n)
        set_io_timeout(d, timeout)
        reply = _read_line(d, dst.host)
        if reply.get("written") != size:
            raise HostUnreachable(f"host {dst.host} wrote {reply.get('written')} of {size} bytes of {file}")
    except OSError as exc:
        raise HostUnreachable(f"copying {file} from {src.host} to {dst.host} failed: {exc}") from exc
    finally:
        for fd in (r, w):
            os.close(fd)
        s.close()
        d.close()


def _arm(deadline: float, *socks: socket.socket) -> None:
    """Give the sockets' next calls what is left until ``deadline``; a TimeoutError
    (what a socket's own timeout raises) once nothing is."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(errno.ETIMEDOUT, "a chunk of the copy did not get through in time")
    for sock in socks:
        set_io_timeout(sock, left)


def _splice_exactly(s: socket.socket, r: int, w: int, d: socket.socket, n: int,
                    host: str, file: str, at: int, size: int, deadline: float) -> None:
    """Pass ``n`` bytes from ``s`` to ``d`` through the pipe (r, w) by ``deadline``.
    Each splice waits at most ``SPLICE_WAIT`` seconds: the kernel's splice into a
    socket sends in several steps, each of which may wait the socket's whole timeout,
    so a splice given all that is left of the chunk's time took up to twice as long
    against a host that had stopped reading (a move failed after 2 × its I/O timeout);
    the deadline is checked between splices instead."""
    while n:
        got = _splice_once(s.fileno(), w, n, deadline, s)
        if got == 0:
            raise HostUnreachable(f"host {host} stopped sending {file} at {at} of {size} bytes")
        n, at = n - got, at + got
        while got:
            got -= _splice_once(r, d.fileno(), got, deadline, d)


def _splice_once(src: int, dst: int, n: int, deadline: float, sock: socket.socket) -> int:
    """One splice of up to ``n`` bytes, bytes moved (0: the source ended); waits at most
    SPLICE_WAIT on ``sock`` per try, and a TimeoutError once ``deadline`` has passed."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(errno.ETIMEDOUT, "a chunk of the copy did not get through in time")
        set_io_timeout(sock, min(left, SPLICE_WAIT))
        try:
            return os.splice(src, dst, n)
        except BlockingIOError:  # (nothing moved within this try: the deadline decides)
            continue
