"""Run an ASGI app on TCP and/or an owner-only unix socket.

We bind the unix socket ourselves rather than letting uvicorn do it: uvicorn
chmods its sockets 0666, and a control socket must be owner-only (0600, in a
0700 directory when fuse creates the directory). A socket file a live server
still answers on is never taken over (`SocketInUse`): that server would run on
unreachable, its VMs beyond control. One nothing listens on (its server died)
is removed and bound again. A server holds an ``flock`` on ``<socket>.lock`` from
before that check until it exits, so two servers starting at once on one stale
socket cannot both judge it stale (the second would unlink the first's fresh
socket and bind its own): the second finds the lock held and stops as for a live one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import resource
import signal
import socket
import ssl
import stat
import struct
import termios  # (here, never where it is used: importing it opens a file, and a server out of descriptors failed to)
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .envsettings import seconds
from .paths import private_dir, socket_dir_problem
from .statelock import lock_file


def head_timeout_s() -> float:
    """FUSE_HTTP_HEAD_TIMEOUT_S: a connection that has not sent a whole request head this long
    after it opened, or after its last answer, is closed: silent or half-sent connections held
    a descriptor each for good, and enough of them (no token needed to open one) left the
    server none to answer with. Read when a server starts, never as this module loads: the
    --listen option's check imports it while the command line is read, before the command can
    say a bad value in one sentence (review 33: a BadSetting traceback, exit 1)."""
    return seconds("FUSE_HTTP_HEAD_TIMEOUT_S", 30.0)


WAITING_RECHECK_S = 1.0  # a connection a timer would close, with bytes waiting: looked at again after this
LATE_S = 1.0  # a timer this late ran after a pause of the server (a stop, a stall), not a client's silence


def _late(timer: asyncio.TimerHandle | None) -> bool:
    """Whether ``timer`` runs ``LATE_S`` or more after it was due: the server was paused, and
    bytes waiting came meanwhile. (A timer on time closes as ever, whatever waits: a client
    that keeps sending bytes nobody reads never holds a connection open so; the re-check's own
    timer is on time, so a connection gets one second more at most.)"""
    return timer is not None and asyncio.get_running_loop().time() - timer.when() >= LATE_S


def _bytes_waiting(transport) -> bool:
    """Whether bytes the server has not read yet wait on ``transport``'s socket."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
    except OSError:
        return False


