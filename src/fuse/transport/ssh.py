"""`ssh://user@host[:port]`: the host API over an SSH login.

How a request travels:

    controller ── one SSH connection per host (asyncssh, keys only) ──▶ sshd
      channel: exec `fuse host relay`  ◀── stdin/stdout ──▶  agent's unix socket

Framing. The relay is a dumb byte pipe: it connects to the agent's owner-only
socket and copies stdin → socket and socket → stdout until either side
closes. Everything HTTP happens here: `SshTransport` writes real HTTP/1.1
requests into the channel with h11 and parses the agent's responses out of it,
so bodies stream in both directions in whatever chunks they come (a move's
4 MiB pieces go through untouched and are never base64'd or re-framed).

A channel is an HTTP/1.1 keep-alive connection to the agent. Starting the
relay costs a Python start-up on the host, so a finished channel is kept for
the next request, but only for `IDLE_CHANNEL_S`: uvicorn closes idle
keep-alive connections after 5 s and we must not race it. At most
`MAX_CHANNELS` are open per connection (sshd's MaxSessions defaults to 10).

The SSH connection is shared by every `SshTransport` of the same target on
the same event loop, opened lazily, reopened when lost, and closed
`IDLE_CONNECTION_S` after its last user let go.

Batch mode: only public keys are tried (never a password or
keyboard-interactive prompt). The host key must be in known_hosts. Every
failure becomes `HostUnreachable` with one sentence (`NotAnAgent` when the
relay answers with something that is not HTTP: FUSE_SSH_RELAY is not the
agent's relay). A relay that could not connect to the agent exits
`RELAY_NOT_CONNECTED` having forwarded nothing: its failure is one the host
never got (`maybe_sent` False), as a unix:// socket that is not there. So does
a relay whose agent hung up with nothing of the request sent to it (an agent
that died under a kept channel): such a request is sent once more on a new
channel, whatever its method, since it reached no agent.

A host that stops answering (frozen, TCP still open) costs a request at most
one bound, and the reason quotes the time really waited: connect + handshake
+ login, and opening a channel on the shared connection, each take at most
`FUSE_SSH_CONNECT_TIMEOUT` or the caller's own timeout, whichever is tighter.
A channel that does not open in time drops the connection (it is silent: the
next request dials again rather than wait on it), and so does SSH keepalive
when the server has said nothing for `KEEPALIVE_S * (KEEPALIVE_COUNT_MAX + 1)`
seconds, which bounds a long request (a create, a move's chunk) on a frozen
host: its reason says the host did not answer within the time the request
waited (`_Channel.failure`), never that the relay ended. The default bound,
5 s, is the poller's own per-poll timeout, so every surface (a poll, a
create, usage) quotes the same time for the same host.

Environment (read when a connection is opened):

    FUSE_SSH_KEY               private key to use (default: ~/.ssh/id_* and the SSH agent)
    FUSE_SSH_KNOWN_HOSTS       known_hosts file (default: ~/.ssh/known_hosts), read as
                               OpenSSH reads it: a line it skips is skipped (`_known_hosts`)
    FUSE_SSH_RELAY             command run on the host (default: `fuse host relay`)
    FUSE_SSH_CONNECT_TIMEOUT   seconds (default 5), as above

asyncssh also reads the controller user's ~/.ssh/config, as `ssh` does: one it cannot
use is NotTrusted naming the file and the line, a mistake to fix, never an outage.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import shlex
import socket
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import asyncssh
import h11
import httpx

from ..envsettings import seconds
from ..errors import HostUnreachable, NotAnAgent, NotTrusted
from .address import BadAddress, parse_address

DEFAULT_RELAY = "fuse host relay"
CONNECT_TIMEOUT_S = 5.0   # FUSE_SSH_CONNECT_TIMEOUT's default
KEEPALIVE_S = 5.0         # a keepalive after this long without a word from the server...
KEEPALIVE_COUNT_MAX = 1   # ...and the connection is dropped once this many went unanswered (10 s silent)
IDLE_CHANNEL_S = 2.0
REUSE_RACE_S = 1.0  # a reused idle channel closed within this of our request: the agent's close raced it
IDLE_CONNECTION_S = 60.0
MAX_CHANNELS = 8
READ_SIZE = 1 << 18
RELAY_STDERR_MAX = 1 << 16  # what a failed relay said: enough for its last line, never unbounded
SEEN_MAX = 64               # the first bytes of an answer kept, to quote one that is not HTTP
# What sshd may write on a session's stderr before the command runs: notices, not failures.
SSHD_NOTICES = ("Could not chdir to home directory", "Warning: no access to tty", "Last login:")
# `fuse host relay`'s exit status when it could not connect to the agent (fuse.cli.relay.NOT_CONNECTED):
# it read none of the request, so the host never got it (a create may go to another host)
RELAY_NOT_CONNECTED = 69
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
TOLD_MAX = 256  # the skipped known_hosts lines and unforeseen failures logged, so each is logged once

log = logging.getLogger("fuse.transport.ssh")
_told: set[tuple] = set()


@dataclass(frozen=True)
class SshTarget:
    user: str
    host: str
    port: int

    @classmethod
    def parse(cls, addr: str) -> "SshTarget":
        """`BadAddress` (a ValueError, 400) for anything that is not ssh://[USER@]HOST[:PORT]."""
        a = parse_address(addr)
        if a.kind != "ssh":
            raise BadAddress(f"address {addr!r} is not ssh://USER@HOST[:PORT]")
        return cls(user=a.user or getpass.getuser(), host=a.host, port=a.port or 22)

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"ssh://{self.user}@{self.hostport}"


