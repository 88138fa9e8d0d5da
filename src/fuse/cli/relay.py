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
to another host), as over `unix://` when the socket is not there. So does a
relay whose agent hung up (died) with nothing sent to it since its last answer:
a request the controller sent on the kept-alive channel then reached no agent
either. One that sent the agent a byte it did not answer exits 0 when the agent
hangs up: the agent may have got the request.
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


def pipe(sock: socket_mod.socket, stdin: int, stdout: int) -> bool:
    """Copy until the agent closes (or the controller does). True when the agent hung up
    first with none of the controller's bytes sent to it since it last said anything: what
    the controller sent since (a create on a kept-alive channel, as the agent died) reached
    no agent. A byte sent and not answered may be a request the agent got: False."""
    cond = threading.Condition()
    # unanswered: a byte went to the agent after the last it sent; heard: how many times the
    # agent sent something (a send it answered while the send was under way is answered, not
    # unanswered); sending: a send under way; ended: the agent's side is done, nothing more is
    # sent; asked_end: the controller closed the channel
    st = {"unanswered": False, "heard": 0, "sending": False, "ended": False, "asked_end": False}

    def upstream() -> None:
        try:
            while True:
                data = os.read(stdin, CHUNK)
                if not data:
                    with cond:
                        st["asked_end"] = True
                    break
                view = memoryview(data)
                while view:
                    with cond:
                        if st["ended"]:
                            return
                        st["sending"], heard = True, st["heard"]
                    sent = 0
                    try:
                        sent = sock.send(view)  # (not under the lock: the agent may be answering)
                    finally:
                        with cond:
                            if sent and st["heard"] == heard:
                                st["unanswered"] = True
                            st["sending"] = False
                            cond.notify_all()
                    view = view[sent:]
        except OSError:
            pass
        # The controller closed the channel (or the agent is gone): nothing more will be
        # asked, so let go of the agent connection, which also ends the loop below.
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
            with cond:  # (before the controller has it: only then may it send its next request)
                st["unanswered"], st["heard"] = False, st["heard"] + 1
            _write_all(stdout, data)
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
            raise
    finally:
        try:  # (a send under way to the agent fails at once: it is gone)
            sock.shutdown(socket_mod.SHUT_RDWR)
        except OSError:
            pass
        with cond:
            settled = cond.wait_for(lambda: not st["sending"], timeout=5)
            st["ended"] = True
            hung_up_first = settled and not st["asked_end"] and not st["unanswered"]
        sock.close()
    return hung_up_first


def relay(
    socket: Optional[Path] = typer.Option(None, help="The agent socket (default: the standard one)."),
) -> None:
    """Hand this channel's requests to the local host agent (run by the controller over SSH)."""
    from ..paths import default_agent_socket, socket_dir_problem

    path = socket or default_agent_socket()
    # (whoever put a socket there would get the requests; no agent serves from such a dir, the
    # servers refuse it for --socket too: review 34, a given --socket was not checked; one the
    # operator named may be the agent's own user's, not the relay's)
    if why := socket_dir_problem(path.parent, any_owner=socket is not None):
        _fail(f"the {'default ' if socket is None else ''}host agent socket {path}: {why}")
    sock = _connect(path)
    if pipe(sock, sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()):
        _fail(f"the host agent at {path} hung up before this relay handed it the request: "
              "is the host agent running?")