def with_head_deadline(base: type[asyncio.Protocol],
                       accepted: Callable[[], None] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base``, closing a connection with no request in flight
    ``head_timeout_s()`` after it opened or answered (uvicorn's keep-alive timer starts only
    after an answer, and stops at the first byte of the next request), or whose request's
    body has sent nothing for that long. ``accepted`` is called as each connection is.

    Its timers close the connection whatever goes wrong as they look at it (then raise, for
    the loop to log): they are not armed again, and one that raised before closing kept its
    connection for good (review 37: out of descriptors, a late timer's look at the bytes
    waiting failed to import ``termios``, so no silent connection was ever closed and they
    held every descriptor, the owner-only socket's included, until their clients let go)."""
    head_s = head_timeout_s()

    class HeadDeadline(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # made as the connection is accepted: on a TLS listener its handshake comes before
            # ``connection_made``, and the head's time counts from here (a peer that took 29 s
            # over its handshake had 30 s more to send nothing)
            self._opened = asyncio.get_running_loop().time()
            if accepted is not None:
                accepted()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # A request whose body stops coming is closed as a stalled head is: this long
            # after its last bytes (it was held for good, a descriptor and a handler each)
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            cycle = getattr(self, "cycle", None)
            if cycle is not None and not cycle.response_complete and getattr(cycle, "more_body", False):
                self._arm_body()

        def _arm_body(self) -> None:
            self._body_timer = asyncio.get_running_loop().call_later(head_s, self._no_body)

        def _no_body(self) -> None:
            self._body_timer = None
            t = getattr(self, "transport", None)
            cycle = getattr(self, "cycle", None)
            if (t is None or t.is_closing() or t.get_protocol() is not self or cycle is None
                    or cycle.response_complete or not getattr(cycle, "more_body", False)):
                return
            if getattr(getattr(self, "flow", None), "read_paused", False):
                self._arm_body()  # (the app has not read what came: not the client stalling; looked at again)
                return
            t.close()

        def _arm(self, after: float | None = None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = asyncio.get_running_loop().call_later(head_s if after is None else after,
                                                                    self._no_head)

        def _no_head(self) -> None:
            late = _late(self._head_timer)
            self._head_timer = None
            try:
                if late and (t := self._idle()) is not None and _bytes_waiting(t):
                    self._arm(WAITING_RECHECK_S)  # (a head came while the server was stopped: read, not cut)
                    return
            except BaseException:
                self._close_idle()
                raise
            self._close_idle()

        def _idle(self) -> asyncio.Transport | None:
            """This connection's transport when it is ours still and no request is in flight."""
            t = getattr(self, "transport", None)
            if t is None or t.is_closing() or t.get_protocol() is not self:
                return None
            if (conns := getattr(self, "connections", None)) is not None and self not in conns:
                return None  # (uvicorn's no longer: the agent's bulk copy has it)
            cycle = getattr(self, "cycle", None)
            if cycle is None or cycle.response_complete:  # (no request in flight: none came whole)
                return t
            return None

        def _close_idle(self) -> None:
            if (t := self._idle()) is not None:
                t.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(head_s - (asyncio.get_running_loop().time() - self._opened))

        def timeout_keep_alive_handler(self) -> None:
            # A request that came as uvicorn's keep-alive timer ran out (the server paused —
            # a stopped process, a stalled machine — or a client that sent just then): the
            # timer can run before the bytes are read, and closing with them unread resets the
            # connection (the request lost: a sleep sent while the agent was stopped 6 s)
            t = getattr(self, "transport", None)
            try:
                if (_late(self.timeout_keep_alive_task) and t is not None and not t.is_closing()
                        and _bytes_waiting(t)):
                    self.timeout_keep_alive_task = asyncio.get_running_loop().call_later(
                        WAITING_RECHECK_S, self.timeout_keep_alive_handler)
                    return
            except BaseException:
                super().timeout_keep_alive_handler()
                raise
            super().timeout_keep_alive_handler()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._head_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = None
            super().connection_lost(exc)

    HeadDeadline.__name__ = f"HeadDeadline{base.__name__}"
    return HeadDeadline


log = logging.getLogger("fuse.serving")

ACCEPT_REMIND_S = 60.0  # while accepts fail (out of descriptors), said again this often
ACCEPT_SETTLE_S = 5.0  # accepts that worked this long with none failing: they work again
# Connections a listener's queue holds, and accepts tried in a turn of the loop: asyncio tries
# that many even once the first fails out of descriptors, each failure reported and a retry
# timer armed (uvicorn's 2048 made a storm of them each second, review 37)
LISTEN_BACKLOG = 512
_ACCEPT_OUT_OF = "socket.accept() out of system resource"  # asyncio's words for it


class AcceptFailures:
    """A loop exception handler that says accepts failing for want of a resource (EMFILE:
    the process's descriptors all held) in one line when they start, again every
    ``ACCEPT_REMIND_S`` while they go on, and once when a connection was accepted and none
    failed for ``ACCEPT_SETTLE_S`` (at the limit, each connection closed lets one in before
    the next fails: said each time, it was a line a second), rather than asyncio's traceback
    for each try (review 37: ~1.7 MB of log a second, the loop busy writing it). Anything
    else goes to the handler it was installed over."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.before: Callable[..., Any] | None = None  # the handler installed over
        self._said = 0.0  # when the failures were last said (0: none since accepts last worked)
        self._started = 0.0
        self._failed = 0  # accepts failed since they were last said
        self._total = 0  # since they started
        self._last_failed = 0.0
        self._settle: asyncio.TimerHandle | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.before = loop, loop.get_exception_handler()
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") != _ACCEPT_OUT_OF or not isinstance(exc, OSError):
            if self.before is not None:
                self.before(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = self._last_failed = time.monotonic()
        self._failed += 1
        self._total += 1
        if not self._said:
            self._started = now
            limit = f" (the open-file limit is {_nofile()[0]})" if exc.errno == errno.EMFILE else ""
            log.warning("accepting connections fails: %s%s: clients wait in the listen queue; said "
                        "again every %g s while it lasts", exc.strerror or exc, limit, ACCEPT_REMIND_S)
        elif now - self._said >= ACCEPT_REMIND_S:
            log.warning("accepting connections still fails: %s (%d tries failed in %.0f s)",
                        exc.strerror or exc, self._failed, now - self._said)
        else:
            return
        self._said, self._failed = now, 0

    def accepted(self) -> None:
        """A connection was accepted: accepts work again once none failed for ``ACCEPT_SETTLE_S``."""
        if self._said and self._settle is None and self.loop is not None:
            self._settle = self.loop.call_later(ACCEPT_SETTLE_S, self._settled)

    def _settled(self) -> None:
        self._settle = None
        if not self._said:
            return
        if (quiet := time.monotonic() - self._last_failed) < ACCEPT_SETTLE_S:
            if self.loop is not None:  # (failed since: looked at again once it could have settled)
                self._settle = self.loop.call_later(ACCEPT_SETTLE_S - quiet, self._settled)
            return
        log.warning("accepting connections works again (%d tries failed over %.0f s)",
                    self._total, self._last_failed - self._started)
        self._said, self._failed, self._total = 0.0, 0, 0

    def remove(self) -> None:
        if self._settle is not None:
            self._settle.cancel()
            self._settle = None
        if self.loop is not None and self.loop.get_exception_handler() is self:
            self.loop.set_exception_handler(self.before)


def _nofile() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


LOW_NOFILE = 4096  # an open-file limit below this is said as a server starts: a connection holds one
NOFILE_MOST = 65536  # the soft limit a server raises itself to, at most (its hard limit permitting)


def raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard one (at most ``NOFILE_MOST``): each connection, each VM's sockets
    and logs hold a descriptor, and the soft limit is often 1024 (systemd's default) while
    the hard one allows far more (review 37: idle connections, no token needed, took them
    all). A limit that stays low is said, with how to raise it."""
    soft, hard = _nofile()
    # at most NOFILE_MOST: the processes started from here (QEMU, Firecracker, a VM's tools)
    # inherit it, and a program that closes every descriptor up to its limit, or sizes a
    # table by it, takes a while over a billion (an unlimited hard limit is fs.nr_open)
    want = NOFILE_MOST if hard == resource.RLIM_INFINITY else min(hard, NOFILE_MOST)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, _nofile()[1]))
    soft = _nofile()[0]
    if soft != resource.RLIM_INFINITY and soft < LOW_NOFILE:
        log.warning("the open-file limit is %d (its hard limit %s): each connection holds one, so "
                    "this many clients at once leave none to answer with; raise it "
                    "(LimitNOFILE= in a systemd unit, ulimit -Hn)", soft, _nofile()[1])


class SocketInUse(OSError):
    """A running server answers on the socket path we were to bind."""


def socket_in_use(path: Path) -> bool:
    """Whether a server accepts connections on unix socket ``path``. A file
    whose connect is refused (its server died and left it) or that is missing
    is not in use; any other answer (one that accepts, a full backlog, no
    permission to try) is, since only a refusal proves nothing listens."""
    if not (path.exists() or path.is_symlink()):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


_socket_locks: dict[str, int] = {}  # socket path -> its held lock file's descriptor, for the process's life


def _lock_socket(path: Path) -> bool:
    """Hold ``<path>.lock`` for the rest of this process's life; False when another process holds it."""
    key = str(path.absolute())
    if key in _socket_locks:
        return True
    fd = lock_file(f"{key}.lock")
    if fd is None:
        return False
    _socket_locks[key] = fd
    return True


def _unlock_socket(path: Path) -> None:
    fd = _socket_locks.pop(str(path.absolute()), None)
    if fd is not None:
        os.close(fd)


# sockaddr_un's sun_path: 108 bytes on Linux, its NUL included
MAX_SOCKET_PATH_BYTES = 107


def socket_path_problem(path: Path) -> str | None:
    """Why a server cannot take ``path`` for its socket (one line), or None. Only a socket
    file is ever replaced: a regular file, a directory or a symbolic link there is somebody's,
    never removed (a mistyped ``--socket`` would have deleted it)."""
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH_BYTES:
        return (f"--socket {path}: the path is {len(os.fsencode(str(path)))} bytes; a unix socket's "
                f"path is at most {MAX_SOCKET_PATH_BYTES}: choose a shorter one")
    if why := socket_dir_problem(path.parent):
        return f"--socket {path}: {why}"
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"--socket {path}: {exc.strerror or exc}"
    if stat.S_ISSOCK(mode):
        return None
    kind = ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "not a socket")
    return f"--socket {path}: the path is {kind}, not a socket; it is left as it is: choose another path"


def owner_only_socket(path: Path) -> socket.socket:
    if why := socket_path_problem(path):  # (the CLIs say it before they start; this never deletes a file)
        raise ValueError(why)
    private_dir(path.parent)  # every directory made for it 0700, whatever the umask
    if why := socket_dir_problem(path.parent):  # (made by another user between the check and the mkdir)
        raise ValueError(f"--socket {path}: {why}")
    if not _lock_socket(path):
        raise SocketInUse(f"socket {path} is in use by a running server (it holds {path}.lock)")
    if path.exists() or path.is_symlink():
        if socket_in_use(path):
            raise SocketInUse(f"socket {path} is in use by a running server")
        path.unlink()  # stale: left by a server that died
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM once it has stopped, which kills the
    process before our clean-up (the socket file) runs; `serve` handles the
    signals itself instead, for all its servers at once."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def trusted(app: Any) -> Any:
    """Mark requests that arrive over the owner-only socket: file-system
    permissions already authenticated them, so no bearer token is asked."""

    async def wrapper(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope, fuse_trusted=True)
        await app(scope, receive, send)

    return wrapper


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen wants HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


STARTUP_FAILED = 3  # the exit status of a server whose app did not start (uvicorn's)


async def serve(app: Any, *, listen: str | None = None, socket_path: Path | None = None,
                ssl_options: dict[str, Any] | None = None, ready: asyncio.Event | None = None,
                banner: str | None = None) -> None:
    """Serve until cancelled or signalled. The app's lifespan runs here, around every
    listener: its startup before any accepts, its shutdown (a controller closes its store
    and its clients, an agent its event log) once each has answered its requests in flight
    (review 36: run by the TCP listener, it closed them under a create still in flight on
    the socket: the caller got a false 502, the agent's answer was a 500 and the VM's event
    was lost). ``banner`` is printed once every listener accepts (after the app's startup,
    which may take seconds: an agent settles its accelerator), so a script that waits for
    it can connect at once."""
    servers: list[tuple[uvicorn.Server, list[socket.socket] | None]] = []
    lifespan = "off"  # (each listener's; the app's own is run below)
    # An app with a bulk server (the agent's) speaks its copy protocol on
    # plain listeners too; mutual-TLS listeners stay HTTP only.
    bulk = getattr(getattr(app, "state", None), "bulk", None)

    accepts = AcceptFailures()

    def http(trusted: bool, tls: bool = False) -> Any:
        base = with_head_deadline(AutoHTTPProtocol, accepts.accepted)
        return bulk.protocol(base, trusted) if bulk and not tls else base

    if listen:
        host, port = parse_listen(listen)
        cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                             backlog=LISTEN_BACKLOG, http=http(False, bool(ssl_options)), **(ssl_options or {}))
        servers.append((_Server(cfg), None))
    if socket_path:
        sock = owner_only_socket(Path(socket_path))
        cfg = uvicorn.Config(trusted(app), log_level="warning", lifespan=lifespan, backlog=LISTEN_BACKLOG,
                             http=http(True))
        servers.append((_Server(cfg), [sock]))
    if not servers:
        raise ValueError("nothing to serve on: give a listen address or a socket path")
    raise_fd_limit()
    loop = asyncio.get_running_loop()
    if ssl_options:
        handshake_deadline(loop)

    def stop() -> None:
        for s, _ in servers:
            s.should_exit = True
        # requests that wait on purpose (a long poll) end now rather than hold the stop up:
        # the server waits for every request in flight before it lets the process go
        if (stopping := getattr(getattr(app, "state", None), "stopping", None)) is not None:
            stopping()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
    life_cfg = uvicorn.Config(app, log_level="warning", lifespan="on")
    life_cfg.load()
    life = life_cfg.lifespan_class(life_cfg)
    tasks: list[asyncio.Task] = []
    done: set[asyncio.Task] = set()

    async def _ready():
        while not all(s.started for s, _ in servers):
            await asyncio.sleep(0.02)
        if banner:
            print(_bound(banner, listen, servers[0][0]), flush=True)
        if ready:
            ready.set()

    started = failed = False
    accepts.install(loop)
    try:
        await life.startup()
        if life.should_exit:  # (the app's startup failed: uvicorn logged why; nothing is served)
            failed = True
            return
        started = True
        tasks = [asyncio.create_task(_serving(s, socks)) for s, socks in servers]
        asyncio.create_task(_ready())
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s, _ in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        if started:
            await life.shutdown()
        if socket_path and Path(socket_path).exists():
            Path(socket_path).unlink()
        if socket_path:
            _unlock_socket(Path(socket_path))  # (after the unlink: a successor binds a fresh file)
        accepts.remove()
        if failed:  # (uvicorn's exit status for it, as when it ran the lifespan: a supervisor restarts it)
            raise SystemExit(STARTUP_FAILED)
    # A server that failed to start (TLS files it cannot load, say) raised: say so, never a
    # quiet return that exits 0 as if asked to stop.
    for t in done:
        if not t.cancelled() and (exc := t.exception()) is not None:
            raise exc
        if not t.cancelled() and t.result() is not None:  # (a listener that could not start: its status)
            raise SystemExit(t.result())