@dataclass(frozen=True)
class SshOptions:
    key: str | None
    known_hosts: str
    relay: str
    connect_timeout: float

    @classmethod
    def from_env(cls) -> "SshOptions":
        return cls(key=os.environ.get("FUSE_SSH_KEY") or None,
                   known_hosts=os.environ.get("FUSE_SSH_KNOWN_HOSTS") or str(Path.home() / ".ssh/known_hosts"),
                   relay=os.environ.get("FUSE_SSH_RELAY") or DEFAULT_RELAY,
                   connect_timeout=seconds("FUSE_SSH_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S))


# ---------------------------------------------------------------- connecting

def _tell_once(key: tuple, msg: str, *args, exc_info: bool = False) -> None:
    """A warning logged once per ``key``: a poller dials a host every second while it is out."""
    if key in _told:
        return
    if len(_told) >= TOLD_MAX:
        _told.clear()
    _told.add(key)
    log.warning(msg, *args, exc_info=exc_info)


def _known_hosts(path: str, target: SshTarget) -> asyncssh.SSHKnownHosts:
    """The known_hosts file read as OpenSSH reads it: a line it cannot use (an unknown
    @marker, one field, a hash type it does not know) is skipped, and bytes that are
    not UTF-8 (a Latin-1 comment) match nothing, rather than failing the whole file
    (asyncssh's own reader raised on them, and every SSH request of the controller was a
    500: review 35). The file is OpenSSH's (~/.ssh/known_hosts by default), and `ssh`
    with it logs in, so fuse trusts the same keys; each line skipped is logged once,
    naming the file and the line. NotTrusted when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise NotTrusted(f"the known_hosts file {path} cannot be read ({exc.strerror or exc}), so the SSH "
                         f"host key of {target.hostport} cannot be checked") from None
    known = asyncssh.SSHKnownHosts()
    for n, raw in enumerate(data.split(b"\n"), 1):  # (lines as OpenSSH splits them)
        line = raw.decode(errors="replace")  # (U+FFFD matches no host name: as OpenSSH's bytes do not)
        try:
            known.load(line)
        except Exception as exc:  # (asyncssh's ValueError, or anything else a line it cannot parse raised)
            _tell_once(("skipped", path, n, raw), "known_hosts file %s line %d is skipped, as OpenSSH skips it: %s",
                       path, n, exc)
    return known


def _by_name(known: asyncssh.SSHKnownHosts):
    """known_hosts matched by the host as the address names it, as OpenSSH does
    (asyncssh on its own also takes a key filed under the peer's IP address, so a
    key trusted for 127.0.0.1 would pass for localhost)."""
    def match(host: str, addr: str, port: int | None):
        return known.match(host, "", port)
    return match


def _config_not_utf8() -> str:
    """Where the controller user's ~/.ssh/config is not UTF-8 text ("PATH line N"), or ""."""
    path = Path.home() / ".ssh" / "config"
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode()
        except UnicodeDecodeError:
            return f"{path} line {n}"
    return ""


async def _connect(t: SshTarget, o: SshOptions, timeout: float, quoted: float | None = None
                   ) -> asyncssh.SSHClientConnection:
    """Log in, batch mode, within `timeout`; every failure is one sentence. `quoted`: the
    request's whole bound, which a reconnect's `timeout` is what is left of."""
    if not Path(o.known_hosts).is_file():
        raise NotTrusted(f"no known_hosts file at {o.known_hosts}, so the SSH host key of {t.hostport} "
                         f"cannot be checked: add it (ssh-keyscan -p {t.port} {shlex.quote(t.host)} >> "
                         f"{shlex.quote(str(o.known_hosts))})")
    keys: dict = {}
    if o.key:
        if not Path(o.key).is_file():
            raise NotTrusted(f"no SSH key at {o.key} (FUSE_SSH_KEY)")
        keys = {"client_keys": [o.key], "agent_path": None}
    which_key = f"the key {o.key} is not" if o.key else "none of the default keys (~/.ssh/id_*, the SSH agent) is"
    known = _known_hosts(o.known_hosts, t)
    try:
        return await asyncio.wait_for(asyncssh.connect(
            t.host, t.port, username=t.user, known_hosts=_by_name(known),
            # Keys only: nothing may ever prompt (batch mode).
            preferred_auth="publickey", password=None, password_auth=False, kbdint_auth=False,
            host_based_auth=False, gss_auth=False,
            connect_timeout=timeout, login_timeout=timeout,
            keepalive_interval=KEEPALIVE_S, keepalive_count_max=KEEPALIVE_COUNT_MAX, **keys), timeout + 1)
    except asyncssh.HostKeyNotVerifiable as exc:
        if "revoked" in str(exc.reason):  # (asyncssh's "Host key is revoked", "Host CA key is revoked")
            which = "the CA key that signed it is" if "CA key" in str(exc.reason) else "it is"
            raise NotTrusted(f"the SSH host key of {t.hostport} is not trusted: {which} marked @revoked in "
                             f"{o.known_hosts}") from None
        raise NotTrusted(f"the SSH host key of {t.hostport} is not trusted: it is missing from or does not "
                              f"match {o.known_hosts}") from None
    except asyncssh.PermissionDenied:
        raise NotTrusted(f"SSH login as {t.user} on {t.hostport} was refused: {which_key} "
                         "authorised there (batch mode: no password is ever asked)") from None
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        if isinstance(exc, asyncssh.KeyEncryptionError) or "passphrase" in str(exc).lower():
            raise NotTrusted(f"the SSH key {o.key} cannot be used without a prompt: {exc}") from None
        # (not encrypted: not a private key at all — a public key given by mistake, say)
        hint = f": give the private key, {str(o.key)[:-4]}" if str(o.key).endswith(".pub") else ""
        raise NotTrusted(f"the SSH key {o.key} is not a private key fuse can read ({exc}){hint}") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise HostUnreachable(f"SSH to {t.hostport} did not connect, shake hands and log in within "
                              f"{quoted or timeout:g} s") from None
    except ConnectionRefusedError:
        raise HostUnreachable(f"connection to {t.hostport} was refused: is sshd listening on port {t.port}?") from None
    except socket.gaierror as exc:
        raise HostUnreachable(f"cannot resolve the host name {t.host}: {exc.strerror}") from None
    except asyncssh.DisconnectError as exc:
        raise HostUnreachable(f"SSH to {t.hostport} failed: {exc.reason}") from None
    except OSError as exc:
        raise HostUnreachable(f"cannot reach {t.hostport} over SSH: {exc.strerror or exc}") from None
    # The controller user's ~/.ssh/config (and what it includes), which asyncssh reads for
    # every connection: one it cannot parse is the controller's mistake to fix, named with
    # its line (these were 500s, and a poller's traceback every second: review 35)
    except asyncssh.ConfigParseError as exc:
        raise NotTrusted(f"SSH to {t.hostport} cannot start: the controller's SSH client configuration cannot "
                         f"be used ({exc}); fix that line") from None
    except UnicodeDecodeError:
        where = _config_not_utf8() or "~/.ssh/config or a file it includes"
        raise NotTrusted(f"SSH to {t.hostport} cannot start: the controller's SSH client configuration is not "
                         f"UTF-8 text at {where}, which fuse's SSH client cannot read; write it in UTF-8") from None
    except Exception as exc:
        # Whatever else asyncssh raises: still one sentence, so the poller marks the host
        # disconnected, usage lists it unreachable and a create passes on (never a 500);
        # the traceback, a bug to report, is logged once.
        _tell_once(("connect", str(t), type(exc).__name__, str(exc)), "SSH to %s failed unexpectedly",
                   t.hostport, exc_info=True)
        raise HostUnreachable(f"SSH to {t.hostport} failed unexpectedly ({type(exc).__name__}: {exc}); the "
                              "controller's log has the details") from None


def _keepalive_lost(cause: BaseException | None) -> bool:
    """Whether asyncssh dropped the connection as silent (its own words: "Server not
    responding to keepalive"): the host froze."""
    return isinstance(cause, asyncssh.ConnectionLost) and "keepalive" in str(cause.reason)


class _NoAnswer(Exception):
    """No whole response head came on the channel: safe to retry on a fresh one.
    `cause`: what broke the read (None: the relay closed its output)."""

    def __init__(self, cause: BaseException | None = None):
        super().__init__()
        self.cause = cause


class _Channel:
    """One relay process: an HTTP/1.1 keep-alive connection to the agent."""

    def __init__(self, process: asyncssh.SSHClientProcess, conn: asyncssh.SSHClientConnection | None = None):
        self.process = process
        self.conn = conn             # the connection it runs on
        self.http = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.reused = False
        self.closed = False
        self.sent_at = 0.0           # when the current request started going out (loop time)
        self.seen = bytearray()      # the first bytes that came back for it (SEEN_MAX at most)

    def usable(self, now: float) -> bool:
        return (not self.closed and self.process.exit_status is None and not self.process.stdout.at_eof()
                and now - self.idle_since < IDLE_CHANNEL_S)

    async def write(self, data: bytes, timeout: float | None) -> None:
        if data:
            self.process.stdin.write(data)
            await asyncio.wait_for(self.process.stdin.drain(), timeout)

    async def next_event(self, timeout: float | None):
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await asyncio.wait_for(self.process.stdout.read(READ_SIZE), timeout)
            if len(self.seen) < SEEN_MAX:
                self.seen += data[:SEEN_MAX - len(self.seen)]
            self.http.receive_data(data)  # b"" is end of stream: h11 decides if that was fine

    async def failure(self, target: SshTarget, relay: str, cause: BaseException | None,
                      silent: bool = False) -> HostUnreachable:
        """Why no response came, as the error to raise, in one sentence. Only a relay
        that ended is asked why (`reason`): one that answered in another protocol is
        not the agent (`NotAnAgent`), and one whose SSH connection was dropped as silent
        (keepalive unanswered, or ``silent``: another request found it so; the host
        froze) never ended, the host did not answer."""
        if isinstance(cause, h11.RemoteProtocolError) and self.seen and not self.seen.startswith(b"HTTP/"):
            said = bytes(self.seen).decode(errors="replace").splitlines()[0][:40] or repr(bytes(self.seen[:16]))
            return NotAnAgent(f"the relay command `{relay}` on {target.hostport} answered with something that is "
                              f"not HTTP ({said!r}), so it is not a fuse agent: FUSE_SSH_RELAY must run "
                              "`fuse host relay`, which hands each request to the host agent")
        if _keepalive_lost(cause):
            waited = asyncio.get_running_loop().time() - self.sent_at
            quiet = KEEPALIVE_S * (KEEPALIVE_COUNT_MAX + 1)
            return HostUnreachable(f"{target} did not answer within {waited:.1f} s: the SSH server said nothing "
                                   f"for {quiet:g} s (keepalive went unanswered), so the connection was dropped")
        if silent:
            waited = asyncio.get_running_loop().time() - self.sent_at
            return HostUnreachable(f"{target} did not answer within {waited:.1f} s: its SSH connection went silent "
                                   "(a new channel did not open in time), so it was dropped")
        err = HostUnreachable(await self.reason(target, relay))
        if self.process.exit_status == RELAY_NOT_CONNECTED and not self.seen:
            # the relay's connection to the agent never opened, as a unix:// socket's that is
            # not there: the request went no further than the relay
            err.maybe_sent = False
        return err

    async def reason(self, target: SshTarget, relay: str) -> str:
        """Why the relay ended without answering, in one sentence."""
        try:
            await asyncio.wait_for(self.process.wait_closed(), 3)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass
        err = b""
        try:
            while len(err) < RELAY_STDERR_MAX:
                got = await asyncio.wait_for(self.process.stderr.read(4096), 1)
                if not got:
                    break
                err += got
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass
        # The last line that is the relay's own: sshd's notices (a login account's
        # missing home directory) come first and are not why it failed.
        lines = [ln.strip() for ln in err.decode(errors="replace").splitlines()]
        text = next((ln for ln in reversed(lines) if ln and not ln.startswith(SSHD_NOTICES)), "")
        status = self.process.exit_status
        if status == 127:
            return (f"the relay command `{relay}` was not found on {target.hostport}: install fuse there "
                    "or set FUSE_SSH_RELAY")
        if text:
            return f"{target}: {text}"
        if status:
            return f"the relay command `{relay}` on {target.hostport} failed (exit {status}) without saying why"
        if status is None:  # (no exit status came: the SSH channel or connection was cut, not the relay)
            return f"the SSH connection to {target.hostport} was dropped before the host answered"
        # (the relay ends once the agent hangs up its socket: worded as the other transports word it)
        return (f"the connection to the host agent through {target.hostport} was dropped before the host "
                "answered (its relay ended, exit 0)")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.process.close()


class _SessionsFull(Exception):
    """sshd refused one more session on a live connection: its MaxSessions is lower than ours."""


class _Shared:
    """The one SSH connection to a target (per event loop) and its idle channels."""

    def __init__(self, target: SshTarget):
        self.target = target
        self.conn: asyncssh.SSHClientConnection | None = None
        self.lock = asyncio.Lock()
        self.open = 0                 # channels open, busy or idle (sshd's MaxSessions counts both)
        self.most = MAX_CHANNELS      # at most open: lower once sshd refuses a session (its MaxSessions)
        self.wake = asyncio.Event()   # a channel came back or closed
        self.idle: list[_Channel] = []
        self.users = 0
        self._closer: asyncio.TimerHandle | None = None
        # connections dropped because they went silent (a channel did not open in time):
        # what ended their other channels' requests was the host, not their relays
        self.silent: weakref.WeakSet = weakref.WeakSet()

    async def connection(self, opts: SshOptions, timeout: float, deadline: float) -> asyncssh.SSHClientConnection:
        """The open connection, or a new one by `deadline` (another request may be
        dialling: its wait counts too). `timeout` is the bound the reason quotes."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self.lock.acquire(), max(deadline - loop.time(), 0.01))
        except asyncio.TimeoutError:
            raise HostUnreachable(f"SSH to {self.target.hostport} did not connect, shake hands and log in "
                                  f"within {timeout:g} s") from None
        try:
            if self.conn is None or self.conn.is_closed():
                self._drop_idle()
                self.conn = await _connect(self.target, opts, max(deadline - loop.time(), 0.01), quoted=timeout)
                self.most = MAX_CHANNELS  # (learnt again of this connection)
            return self.conn
        finally:
            self.lock.release()

    def lost(self, conn: asyncssh.SSHClientConnection) -> None:
        if self.conn is conn:
            self.conn = None
            self._drop_idle()
            conn.close()

    async def channel(self, opts: SshOptions, timeout: float) -> _Channel:
        """An idle channel if one is still fresh, else a new one; with
        `MAX_CHANNELS` busy, wait for one to come back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            now = loop.time()
            while self.idle:
                ch = self.idle.pop()
                if ch.usable(now):
                    ch.reused = True
                    return ch
                self.discard(ch)
            if self.open < self.most:
                self.open += 1
                try:
                    return await self._open(opts, timeout, deadline)
                except _SessionsFull:
                    # the sessions open are all sshd allows on one connection: wait for one of
                    # them to come back, as when ours are all busy (the connection is fine)
                    self.open -= 1
                    self.most = max(1, self.open)
                    continue
                except BaseException:
                    self.open -= 1
                    self.wake.set()
                    raise
            self.wake.clear()
            if now >= deadline:
                raise HostUnreachable(f"all {self.most} SSH channels to {self.target.hostport} stayed busy "
                                      f"for {timeout:g} s")
            try:
                await asyncio.wait_for(self.wake.wait(), deadline - now)
            except asyncio.TimeoutError:
                pass

    async def _open(self, opts: SshOptions, timeout: float, deadline: float) -> _Channel:
        """A new channel by `deadline`, reconnecting once if the connection died: one
        bound for the lot, so a frozen host costs the request the `timeout` it quotes."""
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = await self.connection(opts, timeout, deadline)
            try:
                process = await asyncio.wait_for(conn.create_process(opts.relay, encoding=None),
                                                 max(deadline - loop.time(), 0.01))
                return _Channel(process, conn)
            except asyncio.TimeoutError:
                # (before OSError, which a TimeoutError also is: taken for a dead connection,
                # it dialled again and a frozen host cost twice the time the reason quotes)
                # The connection is silent: drop it, so the next request dials afresh.
                self.silent.add(conn)
                self.lost(conn)
                raise HostUnreachable(f"{self.target.hostport} did not open an SSH channel within "
                                      f"{timeout:g} s") from None
            except (asyncssh.ChannelOpenError, asyncssh.DisconnectError, OSError) as exc:
                if isinstance(exc, asyncssh.ChannelOpenError) and not conn.is_closed() and self.open > 1:
                    # refused by a live connection with sessions open (sshd's MaxSessions below
                    # ours): not a dead connection, whose loss would end those sessions' requests
                    raise _SessionsFull() from None
                # The shared connection died under us (sshd restarted, network
                # blip): nothing was sent yet, so reconnect once and go on.
                self.lost(conn)
                if attempt:
                    raise HostUnreachable(f"cannot open an SSH channel to {self.target.hostport}: "
                                          f"{getattr(exc, 'reason', None) or exc}") from None
        raise AssertionError("unreachable")

    def keep(self, ch: _Channel) -> None:
        ch.idle_since = asyncio.get_running_loop().time()
        self.idle.append(ch)
        self.wake.set()

    def discard(self, ch: _Channel) -> None:
        if not ch.closed:
            ch.close()
            self.open -= 1
            self.wake.set()

    def _drop_idle(self) -> None:
        idle, self.idle = self.idle, []
        for ch in idle:
            self.discard(ch)

    def hold(self) -> None:
        self.users += 1
        if self._closer:
            self._closer.cancel()
            self._closer = None

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self._closer = asyncio.get_running_loop().call_later(IDLE_CONNECTION_S, self.close)

    def close(self) -> None:
        self._drop_idle()
        if self.conn is not None:
            self.conn.close()
            self.conn = None


_shared: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[SshTarget, _Shared]]" = weakref.WeakKeyDictionary()


def _shared_for(target: SshTarget) -> _Shared:
    per_loop = _shared.setdefault(asyncio.get_running_loop(), {})
    if target not in per_loop:
        per_loop[target] = _Shared(target)
    return per_loop[target]


async def close_all() -> None:
    """Close every shared connection of the running loop (tests, shutdown)."""
    for s in _shared.pop(asyncio.get_running_loop(), {}).values():
        conn = s.conn
        s.close()
        if conn is not None:
            await conn.wait_closed()


# ---------------------------------------------------------------- httpx seam

class _Body(httpx.AsyncByteStream):
    def __init__(self, shared: _Shared, ch: _Channel, timeout: float | None):
        self._shared, self._ch, self._timeout = shared, ch, timeout
        self._done = False
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while not self._done:
                event = await self._ch.next_event(self._timeout)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self._done = True
                elif isinstance(event, h11.ConnectionClosed):
                    raise httpx.RemoteProtocolError("the relay closed mid-response")
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout("the host stopped sending the response") from None
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(f"the response was cut short: {exc}") from None
        except (OSError, asyncssh.Error) as exc:
            raise httpx.ReadError(f"the SSH channel failed mid-response: {exc}") from None

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        http = self._ch.http
        if self._done and http.our_state is h11.DONE and http.their_state is h11.DONE:
            http.start_next_cycle()
            self._shared.keep(self._ch)
        else:
            self._shared.discard(self._ch)


class SshTransport(httpx.AsyncBaseTransport):
    """httpx transport that carries requests to a host agent over SSH."""

    def __init__(self, addr: str):
        self.target = SshTarget.parse(addr)
        self._held: _Shared | None = None

    def _shared(self) -> _Shared:
        shared = _shared_for(self.target)
        if self._held is not shared:
            if self._held is not None:
                self._held.release()
            shared.hold()
            self._held = shared
        return shared

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        opts = SshOptions.from_env()
        timeouts = request.extensions.get("timeout", {})
        # Whichever bound is tighter: the operator's for SSH, or the caller's.
        connect_t = min(t for t in (timeouts.get("connect"), opts.connect_timeout) if t)
        read_t, write_t = timeouts.get("read"), timeouts.get("write")
        shared = self._shared()
        replayable = isinstance(request.stream, httpx.ByteStream)
        for attempt in (0, 1):
            try:
                ch = await shared.channel(opts, connect_t)
            except HostUnreachable as exc:
                exc.maybe_sent = False  # (no channel: the request never left)
                raise
            try:
                head = await self._exchange(ch, request, read_t, write_t)
            except _NoAnswer as no:
                # the agent closed this idle channel as we reused it: at once, and not because
                # the host went silent (a connection keepalive dropped after seconds of silence
                # is a frozen host: dialling again cost a second bound the reason did not quote)
                silent = _keepalive_lost(no.cause) or (ch.conn is not None and ch.conn in shared.silent)
                raced = asyncio.get_running_loop().time() - ch.sent_at < REUSE_RACE_S and not silent
                if attempt == 0 and ch.reused and raced and replayable and request.method in IDEMPOTENT:
                    shared.discard(ch)
                    continue
                err = await ch.failure(self.target, opts.relay, no.cause, silent=silent)
                shared.discard(ch)
                if attempt == 0 and ch.reused and replayable and getattr(err, "maybe_sent", True) is False:
                    # the relay says none of it reached the agent, which hung up on this kept
                    # channel (it died, or closed it idle): any request may go again, a create
                    # too, on a channel of its own; a relay that cannot reach the agent there
                    # says so the same way, and the create passes on to the next host
                    continue
                raise err from None
            except asyncio.TimeoutError:
                shared.discard(ch)
                raise httpx.ReadTimeout(f"{self.target} did not answer in time", request=request) from None
            except BaseException:
                shared.discard(ch)
                raise
            headers = [(k, v) for k, v in head.headers]
            return httpx.Response(head.status_code, headers=headers, stream=_Body(shared, ch, read_t),
                                  extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason})
        raise AssertionError("unreachable")

    async def _exchange(self, ch: _Channel, request: httpx.Request, read_t, write_t) -> h11.Response:
        http = ch.http
        ch.sent_at, ch.seen = asyncio.get_running_loop().time(), bytearray()
        # Keep-alive is HTTP/1.1's default; whatever the caller said about the
        # connection is about its own hop, not this one.
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in (b"connection", b"keep-alive")]
        try:
            await ch.write(http.send(h11.Request(method=request.method, target=request.url.raw_path,
                                                 headers=headers)), write_t)
            async for chunk in request.stream:
                await ch.write(http.send(h11.Data(data=chunk)), write_t)
            await ch.write(http.send(h11.EndOfMessage()), write_t)
        except asyncio.TimeoutError:
            raise
        except (BrokenPipeError, ConnectionError, asyncssh.Error):
            pass  # the relay is gone; what it said (if anything) is read below
        try:
            while True:
                event = await ch.next_event(read_t)
                if isinstance(event, h11.Response):
                    return event
                if isinstance(event, h11.ConnectionClosed):
                    raise _NoAnswer()
                # InformationalResponse (100 Continue): wait for the real one.
        except asyncio.TimeoutError:
            raise  # (a TimeoutError is an OSError: keep it from the line below)
        except (h11.RemoteProtocolError, OSError, asyncssh.Error) as exc:
            # The stream ended or broke before a whole response head arrived, or what
            # came is not HTTP (`_Channel.failure` tells which).
            raise _NoAnswer(exc) from None

    async def aclose(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None
