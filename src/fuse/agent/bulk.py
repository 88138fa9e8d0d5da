"""The bulk copy protocol: a move's state files at socket speed.

Most of a move is bytes, and an HTTP stack in Python moves them at a few
hundred MiB/s. So the agent's plain listeners (TCP with its token, and its
owner-only socket) also speak one small protocol beside HTTP, told apart by
the first bytes of a connection. One operation per connection:

    FUSE-BULK/1 {"op": "read", "token": T, "vm": NAME, "file": F, "offset": O, "length": N}\\n
        <- {"ok": true, "length": N}\\n, then N bytes (sendfile), then close
    FUSE-BULK/1 {"op": "write", "token": T, "move": ID, "file": F, "offset": O, "length": N}\\n
        <- {"ok": true}\\n   -> N bytes   <- {"ok": true, "written": N}\\n
    a refusal, instead of the first reply:
        <- {"ok": false, "status": 404, "error": {"code": ..., "message": ...}}\\n

Each operation makes the checks of the HTTP route it stands for (``GET
/v1/host/vms/{vm}/files/{f}``, ``PUT /v1/host/incoming/{move}/files/{f}``),
through the same manager methods; the token is compared in constant time
unless the connection came over the owner-only socket. Bytes never enter
Python: reads are ``sendfile``, writes ``splice`` from the socket into the
file. Mutual-TLS listeners do not speak it (the controller copies over HTTP
there). The controller's side is ``fuse.controller.bulk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import json
import logging
import os
import socket
import struct
import threading
from typing import Any, Callable

from ..errors import FuseError, InvalidArgument, NotFound, Unauthorized

MAGIC = b"FUSE-BULK/1 "
FEATURE = "bulk-copy/1"
MAX_HEADER = 4096
PIPE_SIZE = 1 << 20
IO_TIMEOUT_S = 60.0
log = logging.getLogger("fuse.agent")


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Bound every blocking send/receive (``splice`` and ``sendfile``
    included) on a blocking socket: a peer that vanished fails the copy."""
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


def send_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def refusal(exc: FuseError) -> dict[str, Any]:
    return {"ok": False, "status": exc.http_status, **exc.body()}