async def _serving(server: uvicorn.Server, socks: list[socket.socket] | None) -> Any:
    """``server.serve``; uvicorn's own exit on a listener that cannot start (its port in use:
    ``sys.exit(3)``) comes back as its status, for `serve` to exit with once the app's shutdown
    has run (raised from the task, it ended the loop under the lifespan: a traceback of its
    cancellation after the one-line error)."""
    try:
        await server.serve(sockets=socks)
    except SystemExit as exc:
        return exc.code if exc.code is not None else 0
    return None


def _bound(banner: str, listen: str | None, server: uvicorn.Server) -> str:
    """``banner`` with a ``--listen`` of port 0 (any free port) naming the port the system
    gave, which the operator needs to register or reach it (said as ``HOST:0``, it was found
    only with ``ss``)."""
    if not listen or parse_listen(listen)[1] != 0:
        return banner
    with contextlib.suppress(AttributeError, IndexError, OSError):
        port = server.servers[0].sockets[0].getsockname()[1]
        return banner.replace(listen, f"{listen.rsplit(':', 1)[0]}:{port}", 1)
    return banner


def handshake_deadline(loop: asyncio.AbstractEventLoop) -> None:
    """TLS listeners on ``loop`` close a connection whose handshake is not done
    ``head_timeout_s()`` after it was accepted: uvicorn opens them with asyncio's default
    of 60 s and no way to set it, so a peer with no certificate at all held one that
    long, whatever ``FUSE_HTTP_HEAD_TIMEOUT_S`` said (the head's deadline starts once
    the handshake is done)."""
    create = loop.create_server
    if getattr(create, "fuse_handshake_deadline", False):
        return
    head_s = head_timeout_s()

    async def create_server(*args, **kwargs):
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", head_s)
        return await create(*args, **kwargs)

    create_server.fuse_handshake_deadline = True  # type: ignore[attr-defined]
    loop.create_server = create_server  # type: ignore[method-assign]


def tls_server_options(cert: str, key: str, ca: str) -> dict[str, Any]:
    """uvicorn options for a mutual-TLS listener: only clients whose
    certificate the CA signed get in."""
    return {"ssl_certfile": cert, "ssl_keyfile": key, "ssl_ca_certs": ca,
            "ssl_cert_reqs": ssl.CERT_REQUIRED}
