"""`fuse host relay`: the far end of the SSH transport.

Run by the controller over SSH (one process per channel). It connects to
this machine's host agent socket and copies bytes both ways, stdin → socket
and socket → stdout, until either side is done; the controller speaks
HTTP/1.1 through it (see fuse.transport.ssh for the framing). It knows
nothing about HTTP, so it never buffers a body and never re-frames one.

Failures are one sentence on stderr and a non-zero exit: the controller
reports that sentence as the reason the host is unreachable. A relay that
could not connect to the agent exits `NOT_CONNECTED` before it reads a byte of
stdin: the controller then knows the request reached no agent (a create may go
to another host), as over `unix://` when the socket is not there.
"""

from __future__ import annotations

import errno
import os
import socket as socket_mod
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

CHUNK = 1 << 18
# The exit status of a relay that never connected to the agent, so forwarded nothing
# (sysexits' EX_UNAVAILABLE). fuse.transport.ssh.RELAY_NOT_CONNECTED is the same number:
# the transport does not import the CLI, nor the relay asyncssh.
NOT_CONNECTED = 69


def _fail(message: str, code: int = NOT_CONNECTED) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def _connect(path: Path) -> socket_mod.socket:
    sock = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except FileNotFoundError:
        _fail(f"no host agent socket at {path}: is the host agent running?")
    except PermissionError:
        _fail(f"the host agent socket at {path} is owner-only and this login may not open it: "
              "log in as the user that runs the agent")
    except ConnectionRefusedError:
        _fail(f"the host agent socket at {path} refuses connections: is the host agent running?")
    except OSError as exc:
        _fail(f"cannot open the host agent socket at {path}: {exc.strerror or exc}")
    return sock


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def pipe(sock: socket_mod.socket, stdin: int, stdout: int) -> None:
    """Copy until the agent closes (or the controller does)."""

    def upstream() -> None:
        try:
            while True:
                data = os.read(stdin, CHUNK)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        # The controller closed the channel: nothing more will be asked, so
        # let go of the agent connection, which also ends the loop below.
        try:
            sock.shutdown(socket_mod.SHUT_RDWR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while True:
            data = sock.recv(CHUNK)
            if not data:
                break
            _write_all(stdout, data)
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
            raise
    finally:
        sock.close()


def relay(
    socket: Optional[Path] = typer.Option(None, help="The agent socket (default: the standard one)."),
) -> None:
    """Hand this channel's requests to the local host agent (run by the controller over SSH)."""
    from ..paths import default_agent_socket, socket_dir_problem

    if socket is None and (why := socket_dir_problem(default_agent_socket().parent)):
        _fail(f"the default host agent socket {default_agent_socket()}: {why}")  # (it would get the requests)
    sock = _connect(socket or default_agent_socket())
    pipe(sock, sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno())