class BulkServer:
    """Serves bulk operations for one agent; ``protocol`` wraps uvicorn's
    HTTP protocol class so a listener speaks both."""

    def __init__(self, manager: Callable[[], Any], token: str | None):
        self._manager = manager  # the VmManager, once the app has started
        self._token = (token or "").encode()

    def protocol(self, base: type[asyncio.Protocol], trusted: bool) -> type[asyncio.Protocol]:
        server = self

        class WithBulk(base):  # type: ignore[misc, valid-type]
            _sniffed = b""
            _decided = False

            def data_received(self, data: bytes) -> None:
                if self._decided:
                    return super().data_received(data)
                head = self._sniffed + data
                if not head.startswith(MAGIC[:len(head)]):  # plain HTTP
                    self._decided = True
                    return super().data_received(head)
                if b"\n" not in head:
                    if len(head) > MAX_HEADER:
                        self.transport.close()
                    self._sniffed = head
                    return None
                self._decided = True
                self.connections.discard(self)  # no longer uvicorn's connection
                server.start(self.transport, head, trusted)
                return None

        WithBulk.__name__ = f"Bulk{base.__name__}"
        return WithBulk

    # ---- one operation ----------------------------------------------------------
    def start(self, transport: asyncio.Transport, head: bytes, trusted: bool) -> None:
        """Check the header on the event loop, then move the bytes on a
        thread with a blocking duplicate of the socket."""
        transport.pause_reading()
        line, _, rest = head.partition(b"\n")
        raw = transport.get_extra_info("socket")
        try:
            # The token first, whatever else the header holds (README: a caller without it gets
            # 401 whatever it sent): what is wrong with the rest is said only to a caller with it.
            req, problem = _parse_header(line[len(MAGIC):])
            token = req.get("token") if req is not None else None
            given = token.encode(errors="surrogatepass") if isinstance(token, str) else b""
            if not trusted and self._token and not hmac.compare_digest(given, self._token):
                raise Unauthorized("missing or wrong bearer token")
            if rest:
                raise InvalidArgument("bytes arrived before the agent's first reply")
            if req is None:
                raise InvalidArgument(problem)
            mgr = self._manager()
            if mgr is None:
                raise FuseError("the agent is still starting").with_status(503)
            job, done = self._resolve(mgr, req)
        except Exception as exc:
            if not isinstance(exc, FuseError):  # a bug or an I/O error: said and logged, not a silent hang-up
                log.exception("a bulk operation failed before its first reply")  # (its header holds the token)
                exc = FuseError(f"the agent failed: {exc}")
            transport.write(json.dumps(refusal(exc)).encode() + b"\n")
            transport.close()
            return
        try:
            sock = socket.socket(fileno=os.dup(raw.fileno()))
        except OSError:  # out of descriptors: the peer sees the connection end
            done()
            transport.close()
            return
        sock.setblocking(True)
        set_io_timeout(sock, IO_TIMEOUT_S)
        loop = asyncio.get_running_loop()

        released = threading.Event()

        def release() -> None:
            """Run ``done`` on the event loop, once, and wait for it: a write
            counts as ended before its closing reply goes out."""
            if released.is_set():
                return
            applied = threading.Event()

            def apply() -> None:
                done()
                applied.set()
            released.set()
            loop.call_soon_threadsafe(apply)
            applied.wait(5)

        def run() -> None:
            try:
                job(sock, release)
            except (OSError, FuseError):
                pass  # the peer sees the connection end without the closing reply
            finally:
                release()
                sock.close()
                loop.call_soon_threadsafe(transport.close)

        threading.Thread(target=run, name="fuse-bulk", daemon=True).start()

    def _resolve(self, mgr: Any, req: dict[str, Any]) -> tuple[Callable[..., None], Callable[[], None]]:
        """The operation to run on the thread, and what to do on the event
        loop once it ended."""
        op, offset, length = req.get("op"), req.get("offset", 0), req.get("length")
        # (JSON integers only: true is no offset, as the HTTP route's query refuses it)
        if not all(type(n) is int and n >= 0 for n in (offset, length)):
            raise InvalidArgument("offset and length must be non-negative integers")
        if op == "read":
            vm, file = str(req.get("vm")), str(req.get("file"))
            path = mgr.state_file(vm, file)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise NotFound(f"vm {vm}'s state file {file} is listed but gone from this host's disk") from None
            if offset + length > size:
                raise InvalidArgument(f"bytes {offset}..{offset + length} fall outside {path.name} ({size} bytes)")
            return (lambda sock, release: _send_file(sock, path, offset, length)), lambda: None
        if op == "write":
            move = str(req.get("move"))
            path = mgr.incoming.writable(move, str(req.get("file")), offset, length)
            mgr.incoming.writing(move, 1)  # verify and install wait for this write to end
            return ((lambda sock, release: _receive_file(sock, path, offset, length, release)),
                    lambda: mgr.incoming.writing(move, -1))
        raise InvalidArgument(f"unknown bulk operation {op!r}: read or write")


def _parse_header(text: bytes) -> tuple[dict[str, Any] | None, str]:
    """The header's JSON object, or None and why it is none (never an exception:
    this runs before the token is checked)."""
    try:
        req = json.loads(text)
    except RecursionError:
        return None, "bulk header is not JSON: it is nested too deeply"
    except ValueError as exc:
        return None, f"bulk header is not JSON: {exc}"
    if not isinstance(req, dict):
        return None, "bulk header must be a JSON object"
    return req, ""


def _send_file(sock: socket.socket, path, offset: int, length: int) -> None:
    send_line(sock, {"ok": True, "length": length})
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + length
        while offset < end:
            sent = os.sendfile(sock.fileno(), fd, offset, end - offset)
            if sent == 0:
                raise OSError(f"{path.name} ended at {offset}, before {end}")
            offset += sent
    finally:
        os.close(fd)


def _receive_file(sock: socket.socket, path, offset: int, length: int, landed: Callable[[], None]) -> None:
    send_line(sock, {"ok": True})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    r, w = pipe()
    try:
        left, at = length, offset
        while left:
            got = os.splice(sock.fileno(), w, min(left, PIPE_SIZE))
            if got == 0:
                raise OSError(f"the sender stopped {length - left} bytes into {length}")
            while got:
                put = os.splice(r, fd, got, offset_dst=at)
                got, at, left = got - put, at + put, left - put
    finally:
        for x in (r, w, fd):
            os.close(x)
    landed()
    send_line(sock, {"ok": True, "written": length})
